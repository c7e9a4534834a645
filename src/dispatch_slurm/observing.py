"""Reading dispatch's jobs on Slurm into typed readings: :class:`Observing` (``observe``, ``list``, the polls).

Every reading starts from one complete answer — ``squeue --json --states=all`` (every job Slurm still
lists, ended ones for ``MinJobAge``) — and asks accounting or the completion log (``sacct``, one call for
all of them) only about incarnations that left the queue. A job is this store's by its comment (the
store id) and its name (the native name of the identity the comment claims); an incarnation's job by its
Slurm job id *and* its identity, nonce included, so a job id that now names another job is not it. Each
job is read by :mod:`~dispatch_slurm.readings` (pure), with the last lines of its output when it failed.

No memory of its own: an ended job that the feed already holds, read ended with its compute gone, is
not read again (its output not fetched again each poll) — the feed's last reading of it *is* what it
would read; the host's feed and records are the memory (SPEC §5).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable

from dispatch.feed import Feed
from dispatch.model import Absent, Compute, Handle, Identity, Observation
from dispatch_slurm import naming, readings
from dispatch_slurm.preflight import ClusterInfo
from dispatch_slurm.queries import Queries
from dispatch_slurm.reader import SlurmJob
from dispatch_slurm.script import job_dir
from dispatch_slurm.settings import Settings

__all__ = ["NAME", "Observing"]

NAME = "slurm"


class Observing:
    """The readings of one opened Slurm cluster's jobs for one store (see the module docstring)."""

    def __init__(
        self, queries: Queries, info: ClusterInfo, settings: Settings, store_id: str, feed: Feed
    ) -> None:
        self.queries = queries
        self.info = info
        self.settings = settings
        self.store_id = store_id
        self.feed = feed

    def handle(self, identity: Identity, ref: str) -> Handle:
        return Handle(NAME, identity, ref, cluster=self.info.cluster_id)

    def ours(self, job: SlurmJob) -> naming.Marks | None:
        """The marks of ``job`` when it is one of this store's incarnations, else ``None``."""
        marks = naming.parse_comment(job.comment)
        if marks is None or marks.store != self.store_id:
            return None
        if job.name != naming.native_name(marks.identity):
            return None  # a forged or edited job: not one of ours
        return marks

    @property
    def kept_by(self) -> str:
        """What keeps a job once squeue no longer lists it ("": nothing)."""
        if self.info.accounting:
            return "accounting (sacct)"
        return "the completion log (sacct -c)" if self.info.jobcomp else ""

    async def find(self, handle: Handle) -> SlurmJob | None:
        """The Slurm job of ``handle``: in squeue, else in accounting (checked to be that incarnation by
        its name, which the nonce is part of); ``None`` only when both answered and neither knows it."""
        for job in await self.queries.jobs():
            if job.job_id == handle.ref:
                marks = naming.parse_comment(job.comment)
                if marks is None or not marks.identity.same_incarnation(handle.identity):
                    return None  # the id now names another job: ours left the queue long ago
                return job
        for job in await self.queries.accounted(ids=[handle.ref]):
            if job.job_id == handle.ref and job.name == naming.native_name(handle.identity):
                return job
        return None

    async def read(self, handle: Handle, job: SlurmJob | None, at: float) -> Observation | Absent:
        """The typed reading of ``handle`` from ``job`` (``None``: neither squeue nor accounting knows it),
        asked at ``at``."""
        if job is None:
            return readings.absent(handle, at=at, kept_by=self.kept_by, min_job_age=self.info.min_job_age)
        output: tuple[str, ...] = ()
        if readings.needs_output(job) and self.settings.output_tail_lines:
            directory = job_dir(self.info.workdir, handle.identity)
            output = await self.queries.tails(directory, self.settings.output_tail_lines)
        return readings.seen(
            handle, job, at=at, requeue_by_slurm=self.settings.requeue == "slurm", output=output
        )

    def _kept(self, handle: Handle, job: SlurmJob) -> Observation | None:
        """The feed's last reading of ``handle`` when it says all a new one would: the job ended, its
        compute gone, and Slurm still shows it ended (a requeue would make it pending again)."""
        last = self.feed.last(handle.ref)
        if (
            isinstance(last, Observation)
            and last.handle.identity.same_incarnation(handle.identity)
            and last.outcome.terminal
            and last.compute is Compute.GONE
            and readings.compute_of(job) is Compute.GONE
            and job.final
        ):
            return last
        return None

    async def listed(self, jobs: Iterable[SlurmJob], at: float) -> builtins.list[Observation]:
        """The reading of every incarnation of this store in an squeue answer (``jobs``)."""
        out = []
        for job in jobs:
            marks = self.ours(job)
            if marks is None:
                continue
            handle = self.handle(marks.identity, job.job_id)
            kept = self._kept(handle, job)
            reading = kept if kept is not None else await self.read(handle, job, at)
            assert isinstance(reading, Observation)
            out.append(reading)
        return out

    async def poll(self, live: Iterable[Handle], at: float) -> builtins.list[Observation | Absent]:
        """One poll: every incarnation squeue lists, and those of ``live`` (incarnations read before,
        not ended) it no longer lists, from accounting — one call for all of them — or absent."""
        jobs = await self.queries.jobs()
        seen = await self.listed(jobs, at)
        shown = {o.handle.ref for o in seen}
        left = {h.ref: h for h in live if h.ref not in shown}
        out: builtins.list[Observation | Absent] = list(seen)
        if left:
            found = {j.job_id: j for j in await self.queries.accounted(ids=sorted(left))}
            for ref, handle in left.items():
                job = found.get(ref)
                if job is not None and job.name != naming.native_name(handle.identity):
                    job = None  # the id names another job in accounting (a cluster's ids started again)
                out.append(await self.read(handle, job, at))
        return out
