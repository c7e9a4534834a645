"""Each scenario of SPEC §13 on every Slurm version (``site``: 22.05 here, 24.11 and 26.05 in Debian roots
over ssh): the state and cause dispatch reports, with the Slurm job id, state, reason and exit code in
the evidence."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from slurm_fixtures import Site

import dispatch
from dispatch import Cluster, Config, ConflictError, JobRecord, JobSpec, MemoryStore, NotFoundError
from dispatch.backend import place
from dispatch.model import Absent, Cause, Handle, Identity, Observation, State
from dispatch_slurm import SlurmBackend, StaleHoldError, open_backend, parse_settings
from dispatch_slurm.reader import parse_squeue
from dispatch_slurm.script import node_output

pytestmark = pytest.mark.timeout(300)


@pytest_asyncio.fixture
async def backend(site: Site) -> AsyncIterator[SlurmBackend]:
    b = await open_backend(parse_settings(json.dumps(site.settings())))
    yield b
    await b.close()


def sh(script: str, nodes: int = 1, **kw: object) -> JobSpec:
    return JobSpec(command=("sh", "-c", script), nodes=nodes, **kw)  # type: ignore[arg-type]


_n = iter(range(1, 10_000))


def ident(tag: str) -> Identity:
    return Identity(f"scn-{tag}-{next(_n)}")


async def until(backend: SlurmBackend, handle: object, done: object, seconds: float = 150) -> Observation:
    assert callable(done)
    async with asyncio.timeout(seconds):
        while True:
            obs = await backend.observe(handle)  # type: ignore[arg-type]
            assert not isinstance(obs, Absent), f"{handle} read absent: {obs}"
            if done(obs):
                return obs
            await asyncio.sleep(0.5)


async def final(backend: SlurmBackend, handle: object, seconds: float = 150) -> Observation:
    return await until(backend, handle, lambda o: o.outcome.terminal, seconds)


def evidence(obs: Observation, handle: object) -> dict[str, object]:
    ev = obs.outcome.evidence[0]
    assert ev.kind == "SlurmJob" and ev.name == handle.ref  # type: ignore[attr-defined]
    return {"reason": ev.reason, "exit": ev.exit_code, "node": ev.node, "output": ev.output}


async def test_success_on_two_nodes(backend: SlurmBackend, site: Site) -> None:
    h = await place(backend, sh("echo hello from $NODE_RANK of $WORLD_SIZE", nodes=2), ident("ok"))
    obs = await final(backend, h)
    assert (obs.state, obs.cause) == (State.SUCCEEDED, Cause.NONE)
    ev = evidence(obs, h)
    assert ev["reason"] == "COMPLETED" and ev["exit"] == 0
    # The evidence names the two nodes Slurm chose (any two: the cluster is shared with other tests, and a
    # node busy with another job or still drained after an outage test is passed over).
    nodes = site.slurm("scontrol", "show", "hostnames", str(ev["node"])).split()
    assert len(nodes) == 2 and set(nodes) <= set(site.cluster.node_names), (ev["node"], nodes)
    assert [line async for line in backend.output(h, node=1)] == ["hello from 1 of 2"]


async def test_exit_code_3_on_two_nodes(backend: SlurmBackend) -> None:
    h = await place(backend, sh("exit 3", nodes=2), ident("exit3"))
    obs = await final(backend, h)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.EXIT_CODE)
    ev = evidence(obs, h)
    assert ev["reason"] == "FAILED/NonZeroExitCode" and ev["exit"] == 3, ev


async def test_over_the_memory_limit(backend: SlurmBackend) -> None:
    script = "python3 -c 'import time; b = bytearray(600 * 1024 * 1024); time.sleep(60)'"
    h = await place(backend, sh(script), ident("oom"))
    obs = await final(backend, h)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.OUT_OF_MEMORY), obs.outcome
    ev = evidence(obs, h)
    assert str(ev["reason"]).startswith("FAILED")
    assert any("exceeded memory limit" in line for line in ev["output"])  # type: ignore[attr-defined]


def _append(path: str, line: str) -> None:
    with open(path, "a") as out:
        out.write(line + "\n")


async def test_a_memory_message_written_after_the_job_ended_still_names_the_memory(
    backend: SlurmBackend, site: Site
) -> None:
    """slurmstepd's "exceeded memory limit" can reach the output after Slurm reports the job FAILED (seen
    under load): a SIGKILLed step's job stays running while the line may still come, and is read
    out_of_memory when it does; with no line, it is an exit code once the wait (MEMORY_WORD_WAIT) passed.
    Here the step kills itself, and the test writes the line late, as a loaded slurmstepd would."""
    late = await place(backend, sh("kill -9 $$"), ident("late-oom"))
    never = await place(backend, sh("kill -9 $$"), ident("plain-kill"))
    ending = await until(backend, late, lambda o: o.outcome.evidence[0].reason.startswith("FAILED"))
    assert (ending.state, ending.cause) == (State.RUNNING, Cause.NONE), ending.outcome
    assert "memory" in ending.outcome.evidence[0].message
    _append(
        node_output(str(site.cluster.workdir), late.identity, 0),
        f"slurmstepd: error: Step {late.ref}.0 exceeded memory limit (614400 > 524288), being killed",
    )
    obs = await final(backend, late)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.OUT_OF_MEMORY), obs.outcome
    assert any("exceeded memory limit" in line for line in evidence(obs, late)["output"])  # type: ignore[attr-defined]
    plain = await final(backend, never)
    assert (plain.state, plain.cause) == (State.FAILED, Cause.EXIT_CODE), plain.outcome
    assert evidence(plain, never)["exit"] == 128 + 9
    # The wait is timed from the job's end (Slurm's end_time), not from a process's first reading: a
    # process that first reads the job now (a supervisor started late) reads it settled at once.
    fresh = await open_backend(backend.settings)
    try:
        first = await fresh.observe(never)
    finally:
        await fresh.close()
    assert (first.state, first.cause) == (State.FAILED, Cause.EXIT_CODE), first.outcome


async def test_time_limit(backend: SlurmBackend) -> None:
    h = await place(backend, sh("sleep 600", time_limit=5), ident("time"))
    obs = await final(backend, h, seconds=240)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.TIMEOUT)
    assert evidence(obs, h)["reason"] == "TIMEOUT/TimeLimit"


async def test_node_failure(backend: SlurmBackend, site: Site) -> None:
    slurm = site.cluster
    h = await place(backend, sh("sleep 600"), ident("node"))
    running = await until(backend, h, lambda o: o.state is State.RUNNING)
    node = running.outcome.evidence[0].node
    assert node
    slurm.kill_node(node)
    try:
        obs = await final(backend, h, seconds=120)
    finally:
        slurm.start_node(node)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.NODE_LOST)
    ev = evidence(obs, h)
    assert str(ev["reason"]).startswith("NODE_FAIL") and ev["node"] == node


async def test_preemption(backend: SlurmBackend, site: Site) -> None:
    h = await place(backend, sh("sleep 600"), ident("preempt"))
    node = (await until(backend, h, lambda o: o.state is State.RUNNING)).outcome.evidence[0].node
    assert node
    site.cluster.preempt(node, seconds=2)
    obs = await final(backend, h)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.PREEMPTED)
    assert evidence(obs, h)["reason"] == "PREEMPTED"


async def test_cancel_by_dispatch_and_by_someone_else(site: Site) -> None:
    """Both read CANCELLED; the record says who: `cancelled` when it asked for the cancel, `failed`/
    `cancelled` when someone else's scancel ended it. Each stays `stopping` until its compute is gone."""
    cluster = await dispatch.open("slurm", Config(adapter=site.settings(), store=MemoryStore()))
    async with cluster:
        ours = await cluster.submit(sh("sleep 600"), job_id=f"cancel-us-{next(_n)}")
        theirs = await cluster.submit(sh("sleep 600"), job_id=f"cancel-them-{next(_n)}")
        for rec in (ours, theirs):
            await settled(cluster, rec.job_id, lambda r: r.state is State.RUNNING)
        handle = (await cluster.record(theirs.job_id)).handle
        assert handle is not None
        await cluster.cancel(ours.job_id)
        site.slurm("scancel", handle.ref)
        by_us = await settled(cluster, ours.job_id, lambda r: r.outcome.terminal)
        by_them = await settled(cluster, theirs.job_id, lambda r: r.outcome.terminal)
    assert (by_us.state, by_us.outcome.cause) == (State.CANCELLED, Cause.CANCELLED)
    assert (by_them.state, by_them.outcome.cause) == (State.FAILED, Cause.CANCELLED)
    assert by_them.outcome.evidence[0].reason == "CANCELLED"


