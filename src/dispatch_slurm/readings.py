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

_WAITING = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RESV_DEL_HOLD", "REVOKED"})
"""Flags a version shows instead of ``PENDING`` (22.05, 23.02 write one word): a job requeued or held
before it runs again. Slurm shows ``COMPLETING`` before any of them, so shown they mean its last run's
processes are gone."""


def compute_of(job: SlurmJob) -> Compute:
    """Whether compute of ``job`` remains, as Slurm's answer tells it. Listed by squeue: present while
    it holds its nodes (``COMPLETING`` or another such flag anywhere in its state: a step or the epilog
    still runs) and whenever it is neither ended nor waiting (running, suspended, stopped, or a state this
    reader does not know: a job Slurm lists unended may have processes); gone once it is ended and no
    longer completing, or pending (a requeued job's last run completed before it pends again).
    Accounting alone (squeue no longer lists it) tells only an ended job's: gone; an unended one's it
    cannot tell (the controller forgot a job accounting still shows running): unknown."""
    if job.source != "squeue":
        return Compute.GONE if job.final else Compute.UNKNOWN
    if job.flags & _ALLOCATED:
        return Compute.PRESENT
    if job.final or job.state == "PENDING" or (not job.state and job.flags & _WAITING):
        return Compute.GONE
    return Compute.PRESENT


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
