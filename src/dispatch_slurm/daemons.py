"""Daemons started by pid file, for the local test clusters: free ports, liveness, waiting, stopping.

Nothing here knows Slurm; :mod:`dispatch_slurm.localslurm` and :mod:`dispatch_slurm.rootslurm` start
their daemons with it and stop them by the pids those daemons wrote (never by name: several clusters
share this host).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "alive",
    "children",
    "descendants",
    "free_ports",
    "kill_all",
    "port_busy",
    "read_pid",
    "terminate",
    "wait_until",
]


def free_ports(count: int, *, consecutive: int = 0) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1, then ``consecutive`` more that follow each other
    (Slurm's ``Port=[a-b]`` for its nodes). Free when asked: the daemons bind them just after.

    They come from below the kernel's ephemeral range, so no connection's source port takes one in
    the gap before a daemon binds it (CI saw a slurmd fail to bind the port after the one ``bind(0)``
    chose). Each is claimed by an ``flock`` this process holds until it exits, so test clusters that
    start at once in other processes never choose the same ones."""
    size = count + consecutive
    low, high = _PORT_FLOOR, _ephemeral_low()
    rng = random.Random()
    for _ in range(1000):
        first = rng.randrange(low, high - size)
        block = range(first, first + size)
        claimed = []
        for p in block:
            if not _claim(p):
                break
            claimed.append(p)
        if len(claimed) == size and not any(port_busy(p) for p in block):
            return list(block)
        for p in claimed:
            _release(p)
    raise RuntimeError(f"no {size} consecutive free ports in {low}-{high - 1}")


# Below the ephemeral range and above most services' well-known ports.
_PORT_FLOOR = 20000
_CLAIMS: dict[int, int] = {}


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(low, _PORT_FLOOR + 1000)


def _claim(port: int) -> bool:
    if port in _CLAIMS:
        return False
    claims = Path(tempfile.gettempdir()) / "dispatch-port-claims"
    claims.mkdir(exist_ok=True)
    fd = os.open(claims / str(port), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _CLAIMS[port] = fd
    return True


def _release(port: int) -> None:
    fd = _CLAIMS.pop(port, None)
    if fd is not None:
        os.close(fd)


def port_busy(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux: its /proc entry exists and it is not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def children() -> dict[int, list[int]]:
    """Every process's children (by parent pid), read from /proc."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int(Path(entry, "stat").read_text().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(parent, []).append(int(entry.name))
    return out


def descendants(pids: Iterable[int]) -> list[int]:
    """``pids`` and every process below them."""
    tree = children()
    seen: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo.extend(tree.get(pid, ()))
    return seen


def kill_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def crash(pids: Iterable[int]) -> None:
    """End ``pids`` as a host that crashes does, all at once: each is stopped (SIGSTOP) before any is
    killed, so no slurmstepd can see its task die and report the job's end to slurmctld, which a
    crashed host never does. Killed one after another, a lost node read ``exit_code`` instead of
    ``node_lost`` in two CI runs of this round (22.05 once, 26.05 once): a step daemon outliving its
    task by a moment is the likely way."""
    frozen = list(pids)
    kill_all(frozen, signal.SIGSTOP)
    kill_all(frozen)


def terminate(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM ``pid``, and SIGKILL it if it still runs after ``timeout`` seconds."""
    if not alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_until(ready: Callable[[], bool], timeout: float, what: str, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what} (logs in {logs})")
        time.sleep(0.1)