async def settled(cluster: Cluster, job_id: str, done: Callable[[JobRecord], bool]) -> JobRecord:
    async with asyncio.timeout(150):
        while True:
            rec = await cluster.get(job_id)
            if done(rec):
                return rec
            await asyncio.sleep(0.5)


async def test_hold_release_and_a_stale_release(backend: SlurmBackend) -> None:
    h = await place(backend, sh("sleep 600"), ident("hold"), held=True)
    assert (await backend.observe(h)).state is State.HELD
    token = await backend.hold(h)
    await backend.hold(h)  # a second hold moves the start time: the first token is stale now
    with pytest.raises(StaleHoldError):
        await backend.release(h, token)
    assert (await backend.observe(h)).state is State.HELD
    fresh = await backend.hold(h)
    await backend.release(h, fresh)
    await until(backend, h, lambda o: o.state is State.RUNNING)
    with pytest.raises(ConflictError):
        await backend.release(h, fresh)
    await backend.stop(h)


async def test_a_release_right_after_holding_a_running_job_starts_it_again(
    backend: SlurmBackend, site: Site
) -> None:
    """Holding a running job requeues it, which revokes its launch credential; slurmd refuses a credential
    made in the same second as that revocation and kills the relaunch (FAILED, exit 1: "Job credential
    revoked"). So a release never lets the job start in the second of its hold."""
    h = await place(backend, sh("sleep 600"), ident("rehold"))
    await until(backend, h, lambda o: o.state is State.RUNNING)
    token = await backend.hold(h)
    held_until = int(time.time())  # the requeue happened at this second or before
    await backend.release(h, token)
    listed = parse_squeue(site.slurm("squeue", "--json", "--states=all"), backend.info.dialect)
    (job,) = [j for j in listed if j.job_id == h.ref]
    assert job.eligible_time > held_until, (job.eligible_time, held_until)
    obs = await until(backend, h, lambda o: o.state is State.RUNNING or o.outcome.terminal)
    assert obs.state is State.RUNNING, obs.outcome
    await backend.stop(h)


