"""Recovery policies (data, not code) and the supervisor's plans."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from dispatch.errors import InvalidError
from dispatch.model._decode import Fields, as_enum, as_int, as_number, as_object, as_str, key_path
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


@dataclass(frozen=True, slots=True)
class Rule:
    """One policy entry. ``max`` and the backoff apply to ``requeue`` only."""

    action: Action
    max: int = 3
    backoff: float = 30.0
    backoff_cap: float = 3600.0

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

    def delay(self, attempt: int) -> float:
        """Seconds to wait before requeue number ``attempt`` (1-based): doubling, capped."""
        if attempt < 1:
            return 0.0
        return float(min(self.backoff * (2 ** min(attempt - 1, 62)), self.backoff_cap))

    def to_json(self) -> dict[str, Any]:
        if self.action is not Action.REQUEUE:
            return {"action": self.action.value}
        return {"action": "requeue", "max": self.max, "backoff": self.backoff, "backoffCap": self.backoff_cap}

    @classmethod
    def from_json(cls, value: Any, path: str) -> Rule:
        if isinstance(value, str):  # shorthand: "fail", "hold", "requeue"
            return cls(as_enum(Action, value, path))
        f = Fields(value, path)
        action = f.required("action", lambda v, p: as_enum(Action, v, p))
        if action is Action.REQUEUE:
            kwargs: dict[str, Any] = {
                "max": f.optional("max", as_int, 3),
                "backoff": f.optional("backoff", as_number, 30.0),
                "backoff_cap": f.optional("backoffCap", as_number, 3600.0),
            }
        else:
            kwargs = {}
        f.done()
        try:
            return cls(action, **kwargs)
        except InvalidError as exc:
            raise InvalidError(exc.detail, path=f"{path}.{exc.path}" if exc.path else path) from None


_FAIL = Rule(Action.FAIL)


@dataclass(frozen=True, slots=True)
class Policy:
    """Maps causes to rules; a cause not listed gets ``default`` (fail, unless said otherwise).

    JSON: ``{"rules": {"preempted": {"action": "requeue", "max": 5, "backoff": 30}, "out_of_memory":
    "fail"}, "default": "fail"}``.
    """

    rules: Mapping[Cause, Rule] = field(default_factory=dict, hash=False)
    default: Rule = _FAIL

    def __post_init__(self) -> None:
        if not isinstance(self.rules, Mapping):
            raise InvalidError(f"expected a mapping of Cause -> Rule, got {self.rules!r}", path="rules")
        if not isinstance(self.default, Rule):
            raise InvalidError(f"expected a Rule, got {self.default!r}", path="default")
        for cause, rule in self.rules.items():
            if not isinstance(cause, Cause) or not isinstance(rule, Rule):
                raise InvalidError(f"expected Cause -> Rule, got {cause!r} -> {rule!r}", path="rules")
        object.__setattr__(self, "rules", MappingProxyType(dict(self.rules)))

    def rule_for(self, cause: Cause) -> Rule:
        return self.rules.get(cause, self.default)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Policy):
            return NotImplemented
        return dict(self.rules) == dict(other.rules) and self.default == other.default

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    def to_json(self) -> dict[str, Any]:
        return {
            "rules": {
                c.value: r.to_json() for c, r in sorted(self.rules.items(), key=lambda kv: kv[0].value)
            },
            "default": self.default.to_json(),
        }

    @classmethod
    def from_json(cls, value: Any, path: str = "policy") -> Policy:
        f = Fields(value, path)
        raw_rules: Mapping[str, Any] = f.optional("rules", as_object, {})
        rules: dict[Cause, Rule] = {}
        for name, raw in raw_rules.items():
            where = key_path(f"{path}.rules" if path else "rules", name)
            cause = as_enum(Cause, name, where)
            rules[cause] = Rule.from_json(raw, where)
        default = f.optional("default", Rule.from_json, _FAIL)
        f.done()
        return cls(rules, default)


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


@dataclass(frozen=True, slots=True)
class Plan:
    """The supervisor's decision for one record: action, why, and not before when (epoch seconds)."""

    action: PlanAction
    reason: str = ""
    not_before: float | None = None

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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action.value}
        if self.reason:
            out["reason"] = self.reason
        if self.not_before is not None:
            out["notBefore"] = self.not_before
        return out

    @classmethod
    def from_json(cls, value: Any, path: str = "plan") -> Plan:
        f = Fields(value, path)
        action = f.required("action", lambda v, p: as_enum(PlanAction, v, p))
        reason = f.optional("reason", as_str, "")
        not_before = f.optional("notBefore", as_number, None)
        f.done()
        try:
            return cls(action=action, reason=reason, not_before=not_before)
        except InvalidError as exc:
            raise InvalidError(exc.detail, path=f"{path}.{exc.path}" if path else exc.path) from None
