"""The operator's writes on an opened cluster: :class:`Operator`.

``submit``, ``cancel``, ``hold``, ``release`` and ``resubmit`` go to the record first and then to the
backend, so that a crash in between leaves a record saying what was asked; every record write goes
through :class:`~dispatch.writer.RecordWriter` (one compare-and-swap loop). ``dry_run`` shows what a
submit would create. ``forget`` ends a record whose cluster is gone, ``purge`` deletes finished ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from dispatch import chance, decide
from dispatch.backend import (
    CessationSignal,
    Holder,
    HoldToken,
    Prepared,
    compute_gone,
    recent,
    record_decision,
)
from dispatch.errors import BusyError, ConflictError, InvalidError, UnsupportedError
from dispatch.model import (
    Actor,
    Capabilities,
    Compute,
    Epoch,
    Identity,
    JobRecord,
    JobSpec,
    Observation,
    Policy,
    Unreachable,
    check_job_id,
    new_job_id,
)

from .base import POLL_MAX, POLL_MIN, ClusterBase

__all__ = ["CESSATION_WAIT", "Operator"]

CESSATION_WAIT = 60.0
"""How long :meth:`Cluster.resubmit` waits, by default, for the previous incarnation's compute to go."""


class Operator(ClusterBase):
    """What an operator asks of an opened cluster (see the module docstring): a part of
    :class:`~dispatch.cluster.Cluster`."""

    async def submit(
        self,
        spec: JobSpec,
        *,
        job_id: str | None = None,
        held: bool = False,
        policy: Policy | None = None,
        clusters: tuple[str, ...] = (),
        placed: str = "",
    ) -> JobRecord:
        """Record a new job and start its first incarnation (``job_id@1.0``); return its record. In a fleet
        (:class:`dispatch.fleet.Fleet`): ``clusters`` the names of the clusters the job may go to,
        ``placed`` why it was placed on this one.

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
        nonce = chance.token(self.rng, 8)
        prepared = await self.backend.prepare(spec, Identity(job_id, Epoch(), nonce), held=held)
        record, first = decide.submitted(
            job_id,
            spec,
            policy=policy,
            held=held,
            now=self.clock.now(),
            cluster=self.cluster_id,
            nonce=nonce,
            clusters=clusters,
            placed=placed,
        )
        await self.store.create(record, first)
        try:
            return await self._start(job_id, prepared)
        except ConflictError as exc:
            # The native name is another object's (another store's, or not dispatch's): no start of this
            # identity can succeed, so the record must not wait for one for ever.
            refused = exc
            await self._update(
                job_id,
                lambda r: (
                    decide.start_refused(r, prepared.identity, refused, now=self.clock.now())
                    if r.epoch == Epoch() and not r.outcome.terminal
                    else None
                ),
            )
            raise

    async def _start(self, job_id: str, prepared: Prepared) -> JobRecord:
        """Send what was prepared and write the outcome of the start into the record."""
        rec, handle = await self._writer.start(prepared, actor=Actor.USER)
        if handle is None:
            return rec  # its effect is unknown, and the record says so until an observation settles it
        if prepared.held and isinstance(self.backend, Holder):
            # Holding an incarnation created held is idempotent and yields the token release needs.
            token = await self.backend.hold(handle)
            await self._update(job_id, lambda r: (r.replace(hold_token=token), []))
            why = f"job {job_id} epoch {handle.identity.epoch}: created held by the user"
            await record_decision(self.backend, handle, "Held", why)
        # What the backend already knows of the new incarnation costs nothing (Slurm: sbatch's answer,
        # queued); only without it is the cluster read again. Either way a reading, folded as any.
        known = recent(self.backend, handle)
        if known is not None:
            return await self._fold(job_id, known)
        return await self.get(job_id)

    async def cancel(self, job_id: str) -> JobRecord:
        """Ask for the job to end. Records the intent first, then stops the incarnation. A job that is
        already terminal is returned unchanged; one never placed on the cluster is cancelled at once."""
        # Refreshed first: a job that already ended on the cluster keeps its real outcome, instead of
        # being folded to "cancelled" because the intent was recorded before its end was read.
        rec = await self.get(job_id)
        if rec.outcome.terminal:
            await self._stop_leftovers(rec)
            return rec
        self._writer.check_owned(rec)
        await self._check_writable()

        rec = await self._update(job_id, lambda r: decide.cancel_requested(r, now=self.clock.now()))
        if rec.outcome.terminal:
            return rec
        handle = decide.current_handle(rec)
        if handle is None:
            found = await self._reader.find(rec)
            if isinstance(found, Unreachable):
                return rec  # the cancel is recorded; the stop waits until the cluster answers
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

    async def _stop_leftovers(self, rec: JobRecord) -> None:
        """A finished job whose incarnation still has compute on the cluster (a Trainer re-creating the
        JobSet of a TrainJob being deleted; pods of a job that failed for its configuration): stop it,
        and say so in the history. Its outcome stays as it is."""
        handle = decide.current_handle(rec)
        if handle is None or not self.owns(rec):
            return
        got = await self._reader.observe(handle)
        if not isinstance(got, Observation) or got.compute is not Compute.PRESENT:
            return
        await self._check_writable()
        await self.backend.stop(handle)
        why = f"{handle.identity} ended {rec.outcome} and its compute was still there: stopped it"
        await self._update(
            rec.job_id, lambda r: decide.leftovers_stopped(r, why, actor=Actor.USER, now=self.clock.now())
        )

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
        prepared = await self.backend.prepare(new_spec, Identity(job_id, epoch, rec.nonce))
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
            found = await self._reader.find(rec)
            if isinstance(found, Unreachable):
                raise BusyError(f"job {rec.job_id!r}: the cluster does not answer ({found}); retry")
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
        prepared = await self.backend.prepare(
            spec, Identity(job_id, Epoch(), chance.token(self.rng, 8)), held=held
        )
        return prepared.request

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

    def _cannot_hold(self, caps: Capabilities) -> UnsupportedError:
        # The adapter's notes about holds ("holds: ...") say why; every one of them is a reason.
        why = [
            n.removeprefix("holds: ")
            for n in caps.notes
            if n.startswith(("holds: ", "observe-only: ", "read-only: "))
        ]
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
