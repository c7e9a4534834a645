"""What a command's exit code says (docs/cli.md, "Exit codes").

0 success; 1 a job ended failed/lost/cancelled, or a dispatch error other than invalid input; 2 usage or
validation errors (``InvalidError``); 3 a write found the job already ended; 130 interrupted; 141 the
reader of stdout went away.
"""

from __future__ import annotations

__all__ = [
    "EXIT_ALREADY_ENDED",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_OK",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_ALREADY_ENDED = 3
"""A write (``cancel``) found the job already ended: nothing was done (not a failure of the job)."""
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""The reader of stdout went away (``| head``): 128 + SIGPIPE, as for a tool SIGPIPE ended."""
