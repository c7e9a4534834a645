"""The ``KUBESIM_SCRIPT`` behaviour-script grammar: the one implementation that both kubesim's
simulated pods and dispatch's ``memory`` adapter read, so one job file drives both the same way.

A leaf package: it imports nothing of ``dispatch``, ``dispatch_kubeflow`` or ``kubesim`` (both
``dispatch`` and ``kubesim`` import it; ``tests/test_layout.py`` checks it). Refusals are
:class:`ScriptError` (a ``ValueError``); each user wraps it in its own error type.

Grammar (steps separated by ``;``)::

    script := step (";" step)*
    step   := guard* verb [args]
    guard  := "rank=" INT ":" | "env:" NAME "=" VALUE ":"
    verb   := "sleep" SECONDS | "print" TEXT | "exit" CODE | "oom" | "preempt" | "lose-node"
            | "evict" | "hang" | "slow-stop" SECONDS | "oom-but-exit-0"
            | "config-error" SECRET | "create-error" TEXT

``print`` text runs to the end of the step (write ``\\;`` for a literal semicolon); ``{rank}`` is the
rank (the pod's completion index) and ``{env:NAME}`` the value of one of the environment variables
(an unset one expands to nothing). A guarded step runs only when every guard holds. A script that
runs out of steps exits 0 where it stops, like a shell script. Everything here is a pure function.

``oom-but-exit-0`` ends the rank with exit code 0 although its container reads ``OOMKilled`` (a child
process was OOM-killed, the main one exited 0: kubernetes/kubernetes#116042), so the job completes.
``config-error`` and ``create-error`` are *start* steps: an applicable one keeps the container from
ever starting (wherever it stands in the script), as the kubelet's ``CreateContainerConfigError``
(``config-error NAME``: ``secret "NAME" not found``) or ``CreateContainerError`` (``create-error TEXT``:
the runtime's message) does; the rank never runs (its plan never ends).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_SCRIPT",
    "FAULTS",
    "SCRIPT_ENV",
    "START_ERRORS",
    "VERBS",
    "Guard",
    "RankPlan",
    "ScriptError",
    "Step",
    "parse_script",
    "plan_rank",
    "render_text",
    "start_error",
]

SCRIPT_ENV = "KUBESIM_SCRIPT"
"""The environment variable a job's behaviour script is read from."""

DEFAULT_SCRIPT = "print started; sleep 5; print done; exit 0"
"""What a job (or pod) without a script does: say it started, run five seconds, say it is done, exit
0. The same on kubesim and on the memory adapter, so that ``dispatch logs`` shows output on both."""

VERBS = (
    "sleep",
    "print",
    "exit",
    "oom",
    "preempt",
    "lose-node",
    "evict",
    "hang",
    "slow-stop",
    "oom-but-exit-0",
    "config-error",
    "create-error",
)
FAULTS = frozenset({"oom", "preempt", "lose-node", "evict"})
"""The verbs that end a rank with a fault instead of an exit code."""
START_ERRORS = frozenset({"config-error", "create-error"})
"""The verbs that keep a container from starting (checked before it starts, wherever they stand)."""

_NO_ARG = FAULTS | {"hang", "oom-but-exit-0"}
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RANK_GUARD = re.compile(r"rank=(\d+)\s*:")
_ENV_GUARD = re.compile(r"env:([^=:\s]+)=([^:]*):")
_EXIT_CODE = re.compile(r"\d{1,3}")
_PLACEHOLDER = re.compile(r"\{(rank|env:([A-Za-z_][A-Za-z0-9_]*))\}")


class ScriptError(ValueError):
    """A behaviour script that does not parse; the message names the step and what is allowed."""


@dataclass(frozen=True, slots=True)
class Guard:
    """A condition on a step: ``kind`` is ``"rank"`` (``value`` is the index) or ``"env"``."""

    kind: str
    name: str
    value: str

    def holds(self, rank: int, env: Mapping[str, str]) -> bool:
        if self.kind == "rank":
            return str(rank) == self.value
        return env.get(self.name) == self.value


@dataclass(frozen=True, slots=True)
class Step:
    """One parsed step: the verb, its argument as written, its guards, and the decoded number."""

    verb: str
    arg: str = ""
    guards: tuple[Guard, ...] = ()
    seconds: float = 0.0
    code: int = 0

    def applies(self, rank: int, env: Mapping[str, str]) -> bool:
        return all(g.holds(rank, env) for g in self.guards)


def parse_script(script: str) -> tuple[Step, ...]:
    """Parse a behaviour script; :class:`ScriptError` names the bad step and what is allowed."""
    if not isinstance(script, str):
        raise ScriptError(f"expected a script (text), got {type(script).__name__}")
    return _parse_text(script)


@functools.lru_cache(maxsize=1024)
def _parse_text(script: str) -> tuple[Step, ...]:
    # The steps are immutable, so a script is parsed once (each start checks its job's); an error is
    # not kept.
    steps: list[Step] = []
    parts = [p.replace("\\;", ";") for p in re.split(r"(?<!\\);", script)]
    for i, raw in enumerate(parts, start=1):
        if not raw.strip():
            continue
        steps.append(_parse_step(raw, f"step {i} ({raw.strip()!r})"))
    return tuple(steps)


