"""One scenario per row of the cause table (SPEC §9.7), over real HTTP on kubesim.

Each test runs a job through the kubeflow backend, makes the cluster do what a real one would (a higher
priority job, a lost node, an OOM, a bad image, no capacity, a deadline, an exit code, kubectl deleting
the TrainJob) with ``sim.actions``, ``KUBESIM_SCRIPT`` or a real client, moves simulated time, and polls
``observe`` as a supervisor would. Each ends with the expected state and cause, and evidence naming the
object and reason it was read from.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubeflow_fixtures import caught_up, config, ident, install, spec, torch_runtime, variant
from kubeflow_live import SimClock

from dispatch import Cause, Handle, Identity, Image, JobSpec, Observation, State
from dispatch.cluster import Cluster
from dispatch.model import JobRecord
from dispatch.records import MemoryStore
from dispatch_kubeflow import Backend, RuntimeRef
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.causes import CONFIG_ERROR_GRACE, IMAGE_PULL_GRACE
from dispatch_kubeflow.naming import identity_labels
from kubesim.fixtures import install_default_kueue
from kubesim.resources import CLUSTERQUEUES, PODS, TRAINJOBS, WORKLOADPRIORITYCLASSES
from kubesim.sim import Simulator

NS = "default"
NEVER = "rt-never"  # restartPolicy Never, backoffLimit 0: a failed pod fails the job at once
ON_FAILURE = "rt-onfailure"  # restartPolicy OnFailure, backoffLimit 2: restarts in place twice

KUBECTL = Path(sys.executable).parent / "kubectl"
if not KUBECTL.exists():  # pragma: no cover - depends on the environment
    KUBECTL = Path(shutil.which("kubectl") or "kubectl")


def _runtime(name: str, restart: str, backoff: int) -> dict[str, Any]:
    rt = variant(torch_runtime(), name)
    job = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    job["spec"]["backoffLimit"] = backoff
    job["spec"]["template"]["spec"]["restartPolicy"] = restart
    return rt


class Scenario:
    def __init__(self, sim: Simulator, kc: str) -> None:
        self.sim = sim
        self.kc = kc
        self.backends: list[Backend] = []

    async def open(self, **settings: Any) -> Backend:
        b = await open_backend(
            config({"kubeconfig": self.kc, **settings}), probe_window=1, clock=SimClock(self.sim)
        )
        self.backends.append(b)
        return b

    async def start(self, backend: Backend, job: JobSpec, identity: Identity) -> Handle:
        handle = await backend.start(await backend.prepare(job, identity))
        await self.sim.settle()
        return handle

    def pods(self, handle: Handle) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in identity_labels(handle.identity).items())
        return self.sim.store.list(PODS, NS, label_selector=selector)[0]

    async def until(
        self,
        backend: Backend,
        handle: Handle,
        done: Callable[[Observation], bool],
        *,
        step: float = 5.0,
        limit: float = 3600.0,
    ) -> list[Observation]:
        """Observe, advancing simulated time by ``step``, until ``done``; returns every observation."""
        await caught_up(backend, self.sim)
        seen = [await backend.observe(handle)]
        waited = 0.0
        while not done(seen[-1]):
            assert waited < limit, (
                f"still {seen[-1].outcome} after {limit}s: {[str(o.outcome) for o in seen]}"
            )
            self.sim.advance(step)
            await self.sim.settle()
            waited += step
            await caught_up(backend, self.sim)
            seen.append(await backend.observe(handle))
        return seen

    async def record_until(
        self, cluster: Cluster, job_id: str, done: Callable[[JobRecord], bool], *, step: float = 5.0
    ) -> list[JobRecord]:
        """Read the record through the host (as ``dispatch status`` does), advancing simulated time by
        ``step``, until ``done``; returns every record read."""
        seen = [await cluster.get(job_id)]
        waited = 0.0
        while not done(seen[-1]):
            assert waited < 3600, f"still {seen[-1].outcome}: {[str(r.outcome) for r in seen]}"
            self.sim.advance(step)
            await self.sim.settle()
            waited += step
            await caught_up(cluster.backend, self.sim)  # type: ignore[arg-type]
            seen.append(await cluster.get(job_id))
        return seen

    async def close(self) -> None:
        for b in self.backends:
            await b.close()


@pytest.fixture
async def scenario(tmp_path: Path) -> AsyncIterator[Scenario]:
    async with Simulator(install_runtimes=False, tls=True) as sim:
        install(sim, torch_runtime(), _runtime(NEVER, "Never", 0), _runtime(ON_FAILURE, "OnFailure", 2))
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        s = Scenario(sim, kc)
        try:
            yield s
        finally:
            await s.close()


def _job(runtime: str = NEVER, script: str = "print started; hang", **kw: Any) -> JobSpec:
    return spec(runtime, env={"KUBESIM_SCRIPT": script}, **kw)


def _terminal(o: Observation) -> bool:
    return o.outcome.terminal


def _evidence(obs: Observation, kind: str, reason: str) -> Any:
    found = [e for e in obs.outcome.evidence if e.kind == kind and e.reason == reason]
    assert found, f"no {kind} evidence with reason {reason}: {obs.outcome.evidence}"
    return found[0]


# --- Kueue ----------------------------------------------------------------------------------------------


def _kueue_quota(sim: Simulator, cpu: str) -> None:
    install_default_kueue(sim.store)
    cq = sim.store.get(CLUSTERQUEUES, None, "cluster-queue")
    for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
        if r["name"] == "cpu":
            r["nominalQuota"] = cpu
    sim.store.replace(CLUSTERQUEUES, cq)
    for name, value in (("low", 10), ("high", 100)):
        sim.store.create(
            WORKLOADPRIORITYCLASSES,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )


async def test_kueue_preemption_by_a_higher_priority_job(scenario: Scenario) -> None:
    _kueue_quota(scenario.sim, "8")
    cpu = {"resourcesPerNode": {"requests": {"cpu": "8"}}}
    low = await scenario.open(queue="user-queue", priorityClass="low", **cpu)
    high = await scenario.open(queue="user-queue", priorityClass="high", **cpu)
    victim = await scenario.start(low, _job(), ident("low"))
    await scenario.until(low, victim, lambda o: o.state is State.RUNNING)
    winner = await scenario.start(high, _job(), ident("high"))
    seen = await scenario.until(low, victim, lambda o: o.cause is Cause.PREEMPTED)
    obs = seen[-1]
    assert (obs.state, obs.cause) == (State.QUEUED, Cause.PREEMPTED)
    ev = _evidence(obs, "Workload", "Preempted")
    assert ev.name.startswith("trainjob-") and "Preempted to accommodate" in ev.message
    await caught_up(high, scenario.sim)
    assert (await high.observe(winner)).state in (State.STARTING, State.RUNNING)


async def test_kueue_node_failure_requeues_with_node_lost(scenario: Scenario) -> None:
    _kueue_quota(scenario.sim, "64")
    b = await scenario.open(queue="user-queue")
    handle = await scenario.start(b, _job(), ident("kueue-node"))
    await scenario.until(b, handle, lambda o: o.state is State.RUNNING)
    (pod,) = scenario.pods(handle)
    scenario.sim.actions.lose_node(pod["spec"]["nodeName"])
    await scenario.sim.settle()
    obs = (await scenario.until(b, handle, lambda o: o.cause is Cause.NODE_LOST))[-1]
    # Kueue evicts, requeues and (kubesim's quota allowing at once) re-admits on another node: while
    # evicted the job is queued/node_lost; running again, it still says what happened.
    assert obs.state in (State.QUEUED, State.STARTING, State.RUNNING)
    assert pod["spec"]["nodeName"] in _evidence(obs, "Workload", "NodeFailures").message
    assert not obs.outcome.terminal


async def test_kueue_quota_refusal_is_queued_without_capacity(scenario: Scenario) -> None:
    _kueue_quota(scenario.sim, "8")
    b = await scenario.open(queue="user-queue", resourcesPerNode={"requests": {"cpu": "16"}})
    handle = await scenario.start(b, _job(), ident("over-quota"))
    obs = (await scenario.until(b, handle, lambda o: o.cause is Cause.NO_CAPACITY))[-1]
    assert obs.state is State.QUEUED
    assert "maximum capacity" in _evidence(obs, "Workload", "ExceedsMaxQuota").message


async def test_kueue_maximum_execution_time(scenario: Scenario) -> None:
    _kueue_quota(scenario.sim, "64")
    b = await scenario.open(queue="user-queue", labels={"kueue.x-k8s.io/max-exec-time-seconds": "60"})
    handle = await scenario.start(b, _job(), ident("max-exec"))
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.TIMEOUT)
    assert obs.outcome.evidence[0].kind == "Workload"
    assert "maximum execution time" in obs.outcome.evidence[0].message


# --- pods ------------------------------------------------------------------------------------------------


async def test_node_loss(scenario: Scenario) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(), ident("node-loss"))
    await scenario.until(b, handle, lambda o: o.state is State.RUNNING)
    (pod,) = scenario.pods(handle)
    node = pod["spec"]["nodeName"]
    scenario.sim.actions.lose_node(node)
    await scenario.sim.settle()
    # Read each second, as a supervisor does: the taint manager deletes the pod once its 300 s toleration
    # has run out, the Job syncs that a batch period later, and the pod's evidence lasts its grace period.
    obs = (await scenario.until(b, handle, _terminal, step=1))[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.NODE_LOST)
    ev = _evidence(obs, "Pod", "DeletionByTaintManager")
    assert (ev.name, ev.node) == (pod["metadata"]["name"], node)


async def test_preempted_by_the_scheduler(scenario: Scenario) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(), ident("sched-preempt"))
    await scenario.until(b, handle, lambda o: o.state is State.RUNNING)
    (pod,) = scenario.pods(handle)
    scenario.sim.actions.preempt(NS, pod["metadata"]["name"])
    await scenario.sim.settle()
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.PREEMPTED)
    assert _evidence(obs, "Pod", "PreemptionByScheduler").name == pod["metadata"]["name"]


async def test_evicted_through_the_eviction_api(scenario: Scenario) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(), ident("evicted"))
    await scenario.until(b, handle, lambda o: o.state is State.RUNNING)
    (pod,) = scenario.pods(handle)
    scenario.sim.actions.evict(NS, pod["metadata"]["name"])
    await scenario.sim.settle()
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.EVICTED)
    assert _evidence(obs, "Pod", "EvictionByEvictionAPI").name == pod["metadata"]["name"]


async def test_evicted_for_node_pressure(scenario: Scenario) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(), ident("pressure"))
    await scenario.until(b, handle, lambda o: o.state is State.RUNNING)
    (pod,) = scenario.pods(handle)
    scenario.sim.actions.node_pressure_evict(NS, pod["metadata"]["name"])
    await scenario.sim.settle()
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.EVICTED)
    assert "low on resource" in _evidence(obs, "Pod", "Evicted").message


async def test_oom_under_never(scenario: Scenario) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(NEVER, "print loading; sleep 5; oom"), ident("oom-never"))
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.OUT_OF_MEMORY)
    ev = _evidence(obs, "Pod", "OOMKilled")
    assert ev.exit_code == 137 and ev.node


async def test_oom_under_on_failure_is_read_from_last_state(scenario: Scenario) -> None:
    """The container restarts in place: the OOM is in lastState. While the Job still retries the job is
    running but says why it keeps restarting; when the Job gives up it is failed."""
    b = await scenario.open()
    handle = await scenario.start(b, _job(ON_FAILURE, "print loading; sleep 5; oom"), ident("oom-onfailure"))
    seen = await scenario.until(b, handle, _terminal)
    restarting = [o for o in seen if not o.outcome.terminal and o.cause is Cause.OUT_OF_MEMORY]
    assert restarting, f"never reported the restarts while running: {[(o.at, str(o.outcome)) for o in seen]}"
    assert any("restarted" in e.message for o in restarting for e in o.outcome.evidence)
    assert _evidence(restarting[-1], "Pod", "OOMKilled").exit_code == 137
    # The Job gave up and deleted the pod: the adapter reads what is left, `failed`; the cause seen while it
    # restarted is kept by the host's record and fold (SPEC §7), not in this process's memory.
    assert seen[-1].state is State.FAILED


async def test_exit_code_under_on_failure_seen_while_restarting_is_the_cause(scenario: Scenario) -> None:
    """Restarts in place keep the exit code in lastState; when the Job gives up, its controller deletes
    the pod. While it restarts the adapter reports the exit code as the live cause, for the host's record to
    keep."""
    b = await scenario.open()
    handle = await scenario.start(
        b, _job(ON_FAILURE, "print loading; sleep 5; exit 3"), ident("exit-onfailure")
    )
    seen = await scenario.until(b, handle, _terminal)
    assert any(not o.outcome.terminal and o.cause is Cause.EXIT_CODE for o in seen), [
        str(o.outcome) for o in seen
    ]
    restarting = [o for o in seen if not o.outcome.terminal and o.cause is Cause.EXIT_CODE]
    assert [e.exit_code for e in restarting[-1].outcome.evidence if e.kind == "Pod"] == [3]
    # As for OOM: the host's fold carries the exit code seen while restarting into the failure.
    assert seen[-1].state is State.FAILED


async def test_image_pull_failure_fails_after_the_grace_period(scenario: Scenario) -> None:
    b = await scenario.open()
    job = spec(NEVER, extensions=[Image("registry.invalid/train:1"), RuntimeRef(NEVER)])
    handle = await scenario.start(b, job, ident("image"))
    seen = await scenario.until(b, handle, _terminal, step=30)
    pulling = [o for o in seen if o.cause is Cause.IMAGE_PULL and not o.outcome.terminal]
    assert pulling and pulling[0].state is State.STARTING
    obs = seen[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.IMAGE_PULL)
    ev = obs.outcome.evidence[0]
    assert ev.kind == "Pod" and ev.reason in ("ErrImagePull", "ImagePullBackOff")
    assert obs.at - pulling[0].at >= IMAGE_PULL_GRACE - 60


async def test_a_missing_secret_is_a_config_error_then_fails_after_the_grace_period(
    scenario: Scenario,
) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(NEVER, "config-error db-password; print never"), ident("no-secret"))
    seen = await scenario.until(b, handle, _terminal, step=30)
    waiting = [o for o in seen if o.cause is Cause.CONFIG_ERROR and not o.outcome.terminal]
    assert waiting and waiting[0].state is State.STARTING, [str(o.outcome) for o in seen]
    obs = seen[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.CONFIG_ERROR), obs.outcome
    ev = obs.outcome.evidence[0]
    assert (ev.kind, ev.reason) == ("Pod", "CreateContainerConfigError")
    assert 'secret "db-password" not found' in ev.message  # the kubelet's message
    assert obs.at - waiting[0].at >= CONFIG_ERROR_GRACE - 60


async def test_complete_with_a_pod_oom_killed_at_exit_code_0_is_succeeded(scenario: Scenario) -> None:
    """kubernetes/kubernetes#116042: the pod reads OOMKilled with exit code 0; the TrainJob is Complete, and
    that decides — before this, the reading stayed running/out_of_memory and `dispatch run` never returned."""
    b = await scenario.open()
    handle = await scenario.start(b, _job(NEVER, "print working; sleep 5; oom-but-exit-0"), ident("oom-zero"))
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.SUCCEEDED, Cause.NONE), obs.outcome
    assert _evidence(obs, "Pod", "OOMKilled").exit_code == 0


async def test_unschedulable_is_queued_without_capacity(scenario: Scenario) -> None:
    b = await scenario.open(resourcesPerNode={"requests": {"cpu": "1000"}})
    handle = await scenario.start(b, _job(), ident("too-big"))
    obs = (await scenario.until(b, handle, lambda o: o.cause is Cause.NO_CAPACITY))[-1]
    assert obs.state is State.QUEUED
    assert "Insufficient cpu" in _evidence(obs, "Pod", "Unschedulable").message


async def test_deadline(scenario: Scenario) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(time_limit=60), ident("deadline"))
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.TIMEOUT)
    assert _evidence(obs, "TrainJob", "DeadlineExceeded").name == handle.ref.split("/")[1]


async def test_exit_code_3(scenario: Scenario) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(NEVER, "print working; sleep 10; exit 3"), ident("exit-3"))
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.FAILED, Cause.EXIT_CODE)
    ev = obs.outcome.evidence[0]
    assert (ev.kind, ev.exit_code) == ("Pod", 3) and ev.node


async def test_succeeded(scenario: Scenario) -> None:
    b = await scenario.open()
    handle = await scenario.start(b, _job(NEVER, "print working; sleep 10; exit 0"), ident("ok"))
    obs = (await scenario.until(b, handle, _terminal))[-1]
    assert (obs.state, obs.cause) == (State.SUCCEEDED, Cause.NONE)
    assert _evidence(obs, "TrainJob", "AllJobsCompleted")


async def test_we_cancelled(scenario: Scenario) -> None:
    """dispatch's cancel: ``stopping`` (never a false ``held``, though the stop suspends first) for as long
    as its pods terminate, then ``cancelled``."""
    cluster = Cluster(await scenario.open(), MemoryStore())
    rec = await cluster.submit(_job(), job_id="cancel-me")
    await scenario.record_until(cluster, "cancel-me", lambda r: r.state is State.RUNNING)
    assert (await cluster.cancel("cancel-me")).state is State.STOPPING
    seen = await scenario.record_until(cluster, "cancel-me", lambda r: r.outcome.terminal, step=1.0)
    assert {r.state for r in seen[:-1]} == {State.STOPPING}, [str(r.outcome) for r in seen]
    assert (seen[-1].state, seen[-1].outcome.cause) == (State.CANCELLED, Cause.CANCELLED)
    assert rec.handle is not None and not scenario.pods(rec.handle)


# --- deleted by someone else -----------------------------------------------------------------------------


async def _kubectl(kc: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "--kubeconfig",
        kc,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")
async def test_trainjob_deleted_with_kubectl_is_stopped_by_someone_else_not_cancelled(
    scenario: Scenario,
) -> None:
    """A TrainJob deleted with kubectl: ``stopping`` while it goes, then ``failed``/``cancelled`` with
    evidence that dispatch did not ask for the stop (``cancelled`` means dispatch cancelled it)."""
    cluster = Cluster(await scenario.open(), MemoryStore())
    rec = await cluster.submit(_job(), job_id="kubectl-deleted")
    await scenario.record_until(cluster, "kubectl-deleted", lambda r: r.state is State.RUNNING)
    assert rec.handle is not None
    name = rec.handle.ref.split("/")[1]
    code, _, err = await _kubectl(scenario.kc, "-n", NS, "delete", "trainjob", name, "--wait=false")
    assert code == 0, err
    await scenario.sim.settle()
    seen = await scenario.record_until(cluster, "kubectl-deleted", lambda r: r.outcome.terminal, step=1.0)
    assert State.STOPPING in [r.state for r in seen] and State.CANCELLED not in [r.state for r in seen]
    final = seen[-1]
    assert (final.state, final.outcome.cause) == (State.FAILED, Cause.CANCELLED)
    reasons = [e.reason for e in final.outcome.evidence]
    assert "StoppedByOthers" in reasons and any(
        e.kind == "TrainJob" and e.name == name for e in final.outcome.evidence
    )
    assert scenario.sim.store.list(TRAINJOBS, NS)[0] == [] or all(
        t["metadata"]["name"] != name for t in scenario.sim.store.list(TRAINJOBS, NS)[0]
    )


async def test_a_single_404_does_not_lose_a_job(scenario: Scenario) -> None:
    """A 404 from something other than the TrainJob's absence (a proxy, a CRD being reinstalled) cannot
    lose a job the shared cache holds: observe reads the cache and sends no request a 404 could mislead
    (a TrainJob the cache does not hold is read, and a 404 confirmed by a second read: test_kubeflow_reading)."""
    b = await scenario.open()
    handle = await scenario.start(b, _job(), ident("flaky-404"))
    await scenario.until(b, handle, lambda o: o.state is State.RUNNING)
    name = handle.ref.split("/")[1]
    scenario.sim.faults.fail_next(1, 404, verb="get", path=rf"/trainjobs/{name}$")
    try:
        obs = await b.observe(handle)
        assert obs.state is State.RUNNING
        assert scenario.sim.faults.injected == 0
    finally:
        scenario.sim.faults.clear()
