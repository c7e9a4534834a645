"""The facade (operator and observer) through its public API, on the memory backend with a manual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import ClassVar

import pytest

from dispatch import (
    Actor,
    Capabilities,
    Cause,
    ConflictError,
    Epoch,
    Extensions,
    Handle,
    Identity,
    Image,
    InvalidError,
    JobRecord,
    JobSpec,
    ManualClock,
    Observation,
    OpaqueExtension,
    OutcomeUnknownError,
    ReadOnlyError,
    State,
    Transition,
    UnsupportedError,
)
from dispatch.backend import Prepared
from dispatch.cluster import CAS_ATTEMPTS, Cluster
from dispatch.memory import MemoryBackend
from dispatch.records import MemoryStore

from .helpers import SETTINGS, settle, spec


async def test_submit_records_the_job_and_starts_its_first_incarnation(
    cluster: Cluster, backend: MemoryBackend
) -> None:
    rec = await cluster.submit(spec(), job_id="train-1")
    assert rec.job_id == "train-1"
    assert rec.epoch == Epoch(1, 0)
    assert rec.handle is not None and rec.handle.identity == Identity("train-1", Epoch(1, 0), rec.nonce)
    assert rec.nonce and rec.identity == rec.handle.identity  # the record's own: a reused id never binds
    assert rec.state is State.STARTING  # refreshed from the cluster: it had capacity
    history = await cluster.history("train-1")
    first = history[0]
    assert (first.actor, first.what, first.state, first.epoch) == (
        Actor.USER,
        "submitted",
        State.PENDING,
        Epoch(),
    )
    assert [o.handle.identity for o in await backend.list()] == [rec.identity]


async def test_a_generated_job_id_is_valid(cluster: Cluster) -> None:
    rec = await cluster.submit(spec())
    assert rec.job_id.startswith("job-")


async def test_a_job_follows_the_cluster_to_success(cluster: Cluster, clock: ManualClock) -> None:
    await cluster.submit(spec("sleep 5; exit 0"), job_id="j")
    clock.advance(1)
    assert (await cluster.get("j")).state is State.RUNNING
    clock.advance(5)
    rec = await cluster.get("j")
    assert (rec.state, rec.outcome.cause) == (State.SUCCEEDED, Cause.NONE)
    states = [t.state for t in await cluster.history("j") if t.actor is Actor.CLUSTER]
    assert states == [State.STARTING, State.RUNNING, State.SUCCEEDED]
    # A terminal record is not refreshed again: nothing more is written.
    before = rec.revision
    clock.advance(100)
    assert (await cluster.get("j")).revision == before


async def test_a_scripted_preemption_is_a_typed_cause_with_evidence(
    cluster: Cluster, clock: ManualClock
) -> None:
    await cluster.submit(spec("env:DISPATCH_EPOCH=1.0: sleep 2; env:DISPATCH_EPOCH=1.0: preempt"), job_id="p")
    clock.advance(4)
    rec = await cluster.get("p")
    # Preempted, and its pods still terminate: stopping, with the cause it ends with.
    assert (rec.state, rec.outcome.cause) == (State.STOPPING, Cause.PREEMPTED)
    clock.advance(SETTINGS.cessation_delay)
    rec = await cluster.get("p")
    assert (rec.state, rec.outcome.cause) == (State.FAILED, Cause.PREEMPTED)
    assert rec.outcome.evidence and rec.outcome.evidence[0].reason
    states = [t.state for t in await cluster.history("p") if t.actor is Actor.CLUSTER and t.state]
    assert states == [State.STARTING, State.STOPPING, State.FAILED]


async def test_a_job_the_cluster_cannot_run_is_refused_before_anything_is_created(
    cluster: Cluster, backend: MemoryBackend, store: MemoryStore
) -> None:
    bad = JobSpec(
        command=("x",),
        env={"KUBESIM_SCRIPT": "exit 0"},
        extensions=Extensions([Image("img:1"), OpaqueExtension("acme/Gpu", {"count": 8})]),
    )
    with pytest.raises(UnsupportedError) as info:
        await cluster.submit(bad, job_id="refused")
    assert any("acme/Gpu" in r for r in info.value.reasons)
    assert await store.list() == []
    assert await backend.list() == []


async def test_too_many_nodes_is_refused_before_anything_is_created(
    cluster: Cluster, store: MemoryStore
) -> None:
    with pytest.raises(UnsupportedError):
        await cluster.submit(spec(nodes=SETTINGS.nodes + 1))
    assert await store.list() == []


async def test_a_taken_job_id_is_a_conflict_and_creates_nothing_more(
    cluster: Cluster, backend: MemoryBackend
) -> None:
    await cluster.submit(spec(), job_id="same")
    with pytest.raises(ConflictError):
        await cluster.submit(spec(), job_id="same")
    assert len(await backend.list()) == 1


async def test_an_invalid_job_id_is_refused(cluster: Cluster) -> None:
    with pytest.raises(InvalidError) as info:
        await cluster.submit(spec(), job_id="no spaces")
    assert info.value.path == "job_id"


class LostResponses:
    """A backend whose create responses are lost after the create happened (a dropped connection):
    only the required protocol, around a real memory backend."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def cluster_id(self) -> str:
        return self.inner.cluster_id

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return await self.inner.capabilities(spec)

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        return await self.inner.prepare(spec, identity, held=held)

    async def start(self, prepared: Prepared) -> Handle:
        await self.inner.start(prepared)
        raise OutcomeUnknownError(f"create of {prepared.identity}: connection reset before the response")

    async def observe(self, handle: Handle) -> Observation:
        return await self.inner.observe(handle)

    async def stop(self, handle: Handle) -> None:
        await self.inner.stop(handle)

    async def list(self) -> list[Observation]:
        return await self.inner.list()

    async def close(self) -> None:
        await self.inner.close()