def _parse_step(raw: str, where: str) -> Step:
    def bad(message: str) -> ScriptError:
        return ScriptError(f"{where}: {message}")

    guards: list[Guard] = []
    rest = raw
    while True:
        rest = rest.lstrip()
        m = _RANK_GUARD.match(rest)
        if m:
            guards.append(Guard("rank", "rank", str(int(m.group(1)))))
            rest = rest[m.end() :]
            continue
        if rest.startswith("rank="):
            raise bad("a rank guard is 'rank=<index>:' with a non-negative integer index")
        if rest.startswith("env:"):
            m = _ENV_GUARD.match(rest)
            if not m:
                raise bad("an env guard is 'env:<NAME>=<value>:'")
            if not _ENV_NAME.match(m.group(1)):
                raise bad(f"{m.group(1)!r} is not an environment variable name")
            guards.append(Guard("env", m.group(1), m.group(2).strip()))
            rest = rest[m.end() :]
            continue
        break
    body = rest.strip()
    if not body:
        raise bad(f"a guard must be followed by a verb; verbs: {', '.join(VERBS)}")
    verb, _, arg = body.partition(" ")
    arg = arg.strip()
    if verb not in VERBS:
        raise bad(f"unknown verb {verb!r}; verbs: {', '.join(VERBS)}")
    if verb in _NO_ARG:
        if arg:
            raise bad(f"'{verb}' takes no argument, got {arg!r}")
        return Step(verb, "", tuple(guards))
    if verb in ("sleep", "slow-stop"):
        try:
            seconds = float(arg)
        except ValueError:
            raise bad(f"'{verb}' needs a number of seconds, got {arg!r}") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise bad(f"'{verb}' needs a finite number of seconds >= 0, got {arg!r}")
        return Step(verb, arg, tuple(guards), seconds=seconds)
    if verb == "exit":
        if not _EXIT_CODE.fullmatch(arg) or int(arg) > 255:
            raise bad(f"'exit' needs an exit code 0..255, got {arg!r}")
        return Step(verb, arg, tuple(guards), code=int(arg))
    if verb == "config-error" and not (_SECRET_NAME.match(arg) and len(arg) <= 253):
        raise bad(f"'config-error' needs the name of the missing Secret (a DNS-1123 subdomain), got {arg!r}")
    if verb == "create-error" and not arg:
        raise bad("'create-error' needs the container runtime's error message")
    return Step(verb, arg, tuple(guards))  # print: the rest of the step, verbatim (may be empty)


def render_text(text: str, rank: int, env: Mapping[str, str]) -> str:
    """Expand ``{rank}`` and ``{env:NAME}`` (an unset variable expands to the empty string)."""

    def sub(m: re.Match[str]) -> str:
        return str(rank) if m.group(1) == "rank" else env.get(m.group(2), "")

    return _PLACEHOLDER.sub(sub, text)


@dataclass(frozen=True, slots=True)
class RankPlan:
    """What one rank does once running, as offsets from the moment it starts running.

    ``end`` is None when the rank never ends by itself (``hang``); ``verb`` is ``"exit"`` or one of the
    fault verbs; ``lines`` are ``(offset, text)`` of ``print`` steps; ``slow_stops`` are
    ``(offset, seconds)`` of ``slow-stop`` steps (from then on, stopping the rank takes that long).
    ``oom`` is True when the rank ends 0 reading ``OOMKilled`` (``oom-but-exit-0``); ``start_error`` is
    the start step that keeps the rank from starting (then ``end`` is None)."""

    end: float | None
    verb: str = "exit"
    code: int = 0
    lines: tuple[tuple[float, str], ...] = ()
    slow_stops: tuple[tuple[float, float], ...] = ()
    oom: bool = False
    start_error: Step | None = None

    @property
    def failed(self) -> bool:
        return self.end is not None and (self.verb != "exit" or self.code != 0)


def plan_rank(steps: Sequence[Step], rank: int, env: Mapping[str, str]) -> RankPlan:
    """Walk the steps that apply to ``rank`` and return its plan (a simulator that runs in logical time
    needs no more)."""
    blocked = start_error(steps, rank, env)
    if blocked is not None:
        return RankPlan(None, blocked.verb, start_error=blocked)
    t = 0.0
    lines: list[tuple[float, str]] = []
    slow: list[tuple[float, float]] = []
    for step in steps:
        if not step.applies(rank, env):
            continue
        if step.verb == "sleep":
            t += step.seconds
        elif step.verb == "print":
            lines.append((t, render_text(step.arg, rank, env)))
        elif step.verb == "slow-stop":
            slow.append((t, step.seconds))
        elif step.verb == "hang":
            return RankPlan(None, "hang", 0, tuple(lines), tuple(slow))
        elif step.verb == "exit":
            return RankPlan(t, "exit", step.code, tuple(lines), tuple(slow))
        elif step.verb == "oom-but-exit-0":
            return RankPlan(t, "exit", 0, tuple(lines), tuple(slow), oom=True)
        elif step.verb in START_ERRORS:
            continue  # decided before the rank started
        else:
            return RankPlan(t, step.verb, 0, tuple(lines), tuple(slow))
    return RankPlan(t, "exit", 0, tuple(lines), tuple(slow))


def start_error(steps: Sequence[Step], rank: int, env: Mapping[str, str]) -> Step | None:
    """The first ``config-error``/``create-error`` step that applies to ``rank``, if any: the container
    never starts."""
    return next((s for s in steps if s.verb in START_ERRORS and s.applies(rank, env)), None)
