"""Recovery policies (data, not code) and the supervisor's plans."""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import ClassVar

from msgspec.structs import force_setattr

from dispatch.errors import InvalidError
from dispatch.model._base import EMPTY_MAP, Model, frozen_map
from dispatch.model.identity import EPOCH_BOUND
from dispatch.model.outcome import Cause

__all__ = [
    "DEFAULT_POLICY",
    "MAX_BACKOFF",
    "MAX_EPOCH_SECONDS",
    "Action",
    "Plan",
    "PlanAction",
    "Policy",
    "Rule",
]


class Action(StrEnum):
    """What to do about a cause."""

    REQUEUE = "requeue"  # start a new incarnation, up to ``max`` times, after a doubling backoff
    FAIL = "fail"  # give up and keep the cause
    HOLD = "hold"  # stop and wait for a person


MAX_BACKOFF = 365 * 24 * 3600.0
"""The longest ``backoff``/``backoffCap`` (a year): a longer wait is a hold, and far larger numbers
overflow the clock arithmetic of the supervisor."""

MAX_EPOCH_SECONDS = 253402300799.0
"""The last second of the year 9999: the largest time a :class:`Plan` may name (``datetime``'s range)."""


def _finite(value: float) -> bool:
    # math.isfinite(10**400) raises OverflowError: such an int is no number of seconds either.
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _short(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4,300 digits cannot be printed
        return "an integer too large to show"
    return text if len(text) <= 40 else text[:37] + "..."


class Rule(Model, frozen=True):
    """One policy entry. ``max``, the backoff, ``elsewhere`` and ``after`` apply to ``requeue`` only.

    ``elsewhere`` (a fleet of clusters, SPEC §15): the next incarnation goes to another cluster that
    accepts the job, once the previous one's compute is gone on its own. ``after`` (the ``no_capacity``
    rule, which no incarnation ends with by itself: it waits, queued): how long an incarnation may wait
    without capacity before it is given up on its cluster and requeued by the rule.

    JSON: ``{"action": "requeue", "max": 5, "backoff": 30, "backoffCap": 3600, "elsewhere": true}``, or just
    the action's name (``"fail"``) where a policy lists a rule."""

    action: Action
    max: int = 3
    backoff: float = 30.0
    backoff_cap: float = 3600.0
    elsewhere: bool = False
    after: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.action, Action):
            raise InvalidError(f"expected an Action, got {self.action!r}", path="action")
        if isinstance(self.max, bool) or not isinstance(self.max, int) or not 0 <= self.max < EPOCH_BOUND:
            raise InvalidError(f"must be an integer in [0, {EPOCH_BOUND})", path="max")
        for name, value in (("backoff", self.backoff), ("backoffCap", self.backoff_cap)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
                raise InvalidError(f"expected a finite number of seconds, got {_short(value)}", path=name)
            if not 0 <= value <= MAX_BACKOFF:
                raise InvalidError(
                    f"must be between 0 and {MAX_BACKOFF:g} seconds (a year), got {_short(value)}", path=name
                )
        if not 0 <= self.backoff <= self.backoff_cap:
            raise InvalidError(
                f"need 0 <= backoff ({self.backoff}) <= backoffCap ({self.backoff_cap})", path="backoff"
            )
        if not isinstance(self.elsewhere, bool):
            raise InvalidError(f"expected true or false, got {_short(self.elsewhere)}", path="elsewhere")
        if self.after is not None:
            after = self.after
            if isinstance(after, bool) or not isinstance(after, int | float) or not _finite(after):
                raise InvalidError(f"expected a finite number of seconds, got {_short(after)}", path="after")
            if not 0 < after <= MAX_BACKOFF:
                raise InvalidError(
                    f"must be between 0 and {MAX_BACKOFF:g} seconds, got {after!r}", path="after"
                )
            force_setattr(self, "after", float(after))
        if self.action is not Action.REQUEUE:
            unused: tuple[tuple[str, object, object], ...] = (
                ("max", self.max, 3),
                ("backoff", self.backoff, 30.0),
                ("backoffCap", self.backoff_cap, 3600.0),
                ("elsewhere", self.elsewhere, False),
                ("after", self.after, None),
            )
            for field_name, given, default in unused:
                if given != default:
                    raise InvalidError(
                        f"applies to requeue only; a {self.action.value} rule takes none", path=field_name
                    )
        force_setattr(self, "backoff", float(self.backoff))
        force_setattr(self, "backoff_cap", float(self.backoff_cap))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before requeue number ``attempt`` (1-based): doubling, capped."""
        if attempt < 1:
            return 0.0
        return float(min(self.backoff * (2 ** min(attempt - 1, 62)), self.backoff_cap))


_FAIL = Rule(Action.FAIL)
_SHORTHAND = {action: Rule(action) for action in Action}
"""What a rule written as just an action's name (``"fail"``) is."""


def _rule(value: Rule | Action, path: str) -> Rule:
    if isinstance(value, Rule):
        return value
    if isinstance(value, Action):
        return _SHORTHAND[value]
    raise InvalidError(f"expected a Rule, got {_short(value)}", path=path)


class Policy(Model, frozen=True):
    """Maps causes to rules; a cause not listed gets ``default`` (fail, unless said otherwise).

    JSON: ``{"rules": {"preempted": {"action": "requeue", "max": 5, "backoff": 30}, "out_of_memory":
    "fail"}, "default": "fail"}``. A rule given as an action's name is that action with its defaults.
    """

    json_path: ClassVar[str] = "policy"

    rules: Mapping[Cause, Rule | Action] = EMPTY_MAP  # type: ignore[assignment]  # an empty FrozenMap
    default: Rule | Action = _FAIL
    max_requeues: int | None = None
    """A cap on the requeues of all rules together (since the last submit or resubmit); none by default."""

    def __post_init__(self) -> None:
        if not isinstance(self.rules, Mapping):
            raise InvalidError(f"expected a mapping of Cause -> Rule, got {_short(self.rules)}", path="rules")
        rules: dict[Cause, Rule] = {}
        for cause, rule in self.rules.items():
            if not isinstance(cause, Cause) or not isinstance(rule, Rule | Action):
                raise InvalidError(f"expected Cause -> Rule, got {cause!r} -> {rule!r}", path="rules")
            rules[cause] = _rule(rule, "rules")  # a Rule or an Action: checked just above
        force_setattr(self, "rules", frozen_map(dict(sorted(rules.items()))))  # keys: str-valued Causes
        force_setattr(self, "default", _rule(self.default, "default"))
        mr = self.max_requeues
        if mr is not None and (isinstance(mr, bool) or not isinstance(mr, int) or not 0 <= mr < EPOCH_BOUND):
            raise InvalidError(f"must be an integer in [0, {EPOCH_BOUND})", path="maxRequeues")

    def rule_for(self, cause: Cause) -> Rule:
        rule = self.rules.get(cause, self.default)
        assert isinstance(rule, Rule)  # __post_init__ made every entry a Rule
        return rule

    def rule_name(self, cause: Cause) -> str:
        """The name of the rule that applies to ``cause``: the cause's own, else ``default``. Each rule
        counts its requeues under this name (its budget)."""
        return cause.value if cause in self.rules else "default"


_REQUEUE_3 = Rule(Action.REQUEUE, max=3, backoff=30.0)
DEFAULT_POLICY = Policy({Cause.PREEMPTED: _REQUEUE_3, Cause.EVICTED: _REQUEUE_3, Cause.NODE_LOST: _REQUEUE_3})
"""Requeue on preemption, eviction and node loss (at most 3 times, 30 s doubling backoff); fail otherwise."""


class PlanAction(StrEnum):
    """What the supervisor decided to do next for one record."""

    WAIT = "wait"  # nothing to do until the cluster reports a change
    START = "start"  # place the current epoch on the cluster
    STOP = "stop"  # ask the cluster to end the current incarnation
    SETTLE = "settle"  # a write's effect is unknown: observe the cluster before acting again
    CEASE = "cease"  # stop the previous incarnation and wait until its compute is gone
    REQUEUE = "requeue"  # stop, wait for cessation, start the next epoch
    FAIL = "fail"  # give up: record the failure as final
    HOLD = "hold"  # stop and wait for a person
    DONE = "done"  # terminal; nothing more will happen


class Plan(Model, frozen=True):
    """The supervisor's decision for one record: action, why, and not before when (epoch seconds)."""

    json_path: ClassVar[str] = "plan"

    action: PlanAction
    reason: str = ""
    not_before: float | None = None
    rule: str = ""
    """For a requeue: the policy rule it is made under (whose budget it spends)."""
    avoid: str = ""
    """For a requeue under a rule with ``elsewhere``, and the start that follows it: the cluster (its
    identity) the next incarnation should not go to, when another of the fleet accepts it."""
    placed: str = ""
    """For a start in a fleet of clusters: the cluster (its identity) the fleet placed the incarnation on;
    empty until it is placed."""

    def __post_init__(self) -> None:
        nb = self.not_before
        if nb is not None and (
            isinstance(nb, bool)
            or not isinstance(nb, int | float)
            or not _finite(nb)
            or not 0 <= nb <= MAX_EPOCH_SECONDS
        ):
            raise InvalidError(
                f"expected epoch seconds between 0 and {MAX_EPOCH_SECONDS:.0f}, got {_short(nb)}",
                path="notBefore",
            )
