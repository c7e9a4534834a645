"""An outage changes nothing (SPEC §13, issue 36's Done-when), on every Slurm version (``site``): with jobs
running under a real :class:`~dispatch.supervise.Supervisor` (``run``, its watch kept open, as ``dispatch
supervise`` runs it), five times each —

- slurmctld SIGKILLed, then restarted (each reading during it waits out Slurm's retries, about 9 s);
- munged stopped for 30 s, then started (every command fails at once; Slurm itself marks the nodes down
  after ``SlurmdTimeout`` and ends their jobs ``NODE_FAIL`` — a true outcome, which the policy requeues);
- the login node's sshd stopped and every connection to it cut, then started (the ssh transport only) —

every job ends with its true outcome (the one Slurm gives it: exit 0, exit 3, an end while the cluster
could not be read, and ``node_lost`` where Slurm said so), none is ``lost``, dispatch never ``scancel``s,
and meanwhile another process's ``get`` and the command line's ``dispatch status`` answer from the store
("cluster unreachable since").

Cost (measured here, 2 shared cores): see docs/slurm-versions.md "Outages under a supervisor".
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from slurm_fixtures import Site

import dispatch
from dispatch import (
    Cluster,
    Config,
    JobSpec,
    Policy,
    SqliteStore,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import Actor, Cause, JobRecord, Rule, State
from dispatch.model.policy import Action
from dispatch.supervise import StepReport
from dispatch_slurm import SlurmBackend
from dispatch_slurm.reader import dialect_of, parse_squeue
from dispatch_slurm.rootslurm import RootSlurm

pytestmark = pytest.mark.timeout(900)

ROUNDS = 5
BIN = Path(sys.executable).parent
POLICY = Policy(rules={Cause.NODE_LOST: Rule(Action.REQUEUE, max=4 * ROUNDS, backoff=0.0)})
"""Slurm ends the jobs of nodes it marks down (munge down past SlurmdTimeout) ``NODE_FAIL``: requeued."""
JOBS = {"zero": "0", "three": "3", "meanwhile": "0", "late": "0"}
"""Each job's exit code; ``meanwhile`` is told to exit during the third outage, the others after the last;
``late`` is submitted during the first outage (unreachable, not refused: it starts once Slurm answers)."""

_n = iter(range(1, 10_000))


@dataclass
class Outage:
    name: str
    begin: Callable[[], object]
    end: Callable[[], object]
    seconds: float
    """How long the outage lasts at least."""


@dataclass
class Supervised:
    cluster: Cluster
    observer: Cluster
    """Another process's view of the same store (a dashboard, a second terminal)."""
    config: Path
    control: Path
    reports: list[StepReport]


@pytest_asyncio.fixture
async def supervised(site: Site, tmp_path: Path) -> AsyncIterator[Supervised]:
    settings = site.settings()
    config = tmp_path / "cluster.yaml"
    config.write_text(json.dumps({"adapter": "slurm", "settings": settings, "store": {"sqlite": "jobs.db"}}))
    control = site.cluster.workdir / f"outage-{os.getpid()}-{next(_n)}"
    control.mkdir(parents=True)
    cluster = await dispatch.open(
        "slurm", Config(adapter=settings, store=SqliteStore(tmp_path / "jobs.db"), policy=POLICY)
    )
    observer = await dispatch.open("slurm", Config(adapter=settings, store=SqliteStore(tmp_path / "jobs.db")))
    reports: list[StepReport] = []
    try:
        yield Supervised(cluster, observer, config, control, reports)
    finally:
        await observer.close()
        await cluster.close()


def waiting(control: Path) -> JobSpec:
    """A job that runs until its control file exists (any incarnation), then exits with the code in it."""
    script = f'c={control}/"$DISPATCH_JOB_ID"; while [ ! -e "$c" ]; do sleep 0.2; done; exit "$(cat "$c")"'
    return JobSpec(command=("sh", "-c", script))


def tell(control: Path, job_id: str, code: str) -> None:
    aside = control / f".{job_id}"
    aside.write_text(code)
    aside.replace(control / job_id)