async def test_one_poll_serves_every_watcher(backend: SlurmBackend) -> None:
    """Two watches of one backend see the same changes (same cursors) from one squeue per poll."""
    first, second = backend.watch(), backend.watch()
    h = await place(backend, sh("sleep 1"), ident("watch"))
    seen: dict[int, list[str]] = {0: [], 1: []}

    async def follow(i: int, stream: object) -> None:
        async for change in stream:  # type: ignore[attr-defined]
            if change.handle.ref == h.ref:
                seen[i].append(f"{change.cursor} {change.observation.state}")
                if change.observation.outcome.terminal:
                    return

    before = backend.transport.counts.get("squeue", 0)
    async with asyncio.timeout(120):
        await asyncio.gather(follow(0, first), follow(1, second))
    squeues = backend.transport.counts.get("squeue", 0) - before
    await first.aclose()  # type: ignore[attr-defined]
    await second.aclose()  # type: ignore[attr-defined]
    assert seen[0] == seen[1] and seen[0][-1].endswith("succeeded"), seen
    assert squeues == backend.polls, (squeues, backend.polls)


async def test_a_step_cancelled_by_someone_else_is_cancelled_naming_the_step(
    backend: SlurmBackend, site: Site
) -> None:
    """`scancel JOB.0` read failed/exit_code 137 though the output says the step was cancelled."""
    h = await place(backend, sh("sleep 600"), ident("step"))
    await until(backend, h, lambda o: o.state is State.RUNNING)
    async with asyncio.timeout(60):  # the step is launched a moment after the job runs
        while True:
            if f"{h.ref}.0" in site.slurm("squeue", "-h", "-s", "-o", "%i").split():
                break
            await asyncio.sleep(0.2)
    site.slurm("scancel", f"{h.ref}.0")
    obs = await final(backend, h)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.CANCELLED), obs.outcome
    ev = obs.outcome.evidence[0]
    assert ev.reason.startswith("FAILED") and f"step {h.ref}.0 on " in ev.message, ev


async def test_a_suspended_job_is_running_with_the_suspension_in_the_evidence(
    backend: SlurmBackend, site: Site
) -> None:
    h = await place(backend, sh("sleep 600"), ident("suspend"))
    await until(backend, h, lambda o: o.state is State.RUNNING)
    site.slurm("scontrol", "suspend", h.ref)
    try:
        obs = await until(backend, h, lambda o: o.outcome.evidence[0].reason == "SUSPENDED")
        assert (obs.state, obs.cause) == (State.RUNNING, Cause.NONE)
        assert "scontrol suspend" in obs.outcome.evidence[0].message
        assert not await backend.ceased(h)  # it keeps its nodes
    finally:
        site.slurm("scontrol", "resume", h.ref)
    resumed = await until(backend, h, lambda o: o.outcome.evidence[0].reason == "RUNNING")
    assert resumed.state is State.RUNNING
    await backend.stop(h)


async def test_a_multi_line_command_runs_as_written(backend: SlurmBackend) -> None:
    """A command item with newlines (a multi-line sh -c script) is one quoted argument of the script."""
    script = "set -e\nfor i in 1 2; do\n  echo \"line $i of 'it'\"\ndone\n"
    h = await place(backend, sh(script), ident("lines"))
    obs = await final(backend, h)
    assert obs.state is State.SUCCEEDED, obs.outcome
    assert [line async for line in backend.output(h)] == ["line 1 of 'it'", "line 2 of 'it'"]


