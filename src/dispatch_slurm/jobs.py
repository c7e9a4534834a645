"""What Slurm says about a job, read from ``squeue --json`` and from text ``sacct`` (the completion log
or accounting) into one value. Pure: the commands are run elsewhere.

22.05's quirks this module absorbs (reference/slurm.md): ``squeue --json`` ignores filters (it lists
every job: filter here), its ``exit_code`` is the raw wait status (exit 3 reads 768), ``sacct --json``
loses non-zero exit codes (so text ``sacct -P`` is read, ``3:0`` being exit:signal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dispatch.errors import UnavailableError

__all__ = ["SACCT_FIELDS", "SlurmJob", "parse_sacct", "parse_squeue"]

SACCT_FIELDS = "jobid,jobname,state,exitcode,nodelist,partition,nnodes,comment"
"""The ``sacct -o`` fields :func:`parse_sacct` reads (in this order)."""


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One Slurm job as dispatch reads it. ``exit_code``/``signal`` are decoded (``None``: unknown)."""

    job_id: str
    name: str
    comment: str
    state: str
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    partition: str = ""
    node_count: int = 1
    restarts: int = 0
    eligible_time: int = 0
    source: str = "squeue"

    def as_object(self) -> dict[str, Any]:
        """The mapping :func:`~dispatch_slurm.naming.identity_of` reads."""
        return {"name": self.name, "comment": self.comment}


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, dict):  # 0.0.39 and later wrap numbers: {"set": true, "number": N}
        return _int(value.get("number"))
    return 0


def decode_status(raw: int) -> tuple[int, int]:
    """``(exit code, signal)`` of a raw wait status, as ``squeue --json`` reports it."""
    return (raw >> 8) & 0xFF, raw & 0x7F


def parse_squeue(text: str) -> list[SlurmJob]:
    """Every job of an ``squeue --json`` document."""
    try:
        doc = json.loads(text)
        entries = doc["jobs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UnavailableError(f"squeue --json answered something unreadable: {exc}") from None
    jobs = []
    for e in entries:
        raw = e.get("exit_code")
        code = sig = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            code, sig = decode_status(raw)
        state = e.get("job_state")
        jobs.append(
            SlurmJob(
                job_id=str(_int(e.get("job_id"))),
                name=str(e.get("name") or ""),
                comment=str(e.get("comment") or ""),
                state=state[0] if isinstance(state, list) and state else str(state or ""),
                reason=str(e.get("state_reason") or ""),
                exit_code=code,
                signal=sig,
                nodes=str(e.get("nodes") or ""),
                partition=str(e.get("partition") or ""),
                node_count=max(1, _int(e.get("node_count"))),
                restarts=_int(e.get("restart_cnt")),
                eligible_time=_int(e.get("eligible_time")),
            )
        )
    return jobs


def parse_sacct(text: str) -> list[SlurmJob]:
    """The jobs of ``sacct -X -P -n -o`` :data:`SACCT_FIELDS` (the last line per job id wins: a
    requeued job lists its attempts in order)."""
    out: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 8 or not parts[0].strip():
            continue
        job_id, name, state, exitcode, nodes, partition, count = (p.strip() for p in parts[:7])
        comment = "|".join(parts[7:]).strip()
        code = sig = None
        if ":" in exitcode:
            a, _, b = exitcode.partition(":")
            if a.isdigit() and b.isdigit():
                code, sig = int(a), int(b)
        words = state.split()  # "CANCELLED by 0"
        out[job_id] = SlurmJob(
            job_id=job_id,
            name=name,
            comment=comment,
            state=words[0] if words else "",
            reason=" ".join(words[1:]),
            exit_code=code,
            signal=sig,
            nodes=nodes,
            partition=partition,
            node_count=int(count) if count.isdigit() and int(count) > 0 else 1,
            source="sacct",
        )
    return list(out.values())
