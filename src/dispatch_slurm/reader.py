"""What Slurm says about its jobs, read tolerantly for every version from 22.05 to 26.05. Pure.

One reader per native format — ``squeue --json`` and text ``sacct -P`` (accounting or the completion
log) — into one value, :class:`SlurmJob`, whatever the version that wrote it. The JSON changed under
Slurm's ``data_parser`` versions (``reference/slurm.md``; Slurm's ``rest_release_notes``):

- 22.05 (openapi v0.0.38): numbers are plain, ``job_state`` one word, ``exit_code`` the raw wait status
  (exit 3 reads 768). ``squeue --json`` ignores ``-j``/``-t``/``-u`` and lists every job.
- 23.02 (data_parser v0.0.39): numbers are ``{"set", "infinite", "number"}``; ``job_state`` still one
  word; ``exit_code`` such a number holding the raw wait status.
- 23.11 to 26.05 (v0.0.40 to v0.0.45): ``job_state`` a list — the base state and flags such as
  ``COMPLETING`` or ``REQUEUED``, in any order —, ``exit_code`` an object ``{"status", "return_code",
  "signal": {"id", "name"}}``; ``squeue --json`` applies squeue's default state filter (an ended job
  leaves the listing at once unless ``--states=all``). ``+complex`` output writes numbers plain,
  ``"Infinity"`` or ``null``.

Where Slurm shows only a flag (22.05 and 23.02 print ``COMPLETING`` rather than the base state under
it), the base state is unknown (``""``). An answer whose ``errors`` list is not empty (``squeue
--json`` exits 0 with ``"jobs": []`` and errors when slurmctld is down) is no answer: it raises
:class:`~dispatch.errors.UnavailableError`, never a list that looks complete. Text ``sacct`` keeps what
``sacct --json`` of 22.05 loses (non-zero exit codes: ``3:0`` is exit:signal).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatch.errors import UnavailableError

__all__ = [
    "BASE_STATES",
    "FINAL_STATES",
    "SACCT_FIELDS",
    "Dialect",
    "SlurmJob",
    "decode_status",
    "dialect_of",
    "number",
    "parse_sacct",
    "parse_squeue",
    "parse_state",
]

SACCT_FIELDS = "jobid,jobname,state,exitcode,nodelist,partition,nnodes,end,comment"
"""The ``sacct -o`` fields :func:`parse_sacct` reads, in this order (the comment last: it may hold
``|``). Run with ``SLURM_TIME_FORMAT=%s`` so ``end`` is epoch seconds, whatever the login node's zone."""

BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
"""Slurm's base job states (``JOB_STATE_BASE``); every other word of ``job_state`` is a flag."""

