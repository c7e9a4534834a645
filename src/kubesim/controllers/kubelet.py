"""Simulated kubelets (one per Node, all in this controller).

Outside disruptions are in ``actions.py``, the node lifecycle's taint manager in ``nodelifecycle.py``.

A bound pod's main container (the one named ``node``, else the first) runs its behaviour script
(:mod:`kubesim.behaviour`): from ``sim.behaviours``, else env ``KUBESIM_SCRIPT``, else the default script.
Phases Pending → Running → Succeeded/Failed; container states waiting/running/terminated with reasons and
exit codes; under ``restartPolicy: OnFailure``/``Always`` a failed container restarts in place
(``restartCount``, ``lastState``, ``CrashLoopBackOff`` with 10 s doubling back-off, capped at 300 s);
images on registries whose host ends in ``.invalid`` fail with ``ErrImagePull``/``ImagePullBackOff``, and
malformed references with ``InvalidImageName``. A deleted pod keeps running, terminating, for its grace
period (or its scripted ``slow-stop``), then its containers end and it is removed.

In the ``processes`` mode (``Simulator(processes=...)``) a pod without a behaviour script runs its main
container's real command as a local process instead (:mod:`kubesim.controllers.processes`): its output is
the pod log, its exit the container's, and a deletion sends it SIGTERM, then SIGKILL after the grace period.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubesim.behaviour import (
    DEFAULT_SCRIPT,
    SCRIPT_ENV,
    START_ERRORS,
    Behaviours,
    ScriptError,
    Step,
    parse_script,
    render_text,
    start_error,
)
from kubesim.clock import ManualClock, unstamp
from kubesim.controllers import conditions as cond
from kubesim.controllers.base import BaseController, Key
from kubesim.controllers.processes import (
    MIN_GRACE,
    ProcessMode,
    ProcessRunner,
    command_of,
    process_env,
    rewrite_path,
    volume_dirs,
    workload_of,
)
from kubesim.controllers.volumes import mount_problem
from kubesim.errors import ApiError
from kubesim.resources import (
    CONFIGMAPS,
    NODES,
    PERSISTENTVOLUMECLAIMS,
    PERSISTENTVOLUMES,
    PODS,
    SECRETS,
    ResourceType,
)

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["KubeletController", "env_problem", "image_problem"]

BACKOFF_START = 10.0
DISRUPT = "kubesim.io/disrupt"
"""A pod annotation asking kubesim for a disruption of the pod, as a script step would (``preempt``,
``evict``, ``oom``, ``exit N``, ``lose-node``): how a client outside the process (``kubectl annotate``)
preempts a pod that runs a real command. Each value acts once per pod."""
DISRUPTIONS = ("preempt", "evict", "oom", "exit", "lose-node")
#: Simulated seconds from a pod's binding to its container running (image already present): what a
#: real node spends creating the sandbox and the container, during which the pod is ContainerCreating.
CONTAINER_START_SECONDS = 2.0
BACKOFF_MAX = 300.0
MOUNT_TIMEOUT = 120.0
"""How long the kubelet waits for a pod's volumes before reporting ``FailedMount`` again."""
SYNC_RETRY = 10.0
"""A pod sync that failed is retried after this long (the kubelet's ``backOffPeriod``, pkg/kubelet/kubelet.go)."""
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?:(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?)/)?"
    rf"(?P<repo>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)


def image_problem(image: str) -> tuple[str, str] | None:
    """``(reason, message)`` when the kubelet cannot get ``image``: InvalidImageName or ErrImagePull."""
    m = _REFERENCE.match(image or "")
    if not image or m is None:
        return (
            "InvalidImageName",
            f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": invalid reference format',
        )
    host = m.group("host")
    first = image.split("/", 1)[0]
    if host is not None and not ("." in first or ":" in first or first == "localhost"):
        host = None  # "library/x" style: no registry host, Docker Hub
    if host is not None and host.split(":")[0].endswith(".invalid"):
        hostname = host.split(":")[0]
        tag = m.group("tag") or "latest"
        full = image if m.group("tag") or m.group("digest") else f"{image}:latest"
        return (
            "ErrImagePull",
            f'failed to pull and unpack image "{full}": failed to resolve reference "{full}": failed to do request: '
            f'Head "https://{host}/v2/{m.group("repo")}/manifests/{tag}": dial tcp: lookup {hostname}: no such host',
        )
    return None


