"""How an incarnation is named on Slurm: the job name (lossy, with a hash) and the comment that carries
the full identity — the record's nonce included — and the store's id. Pure.

The nonce (SPEC §2.4) is in both: the name's hash covers it, so the job's directory (named after it)
and every lookup by name are the record's own, and the comment carries it, so a listed job is matched
to a record by job id, ``N`` *and* nonce. A job of a purged record, or of another store's record of the
same job id, is never taken for a new record's."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from dispatch.errors import ConflictError, InvalidError
from dispatch.model import Epoch, Identity

__all__ = [
    "COMMENT_PREFIX",
    "Marks",
    "comment_for",
    "identity_of",
    "native_name",
    "parse_comment",
]

COMMENT_PREFIX = "dispatch/v1"
"""The first word of the ``--comment`` of every job dispatch submits."""

_MAX_ID_IN_NAME = 60
_KEY_VALUE = re.compile(r"([a-z]+)=(\S*)")


def native_name(identity: Identity) -> str:
    """``d-<job id, shortened>-<N>-<hash>``: deterministic, equal for one incarnation, distinct across
    incarnations and across records (the hash covers the full job id, N and the record's nonce; without
    a nonce, as before nonces existed)."""
    key = f"{identity.job_id}\0{identity.epoch.n}" + (f"\0{identity.nonce}" if identity.nonce else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"d-{identity.job_id[:_MAX_ID_IN_NAME]}-{identity.epoch.n}-{digest}"


def comment_for(identity: Identity, store_id: str) -> str:
    """The ``--comment`` carrying the full identity (job ids hold no space, so words are safe)."""
    words = [COMMENT_PREFIX, f"job={identity.job_id}", f"epoch={identity.epoch}"]
    if identity.nonce:
        words.append(f"nonce={identity.nonce}")
    if store_id:
        words.append(f"store={store_id}")
    return " ".join(words)


class Marks:
    """What a comment says: the identity (nonce included) and the store."""

    __slots__ = ("identity", "store")

    def __init__(self, identity: Identity, store: str) -> None:
        self.identity = identity
        self.store = store


def parse_comment(comment: str) -> Marks | None:
    """The marks of a dispatch comment, or ``None`` for a job dispatch did not submit (or a comment
    that cannot be read as one)."""
    words = comment.split()
    if not words or words[0] != COMMENT_PREFIX:
        return None
    fields: dict[str, str] = {m.group(1): m.group(2) for w in words[1:] if (m := _KEY_VALUE.fullmatch(w))}
    try:
        epoch = Epoch.parse(fields.get("epoch", ""))
        identity = Identity(fields.get("job", ""), epoch, fields.get("nonce", ""))
    except InvalidError:
        return None
    return Marks(identity, fields.get("store", ""))


def _name_and_comment(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata")
    source = meta if isinstance(meta, Mapping) else obj
    name, comment = source.get("name"), source.get("comment")
    return (name if isinstance(name, str) else ""), (comment if isinstance(comment, str) else "")


def identity_of(obj: Mapping[str, Any]) -> Identity | None:
    """The identity a Slurm job (an ``squeue --json`` entry, or a prepared request) carries, ``None``
    if it carries none; ``ConflictError`` if its name is not the native name of that identity."""
    name, comment = _name_and_comment(obj)
    marks = parse_comment(comment)
    if marks is None:
        return None
    if name != native_name(marks.identity):
        raise ConflictError(
            f"Slurm job {name!r} claims incarnation {marks.identity} in its comment, whose job name "
            f"would be {native_name(marks.identity)!r}"
        )
    return marks.identity
