"""The Kubeflow harness of the supervisor's deterministic simulation (``python -m dispatch.simulate
--adapter kubeflow``): a kubesim ``Simulator`` on a manual clock, opened through the real Kubeflow
adapter over HTTP.

It lives here, beside the Kubeflow tests, because ``dispatch`` may not import ``kubesim`` nor
``dispatch_kubeflow`` (tests/test_layout.py); ``dispatch.simulate`` loads it by module name
(docs/supervisor.md, "Harnesses"). Per run it draws from the seed: the node count, and nothing else of
the cluster — kubesim's timings are its own. API faults are kubesim's own (``sim.faults``): 429/500 on
TrainJob creates and deletes, lost responses after a create or delete took effect, failed reads,
dropped watch streams and compacted watch history (expired cursors). A supervisor's crash points wrap
the adapter's ``start``/``stop`` (:class:`CrashingBackend`), since a crash is the process's, not the
cluster's.

The facts for the invariants come from kubesim's store, watched synchronously (so nothing between two
checks is missed): an incarnation is live while its TrainJob exists, is not being deleted and has no
``Complete``/``Failed`` condition; two incarnations of one job **overlap** when both have pods that are
not terminated (phase other than Succeeded/Failed, not yet deleted) at one moment of simulated time.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubeflow_fixtures import _CACHED

from dispatch import AdapterConfig, Extensions, Image, JobSpec
from dispatch.backend import Backend, HoldToken, Prepared
from dispatch.clock import ManualClock
from dispatch.errors import DispatchError
from dispatch.model import Capabilities, Change, Handle, Identity, Observation, Share
from dispatch.simulate import T0, Crasher, Faults
from dispatch_kubeflow import RuntimeRef
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import Retry
from dispatch_kubeflow.names import LABEL_INCARNATION, LABEL_JOB_HASH
from dispatch_kubeflow.naming import identity_labels, identity_of, job_hash
from kubesim import resources
from kubesim.clock import ManualClock as SimClock
from kubesim.resources import CLUSTERTRAININGRUNTIMES, NODES, PODS, TRAINJOBS
from kubesim.sim import Simulator
from kubesim.store import WatchEvent

__all__ = ["CrashingBackend", "KubeflowHarness"]

RUNTIME = "dispatch-sim"
NAMESPACE = "default"
NODE_BACK_AFTER = 320.0
"""A lost node (by an event, or by a pod's ``lose-node`` script step) comes back after this long: after
the taint manager's 300 s eviction of its pods (so the loss is seen), and before capacity would be short
for good (a cluster whose every node is lost for ever can finish no job)."""
_TERMINATED = ("Succeeded", "Failed")


def _runtime(restarts: int = 0) -> dict[str, Any]:
    """A torch runtime that does not restart in the cluster (as dispatch recommends): a failed node fails
    the TrainJob at once, and dispatch's policy decides what comes next. With ``restarts``, a container
    that fails is restarted in place (``restartPolicy: OnFailure``) up to that many times before the
    TrainJob fails: dispatch then sees a running job whose pods restarted, and a cause it must remember."""
    job: dict[str, Any] = {
        "name": "node",
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {
                "backoffLimit": restarts,
                "template": {
                    "spec": {
                        "restartPolicy": "OnFailure" if restarts else "Never",
                        "containers": [{"name": "node", "image": "example.org/pytorch:2"}],
                    }
                },
            },
        },
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [job]}},
        },
    }


class _OpeningClock:
    """The run's clock for one backend, except that while the backend opens its preflight's waits take
    no simulated time (they pass on a private offset, dropped once open): opening a backend is instant in
    the run, as a process that starts, and a preflight that must wait (its probe's cleanup after an
    injected 500) ends by its own deadline instead of sleeping on a clock nobody advances meanwhile."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.opening = True
        self.offset = 0.0

    def now(self) -> float:
        return self.clock.now() + self.offset

    async def sleep(self, seconds: float) -> None:
        if self.opening:
            self.offset += max(0.0, seconds)
            await asyncio.sleep(0)
        else:
            await self.clock.sleep(seconds)

    def opened(self) -> None:
        self.opening = False
        self.offset = 0.0


class CrashingBackend:
    """The adapter's backend with a supervisor's crash points around its writes (``start``, ``stop``)."""

    def __init__(self, inner: Any, crasher: Crasher | None) -> None:
        self.inner = inner
        self.crasher = crasher

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def cluster_id(self) -> str:
        return str(self.inner.cluster_id)

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return await self.inner.capabilities(spec)  # type: ignore[no-any-return]

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        return await self.inner.prepare(spec, identity, held=held)  # type: ignore[no-any-return]

    async def start(self, prepared: Prepared) -> Handle:
        what = f"start {prepared.identity}"
        if self.crasher is not None:
            await self.crasher.before(what)
        handle: Handle = await self.inner.start(prepared)
        if self.crasher is not None:
            await self.crasher.done(what)
        return handle

    async def stop(self, handle: Handle) -> None:
        what = f"stop {handle.identity}"
        if self.crasher is not None:
            await self.crasher.before(what)
        await self.inner.stop(handle)
        if self.crasher is not None:
            await self.crasher.done(what)

    async def observe(self, handle: Handle) -> Observation:
        return await self.inner.observe(handle)  # type: ignore[no-any-return]

    async def list(self) -> list[Observation]:
        return await self.inner.list()  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self.inner.close()

    async def hold(self, handle: Handle) -> HoldToken:
        return await self.inner.hold(handle)  # type: ignore[no-any-return]

    async def release(self, handle: Handle, token: HoldToken) -> None:
        await self.inner.release(handle, token)

    def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        return self.inner.watch(cursor, share=share)  # type: ignore[no-any-return]

    async def ceased(self, handle: Handle) -> bool:
        return await self.inner.ceased(handle)  # type: ignore[no-any-return]

    async def wait_ceased(self, handle: Handle) -> None:
        await self.inner.wait_ceased(handle)

    def native_name(self, identity: Identity) -> str:
        return str(self.inner.native_name(identity))

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        return self.inner.identity_of(obj)  # type: ignore[no-any-return]


class KubeflowHarness:
    """One run's kubesim cluster. See the module docstring."""

    name = "kubeflow"
    others_stop = True  # "vanish" deletes a TrainJob behind dispatch's back, its pods terminating after

    def __init__(self, rng: random.Random, clock: ManualClock, trace: list[str]) -> None:
        self.clock = clock
        self.trace = trace
        self.nodes = rng.choice([2, 3, 4])
        # What was added later draws from its own stream (derived without consuming the run's), so the
        # earlier regression seeds keep their meaning.
        extra = random.Random(repr(rng.getstate()[1][:16]))  # a str seed: the same in every process
        self.kueue = extra.random() < 0.3  # TrainJobs queue in Kueue's LocalQueue, admitted by it
        restarts = extra.choice([0, 0, 1, 3])  # in-place restarts (OnFailure) before the TrainJob fails
        self.restart_rate = extra.choice([0.0, 0.0, 0.01])  # the API server restarts (same port and etcd)
        self.sim = Simulator(
            clock=SimClock(clock.now()), kueue=self.kueue, nodes=self.nodes, install_runtimes=False
        )
        self.sim.store.create(CLUSTERTRAININGRUNTIMES, copy.deepcopy(_runtime(restarts)))
        if self.kueue or restarts:
            self._note(f"cluster: {'Kueue, ' if self.kueue else ''}{restarts} in-place restarts per job")
        self._dir = Path(tempfile.mkdtemp(prefix="dispatch-sim-"))
        self._kubeconfig = ""
        self._identity: dict[tuple[str, int], Identity] = {}  # (job hash, N) -> identity
        self._created: dict[str, list[Identity]] = {}
        self._compute: dict[str, dict[int, set[str]]] = {}  # job hash -> N -> pods with compute
        self._overlaps: list[tuple[str, str]] = []
        self._overlapping: set[tuple[str, tuple[int, ...]]] = set()
        self._lost_nodes: dict[str, float] = {}  # node -> when it was first seen not ready
        self._opened: list[Any] = []  # the adapter's backends opened on this cluster
        self._down_until = 0.0  # the API server answers 503 until then (an outage)
        self.sim.store.subscribe(self._on_trainjob, rt=TRAINJOBS)
        self.sim.store.subscribe(self._on_pod, rt=PODS)

    # ------------------------------------------------------------------ facts, as they happen

    def _note(self, text: str) -> None:
        self.trace.append(f"t={self.clock.now() - T0:.1f} {text}")

    def _on_trainjob(self, ev: WatchEvent) -> None:
        if ev.type != "ADDED":
            return
        try:
            ident = identity_of(ev.obj)
        except DispatchError:
            return
        if ident is not None:
            self._identity[(job_hash(ident.job_id), ident.epoch.n)] = ident
            self._created.setdefault(ident.job_id, []).append(ident)

    def _on_pod(self, ev: WatchEvent) -> None:
        labels = ev.obj.get("metadata", {}).get("labels") or {}
        h, n = labels.get(LABEL_JOB_HASH), labels.get(LABEL_INCARNATION)
        if h is None or n is None:
            return
        name = ev.obj["metadata"]["name"]
        pods = self._compute.setdefault(h, {}).setdefault(int(n), set())
        terminated = ev.type == "DELETED" or ev.obj.get("status", {}).get("phase") in _TERMINATED
        if terminated:
            pods.discard(name)
            return
        pods.add(name)
        busy = sorted(k for k, v in self._compute[h].items() if v)
        if len(busy) > 1 and (h, tuple(busy)) not in self._overlapping:
            self._overlapping.add((h, tuple(busy)))  # once per set of incarnations, not per pod event
            idents = [self._identity.get((h, k)) for k in busy]
            job_id = next((i.job_id for i in idents if i is not None), h)
            what = " and ".join(
                str(i) if i is not None else f"{h}#{k}" for i, k in zip(idents, busy, strict=True)
            )
            self._overlaps.append((job_id, f"{what} had compute at once (t={self.clock.now() - T0:.1f})"))

    # ------------------------------------------------------------------ the Harness protocol

    async def start(self) -> None:
        await self.sim.start()
        self._kubeconfig = str(self.sim.write_kubeconfig(self._dir / "kubeconfig", token="admin"))

    async def open(self, faults: Faults, crasher: Crasher | None, who: str) -> Backend:
        settings: dict[str, Any] = {
            "kubeconfig": self._kubeconfig,
            "probeRuntime": {"kind": "ClusterTrainingRuntime", "name": RUNTIME},
        }
        if self.kueue:
            settings["queue"] = "user-queue"
        cfg = AdapterConfig("kubeflow", json.dumps(settings).encode())
        for attempt in range(30):
            clock = _OpeningClock(self.clock)
            try:
                # One try per request: kubesim's faults reach the supervisor (which retries by itself), and
                # no retry sleeps on the manual clock within a step.
                inner = await open_backend(cfg, probe_window=0.0, clock=clock, retry=Retry(attempts=1))
                clock.opened()
                self._opened.append(inner)
                break
            except DispatchError as exc:  # an injected fault hit the preflight: the process starts again
                self._note(f"{who}: open failed ({type(exc).__name__}), again")
                if attempt == 29:
                    raise
                if attempt >= 3:
                    # The cluster is down: a daemon tries again a moment later (once the outage is over).
                    await self.advance(max(1.0, min(10.0, self._down_until - self.clock.now())))
        return CrashingBackend(inner, crasher)

    def spec(self, script: str, nodes: int, time_limit: int | None) -> JobSpec:
        return JobSpec(
            command=("python", "train.py"),
            nodes=nodes,
            env={"KUBESIM_SCRIPT": script},
            time_limit=time_limit,
            extensions=Extensions([Image("example.org/train:1"), RuntimeRef(RUNTIME)]),
        )

    def _pods(self, ident: Identity) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in identity_labels(ident).items())
        pods = self.sim.store.list(PODS, NAMESPACE, label_selector=selector)[0]
        return sorted(
            (
                p
                for p in pods
                if not p["metadata"].get("deletionTimestamp")
                and p.get("status", {}).get("phase") == "Running"
            ),
            key=lambda p: p["metadata"]["name"],
        )

    async def events(self, rng: random.Random, faults: Faults) -> None:
        if rng.random() < 0.15:
            running = [i for i in sorted(self.live(), key=str) if self._pods(i)]
            if running:
                ident = rng.choice(running)
                event = rng.choice(["preempt", "lose-node", "evict", "oom", "exit 0", "exit 2", "vanish"])
                self._note(f"cluster: {event} {ident}")
                self._inject(ident, event, rng)
        if not faults.on:
            return
        if self.restart_rate and rng.random() < self.restart_rate:
            await self._restart()
        f = self.sim.faults
        if faults.hit(faults.outage, "outage", faults.later):
            seconds = faults.later.choice([2.0, 10.0, 40.0])
            until = self.clock.now() + seconds
            self._down_until = max(self._down_until, until)
            self._note(f"cluster: OUTAGE (the API server answers 503 for {seconds:g} s)")
            faults.hits.add("outage down")
            # By the cluster's time, not by a count of requests: which process's request meets it must not
            # depend on how fast background reconnects come (a seed must replay).
            f.fail_next(
                n=1 << 30,
                code=503,
                predicate=lambda _verb, _path: self.clock.now() < until,
                message="injected outage: the API server is unavailable",
            )
        if faults.hit(faults.write, "write"):
            verb = rng.choice(["create", "delete"])
            kind = rng.choice(["429", "500", "lost-after"])
            self._note(f"fault {kind} armed on the next TrainJob {verb}")
            if kind == "lost-after":
                f.lose_response_next(verb=verb, path="/trainjobs")
            else:
                f.fail_next(code=int(kind), verb=verb, path="/trainjobs")
        if faults.hit(faults.read, "read"):
            verb = rng.choice(["get", "list"])
            self._note(f"fault 500 armed on the next {verb}")
            f.fail_next(code=500, verb=verb)
        if faults.hit(faults.watch, "watch"):
            if rng.random() < 0.5:
                self._note("fault: watches dropped")
                f.drop_watches(abort=rng.random() < 0.5)
            else:
                self._note("fault: watch history compacted (cursors expire)")
                f.compact()
        await self.sim.settle()
        await self._quiesce()

    async def _restart(self) -> None:
        """The API server restarts: every connection and watch ends, the watch cache starts again (old
        cursors expire), the objects stay (etcd), and it listens on the same address."""
        self._note("cluster: the API server restarts")
        port = urlsplit(self.sim.url).port
        await self.sim.stop()
        self.sim._port = port or 0
        await self.sim.start()

    async def disappear(self) -> None:
        for ident in sorted(self.live(), key=str):
            if self._pods(ident):
                self._inject(ident, "preempt", random.Random(str(ident)))
        await self.sim.settle()
        for ident, tj in self._trainjobs():
            self._note(f"cluster: preempted, then gone: {ident}")
            self._delete_behind(ident, tj)
        self.sim.settle_now()

    def _inject(self, ident: Identity, event: str, rng: random.Random) -> None:
        try:
            self._act(ident, event, rng)
        except ValueError as exc:  # a container waiting to restart in place (OnFailure) cannot end now
            self._note(f"cluster: {event} {ident} does not apply now: {exc}")
        self.sim.settle_now()

    def _act(self, ident: Identity, event: str, rng: random.Random) -> None:
        pods = [p["metadata"]["name"] for p in self._pods(ident)]
        actions = self.sim.actions
        if event == "preempt":
            actions.preempt(NAMESPACE, rng.choice(pods))
        elif event == "evict":
            actions.evict(NAMESPACE, rng.choice(pods))
        elif event == "oom":
            actions.oom(NAMESPACE, rng.choice(pods))
        elif event == "exit 0":
            for pod in pods:
                try:
                    actions.exit(NAMESPACE, pod, 0)
                except ValueError:
                    pass  # this pod's container is waiting to restart; the others still end
        elif event == "exit 2":
            actions.exit(NAMESPACE, rng.choice(pods), 2)
        elif event == "lose-node":
            pod = self.sim.store.get(PODS, NAMESPACE, rng.choice(pods))
            node = pod["spec"]["nodeName"]
            if node not in self._lost_nodes:
                actions.lose_node(node)
        else:  # vanish: someone deletes the TrainJob behind dispatch's back
            for tj in self.sim.store.list(TRAINJOBS, NAMESPACE)[0]:
                if identity_of(tj) == ident:
                    self._delete_behind(ident, tj)

    def _delete_behind(self, ident: Identity, tj: dict[str, Any]) -> None:
        """Delete a TrainJob behind dispatch's back. Its creation no longer counts (as ``memory``'s
        vanish): a start whose record write never landed is retried, and places the identity anew."""
        self.sim.store.delete(TRAINJOBS, NAMESPACE, tj["metadata"]["name"])
        created = self._created.get(ident.job_id, [])
        if ident in created:
            created.remove(ident)

    async def _quiesce(self) -> None:
        """Wait (real time, bounded) until every open backend's informer holds what kubesim holds and has
        read it all into its feed: what a supervisor's next step drains then depends on the seed alone,
        not on how fast loopback delivered the watch events (a seed must replay)."""
        if self.clock.now() < self._down_until + 1.0:
            return  # nothing catches up while the API server is down (nor a moment after)
        for backend in [b for b in self._opened if not b._closed]:
            informer = backend.informer
            for _ in range(300):  # bounded: a stream in its reconnect back-off waits for the clock
                if not informer.running:
                    break
                behind = False
                for kind in informer.kinds:
                    rt = getattr(resources, _CACHED[kind.key])
                    ns = None if kind.key == "clustertrainingruntimes" else NAMESPACE
                    items, _ = self.sim.store.list(rt, ns, label_selector=kind.selector)
                    want = {i["metadata"]["uid"]: i["metadata"]["resourceVersion"] for i in items}
                    if informer.versions(kind.key) != want:
                        behind = True
                        break
                if not behind and informer.quiet:
                    break
                await asyncio.sleep(0.001)
        for _ in range(5):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        self.sim.advance(seconds)
        self.clock.advance(seconds)
        now = self.clock.now()
        for node in self.sim.store.list(NODES, None)[0]:
            name = node["metadata"]["name"]
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in node.get("status", {}).get("conditions") or []
            )
            if ready:
                self._lost_nodes.pop(name, None)
            elif now - self._lost_nodes.setdefault(name, now) >= NODE_BACK_AFTER:
                self._note(f"cluster: node {name} is back")
                self.sim.actions.restore_node(name)
                self._lost_nodes.pop(name, None)
        await self.sim.settle()
        await self._quiesce()

    def _trainjobs(self) -> list[tuple[Identity, dict[str, Any]]]:
        out = []
        for tj in self.sim.store.list(TRAINJOBS, NAMESPACE)[0]:
            try:
                ident = identity_of(tj)
            except DispatchError:
                continue
            if ident is not None:
                out.append((ident, tj))
        return out

    def live(self) -> list[Identity]:
        out = []
        for ident, tj in self._trainjobs():
            conditions = tj.get("status", {}).get("conditions") or []
            ended = any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
            )
            if not ended and not tj["metadata"].get("deletionTimestamp"):
                out.append(ident)
        return out

    def on_cluster(self) -> set[Identity]:
        return {ident for ident, _ in self._trainjobs()}

    def with_compute(self) -> set[Identity]:
        """Incarnations with a pod that has not finished (running, pending or terminating)."""
        out = set()
        for ident in {ident for ident, _ in self._trainjobs()} | {
            i for ids in self._created.values() for i in ids
        }:
            selector = ",".join(f"{k}={v}" for k, v in identity_labels(ident).items())
            pods = self.sim.store.list(PODS, NAMESPACE, label_selector=selector)[0]
            if any(p.get("status", {}).get("phase") not in ("Succeeded", "Failed") for p in pods):
                out.add(ident)
        return out

    def created(self, job_id: str) -> list[Identity]:
        return list(self._created.get(job_id, []))

    def overlaps(self) -> list[tuple[str, str]]:
        return list(self._overlaps)

    async def close(self) -> None:
        await self.sim.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
