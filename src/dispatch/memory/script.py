"""The behaviour script a memory job carries in ``env["KUBESIM_SCRIPT"]``: parsing and timelines.

The grammar is the one kubesim's simulated pods read (so one job file drives both), restricted to what
makes sense without processes or output::

    script := step (";" step)*
    step   := guard* verb [args]
    guard  := "rank=" INT ":" | "env:" NAME "=" VALUE ":"
    verb   := "sleep" SECONDS | "print" TEXT | "exit" CODE | "oom" | "preempt" | "lose-node"
            | "evict" | "hang" | "slow-stop" SECONDS

``print`` text runs to the end of the step (write ``\\;`` for a literal semicolon). A guarded step
runs only on the ranks (nodes) where every guard holds; ``env:`` guards read the job's
environment, which includes ``DISPATCH_JOB_ID`` and ``DISPATCH_EPOCH`` (so ``env:DISPATCH_EPOCH=1.0:
preempt`` hits only the first incarnation). Parsing and the timeline of one rank are pure functions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dispatch.errors import InvalidError

__all__ = [
    "DEFAULT_SCRIPT",
    "SCRIPT_ENV",
    "VERBS",
    "Guard",
    "RankPlan",
    "Step",
    "parse_script",
    "plan_rank",
]

SCRIPT_ENV = "KUBESIM_SCRIPT"
"""The environment variable a job's behaviour script is read from."""

DEFAULT_SCRIPT = "sleep 5; exit 0"
"""What a job without a script does: run five seconds, then exit 0."""

VERBS = ("sleep", "print", "exit", "oom", "preempt", "lose-node", "evict", "hang", "slow-stop")
FAULTS = frozenset({"oom", "preempt", "lose-node", "evict"})
_NO_ARG = FAULTS | {"hang"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RANK_GUARD = re.compile(r"rank=(\d+)\s*:")
_ENV_GUARD = re.compile(r"env:([^=:\s]+)=([^:]*):")


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


def parse_script(script: str, *, path: str = f'env["{SCRIPT_ENV}"]') -> tuple[Step, ...]:
    """Parse a behaviour script. Raises :class:`InvalidError` at ``path`` naming the bad step and what
    is allowed."""
    steps: list[Step] = []
    parts = [p.replace("\\;", ";") for p in re.split(r"(?<!\\);", script)]
    for i, raw in enumerate(parts, start=1):
        if not raw.strip():
            continue
        where = f"step {i} ({raw.strip()!r})"
        steps.append(_parse_step(raw, where, path))
    return tuple(steps)


def _parse_step(raw: str, where: str, path: str) -> Step:
    def bad(message: str) -> InvalidError:
        return InvalidError(f"{where}: {message}", path=path)

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
        if not re.fullmatch(r"\d{1,3}", arg) or int(arg) > 255:
            raise bad(f"'exit' needs an exit code 0..255, got {arg!r}")
        return Step(verb, arg, tuple(guards), code=int(arg))
    return Step(verb, arg, tuple(guards))  # print: the rest of the step, verbatim


@dataclass(frozen=True, slots=True)
class RankPlan:
    """What one rank does once running, as offsets from the moment it starts running.

    ``end`` is None when the rank never ends by itself (``hang``); ``verb`` is ``"exit"`` or one of the
    fault verbs; ``lines`` are ``(offset, text)`` of ``print`` steps; ``slow_stops`` are
    ``(offset, seconds)`` of ``slow-stop`` steps (from then on, stopping the rank takes that long)."""

    end: float | None
    verb: str = "exit"
    code: int = 0
    lines: tuple[tuple[float, str], ...] = ()
    slow_stops: tuple[tuple[float, float], ...] = ()

    @property
    def failed(self) -> bool:
        return self.end is not None and (self.verb != "exit" or self.code != 0)


def plan_rank(steps: Sequence[Step], rank: int, env: Mapping[str, str]) -> RankPlan:
    """Walk the steps that apply to ``rank`` and return its plan. A script that runs out of steps
    exits 0 where it stops, like a shell script."""
    t = 0.0
    lines: list[tuple[float, str]] = []
    slow: list[tuple[float, float]] = []
    for step in steps:
        if not step.applies(rank, env):
            continue
        if step.verb == "sleep":
            t += step.seconds
        elif step.verb == "print":
            lines.append((t, _render(step.arg, rank, env)))
        elif step.verb == "slow-stop":
            slow.append((t, step.seconds))
        elif step.verb == "hang":
            return RankPlan(None, "hang", 0, tuple(lines), tuple(slow))
        elif step.verb == "exit":
            return RankPlan(t, "exit", step.code, tuple(lines), tuple(slow))
        else:
            return RankPlan(t, step.verb, 0, tuple(lines), tuple(slow))
    return RankPlan(t, "exit", 0, tuple(lines), tuple(slow))


_PLACEHOLDER = re.compile(r"\{(rank|env:([A-Za-z_][A-Za-z0-9_]*))\}")


def _render(text: str, rank: int, env: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        return str(rank) if m.group(1) == "rank" else env.get(m.group(2), "")

    return _PLACEHOLDER.sub(sub, text)
