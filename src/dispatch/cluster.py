"""Opening a cluster: :func:`open` and the :class:`Cluster` it returns (operator and observer).

The operator writes (``submit``, ``cancel``, ``hold``, ``release``, ``resubmit``) go to the record
first and then to the backend, so that a crash in between leaves a record saying what was asked; every
record write is a compare-and-swap retried a bounded number of times. The observer reads (``get``,
``list``, ``watch``) fold what the cluster reports into the records with :func:`dispatch.fold.fold`.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dispatch import decide, metrics
from dispatch.backend import (
    Backend,
    CessationSignal,
    Holder,
    HoldToken,
    OutputReader,
    Prepared,
    Watcher,
    compute_gone,
    record_decision,
)
from dispatch.clock import Clock, SystemClock
from dispatch.config import Config
from dispatch.errors import (
    BusyError,
    ConflictError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    ReadOnlyError,
    UnsupportedError,
)
from dispatch.fold import fold, matches
from dispatch.model import (
    DEFAULT_POLICY,
    Actor,
    Capabilities,
    Epoch,
    Identity,
    JobRecord,
    JobSpec,
    Observation,
    Policy,
    State,
    Transition,
    check_job_id,
    new_job_id,
)
from dispatch.model._decode import as_enum
from dispatch.records import Store
from dispatch.registry import new_backend

if TYPE_CHECKING:
    from dispatch.supervise import Supervisor

__all__ = ["CAS_ATTEMPTS", "Cluster", "open"]

CAS_ATTEMPTS = 8
"""How many times a record write is retried when the record changed under it (``ConflictError``)."""

POLL_MIN = 0.5
POLL_MAX = 5.0
"""Polling backoff of :meth:`Cluster.watch` on a backend without a watcher (seconds)."""

CESSATION_WAIT = 60.0
"""How long :meth:`Cluster.resubmit` waits, by default, for the previous incarnation's compute to go."""

_Step = tuple[JobRecord, list[Transition]]
_Change = Callable[[JobRecord], _Step | None]


async def open(name: str, config: Config | None = None, *, clock: Clock | None = None) -> Cluster:
    """Open the cluster of adapter ``name`` with ``config`` and return a :class:`Cluster`.

    The adapter is found in the registry (by import or through the ``dispatch.adapters`` entry points).
    Without ``config.store`` the records go to a :class:`~dispatch.records.SqliteStore` under the user's
    state directory. ``clock`` (tests: a :class:`~dispatch.clock.ManualClock`) times the records and the
    polling of :meth:`Cluster.watch`.
    """
    config = config if config is not None else Config()
    if not isinstance(config, Config):
        raise InvalidError(f"expected a dispatch.Config, got {type(config).__name__}", path="config")
    store = config.store
    if store is None:
        from dispatch.records import SqliteStore, default_store_path  # deferred: sqlite3 is not light

        store = SqliteStore(default_store_path())
    try:
        backend = await new_backend(name, config.adapter_config(name))
    except BaseException:
        if config.store is None:
            await store.close()
        raise
    return Cluster(backend, store, policy=config.policy, clock=clock)


def _states(states: Any) -> frozenset[State]:
    """``states`` as a set of :class:`State`; one state alone (a ``State`` is also a ``str``) is allowed.
    An unknown name is refused rather than silently matching nothing."""
    if isinstance(states, str):
        states = [states]
    try:
        items = builtins.list(states)
    except TypeError:
        raise InvalidError(f"expected states, got {type(states).__name__}", path="states") from None
    return frozenset(as_enum(State, s, f"states[{i}]") for i, s in enumerate(items))


