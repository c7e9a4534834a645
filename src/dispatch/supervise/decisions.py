"""The supervisor's small decisions over values (pure): whether an observed incarnation still has compute,
whether its record still wants it, and whether a record is still what a decision was made on (which
member of a fleet a job belongs to is :class:`dispatch.model.Share`'s). The big one — the next action for a record — is
:func:`dispatch.decide.next`."""

from __future__ import annotations

from dispatch import decide
from dispatch.model import Compute, JobRecord, Observation

__all__ = ["live", "same", "unwanted"]


def live(obs: Observation) -> bool:
    """Whether an observed incarnation still has (or may have) compute: leftovers to stop."""
    return obs.compute is Compute.PRESENT or (obs.compute is Compute.UNKNOWN and not obs.outcome.terminal)


def unwanted(rec: JobRecord, obs: Observation) -> bool:
    """An incarnation its record no longer wants: of a finished record's current epoch, or of an epoch
    that is neither the record's nor the previous one it is retiring (an object of another record of
    the same job id is no business of this one's)."""
    ident = obs.handle.identity
    if ident.nonce != rec.nonce:
        return False
    n = ident.epoch.n
    if n == rec.epoch.n:
        return rec.outcome.terminal
    prev = decide.previous_handle(rec)
    return n < rec.epoch.n and (prev is None or prev.identity.epoch.n != n)


def same(before: JobRecord, now: JobRecord) -> bool:
    """True when the record is still the incarnation and state a decision was made on."""
    return (
        now.epoch == before.epoch
        and now.outcome.state is before.outcome.state
        and now.handle == before.handle
        and now.cancel_requested == before.cancel_requested
    )
