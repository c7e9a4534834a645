"""Decisions about an incarnation are Kubernetes Events on its TrainJob (SPEC §7: decisions are visible
where operators look): ``kubectl describe trainjob`` on kubesim shows the cause read, the requeue, the
hold and the cancel of a supervised job, each naming the job and the epoch."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest
from kubeflow_fixtures import STOCK, config, install, spec

from dispatch import Action, Cause, Epoch, ManualClock, Policy, Rule, State
from dispatch.cluster import Cluster
from dispatch.records import MemoryStore
from dispatch_kubeflow.backend import open_backend
from kubesim.sim import Simulator

KUBECTL = Path(sys.executable).parent / "kubectl"
if not KUBECTL.exists():  # pragma: no cover - depends on the environment
    KUBECTL = Path(shutil.which("kubectl") or "kubectl")

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")

REQUEUE = Rule(Action.REQUEUE, max=2, backoff=0.0)
# As in test_kubeflow_supervise: the cause is read from the pods while they are there, else unknown.
POLICY = Policy({Cause.EXIT_CODE: REQUEUE, Cause.UNKNOWN: REQUEUE})


async def kubectl(kc: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(kc), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def describe(kc: Path, name: str) -> str:
    """The Events section of ``kubectl describe trainjob NAME``."""
    return (await kubectl(kc, "describe", "trainjob", name)).split("Events:", 1)[1]


@pytest.mark.asyncio(loop_scope="function")
async def test_describe_trainjob_shows_the_requeue_hold_and_cancel_of_a_supervised_job(
    tmp_path: Path,
) -> None:
    async with Simulator(install_runtimes=False, tls=True) as sim:  # kubectl sends tokens only over TLS
        install(sim, *(make() for make in STOCK.values()))
        kc = sim.write_kubeconfig(tmp_path / "kc")
        backend = await open_backend(config({"kubeconfig": str(kc)}), probe_window=0.3)
        try:
            clock = ManualClock()
            cluster = Cluster(backend, MemoryStore(clock), clock=clock, policy=POLICY)
            script = "env:DISPATCH_EPOCH=1.0: sleep 5; env:DISPATCH_EPOCH=1.0: exit 3; sleep 600; exit 0"
            await cluster.submit(spec(nodes=2, env={"KUBESIM_SCRIPT": script}), job_id="ev")
            first = (await cluster.store.get("ev")).handle
            assert first is not None
            sup = cluster.supervisor(poll=1.0, lease=30.0)
            for _ in range(150):
                await sup.step()
                rec = await cluster.store.get("ev")
                if rec.state is State.RUNNING and rec.epoch == Epoch(2, 1):
                    break
                await sim.settle()
                sim.advance(2)
                clock.advance(2)
            assert rec.state is State.RUNNING and rec.epoch == Epoch(2, 1)
            second = rec.handle
            assert second is not None
            name = second.ref.rpartition("/")[2]
            events = await describe(kc, name)
            assert "Requeued" in events and "job ev epoch 2.1: placed as a requeue: " in events, events
            assert "dispatch" in events  # the From column

            # The first incarnation's TrainJob is deleted; its Events stay in the namespace.
            old = await kubectl(
                kc, "get", "events", "--field-selector", f"involvedObject.name={first.ref.rpartition('/')[2]}"
            )
            assert "CauseRead" in old and "job ev epoch 1.0: failed, cause" in old, old
            assert "job ev epoch 1.0: requeued as epoch 2.1" in old, old

            await cluster.hold("ev")
            events = await describe(kc, name)
            assert (
                "Requeued" in events and "Held" in events and "job ev epoch 2.1: held by the user" in events
            )
            await cluster.cancel("ev")
            # A stop deletes the TrainJob in the background once its pods are told to go (Trainer v2.3.0
            # never finishes a foreground deletion), so it is soon gone: its Events stay, as on a cluster.
            events = await kubectl(kc, "get", "events", "--field-selector", f"involvedObject.name={name}")
            assert "Cancelled" in events and "job ev epoch 2.1: cancelled by the user" in events, events
            await sup.close()
        finally:
            await backend.close()


@pytest.mark.asyncio(loop_scope="function")
async def test_describe_and_get_events_show_the_controllers_and_the_supervisor_under_kueue(
    tmp_path: Path,
) -> None:
    """Both authors side by side: Kueue's job reconciler writes on the TrainJob (CreatedWorkload, Started),
    the Job controller, scheduler and kubelet on theirs, and the supervisor its decisions; ``kubectl
    describe trainjob`` shows the first and the last, ``kubectl get events`` all of them."""
    async with Simulator(install_runtimes=False, tls=True) as sim:
        install(sim, *(make() for make in STOCK.values()))
        kc = sim.write_kubeconfig(tmp_path / "kc")
        backend = await open_backend(config({"kubeconfig": str(kc), "queue": "user-queue"}), probe_window=0.3)
        try:
            clock = ManualClock()
            cluster = Cluster(backend, MemoryStore(clock), clock=clock, policy=POLICY)
            script = "env:DISPATCH_EPOCH=1.0: sleep 5; env:DISPATCH_EPOCH=1.0: exit 3; sleep 600; exit 0"
            await cluster.submit(spec(nodes=2, env={"KUBESIM_SCRIPT": script}), job_id="kq")
            sup = cluster.supervisor(poll=1.0, lease=30.0)
            for _ in range(150):
                await sup.step()
                rec = await cluster.store.get("kq")
                if rec.state is State.RUNNING and rec.epoch == Epoch(2, 1):
                    break
                await sim.settle()
                sim.advance(2)
                clock.advance(2)
            assert rec.state is State.RUNNING and rec.epoch == Epoch(2, 1) and rec.handle is not None
            name = rec.handle.ref.rpartition("/")[2]
            events = await describe(kc, name)
            # Kueue's job reconciler (Trainer v2.3.0 itself records none) and the supervisor, on one TrainJob.
            for reason in ("CreatedWorkload", "Started", "kueue-admission", "Requeued", "dispatch"):
                assert reason in events, events
            everything = await kubectl(kc, "get", "events")
            for seen in (
                "job/kq-1-",  # the Job controller: SuccessfulCreate ... BackoffLimitExceeded
                "SuccessfulCreate",
                "BackoffLimitExceeded",
                "FailedJobs",  # JobSet
                "Scheduled",  # the scheduler, then the kubelet
                "Started container",
                "QuotaReserved",  # Kueue, on the Workload
                "CauseRead",  # the supervisor, on the first incarnation's TrainJob
                "job kq epoch 1.0: requeued as epoch 2.1",
                "job kq epoch 2.1: placed as a requeue",
            ):
                assert seen in everything, everything
            await cluster.cancel("kq")
            await sim.settle()
            after = await kubectl(kc, "get", "events", "--field-selector", f"involvedObject.name={name}")
            assert "Cancelled" in after and "job kq epoch 2.1: cancelled by the user" in after, after
            assert "CreatedWorkload" in after, after
            await sup.close()
        finally:
            await backend.close()
