"""What one supervisor step did: :class:`StepReport`, which every part of the step adds to."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["StepReport"]


@dataclass
class StepReport:
    """What one :meth:`~dispatch.supervise.Supervisor.step` did (for logs, tests and the simulation's
    traces)."""

    changes: int = 0
    folded: int = 0
    actions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    leased: int = 0
    unreadable: list[str] = field(default_factory=list)
    """Stored records it could not read (each named once per supervisor): left alone, never an error of
    the step's actions."""