async def test_a_start_with_an_unknown_outcome_is_recorded_then_settled_by_observation(
    backend: MemoryBackend, store: MemoryStore, clock: ManualClock
) -> None:
    async with Cluster(LostResponses(backend), store, clock=clock) as cluster:
        rec = await cluster.submit(spec(), job_id="u")
        assert rec.unknown_write is not None and "connection reset" in rec.unknown_write
        assert rec.handle is None
        assert "start outcome unknown" in [t.what for t in await cluster.history("u")]
        clock.advance(1)
        rec = await cluster.get("u")  # found by identity: the write had happened
        assert rec.unknown_write is None
        assert rec.handle is not None and rec.handle.identity == rec.identity
        assert rec.state is State.RUNNING
        assert "settled" in [t.what for t in await cluster.history("u")]


async def test_cancel_records_the_intent_and_ends_cancelled(cluster: Cluster, clock: ManualClock) -> None:
    await cluster.submit(spec("hang"), job_id="c")
    clock.advance(1)
    rec = await cluster.cancel("c")
    assert rec.cancel_requested
    clock.advance(SETTINGS.cessation_delay)
    rec = await cluster.get("c")
    assert (rec.state, rec.outcome.cause) == (State.CANCELLED, Cause.CANCELLED)
    whats = [(t.actor, t.what) for t in await cluster.history("c")]
    assert (Actor.USER, "cancel requested") in whats
    # Cancelling a finished job changes nothing.
    assert (await cluster.cancel("c")).revision == rec.revision


async def test_cancel_of_a_job_that_already_ended_keeps_its_real_outcome(
    cluster: Cluster, clock: ManualClock
) -> None:
    await cluster.submit(spec("sleep 2; exit 0"), job_id="done")
    clock.advance(10)  # it succeeded on the cluster; nobody has read that into the record yet
    rec = await cluster.cancel("done")
    assert (rec.state, rec.outcome.cause) == (State.SUCCEEDED, Cause.NONE)
    assert not rec.cancel_requested
    assert "cancel requested" not in [t.what for t in await cluster.history("done")]


async def test_resubmit_of_a_job_that_ended_unobserved(cluster: Cluster, clock: ManualClock) -> None:
    await cluster.submit(spec("sleep 2; exit 1"), job_id="again")
    clock.advance(10)  # it failed on the cluster; the record has not read that yet
    rec = await cluster.resubmit("again")
    assert rec.epoch == Epoch(2, 0)
    assert [(t.what, t.epoch) for t in await cluster.history("again") if t.state is State.FAILED] == [
        ("failed", Epoch(1, 0))
    ]


async def test_hold_and_release(cluster: Cluster, clock: ManualClock) -> None:
    await cluster.submit(spec("sleep 3; exit 0"), job_id="h")
    rec = await cluster.hold("h")
    assert rec.state is State.HELD and rec.hold_requested and rec.hold_token
    clock.advance(10)
    assert (await cluster.get("h")).state is State.HELD  # it does not run while held
    rec = await cluster.release("h")
    assert rec.hold_token is None and not rec.hold_requested
    assert rec.state is not State.HELD
    clock.advance(1 + 3)
    assert (await cluster.get("h")).state is State.SUCCEEDED
    with pytest.raises(ConflictError):
        await cluster.release("h")


