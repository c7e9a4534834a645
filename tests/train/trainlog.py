"""Reading what ``examples/train/train.py`` prints, and running its ranks as local processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "examples" / "train" / "train.py"
WAIT = 120.0
"""A hang guard for waits on the program's output, never a measure (a loaded machine is slow)."""

_STEP = re.compile(r"^step (\d+) loss (\S+)$")
_CHECKPOINT = re.compile(r"^checkpoint step (\d+) epoch (\d+): ")
_RESUMED = re.compile(r"^resumed from step (\d+) \(checkpoint of incarnation (\d+)\)$")


@dataclass(frozen=True)
class Run:
    """What one rank of one incarnation printed, read back."""

    steps: list[tuple[int, str]]
    checkpoints: list[int]
    resumed_from: int | None
    """The step of the checkpoint it resumed from; None when it started from scratch."""

    @classmethod
    def of(cls, lines: Iterable[str]) -> Run:
        steps, checkpoints, resumed = [], [], None
        for line in lines:
            line = line.strip()
            # `dispatch logs` prefixes a node's lines with `[node N] ` when it prints several nodes
            line = re.sub(r"^\[node \d+\] ", "", line)
            if m := _STEP.match(line):
                steps.append((int(m.group(1)), m.group(2)))
            elif m := _CHECKPOINT.match(line):
                checkpoints.append(int(m.group(1)))
            elif m := _RESUMED.match(line):
                resumed = int(m.group(1))
        return cls(steps, checkpoints, resumed)

    @property
    def first(self) -> int:
        return self.steps[0][0]

    @property
    def reached(self) -> int:
        return self.steps[-1][0]

    @property
    def final_loss(self) -> str:
        return self.steps[-1][1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class Rank:
    """One process of the program, its output read as it comes (so a test waits on a line, not a time)."""

    def __init__(self, args: list[str], env: Mapping[str, str], cwd: Path) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "TRAIN_", "PET_"))}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            base.pop(name, None)
        self.proc = subprocess.Popen(
            [sys.executable, str(PROGRAM), *args],
            env={**base, **env},
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._changed = threading.Condition()
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.errors), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream: Iterable[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            with self._changed:
                into.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, pattern: str) -> str:
        """The first line matching ``pattern`` (a regex), waiting for it; fails if the process ends first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + WAIT
        with self._changed:
            while True:
                found = next((line for line in self.lines if rx.search(line)), None)
                if found is not None:
                    return found
                if self.proc.poll() is not None and not any(t.is_alive() for t in self._threads):
                    raise AssertionError(
                        f"ended ({self.proc.returncode}) before {pattern!r}:\n{self.output()}"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(f"no {pattern!r} within {WAIT:g} s:\n{self.output()}")
                self._changed.wait(0.5)

    def finish(self) -> int:
        code = self.proc.wait(timeout=WAIT)
        for t in self._threads:
            t.join(timeout=WAIT)
        return code

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()

    def run(self) -> Run:
        return Run.of(self.lines)

    def output(self) -> str:
        return "\n".join([*self.lines, "--- stderr", *self.errors])


def ranks(
    world: int, args: list[str], cwd: Path, *, epoch: str = "1.0", extra: Mapping[str, str] | None = None
) -> list[Rank]:
    """Every rank of one incarnation, torch.distributed's way, on a free loopback port."""
    port = str(free_port())
    common = {
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "DISPATCH_EPOCH": epoch,
    }
    return [Rank(args, {**common, "RANK": str(r), **(extra or {})}, cwd) for r in range(world)]


BIN = Path(sys.executable).parent


class Session:
    """The CLI with its own state directory (its own dev cluster), run from the repository, whose
    examples/train/train.py the processes run."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "KUBECONFIG"))}
        self.env["DISPATCH_STATE_DIR"] = str(home / "state")
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"  # python3 with numpy

    @property
    def kubeconfig(self) -> Path:
        return self.home / "state" / "dev-cluster" / "kubeconfig"

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dispatch"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(BIN / "dispatch"), *args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def kubectl(self, *args: str) -> str:
        done = subprocess.run(
            [str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


def until_checkpoint(follow: subprocess.Popen[str], step: int) -> list[str]:
    """The lines ``dispatch logs --follow`` prints up to incarnation 1's checkpoint of ``step`` (the
    moment a test preempts it); fails if the output ends first."""
    assert follow.stdout is not None
    lines = []
    for line in follow.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith(f"checkpoint step {step} epoch 1: "):
            return lines
    raise AssertionError("\n".join(lines))