async def test_a_workdir_that_tries_to_run_something_runs_nothing(site: Site) -> None:
    """script.py pasted workdir unquoted into srun --output: `$(touch${IFS}/tmp/x)` created the file.
    Quoted, the path is just a strange directory name (spaces, quotes, % and # included). The target is
    in the cluster's shared workdir, which the login node, the compute nodes and this test all see."""
    n = next(_n)
    target = site.cluster.workdir / f"pwned-{n}"
    odd = str(site.cluster.workdir / f"odd dir {n} 'q' \"dq\" 100% #x $(touch${{IFS}}{target})")
    b = await open_backend(parse_settings(json.dumps(site.settings(workdir=odd))))
    try:
        h = await place(b, sh("echo hello from $NODE_RANK", nodes=2), ident("odd"))
        obs = await final(b, h)
        assert obs.state is State.SUCCEEDED, obs.outcome
        assert [line async for line in b.output(h, node=1)] == ["hello from 1"]
    finally:
        await b.close()
    assert not target.exists()
    directory = Path(odd) / b.native_name(h.identity)
    assert sorted(p.name for p in directory.iterdir()) == ["batch.out", "ended", "node-0.out", "node-1.out"]


async def test_the_output_of_an_ended_job_nobody_remembers_is_read_from_its_directory(
    backend: SlurmBackend,
) -> None:
    """The node count comes from the reading, else from the job's directory: an ended 2-node job that
    neither squeue nor the completion log knows any more still shows node 1 (it said "there is no node 1"
    when the reading it took the count from was gone)."""
    h = await place(backend, sh("echo hello from $NODE_RANK", nodes=2), ident("forgotten"))
    assert (await final(backend, h)).state is State.SUCCEEDED
    forgotten = Handle(h.backend, h.identity, "999999", cluster=h.cluster)  # no Slurm job has this id
    assert [line async for line in backend.output(forgotten, node=1)] == ["hello from 1"]
    with pytest.raises(NotFoundError):
        [line async for line in backend.output(forgotten, node=2)]


@pytest.mark.parametrize("by", ["admin", "preemption"])
async def test_a_requeue_by_slurm_or_an_admin_is_a_restart_in_place(site: Site, by: str) -> None:
    """With `requeue: slurm`, a job Slurm requeues (preemption under PreemptMode=REQUEUE) or an admin
    requeues (`scontrol requeue`) is the same incarnation pending again with Restarts > 0 —
    `queued`/`preempted`, then `running` and `succeeded` under the same handle."""
    b = await open_backend(parse_settings(json.dumps(site.settings(requeue="slurm"))))
    try:
        h = await place(b, sh("sleep 6"), ident(f"requeue-{by}"))
        node = (await until(b, h, lambda o: o.state is State.RUNNING)).outcome.evidence[0].node
        assert node
        if by == "admin":
            site.slurm("scontrol", "requeue", h.ref)
        else:
            site.cluster.preempt(node, seconds=2)
        again = await until(b, h, lambda o: o.state is State.QUEUED, seconds=60)
        assert again.cause is Cause.PREEMPTED, again.outcome
        obs = await final(b, h)
        assert (obs.state, obs.cause) == (State.SUCCEEDED, Cause.NONE), obs.outcome
        assert obs.handle == h  # the same incarnation all along
    finally:
        await b.close()


async def test_a_start_is_one_round_trip_and_looks_up_only_after_an_earlier_attempt(
    backend: SlurmBackend,
) -> None:
    """One `sh -c` makes the job's directory and submits (no --test-only, no identity lookup, no mkdir
    of its own); a start that finds the directory made (an earlier attempt) looks the identity up, and
    adopts the job it finds or submits when there is none."""
    before = dict(backend.transport.counts)
    h = await place(backend, sh("sleep 1"), ident("one-trip"))
    used = {k: v - before.get(k, 0) for k, v in backend.transport.counts.items() if v != before.get(k, 0)}
    assert used == {"sh": 1}, used
    again = await place(backend, sh("sleep 1"), h.identity)  # as after a crash before the handle was kept
    assert again == h
    tried = ident("tried-before")
    Path(node_output(backend.info.workdir, tried, 0)).parent.mkdir(parents=True)  # an attempt that failed
    started = await place(backend, sh("sleep 1"), tried)
    assert (await final(backend, started)).state is State.SUCCEEDED
    assert (await final(backend, h)).state is State.SUCCEEDED
