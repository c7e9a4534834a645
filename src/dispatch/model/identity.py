"""Job ids, epochs and identities: how an incarnation of a job is named on a cluster."""

from __future__ import annotations

import re
from functools import total_ordering
from typing import Any

from dispatch.errors import InvalidError
from dispatch.model._base import Frozen, Model, custom_type
from dispatch.model._decode import as_str

__all__ = [
    "ENV_PREFIX",
    "EPOCH_BOUND",
    "Epoch",
    "Handle",
    "Identity",
    "check_job_id",
    "check_nonce",
    "new_job_id",
]

EPOCH_BOUND = 1_000_000
"""Both parts of an epoch stay below this; a requeue that would reach it is refused."""

ENV_PREFIX = "DISPATCH_"
"""Environment variables with this prefix are reserved to dispatch."""

_JOB_ID = r"[A-Za-z0-9._-]{1,253}\Z"
# A job id is a command-line argument too (``dispatch cancel <id>``): one that starts with "-" reads as
# an option there, so it could be submitted but never addressed again.


_VALID: set[str] = set()
"""Job ids already found valid: a supervisor checks the same few thousand at every record it builds
(each decode and ``replace`` of a record checks its id). Emptied when it reaches ``_VALID_MAX``."""
_VALID_MAX = 1 << 17


def check_job_id(job_id: Any, path: str = "job_id") -> str:
    """Return ``job_id`` if it is a valid job id, else raise :class:`InvalidError`."""
    if type(job_id) is str and job_id in _VALID:
        return job_id
    text = as_str(job_id, path)
    if not re.match(_JOB_ID, text):
        raise InvalidError(
            f"invalid job id {text[:60]!r}: use 1 to 253 characters from A-Z a-z 0-9 . _ -", path=path
        )
    if text.startswith("-"):
        raise InvalidError(
            f"invalid job id {text[:60]!r}: must not start with '-' (the CLI would read it as an option)",
            path=path,
        )
    if type(text) is str:
        if len(_VALID) >= _VALID_MAX:
            _VALID.clear()
        _VALID.add(text)
    return text


NONCE = r"[0-9a-f]{0,16}\Z"
"""A record's nonce: up to 16 lowercase hex digits (it goes into native names and labels)."""


def check_nonce(nonce: Any, path: str = "nonce") -> str:
    """Return ``nonce`` if it is a valid record nonce, else raise :class:`InvalidError`."""
    text = as_str(nonce, path)
    if not re.match(NONCE, text):
        raise InvalidError(f"invalid nonce {text[:40]!r}: use up to 16 digits from 0-9 a-f", path=path)
    return text


def new_job_id() -> str:
    """A fresh job id: ``job-`` and twelve random hex digits."""
    import secrets  # deferred: it pulls in hmac and hashlib, which ``import dispatch`` does not need

    return f"job-{secrets.token_hex(6)}"


