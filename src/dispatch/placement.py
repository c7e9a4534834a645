"""Where an incarnation goes in a fleet of clusters (SPEC §15): :func:`place`, a pure decision.

The fleet reads each of its clusters (whether it answers, whether it accepts the job's spec, how many jobs
wait there for capacity) into a :class:`Candidate`; :func:`place` takes the first, in the fleet's order
for this incarnation, that the job allows and that takes it, and says why it was chosen and why each one
before it was passed over — the words the record's history keeps.

The order is the configured one, or with weights a weighted rendezvous hash of the job id and its epoch:
the same incarnation always gets the same order (any process, any time), and the jobs spread over the
clusters in proportion to their weights. A requeue under a rule with ``elsewhere`` avoids the cluster the
previous incarnation ran on while another takes it; it goes back there only when none does.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Candidate", "Placement", "order", "place"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One cluster of the fleet as placement sees it now: its configured ``name``, its ``identity`` (empty
    when it was never opened), ``refusing`` (why it takes no work now: unreachable, refuses the spec,
    jobs waiting there for capacity; empty when it takes work) and ``checkpoints`` (the name of the
    checkpoint directory its jobs see; empty: one of its own)."""

    name: str
    identity: str = ""
    refusing: str = ""
    checkpoints: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the incarnation goes (``chosen``; ``None`` when no allowed cluster takes it now) and why."""

    chosen: Candidate | None
    why: str


def order(names: Sequence[str], weights: Mapping[str, float] | None, job_id: str, epoch: int) -> list[str]:
    """The clusters in the order tried for incarnation ``epoch`` of ``job_id``: ``names`` as configured,
    or with ``weights`` (each > 0) by a weighted rendezvous hash (a cluster of weight 3 comes first for
    about three jobs in four beside one of weight 1)."""
    if not weights:
        return list(names)

    def score(name: str) -> float:
        digest = hashlib.sha256(f"{job_id}\0{epoch}\0{name}".encode()).digest()
        u = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64  # uniform in (0, 1)
        return -math.log(u) / weights.get(name, 1.0)

    return sorted(names, key=lambda n: (score(n), n))


def place(
    candidates: Sequence[Candidate],
    *,
    allowed: Sequence[str] = (),
    avoid: str = "",
    previous: Candidate | None = None,
) -> Placement:
    """Choose the cluster for an incarnation among ``candidates`` (in the order to try them).

    ``allowed``: the names the job may go to (empty: any); ``avoid``: the identity of the cluster a
    requeue ``elsewhere`` leaves (taken only when no other takes the job); ``previous``: the cluster of
    the previous incarnation, whose checkpoints follow only to a cluster that sees the same directory."""
    passed: list[str] = []
    usable: list[Candidate] = []
    for c in candidates:
        if allowed and c.name not in allowed:
            continue
        if c.refusing:
            passed.append(f"{c.name}: {c.refusing}")
        else:
            usable.append(c)
    others = [c for c in usable if not avoid or c.identity != avoid]
    chosen: Candidate | None = None
    if others:
        chosen = others[0]
        reason = "the first that takes it" if not avoid else "the first other cluster that takes it"
        for c in usable:
            if c is chosen:
                break
            if avoid and c.identity == avoid:
                passed.append(f"{c.name}: the previous incarnation ran there (requeue elsewhere)")
    elif usable:
        chosen = usable[0]
        reason = "no other cluster takes it"
    if chosen is None:
        where = f" of {', '.join(allowed)}" if allowed else ""
        why = f"no cluster{where} takes it now"
        return Placement(None, why + (f" ({'; '.join(passed)})" if passed else ""))
    why = f"placed on {chosen.name}: {reason}"
    if passed:
        why += f"; passed over {'; '.join(passed)}"
    if previous is not None and previous.identity and previous.identity != chosen.identity:
        if previous.checkpoints and previous.checkpoints == chosen.checkpoints:
            why += f"; its checkpoints follow ({previous.name} and {chosen.name} see {chosen.checkpoints})"
        else:
            why += f"; it starts over: {chosen.name} does not see {previous.name}'s checkpoints"
    return Placement(chosen, why)
