"""Every question the Slurm backend asks the cluster, each answered completely or not at all.

The one place the adapter reads: ``squeue --json --states=all`` (every job Slurm still lists), ``sacct``
(what accounting or the completion log keeps of jobs that left the queue), ``squeue -s`` (the steps), and
the job's directory on the shared workdir (output, dispatch's cancel mark). Each method returns what the
cluster answered, parsed by :mod:`~dispatch_slurm.reader` in the dialect opening chose, or raises
:class:`~dispatch.errors.UnavailableError` saying why (:func:`~dispatch_slurm.answers.answer`): a
controller, munge or ssh that is down, a timeout, an answer carrying ``errors``. Nothing here ever turns
a failure into "nothing there": that is the line between *absent* and *unreachable* readings.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatch.errors import UnavailableError
from dispatch_slurm.answers import answer
from dispatch_slurm.preflight import ClusterInfo
from dispatch_slurm.reader import SACCT_FIELDS, SlurmJob, parse_sacct, parse_squeue
from dispatch_slurm.transport import LocalTransport, SshTransport

__all__ = ["SQUEUE", "Queries"]

SQUEUE = ("squeue", "--json", "--states=all")
"""The one listing every reading starts from: every job Slurm still knows, ended ones included."""
_TIME_FORMAT = {"SLURM_TIME_FORMAT": "%s"}  # sacct's End as epoch seconds, whatever the login node's zone
_IF_EXISTS = 'if [ -e "$1" ]; then exec cat -- "$1"; fi'
_TAIL_FROM = 'if [ -e "$2" ]; then exec tail -c "+$1" -- "$2"; fi'
_TAILS = 'for f in "$1"/node-*.out "$1"/batch.out; do if [ -f "$f" ]; then tail -n "$2" -- "$f"; fi; done'
_EXISTING = 'while IFS= read -r f; do if [ -e "$f" ]; then printf "%s\\n" "$f"; fi; done'


class Queries:
    """The questions, over one transport, for the cluster opening read (``info``)."""

    def __init__(self, transport: LocalTransport | SshTransport, info: ClusterInfo) -> None:
        self.transport = transport
        self.info = info

    async def jobs(self) -> list[SlurmJob]:
        """Every job Slurm lists (ended ones too, for ``MinJobAge``)."""
        listed = await self.transport.run(SQUEUE)
        return parse_squeue(answer(listed, "list Slurm's jobs"), self.info.dialect)

    async def accounted(self, *, ids: Sequence[str] = (), name: str | None = None) -> list[SlurmJob]:
        """What accounting (or the completion log) keeps of the jobs ``ids`` or named ``name``; ``[]``
        when the cluster keeps neither (a complete answer: nothing outlives squeue there)."""
        if not (self.info.accounting or self.info.jobcomp) or not (ids or name):
            return []
        argv = ["sacct", "-X", "-P", "-n", "--duplicates", "-o", SACCT_FIELDS]
        if not self.info.accounting:
            argv.insert(1, "-c")  # the completion log (jobcomp/filetxt), not the database
        if ids:
            argv += ["-j", ",".join(ids)]
        if name:
            argv += ["--name", name, "--starttime", "2000-01-01"]  # without -j sacct looks at today only
        what = "read Slurm's accounting" if self.info.accounting else "read Slurm's completion log"
        return parse_sacct(answer(await self.transport.run(argv, env=_TIME_FORMAT), what))

    async def stepping(self) -> set[str]:
        """The ids of the jobs with a step listed (``squeue -s``)."""
        steps = answer(await self.transport.run(["squeue", "-h", "-s", "-o", "%i"]), "list Slurm's job steps")
        return {line.split(".")[0] for line in steps.split()}

    async def tails(self, directory: str, lines: int) -> tuple[str, ...]:
        """The last ``lines`` lines of every node's output in ``directory``, then the batch script's."""
        got = await self.transport.run(["sh", "-c", _TAILS, "dispatch-tail", directory, str(lines)])
        return tuple(answer(got, f"read the output in {directory}").splitlines()[-lines:])

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists on the login node (``test`` answers 0 or 1; anything else is no answer)."""
        found = await self.transport.run(["test", "-e", path])
        if found.returncode not in (0, 1):
            raise UnavailableError(f"cannot tell whether {path} exists: {found.error()}")
        return found.ok

    async def existing(self, paths: Sequence[str]) -> set[str]:
        """Which of ``paths`` exist on the login node (one command for all: the paths go on its stdin, one
        a line — none holds a line break — so their number is not bounded by a command line's length)."""
        got = await self.transport.run(
            ["sh", "-c", _EXISTING, "dispatch-exists"], stdin="\n".join(paths) + "\n"
        )
        return set(answer(got, "look for the jobs' end markers").splitlines())

    async def text(self, path: str, *, offset: int = 0) -> str:
        """The text of ``path`` from byte ``offset`` on (``""`` for a file not written yet)."""
        if offset:
            argv = ["sh", "-c", _TAIL_FROM, "dispatch-follow", str(offset + 1), path]
        else:
            argv = ["sh", "-c", _IF_EXISTS, "dispatch-cat", path]
        return answer(await self.transport.run(argv), f"read {path}")
