"""A job's behaviour script (``env["KUBESIM_SCRIPT"]``, the grammar of :mod:`kubescript`) → a shell
script that does it for real on Slurm's nodes. Pure.

Used only when the settings say ``behaviourScripts: true`` (a tutorial or test cluster): then the same
``examples/*.yaml`` that drive kubesim's simulated pods run on a real Slurm, their ``command``, image and
runtime being stand-ins for a training program. ``print`` echoes (``{rank}`` is ``$NODE_RANK``,
``{env:X}`` is ``$X``), ``sleep``/``exit``/``hang`` do what they say, ``oom`` grows memory until Slurm
kills the step, and ``preempt`` asks Slurm for a job of a higher-priority-tier partition on this very
node, which preempts this one. ``lose-node`` and ``evict`` have no honest Slurm equivalent a job can
cause and are refused, naming them; ``slow-stop`` makes the job ignore SIGTERM for that long.
"""

from __future__ import annotations

import re
import shlex

from dispatch.errors import InvalidError, UnsupportedError
from kubescript import SCRIPT_ENV, ScriptError, Step, parse_script

__all__ = ["SCRIPT_ENV", "to_shell"]

_PLACEHOLDER = re.compile(r"\{(rank|env:([A-Za-z_][A-Za-z0-9_]*))\}")
_REFUSED = {
    "lose-node": "a job cannot lose its own node on Slurm (kill the node's slurmd to see node_lost)",
    "evict": "Slurm has no eviction",
}


def _text(text: str) -> str:
    """A double-quoted shell word printing ``text`` with its placeholders expanded by the shell."""
    out, last = [], 0
    for m in _PLACEHOLDER.finditer(text):
        out.append(shlex.quote(text[last : m.start()]) if m.start() > last else "")
        out.append('"$NODE_RANK"' if m.group(1) == "rank" else f'"${{{m.group(2)}-}}"')
        last = m.end()
    if last < len(text) or not out:
        out.append(shlex.quote(text[last:]))
    return "".join(out)


def _step(step: Step, preempt_partition: str | None) -> str:
    verb = step.verb
    if verb == "print":
        return f"printf '%s\\n' {_text(step.arg)}"
    if verb == "sleep":
        return f"sleep {step.seconds:g}"
    if verb == "exit":
        return f"exit {step.code}"
    if verb == "hang":
        return "exec sleep infinity"
    if verb == "oom":
        # tail keeps the longest line of /dev/zero (it has no newline) in memory: it grows until killed.
        return "exec tail /dev/zero"
    if verb == "slow-stop":
        return f"trap 'sleep {step.seconds:g}' TERM"
    if verb == "preempt":
        if preempt_partition is None:
            raise UnsupportedError(
                f"{SCRIPT_ENV}: preempt needs a partition of a higher PriorityTier over the same nodes"
            )
        return (
            f'sbatch -Q -p {shlex.quote(preempt_partition)} -w "$SLURMD_NODENAME" --exclusive '
            "-o /dev/null --wrap 'sleep 5'; exec sleep infinity"
        )
    raise UnsupportedError(f"{SCRIPT_ENV}: {verb}: {_REFUSED.get(verb, 'not supported on Slurm')}")


def _guard(step: Step) -> str:
    tests = []
    for g in step.guards:
        if g.kind == "rank":
            tests.append(f'[ "$NODE_RANK" = {shlex.quote(g.value)} ]')
        else:
            tests.append(f'[ "${{{g.name}-}}" = {shlex.quote(g.value)} ]')
    return " && ".join(tests)


def to_shell(script: str, *, preempt_partition: str | None) -> str:
    """The shell script that does what ``script`` says (``InvalidError`` if it does not parse,
    ``UnsupportedError`` naming a verb Slurm cannot do)."""
    try:
        steps = parse_script(script)
    except ScriptError as exc:
        raise InvalidError(str(exc), path=f'env["{SCRIPT_ENV}"]') from None
    lines = []
    for step in steps:
        action = _step(step, preempt_partition)
        guard = _guard(step)
        lines.append(f"if {guard}; then {action}; fi" if guard else action)
    lines.append("exit 0")
    return "\n".join(lines) + "\n"
