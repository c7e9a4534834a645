"""Opening a cluster: :func:`open` and the :class:`Cluster` it returns (operator and observer).

The operator writes (``submit``, ``cancel``, ``hold``, ``release``, ``resubmit``) go to the record
first and then to the backend, so that a crash in between leaves a record saying what was asked; every
record write goes through :class:`~dispatch.writer.RecordWriter` (one compare-and-swap loop). The
observer reads (``get``, ``list``, ``watch``) fold what the cluster reports into the records with
:func:`dispatch.fold.fold`.

A record belongs to the cluster of its current incarnation (SPEC §6.1): opened on another cluster, a
``Cluster`` shows such a record as last known (``record.cluster`` names its own) and writes nothing to
it; the writes raise :class:`~dispatch.errors.OtherClusterError`. Only :meth:`Cluster.forget` ends a
record of a cluster that is gone, and :meth:`Cluster.purge` deletes finished ones.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dispatch import decide
from dispatch.backend import (
    Backend,
    CessationSignal,
    Holder,
    HoldToken,
    JobWatcher,
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
    OtherClusterError,
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
from dispatch.records import KeyValues, Listing, Store, store_identity
from dispatch.registry import new_backend
from dispatch.writer import CAS_ATTEMPTS, Change, RecordWriter

if TYPE_CHECKING:
    from dispatch.supervise import Supervisor

__all__ = ["CAS_ATTEMPTS", "Cluster", "backend_for", "open"]

POLL_MIN = 0.5
POLL_MAX = 5.0
"""Polling backoff of :meth:`Cluster.watch` on a backend without a watcher (seconds)."""

CESSATION_WAIT = 60.0
"""How long :meth:`Cluster.resubmit` waits, by default, for the previous incarnation's compute to go."""

_Step = tuple[JobRecord, list[Transition]]


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
        backend = await backend_for(name, config, store)
    except BaseException:
        if config.store is None:
            await store.close()
        raise
    return Cluster(backend, store, policy=config.policy, clock=clock)


