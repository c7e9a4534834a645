"""Daemons started by pid file, for the local test clusters: free ports, liveness, waiting, stopping.

Nothing here knows Slurm; :mod:`dispatch_slurm.localslurm` and :mod:`dispatch_slurm.rootslurm` start
their daemons with it and stop them by the pids those daemons wrote (never by name: several clusters
share this host).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
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
    (Slurm's ``Port=[a-b]`` for its nodes). Free when asked: the daemons bind them just after."""
    socks = []
    try:
        for _ in range(count + 1):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        ports = [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
    singles, start = ports[:count], ports[count]
    if consecutive == 0:
        return singles
    run = range(start, start + consecutive)
    if start + consecutive > 65535 or any(p in singles or port_busy(p) for p in run):
        return free_ports(count, consecutive=consecutive)
    return [*singles, *run]


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
