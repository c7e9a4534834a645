"""What an opened cluster can do, as seen by its adapter: :class:`Capabilities`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dispatch.errors import InvalidError
from dispatch.model._decode import Fields, as_bool, as_enum, as_int, as_list, as_str

__all__ = ["Capabilities", "Limits", "Mode"]


class Mode(StrEnum):
    """How far dispatch may act on an opened cluster."""

    READ_WRITE = "read_write"  # reads and writes
    OBSERVE_ONLY = "observe_only"  # opened for writing, but the credentials may not write: reads only
    READ_ONLY = "read_only"  # opened read-only on purpose (no probe, no write ever sent)


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits of what a job may ask for on this cluster (``None`` = unknown or unbounded)."""

    max_env: int | None = None
    max_command: int | None = None
    max_nodes: int | None = None

    def to_json(self) -> dict[str, Any]:
        names = {"max_env": "maxEnv", "max_command": "maxCommand", "max_nodes": "maxNodes"}
        return {names[k]: getattr(self, k) for k in names if getattr(self, k) is not None}

    @classmethod
    def from_json(cls, value: Any, path: str = "limits") -> Limits:
        f = Fields(value, path)
        out = cls(
            max_env=f.optional("maxEnv", as_int, None),
            max_command=f.optional("maxCommand", as_int, None),
            max_nodes=f.optional("maxNodes", as_int, None),
        )
        f.done()
        return out


_FLAGS = (
    "holds",
    "watch",
    "output",
    "cessation",
    "shared_checkpoint",
    "queueing",
)
_CAMEL = {"shared_checkpoint": "sharedCheckpoint"}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Reported per opened cluster, not per adapter: the same adapter may hold jobs on one cluster
    (Kueue installed) and not on another."""

    mode: Mode = Mode.READ_WRITE
    holds: bool = False
    watch: bool = False
    output: bool = False
    cessation: bool = False
    shared_checkpoint: bool = False
    queueing: bool = False
    extensions: frozenset[str] = frozenset()
    limits: Limits = field(default_factory=Limits)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.mode, Mode):
            raise InvalidError(f"expected a Mode, got {self.mode!r}", path="mode")
        # A lone string would silently become a set (or tuple) of its characters.
        for key in ("extensions", "notes"):
            value = getattr(self, key)
            if not isinstance(value, list | tuple | set | frozenset) or not all(
                isinstance(x, str) for x in value
            ):
                raise InvalidError(f"expected a collection of strings, got {value!r}", path=key)
        object.__setattr__(self, "extensions", frozenset(self.extensions))
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def writable(self) -> bool:
        """Writes are allowed (``mode`` is ``read_write``)."""
        return self.mode is Mode.READ_WRITE

    @property
    def read_only(self) -> bool:
        return self.mode is Mode.READ_ONLY

    @property
    def observe_only(self) -> bool:
        return self.mode is Mode.OBSERVE_ONLY

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode.value}
        out |= {_CAMEL.get(k, k): getattr(self, k) for k in _FLAGS}
        out["extensions"] = sorted(self.extensions)
        out["limits"] = self.limits.to_json()
        out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_json(cls, value: Any, path: str = "") -> Capabilities:
        f = Fields(value, path)
        mode = f.optional("mode", lambda v, p: as_enum(Mode, v, p), Mode.READ_WRITE)
        flags = {k: f.optional(_CAMEL.get(k, k), as_bool, False) for k in _FLAGS}
        out = cls(
            mode=mode,
            **flags,
            extensions=frozenset(f.optional("extensions", _str_list, list[str]())),
            limits=f.optional("limits", Limits.from_json, Limits()),
            notes=tuple(f.optional("notes", _str_list, list[str]())),
        )
        f.done()
        return out


def _str_list(value: Any, path: str) -> list[str]:
    return as_list(value, path, as_str)
