"""``dispatch list -l``: kubectl's equality selectors over what a job is known by.

A job's labels are its ``state``, ``cause`` and ``epoch`` (its current incarnation's), ``adapter`` (of
its handle, when placed) and ``env.NAME`` for each variable of its spec (a job's own tags: ``env:
{TEAM: vision}`` is selected by ``-l env.TEAM=vision``). A selector is comma-separated requirements,
``key=value`` (or ``==``) and ``key!=value``, all of which must hold (kubectl's equality-based syntax).
Pure: parsing and matching, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgspec import Struct

from dispatch.errors import InvalidError
from dispatch.model import JobRecord

__all__ = ["KEYS", "Requirement", "labels_of", "matches", "namespace_of", "parse_selector"]

KEYS = ("state", "cause", "epoch", "adapter", "env.NAME")


class Requirement(Struct, frozen=True):
    key: str
    value: str
    equal: bool


def parse_selector(text: str) -> list[Requirement]:
    """``state=running,env.TEAM!=vision`` → requirements; ``InvalidError`` naming ``-l`` otherwise."""
    out: list[Requirement] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        op = next((o for o in ("!=", "==", "=") if o in part), None)
        if op is None:
            raise InvalidError(f"{part!r}: expected key=value or key!=value", path="-l")
        key, value = (s.strip() for s in part.split(op, 1))
        equal = op != "!="
        if key not in KEYS[:-1] and not (key.startswith("env.") and len(key) > 4):
            raise InvalidError(f"{part!r}: unknown key {key!r}; the keys are {', '.join(KEYS)}", path="-l")
        out.append(Requirement(key, value, equal))
    return out


def labels_of(rec: JobRecord) -> Mapping[str, str]:
    labels = {
        "state": rec.state.value,
        "cause": rec.outcome.cause.value,
        "epoch": str(rec.epoch),
        "adapter": rec.handle.backend if rec.handle is not None else "",
    }
    labels.update({f"env.{k}": v for k, v in rec.spec.env.items()})
    return labels


def matches(rec: JobRecord, requirements: Sequence[Requirement]) -> bool:
    labels = labels_of(rec)
    return all((labels.get(r.key) == r.value) is r.equal for r in requirements)


def namespace_of(rec: JobRecord) -> str | None:
    """The Kubernetes namespace a job was placed in (``-n``): a Kubernetes adapter's handle is
    ``NAMESPACE/NAME``. ``None`` for a job not placed yet, or of an adapter without namespaces."""
    if rec.handle is None or "/" not in rec.handle.ref:
        return None
    return rec.handle.ref.split("/", 1)[0]
