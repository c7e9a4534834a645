"""Native names of memory jobs, and reading an identity back from a native object.

The memory cluster names its objects like Kubernetes does (RFC 1035 labels of at most 63 characters),
so the adapter weakens identities the way a Kubernetes adapter must: the job id is sanitised and
shortened, and a hash of the incarnation (job id, ``N`` and the record's nonce) keeps distinct
incarnations apart — those of a purged record and of its successor under the same job id included.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from dispatch.errors import ConflictError, InvalidError
from dispatch.model import Epoch, Identity, check_job_id, check_nonce

__all__ = [
    "ANNOTATION_EPOCH",
    "ANNOTATION_JOB_ID",
    "ANNOTATION_NONCE",
    "LABEL_MANAGED_BY",
    "identity_of",
    "native_name",
]

ANNOTATION_JOB_ID = "dispatch.dev/job-id"
ANNOTATION_EPOCH = "dispatch.dev/epoch"
ANNOTATION_NONCE = "dispatch.dev/nonce"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "dispatch"

_MAX = 63
_HASH = 10


def native_name(identity: Identity) -> str:
    """``<sanitised job id>-<N>-<hash>``: lowercase, starts with a letter, at most 63 characters.

    Deterministic, and the same for every identity of one incarnation (the hash covers the full job id,
    ``N`` and the nonce, not the requeue count; without a nonce, as before nonces existed)."""
    if not isinstance(identity, Identity):
        raise InvalidError(f"expected an Identity, got {type(identity).__name__}", path="identity")
    key = f"{identity.job_id}\0{identity.epoch.n}" + (f"\0{identity.nonce}" if identity.nonce else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:_HASH]
    base = re.sub(r"[^a-z0-9-]+", "-", identity.job_id.lower()).strip("-")
    if not base or not base[0].isalpha():
        base = f"j-{base}".rstrip("-")
    suffix = f"-{identity.epoch.n}-{digest}"
    return base[: _MAX - len(suffix)].rstrip("-") + suffix


def identity_of(obj: Mapping[str, Any]) -> Identity | None:
    """The identity a memory object carries in its annotations, or None if it carries none.

    Raises :class:`ConflictError` when the object's name is not the native name of the identity it
    claims (someone else's object under our name, or a tampered one), and :class:`InvalidError` when
    the annotations are malformed."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(metadata, Mapping):
        return None
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping) or ANNOTATION_JOB_ID not in annotations:
        return None
    job_id = check_job_id(annotations.get(ANNOTATION_JOB_ID), f'metadata.annotations["{ANNOTATION_JOB_ID}"]')
    epoch_text = annotations.get(ANNOTATION_EPOCH)
    if epoch_text is None:
        raise InvalidError(
            "missing: an object with a job id carries its epoch",
            path=f'metadata.annotations["{ANNOTATION_EPOCH}"]',
        )
    epoch = Epoch.parse(epoch_text, f'metadata.annotations["{ANNOTATION_EPOCH}"]')
    nonce = annotations.get(ANNOTATION_NONCE, "")
    identity = Identity(job_id, epoch, check_nonce(nonce, f'metadata.annotations["{ANNOTATION_NONCE}"]'))
    name = metadata.get("name")
    expected = native_name(identity)
    if name != expected:
        raise ConflictError(
            f"object {name!r} claims identity {identity}, whose native name is {expected!r}; "
            "it was not created by dispatch for that job: leave it alone or delete it"
        )
    return identity
