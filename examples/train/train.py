"""A small data-parallel training program: numpy, ranks exchanging gradients over TCP, checkpoints that
a later incarnation resumes from.

    python3 examples/train/train.py --steps 40 --checkpoint-every 10 --step-time 0.2

It follows ``torch.distributed``'s environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` (what a Slurm job script or ``torchrun`` sets), else what Kubeflow Trainer's torch runtime
gives a pod (``PET_NODE_RANK``, ``PET_NNODES``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``); one process
per node. Rank 0 listens on ``MASTER_PORT``; the others connect to ``MASTER_ADDR:MASTER_PORT``,
retrying while it starts. Every step each rank computes the gradient of its share of the batch, rank 0
sums them in rank order and sends the sum back, and every rank applies the same update: the run is
deterministic (fixed seed, fixed data order), whatever the timing.

Rank 0 checkpoints to ``$DISPATCH_CHECKPOINT_DIR/$DISPATCH_JOB_ID`` every K steps, after the last step,
and when the job is told to stop (SIGTERM to any rank): parameters, optimizer state and data position,
written atomically (a temporary file, fsync, rename, fsync of the directory). A checkpoint's name
carries the incarnation ``N`` of ``DISPATCH_EPOCH="N.R"``, a fencing token: an incarnation refuses to
write, or even to start, once a newer one has written, and resumes from the newest checkpoint written by
itself or an older one. A checkpoint holds the whole state, so a resumed run ends with the same loss,
to the float, as a run that was never interrupted.

It prints ``step S loss L`` per step (L in full precision). Exit codes: 0 done, 1 error, 2 bad
arguments or environment, 3 fenced by a newer incarnation, 143 (or killed by SIGTERM) when told to stop.

``--backend torch`` exchanges through ``torch.distributed`` (gloo) where torch is installed; the
default needs numpy alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

Vector = NDArray[np.float64]

EXIT_ERROR, EXIT_USAGE, EXIT_FENCED, EXIT_STOPPED = 1, 2, 3, 143
FORMAT = 1
"""The checkpoint format this program writes and reads."""
KEEP = 2
"""How many of its own newest checkpoints an incarnation keeps (it never deletes another's)."""
_NAME = re.compile(r"^ckpt-e(\d{6,})-s(\d{8,})\.npz$")

# The problem: a fixed data set, a small two-layer network, SGD with momentum.
SAMPLES, FEATURES, HIDDEN, BATCH = 1024, 8, 16, 64
LEARNING_RATE, MOMENTUM = 0.05, 0.9
PARAMS = ("w1", "b1", "w2", "b2")
SHAPES = {"w1": (FEATURES, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, 1), "b2": (1,)}


class UsageProblem(Exception):
    """Bad arguments or environment (exit 2)."""


class Fenced(Exception):
    """A newer incarnation wrote a checkpoint: this one must not write, nor go on (exit 3)."""


class PeerLost(Exception):
    """A rank went away or broke the protocol."""


class StopRequested(Exception):
    """Told to stop (SIGTERM) before training began: nothing new to keep."""


# --------------------------------------------------------------------------------------- the setup


@dataclass(frozen=True)
class Dist:
    """Where this process stands in the job: its rank, the job's size, how to reach rank 0."""

    rank: int
    world: int
    local_rank: int
    addr: str
    port: int


def _int(environ: Mapping[str, str], names: Sequence[str], default: int) -> int:
    for name in names:
        text = environ.get(name)
        if text is None or text == "":
            continue
        try:
            return int(text)
        except ValueError:
            raise UsageProblem(f"{name}={text!r}: expected an integer") from None
    return default


def dist_from(environ: Mapping[str, str]) -> Dist:
    """torch.distributed's variables, else Kubeflow Trainer's torch runtime's (one process per node)."""
    world = _int(environ, ("WORLD_SIZE", "PET_NNODES"), 1)
    rank = _int(environ, ("RANK", "PET_NODE_RANK", "JOB_COMPLETION_INDEX"), 0)
    local_rank = _int(environ, ("LOCAL_RANK",), 0)
    port = _int(environ, ("MASTER_PORT", "PET_MASTER_PORT"), 29500)
    addr = environ.get("MASTER_ADDR") or environ.get("PET_MASTER_ADDR") or "127.0.0.1"
    if world < 1:
        raise UsageProblem(f"the world size must be at least 1, got {world} (WORLD_SIZE or PET_NNODES)")
    if not 0 <= rank < world:
        raise UsageProblem(f"rank {rank} is not in [0, {world}) (RANK or PET_NODE_RANK, WORLD_SIZE)")
    if world > BATCH:
        raise UsageProblem(f"at most {BATCH} ranks share a batch of {BATCH}, got {world}")
    if not 0 < port < 65536:
        raise UsageProblem(f"MASTER_PORT {port} is not a TCP port")
    return Dist(rank, world, local_rank, addr, port)


def incarnation_from(environ: Mapping[str, str]) -> tuple[int, str]:
    """``N`` of ``DISPATCH_EPOCH="N.R"`` (the fencing token) and the epoch's text; 1 when run by hand."""
    text = environ.get("DISPATCH_EPOCH") or "1.0"
    m = re.fullmatch(r"(\d+)\.(\d+)", text)
    if m is None or int(m.group(1)) < 1:
        raise UsageProblem(f'DISPATCH_EPOCH={text!r}: expected "N.R" with N >= 1')
    return int(m.group(1)), text


def checkpoint_dir_from(environ: Mapping[str, str], given: str | None) -> Path | None:
    """``--checkpoint-dir``, else the job's own directory under ``$DISPATCH_CHECKPOINT_DIR`` (each job
    of one job file keeps its own checkpoints), else none."""
    if given:
        return Path(given)
    base = environ.get("DISPATCH_CHECKPOINT_DIR")
    if not base:
        return None
    job = environ.get("DISPATCH_JOB_ID")
    return Path(base) / job if job else Path(base)


# ---------------------------------------------------------------------------------------- the model


@dataclass
class State:
    """Everything a resumed run needs: parameters, optimizer state, and how far it went."""

    params: dict[str, Vector]
    velocity: dict[str, Vector]
    step: int
    loss: float | None = None
    source: int = 0
    """The incarnation whose checkpoint this state came from (0: none, a fresh start)."""

    def flat(self) -> Vector:
        parts = [self.params[n].ravel() for n in PARAMS] + [self.velocity[n].ravel() for n in PARAMS]
        loss = np.nan if self.loss is None else self.loss
        return np.concatenate([np.array([self.step, loss, self.source], dtype=np.float64), *parts])

    @classmethod
    def unflat(cls, vec: Vector) -> State:
        step, loss, source = int(vec[0]), float(vec[1]), int(vec[2])
        at = 3
        tensors: list[Vector] = []
        for _ in range(2):
            for n in PARAMS:
                size = int(np.prod(SHAPES[n]))
                tensors.append(vec[at : at + size].reshape(SHAPES[n]).copy())
                at += size
        params = dict(zip(PARAMS, tensors[: len(PARAMS)], strict=True))
        velocity = dict(zip(PARAMS, tensors[len(PARAMS) :], strict=True))
        return cls(params, velocity, step, None if np.isnan(loss) else loss, source)


def data(seed: int) -> tuple[Vector, Vector]:
    """The data set, a pure function of the seed."""
    rng = np.random.default_rng([seed, 1])
    x = rng.standard_normal((SAMPLES, FEATURES))
    direction = rng.standard_normal((FEATURES, 1))
    y = np.sin(x @ direction) + 0.1 * rng.standard_normal((SAMPLES, 1))
    return x, y


def initial_state(seed: int) -> State:
    rng = np.random.default_rng([seed, 2])
    params = {
        "w1": rng.standard_normal(SHAPES["w1"]) / np.sqrt(FEATURES),
        "b1": np.zeros(SHAPES["b1"]),
        "w2": rng.standard_normal(SHAPES["w2"]) / np.sqrt(HIDDEN),
        "b2": np.zeros(SHAPES["b2"]),
    }
    return State(params, {n: np.zeros(SHAPES[n]) for n in PARAMS}, 0)


def batch_indices(seed: int, step: int) -> NDArray[np.int64]:
    """The samples of step ``step`` (0-based): passes over the data in an order fixed by the seed, so
    the data position is the number of steps taken."""
    per_pass = SAMPLES // BATCH
    order = np.random.default_rng([seed, 3, step // per_pass]).permutation(SAMPLES)
    at = (step % per_pass) * BATCH
    return order[at : at + BATCH].astype(np.int64)


def gradient(params: Mapping[str, Vector], x: Vector, y: Vector) -> tuple[float, dict[str, Vector]]:
    """The summed squared error of ``(x, y)`` and its gradient (sums, not means: ranks add them up)."""
    hidden = np.tanh(x @ params["w1"] + params["b1"])
    err = hidden @ params["w2"] + params["b2"] - y
    d_out = 2.0 * err
    d_hidden = (d_out @ params["w2"].T) * (1.0 - hidden**2)
    grads = {
        "w1": x.T @ d_hidden,
        "b1": d_hidden.sum(axis=0),
        "w2": hidden.T @ d_out,
        "b2": d_out.sum(axis=0),
    }
    return float((err**2).sum()), grads


def apply(state: State, grads: Mapping[str, Vector], count: float) -> None:
    """One SGD-with-momentum update with the mean gradient."""
    for n in PARAMS:
        state.velocity[n] = MOMENTUM * state.velocity[n] + grads[n] / count
        state.params[n] = state.params[n] - LEARNING_RATE * state.velocity[n]


# ----------------------------------------------------------------------------------- checkpoints


def checkpoint_name(incarnation: int, step: int) -> str:
    return f"ckpt-e{incarnation:06d}-s{step:08d}.npz"


def checkpoints(directory: Path) -> list[tuple[int, int, Path]]:
    """``(incarnation, step, path)`` of every checkpoint in ``directory``, oldest first (by incarnation,
    then step: a newer incarnation's checkpoint comes after any older one's, whatever its step)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _NAME.match(name)
        if m:
            found.append((int(m.group(1)), int(m.group(2)), directory / name))
    return sorted(found)


def newer_than(directory: Path, incarnation: int) -> int | None:
    """The newest incarnation above ``incarnation`` that wrote a checkpoint here, if any."""
    newer = [e for e, _, _ in checkpoints(directory) if e > incarnation]
    return max(newer) if newer else None


def fence(directory: Path, incarnation: int) -> None:
    newer = newer_than(directory, incarnation)
    if newer is not None:
        raise Fenced(
            f"incarnation {newer} has written checkpoints in {directory}; this is incarnation {incarnation}, "
            "which must not write there nor go on"
        )


def save(directory: Path, incarnation: int, seed: int, state: State) -> Path:
    """Write ``state`` atomically as this incarnation's checkpoint; :class:`Fenced` when a newer
    incarnation wrote one (checked before writing and again right before the rename; a write that races
    a newer incarnation's anyway cannot shadow it, since the newer incarnation's checkpoints sort last)."""
    directory.mkdir(parents=True, exist_ok=True)
    fence(directory, incarnation)
    final = directory / checkpoint_name(incarnation, state.step)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    meta = {
        "format": FORMAT,
        "incarnation": incarnation,
        "step": state.step,
        "dataPosition": state.step * BATCH,
        "seed": seed,
        "loss": state.loss,
    }
    arrays: dict[str, Any] = {f"param_{n}": state.params[n] for n in PARAMS}
    arrays.update({f"velocity_{n}": state.velocity[n] for n in PARAMS})
    arrays["meta"] = np.array(json.dumps(meta))
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        fence(directory, incarnation)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    own = [p for e, _, p in checkpoints(directory) if e == incarnation]
    for old in own[:-KEEP]:
        old.unlink(missing_ok=True)
    return final


def load(path: Path, seed: int) -> State:
    """A checkpoint's state; ``ValueError`` when it is not one this program (with this seed) wrote."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT}")
        if meta.get("seed") != seed:
            raise ValueError(f"written with seed {meta.get('seed')}, this run has seed {seed}")
        step = int(meta["step"])
        if meta.get("dataPosition") != step * BATCH:
            raise ValueError(f"data position {meta.get('dataPosition')} does not match step {step}")
        params = {n: np.array(z[f"param_{n}"], dtype=np.float64) for n in PARAMS}
        velocity = {n: np.array(z[f"velocity_{n}"], dtype=np.float64) for n in PARAMS}
    for n in PARAMS:
        if params[n].shape != SHAPES[n] or velocity[n].shape != SHAPES[n]:
            raise ValueError(f"{n} has shape {params[n].shape}, expected {SHAPES[n]}")
    loss = meta.get("loss")
    return State(params, velocity, step, None if loss is None else float(loss), int(meta["incarnation"]))


def resume(directory: Path | None, incarnation: int, seed: int, say: Callable[[str], None]) -> State:
    """The newest checkpoint this incarnation may use (its own or an older one's), else a fresh start.
    :class:`Fenced` when a newer incarnation has written here."""
    if directory is None:
        return initial_state(seed)
    fence(directory, incarnation)
    for e, s, path in reversed(checkpoints(directory)):
        try:
            return load(path, seed)
        except (OSError, ValueError, KeyError) as exc:
            say(f"skipping checkpoint {path.name} (incarnation {e}, step {s}): {exc}")
    return initial_state(seed)


# ------------------------------------------------------------------------------------- the exchange


class Group(Protocol):
    """How ranks reach each other: a sum in rank order, and rank 0's vector sent to all."""

    def sum(self, vec: Vector) -> Vector: ...

    def broadcast(self, vec: Vector | None, size: int) -> Vector: ...

    def close(self) -> None: ...


class Alone:
    """A job of one rank."""

    def sum(self, vec: Vector) -> Vector:
        return vec

    def broadcast(self, vec: Vector | None, size: int) -> Vector:
        assert vec is not None
        return vec

    def close(self) -> None:
        pass


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">Q", len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise PeerLost("the connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket, limit: int = 1 << 26) -> bytes:
    (n,) = struct.unpack(">Q", _recv_exact(sock, 8))
    if n > limit:
        raise PeerLost(f"a message of {n} bytes, above the limit of {limit}")
    return _recv_exact(sock, n)


def _vector(payload: bytes, size: int) -> Vector:
    if len(payload) != 8 * size:
        raise PeerLost(f"expected {size} numbers, got {len(payload)} bytes")
    return np.frombuffer(payload, dtype="<f8").astype(np.float64)


class TcpGroup:
    """Rank 0 accepts one connection per other rank; each sum goes through it, in rank order."""

    def __init__(
        self, dist: Dist, epoch: str, timeout: float, stopping: Callable[[], bool], say: Callable[[str], None]
    ) -> None:
        self.dist = dist
        self.peers: dict[int, socket.socket] = {}
        self.master: socket.socket | None = None
        deadline = time.monotonic() + timeout
        hello = {"rank": dist.rank, "world": dist.world, "epoch": epoch}
        if dist.rank == 0:
            self._accept(epoch, deadline, timeout, stopping, say)
        else:
            self._connect(hello, deadline, timeout, stopping)

    def _listen(self, deadline: float, timeout: float, stopping: Callable[[], bool]) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.dist.addr else socket.AF_INET
        last: OSError | None = None
        while True:
            if stopping():
                raise StopRequested
            server = socket.socket(family, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                server.bind(("", self.dist.port))
                server.listen(self.dist.world)
                return server
            except OSError as exc:  # a previous process of this job may still hold the port
                server.close()
                last = exc
            if time.monotonic() > deadline:
                raise PeerLost(
                    f"rank 0 could not listen on port {self.dist.port} within {timeout:g} s: {last}"
                ) from None
            time.sleep(0.2)

    def _accept(
        self,
        epoch: str,
        deadline: float,
        timeout: float,
        stopping: Callable[[], bool],
        say: Callable[[str], None],
    ) -> None:
        server = self._listen(deadline, timeout, stopping)
        server.settimeout(0.2)
        try:
            while len(self.peers) < self.dist.world - 1:
                if stopping():
                    raise StopRequested
                if time.monotonic() > deadline:
                    missing = sorted(set(range(1, self.dist.world)) - set(self.peers))
                    raise PeerLost(
                        f"rank 0: ranks {missing} did not join on port {self.dist.port} within {timeout:g} s"
                    )
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(timeout)
                try:
                    hello = json.loads(_recv(conn, 4096))
                    why = self._refusal(hello, epoch)
                except (OSError, PeerLost, ValueError) as exc:
                    why = f"no greeting ({exc})"
                    hello = {}
                if why:
                    say(f"rank 0: refused a connection: {why}")
                    try:
                        _send(conn, json.dumps({"error": why}).encode())
                    except OSError:
                        pass
                    conn.close()
                    continue
                self.peers[int(hello["rank"])] = conn
            for conn in self.peers.values():
                conn.settimeout(None)
                _send(conn, json.dumps({"ok": True}).encode())
        finally:
            server.close()

    def _refusal(self, hello: Any, epoch: str) -> str | None:
        if not isinstance(hello, dict):
            return "not a greeting"
        rank, world, theirs = hello.get("rank"), hello.get("world"), hello.get("epoch")
        if world != self.dist.world:
            return f"rank {rank} counts {world} ranks, rank 0 counts {self.dist.world}"
        if theirs != epoch:
            return f"rank {rank} belongs to epoch {theirs}, rank 0 to {epoch}"
        if not isinstance(rank, int) or not 0 < rank < self.dist.world:
            return f"rank {rank!r} is not in [1, {self.dist.world})"
        if rank in self.peers:
            return f"rank {rank} already joined"
        return None

    def _connect(
        self, hello: Mapping[str, Any], deadline: float, timeout: float, stopping: Callable[[], bool]
    ) -> None:
        where = f"{self.dist.addr}:{self.dist.port}"
        last: Exception | None = None
        while True:
            if stopping():
                raise StopRequested
            try:
                sock = socket.create_connection((self.dist.addr, self.dist.port), timeout=2.0)
                break
            except OSError as exc:  # refused, unreachable, or a name not resolvable yet: rank 0 starting
                last = exc
            if time.monotonic() > deadline:
                raise PeerLost(
                    f"rank {self.dist.rank} could not reach rank 0 at {where} within {timeout:g} s "
                    f"(last error: {last}); check MASTER_ADDR and MASTER_PORT"
                )
            time.sleep(0.2)
        sock.settimeout(timeout)
        _send(sock, json.dumps(hello).encode())
        answer = json.loads(_recv(sock, 4096))
        if "error" in answer:
            sock.close()
            raise PeerLost(f"rank 0 at {where} refused rank {self.dist.rank}: {answer['error']}")
        sock.settimeout(None)
        self.master = sock

    def sum(self, vec: Vector) -> Vector:
        payload = vec.astype("<f8").tobytes()
        if self.master is not None:
            _send(self.master, payload)
            return _vector(_recv(self.master), vec.size)
        total = vec.copy()
        for rank in sorted(self.peers):  # always rank order: the same sum, bit for bit, every run
            try:
                total = total + _vector(_recv(self.peers[rank]), vec.size)
            except OSError as exc:
                raise PeerLost(f"rank {rank}: {exc}") from None
        out = total.astype("<f8").tobytes()
        for rank in sorted(self.peers):
            try:
                _send(self.peers[rank], out)
            except OSError as exc:
                raise PeerLost(f"rank {rank}: {exc}") from None
        return total

    def broadcast(self, vec: Vector | None, size: int) -> Vector:
        if self.master is not None:
            return _vector(_recv(self.master), size)
        assert vec is not None
        for sock in self.peers.values():
            _send(sock, vec.astype("<f8").tobytes())
        return vec

    def close(self) -> None:
        for sock in [*self.peers.values(), *([self.master] if self.master else [])]:
            sock.close()


class TorchGroup:
    """The same exchange through ``torch.distributed`` (gloo), for a site that has torch."""

    def __init__(self, dist: Dist, timeout: float) -> None:
        import datetime
        import importlib

        self.torch: Any = importlib.import_module("torch")
        self.td: Any = importlib.import_module("torch.distributed")
        self.td.init_process_group(
            "gloo",
            init_method=f"tcp://{dist.addr}:{dist.port}",
            rank=dist.rank,
            world_size=dist.world,
            timeout=datetime.timedelta(seconds=timeout),
        )

    def sum(self, vec: Vector) -> Vector:
        t = self.torch.from_numpy(vec.copy())
        self.td.all_reduce(t)
        return np.asarray(t.numpy(), dtype=np.float64)

    def broadcast(self, vec: Vector | None, size: int) -> Vector:
        t = self.torch.from_numpy(vec.copy() if vec is not None else np.zeros(size))
        self.td.broadcast(t, src=0)
        return np.asarray(t.numpy(), dtype=np.float64)

    def close(self) -> None:
        self.td.destroy_process_group()


# ---------------------------------------------------------------------------------------- training


class StopFlag:
    """SIGTERM sets it; the next exchange tells every rank, and they all stop after the same step."""

    def __init__(self) -> None:
        self.signalled = False

    def __call__(self) -> bool:
        return self.signalled

    def install(self) -> None:
        def handler(signum: int, frame: object) -> None:
            self.signalled = True

        signal.signal(signal.SIGTERM, handler)


def share(dist: Dist, indices: NDArray[np.int64]) -> NDArray[np.int64]:
    """This rank's part of the batch (contiguous, as equal as the sizes allow)."""
    return np.array_split(indices, dist.world)[dist.rank]


def train(
    args: argparse.Namespace, environ: Mapping[str, str], stop: StopFlag, say: Callable[[str], None]
) -> int:
    dist = dist_from(environ)
    incarnation, epoch = incarnation_from(environ)
    directory = checkpoint_dir_from(environ, args.checkpoint_dir)
    x, y = data(args.seed)
    state = resume(directory, incarnation, args.seed, say) if dist.rank == 0 else None
    where = f"{dist.addr}:{dist.port}"
    say(f"rank {dist.rank} of {dist.world} (local rank {dist.local_rank}), epoch {epoch}, rank 0 at {where}")
    if args.backend == "torch":
        group: Group = TorchGroup(dist, args.connect_timeout)
    elif dist.world == 1:
        group = Alone()
    else:
        group = TcpGroup(dist, epoch, args.connect_timeout, stop, say)
    try:
        size = initial_state(args.seed).flat().size
        state = State.unflat(group.broadcast(state.flat() if state is not None else None, size))
        if state.source:
            say(f"resumed from step {state.step} (checkpoint of incarnation {state.source})")
        else:
            say("starting at step 0 (no checkpoint)")
        if directory is None and dist.rank == 0:
            say("no checkpoint directory ($DISPATCH_CHECKPOINT_DIR): nothing is saved")
        return _loop(args, dist, incarnation, directory, group, state, x, y, stop, say)
    finally:
        group.close()


def _loop(
    args: argparse.Namespace,
    dist: Dist,
    incarnation: int,
    directory: Path | None,
    group: Group,
    state: State,
    x: Vector,
    y: Vector,
    stop: StopFlag,
    say: Callable[[str], None],
) -> int:
    saved = state.step

    def checkpoint() -> None:
        nonlocal saved
        if dist.rank == 0 and directory is not None and state.step > saved:
            path = save(directory, incarnation, args.seed, state)
            saved = state.step
            say(f"checkpoint step {state.step} epoch {incarnation}: {path}")

    try:
        while state.step < args.steps:
            if args.step_time > 0:
                time.sleep(args.step_time)  # stands for the real work of a step
            mine = share(dist, batch_indices(args.seed, state.step))
            loss, grads = gradient(state.params, x[mine], y[mine])
            flat = [grads[n].ravel() for n in PARAMS]
            local = np.concatenate([np.array([1.0 if stop() else 0.0, loss, float(mine.size)]), *flat])
            total = group.sum(local)
            stopping, loss_sum, count = total[0] > 0, float(total[1]), float(total[2])
            at, summed = 3, {}
            for n in PARAMS:
                size = int(np.prod(SHAPES[n]))
                summed[n] = total[at : at + size].reshape(SHAPES[n])
                at += size
            apply(state, summed, count)
            state.step += 1
            state.loss = loss_sum / count
            say(f"step {state.step} loss {state.loss!r}")
            if state.step % args.checkpoint_every == 0 or state.step == args.steps:
                checkpoint()
            if stopping:
                checkpoint()
                who = "this rank was" if stop() else "another rank was"
                say(f"stopping after step {state.step}: {who} told to stop (SIGTERM)")
                return EXIT_STOPPED
    except (PeerLost, OSError) as exc:
        if stop():  # told to stop, and a peer went first: keep what was completed
            checkpoint()
            say(f"stopping after step {state.step}: told to stop (SIGTERM); {exc}")
            return EXIT_STOPPED
        checkpoint()
        raise PeerLost(f"rank {dist.rank} lost its peers after step {state.step}: {exc}") from None
    checkpoint()
    say(f"final loss {state.loss!r} (step {state.step})")
    return 0


_OPTIONS: tuple[tuple[str, str, type[int] | type[float], float, str], ...] = (
    # option, variable, type, default, what
    ("--steps", "TRAIN_STEPS", int, 40, "steps in all"),
    ("--checkpoint-every", "TRAIN_CHECKPOINT_EVERY", int, 10, "checkpoint every K steps"),
    ("--seed", "TRAIN_SEED", int, 0, "the seed of the data and of the initial parameters"),
    (
        "--step-time",
        "TRAIN_STEP_TIME",
        float,
        0.0,
        "seconds each step takes at least, standing for real work",
    ),
    ("--connect-timeout", "TRAIN_CONNECT_TIMEOUT", float, 120.0, "seconds the ranks wait for each other"),
)


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """The options, each defaulting to its ``TRAIN_*`` variable; :class:`UsageProblem` for a variable
    that is not a number."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    for option, variable, kind, default, what in _OPTIONS:
        text = environ.get(variable)
        if text:
            try:
                default = kind(text)
            except ValueError:
                expected = "an integer" if kind is int else "a number"
                raise UsageProblem(f"{variable}={text!r}: expected {expected}") from None
        p.add_argument(option, type=kind, default=default, help=f"{what} (${variable}, default {default})")
    p.add_argument("--checkpoint-dir", help="default: $DISPATCH_CHECKPOINT_DIR/$DISPATCH_JOB_ID")
    p.add_argument("--backend", choices=("numpy", "torch"), default=environ.get("TRAIN_BACKEND") or "numpy")
    args = p.parse_args(list(argv))
    if args.steps < 0 or args.checkpoint_every < 1 or args.step_time < 0 or args.connect_timeout <= 0:
        p.error("--steps >= 0, --checkpoint-every >= 1, --step-time >= 0 and --connect-timeout > 0")
    return args


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        args = parse_args(sys.argv[1:] if argv is None else argv, env)
    except UsageProblem as exc:
        print(f"train: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    stop = StopFlag()
    stop.install()
    try:
        code = train(args, env, stop, say)
    except UsageProblem as exc:
        print(f"train: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Fenced as exc:
        print(f"train: fenced: {exc}", file=sys.stderr, flush=True)
        return EXIT_FENCED
    except StopRequested:
        say("stopping before the first step: told to stop (SIGTERM)")
        code = EXIT_STOPPED
    except PeerLost as exc:
        print(f"train: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    if code == EXIT_STOPPED and stop.signalled:
        # End as a process killed by SIGTERM, as a scheduler expects of a task it stopped.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    return code


if __name__ == "__main__":
    sys.exit(main())