async def test_submit_held_waits_for_release(cluster: Cluster, clock: ManualClock) -> None:
    rec = await cluster.submit(spec("sleep 1; exit 0"), job_id="sh", held=True)
    assert rec.state is State.HELD and rec.hold_token
    clock.advance(5)
    assert (await cluster.get("sh")).state is State.HELD
    await cluster.release("sh")
    clock.advance(2)
    assert (await cluster.get("sh")).state is State.SUCCEEDED


async def test_release_of_a_job_that_is_not_held_is_a_conflict(cluster: Cluster) -> None:
    await cluster.submit(spec(), job_id="nh")
    with pytest.raises(ConflictError):
        await cluster.release("nh")


async def test_resubmit_needs_a_finished_job_whose_compute_is_gone(
    cluster: Cluster, backend: MemoryBackend, clock: ManualClock
) -> None:
    await cluster.submit(spec("hang"), job_id="r")
    clock.advance(1)
    with pytest.raises(ConflictError):
        await cluster.resubmit("r")
    rec = await cluster.cancel("r")
    assert (rec.state, rec.outcome.cause) == (State.STOPPING, Cause.CANCELLED)  # its compute lingers
    assert rec.handle is not None and not await backend.ceased(rec.handle)
    with pytest.raises(ConflictError, match="stopping"):
        await cluster.resubmit("r", wait=0)  # not finished until its compute is gone
    assert (await cluster.get("r")).epoch == Epoch(1, 0)  # nothing started
    clock.advance(SETTINGS.cessation_delay)
    assert (await cluster.get("r")).state is State.CANCELLED
    new = await cluster.resubmit("r", spec("sleep 1; exit 0"))
    assert new.epoch == Epoch(2, 0)
    assert new.handle is not None and new.handle.identity == Identity("r", Epoch(2, 0), new.nonce)
    assert not new.cancel_requested
    assert new.spec.env["KUBESIM_SCRIPT"] == "sleep 1; exit 0"
    clock.advance(2)
    assert (await cluster.get("r")).state is State.SUCCEEDED
    assert "resubmitted" in [t.what for t in await cluster.history("r")]


async def test_resubmit_waits_for_a_slow_cessation(
    cluster: Cluster, backend: MemoryBackend, clock: ManualClock
) -> None:
    await cluster.submit(spec("slow-stop 30; exit 3"), job_id="slow")
    clock.advance(1 + SETTINGS.cessation_delay)
    # Failed, and its pods take 30 s to go: it is stopping until they have.
    assert (await cluster.get("slow")).state is State.STOPPING
    with pytest.raises(ConflictError, match="stopping"):
        await cluster.resubmit("slow", wait=0)
    clock.advance(30)
    assert (await cluster.get("slow")).state is State.FAILED
    assert (await cluster.resubmit("slow")).epoch == Epoch(2, 0)


async def test_dry_run_shows_the_native_object_and_creates_nothing(
    cluster: Cluster, backend: MemoryBackend, store: MemoryStore
) -> None:
    native = await cluster.dry_run(spec(), job_id="dry")
    assert isinstance(native, Mapping) and native
    assert "dry" in str(native)
    assert await backend.list() == []
    assert await store.list() == []


async def test_output_on_a_backend_without_an_output_reader_is_unsupported(cluster: Cluster) -> None:
    await cluster.submit(spec(), job_id="o")
    with pytest.raises(UnsupportedError):
        async for _ in cluster.output("o"):
            pass


async def test_list_refreshes_and_filters(cluster: Cluster, clock: ManualClock) -> None:
    await cluster.submit(spec("sleep 1; exit 0"), job_id="a")
    await cluster.submit(spec("sleep 1; exit 3"), job_id="b")
    await cluster.submit(spec("hang"), job_id="c")
    clock.advance(3 + SETTINGS.cessation_delay)  # b's pods terminate after it failed
    recs = await cluster.list()
    assert [(r.job_id, r.state) for r in recs] == [
        ("a", State.SUCCEEDED),
        ("b", State.FAILED),
        ("c", State.RUNNING),
    ]
    assert recs[1].outcome.cause is Cause.EXIT_CODE
    assert [r.job_id for r in await cluster.list([State.FAILED, State.SUCCEEDED])] == ["a", "b"]


async def test_capabilities_are_the_clusters(cluster: Cluster) -> None:
    caps = await cluster.capabilities()
    assert caps.holds and caps.watch and caps.cessation and not caps.output


async def collect(stream: AsyncIterator[JobRecord], into: list[JobRecord]) -> None:
    async for rec in stream:
        into.append(rec)