FINAL_STATES = BASE_STATES - {"PENDING", "RUNNING", "SUSPENDED"}
"""Base states Slurm will not leave by itself (a requeue makes the job ``PENDING`` again)."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """What one Slurm version writes, chosen by the version opening reads (``scontrol show config``)."""

    version: tuple[int, int]

    @property
    def data_parser(self) -> str:
        """The newest JSON format its commands write (``v0.0.38`` is 22.05's openapi plugin)."""
        known = ((26, 5, "v0.0.45"), (25, 11, "v0.0.44"), (25, 5, "v0.0.43"), (24, 11, "v0.0.42"),
                 (24, 5, "v0.0.41"), (23, 11, "v0.0.40"), (23, 2, "v0.0.39"))  # fmt: skip
        for major, minor, name in known:
            if self.version >= (major, minor):
                return name
        return "v0.0.38"

    @property
    def raw_exit_status(self) -> bool:
        """Whether a numeric ``exit_code`` is the raw wait status (v0.0.38 and v0.0.39); later
        versions write an object whose ``return_code`` is the exit code itself."""
        return self.version < (23, 11)


def dialect_of(version: str) -> Dialect:
    """The dialect of Slurm ``version`` (``"24.11.5"``); unknown text reads as the oldest supported."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return Dialect((int(m.group(1)), int(m.group(2))) if m else (22, 5))


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One Slurm job as dispatch reads it.

    ``state`` is the base state (``""`` when Slurm showed only a flag), ``flags`` the rest of
    ``job_state``. ``exit_code``/``signal`` are decoded (``None``: none or unknown; a job killed by a
    signal has a signal and no exit code). ``end_time`` is when it ended (epoch seconds), known only once
    its state is final (a running job's is its expected end)."""

    job_id: str
    name: str
    comment: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    partition: str = ""
    node_count: int = 1
    restarts: int = 0
    eligible_time: int = 0
    end_time: int | None = None
    source: str = "squeue"

    @property
    def final(self) -> bool:
        """Slurm will not run it again by itself (its compute may still be ending: ``COMPLETING``)."""
        return self.state in FINAL_STATES

    @property
    def completing(self) -> bool:
        return "COMPLETING" in self.flags

    @property
    def shown(self) -> str:
        """Its state as evidence says it: the base state, or the flag Slurm showed instead."""
        return self.state or min(self.flags, default="UNKNOWN")

    def as_object(self) -> dict[str, Any]:
        """The mapping :func:`~dispatch_slurm.naming.identity_of` reads."""
        return {"name": self.name, "comment": self.comment}


def number(value: Any) -> int | None:
    """A number in any of Slurm's forms: plain, ``{"set", "infinite", "number"}``, ``"Infinity"``,
    ``null``, a numeric string. ``None`` for unset and infinite."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value == value and abs(value) != float("inf") else None
    if isinstance(value, str):
        return int(value) if value.strip().lstrip("-").isdigit() else None
    if isinstance(value, Mapping):
        if value.get("infinite") is True or value.get("set") is False:
            return None
        return number(value.get("number"))
    return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_state(value: Any) -> tuple[str, frozenset[str]]:
    """``(base state, flags)`` of ``job_state``: one word (22.05, 23.02: a flag shown instead of the
    base state leaves the base ``""``) or a list of words in any order (23.11 on)."""
    words = [w for w in value if isinstance(w, str)] if isinstance(value, list) else [_text(value)]
    words = [w.strip().upper() for w in words if w.strip()]
    bases = [w for w in words if w in BASE_STATES]
    return (bases[0] if bases else ""), frozenset(w for w in words if w not in BASE_STATES)


def decode_status(raw: int) -> tuple[int | None, int | None]:
    """``(exit code, signal)`` of a raw wait status: ``768`` is exit 3, ``9`` is SIGKILL."""
    signal = raw & 0x7F
    if signal:
        return None, signal
    return (raw >> 8) & 0xFF, None


def _exit(value: Any, dialect: Dialect) -> tuple[int | None, int | None]:
    if isinstance(value, Mapping) and ("return_code" in value or "status" in value or "signal" in value):
        status = value.get("status")
        words = {s for s in status if isinstance(s, str)} if isinstance(status, list) else {_text(status)}
        sig = value.get("signal")
        signal = number(sig.get("id")) if isinstance(sig, Mapping) else number(sig)
        code = number(value.get("return_code"))
        if "SIGNALED" in words or "CORE_DUMPED" in words:
            return None, signal or None
        if "PENDING" in words:
            return None, None
        return code, signal or None
    raw = number(value)
    if raw is None or raw < 0:
        return None, None
    if dialect.raw_exit_status:
        return decode_status(raw)
    return raw, None  # a bare number in a later dialect is the return code itself


def _errors(doc: Mapping[str, Any]) -> list[str]:
    """The ``errors`` of a JSON answer, each as Slurm words it."""
    found = doc.get("errors")
    if not isinstance(found, list):
        return []
    out = []
    for e in found:
        if isinstance(e, Mapping):
            words = [_text(e.get(k)) for k in ("source", "description", "error")]
            out.append(": ".join(w for w in words if w) or json.dumps(e)[:200])
        else:
            out.append(str(e)[:200])
    return out


def parse_squeue(text: str, dialect: Dialect) -> list[SlurmJob]:
    """Every job of an ``squeue --json`` answer; :class:`UnavailableError` for an answer that is not
    one (unreadable, or carrying errors)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UnavailableError(f"squeue --json answered something unreadable: {exc}") from None
    if not isinstance(doc, Mapping):
        raise UnavailableError("squeue --json answered something that is not an object")
    errors = _errors(doc)
    if errors:
        raise UnavailableError(f"squeue --json answered with errors: {'; '.join(errors)}")
    entries = doc.get("jobs")
    if not isinstance(entries, list):
        raise UnavailableError("squeue --json answered no job list")
    return [_job(e, dialect) for e in entries if isinstance(e, Mapping) and number(e.get("job_id"))]


def _job(e: Mapping[str, Any], dialect: Dialect) -> SlurmJob:
    state, flags = parse_state(e.get("job_state"))
    code, signal = _exit(e.get("exit_code"), dialect)
    end = number(e.get("end_time"))
    return SlurmJob(
        job_id=str(number(e.get("job_id"))),
        name=_text(e.get("name")),
        comment=_text(e.get("comment")),
        state=state,
        flags=flags,
        reason=_text(e.get("state_reason")),
        exit_code=code,
        signal=signal,
        nodes=_text(e.get("nodes")),
        partition=_text(e.get("partition")),
        node_count=max(1, number(e.get("node_count")) or 1),
        restarts=max(0, number(e.get("restart_cnt")) or 0),
        eligible_time=number(e.get("eligible_time")) or 0,
        end_time=end if end and state in FINAL_STATES else None,
    )


def _sacct_exit(text: str) -> tuple[int | None, int | None]:
    code, _, sig = text.partition(":")
    if not (code.isdigit() and sig.isdigit()):
        return None, None
    if int(sig):
        return None, int(sig)
    return int(code), None


def parse_sacct(text: str) -> list[SlurmJob]:
    """The jobs of ``sacct -X -P -n -o`` :data:`SACCT_FIELDS` (the last line per job id wins: a
    requeued job lists its attempts in order). The state may carry words (``CANCELLED by 0``)."""
    out: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 9 or not parts[0].strip()[:1].isdigit():
            continue  # not a job's line (a header, a blank)
        job_id, name, state, exitcode, nodes, partition, count, end = (p.strip() for p in parts[:8])
        words = state.split()
        base, flags = parse_state(words[:1])
        code, signal = _sacct_exit(exitcode)
        ended = int(end) if end.isdigit() else None
        out[job_id] = SlurmJob(
            job_id=job_id,
            name=name,
            comment="|".join(parts[8:]).strip(),
            state=base,
            flags=flags,
            reason=" ".join(words[1:]),
            exit_code=code,
            signal=signal,
            nodes=nodes,
            partition=partition,
            node_count=int(count) if count.isdigit() and int(count) > 0 else 1,
            end_time=ended if base in FINAL_STATES else None,
            source="sacct",
        )
    return list(out.values())