async def backend_for(name: str, config: Config, store: Store) -> Backend:
    """The backend of adapter ``name`` opened with ``config`` for the records of ``store``: the objects it
    creates carry the store's identity, so two stores sharing a cluster leave each other's alone."""
    store_id = await store_identity(store)
    return await new_backend(name, config.adapter_config(name, store_id=store_id))


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
        self._writer = RecordWriter(store, backend, self.clock)
        self._closed = False

    @property
    def cluster_id(self) -> str:
        """The identity of the opened cluster (see :attr:`dispatch.backend.Backend.cluster_id`)."""
        return self.backend.cluster_id

    def owns(self, record: JobRecord) -> bool:
        """Whether ``record`` belongs to this cluster, so that this process may change it (SPEC §6.1)."""
        return self._writer.owns(record)

    async def belongs(self, record: JobRecord) -> bool:
        """:meth:`owns`, for any backend: one opened on first use (the CLI's read commands) is opened
        first, since it knows its cluster only then."""
        await self.backend.capabilities()
        return self.owns(record)

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
        record, first = decide.submitted(
            job_id, spec, policy=policy, held=held, now=self.clock.now(), cluster=self.cluster_id
        )
        await self.store.create(record, first)
        return await self._start(job_id, prepared)

    async def _start(self, job_id: str, prepared: Prepared) -> JobRecord:
        """Send what was prepared and write the outcome of the start into the record."""
        rec, handle = await self._writer.start(prepared, actor=Actor.USER)
        if handle is None:
            return rec  # its effect is unknown, and the record says so until an observation settles it
        if prepared.held and isinstance(self.backend, Holder):
            # Holding an incarnation created held is idempotent and yields the token release needs.
            token = await self.backend.hold(handle)
            await self._update(job_id, lambda r: (r.replace(hold_token=token), []))
        return await self.get(job_id)

    async def cancel(self, job_id: str) -> JobRecord:
        """Ask for the job to end. Records the intent first, then stops the incarnation. A job that is
        already terminal is returned unchanged; one never placed on the cluster is cancelled at once."""
        # Refreshed first: a job that already ended on the cluster keeps its real outcome, instead of
        # being folded to "cancelled" because the intent was recorded before its end was read.
        rec = await self.get(job_id)
        if rec.outcome.terminal:
            return rec
        self._writer.check_owned(rec)
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
        # Told before the stop: a stop deletes the TrainJob, and an Event is recorded on a live object.
        why = f"job {job_id} epoch {rec.epoch}: cancelled by the user; stopping {handle.ref}"
        await record_decision(self.backend, handle, "Cancelled", why)
        await self.backend.stop(handle)
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
        self._writer.check_owned(rec)
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
        if rec.outcome.terminal or not await self.belongs(rec):
            return rec  # final, or another cluster's: shown as last known
        obs = await self._observe(rec)
        if obs is None:
            return rec
        return await self._fold(job_id, obs)

    async def list(self, states: Iterable[State] | None = None) -> Listing:
        """Every record (optionally only in ``states``), oldest first; records of this cluster that are
        not terminal are refreshed from one listing of the cluster, others' are shown as last known.
        Stored records that cannot be read are left out and named in the listing's ``unreadable``."""
        wanted = None if states is None else _states(states)
        listing = await self.store.list()
        records: builtins.list[JobRecord] = listing
        unfinished = [r for r in records if not r.outcome.terminal]
        if unfinished:
            await self.backend.capabilities()  # opened once (lazily opened backends), not per record
        live = [r for r in unfinished if self.owns(r)]
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
        return Listing((r for r in records if wanted is None or r.state in wanted), listing.unreadable)

    async def watch(self, job_id: str | None = None) -> AsyncIterator[JobRecord]:
        """Yield records as they change: first the current record(s), then each change.

        With ``job_id`` the stream ends once the job's record is terminal. Uses the backend's
        :class:`~dispatch.backend.Watcher` when it has one, else polls ``observe`` with a backoff.
        """
        if job_id is not None:
            rec = await self.store.get(job_id)  # NotFoundError early, before any waiting
            if not rec.outcome.terminal and not await self.belongs(rec):  # another cluster's: shown as is
                yield rec
                return
        if isinstance(self.backend, Watcher) and (await self.backend.capabilities()).watch:
            stream: AsyncIterator[JobRecord] = self._watch_changes(self.backend, job_id)
        else:
            stream = self._watch_polling(job_id)
        async for rec in stream:
            yield rec

    async def _watch_changes(self, watcher: Watcher, job_id: str | None) -> AsyncIterator[JobRecord]:
        # One job's watch costs that job's changes, not every job's, where the backend can say so.
        changes = (
            watcher.watch_job(job_id)
            if job_id is not None and isinstance(watcher, JobWatcher)
            else watcher.watch(None)
        )
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
                except OtherClusterError:
                    continue  # a record of another cluster: not this process's to fold
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
        # One listing of the cluster refreshes every record (a get each cost one reading per record).
        return builtins.list(await self.list())

    async def output(
        self,
        job_id: str,
        *,
        node: int = 0,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
        since: float | None = None,
        timestamps: bool = False,
    ) -> AsyncIterator[str]:
        """Lines of output of node ``node`` of the job's current incarnation (``previous``: its last
        terminated run, when it restarted in place; ``since``: only the last ``since`` seconds';
        ``timestamps``: each line prefixed with the RFC 3339 time it was written). ``UnsupportedError``
        when the adapter cannot read output."""
        if not isinstance(self.backend, OutputReader) or not (await self.backend.capabilities()).output:
            raise UnsupportedError(
                f"cluster {self.backend.name!r} cannot read job output (capability 'output')"
            )
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise InvalidError(f"expected a node index >= 0, got {node!r}", path="node")
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise InvalidError(f"expected a line count >= 0, got {tail!r}", path="tail")
        if since is not None and (
            isinstance(since, bool) or not isinstance(since, int | float) or since <= 0
        ):
            raise InvalidError(f"expected a number of seconds > 0, got {since!r}", path="since")
        rec = await self.store.get(job_id)
        if rec.handle is None:
            raise BusyError(f"job {job_id!r} is not on the cluster yet; retry once it is")
        if not isinstance(previous, bool) or not isinstance(timestamps, bool):
            raise InvalidError(
                "expected True or False", path="previous" if not isinstance(previous, bool) else "timestamps"
            )
        # Only what was asked for: a reader that predates an option still serves the plain reads.
        asked: dict[str, Any] = {"previous": previous, "since": since, "timestamps": timestamps}
        options = {k: v for k, v in asked.items() if v not in (None, False)}
        async for line in self.backend.output(rec.handle, node=node, follow=follow, tail=tail, **options):
            yield line

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The job's transitions, oldest first."""
        return await self.store.history(job_id)

    async def record(self, job_id: str) -> JobRecord:
        """The job's record as last stored, not refreshed from the cluster (:meth:`get` refreshes it)."""
        return await self.store.get(job_id)

    async def records(self) -> Listing:
        """Every record as last stored, oldest first, not refreshed (:meth:`list` refreshes them)."""
        return await self.store.list()

    async def note(self, key: str) -> str | None:
        """A value kept beside the records (the store's key-value table); ``None`` when unset or when
        the store has no such table."""
        return await self.store.get_value(key) if isinstance(self.store, KeyValues) else None

    async def set_note(self, key: str, value: str | None) -> None:
        """Keep ``value`` under ``key`` beside the records (``None`` deletes it); a store without a
        key-value table keeps nothing."""
        if isinstance(self.store, KeyValues):
            await self.store.put_value(key, value)

    # ------------------------------------------------------------------ records whose cluster is gone

    async def forget(self, job_id: str, reason: str) -> JobRecord:
        """End a record whose cluster is gone (a stopped dev cluster): ``lost``/``unknown`` with the user
        as actor and ``reason`` in the history, final (never requeued). Asks no cluster anything, so it
        works on a record of any cluster; a record of *this* cluster is refused (``ConflictError``:
        cancel it instead), and a finished record is returned as it is."""
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidError("say why the job is forgotten", path="reason")
        rec = await self.store.get(job_id)
        if rec.outcome.terminal:
            return rec
        if rec.cluster and await self.belongs(rec):
            raise ConflictError(
                f"job {job_id!r} belongs to this cluster, which can still answer for it: "
                "cancel it instead (dispatch cancel)"
            )
        return await self._writer.update(
            job_id, lambda r: decide.forgotten(r, reason, now=self.clock.now()), any_cluster=True
        )

    async def purge(self, older_than: float) -> int:
        """Delete finished records (and their history) last changed before ``older_than`` (epoch
        seconds); records that are not finished are never deleted. Returns how many were deleted."""
        if isinstance(older_than, bool) or not isinstance(older_than, int | float):
            raise InvalidError(f"expected epoch seconds, got {older_than!r}", path="older_than")
        return await self.store.purge(float(older_than))

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
        self._writer.check_owned(rec)
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

    async def _update(self, job_id: str, change: Change) -> JobRecord:
        """The one compare-and-swap loop (:meth:`RecordWriter.update`)."""
        return await self._writer.update(job_id, change)