async def drive(clock: ManualClock, task: asyncio.Task[None], step: float = 0.5, limit: int = 200) -> None:
    for _ in range(limit):
        await settle()
        if task.done():
            break
        clock.advance(step)
    await asyncio.wait_for(task, 1)


async def test_watch_with_the_backend_watcher_follows_a_job_to_its_end(
    cluster: Cluster, clock: ManualClock
) -> None:
    await cluster.submit(spec("sleep 2; exit 0"), job_id="w")
    seen: list[JobRecord] = []
    await drive(clock, asyncio.create_task(collect(cluster.watch("w"), seen)))
    states = [r.state for r in seen]
    assert states[0] is State.STARTING
    assert State.RUNNING in states
    assert states[-1] is State.SUCCEEDED
    assert len(states) == len(set(states))  # one record per change, no repeats


class NoWatcher(LostResponses):
    """The required protocol only, with starts that work: :meth:`Cluster.watch` must poll."""

    async def start(self, prepared: Prepared) -> Handle:
        return await self.inner.start(prepared)


async def test_watch_without_a_watcher_polls_observe(
    backend: MemoryBackend, store: MemoryStore, clock: ManualClock
) -> None:
    async with Cluster(NoWatcher(backend), store, clock=clock) as cluster:
        await cluster.submit(spec("sleep 2; oom"), job_id="poll")
        seen: list[JobRecord] = []
        await drive(clock, asyncio.create_task(collect(cluster.watch("poll"), seen)))
        assert [r.state for r in seen][-1] is State.FAILED
        assert seen[-1].outcome.cause is Cause.OUT_OF_MEMORY
        assert State.RUNNING in [r.state for r in seen]


async def test_watch_of_every_job_yields_each_jobs_changes(cluster: Cluster, clock: ManualClock) -> None:
    await cluster.submit(spec("sleep 1; exit 0"), job_id="x")
    await cluster.submit(spec("sleep 2; exit 1"), job_id="y")
    seen: list[JobRecord] = []
    task = asyncio.create_task(collect(cluster.watch(), seen))
    for _ in range(20):
        await settle()
        clock.advance(0.5)
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    final = {r.job_id: r.state for r in seen}
    assert final == {"x": State.SUCCEEDED, "y": State.FAILED}


class Contended(MemoryStore):
    """A store shared with another writer that writes to the record between our read and our write
    ``times`` times (the real race, made deterministic)."""

    def __init__(self, clock: ManualClock, times: int) -> None:
        super().__init__(clock)
        self.times = times

    async def update(
        self, record: JobRecord, *, expected_revision: int, transitions: Sequence[Transition] = ()
    ) -> JobRecord:
        if self.times > 0:
            self.times -= 1
            current = await self.get(record.job_id)
            await super().update(current, expected_revision=current.revision)  # the other writer
        return await super().update(record, expected_revision=expected_revision, transitions=transitions)


async def test_record_writes_retry_a_compare_and_swap_that_lost_a_race(
    backend: MemoryBackend, clock: ManualClock
) -> None:
    store = Contended(clock, times=0)
    async with Cluster(backend, store, clock=clock) as cluster:
        await cluster.submit(spec("hang"), job_id="cas")
        store.times = 3
        rec = await cluster.cancel("cas")
        assert rec.cancel_requested
        requests = [t for t in await cluster.history("cas") if t.what == "cancel requested"]
        assert len(requests) == 1  # retried, not duplicated


async def test_record_writes_give_up_after_a_bounded_number_of_attempts(
    backend: MemoryBackend, clock: ManualClock
) -> None:
    store = Contended(clock, times=0)
    async with Cluster(backend, store, clock=clock) as cluster:
        await cluster.submit(spec("hang"), job_id="busy")
        store.times = CAS_ATTEMPTS
        with pytest.raises(ConflictError, match="kept changing"):
            await cluster.cancel("busy")


async def test_a_read_only_backend_refuses_writes_before_recording(
    store: MemoryStore, clock: ManualClock
) -> None:
    ro = MemoryBackend(SETTINGS, clock=clock, read_only=True)
    async with Cluster(ro, store, clock=clock) as cluster:
        with pytest.raises(ReadOnlyError):
            await cluster.submit(spec())
        assert await store.list() == []


async def test_close_closes_backend_and_store(
    backend: MemoryBackend, store: MemoryStore, clock: ManualClock
) -> None:
    cluster = Cluster(backend, store, clock=clock)
    async with cluster:
        pass
    with pytest.raises(Exception) as info:
        await store.list()
    assert "closed" in str(info.value)
    await cluster.close()  # idempotent


