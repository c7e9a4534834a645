"""Slurm's answer about one incarnation → a typed reading (SPEC §5): seen, with its compute, or absent. Pure.

- **seen**: the job as ``squeue --states=all`` or accounting (the completion log) shows it, classified by
  :mod:`~dispatch_slurm.causes`, with :func:`compute_of` saying whether any of its compute remains;
- **absent**: neither squeue nor accounting/the completion log knows it — both answered completely. Only
  the host concludes ``lost``, from two such readings; this module never does;
- an answer that did not come (an outage) never gets here: the queries raise ``UnavailableError``.

What the host folds with it — ``stopping`` while a terminal job's compute remains, ``cancelled`` only when
the record asked for the cancel (else ``failed``/``cancelled``, someone else's), no going back within an
incarnation — is the host's (:mod:`dispatch.fold`), not this adapter's.
"""

from __future__ import annotations

from dispatch.model import Absent, Compute, Evidence, Handle, Observation
from dispatch_slurm.causes import Facts, classify
from dispatch_slurm.reader import SlurmJob

__all__ = ["absent", "compute_of", "needs_output", "seen"]

_ALLOCATED = frozenset({"COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING"})
"""Flags under which the job still holds its nodes (a process of it may remain there)."""


def compute_of(job: SlurmJob) -> Compute:
    """Whether compute of ``job`` remains: present while it runs, is suspended (its processes stopped on
    its nodes), is being set up or is still completing (``COMPLETING`` anywhere in its state: a step or
    the epilog still runs); gone once Slurm shows it ended and no longer completing, or pending (a
    requeued job's last run completed before it pends again). Accounting alone (squeue no longer lists
    it) cannot say for a job it shows unended: unknown."""
    if job.source != "squeue":
        return Compute.GONE if job.final else Compute.UNKNOWN
    if job.flags & _ALLOCATED or job.state in ("RUNNING", "SUSPENDED"):
        return Compute.PRESENT
    if job.final or job.state == "PENDING":
        return Compute.GONE
    return Compute.UNKNOWN  # a state this reader does not know


def needs_output(job: SlurmJob) -> bool:
    """Whether classifying ``job`` reads the last lines of its output (a failure: they may say why)."""
    return job.state in ("FAILED", "OUT_OF_MEMORY")


def seen(
    handle: Handle,
    job: SlurmJob,
    *,
    at: float,
    requeue_by_slurm: bool = False,
    output: tuple[str, ...] = (),
) -> Observation:
    """The reading of incarnation ``handle`` as Slurm shows it in ``job``, read at ``at`` (epoch seconds,
    when Slurm was asked: readings order by what they saw)."""
    facts = Facts(job=job, job_ref=handle.ref, now=at, requeue_by_slurm=requeue_by_slurm, output=output)
    return Observation(handle, classify(facts), at, compute_of(job))


def absent(handle: Handle, *, at: float, kept_by: str, min_job_age: int) -> Absent:
    """The reading of incarnation ``handle`` that neither squeue nor ``kept_by`` (accounting, the
    completion log, or nothing) lists."""
    where = f"nor {kept_by}" if kept_by else "and the cluster keeps no accounting nor completion log"
    return Absent(
        handle,
        at,
        (
            Evidence(
                "SlurmJob",
                handle.ref,
                reason="Gone",
                message=(
                    f"neither squeue --states=all lists it {where} (an ended job stays in squeue "
                    f"MinJobAge={min_job_age} s)"
                ),
                at=at,
            ),
        ),
    )