class Cluster:
    """One opened cluster with its records: the operator, the observer and its capabilities.

    An async context manager; :meth:`close` closes the backend and the store.
    """

    def __init__(
        self,
        backend: Backend,
        store: Store,
        *,
        policy: Policy = DEFAULT_POLICY,
        clock: Clock | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.policy = policy
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._closed = False

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the backend and the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.backend.close()
        finally:
            await self.store.close()

    def __repr__(self) -> str:
        return f"Cluster(backend={self.backend.name!r}, store={type(self.store).__name__})"

    # ------------------------------------------------------------------ capabilities

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        """What this cluster can do; with ``spec``, also refuse (``UnsupportedError``, every reason) a
        job it cannot run."""
        return await self.backend.capabilities(spec)

    async def _check_writable(self) -> Capabilities:
        caps = await self.backend.capabilities()
        if caps.read_only or caps.observe_only:
            mode = "read-only" if caps.read_only else "observe-only"
            raise ReadOnlyError(f"cluster {self.backend.name!r} is {mode}: it accepts no writes")
        return caps

    # ------------------------------------------------------------------ supervisor

    def supervisor(self, policy: Policy | None = None, **options: Any) -> Supervisor:
        """A :class:`~dispatch.supervise.Supervisor` over this cluster's backend and store, applying
        ``policy`` (default: the cluster's) to records without their own. ``options`` are the
        supervisor's (``holder``, ``lease``, ``poll``, ``unmatched``, ``jobs``, ...)."""
        from dispatch.supervise import Supervisor

        if policy is not None and not isinstance(policy, Policy):
            raise InvalidError(f"expected a Policy, got {type(policy).__name__}", path="policy")
        return Supervisor(
            self.backend,
            self.store,
            policy=policy if policy is not None else self.policy,
            clock=self.clock,
            **options,
        )

    # ------------------------------------------------------------------ operator

    async def submit(
        self,
        spec: JobSpec,
        *,
        job_id: str | None = None,
        held: bool = False,
        policy: Policy | None = None,
    ) -> JobRecord:
        """Record a new job and start its first incarnation (``job_id@1.0``); return its record.

        The backend prepares the job first (``prepare``: every check, the native request built): a
        job the cluster cannot run is refused before anything is created, and no record is written. A taken job id is a ``ConflictError``. A start whose effect could
        not be known leaves the record with ``unknown_write`` set (the job is not lost: an observation
        settles it). A start the cluster refuses (``InvalidError``/``UnsupportedError``) leaves the
        record ``failed``/``invalid_spec`` and raises.
        """
        if not isinstance(spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(spec).__name__}", path="spec")
        if policy is not None and not isinstance(policy, Policy):
            raise InvalidError(f"expected a Policy, got {type(policy).__name__}", path="policy")
        if not isinstance(held, bool):
            raise InvalidError(f"expected True or False, got {held!r}", path="held")
        job_id = check_job_id(job_id) if job_id is not None else new_job_id()
        caps = await self._check_writable()
        if held and not (caps.holds and isinstance(self.backend, Holder)):
            raise self._cannot_hold(caps)
        # Every check, before the record exists: a job the cluster cannot run leaves nothing behind.
        prepared = await self.backend.prepare(spec, Identity(job_id, Epoch()), held=held)
        record, first = decide.submitted(job_id, spec, policy=policy, held=held, now=self.clock.now())
        await self.store.create(record, first)
        return await self._start(job_id, prepared)

    async def _start(self, job_id: str, prepared: Prepared) -> JobRecord:
        """Send what was prepared and write the outcome of the start into the record."""
        identity, held = prepared.identity, prepared.held
        try:
            handle = await self.backend.start(prepared)
        except OutcomeUnknownError as exc:
            return await self._start_unknown(job_id, identity, str(exc))
        except asyncio.CancelledError:
            # Cancelled while the create may have been sent: the record must say so, whatever happens
            # to this task next.
            await asyncio.shield(self._start_unknown(job_id, identity, "cancelled while starting"))
            raise
        except (InvalidError, UnsupportedError) as exc:
            refused = exc
            await self._update(
                job_id, lambda r: decide.start_refused(r, identity, refused, now=self.clock.now())
            )
            raise
        except Exception as exc:
            reason = str(exc)
            # Unavailable, permission denied, a name taken by another identity...: the record stays
            # pending (the job is not lost) and says why; the caller sees the error.
            await self._update(
                job_id,
                lambda r: decide.start_failed(r, identity, reason, actor=Actor.USER, now=self.clock.now()),
            )
            raise
        await self._update(
            job_id, lambda r: decide.started(r, handle, actor=Actor.USER, now=self.clock.now())
        )
        if held and isinstance(self.backend, Holder):
            # Holding an incarnation created held is idempotent and yields the token release needs.
            token = await self.backend.hold(handle)
            await self._update(job_id, lambda r: (r.replace(hold_token=token), []))
        return await self.get(job_id)

    async def _start_unknown(self, job_id: str, identity: Identity, reason: str) -> JobRecord:
        return await self._update(
            job_id,
            lambda r: decide.start_unknown(r, identity, reason, actor=Actor.USER, now=self.clock.now()),
        )

    async def cancel(self, job_id: str) -> JobRecord:
        """Ask for the job to end. Records the intent first, then stops the incarnation. A job that is
        already terminal is returned unchanged; one never placed on the cluster is cancelled at once."""
        # Refreshed first: a job that already ended on the cluster keeps its real outcome, instead of
        # being folded to "cancelled" because the intent was recorded before its end was read.
        rec = await self.get(job_id)
        if rec.outcome.terminal:
            return rec
        await self._check_writable()

        rec = await self._update(job_id, lambda r: decide.cancel_requested(r, now=self.clock.now()))
        if rec.outcome.terminal:
            return rec
        handle = decide.current_handle(rec)
        if handle is None:
            found = await self._find(rec)
            handle = found.handle if found is not None else None
        if handle is None:
            # Never placed on the cluster (or its start is unknown and nothing carries its identity).
            return await self._update(
                job_id, lambda r: decide.cancelled_off_cluster(r, actor=Actor.USER, now=self.clock.now())
            )
        await self.backend.stop(handle)
        why = f"job {job_id} epoch {rec.epoch}: cancelled by the user; stopping {handle.ref}"
        await record_decision(self.backend, handle, "Cancelled", why)
        return await self.get(job_id)

    async def hold(self, job_id: str) -> JobRecord:
        """Hold the job's current incarnation (keep it from running, or stop it running) until
        :meth:`release`. ``UnsupportedError`` when the cluster cannot hold."""
        holder = await self._holder()
        rec = await self._live(job_id, "hold")
        if rec.handle is None:
            raise BusyError(f"job {job_id!r} is not on the cluster yet; retry once it is")
        handle = rec.handle
        token = await holder.hold(handle)

        await self._update(job_id, lambda r: decide.held(r, handle, token, now=self.clock.now()))
        await record_decision(
            self.backend, handle, "Held", f"job {job_id} epoch {rec.epoch}: held by the user"
        )
        return await self.get(job_id)

    async def release(self, job_id: str) -> JobRecord:
        """Release the job's hold. ``ConflictError`` if the job is not held by us, or the cluster shows
        another hold than the one recorded."""
        holder = await self._holder()
        rec = await self._live(job_id, "release")
        if rec.handle is None or rec.hold_token is None:
            raise ConflictError(f"job {job_id!r} is not held")
        handle, token = rec.handle, rec.hold_token
        await holder.release(handle, HoldToken(token))

        await self._update(job_id, lambda r: decide.released(r, now=self.clock.now()))
        why = f"job {job_id} epoch {rec.epoch}: released by the user"
        await record_decision(self.backend, handle, "Released", why)
        return await self.get(job_id)

    async def resubmit(
        self, job_id: str, spec: JobSpec | None = None, *, wait: float = CESSATION_WAIT
    ) -> JobRecord:
        """Start a new incarnation of a finished job (epoch ``N+1.0``), with ``spec`` if given.

        Only a terminal record can be resubmitted (``ConflictError`` otherwise). The previous incarnation
        is stopped (its object removed) and the new one starts only once its compute is gone: two
        incarnations running at once can corrupt a shared checkpoint. On a backend that signals
        cessation this waits up to ``wait`` seconds for it; on one that does not, until an observation
        shows the previous incarnation gone. ``BusyError`` when it has not gone by then (retry later).
        """
        rec = await self.get(job_id)  # refreshed: a job that ended unobserved can be resubmitted
        if not rec.outcome.terminal:
            raise ConflictError(
                f"job {job_id!r} is {rec.state.value}; only a finished job can be resubmitted (cancel it first)"
            )
        if spec is not None and not isinstance(spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(spec).__name__}", path="spec")
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < 1e9:
            raise InvalidError(f"expected seconds >= 0, got {wait!r}", path="wait")
        new_spec = spec if spec is not None else rec.spec
        await self._check_writable()
        epoch = rec.epoch.resubmitted()
        prepared = await self.backend.prepare(new_spec, Identity(job_id, epoch))
        await self._retire(rec, wait)
        expected = rec.revision

        await self._update(
            job_id,
            lambda r: decide.resubmitted(
                r, new_spec, epoch, expected_revision=expected, now=self.clock.now()
            ),
        )
        return await self._start(job_id, prepared)

    async def _retire(self, rec: JobRecord, wait: float) -> None:
        """Stop the record's current incarnation and return once its compute is gone; ``BusyError``
        if it has not gone within ``wait`` seconds."""
        handle = decide.current_handle(rec)
        if handle is None:
            found = await self._find(rec)
            handle = found.handle if found is not None else None
        if handle is None:
            return  # never placed on the cluster: nothing can remain
        await self.backend.stop(handle)  # idempotent; removes a finished incarnation's object too
        cessation = (await self.backend.capabilities()).cessation
        try:
            async with asyncio.timeout(wait):
                if cessation and isinstance(self.backend, CessationSignal):
                    await self.backend.wait_ceased(handle)
                else:
                    delay = POLL_MIN
                    while not await compute_gone(self.backend, handle, cessation=False):
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, POLL_MAX)
        except TimeoutError:
            raise BusyError(
                f"job {rec.job_id!r}: incarnation {handle.identity} still has compute on the cluster "
                f"after {wait:g} s; retry once it has ceased"
            ) from None

    async def dry_run(
        self, spec: JobSpec, *, job_id: str | None = None, held: bool = False
    ) -> Mapping[str, Any]:
        """The native object a submit would create (e.g. a TrainJob), after every check a submit makes,
        creating nothing. Only reads, so it works on a read-only cluster too."""
        if not isinstance(spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(spec).__name__}", path="spec")
        if not isinstance(held, bool):
            raise InvalidError(f"expected True or False, got {held!r}", path="held")
        job_id = check_job_id(job_id) if job_id is not None else new_job_id()
        caps = await self.backend.capabilities()
        # A read-only open cannot hold, yet may show what a held submit would create: the backend's
        # prepare refuses a held job the cluster could not hold once writable.
        if held and not (isinstance(self.backend, Holder) and (caps.holds or not caps.writable)):
            raise self._cannot_hold(caps)
        prepared = await self.backend.prepare(spec, Identity(job_id, Epoch()), held=held)
        return prepared.request

    # ------------------------------------------------------------------ observer

    async def get(self, job_id: str) -> JobRecord:
        """The job's record, refreshed from the cluster when it is not terminal."""
        rec = await self.store.get(job_id)
        if rec.outcome.terminal:
            return rec
        obs = await self._observe(rec)
        if obs is None:
            return rec
        return await self._fold(job_id, obs)

    async def list(self, states: Iterable[State] | None = None) -> builtins.list[JobRecord]:
        """Every record (optionally only in ``states``), oldest first; records that are not terminal are
        refreshed from one listing of the cluster."""
        wanted = None if states is None else _states(states)
        records = await self.store.list()
        live = [r for r in records if not r.outcome.terminal]
        if live:
            by_id: dict[str, JobRecord] = {r.job_id: r for r in records}
            seen: set[str] = set()
            for obs in await self.backend.list():
                rec = by_id.get(obs.handle.identity.job_id)
                if rec is not None and not rec.outcome.terminal and matches(rec, obs):
                    by_id[rec.job_id] = await self._fold(rec.job_id, obs)
                    seen.add(rec.job_id)
            # A live record the listing does not show (its object was deleted behind our back): observe
            # it, as get() would, so list and status never disagree.
            for rec in live:
                if rec.job_id not in seen and rec.handle is not None:
                    missing = await self._observe(rec)
                    if missing is not None:
                        by_id[rec.job_id] = await self._fold(rec.job_id, missing)
            records = [by_id[r.job_id] for r in records]
        return [r for r in records if wanted is None or r.state in wanted]

    async def watch(self, job_id: str | None = None) -> AsyncIterator[JobRecord]:
        """Yield records as they change: first the current record(s), then each change.

        With ``job_id`` the stream ends once the job's record is terminal. Uses the backend's
        :class:`~dispatch.backend.Watcher` when it has one, else polls ``observe`` with a backoff.
        """
        if job_id is not None:
            await self.store.get(job_id)  # NotFoundError early, before any waiting
        if isinstance(self.backend, Watcher) and (await self.backend.capabilities()).watch:
            stream: AsyncIterator[JobRecord] = self._watch_changes(self.backend, job_id)
        else:
            stream = self._watch_polling(job_id)
        async for rec in stream:
            yield rec

    async def _watch_changes(self, watcher: Watcher, job_id: str | None) -> AsyncIterator[JobRecord]:
        changes = watcher.watch(None)
        try:
            last: dict[str, int] = {}
            for rec in await self._snapshot(job_id):
                last[rec.job_id] = rec.revision
                yield rec
                if job_id is not None and rec.outcome.terminal:
                    return
            async for change in changes:
                ident = change.handle.identity
                if job_id is not None and ident.job_id != job_id:
                    continue
                try:
                    rec = await self._fold(ident.job_id, change.observation)
                except NotFoundError:
                    continue  # an object of ours that matches no record: the supervisor's business
                if last.get(rec.job_id) != rec.revision:
                    last[rec.job_id] = rec.revision
                    yield rec
                if job_id is not None and rec.outcome.terminal:
                    return
        finally:
            aclose = getattr(changes, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _watch_polling(self, job_id: str | None) -> AsyncIterator[JobRecord]:
        last: dict[str, int] = {}
        delay = POLL_MIN
        while True:
            changed = False
            for rec in await self._snapshot(job_id):
                if last.get(rec.job_id) != rec.revision:
                    last[rec.job_id] = rec.revision
                    changed = True
                    yield rec
                if job_id is not None and rec.outcome.terminal:
                    return
            delay = POLL_MIN if changed else min(delay * 2, POLL_MAX)
            await self.clock.sleep(delay)

    async def _snapshot(self, job_id: str | None) -> builtins.list[JobRecord]:
        if job_id is not None:
            return [await self.get(job_id)]
        out = []
        for rec in await self.store.list():
            out.append(rec if rec.outcome.terminal else await self.get(rec.job_id))
        return out

    async def output(
        self,
        job_id: str,
        *,
        node: int = 0,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
    ) -> AsyncIterator[str]:
        """Lines of output of node ``node`` of the job's current incarnation (``previous``: its last
        terminated run, when it restarted in place). ``UnsupportedError`` when the adapter cannot read output."""
        if not isinstance(self.backend, OutputReader) or not (await self.backend.capabilities()).output:
            raise UnsupportedError(
                f"cluster {self.backend.name!r} cannot read job output (capability 'output')"
            )
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise InvalidError(f"expected a node index >= 0, got {node!r}", path="node")
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise InvalidError(f"expected a line count >= 0, got {tail!r}", path="tail")
        rec = await self.store.get(job_id)
        if rec.handle is None:
            raise BusyError(f"job {job_id!r} is not on the cluster yet; retry once it is")
        if not isinstance(previous, bool):
            raise InvalidError(f"expected True or False, got {previous!r}", path="previous")
        stream = (
            self.backend.output(rec.handle, node=node, follow=follow, tail=tail, previous=True)
            if previous
            else self.backend.output(rec.handle, node=node, follow=follow, tail=tail)
        )
        async for line in stream:
            yield line

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The job's transitions, oldest first."""
        return await self.store.history(job_id)

    # ------------------------------------------------------------------ internals

    def _cannot_hold(self, caps: Capabilities) -> UnsupportedError:
        # The adapter's notes about holds ("holds: ...") say why; every one of them is a reason.
        why = [n.removeprefix("holds: ") for n in caps.notes if n.startswith("holds: ")]
        return UnsupportedError(
            [f"cluster {self.backend.name!r} cannot hold jobs (capability 'holds')", *why]
        )

    async def _holder(self) -> Holder:
        # Capabilities are per cluster: an adapter that can hold (a Holder) may not on this cluster.
        caps = await self.backend.capabilities()
        if not isinstance(self.backend, Holder) or not caps.holds:
            raise self._cannot_hold(caps)
        return self.backend

    async def _live(self, job_id: str, what: str) -> JobRecord:
        rec = await self.get(job_id)
        if rec.outcome.terminal:
            raise ConflictError(f"job {job_id!r} is {rec.outcome}; cannot {what} a finished job")
        await self._check_writable()
        return rec

    async def _observe(self, rec: JobRecord) -> Observation | None:
        """Observe the record's current incarnation (by handle, else by identity lookup)."""
        handle = decide.current_handle(rec)
        if handle is not None:
            obs = await self.backend.observe(handle)
            if obs.state is State.LOST:
                # One reading that finds nothing is not proof (see fold): the identity lookup over the
                # whole listing confirms it, or shows the object after all.
                found = await self._find(rec)
                if found is not None:
                    return found
            return obs
        if rec.unknown_write is not None:
            return await self._find(rec)
        return None

    async def _find(self, rec: JobRecord) -> Observation | None:
        """The cluster's object of the record's current incarnation, looked up by identity."""
        for obs in await self.backend.list():
            if matches(rec, obs):
                return obs
        return None

    async def _fold(self, job_id: str, obs: Observation) -> JobRecord:
        return await self._update(job_id, lambda r: self._fold_change(r, obs))

    def _fold_change(self, rec: JobRecord, obs: Observation) -> _Step | None:
        new, transitions = fold(rec, obs, now=self.clock.now())
        return None if new is rec else (new, transitions)

    async def _update(self, job_id: str, change: _Change) -> JobRecord:
        """Read, change and compare-and-swap the record; retry on ``ConflictError`` a bounded number of
        times. ``change`` returns ``None`` for "nothing to write"."""
        for _ in range(CAS_ATTEMPTS):
            rec = await self.store.get(job_id)
            result = change(rec)
            if result is None:
                return rec
            new, transitions = result
            try:
                return await self.store.update(
                    new.replace(updated_at=self.clock.now()),
                    expected_revision=rec.revision,
                    transitions=transitions,
                )
            except ConflictError:
                metrics.current().inc("dispatch_store_conflicts_total")
                continue
        raise ConflictError(
            f"job {job_id!r}: the record kept changing under this write ({CAS_ATTEMPTS} attempts); retry"
        )
