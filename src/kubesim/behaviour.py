"""Scripted pod behaviour: what a simulated container "does".

A pod's main container reads a small script from its env var ``KUBESIM_SCRIPT`` (so a job's own env can
carry it end to end), or from a rule registered with :class:`Behaviours` (the Python API for tests).

Grammar (steps separated by ``;``)::

    script := step (";" step)*
    step   := guard* verb [args]
    guard  := "rank=" INT ":" | "env:" NAME "=" VALUE ":"
    verb   := "sleep" SECONDS | "print" TEXT | "exit" CODE | "oom" | "preempt" | "lose-node"
            | "evict" | "hang" | "slow-stop" SECONDS

``print`` text runs to the end of the step (write ``\\;`` for a literal semicolon); ``{rank}`` is the
pod's completion index and ``{env:NAME}`` the value of one of the container's env vars. A guarded step runs only when every guard holds.
Parsing is pure (:func:`parse_script`); running the steps is the kubelet's job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_SCRIPT",
    "SCRIPT_ENV",
    "Behaviours",
    "Guard",
    "ScriptError",
    "Step",
    "parse_script",
    "render_text",
]

SCRIPT_ENV = "KUBESIM_SCRIPT"
DEFAULT_SCRIPT = "print started; sleep 5; print done; exit 0"

VERBS = ("sleep", "print", "exit", "oom", "preempt", "lose-node", "evict", "hang", "slow-stop")
_NO_ARG = frozenset({"oom", "preempt", "lose-node", "evict", "hang"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class ScriptError(ValueError):
    """A behaviour script that does not parse; the message names the step and what is allowed."""


@dataclass(frozen=True)
class Guard:
    """A condition on a step: ``kind`` is ``"rank"`` (value = index) or ``"env"`` (name=value)."""

    kind: str
    name: str
    value: str

    def holds(self, rank: int, env: Mapping[str, str]) -> bool:
        if self.kind == "rank":
            return str(rank) == self.value
        return env.get(self.name) == self.value


@dataclass(frozen=True)
class Step:
    """One parsed step: ``verb``, its argument (seconds, exit code or text) and its guards."""

    verb: str
    arg: str = ""
    guards: tuple[Guard, ...] = ()
    seconds: float = 0.0
    code: int = 0

    def applies(self, rank: int, env: Mapping[str, str]) -> bool:
        return all(g.holds(rank, env) for g in self.guards)


def _parse_guards(text: str, where: str) -> tuple[tuple[Guard, ...], str]:
    guards: list[Guard] = []
    rest = text
    while True:
        rest = rest.lstrip()
        m = re.match(r"rank=(\d+)\s*:", rest)
        if m:
            guards.append(Guard("rank", "rank", str(int(m.group(1)))))
            rest = rest[m.end() :]
            continue
        if rest.startswith("rank="):
            raise ScriptError(f"{where}: a rank guard is 'rank=<index>:' with a non-negative integer index")
        if rest.startswith("env:"):
            m = re.match(r"env:([^=:\s]+)=([^:]*):", rest)
            if not m:
                raise ScriptError(f"{where}: an env guard is 'env:<NAME>=<value>:'")
            name = m.group(1)
            if not _ENV_NAME.match(name):
                raise ScriptError(f"{where}: {name!r} is not an environment variable name")
            guards.append(Guard("env", name, m.group(2).strip()))
            rest = rest[m.end() :]
            continue
        return tuple(guards), rest


def _seconds(verb: str, arg: str, where: str) -> float:
    try:
        value = float(arg)
    except ValueError:
        raise ScriptError(f"{where}: '{verb}' needs a number of seconds, got {arg!r}") from None
    if value < 0 or value != value or value == float("inf"):
        raise ScriptError(f"{where}: '{verb}' needs a finite number of seconds >= 0, got {arg!r}")
    return value


def parse_script(script: str) -> list[Step]:
    """Parse a behaviour script into steps; raises :class:`ScriptError` naming the bad step."""
    steps: list[Step] = []
    parts = [p.replace("\\;", ";") for p in re.split(r"(?<!\\);", script)]
    for i, raw in enumerate(parts, start=1):
        where = f"step {i} ({raw.strip()!r})"
        if not raw.strip():
            continue
        guards, body = _parse_guards(raw, where)
        body = body.strip()
        if not body:
            raise ScriptError(f"{where}: a guard must be followed by a verb; verbs: {', '.join(VERBS)}")
        verb, _, arg = body.partition(" ")
        arg = arg.strip()
        if verb not in VERBS:
            raise ScriptError(f"{where}: unknown verb {verb!r}; verbs: {', '.join(VERBS)}")
        if verb in _NO_ARG:
            if arg:
                raise ScriptError(f"{where}: '{verb}' takes no argument, got {arg!r}")
            steps.append(Step(verb, "", guards))
        elif verb in ("sleep", "slow-stop"):
            steps.append(Step(verb, arg, guards, seconds=_seconds(verb, arg, where)))
        elif verb == "exit":
            if not re.fullmatch(r"\d{1,3}", arg) or int(arg) > 255:
                raise ScriptError(f"{where}: 'exit' needs an exit code 0..255, got {arg!r}")
            steps.append(Step(verb, arg, guards, code=int(arg)))
        else:  # print: the rest of the step, verbatim (may be empty)
            steps.append(Step(verb, body[len("print") :].strip(), guards))
    return steps


_PLACEHOLDER = re.compile(r"\{(rank|env:([A-Za-z_][A-Za-z0-9_]*))\}")


def render_text(text: str, rank: int, env: Mapping[str, str]) -> str:
    """Expand ``{rank}`` and ``{env:NAME}`` (an unset variable expands to the empty string)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) == "rank":
            return str(rank)
        return env.get(m.group(2), "")

    return _PLACEHOLDER.sub(sub, text)


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