@dataclass
class _Run:
    """What the kubelet remembers about one pod it runs."""

    uid: str
    ns: str
    name: str
    node: str
    main: str
    image: str
    restart_policy: str
    rank: int
    env: dict[str, str]
    others: list[tuple[str, str]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    script_error: str | None = None
    mode: str = "new"  # new | mounting | pulling | blocked | creating | running | crash | done
    mount_report_at: float | None = None
    pc: int = 0
    wake_at: float | None = None
    started_at: str | None = None
    restarts: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    phase: str = "Pending"
    pull_attempts: int = 0
    slow_stop: float | None = None
    stop_at: float | None = None
    stop_code: int = 143
    pod_ip: str = ""
    host_ip: str = ""
    container_seq: int = 0
    process: bool = False
    """Processes mode: the main container is a local process, not a script."""
    exited: int | None = None
    """Processes mode: the exit code of the current process, once it ended."""
    start_failure: str | None = None
    """Processes mode: why the command could not be run (the runtime's ``StartError``)."""
    disrupted: set[str] = field(default_factory=set)
    """The ``kubesim.io/disrupt`` values already acted on."""


def _resolve_env(container: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    out: dict[str, str] = {}
    for e in container.get("env") or []:
        name = str(e.get("name"))
        if "value" in e:
            out[name] = str(e.get("value") or "")
            continue
        ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if not ref:
            continue
        m = re.match(r"metadata\.(annotations|labels)\['([^']+)'\]", str(ref))
        if m:
            out[name] = str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        elif ref == "metadata.name":
            out[name] = str(meta.get("name", ""))
        elif ref == "metadata.namespace":
            out[name] = str(meta.get("namespace", ""))
        elif ref == "spec.nodeName":
            out[name] = str((pod.get("spec") or {}).get("nodeName", ""))
    return out


class KubeletController(BaseController):
    """Runs bound pods on their nodes (every simulated node's kubelet in one controller)."""

    name = "kubelet"

    def __init__(self, start_seconds: float | None = None) -> None:
        super().__init__()
        # None: CONTAINER_START_SECONDS on a running clock (serve, the dev cluster), 0 on a ManualClock,
        # whose tests move time themselves and would all have to step over the creation (they opt in).
        self._start_seconds = start_seconds
        self.start_seconds = 0.0
        self.runs: dict[str, _Run] = {}
        self.dead_nodes: set[str] = set()
        # The workloads (JobSet, else Job, else pod) whose script already took a node down: a scripted
        # `lose-node` run by every rank of a job is one node loss, not one per rank (nor per pod retry).
        self.scripted_losses: set[str] = set()
        self.behaviours = Behaviours()
        self._ip_seq = 0
        self.runner: ProcessRunner | None = None

    def setup(self) -> None:
        # Scripts set through ``sim.behaviours`` are the simulator's, shared with this kubelet.
        self.behaviours = self.sim.behaviours
        mode: ProcessMode | None = getattr(self.sim, "processes", None)
        self.runner = ProcessRunner(mode, self.clock) if mode is not None else None
        if self._start_seconds is not None:
            self.start_seconds = self._start_seconds
        else:
            self.start_seconds = 0.0 if isinstance(self.clock, ManualClock) else CONTAINER_START_SECONDS

    def resync(self) -> None:
        for pod in self.store.list(PODS)[0]:
            if (pod.get("spec") or {}).get("nodeName"):
                self.enqueue(pod["metadata"].get("namespace"), pod["metadata"]["name"])

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.rt == PODS and (ev.obj.get("spec") or {}).get("nodeName"):
            yield (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
        elif ev.rt == NODES and ev.obj["metadata"]["name"] in self.dead_nodes:
            node = ev.obj["metadata"]["name"]
            if ev.type == "DELETED":
                self.dead_nodes.discard(node)  # the machine is gone for good (PodGC took its pods)
            elif cond.is_true(ev.obj, "Ready"):
                # Ready again, however it was written (a reboot, or by hand): this kubelet is back.
                self.dead_nodes.discard(node)
                for pod in self.store.list(PODS, field_selector=f"spec.nodeName={node}")[0]:
                    yield (pod["metadata"].get("namespace", ""), pod["metadata"]["name"])

    @property
    def logs(self) -> Any:
        return self.sim.logs

    # -------------------------------------------------------------------------------- reconcile

    def reconcile(self, namespace: str, name: str) -> None:
        pod = self.get_or_none(PODS, namespace, name)
        if pod is None:
            for gone_uid, gone in list(self.runs.items()):
                if gone.ns == namespace and gone.name == name:
                    if self.runner is not None:  # removed at once (a forced delete): stopped all the same
                        self.runner.stop(gone_uid, MIN_GRACE)
                    del self.runs[gone_uid]
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        uid = pod["metadata"]["uid"]
        run = self.runs.get(uid)
        if node in self.dead_nodes:
            self._on_dead_node(pod, run)
            return
        if run is None:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                return
            run = self._new_run(pod)
            self.runs[uid] = run
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate(pod, run)
            return
        if self._disrupt(pod, run):
            return
        self._advance(pod, run)
        self._publish(run)

    def _disrupt(self, pod: dict[str, Any], run: _Run) -> bool:
        """Act on the pod's ``kubesim.io/disrupt`` annotation once; whether it did (the pod changed)."""
        value = str((pod["metadata"].get("annotations") or {}).get(DISRUPT, "")).strip()
        if not value or value in run.disrupted:
            return False
        run.disrupted.add(value)
        try:
            (step,) = parse_script(value)
            if step.verb not in DISRUPTIONS or step.guards:
                raise ScriptError(f"{value!r} is not one of {', '.join(DISRUPTIONS)}")
            actions = self.sim.actions
            if step.verb == "preempt":
                actions.preempt(run.ns, run.name)
            elif step.verb == "evict":
                actions.evict(run.ns, run.name)
            elif step.verb == "oom":
                actions.oom(run.ns, run.name)
            elif step.verb == "exit":
                actions.exit(run.ns, run.name, step.code)
            else:
                actions.lose_node(run.node)
        except (ScriptError, ValueError) as exc:
            self.record_event(
                pod, "Warning", "DisruptFailed", f"{DISRUPT}={value!r}: {exc}", component="kubesim"
            )
            return False
        return True

    def _new_run(self, pod: dict[str, Any]) -> _Run:
        spec = pod.get("spec") or {}
        containers = list(spec.get("containers") or [])
        main = next(
            (c for c in containers if c.get("name") == "node"),
            containers[0] if containers else {"name": "main"},
        )
        meta = pod["metadata"]
        env = _resolve_env(main, pod)
        try:
            rank = int((meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index", "0"))
        except ValueError:
            rank = 0
        self._ip_seq += 1
        run = _Run(
            uid=meta["uid"],
            ns=meta.get("namespace", ""),
            name=meta["name"],
            node=str(spec.get("nodeName")),
            main=str(main.get("name")),
            image=str(main.get("image") or ""),
            restart_policy=str(spec.get("restartPolicy") or "Always"),
            rank=rank,
            env=env,
            others=[(str(c.get("name")), str(c.get("image") or "")) for c in containers if c is not main],
            pod_ip=f"10.244.{(self._ip_seq >> 8) & 255}.{self._ip_seq & 255}",
            host_ip=self._host_ip(str(spec.get("nodeName"))),
        )
        script = self.behaviours.script_for(pod)
        if script is None and self.runner is not None and SCRIPT_ENV not in env:
            run.process = True  # its real command runs; a pod with a behaviour script keeps its script
            return run
        if script is None:
            script = env.get(SCRIPT_ENV) or DEFAULT_SCRIPT
        try:
            run.steps = list(parse_script(script))
        except ScriptError as e:
            run.script_error = str(e)
        return run

    def _host_ip(self, node: str) -> str:
        n = self.get_or_none(NODES, None, node)
        for a in ((n or {}).get("status") or {}).get("addresses") or []:
            if a.get("type") == "InternalIP":
                return str(a.get("address"))
        return "10.0.0.1"

    # -------------------------------------------------------------------------------- running

    def _advance(self, pod: dict[str, Any], run: _Run) -> None:
        now_s = self.clock.now()
        if run.wake_at is not None and now_s < run.wake_at:
            # Woken early (an event, or an earlier timer that kept ``requeue_at`` from arming this one):
            # ask again for the wake time, or a back-off would never end.
            self.requeue_at(run.wake_at, run.ns, run.name)
            return
        run.wake_at = None
        if run.mode in ("new", "mounting"):
            unmounted = mount_problem(
                pod, lambda claim: self.get_or_none(PERSISTENTVOLUMECLAIMS, run.ns, claim)
            )
            if unmounted is not None:
                self._mount_wait(pod, run, unmounted)
                return
            run.mode = "new"
        if run.mode in ("new", "pulling"):
            problem = image_problem(run.image)
            if problem is not None:
                self._pull_failed(pod, run, problem)
                return
        if run.mode in ("new", "pulling", "blocked"):
            self.record_event(
                pod,
                "Normal",
                "Pulled",
                f'Container image "{run.image}" already present on machine',
                component="kubelet",
            )
            blocker = self._start_blocker(pod, run)
            if blocker is not None:
                self._blocked(pod, run, blocker)
                return
            if self.start_seconds > 0:
                # Sandbox, network and container creation take a moment on a real node: the pod shows
                # ContainerCreating (Pending) first, so a watcher sees it starting before it runs.
                run.mode = "creating"
                run.state = {"waiting": {"reason": "ContainerCreating"}}
                run.wake_at = now_s + self.start_seconds
                self.requeue_at(run.wake_at, run.ns, run.name)
                return
            self._start_container(pod, run)
        elif run.mode in ("creating", "crash"):
            self._start_container(pod, run)
        if run.mode == "running":
            self._step(pod, run)

    def _pull_failed(self, pod: dict[str, Any], run: _Run, problem: tuple[str, str]) -> None:
        reason, message = problem
        run.phase = "Pending"
        run.ready = False
        if reason == "InvalidImageName":
            if run.mode != "pulling":
                self.record_event(pod, "Warning", "InspectFailed", message, component="kubelet")
                self.record_event(pod, "Warning", "Failed", "Error: InvalidImageName", component="kubelet")
            run.mode = "pulling"
            run.state = {"waiting": {"reason": "InvalidImageName", "message": message}}
            return
        run.mode = "pulling"
        now_s = self.clock.now()
        showing_backoff = run.state.get("waiting", {}).get("reason") == "ErrImagePull"
        if showing_backoff:
            delay = min(BACKOFF_START * 2 ** max(run.pull_attempts - 1, 0), BACKOFF_MAX)
            run.state = {
                "waiting": {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{run.image}": ErrImagePull: {message}',
                }
            }
            self.record_event(
                pod, "Normal", "BackOff", f'Back-off pulling image "{run.image}"', component="kubelet"
            )
            run.wake_at = now_s + delay
        else:
            run.pull_attempts += 1
            run.state = {"waiting": {"reason": "ErrImagePull", "message": message}}
            self.record_event(pod, "Normal", "Pulling", f'Pulling image "{run.image}"', component="kubelet")
            self.record_event(
                pod,
                "Warning",
                "Failed",
                f'Failed to pull image "{run.image}": {message}',
                component="kubelet",
            )
            self.record_event(pod, "Warning", "Failed", "Error: ErrImagePull", component="kubelet")
            run.wake_at = now_s + 1.0
        self.requeue_at(run.wake_at, run.ns, run.name)

    def _start_blocker(self, pod: dict[str, Any], run: _Run) -> tuple[str, str] | None:
        """Why the main container cannot be created now, as ``(waiting reason, message)``: a Secret or
        ConfigMap its env names is missing (``makeEnvironmentVariables`` in pkg/kubelet/kubelet_pods.go),
        or its script says so (``config-error``/``create-error``)."""
        containers: list[dict[str, Any]] = (pod.get("spec") or {}).get("containers") or []
        container = next((c for c in containers if c.get("name") == run.main), {})
        problem = env_problem(container, run.ns, lambda rt, name: self.get_or_none(rt, run.ns, name))
        if problem is not None:
            return ("CreateContainerConfigError", problem)
        if run.process and command_of(container) is None:
            return (
                "CreateContainerError",
                f"kubesim processes mode: container {run.main} names no command, and the image "
                f"{run.image!r} is not pulled, so its entrypoint cannot run here",
            )
        step = start_error(run.steps, run.rank, run.env)
        if step is None:
            return None
        if step.verb == "create-error":
            return ("CreateContainerError", step.arg)
        if self.get_or_none(SECRETS, run.ns, step.arg) is not None:
            return None  # the Secret exists now: the next sync creates the container
        return ("CreateContainerConfigError", f'secret "{step.arg}" not found')

    def _mount_wait(self, pod: dict[str, Any], run: _Run, problem: str) -> None:
        """A claim of the pod is missing or unbound: the volume manager waits (the container stays
        ``ContainerCreating``), says why every ``MOUNT_TIMEOUT`` (its ``waitForAttachAndMount``
        timeout), and the pod worker retries after its back-off."""
        now_s = self.clock.now()
        if run.mode != "mounting" or run.mount_report_at is None or now_s >= run.mount_report_at:
            failing = [
                str(v.get("name"))
                for v in (pod.get("spec") or {}).get("volumes") or []
                if (v.get("persistentVolumeClaim") or {}).get("claimName")
            ]
            names = " ".join(failing)
            self.record_event(
                pod,
                "Warning",
                "FailedMount",
                f"Unable to attach or mount volumes: unmounted volumes=[{names}], unattached volumes=[{names}], "
                f"failed to process volumes=[{names}]: {problem}",
                component="kubelet",
            )
            run.mount_report_at = now_s + MOUNT_TIMEOUT
        run.mode = "mounting"
        run.phase = "Pending"
        run.ready = False
        run.state = {"waiting": {"reason": "ContainerCreating"}}
        run.wake_at = now_s + SYNC_RETRY
        self.requeue_at(run.wake_at, run.ns, run.name)

    def _blocked(self, pod: dict[str, Any], run: _Run, blocker: tuple[str, str]) -> None:
        """The container could not be created: wait, say why, and try again after the sync back-off."""
        reason, message = blocker
        run.mode = "blocked"
        run.phase = "Pending"
        run.ready = False
        run.state = {"waiting": {"reason": reason, "message": message}}
        self.record_event(pod, "Warning", "Failed", f"Error: {message}", component="kubelet")
        run.wake_at = self.clock.now() + SYNC_RETRY
        self.requeue_at(run.wake_at, run.ns, run.name)

    def _start_container(self, pod: dict[str, Any], run: _Run) -> None:
        run.mode = "running"
        run.phase = "Running"
        run.started_at = self.now()
        run.container_seq += 1
        run.pc = 0
        run.state = {"running": {"startedAt": run.started_at}}
        run.ready = True
        if run.restarts == 0:
            self.record_event(pod, "Normal", "Created", f"Created container: {run.main}", component="kubelet")
        self.record_event(pod, "Normal", "Started", f"Started container {run.main}", component="kubelet")
        if run.process:
            self._start_process(pod, run)
        elif run.script_error is not None:
            self.logs.append(run.ns, run.name, run.main, f"kubesim: bad behaviour script: {run.script_error}")
            self._exit(pod, run, 2, "Error")

    def _start_process(self, pod: dict[str, Any], run: _Run) -> None:
        """Run the main container's command as a local process (processes mode)."""
        assert self.runner is not None
        containers: list[dict[str, Any]] = (pod.get("spec") or {}).get("containers") or []
        container = next((c for c in containers if c.get("name") == run.main), {})
        mounts = volume_dirs(
            pod,
            container,
            lambda claim: self.get_or_none(PERSISTENTVOLUMECLAIMS, run.ns, claim),
            lambda volume: self.get_or_none(PERSISTENTVOLUMES, None, volume),
            self.runner.mode.volumes,
        )
        for directory in mounts.values():
            directory.mkdir(parents=True, exist_ok=True)
        env = process_env(run.env, os.environ, mounts, self.runner.port(workload_of(pod)))
        argv = [rewrite_path(a, mounts) for a in command_of(container) or []]
        run.exited = None
        seq = run.container_seq

        def line(text: str) -> None:
            if self.runs.get(run.uid) is run:
                self.logs.append(run.ns, run.name, run.main, text)

        def exited(code: int, failure: str | None) -> None:
            if self.runs.get(run.uid) is run and run.container_seq == seq and run.mode == "running":
                run.exited, run.start_failure = code, failure
                self.enqueue(run.ns, run.name)
                self.sim.kick()

        self.runner.start(run.uid, argv, env, line, exited)

    def _stop_process(self, run: _Run) -> None:
        """The container ended by other means than its process (an OOM kill, an eviction): kill it."""
        if run.process and self.runner is not None:
            self.runner.kill(run.uid)

    def lose_processes(self, node: str) -> None:
        """The node's machine went away: nothing of its pods runs on (processes mode)."""
        for run in self.runs.values():
            if run.node == node:
                self._stop_process(run)

    async def close(self) -> None:
        """The simulator stops: so do the pods' processes."""
        if self.runner is not None:
            await self.runner.close()

    def _step(self, pod: dict[str, Any], run: _Run) -> None:
        if run.process:
            if run.exited is not None:
                code, run.exited = run.exited, None
                self._exit(pod, run, code, _reason(code, run.start_failure), run.start_failure)
            return
        while run.mode == "running" and run.pc < len(run.steps):
            step = run.steps[run.pc]
            if not step.applies(run.rank, run.env):
                run.pc += 1
                continue
            verb = step.verb
            if verb == "print":
                self.logs.append(run.ns, run.name, run.main, render_text(step.arg, run.rank, run.env))
                run.pc += 1
            elif verb == "sleep":
                run.pc += 1
                if step.seconds > 0:
                    run.wake_at = self.clock.now() + step.seconds
                    self.requeue_at(run.wake_at, run.ns, run.name)
                    return
            elif verb == "slow-stop":
                run.slow_stop = step.seconds
                run.pc += 1
            elif verb == "exit":
                self._exit(pod, run, step.code, "Completed" if step.code == 0 else "Error")
                return
            elif verb == "oom":
                self._exit(pod, run, 137, "OOMKilled")
                return
            elif verb == "oom-but-exit-0":
                # containerd reports the cgroup's OOM kill even when the main process exits 0 (#116042).
                self._exit(pod, run, 0, "OOMKilled")
                return
            elif verb == "hang":
                return
            elif verb in START_ERRORS:
                run.pc += 1  # decided before the container started
            else:  # preempt / lose-node / evict: disruptions decided elsewhere in the cluster
                run.pc += 1
                self._publish(run)
                # the simulator's actions act through this kubelet (no import of actions.py here: it
                # imports this module)
                actions = self.sim.actions
                if verb == "preempt":
                    actions.preempt(run.ns, run.name)
                elif verb == "evict":
                    actions.evict(run.ns, run.name)
                elif _claim_scripted_loss(self.scripted_losses, pod):
                    actions.lose_node(run.node)
                else:
                    continue  # this workload already lost its node: the rest of the script runs
                return
        if run.mode == "running":
            self._exit(pod, run, 0, "Completed")

    def _terminated(self, run: _Run, code: int, reason: str, message: str | None = None) -> dict[str, Any]:
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": run.started_at or self.now(),
            "finishedAt": self.now(),
            "containerID": self._container_id(run),
        }
        if message:
            term["message"] = message
        return {"terminated": term}

    def _container_id(self, run: _Run) -> str:
        digest = hashlib.sha256(f"{run.uid}/{run.main}/{run.container_seq}".encode()).hexdigest()
        return f"containerd://{digest}"

    def _exit(
        self, pod: dict[str, Any], run: _Run, code: int, reason: str, message: str | None = None
    ) -> None:
        """The main container ended with ``code``: restart in place or finish the pod."""
        self._stop_process(run)
        term = self._terminated(run, code, reason, message)
        restart = run.restart_policy == "Always" or (run.restart_policy == "OnFailure" and code != 0)
        run.ready = False
        if restart:
            run.last_state = term
            run.restarts += 1
            # The finished instance's log becomes ``?previous=true``; the next instance logs afresh.
            self.logs.restart(run.ns, run.name, run.main)
            delay = min(BACKOFF_START * 2 ** (run.restarts - 1), BACKOFF_MAX)
            run.mode = "crash"
            run.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {int(delay)}s restarting failed container={run.main} "
                    f"pod={run.name}_{run.ns}({run.uid})",
                }
            }
            run.wake_at = self.clock.now() + delay
            self.requeue_at(run.wake_at, run.ns, run.name)
            self.record_event(
                pod,
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {run.main} in pod {run.name}_{run.ns}({run.uid})",
                component="kubelet",
            )
            return
        run.state = term
        run.mode = "done"
        run.phase = "Succeeded" if code == 0 else "Failed"
        self.logs.close(run.ns, run.name, run.main)

    # -------------------------------------------------------------------------------- termination

    def _terminate(self, pod: dict[str, Any], run: _Run) -> None:
        meta = pod["metadata"]
        now_s = self.clock.now()
        if run.mode == "done":
            self._publish(run)
            self.store.finalize_pod_deletion(run.ns, run.name)
            self.runs.pop(run.uid, None)
            return
        if run.process and run.mode == "running":
            self._terminate_process(pod, run)
            return
        if run.stop_at is None:
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            if run.mode != "running":
                linger = 0.0  # nothing running to stop
            elif run.slow_stop is not None:
                linger = min(run.slow_stop, grace)
                run.stop_code = 137 if run.slow_stop > grace else 143
            else:
                linger = grace
            run.stop_at = now_s + linger
            if run.mode == "running":
                self.record_event(
                    pod, "Normal", "Killing", f"Stopping container {run.main}", component="kubelet"
                )
        if now_s < run.stop_at:
            self.requeue_at(run.stop_at, run.ns, run.name)
            self._publish(run)
            return
        if run.mode == "running":
            run.state = self._terminated(run, run.stop_code, "Error")
        # A container that never ran (waiting on its image or in back-off) keeps its waiting state.
        run.ready = False
        run.mode = "done"
        if run.phase != "Succeeded":
            run.phase = "Failed"
        self.logs.close(run.ns, run.name, run.main)
        self._publish(run)
        self.store.finalize_pod_deletion(run.ns, run.name)
        self.runs.pop(run.uid, None)

    def _terminate_process(self, pod: dict[str, Any], run: _Run) -> None:
        """A deleted pod's process: SIGTERM, SIGKILL after the grace period (``killContainer``); the pod
        goes once the process has ended, with the exit it really had."""
        assert self.runner is not None
        if run.stop_at is None:
            grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            run.stop_at = self.clock.now()
            self.record_event(pod, "Normal", "Killing", f"Stopping container {run.main}", component="kubelet")
            self.runner.stop(run.uid, grace)
        if run.exited is None:
            self._publish(run)
            return
        code, run.exited = run.exited, None
        run.state = self._terminated(run, code, _reason(code, run.start_failure), run.start_failure)
        run.ready = False
        run.mode = "done"
        run.phase = "Succeeded" if code == 0 and run.restart_policy != "Always" else "Failed"
        self.logs.close(run.ns, run.name, run.main)
        self._publish(run)
        self.store.finalize_pod_deletion(run.ns, run.name)
        self.runs.pop(run.uid, None)

    def _on_dead_node(self, pod: dict[str, Any], run: _Run | None) -> None:
        """The node's kubelet is gone: nothing runs or reports; a deleted pod is removed after its grace
        period (as PodGC does once the lost Node object is gone)."""
        if run is not None:
            self._stop_process(run)
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        when = unstamp(self.clock, meta["deletionTimestamp"])
        if self.clock.now() < when:
            self.requeue_at(when, meta.get("namespace"), meta["name"])
            return
        before = copy.deepcopy(pod)
        status = pod.setdefault("status", {})
        if status.get("phase") not in ("Succeeded", "Failed"):
            status["phase"] = "Failed"
            if not cond.is_true(pod, "DisruptionTarget"):
                cond.set_pod_condition(
                    pod,
                    "DisruptionTarget",
                    "True",
                    "DeletionByPodGC",
                    "PodGC: node no longer exists",
                    self.now(),
                )
            body = copy.deepcopy(before)
            body["status"] = status
            self.store.update_status(PODS, body)
        if run is not None:
            self.logs.close(run.ns, run.name, run.main)
            self.runs.pop(run.uid, None)
        self.store.finalize_pod_deletion(meta.get("namespace", ""), meta["name"])

    # -------------------------------------------------------------------------------- status

    def _publish(self, run: _Run) -> None:
        """Write the run's view (phase, container statuses, readiness) onto the current pod status."""
        before = self.get_or_none(PODS, run.ns, run.name)
        if before is None or before["metadata"].get("uid") != run.uid:
            return
        pod = copy.deepcopy(before)
        status = pod.setdefault("status", {})
        now = self.now()
        status["phase"] = run.phase
        status.setdefault("startTime", now)
        status["hostIP"] = run.host_ip
        status["hostIPs"] = [{"ip": run.host_ip}]
        if run.mode not in ("new",):
            status["podIP"] = run.pod_ip
            status["podIPs"] = [{"ip": run.pod_ip}]
        main_status: dict[str, Any] = {
            "name": run.main,
            "image": run.image,
            "imageID": ""
            if run.mode in ("pulling", "blocked", "mounting")
            else f"{run.image}@sha256:{hashlib.sha256(run.image.encode()).hexdigest()}",
            "ready": run.ready,
            "started": run.mode == "running",
            "restartCount": run.restarts,
            "state": copy.deepcopy(run.state) or {"waiting": {"reason": "ContainerCreating"}},
            "lastState": copy.deepcopy(run.last_state),
        }
        if "running" in run.state or "terminated" in run.state:
            main_status["containerID"] = self._container_id(run)
        statuses = [main_status]
        for cname, cimage in run.others:
            if run.mode == "done":
                cstate: dict[str, Any] = {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": run.started_at or now,
                        "finishedAt": now,
                    }
                }
            elif run.mode in ("running", "crash"):
                cstate = {"running": {"startedAt": run.started_at or now}}
            else:
                cstate = {"waiting": {"reason": "PodInitializing"}}
            statuses.append(
                {
                    "name": cname,
                    "image": cimage,
                    "imageID": "",
                    "ready": run.mode == "running",
                    "started": "running" in cstate,
                    "restartCount": 0,
                    "state": cstate,
                    "lastState": {},
                }
            )
        order = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        statuses.sort(key=lambda s: order.index(s["name"]) if s["name"] in order else 0)
        status["containerStatuses"] = statuses
        cond.set_pod_condition(pod, "PodReadyToStartContainers", "True", "", "", now)
        cond.set_pod_condition(pod, "Initialized", "True", "", "", now)
        all_ready = run.ready and run.mode == "running"
        if run.mode == "done":
            cond.set_pod_condition(pod, "Ready", "False", "PodCompleted", "", now)
            cond.set_pod_condition(pod, "ContainersReady", "False", "PodCompleted", "", now)
        elif all_ready:
            cond.set_pod_condition(pod, "Ready", "True", "", "", now)
            cond.set_pod_condition(pod, "ContainersReady", "True", "", "", now)
        else:
            unready = f"containers with unready status: [{run.main}]"
            cond.set_pod_condition(pod, "Ready", "False", "ContainersNotReady", unready, now)
            cond.set_pod_condition(pod, "ContainersReady", "False", "ContainersNotReady", unready, now)
        if before.get("status") != pod.get("status"):
            body = copy.deepcopy(before)
            body["status"] = pod["status"]
            try:
                self.store.update_status(PODS, body)
            except ApiError as e:
                if e.code != 404:
                    raise


def env_problem(
    container: dict[str, Any], namespace: str, lookup: Callable[[ResourceType, str], dict[str, Any] | None]
) -> str | None:
    """The kubelet's message when ``container``'s env names a Secret or ConfigMap (or a key of one) that
    does not exist and is not ``optional``; ``lookup(rt, name)`` reads an object of the namespace or
    None. Wording as ``makeEnvironmentVariables`` and the kubelet's object managers
    (``secret "x" not found``, ``couldn't find key k in Secret ns/x``)."""
    refs: list[tuple[ResourceType, str, str | None, bool]] = []
    for source in container.get("envFrom") or []:
        for field_name, rt in (("configMapRef", CONFIGMAPS), ("secretRef", SECRETS)):
            ref = source.get(field_name)
            if isinstance(ref, dict):
                refs.append((rt, str(ref.get("name") or ""), None, bool(ref.get("optional"))))
    for e in container.get("env") or []:
        value_from = e.get("valueFrom") or {}
        for field_name, rt in (("configMapKeyRef", CONFIGMAPS), ("secretKeyRef", SECRETS)):
            ref = value_from.get(field_name)
            if isinstance(ref, dict):
                refs.append(
                    (rt, str(ref.get("name") or ""), str(ref.get("key") or ""), bool(ref.get("optional")))
                )
    for rt, name, key, optional in refs:
        obj = lookup(rt, name)
        kind = "configmap" if rt is CONFIGMAPS else "secret"
        if obj is None:
            if not optional:
                return f'{kind} "{name}" not found'
            continue
        keys = {**(obj.get("data") or {}), **(obj.get("binaryData") or {})}
        if key is not None and key not in keys and not optional:
            return f"couldn't find key {key} in {rt.kind} {namespace}/{name}"
    return None


def _reason(code: int, start_failure: str | None) -> str:
    """A process's terminated reason: ``StartError`` when it could not be run (containerd's, with code
    128), ``Completed`` for 0, else ``Error``."""
    if start_failure is not None:
        return "StartError"
    return "Completed" if code == 0 else "Error"


def _claim_scripted_loss(claimed: set[str], pod: dict[str, Any]) -> bool:
    """Whether this pod's workload may still take a node down by script (then it is claimed)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    owner = (
        labels.get("jobset.sigs.k8s.io/jobset-name")
        or labels.get("batch.kubernetes.io/job-name")
        or labels.get("job-name")
        or meta.get("name", "")
    )
    key = f"{meta.get('namespace', '')}/{owner}"
    if key in claimed:
        return False
    claimed.add(key)
    return True
