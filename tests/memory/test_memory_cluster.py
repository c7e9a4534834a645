"""The memory cluster's semantics through the public API: capacity and queueing, timeouts, image
pulls, holds, cluster events, cessation, watch, identity and dry runs."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import pytest

from dispatch import (
    Absent,
    Cause,
    Change,
    Compute,
    ConflictError,
    Epoch,
    Extensions,
    Identity,
    Image,
    InvalidError,
    JobSpec,
    ManualClock,
    NotFoundError,
    Observation,
    OpaqueExtension,
    ReadOnlyError,
    SharedCheckpoint,
    State,
    UnavailableError,
    UnsupportedError,
)
from dispatch.backend import place
from dispatch.memory import MemoryBackend
from dispatch.model import Share, bucket

Make = Callable[..., MemoryBackend]
Job = Callable[..., JobSpec]


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


# --- capacity -------------------------------------------------------------------------------------


async def test_queues_in_strict_fifo_when_capacity_is_short(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(nodes=3, startDelay=1, cessationDelay=2)
    big = await place(backend, job("hang", nodes=2), Identity("big"))
    wide = await place(backend, job("sleep 1", nodes=2), Identity("wide"))
    small = await place(backend, job("sleep 1"), Identity("small"))
    obs = await backend.observe(wide)
    assert (obs.state, obs.cause) == (State.QUEUED, Cause.NO_CAPACITY)
    (ev,) = obs.outcome.evidence
    assert (ev.reason, ev.message) == ("InsufficientNodes", "waiting for 2 free node(s) of 3")
    # One node is free, but the head of the queue needs two: nobody jumps it.
    assert (await backend.observe(small)).state is State.QUEUED
    clock.advance(100)
    assert (await backend.observe(small)).state is State.QUEUED
    await backend.stop(big)
    clock.advance(1.5)  # big's compute lingers cessationDelay: its nodes are not free yet
    assert (await backend.observe(wide)).state is State.QUEUED
    clock.advance(0.5)
    assert (await backend.observe(wide)).state is State.STARTING
    assert (await backend.observe(small)).state is State.STARTING
    nodes = {o.handle.ref: o.outcome.evidence[0].node for o in await backend.list()}
    assert nodes[wide.ref] == "node-0" and nodes[small.ref] == "node-2"


async def test_capacity_frees_when_a_failed_jobs_compute_is_gone(
    make: Make, clock: ManualClock, job: Job
) -> None:
    backend = make(nodes=1, startDelay=0, cessationDelay=2)
    first = await place(backend, job("sleep 3; exit 1"), Identity("a"))
    second = await place(backend, job("sleep 1"), Identity("b"))
    clock.advance(3)
    ended = await backend.observe(first)
    assert isinstance(ended, Observation)
    # Failed, but its pods take their grace period to go: the node is not free yet.
    assert (ended.cause, ended.compute) == (Cause.EXIT_CODE, Compute.PRESENT)
    assert (await backend.observe(second)).state is State.QUEUED  # type: ignore[union-attr]
    clock.advance(2)
    gone = await backend.observe(first)
    assert isinstance(gone, Observation) and gone.compute is Compute.GONE
    # second was admitted at t=5 (when first's compute went), so it started then, not later
    clock.advance(1)
    assert (await backend.observe(second)).state is State.SUCCEEDED  # type: ignore[union-attr]


async def test_more_nodes_than_the_cluster_is_unsupported(make: Make, job: Job) -> None:
    backend = make(nodes=2)
    spec = JobSpec(
        ("x",),
        nodes=3,
        extensions=Extensions([OpaqueExtension("acme.example/Gpu", {"count": 1})]),
    )
    with pytest.raises(UnsupportedError) as caught:
        await backend.capabilities(spec)
    assert len(caught.value.reasons) == 2
    assert "acme.example/Gpu" in caught.value.reasons[0]
    assert "asks for 3 nodes; this memory cluster has 2" in caught.value.reasons[1]
    with pytest.raises(UnsupportedError):
        await place(backend, spec, Identity("too-big"))
    assert await backend.list() == []


async def test_capabilities(make: Make) -> None:
    caps = await make(nodes=5).capabilities()
    assert (caps.holds, caps.watch, caps.cessation, caps.output, caps.queueing) == (
        True,
        True,
        True,
        False,
        True,
    )
    assert caps.shared_checkpoint and not caps.read_only
    assert caps.extensions == {"dispatch/Image", "dispatch/SharedCheckpoint"}
    assert caps.limits.max_nodes == 5


# --- timeouts and images ----------------------------------------------------------------------------


async def test_time_limit_counts_from_admission(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(nodes=1, startDelay=1, cessationDelay=2)
    blocker = await place(backend, job("sleep 10"), Identity("blocker"))
    handle = await place(backend, job("hang", time_limit=5), Identity("slowpoke"))
    clock.advance(11)  # queued time does not count
    assert (await backend.observe(blocker)).state is State.SUCCEEDED
    clock.advance(4.5)
    assert (await backend.observe(handle)).state is State.RUNNING
    clock.advance(0.5)
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.TIMEOUT)
    assert obs.outcome.evidence[0].reason == "DeadlineExceeded"
    assert "time limit of 5 s" in obs.outcome.evidence[0].message
    assert not await backend.ceased(handle)  # killed: its compute takes cessationDelay to go
    clock.advance(2)
    assert await backend.ceased(handle)


async def test_a_job_ending_within_its_limit_succeeds(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=1)
    handle = await place(backend, job("sleep 4"), Identity("in-time"))
    handle_limited = await place(backend, job("sleep 4", time_limit=5), Identity("in-time-2"))
    clock.advance(5)
    assert (await backend.observe(handle)).state is State.SUCCEEDED
    assert (await backend.observe(handle_limited)).state is State.SUCCEEDED


async def test_image_pull_failure(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=1, imagePullGrace=10)
    bad = job(extensions=Extensions([Image("registry.invalid/team/train:1")]))
    handle = await place(backend, bad, Identity("pull"))
    clock.advance(9)
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause) == (State.STARTING, Cause.IMAGE_PULL)
    assert obs.outcome.evidence[0].reason == "ErrImagePull"
    assert 'registry host "registry.invalid" does not resolve' in obs.outcome.evidence[0].message
    clock.advance(1)
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.IMAGE_PULL)
    assert obs.outcome.evidence[0].reason == "ImagePullBackOff"


@pytest.mark.parametrize(
    "ref", ["pytorch/pytorch:2.5", "localhost:5000/x", "ghcr.io/a/b@sha256:00", "invalid/x"]
)
async def test_good_images_pull(make: Make, clock: ManualClock, job: Job, ref: str) -> None:
    backend = make(startDelay=1)
    handle = await place(backend, job(extensions=Extensions([Image(ref)])), Identity("good"))
    clock.advance(1)
    assert (await backend.observe(handle)).state is State.RUNNING


# --- holds --------------------------------------------------------------------------------------


async def test_holds(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(nodes=1, startDelay=0, cessationDelay=3)
    handle = await place(backend, job("print once; sleep 10"), Identity("held"), held=True)
    clock.advance(1000)
    assert (await backend.observe(handle)).state is State.HELD
    token = await backend.hold(handle)
    assert await backend.hold(handle) == token  # holding a held job gives its current token
    await backend.release(handle, token)
    clock.advance(5)
    assert (await backend.observe(handle)).state is State.RUNNING
    # holding a running job gives its node back (after cessationDelay) and restarts it from scratch
    token2 = await backend.hold(handle)
    assert token2 != token
    assert (await backend.observe(handle)).state is State.HELD
    with pytest.raises(ConflictError, match="stale hold"):
        await backend.release(handle, token)
    await backend.release(handle, token2)
    assert (await backend.observe(handle)).state is State.QUEUED  # its old compute still lingers
    clock.advance(3)
    assert (await backend.observe(handle)).state is State.RUNNING
    clock.advance(10)
    assert (await backend.observe(handle)).state is State.SUCCEEDED
    with pytest.raises(ConflictError, match="already ended"):
        await backend.hold(handle)


async def test_a_queued_job_can_be_held_and_others_pass_it(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(nodes=1, startDelay=0)
    running = await place(backend, job("sleep 5"), Identity("r"))
    queued = await place(backend, job("sleep 5"), Identity("q"))
    behind = await place(backend, job("sleep 5"), Identity("b"))
    token = await backend.hold(queued)
    clock.advance(5)
    assert (await backend.observe(running)).state is State.SUCCEEDED
    assert (await backend.observe(behind)).state is State.RUNNING
    assert (await backend.observe(queued)).state is State.HELD
    await backend.release(queued, token)
    assert (await backend.observe(queued)).state is State.QUEUED


async def test_hold_of_an_unknown_job(make: Make, job: Job) -> None:
    backend = make()
    other = make()
    handle = await place(other, job(), Identity("elsewhere"))
    with pytest.raises(NotFoundError):
        await backend.hold(handle)


# --- cluster events -------------------------------------------------------------------------------


async def test_lose_node_fails_every_job_on_it(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(nodes=3, startDelay=0)
    pair = await place(backend, job("hang", nodes=2), Identity("pair"))
    solo = await place(backend, job("hang"), Identity("solo"))
    await backend.lose_node(pair, rank=1)
    obs = await backend.observe(pair)
    (ev,) = obs.outcome.evidence
    assert (obs.cause, ev.kind, ev.name, ev.node) == (Cause.NODE_LOST, "MemoryNode", "node-1", "node-1")
    assert (await backend.observe(solo)).state is State.RUNNING


async def test_injected_events(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=1)
    handle = await place(backend, job("hang"), Identity("events"))
    with pytest.raises(InvalidError) as caught:
        await backend.inject(handle, "sleep 3")
    assert caught.value.path == "action"
    with pytest.raises(InvalidError):
        await backend.inject(handle, "rank=0: oom")
    with pytest.raises(InvalidError):
        await backend.exit(handle, 300)
    with pytest.raises(InvalidError) as caught:
        await backend.oom(handle, rank=1)
    assert caught.value.path == "rank"
    await backend.inject(handle, "slow-stop 7")
    await backend.evict(handle)  # a starting pod can be evicted
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.EVICTED)
    with pytest.raises(ConflictError, match="not starting or running"):
        await backend.preempt(handle)


async def test_injected_exit_and_hang(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=0)
    a = await place(backend, job("sleep 2"), Identity("a"))
    b = await place(backend, job("sleep 2"), Identity("b"))
    await backend.inject(a, "hang")
    await backend.exit(b, 5)
    clock.advance(100)
    assert (await backend.observe(a)).state is State.RUNNING
    obs = await backend.observe(b)
    assert (obs.cause, obs.outcome.evidence[0].exit_code) == (Cause.EXIT_CODE, 5)
    await backend.exit(a, 0)
    assert (await backend.observe(a)).state is State.SUCCEEDED


async def test_injecting_into_a_queued_job_is_a_conflict(make: Make, job: Job) -> None:
    backend = make(nodes=1)
    await place(backend, job("hang"), Identity("a"))
    queued = await place(backend, job("hang"), Identity("b"))
    with pytest.raises(ConflictError):
        await backend.oom(queued)


async def test_vanished_job_reads_absent(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(nodes=1, startDelay=0)
    handle = await place(backend, job("hang"), Identity("gone"))
    waiting = await place(backend, job("hang"), Identity("next"))
    await backend.vanish(handle)
    obs = await backend.observe(handle)
    # Absent, never "lost": only the host concludes that, from two such readings.
    assert isinstance(obs, Absent)
    assert (obs.handle, obs.evidence[0].reason) == (handle, "NotFound")
    assert await backend.ceased(handle)
    assert [o.handle for o in await backend.list()] == [waiting]
    assert (await backend.observe(waiting)).state is State.RUNNING  # its node was freed
    await backend.stop(handle)  # stopping what is gone is a no-op


# --- cessation and overlap -------------------------------------------------------------------------


async def test_wait_ceased_sleeps_on_the_clock(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=0, cessationDelay=2)
    handle = await place(backend, job("hang"), Identity("w"))
    waiter = asyncio.ensure_future(backend.wait_ceased(handle))
    await settle()
    assert not waiter.done()
    await backend.stop(handle)
    await settle()
    assert not waiter.done()
    clock.advance(2)
    await settle()
    assert waiter.done()
    await waiter


async def test_stopping_a_queued_or_held_job_ceases_at_once(make: Make, job: Job) -> None:
    backend = make(nodes=1)
    await place(backend, job("hang"), Identity("a"))
    queued = await place(backend, job("hang"), Identity("b"))
    held = await place(backend, job("hang"), Identity("c"), held=True)
    assert not await backend.ceased(queued)  # it may still run
    for handle in (queued, held):
        await backend.stop(handle)
        obs = await backend.observe(handle)
        assert (obs.state, obs.cause) == (State.CANCELLED, Cause.CANCELLED)
        assert await backend.ceased(handle)


async def test_overlapping_incarnations_are_recorded(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=0, cessationDelay=5)
    first = await place(backend, job("hang"), Identity("o"))
    await backend.stop(first)
    second = await place(backend, job("hang"), Identity("o", Epoch(2, 1)))
    assert [(o.running, o.started) for o in backend.overlaps] == [(first.identity, second.identity)]
    clock.advance(5)
    await backend.wait_ceased(first)
    third = await place(backend, job("hang"), Identity("o", Epoch(3, 2)))
    assert len(backend.overlaps) == 2  # second still runs
    await backend.stop(second)
    await backend.stop(third)


# --- watch --------------------------------------------------------------------------------------


async def collect(
    backend: MemoryBackend, cursor: str | None, count: int, share: Share | None = None
) -> list[Change]:
    out: list[Change] = []
    stream = backend.watch(cursor, share=share)
    try:
        async for change in stream:
            out.append(change)
            if len(out) == count:
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return out


async def test_watch_emits_each_change_and_resumes_from_a_cursor(
    make: Make, clock: ManualClock, job: Job
) -> None:
    backend = make(startDelay=1, cessationDelay=0)
    seen: list[Change] = []

    async def follow() -> None:
        async for change in backend.watch():
            seen.append(change)

    task = asyncio.ensure_future(follow())
    try:
        await settle()
        handle = await place(backend, job("sleep 2; exit 3"), Identity("w"))
        for _ in range(10):
            clock.advance(1)
            await settle()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    shown = [str(c.observation.outcome) for c in seen if c.observation is not None]
    # The failing job reads "starting" with its cause for a moment, as on real controllers.
    assert shown == ["starting", "running", "starting (exit_code)", "failed (exit_code)"]
    assert all(c.handle == handle for c in seen)
    resumed = await collect(backend, seen[0].cursor, 3)
    assert resumed == seen[1:]


async def test_watch_follows_the_clock(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=1)
    seen: list[Change] = []

    async def follow() -> None:
        async for change in backend.watch():
            seen.append(change)

    task = asyncio.ensure_future(follow())
    try:
        await settle()
        handle = await place(backend, job("sleep 2"), Identity("live"))
        await settle()
        assert [c.observation.state for c in seen] == [State.STARTING]
        clock.advance(1)
        await settle()
        assert [c.observation.state for c in seen] == [State.STARTING, State.RUNNING]
        clock.advance(2)
        await settle()
        assert [c.observation.state for c in seen][-1] is State.SUCCEEDED
        assert seen[-1].handle == handle
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_cursor_of_another_feed_relists(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=1)
    a = await place(backend, job("sleep 1"), Identity("a"))
    b = await place(backend, job("hang"), Identity("b"))
    clock.advance(5)
    first = await collect(backend, None, 2)  # the feed starts, and reads what the cluster shows
    assert [c.handle for c in first] == [a, b]
    relisted = await collect(backend, "another-process:5", 2)
    shown = [(c.handle, c.observation.state if c.observation else None) for c in relisted]
    assert shown == [(a, State.SUCCEEDED), (b, State.RUNNING)]
    # only the last change of a relist resumes after it; an earlier one relists again
    assert relisted[0].cursor.endswith(":relist") and relisted[1].cursor == backend.feed.cursor
    await backend.stop(b)
    after = await collect(backend, relisted[1].cursor, 1)
    assert after[0].handle == b and after[0].observation is not None
    assert (after[0].observation.state, after[0].observation.compute) == (State.CANCELLED, Compute.PRESENT)
    again = await collect(backend, relisted[0].cursor, 2)
    assert [c.handle for c in again] == [a, b]


async def test_a_watch_resumed_with_a_wider_share_replays_the_jobs_it_adds(
    make: Make, clock: ManualClock, job: Job
) -> None:
    """A fleet member whose share grows (a member died) opens its watch again from its cursor: every
    change since then of the jobs it gained comes, in order with those of the jobs it had."""
    backend = make(startDelay=1)
    ids = [f"job-{i}" for i in range(40)]
    a = ids[0]
    b = next(j for j in ids if bucket(j) != bucket(a))
    mine, both = Share(frozenset({bucket(a)})), Share(frozenset({bucket(a), bucket(b)}))
    ha = await place(backend, job("sleep 1; hang"), Identity(a))
    first = await collect(backend, None, 1, share=mine)
    assert [c.handle for c in first] == [ha]
    hb = await place(backend, job("sleep 2"), Identity(b))
    clock.advance(5)  # a runs; b starts, runs and succeeds, none of it sent to this share
    assert [c.handle for c in await collect(backend, first[0].cursor, 1, share=mine)] == [ha]
    resumed = await collect(backend, first[0].cursor, 4, share=both)
    shown = [(c.handle, c.observation.state if c.observation else None) for c in resumed]
    assert shown == [(hb, State.STARTING), (ha, State.RUNNING), (hb, State.RUNNING), (hb, State.SUCCEEDED)]


async def test_watch_refuses_a_cursor_that_is_not_text(make: Make) -> None:
    with pytest.raises(InvalidError) as caught:
        await collect(make(), 5, 1)  # type: ignore[arg-type]
    assert caught.value.path == "cursor"


# --- identity, start, dry run, read-only ----------------------------------------------------------


def test_native_names() -> None:
    from dispatch.memory import native_name

    long = Identity("Team_A." + "x" * 240, Epoch(12, 3))
    name = native_name(long)
    assert len(name) <= 63
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)
    assert name.startswith("team-a-x") and "-12-" in name
    assert native_name(Identity("7up")).startswith("j-7up-1-")
    assert native_name(Identity("job")) != native_name(Identity("JOB"))


async def test_start_conflicts_and_adoption(make: Make, job: Job) -> None:
    backend = make()
    handle = await place(backend, job(), Identity("adopt"))
    other_process = MemoryBackend(cluster=backend.cluster)
    assert await place(other_process, job("exit 1"), Identity("adopt")) == handle  # adopts, spec unchanged
    mismatched = type(handle)(handle.backend, Identity("someone-else"), handle.ref)
    with pytest.raises(ConflictError):
        await backend.observe(mismatched)
    with pytest.raises(InvalidError) as caught:
        await backend.observe(type(handle)("kubeflow", handle.identity, handle.ref))
    assert caught.value.path == "handle.backend"


async def test_identity_of(make: Make, job: Job) -> None:
    backend = make()
    obj = (await backend.prepare(job(), Identity("read-back", Epoch(4, 2)))).request
    assert backend.identity_of(obj) == Identity("read-back", Epoch(4, 2))
    assert backend.identity_of({"kind": "ConfigMap"}) is None
    broken = {**obj, "metadata": {**obj["metadata"], "annotations": {"dispatch.dev/job-id": "read-back"}}}
    with pytest.raises(InvalidError, match="epoch"):
        backend.identity_of(broken)


async def test_prepared_object(make: Make, job: Job) -> None:
    backend = make()
    spec = job(
        "sleep 1",
        nodes=2,
        procs_per_node=4,
        time_limit=60,
        extensions=Extensions([Image("example.org/t:1"), SharedCheckpoint("/ckpt/run")]),
    )
    identity = Identity("dry", Epoch(2, 1))
    obj = (await backend.prepare(spec, identity, held=True)).request
    assert obj["kind"] == "MemoryJob"
    assert obj["metadata"]["name"] == backend.native_name(identity)
    assert obj["spec"]["env"] == {
        "KUBESIM_SCRIPT": "sleep 1",
        "DISPATCH_JOB_ID": "dry",
        "DISPATCH_EPOCH": "2.1",
        "DISPATCH_CHECKPOINT_DIR": "/ckpt/run",
    }
    assert (obj["spec"]["held"], obj["spec"]["image"], obj["spec"]["timeLimit"]) == (
        True,
        "example.org/t:1",
        60,
    )
    assert await backend.list() == []
    handle = await place(backend, spec, identity, held=True)
    (created,) = backend.objects()
    assert created["status"] == {"state": "held", "cause": "none", "nodes": [], "hold": "hold-1"}
    assert {k: v for k, v in created.items() if k != "status"} == obj
    assert handle.ref == obj["metadata"]["name"]


async def test_checkpoint_dir_is_visible_to_guards(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(startDelay=0)
    spec = job(
        "env:DISPATCH_CHECKPOINT_DIR=/ckpt: exit 8", extensions=Extensions([SharedCheckpoint("/ckpt")])
    )
    handle = await place(backend, spec, Identity("ckpt"))
    assert (await backend.observe(handle)).outcome.evidence[0].exit_code == 8


async def test_read_only_view_of_a_cluster(make: Make, job: Job) -> None:
    writer = make()
    handle = await place(writer, job("hang"), Identity("ro"))
    reader = MemoryBackend(cluster=writer.cluster, read_only=True)
    assert (await reader.capabilities()).read_only
    assert [o.handle for o in await reader.list()] == [handle]
    for call in (
        place(reader, job(), Identity("x")),
        reader.stop(handle),
        reader.hold(handle),
        reader.release(handle, "hold-1"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ReadOnlyError):
            await call
    # A dry run writes nothing: a read-only view shows what a start would create.
    assert (await reader.prepare(job(), Identity("x"))).request["metadata"]["name"] == reader.native_name(
        Identity("x")
    )
    assert (await writer.observe(handle)).state is not State.CANCELLED


# --- outages --------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["down", "errors"])
async def test_a_cluster_that_does_not_answer_takes_no_write_and_checks_no_spec(
    make: Make, clock: ManualClock, job: Job, how: str
) -> None:
    """Not kinder than a real cluster: with its API server down (or slurmctld down) a create, a stop, a
    hold is refused and nothing is done, and checking a spec — which reads the cluster (Kubeflow's
    runtime, Slurm's ``sbatch --test-only``) — fails too. What it knows of itself it still says."""
    backend = make(nodes=2, startDelay=0, cessationDelay=0)
    running = await place(backend, job("hang"), Identity("running"))
    backend.cluster.outage(10, how)
    with pytest.raises(UnavailableError):
        await backend.capabilities(job("sleep 1"))
    assert (await backend.capabilities()).limits.max_nodes == 2
    with pytest.raises(UnavailableError):
        await place(backend, job("sleep 1"), Identity("new"))
    with pytest.raises(UnavailableError):
        await backend.stop(running)
    with pytest.raises(UnavailableError):
        await backend.hold(running)
    clock.advance(10)
    assert [o.handle.identity.job_id for o in await backend.list()] == ["running"]  # nothing was created
    assert (await backend.observe(running)).state is State.RUNNING  # nor stopped
    await place(backend, job("sleep 1"), Identity("new"))  # it answers again


async def test_a_partial_outage_still_takes_writes(make: Make, clock: ManualClock, job: Job) -> None:
    backend = make(nodes=2, startDelay=0)
    backend.cluster.outage(10, "partial")
    handle = await place(backend, job("hang"), Identity("j"))
    with pytest.raises(UnavailableError):
        await backend.observe(handle)  # the answer is partial: unreachable, never "gone"
    clock.advance(10)
    assert (await backend.observe(handle)).state is State.RUNNING
