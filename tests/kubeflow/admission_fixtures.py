"""Helpers for tests that run ``dispatch-admission`` in-process against kubesim over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from dispatch_kubeflow.admission import AdmissionController, LeaseSettings
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.names import ADMISSION_CONTROLLER
from kubesim.fixtures import add_admission_check
from kubesim.resources import ADMISSIONCHECKS, TRAINJOBS, WORKLOADS
from kubesim.sim import Simulator

CHECK = "dispatch-hold"
TASKS: dict[AdmissionController, asyncio.Task[None]] = {}
"""The task running each controller of :func:`running` (cancel it to kill the controller)."""
_KINDS = (ADMISSIONCHECKS, WORKLOADS, TRAINJOBS)


def install_check(sim: Simulator, name: str = CHECK) -> None:
    """The AdmissionCheck ``name`` served by dispatch-admission, listed by ``cluster-queue``."""
    add_admission_check(sim.store, name, ADMISSION_CONTROLLER)


@contextlib.asynccontextmanager
async def running(
    kubeconfig: str, *, identity: str = "replica-a", lease: LeaseSettings | None = None
) -> AsyncIterator[AdmissionController]:
    """An :class:`AdmissionController` running as a task; stopped (lease released) on exit."""
    client = KubeClient.connect(kubeconfig=kubeconfig)
    ctl = AdmissionController(
        client,
        lease=lease
        or LeaseSettings(
            namespace="default", identity=identity, duration=15, renew_deadline=10, retry_period=0.5
        ),
    )
    task = TASKS[ctl] = asyncio.create_task(ctl.run())
    try:
        yield ctl
    finally:
        if not task.done():
            await ctl.stop()
        await asyncio.gather(task, return_exceptions=True)
        del TASKS[ctl]
        await client.close()


async def caught_up(sim: Simulator, ctl: AdmissionController, *, patience: float = 10.0) -> None:
    """Wait (real time) until the controller leads, has seen every AdmissionCheck, Workload and TrainJob
    change the store holds, and has no work left."""
    deadline = time.monotonic() + patience
    while True:
        r = ctl.reconciler
        if ctl.idle() and r is not None:
            seen = True
            for rt, informer in zip(_KINDS, r.informers, strict=True):
                items = sim.store.list(rt, None)[0]
                newest = max((int(o["metadata"]["resourceVersion"]) for o in items), default=0)
                if int(informer.resource_version or 0) < newest:
                    seen = False
            if seen:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"dispatch-admission did not catch up in {patience}s: {ctl!r} {ctl.stats}")
        await asyncio.sleep(0.01)


async def settle(sim: Simulator, ctl: AdmissionController) -> None:
    """Run kubesim's controllers and dispatch-admission until neither has anything left to do."""
    for _ in range(200):
        await sim.settle()
        before = sim.store.resource_version
        await caught_up(sim, ctl)
        await sim.settle()
        if sim.store.resource_version == before:
            return
    raise AssertionError("kubesim and dispatch-admission kept changing the cluster")
