"""What one process on a Linux node can be given: execve(2)'s limits on its arguments and environment.

Every adapter that runs a job's command as a process — a container's entrypoint (Kubeflow), an ``srun``
task (Slurm) — hands the command over as its arguments and the environment as its environ. Linux refuses
such an exec (``E2BIG``, "Argument list too long") on every node when one string, with its terminating
NUL, is longer than ``MAX_ARG_STRLEN`` (32 pages: 131,072 bytes), or when all of them with their pointers
take more than a quarter of the stack limit (2 MiB under the usual ``ulimit -s`` of 8 MiB; see
``execve(2)``, "Limits on size of arguments and environment", and ``fs/exec.c``). A job that can only
fail so is refused at submit, naming the limit (:func:`check_exec`); the node's own additions (a
container runtime's ``PATH`` and service variables, Slurm's ``SLURM_*``) get :data:`NODE_RESERVE`.

Pure: sizes in bytes of UTF-8, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatch.errors import InvalidError

__all__ = ["EXEC_BYTES", "MAX_ARG_STRLEN", "NODE_RESERVE", "check_exec"]

MAX_ARG_STRLEN = 131_072
"""The longest string (an argument, or an environment entry ``NAME=VALUE``) Linux passes to a process,
its NUL included."""
EXEC_BYTES = 2_097_152
"""Arguments and environment of one exec, strings with their NULs plus a pointer each: a quarter of the
usual 8 MiB stack limit."""
NODE_RESERVE = 65_536
"""What :func:`check_exec` leaves of :data:`EXEC_BYTES` for the variables the node itself adds."""
_POINTER = 8


def check_exec(command: Sequence[str], env: Mapping[str, str], *, where: str = "a Linux node") -> None:
    """``InvalidError`` naming the first item of ``command`` or entry of ``env`` (the environment the
    process gets, dispatch's own variables included) that no process on ``where`` can be given, or the
    total when they cannot all be given at once."""
    total = 0
    for i, item in enumerate(command):
        size = len(item.encode()) + 1
        total += size + _POINTER
        if size > MAX_ARG_STRLEN:
            raise InvalidError(
                f"{size - 1:,} bytes; one argument of a process on {where} may hold at most "
                f"{MAX_ARG_STRLEN - 1:,} (Linux's MAX_ARG_STRLEN): pass large data in a file",
                path=f"command[{i}]",
            )
    for name, value in env.items():
        size = len(name.encode()) + 1 + len(value.encode()) + 1
        total += size + _POINTER
        if size > MAX_ARG_STRLEN:
            raise InvalidError(
                f"{name}=VALUE is {size - 1:,} bytes; one environment entry of a process on {where} may "
                f"hold at most {MAX_ARG_STRLEN - 1:,} (Linux's MAX_ARG_STRLEN): pass large data in a file",
                path=f'env["{name}"]',
            )
    budget = EXEC_BYTES - NODE_RESERVE
    if total > budget:
        raise InvalidError(
            f"the command ({len(command)} item(s)) and the environment ({len(env)} entries) take {total:,} "
            f"bytes; a process on {where} may be given at most {EXEC_BYTES:,} in all (a quarter of the usual "
            f"8 MiB stack limit), of which {NODE_RESERVE:,} are left for what the node adds",
            path="env" if len(env) > len(command) else "command",
        )