async def all_running(cluster: Cluster, ids: list[str]) -> None:
    """Until every job that has not ended runs (a requeued one again, at its next incarnation)."""
    async with asyncio.timeout(180):
        while True:
            recs = [await cluster.record(j) for j in ids]
            if all(r.state is State.RUNNING or r.outcome.terminal for r in recs):
                return
            await asyncio.sleep(0.5)


async def answers_again(s: Supervised, job_id: str) -> None:
    """Until another process reads the cluster again (the daemon is back and answers)."""
    async with asyncio.timeout(120):
        while True:
            await s.observer.get(job_id)
            if s.observer.unreachable is None:
                return
            await asyncio.sleep(0.5)


async def stepping(s: Supervised, site: Site, ids: list[str]) -> None:
    """Until every job that has not ended runs its step (srun's ``.0``), before the next outage begins. A
    job runs its batch script first, and srun asks slurmctld for the step a moment later (after
    ``--export=NONE``'s login, seconds under load): asked while slurmctld was down, the step failed
    ("Expired or invalid job") and the job exited 1 — Slurm's truth, which the record took, but not the
    exit code the test tells the job to end with (seen on 22.05 under load)."""
    async with asyncio.timeout(180):
        while True:
            recs = [await s.cluster.record(j) for j in ids]
            steps = set(site.slurm("squeue", "-h", "-s", "-o", "%i").split())
            if all(
                r.outcome.terminal or (r.handle is not None and f"{r.handle.ref}.0" in steps) for r in recs
            ):
                return
            await asyncio.sleep(0.5)


async def all_ended(cluster: Cluster, ids: list[str]) -> None:
    async with asyncio.timeout(180):
        while True:
            if all([(await cluster.record(j)).outcome.terminal for j in ids]):
                return
            await asyncio.sleep(0.5)


def status(config: Path, job_id: str) -> subprocess.CompletedProcess[str]:
    """``dispatch status`` as a person would type it in another terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["dispatch", "--config", str(config), "status", job_id],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def through(s: Supervised, site: Site, outage: Outage) -> None:
    """Five outages with jobs running under a supervisor, then the jobs' ends (see the module docstring)."""
    ids = [f"{outage.name}-{job}-{next(_n)}" for job in JOBS]
    for job_id in ids[:3]:
        await s.cluster.submit(waiting(s.control), job_id=job_id)
    supervisor = s.cluster.supervisor(poll=0.5, resync=5.0)
    stop = asyncio.Event()

    async def kept(report: StepReport) -> None:
        s.reports.append(report)

    running = asyncio.ensure_future(supervisor.run(stop=stop, on_step=kept))
    try:
        await all_running(s.cluster, ids[:3])
        await stepping(s, site, ids[:3])
        for round in range(ROUNDS):
            outage.begin()
            try:
                pause = asyncio.ensure_future(asyncio.sleep(outage.seconds))
                if round == 2:
                    tell(s.control, ids[2], JOBS["meanwhile"])  # it ends while nobody can read Slurm
                checks = [answered_from_the_store(s, ids[:3], round)]
                if round == 0:
                    checks += [not_refused(s, ids[3]), asyncio.to_thread(status, s.config, ids[0])]
                done = await asyncio.gather(*checks)
                if round == 0:
                    shown = done[-1]
                    assert shown.returncode == 0, shown.stdout + shown.stderr
                    assert "cluster unreachable since" in shown.stdout, shown.stdout
                    assert "Traceback" not in shown.stderr, shown.stderr
                await pause
            finally:
                outage.end()
            await answers_again(s, ids[0])
            await all_running(s.cluster, ids)
            await stepping(s, site, ids)
        for job_id, job in zip(ids, JOBS, strict=True):
            if job != "meanwhile":
                tell(s.control, job_id, JOBS[job])
        await all_ended(s.cluster, ids)
    finally:
        stop.set()
        await running
    await judged(s, site, ids)


