"""The backend contract as pytest checks: plain async test functions over a ``harness`` fixture.

Each check opens backends through the harness, so it runs against any adapter. Checks of an optional
protocol are skipped unless the backend implements it (``isinstance``) and its capabilities say so;
checks that need a cluster event are skipped unless the harness lists it in ``injects``.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from dispatch.backend import (
    Backend,
    CessationSignal,
    Holder,
    HoldToken,
    IdentityWeakener,
    OutputReader,
    Prepared,
    Watcher,
    place,
)
from dispatch.conformance.harness import Harness
from dispatch.errors import (
    ConflictError,
    DispatchError,
    InvalidError,
    ReadOnlyError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import (
    Absent,
    Capabilities,
    Cause,
    Change,
    Compute,
    Epoch,
    Extension,
    Extensions,
    Handle,
    Identity,
    JobSpec,
    Observation,
    OpaqueExtension,
    Share,
    State,
    bucket,
    register_extension,
)

__all__ = [
    "test_conformance_capabilities_of_a_spec_create_nothing",
    "test_conformance_capabilities_shape",
    "test_conformance_cessation",
    "test_conformance_exit_code_in_evidence",
    "test_conformance_held_start_never_runs_until_released",
    "test_conformance_hold_running_then_release",
    "test_conformance_identity_weakener",
    "test_conformance_injected_cause",
    "test_conformance_lifecycle_to_success",
    "test_conformance_list_includes_every_incarnation",
    "test_conformance_nonce_keeps_records_apart",
    "test_conformance_output_lines_tail_and_follow",
    "test_conformance_prepare_creates_nothing_and_start_sends_it",
    "test_conformance_read_only_refuses_every_write",
    "test_conformance_readings_say_whether_compute_remains",
    "test_conformance_refuses_unsupported_extensions",
    "test_conformance_start_is_idempotent_per_identity",
    "test_conformance_stop_a_held_job",
    "test_conformance_stop_is_idempotent_and_cancels",
    "test_conformance_time_limit_times_out",
    "test_conformance_unreachable_is_raised_never_absent",
    "test_conformance_vanished_is_absent",
    "test_conformance_wait_ceased_honours_timeout",
    "test_conformance_watch_emits_changes_and_resumes",
    "test_conformance_watch_of_a_share_emits_only_its_jobs",
    "test_conformance_watch_without_cursor_lists_current",
]

_ids = itertools.count(1)


_ORDER = {State.PENDING: 0, State.QUEUED: 1, State.STARTING: 2, State.RUNNING: 3}


@register_extension
@dataclass(frozen=True, slots=True)
class ForeignExtension(Extension):
    """A registered (typed) extension no backend accepts: checks that typed extensions are refused too."""

    NAME: ClassVar[str] = "conformance.dispatch.dev/Foreign"
    value: str = "x"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value}

    @classmethod
    def from_json(cls, value: Any, path: str) -> ForeignExtension:
        return cls(str(dict(value).get("value", "x")))


# --- helpers (not collected: no test_ prefix) ---------------------------------------------------


def _identity(tag: str, epoch: Epoch = Epoch()) -> Identity:
    n = next(_ids)
    return Identity(f"conf-{tag}-{n}", epoch, f"{n:x}c0f")


def _with_extensions(spec: JobSpec, *extra: Extension) -> JobSpec:
    return spec.replace(extensions=Extensions([*spec.extensions.values(), *extra]))


def _check_observation(obs: Observation | Absent, handle: Handle) -> Observation:
    assert isinstance(obs, Observation), f"{handle} read absent: {obs}"
    assert obs.handle.identity.same_incarnation(handle.identity), f"{obs.handle} is not {handle}"
    if obs.outcome.terminal:
        assert obs.outcome.evidence, f"terminal outcome {obs.outcome} carries no evidence"
    assert obs.state is not State.LOST, f"an adapter reads {obs.outcome}: only the host concludes lost"
    return obs


async def _until(
    harness: Harness, backend: Backend, handle: Handle, done: Callable[[Observation], bool], what: str
) -> list[Observation]:
    """Observe (advancing cluster time by steps) until ``done``; every observation seen, in order."""
    seen: list[Observation] = []
    waited = 0.0
    while True:
        await harness.settle()
        obs = _check_observation(await backend.observe(handle), handle)
        seen.append(obs)
        if done(obs):
            return seen
        if waited >= harness.patience:
            pytest.fail(f"waiting for {what}: still {obs.outcome} after {waited:g} s of cluster time")
        await harness.advance(harness.step)
        waited += harness.step


async def _running(harness: Harness, backend: Backend, handle: Handle) -> list[Observation]:
    seen = await _until(
        harness, backend, handle, lambda o: o.state is State.RUNNING or o.outcome.terminal, "running"
    )
    assert seen[-1].state is State.RUNNING, (
        f"the job ended before running: {seen[-1].outcome}; evidence: {seen[-1].outcome.evidence}"
    )
    return seen


async def _terminal(harness: Harness, backend: Backend, handle: Handle) -> Observation:
    """The first reading of a terminal outcome whose compute is no longer there."""
    return (
        await _until(
            harness,
            backend,
            handle,
            lambda o: o.outcome.terminal and o.compute is not Compute.PRESENT,
            "a terminal state with its compute gone",
        )
    )[-1]


async def _stopped(harness: Harness, backend: Backend, handle: Handle) -> Observation | Absent:
    """The end of a stopped incarnation: read ``cancelled`` with its compute gone, or absent (a cluster
    that deletes what it stops, as Kubernetes does). Until then it may read anything, ``stopping`` included."""
    waited = 0.0
    while True:
        await harness.settle()
        got = await backend.observe(handle)
        if isinstance(got, Absent):
            assert got.handle.identity.same_incarnation(handle.identity)
            return got
        obs = _check_observation(got, handle)
        if obs.outcome.terminal and obs.compute is not Compute.PRESENT:
            assert (obs.state, obs.cause) == (State.CANCELLED, Cause.CANCELLED), obs.outcome
            return obs
        if waited >= harness.patience:
            pytest.fail(f"a stopped incarnation still reads {obs.outcome} (compute {obs.compute})")
        await harness.advance(harness.step)
        waited += harness.step


def _needs(harness: Harness, event: str) -> None:
    if event not in harness.injects:
        pytest.skip(f"the harness cannot inject {event!r}")


async def _capable(backend: Backend, proto: type, flag: str) -> None:
    if not isinstance(backend, proto):
        pytest.skip(f"{type(backend).__name__} does not implement {proto.__name__}")
    caps = await backend.capabilities()
    if not getattr(caps, flag):
        pytest.skip(f"this cluster reports {flag}=False")


def _refs(observations: list[Observation]) -> list[Identity]:
    return [o.handle.identity for o in observations]


class WatchCollector:
    """Consumes a watch stream in a task, so a check (or an adapter's own test) can drive the cluster
    meanwhile. Not a check: import it by name."""

    def __init__(self, stream: AsyncIterator[Change]) -> None:
        self.stream = stream
        self.changes: list[Change] = []
        self.error: BaseException | None = None
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            async for change in self.stream:
                self.changes.append(change)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced by the check, not lost in a task
            self.error = exc

    def of(self, handle: Handle) -> list[Change]:
        if self.error is not None:
            raise AssertionError(f"the watch stream failed: {self.error!r}") from self.error
        return [c for c in self.changes if c.handle.identity.same_incarnation(handle.identity)]

    async def until(
        self, harness: Harness, handle: Handle, done: Callable[[Change], bool], what: str
    ) -> list[Change]:
        waited = 0.0
        while True:
            await harness.settle()
            mine = self.of(handle)
            if mine and done(mine[-1]):
                return mine
            if waited >= harness.patience:
                pytest.fail(f"watch: waiting for {what}; saw {[_shown(c) for c in mine]}")
            await harness.advance(harness.step)
            waited += harness.step

    async def close(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        aclose = getattr(self.stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _shown(change: Change) -> str:
    r = change.reading
    return f"{r.outcome} (compute {r.compute})" if isinstance(r, Observation) else "absent"


def _seen(change: Change) -> Observation:
    assert isinstance(change.reading, Observation), f"expected a seen reading, got {change.reading}"
    return change.reading


# --- Backend ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_capabilities_shape(harness: Harness) -> None:
    """``name`` is the harness's; capabilities are typed, round-trip through JSON, accept the harness
    spec's extensions, and claim an optional protocol only where it is implemented."""
    backend = await harness.open()
    assert backend.name == harness.name
    caps = await backend.capabilities()
    assert isinstance(caps, Capabilities)
    assert Capabilities.from_json(caps.to_json()) == caps
    assert set(harness.spec().extensions) <= caps.extensions
    assert caps.writable, "a backend opened writable reports read_only/observe_only"
    for flag, proto in (
        ("holds", Holder),
        ("watch", Watcher),
        ("cessation", CessationSignal),
        ("output", OutputReader),
    ):
        if getattr(caps, flag):
            assert isinstance(backend, proto), (
                f"capabilities say {flag} but {proto.__name__} is not implemented"
            )


@pytest.mark.asyncio
async def test_conformance_capabilities_of_a_spec_create_nothing(harness: Harness) -> None:
    backend = await harness.open()
    before = _refs(await backend.list())
    caps = await backend.capabilities(harness.spec())
    assert isinstance(caps, Capabilities)
    assert _refs(await backend.list()) == before


@pytest.mark.asyncio
async def test_conformance_refuses_unsupported_extensions(harness: Harness) -> None:
    """Unknown (opaque) and unaccepted typed extensions are refused with every reason at once, by
    ``capabilities(spec)`` and by ``start``, and nothing is created."""
    backend = await harness.open()
    spec = _with_extensions(
        harness.spec(),
        OpaqueExtension("acme.example/Thing", {"size": 1}),
        OpaqueExtension("acme.example/Other", {}),
        ForeignExtension(),
    )
    names = ("acme.example/Thing", "acme.example/Other", ForeignExtension.NAME)
    before = _refs(await backend.list())
    with pytest.raises(UnsupportedError) as caught:
        await backend.capabilities(spec)
    assert not isinstance(caught.value, ReadOnlyError)
    text = "\n".join(caught.value.reasons)
    for name in names:
        assert name in text, f"the refusal does not name {name}: {caught.value.reasons}"
    with pytest.raises(UnsupportedError) as caught_start:
        await place(backend, spec, _identity("ext"))
    for name in names:
        assert name in "\n".join(caught_start.value.reasons)
    assert _refs(await backend.list()) == before


@pytest.mark.asyncio
async def test_conformance_start_is_idempotent_per_identity(harness: Harness) -> None:
    """Starting one incarnation twice (even with another requeue count) gives the same handle and
    creates one object."""
    backend = await harness.open()
    identity = _identity("idem", Epoch(2, 0))
    first = await place(backend, harness.spec(), identity)
    assert isinstance(first, Handle)
    assert first.backend == harness.name
    assert first.identity == identity
    again = await place(backend, harness.spec(), identity)
    assert again == first
    same_incarnation = await place(
        backend, harness.spec(), Identity(identity.job_id, Epoch(2, 1), identity.nonce)
    )
    assert same_incarnation.ref == first.ref
    assert same_incarnation.identity.same_incarnation(identity)
    mine = [o for o in await backend.list() if o.handle.identity.same_incarnation(identity)]
    assert len(mine) == 1, f"one incarnation, {len(mine)} objects: {mine}"


@pytest.mark.asyncio
async def test_conformance_lifecycle_to_success(harness: Harness) -> None:
    """A job goes forward through queued/starting to running, then succeeds with evidence."""
    _needs(harness, "succeed")
    backend = await harness.open()
    handle = await place(backend, harness.spec(), _identity("ok"))
    first = _check_observation(await backend.observe(handle), handle)
    assert first.state in _ORDER, f"a new job is {first.outcome}"
    seen = [first, *await _running(harness, backend, handle)]
    ranks = [_ORDER[o.state] for o in seen]
    assert ranks == sorted(ranks), f"states went backwards: {[str(o.outcome) for o in seen]}"
    await harness.succeed(backend, handle)
    final = await _terminal(harness, backend, handle)
    assert (final.state, final.cause) == (State.SUCCEEDED, Cause.NONE)


_CAUSES = [
    ("preempt", Cause.PREEMPTED),
    ("lose_node", Cause.NODE_LOST),
    ("oom", Cause.OUT_OF_MEMORY),
    ("evict", Cause.EVICTED),
    ("fail", Cause.EXIT_CODE),
]
# A cluster with its own queue (Kueue) may requeue a preempted, evicted or node-lost job itself, and
# admit it again at once: then it is starting or running again, the cause still naming what happened.
_REQUEUEABLE = {Cause.PREEMPTED, Cause.EVICTED, Cause.NODE_LOST}
_REQUEUED = {State.FAILED, State.QUEUED, State.STARTING, State.RUNNING}


@pytest.mark.asyncio
@pytest.mark.parametrize(("event", "cause"), _CAUSES, ids=[e for e, _ in _CAUSES])
async def test_conformance_injected_cause(harness: Harness, event: str, cause: Cause) -> None:
    """Each injected cluster event yields its typed cause, with evidence."""
    _needs(harness, event)
    backend = await harness.open()
    handle = await place(backend, harness.spec(), _identity(event.replace("_", "-")))
    await _running(harness, backend, handle)
    if event == "fail":
        await harness.fail(backend, handle, 3)
    else:
        await getattr(harness, event)(backend, handle)
    if cause in _REQUEUEABLE:
        allowed = _REQUEUED if (await backend.capabilities()).queueing else {State.FAILED, State.QUEUED}
    else:
        allowed = {State.FAILED}
    # A failing job may read "starting" with the cause for a moment first, as on real controllers: the
    # host keeps such a reading from taking the record back. What counts is where it settles.
    seen = await _until(
        harness,
        backend,
        handle,
        lambda o: (o.cause is cause and o.state in allowed) or o.outcome.terminal,
        str(cause),
    )
    obs = seen[-1]
    assert obs.cause is cause, (
        f"{event}: expected cause {cause}, got {obs.outcome}; evidence: {obs.outcome.evidence}"
    )
    assert obs.outcome.evidence, f"{event}: {obs.outcome} carries no evidence"
    assert obs.state in allowed, f"{event}: {obs.outcome}"


@pytest.mark.asyncio
async def test_conformance_exit_code_in_evidence(harness: Harness) -> None:
    _needs(harness, "fail")
    backend = await harness.open()
    handle = await place(backend, harness.spec(), _identity("exit"))
    await _running(harness, backend, handle)
    await harness.fail(backend, handle, 42)
    final = await _terminal(harness, backend, handle)
    assert (final.state, final.cause) == (State.FAILED, Cause.EXIT_CODE)
    assert 42 in [e.exit_code for e in final.outcome.evidence], final.outcome.evidence


@pytest.mark.asyncio
async def test_conformance_time_limit_times_out(harness: Harness) -> None:
    """A job that runs past ``time_limit`` fails with cause ``timeout``."""
    backend = await harness.open()
    limit = max(1, int(harness.step * 3))
    spec = harness.spec().replace(time_limit=limit)
    handle = await place(backend, spec, _identity("timeout"))
    final = await _terminal(harness, backend, handle)
    assert (final.state, final.cause) == (State.FAILED, Cause.TIMEOUT), final.outcome


@pytest.mark.asyncio
async def test_conformance_stop_is_idempotent_and_cancels(harness: Harness) -> None:
    backend = await harness.open()
    handle = await place(backend, harness.spec(), _identity("stop"))
    await _running(harness, backend, handle)
    await backend.stop(handle)
    await backend.stop(handle)
    await _stopped(harness, backend, handle)
    await backend.stop(handle)
    after = await backend.observe(handle)
    # Stopped and gone, a cluster may forget the incarnation at once (Kubernetes deletes the TrainJob):
    # absent is an answer too; seen, it says cancelled.
    if isinstance(after, Observation):
        assert (after.state, after.cause) == (State.CANCELLED, Cause.CANCELLED)


@pytest.mark.asyncio
async def test_conformance_list_includes_every_incarnation(harness: Harness) -> None:
    backend = await harness.open()
    first = _identity("list")
    second = Identity(first.job_id, first.epoch.requeued(), first.nonce)
    other = _identity("list-other")
    handles = [await place(backend, harness.spec(), i) for i in (first, second, other)]
    listed = await backend.list()
    for handle in handles:
        mine = [o for o in listed if o.handle.identity.same_incarnation(handle.identity)]
        assert len(mine) == 1, f"list() shows {len(mine)} objects for {handle.identity}"
        _check_observation(mine[0], handle)
        assert mine[0].handle.ref == handle.ref


@pytest.mark.asyncio
async def test_conformance_vanished_is_absent(harness: Harness) -> None:
    """An incarnation whose object and compute vanished without dispatch reads :class:`Absent` (never
    ``lost``: only the host concludes that, from two such readings), and a listing leaves it out."""
    _needs(harness, "vanish")
    backend = await harness.open()
    handle = await place(backend, harness.spec(), _identity("vanish"))
    await _running(harness, backend, handle)
    await harness.vanish(backend, handle)
    waited = 0.0
    while not isinstance(got := await backend.observe(handle), Absent):
        _check_observation(got, handle)
        if waited >= harness.patience:
            pytest.fail(f"a vanished incarnation still reads {got.outcome} after {waited:g} s")
        await harness.advance(harness.step)
        waited += harness.step
    assert got.handle.identity.same_incarnation(handle.identity)
    assert not [o for o in await backend.list() if o.handle.identity.same_incarnation(handle.identity)]


@pytest.mark.asyncio
async def test_conformance_unreachable_is_raised_never_absent(harness: Harness) -> None:
    """While the cluster does not answer — down, answering partially, or with an errors list — every
    read raises ``UnavailableError``: it is never an absent reading nor a shorter listing, which the host
    could take for a job gone. Once it answers again, the job reads as it is."""
    _needs(harness, "outage")
    backend = await harness.open()
    handle = await place(backend, harness.spec(), _identity("outage"))
    await _running(harness, backend, handle)
    for how in ("down", "partial", "errors"):
        await harness.outage(backend, how)
        try:
            with pytest.raises(UnavailableError):
                await backend.observe(handle)
            with pytest.raises(UnavailableError):
                await backend.list()
        finally:
            await harness.outage(backend, None)
        after = _check_observation(await backend.observe(handle), handle)
        assert after.state is State.RUNNING, f"after an outage ({how}) the job reads {after.outcome}"


@pytest.mark.asyncio
async def test_conformance_readings_say_whether_compute_remains(harness: Harness) -> None:
    """A running incarnation's reading says its compute is there (or that the adapter cannot tell);
    stopped, a reading says cancelled with compute still present while it lingers, then gone (or the
    incarnation reads absent)."""
    backend = await harness.open()
    handle = await place(backend, harness.spec(), _identity("compute"))
    running = (await _running(harness, backend, handle))[-1]
    assert running.compute in (Compute.PRESENT, Compute.UNKNOWN), running
    caps = await backend.capabilities()
    if caps.cessation:
        assert running.compute is Compute.PRESENT, f"a cluster with cessation cannot tell: {running}"
    await backend.stop(handle)
    if harness.lingers and caps.cessation:
        lingering = _check_observation(await backend.observe(handle), handle)
        assert lingering.compute is Compute.PRESENT, f"stopped, its compute lingers, yet it reads {lingering}"
    end = await _stopped(harness, backend, handle)
    if isinstance(end, Observation):
        assert end.compute is not Compute.PRESENT


@pytest.mark.asyncio
async def test_conformance_nonce_keeps_records_apart(harness: Harness) -> None:
    """Two records of one job id (a purged record and its successor; two stores' records) never share
    an object: the same job id and ``N`` with another nonce is another incarnation, with its own native
    object, and neither is read as the other."""
    backend = await harness.open()
    first = _identity("nonce")
    second = Identity(first.job_id, first.epoch, "b" * 16)
    one = await place(backend, harness.spec(), first)
    two = await place(backend, harness.spec(), second)
    assert one.ref != two.ref, f"two records' incarnations share {one.ref}"
    assert two.identity == second
    listed = [o.handle.identity for o in await backend.list() if o.handle.identity.job_id == first.job_id]
    assert sorted(i.nonce for i in listed) == sorted([first.nonce, second.nonce]), listed
    assert _check_observation(await backend.observe(two), two).handle.identity == second


# --- Holder -------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_held_start_never_runs_until_released(harness: Harness) -> None:
    """Started held, a job stays held however long; ``hold`` on it gives the token that releases it;
    release runs it; a stale token is a ``ConflictError``."""
    backend = await harness.open()
    await _capable(backend, Holder, "holds")
    assert isinstance(backend, Holder)
    handle = await place(backend, harness.spec(), _identity("held"), held=True)
    for _ in range(5):
        obs = _check_observation(await backend.observe(handle), handle)
        assert obs.state is State.HELD, f"a job started held is {obs.outcome}"
        await harness.advance(harness.step * 3)
    token = await backend.hold(handle)
    assert isinstance(token, str) and token
    await backend.release(handle, token)
    await _running(harness, backend, handle)
    with pytest.raises(ConflictError):
        await backend.release(handle, token)


@pytest.mark.asyncio
async def test_conformance_hold_running_then_release(harness: Harness) -> None:
    backend = await harness.open()
    await _capable(backend, Holder, "holds")
    assert isinstance(backend, Holder)
    handle = await place(backend, harness.spec(), _identity("hold"))
    await _running(harness, backend, handle)
    token = await backend.hold(handle)
    await _until(harness, backend, handle, lambda o: o.state is State.HELD, "held")
    with pytest.raises(ConflictError):
        await backend.release(handle, HoldToken(f"{token}-not-this-one"))
    assert _check_observation(await backend.observe(handle), handle).state is State.HELD
    await backend.release(handle, token)
    await _running(harness, backend, handle)
    with pytest.raises(ConflictError):
        await backend.release(handle, token)


@pytest.mark.asyncio
async def test_conformance_stop_a_held_job(harness: Harness) -> None:
    """A job stopped while held is cancelled and never runs."""
    backend = await harness.open()
    await _capable(backend, Holder, "holds")
    handle = await place(backend, harness.spec(), _identity("held-stop"), held=True)
    await backend.stop(handle)
    await _stopped(harness, backend, handle)


# --- Watcher ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_watch_emits_changes_and_resumes(harness: Harness) -> None:
    """A watch emits only real changes (never the same outcome twice in a row for one incarnation, even
    while compute lingers after a stop), misses no transition we observed, and resumes from a change's
    cursor to the same end."""
    backend = await harness.open()
    await _capable(backend, Watcher, "watch")
    assert isinstance(backend, Watcher)
    live = WatchCollector(backend.watch())
    try:
        await harness.settle()
        handle = await place(backend, harness.spec(), _identity("watch"))
        observed = await _running(harness, backend, handle)
        await live.until(harness, handle, lambda c: _seen(c).state is State.RUNNING, "running")
        await backend.stop(handle)
        final = await _stopped(harness, backend, handle)
        await live.until(
            harness,
            handle,
            lambda c: (
                not isinstance(c.reading, Observation)
                or (c.reading.outcome.terminal and c.reading.compute is not Compute.PRESENT)
            ),
            "the end",
        )
        for _ in range(5):  # nothing changes once the compute is gone: no change is emitted
            await harness.advance(harness.step)
        changes = live.of(handle)
    finally:
        await live.close()
    readings = [(_seen(c).outcome, _seen(c).compute) for c in changes if isinstance(c.reading, Observation)]
    for before, after in itertools.pairwise(readings):
        assert before != after, f"an unchanged reading was emitted twice: {after}"
    outcomes = [o for o, _ in readings]
    for change in changes:
        assert isinstance(change.cursor, str) and change.cursor
    states = [o.state for o in outcomes]
    for obs in observed:
        assert obs.state in states, f"watch missed {obs.state}: it emitted {[str(o) for o in outcomes]}"
    if isinstance(final, Observation):
        assert (outcomes[-1].state, outcomes[-1].cause) == (final.state, final.cause)
    else:
        assert isinstance(changes[-1].reading, Absent), (
            f"the watch did not say it went: {_shown(changes[-1])}"
        )

    resumed = WatchCollector(backend.watch(changes[0].cursor))
    try:
        tail = await resumed.until(
            harness,
            handle,
            lambda c: (
                not isinstance(c.reading, Observation)
                or (c.reading.outcome.terminal and c.reading.compute is not Compute.PRESENT)
            ),
            "the end, resumed",
        )
    finally:
        await resumed.close()
    later = [str(o) for o in outcomes[1:]]
    for change in tail:
        if isinstance(change.reading, Observation):
            assert str(change.reading.outcome) in later, f"resumed watch emitted {change.reading.outcome}"
    assert _shown(tail[-1]) == _shown(changes[-1])


@pytest.mark.asyncio
async def test_conformance_watch_without_cursor_lists_current(harness: Harness) -> None:
    """A watch without a cursor starts with the current state of existing incarnations."""
    backend = await harness.open()
    await _capable(backend, Watcher, "watch")
    assert isinstance(backend, Watcher)
    handle = await place(backend, harness.spec(), _identity("relist"))
    await _running(harness, backend, handle)
    live = WatchCollector(backend.watch())
    try:
        mine = await live.until(harness, handle, lambda c: _seen(c).state is State.RUNNING, "running")
    finally:
        await live.close()
    assert _seen(mine[-1]).state is State.RUNNING


@pytest.mark.asyncio
async def test_conformance_watch_of_a_share_emits_only_its_jobs(harness: Harness) -> None:
    """A watch asked for a share (a fleet member's jobs) emits the changes of the jobs in it, from the
    current reading on, and none of a job outside it."""
    backend = await harness.open()
    await _capable(backend, Watcher, "watch")
    assert isinstance(backend, Watcher)
    inside, outside = _identity("share-in"), _identity("share-out")
    while bucket(outside.job_id) == bucket(inside.job_id):
        outside = _identity("share-out")
    share = Share(frozenset({bucket(inside.job_id)}))
    theirs = await place(backend, harness.spec(), outside)
    live = WatchCollector(backend.watch(share=share))
    try:
        handle = await place(backend, harness.spec(), inside)
        await _running(harness, backend, handle)
        await _running(harness, backend, theirs)
        await live.until(harness, handle, lambda c: _seen(c).state is State.RUNNING, "running")
        await backend.stop(theirs)
        await _stopped(harness, backend, theirs)
        await harness.settle()
        others = live.of(theirs)
    finally:
        await live.close()
    assert others == [], f"a job outside the share was emitted: {[_shown(c) for c in others]}"


# --- CessationSignal ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_cessation(harness: Harness) -> None:
    """``ceased`` is false while compute remains (running, and right after stop when compute lingers),
    then true; ``wait_ceased`` returns once it is."""
    backend = await harness.open()
    await _capable(backend, CessationSignal, "cessation")
    assert isinstance(backend, CessationSignal)
    handle = await place(backend, harness.spec(), _identity("cease"))
    await _running(harness, backend, handle)
    assert not await backend.ceased(handle), "a running job reports ceased"
    waiter = asyncio.ensure_future(backend.wait_ceased(handle))
    try:
        await backend.stop(handle)
        if harness.lingers:
            assert not await backend.ceased(handle), "compute is gone the instant stop returns"
            await harness.settle()
            assert not waiter.done(), "wait_ceased returned while compute remains"
        waited = 0.0
        while not await backend.ceased(handle):
            if waited >= harness.patience:
                pytest.fail(f"still not ceased after {waited:g} s of cluster time")
            await harness.advance(harness.step)
            waited += harness.step
        for _ in range(20):
            if waiter.done():
                break
            await harness.settle()
        assert waiter.done(), "wait_ceased did not return once ceased"
        await waiter
    finally:
        waiter.cancel()
    assert await backend.ceased(handle)


@pytest.mark.asyncio
async def test_conformance_wait_ceased_honours_timeout(harness: Harness) -> None:
    """``wait_ceased`` on a running job is bounded by ``asyncio.timeout`` and leaves the backend usable."""
    backend = await harness.open()
    await _capable(backend, CessationSignal, "cessation")
    assert isinstance(backend, CessationSignal)
    handle = await place(backend, harness.spec(), _identity("bounded"))
    await _running(harness, backend, handle)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await backend.wait_ceased(handle)
    assert _check_observation(await backend.observe(handle), handle).state is State.RUNNING


# --- OutputReader -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_output_lines_tail_and_follow(harness: Harness) -> None:
    """A running node's output is readable as lines (the harness spec prints at least one), ``tail``
    bounds it, and ``follow`` yields until the node ends. A node that does not exist is refused."""
    _needs(harness, "succeed")
    backend = await harness.open()
    await _capable(backend, OutputReader, "output")
    assert isinstance(backend, OutputReader)
    handle = await place(backend, harness.spec(), _identity("output"))
    await _running(harness, backend, handle)
    lines = [line async for line in backend.output(handle)]
    assert lines and all(isinstance(line, str) and "\n" not in line for line in lines), lines
    assert [line async for line in backend.output(handle, tail=1)] == lines[-1:]
    assert [line async for line in backend.output(handle, tail=0)] == []
    followed: list[str] = []

    async def follow() -> None:
        async for line in backend.output(handle, follow=True):
            followed.append(line)

    task = asyncio.ensure_future(follow())
    try:
        await harness.settle()
        await harness.succeed(backend, handle)
        waited = 0.0
        while not task.done():
            if waited >= harness.patience:
                pytest.fail("output(follow=True) did not end after the node ended")
            await harness.advance(harness.step)
            waited += harness.step
            for _ in range(20):
                if task.done():
                    break
                await asyncio.sleep(0.01)
        await task
    finally:
        task.cancel()
    assert followed[: len(lines)] == lines, (followed, lines)
    with pytest.raises(DispatchError):
        _ = [line async for line in backend.output(handle, node=10_000)]


# --- IdentityWeakener ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_identity_weakener(harness: Harness) -> None:
    """Native names are deterministic, equal for one incarnation, distinct across incarnations (even
    when sanitising makes the job ids alike); an object reads back to its identity; a mismatch is
    refused with ``ConflictError``."""
    backend = await harness.open()
    if not isinstance(backend, IdentityWeakener):
        pytest.skip(f"{type(backend).__name__} does not implement IdentityWeakener")
    base = f"conf-Name_{next(_ids)}"
    incarnations = [
        Identity(base),
        Identity(base, Epoch(2, 0)),
        Identity(base.lower()),
        Identity(base.replace("_", "-")),
        Identity(base.replace("_", ".")),
        Identity("9" + "x" * 252),
        Identity("9" + "x" * 251 + "y"),
        Identity(base, Epoch(), "0123456789abcdef"),  # another record of the same job id
    ]
    names = [backend.native_name(i) for i in incarnations]
    assert names == [backend.native_name(i) for i in incarnations], "native_name is not deterministic"
    assert all(isinstance(n, str) and n for n in names)
    assert len(set(names)) == len(names), f"distinct incarnations share a native name: {names}"
    assert backend.native_name(Identity(base, Epoch(2, 1))) == names[1], "one incarnation, two names"
    assert backend.identity_of({"metadata": {"name": "not-ours"}}) is None
    identity = Identity(base, Epoch(3, 1))
    obj = (await backend.prepare(harness.spec(), identity)).request
    read = backend.identity_of(obj)
    assert read is not None and read.same_incarnation(identity), f"read back {read}, not {identity}"
    forged: Any = copy.deepcopy(dict(obj))
    assert isinstance(forged.get("metadata"), Mapping), "a native object carries metadata"
    forged["metadata"]["name"] = backend.native_name(incarnations[0])
    with pytest.raises(ConflictError):
        backend.identity_of(forged)


# --- prepare ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_prepare_creates_nothing_and_start_sends_it(harness: Harness) -> None:
    """``prepare`` makes every check and returns the native request without creating anything;
    ``start`` creates that incarnation; another adapter's request is refused."""
    backend = await harness.open()
    before = _refs(await backend.list())
    identity = _identity("dry")
    prepared = await backend.prepare(harness.spec(), identity)
    assert isinstance(prepared, Prepared)
    assert (prepared.backend, prepared.identity, prepared.held) == (harness.name, identity, False)
    assert isinstance(prepared.request, Mapping) and prepared.request
    held = await backend.prepare(harness.spec(), identity, held=True)
    assert held.held and held.request and held.request != prepared.request
    with pytest.raises(UnsupportedError):
        await backend.prepare(
            _with_extensions(harness.spec(), OpaqueExtension("acme.example/Thing", {})), identity
        )
    assert _refs(await backend.list()) == before
    foreign = prepared.replace(backend=f"not-{harness.name}")
    with pytest.raises(InvalidError):
        await backend.start(foreign)
    assert _refs(await backend.list()) == before
    handle = await backend.start(prepared)
    assert handle.identity == identity
    after = _refs(await backend.list())
    assert len(after) == len(before) + 1
    assert [i for i in after if i.same_incarnation(identity)] == [identity]


# --- read-only ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_conformance_read_only_refuses_every_write(harness: Harness) -> None:
    """A read-only backend says so, reads, and refuses every write with ``ReadOnlyError`` without
    changing anything."""
    writer = await harness.open()
    handle = await place(writer, harness.spec(), _identity("ro"))
    await _running(harness, writer, handle)
    reader = await harness.open(read_only=True)
    caps = await reader.capabilities()
    assert caps.read_only or caps.observe_only
    assert not caps.writable
    before = _refs(await reader.list())
    assert any(i.same_incarnation(handle.identity) for i in before)
    obs = _check_observation(await reader.observe(handle), handle)
    assert obs.state is State.RUNNING
    with pytest.raises(ReadOnlyError):
        await place(reader, harness.spec(), _identity("ro-new"))
    with pytest.raises(ReadOnlyError):
        await reader.stop(handle)
    if isinstance(reader, Holder):
        with pytest.raises(ReadOnlyError):
            await reader.hold(handle)
        with pytest.raises(ReadOnlyError):
            await reader.release(handle, HoldToken("any"))
    # Preparing is a read: a person without write access sees what a submit would create.
    assert (await reader.prepare(harness.spec(), _identity("ro-dry"))).request
    await harness.settle()
    assert _refs(await reader.list()) == before
    assert _check_observation(await writer.observe(handle), handle).state is State.RUNNING


# --- the harness's lifetime ----------------------------------------------------------------------


def _closing(check: Callable[..., Any]) -> Callable[..., Any]:
    """Close the harness when the check ends, whatever the outcome: a plain (synchronous)
    ``@pytest.fixture`` returning a harness then needs no async teardown (pytest-asyncio's strict mode,
    the default outside dispatch, runs no async fixture without ``@pytest_asyncio.fixture``). A fixture
    that closes the harness too may: ``close`` must be idempotent."""

    @functools.wraps(check)
    async def run(harness: Harness, **arguments: Any) -> None:
        try:
            await check(harness, **arguments)
        finally:
            await harness.close()

    return run


for _name in __all__:
    globals()[_name] = _closing(globals()[_name])
