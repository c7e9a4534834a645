"""The one way a record is written: :class:`RecordWriter`.

The facade (:class:`~dispatch.cluster.Cluster`) and the supervisor change records the same way: read the
record, check that this process may change it, apply a pure change from :mod:`dispatch.decide` or
:func:`dispatch.fold.fold`, and compare-and-swap the result, retrying a bounded number of times when the
record moved under the write. Placing an incarnation and recording what happened (started, refused,
failed, or unknown) is one routine too, :meth:`RecordWriter.start`.

Who may change a record (SPEC §6.1): only a process opened on the record's own cluster
(:func:`dispatch.decide.owned`); another process gets :class:`~dispatch.errors.OtherClusterError` and
writes nothing. A supervisor's writer also holds a lease holder name: it writes only while that holder's
lease on the record is live (:class:`LeaseLostError` otherwise) — live by the holder's own reckoning when
it gives one (``lease_until``), since its clock may disagree with the store's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dispatch import decide, metrics
from dispatch.backend import Backend, Prepared
from dispatch.clock import Clock
from dispatch.errors import (
    ConflictError,
    DispatchError,
    InvalidError,
    OtherClusterError,
    OutcomeUnknownError,
    UnsupportedError,
)
from dispatch.model import Actor, Handle, Identity, JobRecord, Transition
from dispatch.records import Store

__all__ = ["CAS_ATTEMPTS", "Change", "LeaseLostError", "RecordWriter"]

CAS_ATTEMPTS = 8
"""How many times a record write is retried when the record changed under it (``ConflictError``)."""

Change = Callable[[JobRecord], decide.Step | None]
"""A pure change of a record: the new record and its transitions, or ``None`` for "nothing to write"."""

OnWrite = Callable[[JobRecord, JobRecord, list[Transition], float], None]


class LeaseLostError(ConflictError):
    """Our lease on a record expired or was taken over; the record is not ours to act on."""


class RecordWriter:
    """Writes the records of ``store`` for a process opened on ``backend``'s cluster.

    ``holder``: write only under this lease holder's live lease (a supervisor). ``lease_until``: when the
    holder's lease on a job ends on the holder's own clock (``None``: it holds none); without it the
    record's expiry, which the store stamped on its clock, is compared with ``clock``. ``on_write`` is
    called after each successful write with the record before and after, the transitions and the time
    (the supervisor's metrics)."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        clock: Clock,
        *,
        holder: str | None = None,
        lease_until: Callable[[str], float | None] | None = None,
        on_write: OnWrite | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.clock = clock
        self.holder = holder
        self._lease_until = lease_until
        self._on_write = on_write

    @property
    def cluster(self) -> str:
        """The identity of the cluster this process opened."""
        return self.backend.cluster_id

    def owns(self, record: JobRecord) -> bool:
        """Whether this process may change ``record`` (it belongs to this process's cluster)."""
        return decide.owned(record, self.backend.cluster_id, self.backend.name)

    def check_owned(self, record: JobRecord) -> JobRecord:
        """``record`` if this process may change it, else :class:`OtherClusterError`."""
        if not self.owns(record):
            raise OtherClusterError(record.job_id, record.cluster)
        return record

    async def update(
        self, job_id: str, change: Change, *, any_cluster: bool = False, current: JobRecord | None = None
    ) -> JobRecord:
        """Read, check, change and compare-and-swap the record; retry on ``ConflictError`` a bounded
        number of times. Returns the record as written (or as read, when ``change`` had nothing).
        ``any_cluster``: the change asks no cluster anything (``forget``), so a record of any cluster
        may take it. ``current``: the record as the caller just read it, used instead of reading it
        again for the first attempt (the compare-and-swap still refuses it if it moved since)."""
        for attempt in range(CAS_ATTEMPTS):
            rec = current if attempt == 0 and current is not None else await self.store.get(job_id)
            if not any_cluster:
                self.check_owned(rec)
            now = self.clock.now()
            if self.holder is not None:
                lease = rec.lease
                until = lease.expires_at if lease is not None else None
                if self._lease_until is not None:
                    until = self._lease_until(job_id)
                if lease is None or lease.holder != self.holder or until is None or until <= now:
                    raise LeaseLostError(f"job {job_id!r}: the lease of {self.holder!r} is gone")
            result = change(rec)
            if result is None:
                return rec
            new, transitions = result
            # A record written before clusters were recorded belongs from now on to the one writing it.
            if not new.cluster and self.owns(new):
                new = new.replace(cluster=self.backend.cluster_id)
            # ``since``: when the record entered its current state (a stop's grace is counted from it).
            since = now if new.state is not rec.state or new.epoch != rec.epoch else new.since
            new = new.replace(updated_at=now, since=since)
            try:
                after = await self.store.update(new, expected_revision=rec.revision, transitions=transitions)
            except ConflictError:
                metrics.current().inc("dispatch_store_conflicts_total")
                continue
            if self._on_write is not None:
                self._on_write(rec, after, transitions, now)
            return after
        raise ConflictError(
            f"job {job_id!r}: the record kept changing under this write ({CAS_ATTEMPTS} attempts); retry"
        )

    async def start(
        self,
        prepared: Prepared,
        *,
        actor: Actor,
        record_failures: bool = True,
        current: JobRecord | None = None,
    ) -> tuple[JobRecord, Handle | None]:
        """Send what was prepared and write what happened into the record of ``prepared``'s job:
        ``started`` with the handle; a start whose effect could not be known (a lost answer, or cancelled
        while the create may have been sent) as ``unknown_write``; a start the cluster refuses
        (``InvalidError``/``UnsupportedError``) as ``failed``/``invalid_spec``, raised; any other error
        as a "start failed" line in the history (the record stays pending, the job is not lost), raised
        — unless ``record_failures`` is false (a supervisor that retries writes nothing each time).

        A lease holder whose lease is gone by its own reckoning gets ``LeaseLostError`` and nothing is
        sent. Each change applies only while the record still wants this incarnation (same ``N``). Returns the
        record after the write and the handle started (``None`` when the start's effect is unknown).
        ``current``: the record the start was decided on, from which recording the handle starts (as in
        :meth:`update`)."""
        identity = prepared.identity
        job_id = identity.job_id
        if self.holder is not None and self._lease_until is not None:
            # A placement is not a record write, so no compare-and-swap guards it: a holder that was
            # paused past its lease (the zombie) must not place what its record wanted before the pause.
            until = self._lease_until(job_id)
            if until is None or until <= self.clock.now():
                raise LeaseLostError(f"job {job_id!r}: the lease of {self.holder!r} is gone; not placing")
        try:
            handle = await self.backend.start(prepared)
        except OutcomeUnknownError as exc:
            return await self._unknown(identity, str(exc), actor), None
        except asyncio.CancelledError:
            # Cancelled while the create may have been sent: the record must say so, whatever happens
            # to this task next.
            await asyncio.shield(self._unknown(identity, "cancelled while starting", actor))
            raise
        except (InvalidError, UnsupportedError) as exc:
            refused = exc
            await self.update(
                job_id,
                _wanting(
                    identity, lambda r: decide.start_refused(r, identity, refused, now=self.clock.now())
                ),
            )
            raise
        except DispatchError as exc:
            if record_failures:
                reason = str(exc)
                await self.update(
                    job_id,
                    _wanting(
                        identity,
                        lambda r: decide.start_failed(r, identity, reason, actor=actor, now=self.clock.now()),
                    ),
                )
            raise
        after = await self.update(
            job_id, lambda r: decide.started(r, handle, actor=actor, now=self.clock.now()), current=current
        )
        return after, handle

    async def _unknown(self, identity: Identity, reason: str, actor: Actor) -> JobRecord:
        return await self.update(
            identity.job_id,
            _wanting(
                identity,
                lambda r: decide.start_unknown(r, identity, reason, actor=actor, now=self.clock.now()),
            ),
        )


def _wanting(identity: Identity, change: Change) -> Change:
    """``change``, applied only while the record still wants incarnation ``identity``."""
    return lambda r: change(r) if r.epoch.n == identity.epoch.n and not r.outcome.terminal else None
