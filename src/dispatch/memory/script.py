"""The behaviour script a memory job carries in ``env["KUBESIM_SCRIPT"]``.

The grammar, its parser and the timeline of one rank live in the leaf package :mod:`kubescript`,
shared with kubesim's simulated pods (so one job file drives both the same way). This module only
turns a parse error into an :class:`~dispatch.errors.InvalidError` at the path where the script came
from. ``print`` lines of the memory adapter have no process behind them; the rest behaves as on kubesim.
"""

from __future__ import annotations

from dispatch.errors import InvalidError
from kubescript import (
    DEFAULT_SCRIPT,
    FAULTS,
    SCRIPT_ENV,
    VERBS,
    Guard,
    RankPlan,
    ScriptError,
    Step,
    plan_rank,
)
from kubescript import parse_script as _parse

__all__ = [
    "DEFAULT_SCRIPT",
    "FAULTS",
    "SCRIPT_ENV",
    "VERBS",
    "Guard",
    "RankPlan",
    "Step",
    "parse_script",
    "plan_rank",
]


def parse_script(script: str, *, path: str = f'env["{SCRIPT_ENV}"]') -> tuple[Step, ...]:
    """Parse a behaviour script. Raises :class:`InvalidError` at ``path`` naming the bad step and what
    is allowed."""
    try:
        return _parse(script)
    except ScriptError as exc:
        raise InvalidError(str(exc), path=path) from None