@total_ordering
class Epoch(Frozen):
    """``(N, R)``: N counts incarnations (1 for the first), R counts automatic requeues since the user
    last submitted or resubmitted the job. N is a fencing token for the job's own checkpoints.

    Its JSON form is the string ``"N.R"`` that jobs see as ``DISPATCH_EPOCH``."""

    __slots__ = ("n", "r")
    n: int
    r: int

    def __init__(self, n: int = 1, r: int = 0) -> None:
        for name, value, low in (("n", n, 1), ("r", r, 0)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidError(f"expected an integer, got {value!r}", path=f"epoch.{name}")
            if not low <= value < EPOCH_BOUND:
                raise InvalidError(f"must be in [{low}, {EPOCH_BOUND})", path=f"epoch.{name}")
        if r >= n:
            raise InvalidError(f"requeues ({r}) must be fewer than incarnations ({n})", path="epoch")
        self._set(n=n, r=r)

    def __lt__(self, other: Epoch) -> bool:
        if not isinstance(other, Epoch):
            return NotImplemented
        return (self.n, self.r) < (other.n, other.r)

    def __repr__(self) -> str:
        return f"Epoch(n={self.n}, r={self.r})"

    def requeued(self) -> Epoch:
        """The epoch of the next automatic requeue. Raises :class:`InvalidError` at :data:`EPOCH_BOUND`."""
        if self.n + 1 >= EPOCH_BOUND:
            raise InvalidError(f"epoch {self} cannot be requeued: it would reach {EPOCH_BOUND}", path="epoch")
        return Epoch(self.n + 1, self.r + 1)

    def resubmitted(self) -> Epoch:
        """The epoch of the next user (re)submission: a new incarnation, requeue count reset."""
        if self.n + 1 >= EPOCH_BOUND:
            raise InvalidError(
                f"epoch {self} cannot be resubmitted: it would reach {EPOCH_BOUND}", path="epoch"
            )
        return Epoch(self.n + 1, 0)

    def __str__(self) -> str:
        return f"{self.n}.{self.r}"

    @classmethod
    def parse(cls, text: Any, path: str = "epoch") -> Epoch:
        """Parse the ``"N.R"`` form that jobs see as ``DISPATCH_EPOCH``."""
        value = as_str(text, path)
        if type(value) is str:
            found = _EPOCHS.get(value)
            if found is not None:
                return found
        m = re.fullmatch(_EPOCH, value)
        if not m:
            raise InvalidError(f'expected "N.R" (two integers), got {value!r}', path=path)
        try:
            epoch = cls(int(m.group(1)), int(m.group(2)))
        except InvalidError as exc:
            raise InvalidError(exc.detail, path=path) from None
        if type(value) is str and len(_EPOCHS) < _EPOCHS_MAX:
            _EPOCHS[value] = epoch
        return epoch


_EPOCH = r"(\d{1,7})\.(\d{1,7})"
_EPOCHS: dict[str, Epoch] = {}
"""Epochs already parsed, by their text: an epoch is immutable and jobs share a few ("1.0", "2.1"), and
a supervisor decodes several in every record it reads or writes. At most ``_EPOCHS_MAX`` are kept."""
_EPOCHS_MAX = 4096
custom_type(
    Epoch,
    decode=lambda value, path: Epoch.parse(value, path or "epoch"),
    encode=str,
    schema=lambda: {
        "type": "string",
        "pattern": r"^[0-9]{1,7}\.[0-9]{1,7}$",
        "description": 'an epoch, "N.R"',
    },
)


class Identity(Model, frozen=True):
    """One incarnation of a job: the job id with its epoch, and the nonce of the record it belongs to.

    Two identities name the same incarnation when the job id, ``N`` and the nonce agree (see
    :meth:`same_incarnation`). The nonce is drawn when the record is created, so a job id used again —
    after ``dispatch purge``, or by another store on the same cluster — never names an object of the
    record that used it before (``""``: a record written before dispatch drew nonces).
    """

    job_id: str
    epoch: Epoch = Epoch()
    nonce: str = ""

    def __post_init__(self) -> None:
        check_job_id(self.job_id, "jobId")
        if not isinstance(self.epoch, Epoch):
            raise InvalidError(f"expected an Epoch, got {self.epoch!r}", path="epoch")
        check_nonce(self.nonce)

    def same_incarnation(self, other: Identity) -> bool:
        return self.job_id == other.job_id and self.epoch.n == other.epoch.n and self.nonce == other.nonce

    def env(self) -> dict[str, str]:
        """The variables every incarnation sees."""
        return {"DISPATCH_JOB_ID": self.job_id, "DISPATCH_EPOCH": str(self.epoch)}

    def __str__(self) -> str:
        return f"{self.job_id}@{self.epoch}"


class Handle(Model, frozen=True):
    """A backend's reference to one incarnation: its identity and the backend's native reference
    (Kubernetes: ``namespace/name``). Handles are stored in records and must survive restarts.

    ``cluster`` is the identity of the cluster the incarnation was placed on (``Backend.cluster_id``);
    empty in handles written before dispatch recorded it."""

    backend: str
    identity: Identity
    ref: str
    cluster: str = ""

    def __str__(self) -> str:
        return f"{self.backend}:{self.ref} ({self.identity})"
