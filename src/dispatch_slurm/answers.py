"""What a Slurm command's answer means: an answer, an outage, or Slurm's refusal. Pure.

The one place that tells *unreachable* from everything else (SPEC §5, §13 "An outage changes
nothing"): a command that failed because the controller is down or restarting, munge is down, or the
ssh connection failed, or that timed out, says nothing about any job — a reading raises
:class:`~dispatch.errors.UnavailableError` and no record changes. Only a write's failure can be a
refusal (``sbatch`` saying the job cannot run as asked), and only when its words are not an outage's:
munge coming back, a controller restarting, a socket that timed out are never a refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from dispatch.errors import UnavailableError

__all__ = ["Failure", "Result", "answer", "failure_of", "outage"]


@dataclass(frozen=True, slots=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def error(self) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"{self.argv[0]} exited {self.returncode}: {' / '.join(text[-3:]) or 'no message'}"


# Slurm's words (slurm_strerror and its clients' messages) for a request that never got an answer.
_NOT_SENT = re.compile(
    r"Unable to contact slurm controller|Protocol authentication error|authentication error"
    r"|Munge (?:en|de)code failed|Invalid authentication credential|Zero Bytes were transmitted or received"
    r"|Connection refused|Communication connection failure|backup controller in standby mode"
    r"|Slurm temporarily unable to accept job|Slurmctld is not responding|Transport endpoint is not connected"
    r"|Address already in use|Network is unreachable|No route to host|Could not resolve hostname",
    re.IGNORECASE,
)
# Words for a request that may have reached slurmctld before the answer was lost.
_MAYBE_SENT = re.compile(
    r"Socket timed out on send/recv operation|Connection reset by peer|Broken pipe|Insane message length"
    r"|Unexpected message received|Connection closed by|client_loop: send disconnect",
    re.IGNORECASE,
)


class Failure(Enum):
    """How a command failed."""

    UNREACHABLE = "unreachable"
    """It never reached slurmctld, or slurmctld could not answer it: nothing was done."""
    UNKNOWN = "unknown"
    """It may have reached slurmctld, and the answer was lost: a write may or may not have happened."""
    REFUSED = "refused"
    """Slurm answered, and said no."""


def failure_of(result: Result) -> Failure:
    """How ``result`` (a command that exited non-zero) failed."""
    text = f"{result.stderr}\n{result.stdout}"
    if _MAYBE_SENT.search(text):
        return Failure.UNKNOWN
    if _NOT_SENT.search(text):
        return Failure.UNREACHABLE
    return Failure.REFUSED


def outage(result: Result) -> bool:
    """Whether a failed command failed for an outage, not for what it asked."""
    return failure_of(result) is not Failure.REFUSED


def answer(result: Result, what: str) -> str:
    """The output of a reading command that answered; :class:`UnavailableError` naming ``what`` and
    why for one that did not — any failure of a reading is unreachable, never "nothing there"."""
    if not result.ok:
        raise UnavailableError(f"cannot {what}: {result.error()}")
    return result.stdout
