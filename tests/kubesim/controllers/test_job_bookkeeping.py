"""The Job controller forgets deleted Jobs and pods: a long-running simulator must not grow per job run."""

from __future__ import annotations

from kubesim.controllers.job import JobController
from kubesim.resources import TRAINJOBS
from kubesim.sim import Simulator

from .helpers import NS, no_controller_errors, pods, submit, trainjob


def test_job_bookkeeping_is_dropped_with_the_jobs_and_pods() -> None:
    sim = Simulator(kueue=False)
    job_controller = next(c for c in sim.controllers if isinstance(c, JobController))
    for i in range(3):
        name = f"tj{i}"
        # One pod failure counted (a preemption), then a suspension (pods deleted by the controller).
        submit(sim, trainjob(name, nodes=2, script="hang"))
        sim.actions.preempt(NS, pods(sim, name)[1]["metadata"]["name"])
        sim.settle_now()
        sim.advance(40)
        assert job_controller._counted_failed and job_controller._last_failure  # the test exercises them
        cur = sim.store.get(TRAINJOBS, NS, name)
        cur["spec"]["suspend"] = True
        sim.store.replace(TRAINJOBS, cur)
        sim.settle_now()
        sim.advance(60)
        assert pods(sim, name) == []
        sim.store.delete(TRAINJOBS, NS, name)
        sim.settle_now()
        sim.advance(60)
    no_controller_errors(sim)
    assert job_controller._counted_failed == {}
    assert job_controller._last_failure == {}
    assert job_controller._ignored == set()
