"""Holds on Slurm (SPEC §13 "Holds"): :class:`Holds`.

As the Go original: a hold pushes the job's start time ``HoldBase`` (ten Julian years) into the future,
and the start time written is the hold token; a release whose token no longer matches what Slurm shows
raises :class:`~dispatch_slurm.errors.StaleHoldError`. Slurm cannot hold a running job in place: a hold
of a running job requeues it (stops it) first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from dispatch.backend import HoldToken
from dispatch.errors import ConflictError
from dispatch.model import Handle
from dispatch_slurm.answers import Result
from dispatch_slurm.errors import StaleHoldError
from dispatch_slurm.observing import Observing
from dispatch_slurm.reader import SlurmJob
from dispatch_slurm.settings import HOLD_BASE

__all__ = ["REQUEUE_SETTLE", "Holds", "hold_token"]

_log = logging.getLogger(__name__)

REQUEUE_SETTLE = 30.0
"""Seconds a release waits for a held (requeued) running job to leave COMPLETING for PENDING."""

Write = Callable[[Sequence[str], str], Awaitable[Result]]
"""Runs a write command (an outage raises; Slurm's refusal is returned)."""


def hold_token(job: SlurmJob) -> str:
    """The hold token a held job carries: its id and the start time Slurm shows for it."""
    return f"{job.job_id}@{job.eligible_time}"


class Holds:
    """Hold and release the incarnations of one opened cluster (see the module docstring)."""

    def __init__(self, observing: Observing, write: Write, *, requeue_by_slurm: bool) -> None:
        self.observing = observing
        self._write = write
        self.requeue_by_slurm = requeue_by_slurm

    async def _update(self, job_id: str, *settings: str) -> Result:
        return await self._write(
            ["scontrol", "update", f"jobid={job_id}", *settings], f"update Slurm job {job_id}"
        )

    async def hold(self, handle: Handle) -> HoldToken:
        job = await self.observing.find(handle)
        if job is None or job.final:
            raise ConflictError(f"incarnation {handle.identity} has ended: there is nothing to hold")
        if job.state != "PENDING":
            # Slurm cannot hold a running job in place: it is requeued (stopped), then held by start time.
            await self._requeue(job)
        before = job.eligible_time if job.state == "PENDING" else None
        # Each hold writes a start time the job did not show before, so an older token goes stale even
        # when two holds fall in the same second.
        token = ""
        for extra in range(5):
            updated = await self._update(job.job_id, f"StartTime=now+{HOLD_BASE + extra}")
            if not updated.ok:
                raise ConflictError(f"Slurm refused to hold job {job.job_id}: {updated.error()}")
            again = await self.observing.find(handle)
            if again is None:
                raise ConflictError(f"incarnation {handle.identity} vanished while being held")
            token = hold_token(again)
            if again.eligible_time != before:
                break
        _log.info("held Slurm job %s of %s", job.job_id, handle.identity)
        return HoldToken(token)

    async def _requeue(self, job: SlurmJob) -> None:
        # Two steps (a job submitted --no-requeue must be made requeueable first); a crash between them
        # leaves Requeue=1 on a running job, which is harmless: dispatch still decides what follows.
        await self._update(job.job_id, "Requeue=1")
        done = await self._write(["scontrol", "requeue", job.job_id], f"requeue Slurm job {job.job_id}")
        if not done.ok:
            raise ConflictError(f"Slurm refused to requeue running job {job.job_id}: {done.error()}")
        if not self.requeue_by_slurm:
            await self._update(job.job_id, "Requeue=0")

    async def release(self, handle: Handle, token: HoldToken) -> None:
        job = await self.observing.find(handle)
        # A running job that was held is requeued: it stays COMPLETING, with the held start time, until
        # its nodes have cleaned up, then is PENDING. A release in that window waits for it (seen under
        # load: a release right after the hold found it COMPLETING and called the token stale).
        settled = time.monotonic() + REQUEUE_SETTLE
        while job is not None and job.completing and token == hold_token(job) and time.monotonic() < settled:
            await asyncio.sleep(0.2)
            job = await self.observing.find(handle)
        if job is None or job.state != "PENDING" or job.completing or token != hold_token(job):
            raise StaleHoldError(
                f"the hold token of {handle.identity} no longer matches what Slurm shows "
                f"({'gone' if job is None else job.shown + ', start time ' + str(job.eligible_time)})"
            )
        # now+1, not now: a hold of a running job requeued it, which revokes its launch credential, and
        # slurmd refuses a credential made in the same second as a revocation ("Killing non-startable
        # batch JobId=N: Job credential revoked": the job ends FAILED, exit 1). Seen when a release came
        # within a second of the hold (issue 21's fault series); a second later costs a held job nothing.
        updated = await self._update(job.job_id, "StartTime=now+1")
        if not updated.ok:
            raise ConflictError(f"Slurm refused to release job {job.job_id}: {updated.error()}")
        _log.info("released Slurm job %s of %s", job.job_id, handle.identity)
