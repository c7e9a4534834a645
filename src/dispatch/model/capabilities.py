"""What an opened cluster can do, as seen by its adapter: :class:`Capabilities`."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from msgspec.structs import force_setattr

from dispatch.errors import InvalidError
from dispatch.model._base import Int64, Model

__all__ = ["Capabilities", "Limits", "Mode"]


class Mode(StrEnum):
    """How far dispatch may act on an opened cluster."""

    READ_WRITE = "read_write"  # reads and writes
    OBSERVE_ONLY = "observe_only"  # opened for writing, but the credentials may not write: reads only
    READ_ONLY = "read_only"  # opened read-only on purpose (no probe, no write ever sent)


class Limits(Model, frozen=True):
    """Limits of what a job may ask for on this cluster (``None`` = unknown or unbounded)."""

    json_path: ClassVar[str] = "limits"

    max_env: Int64 | None = None
    max_command: Int64 | None = None
    max_nodes: Int64 | None = None


class Capabilities(Model, omit_defaults=False, frozen=True):
    """Reported per opened cluster, not per adapter: the same adapter may hold jobs on one cluster
    (Kueue installed) and not on another. Its JSON form lists every field."""

    mode: Mode = Mode.READ_WRITE
    holds: bool = False
    watch: bool = False
    output: bool = False
    cessation: bool = False
    shared_checkpoint: bool = False
    queueing: bool = False
    extensions: frozenset[str] = frozenset()
    limits: Limits = Limits()
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
        force_setattr(self, "extensions", frozenset(self.extensions))
        force_setattr(self, "notes", tuple(self.notes))

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
