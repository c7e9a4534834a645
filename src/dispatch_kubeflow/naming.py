"""How an incarnation is named on the cluster, and how an object's identity is read back (pure).

The TrainJob name holds as much of the job id as fits, then ``N`` and a hash of ``(job id, N, nonce)``:
the same incarnation always gets the same name (so a create after a crash finds the first one) and two
incarnations never share one — nor two records of one job id (a purged record and its successor, two
stores' records). The full identity rides in annotations; labels carry a hash of the job id, ``N`` and the
record's nonce so objects and pods can be selected.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from dispatch.errors import ConflictError, InvalidError
from dispatch.model import Epoch, Identity
from dispatch_kubeflow.names import (
    ANNOTATION_EPOCH,
    ANNOTATION_JOB_ID,
    LABEL_INCARNATION,
    LABEL_JOB_HASH,
    LABEL_MANAGED_BY,
    LABEL_NONCE,
    MANAGED_BY,
)

__all__ = [
    "MAX_NAME",
    "identity_annotations",
    "identity_labels",
    "identity_of",
    "job_hash",
    "native_name",
]

MAX_NAME = 40
"""Native names stay well under the 63-character RFC 1035 limit: Trainer and JobSet derive Job, pod and
host names from them by appending ``-<replicatedJob>-<index>-<index>`` (and pods a random suffix)."""

_NOT_NAME = r"[^a-z0-9-]+"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def job_hash(job_id: str) -> str:
    """A label-safe hash of the full job id (16 hex digits)."""
    return _digest(job_id)[:16]


def native_name(identity: Identity) -> str:
    """The TrainJob name of an incarnation: an RFC 1035 label of at most :data:`MAX_NAME` characters,
    deterministic in ``(job id, N, nonce)``: ``<sanitised job id>-<N>-<hash>`` (without a nonce, as
    before nonces existed)."""
    n = identity.epoch.n
    key = f"{identity.job_id}\n{n}" + (f"\n{identity.nonce}" if identity.nonce else "")
    digest = _digest(key)[:10]
    suffix = f"-{n}-{digest}"
    slug = re.sub(_NOT_NAME, "-", identity.job_id.lower()).strip("-")
    slug = re.sub("-{2,}", "-", slug)
    if not slug or not slug[0].isalpha():
        slug = "j" + (f"-{slug}" if slug else "")
    slug = slug[: MAX_NAME - len(suffix)].rstrip("-")
    return slug + suffix


def identity_labels(identity: Identity) -> dict[str, str]:
    """Labels that select every object and pod of an incarnation."""
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB_HASH: job_hash(identity.job_id),
        LABEL_INCARNATION: str(identity.epoch.n),
    }
    if identity.nonce:
        labels[LABEL_NONCE] = identity.nonce
    return labels


def identity_annotations(identity: Identity) -> dict[str, str]:
    """Annotations that carry the full identity (job ids may be longer than a label value)."""
    return {ANNOTATION_JOB_ID: identity.job_id, ANNOTATION_EPOCH: str(identity.epoch)}


def _meta(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    value = metadata.get(key) if isinstance(metadata, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def identity_of(obj: Mapping[str, Any]) -> Identity | None:
    """The identity a TrainJob carries, or ``None`` if it carries none of dispatch's marks.

    Raises :class:`~dispatch.errors.ConflictError` when the marks are inconsistent: a partial or malformed
    identity, labels that disagree with the annotations, or a name that is not the identity's native name.
    """
    labels, annotations = _meta(obj, "labels"), _meta(obj, "annotations")
    name = obj.get("metadata", {}).get("name") if isinstance(obj.get("metadata"), Mapping) else None
    marks = (ANNOTATION_JOB_ID in annotations, ANNOTATION_EPOCH in annotations, LABEL_JOB_HASH in labels)
    if not any(marks):
        return None
    where = f"TrainJob {name!r}"
    if not all(marks):
        raise ConflictError(
            f"{where} carries a partial dispatch identity; it was not written by dispatch as is"
        )
    try:
        identity = Identity(
            str(annotations[ANNOTATION_JOB_ID]),
            Epoch.parse(annotations[ANNOTATION_EPOCH]),
            str(labels.get(LABEL_NONCE, "")),
        )
    except InvalidError as exc:
        raise ConflictError(f"{where} carries a malformed dispatch identity: {exc}") from None
    if labels.get(LABEL_JOB_HASH) != job_hash(identity.job_id) or labels.get(LABEL_INCARNATION) != str(
        identity.epoch.n
    ):
        raise ConflictError(f"{where}: its labels do not match the identity {identity} in its annotations")
    if name is not None and name != native_name(identity):
        raise ConflictError(
            f"{where} claims identity {identity}, whose native name is {native_name(identity)!r}"
        )
    return identity