async def answered_from_the_store(s: Supervised, ids: list[str], round: int) -> None:
    """Another process's ``get`` answers with the record as stored (one the cluster would be read for,
    when there is one) and says the cluster is unreachable."""
    stored = [await s.observer.record(j) for j in ids]
    live = [r for r in stored if not r.outcome.terminal]
    if not live:
        return  # each is between two incarnations (Slurm ended it: NODE_FAIL), and get reads nothing
    rec = await s.observer.get(live[0].job_id)
    assert s.observer.unreachable is not None, f"round {round}: the outage did not show"
    assert rec.state is live[0].state and rec.state is not State.LOST, rec.outcome


async def not_refused(s: Supervised, job_id: str) -> None:
    """Slurm's verdict and a submit during the outage are unreachable, never a refusal (a refusal while
    munge was down read as UnsupportedError, and the job failed `invalid_spec`)."""
    with pytest.raises(UnavailableError) as checked:
        await s.cluster.capabilities(waiting(s.control))  # sbatch --test-only
    assert not isinstance(checked.value, UnsupportedError), checked.value
    with pytest.raises(UnavailableError) as submitted:
        await s.cluster.submit(waiting(s.control), job_id=job_id)
    assert not isinstance(submitted.value, UnsupportedError), submitted.value
    assert (await s.cluster.record(job_id)).state is State.PENDING


async def judged(s: Supervised, site: Site, ids: list[str]) -> None:
    """Every job's true outcome — the one Slurm gives its last incarnation, and for the jobs told to end
    once the cluster answered, their own exit code —, none lost, every requeue after a node_lost, no
    scancel by dispatch. (A job that ends while slurmctld is down can fail of it: srun cannot complete
    its step without the controller and exits 1 — Slurm's truth, which the record must take.)"""
    listed = {
        j.job_id: j
        for j in parse_squeue(site.slurm("squeue", "--json", "--states=all"), dialect_of(site.version))
    }
    wanted = {0: (State.SUCCEEDED, 0), 1: (State.FAILED, 3), 3: (State.SUCCEEDED, 0)}
    for i, job_id in enumerate(ids):
        rec: JobRecord = await s.cluster.record(job_id)
        assert rec.handle is not None and rec.handle.ref in listed, (job_id, rec.handle)
        slurm = listed[rec.handle.ref]
        truth = (State.SUCCEEDED, 0) if slurm.state == "COMPLETED" else (State.FAILED, slurm.exit_code)
        got = (rec.state, rec.outcome.evidence[0].exit_code)
        assert got == truth, (job_id, slurm, rec.outcome)
        if i in wanted:
            assert got == wanted[i], (job_id, rec.outcome)
        history = await s.cluster.history(job_id)
        assert all(t.state is not State.LOST for t in history), history
        ends = [t for t in history if t.actor is Actor.CLUSTER and t.state is not None and t.state.terminal]
        assert all(t.cause is Cause.NODE_LOST for t in ends[:-1]), ends  # Slurm's NODE_FAIL, requeued
    for backend in (s.cluster.backend, s.observer.backend):
        assert isinstance(backend, SlurmBackend)
        assert backend.transport.counts.get("scancel", 0) == 0, backend.transport.counts


async def test_slurmctld_killed_and_restarted_five_times(supervised: Supervised, site: Site) -> None:
    """22.05's squeue --json answers "jobs": [] with an errors entry (exit 0) when slurmctld is down: read
    as an empty queue, a running job was `lost` and the supervisor scancelled it."""
    slurm = site.cluster
    await through(supervised, site, Outage("ctld", slurm.kill_controller, slurm.start_controller, 3.0))


async def test_munged_stopped_for_30_s_five_times(supervised: Supervised, site: Site) -> None:
    """A refusal while munge was down read as UnsupportedError; a reading as an empty queue."""
    slurm = site.cluster
    await through(supervised, site, Outage("munge", slurm.stop_munge, slurm.start_munge, 30.0))


async def test_the_login_nodes_ssh_cut_five_times(supervised: Supervised, site: Site) -> None:
    """The ssh transport: a login node whose sshd is down and whose connections were cut."""
    slurm = site.cluster
    if not isinstance(slurm, RootSlurm):
        pytest.skip("22.05 runs here through the local transport (its ssh runs in test_slurm_conformance)")
    await through(supervised, site, Outage("ssh", slurm.stop_sshd, slurm.start_sshd, 3.0))
