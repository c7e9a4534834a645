"""Scripted pod behaviour: what a simulated container "does".

A pod's main container reads a small script from its env var ``KUBESIM_SCRIPT`` (so a job's own env can
carry it end to end), or from a rule registered with :class:`Behaviours` (the Python API for tests).
The grammar, its parser and its default script are the leaf package :mod:`kubescript`'s, shared with
dispatch's ``memory`` adapter; running the steps is the kubelet's job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubescript import (
    DEFAULT_SCRIPT,
    SCRIPT_ENV,
    START_ERRORS,
    VERBS,
    Guard,
    ScriptError,
    Step,
    parse_script,
    render_text,
    start_error,
)

__all__ = [
    "DEFAULT_SCRIPT",
    "SCRIPT_ENV",
    "START_ERRORS",
    "VERBS",
    "Behaviours",
    "Guard",
    "ScriptError",
    "Step",
    "parse_script",
    "render_text",
    "start_error",
]


PodMatch = Callable[[dict[str, Any]], bool]


@dataclass
class _Rule:
    match: PodMatch
    script: str
    description: str


@dataclass
class Behaviours:
    """Scripts chosen by tests for pods, overriding ``KUBESIM_SCRIPT``.

    ``set(match, script)`` registers a rule; ``match`` is a predicate over the pod object or a pod-name
    prefix. The most recently set matching rule wins. Rules apply to pods whose container starts after
    the rule is set.
    """

    _rules: list[_Rule] = field(default_factory=list)

    def set(self, match: PodMatch | str, script: str) -> None:
        """Use ``script`` for pods matching ``match`` (a predicate or a pod-name prefix)."""
        parse_script(script)  # refuse a bad script now, where the test can see it
        if isinstance(match, str):
            prefix = match

            def by_prefix(pod: dict[str, Any]) -> bool:
                return str(pod.get("metadata", {}).get("name", "")).startswith(prefix)

            self._rules.append(_Rule(by_prefix, script, f"name prefix {prefix!r}"))
        else:
            self._rules.append(_Rule(match, script, repr(match)))

    def clear(self) -> None:
        """Forget every rule."""
        self._rules.clear()

    def script_for(self, pod: dict[str, Any]) -> str | None:
        """The script of the last rule matching ``pod``, or None."""
        for rule in reversed(self._rules):
            if rule.match(pod):
                return rule.script
        return None