class WithOutput(NoWatcher):
    """A backend with an output reader (lines kept per handle and node) and the capability to match."""

    lines: ClassVar[dict[int, list[str]]] = {0: ["step 1", "step 2", "step 3"], 1: ["rank 1 says hi"]}

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        caps = await self.inner.capabilities(spec)
        return caps.replace(output=True)

    async def output(
        self, handle: Handle, *, node: int = 0, follow: bool = False, tail: int | None = None
    ) -> AsyncIterator[str]:
        assert handle.identity.job_id == "out"
        lines = self.lines[node]
        for line in lines[-tail:] if tail else lines:
            yield line


async def test_output_reads_the_lines_of_a_node(
    backend: MemoryBackend, store: MemoryStore, clock: ManualClock
) -> None:
    async with Cluster(WithOutput(backend), store, clock=clock) as cluster:
        await cluster.submit(spec(), job_id="out")
        assert [line async for line in cluster.output("out")] == ["step 1", "step 2", "step 3"]
        assert [line async for line in cluster.output("out", node=1)] == ["rank 1 says hi"]
        assert [line async for line in cluster.output("out", tail=2)] == ["step 2", "step 3"]
        with pytest.raises(InvalidError) as info:
            async for _ in cluster.output("out", node=-1):
                pass
        assert info.value.path == "node"


class WithPreviousOutput(WithOutput):
    """An output reader that also knows the last terminated run of a node."""

    async def output(  # type: ignore[override]
        self,
        handle: Handle,
        *,
        node: int = 0,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
    ) -> AsyncIterator[str]:
        if previous:
            yield "the run before"
            return
        async for line in super().output(handle, node=node, follow=follow, tail=tail):
            yield line


async def test_output_previous_reaches_the_backend_and_is_checked(
    backend: MemoryBackend, store: MemoryStore, clock: ManualClock
) -> None:
    async with Cluster(WithPreviousOutput(backend), store, clock=clock) as cluster:
        await cluster.submit(spec(), job_id="out")
        assert [line async for line in cluster.output("out", previous=True)] == ["the run before"]
        assert [line async for line in cluster.output("out")] == ["step 1", "step 2", "step 3"]
        with pytest.raises(InvalidError) as info:
            async for _ in cluster.output("out", previous="yes"):  # type: ignore[arg-type]
                pass
        assert info.value.path == "previous"


class HolderWithoutHolds(NoWatcher):
    """An adapter that can hold, on a cluster where it cannot (e.g. Kueue without the admission check)."""

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return (await self.inner.capabilities(spec)).replace(holds=False)

    async def hold(self, handle: Handle) -> str:
        raise AssertionError("must not be called: the cluster has no holds")


async def test_holds_follow_the_clusters_capabilities(
    backend: MemoryBackend, store: MemoryStore, clock: ManualClock
) -> None:
    async with Cluster(HolderWithoutHolds(backend), store, clock=clock) as cluster:
        with pytest.raises(UnsupportedError, match="holds"):
            await cluster.submit(spec(), job_id="held", held=True)
        assert await store.list() == []
        await cluster.submit(spec(), job_id="free")
        with pytest.raises(UnsupportedError, match="holds"):
            await cluster.hold("free")


async def test_dry_run_is_prepare_on_any_backend(
    backend: MemoryBackend, store: MemoryStore, clock: ManualClock
) -> None:
    async with Cluster(NoWatcher(backend), store, clock=clock) as cluster:
        native = await cluster.dry_run(spec(), job_id="plain")
        # The name's hash covers a nonce, which a submit draws afresh for its record.
        nonce = native["metadata"]["annotations"]["dispatch.dev/nonce"]
        assert native["metadata"]["name"] == backend.native_name(Identity("plain", Epoch(), nonce))
        assert backend.objects() == []


class HangingStart(NoWatcher):
    """A backend whose create is sent but whose response never comes (the caller gives up)."""

    async def start(self, prepared: Prepared) -> Handle:
        await self.inner.start(prepared)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_submit_cancelled_during_start_leaves_the_record_saying_so(
    backend: MemoryBackend, store: MemoryStore, clock: ManualClock
) -> None:
    async with Cluster(HangingStart(backend), store, clock=clock) as cluster:
        task = asyncio.create_task(cluster.submit(spec(), job_id="cx"))
        await settle()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        rec = await store.get("cx")
        assert rec.unknown_write is not None and "cancelled while starting" in rec.unknown_write
        settled = await cluster.get("cx")
        assert settled.unknown_write is None and settled.handle is not None
