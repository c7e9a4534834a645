"""A fleet of supervisors: 1, 2 and 3 ``Supervisor`` processes on one PostgreSQL store, then one of three
killed; and one supervisor over 100,000 jobs.

Run: ``.venv/bin/python benchmarks/fleet_bench.py [--jobs 10000] [--fleet 1 2 3] [--single 100000]``
from the repository root (needs PostgreSQL's binaries, as the store tests do: tests/records/pgserver.py
starts a throwaway server).

**How several processes share one cluster.** The ``memory`` adapter's cluster lives in one process. So
the cluster runs in a process of its own (``fleet_bench.py cluster``: a ``MemoryBackend`` on the system
clock) and answers the backend protocols (capabilities, start, observe, stop, list, ceased, watch) as
JSON lines over loopback TCP, like an API server; each supervisor process talks to it through
``RemoteBackend`` (one connection for calls, one per watch stream) and prepares locally (``prepare`` is
pure for the memory adapter). A fleet member asks its watch for its share of the jobs
(``dispatch.model.Share``: buckets of job ids) and the cluster process sends it only those changes, as
an API server filters a watch by label selector; a supervisor alone receives every change.

**The work.** ``--jobs`` records are written pending, each with a scripted cause: its first incarnation
runs ``--run`` seconds (default 2, spread ±50 %: short, so that the supervisors, not the jobs, bound
the wall time) and exits 3, which the policy requeues (rule exit_code, max 1, no backoff); the second
runs as long and exits 0. So each job is placed, fails, is requeued, its old incarnation confirmed gone,
placed again and succeeds — all by the supervisors. Then the supervisors start (``--lease`` 10 s, poll
2 s, no cap: they form a fleet and split the jobs by a hash of the job id over the live members).

**API latency.** The cluster process answers each call (start, observe, stop, ceased, list) after
``--api-latency`` seconds, default 5 ms; calls of different supervisors overlap, as on a real API
server, and watch events are not delayed. An in-process memory cluster answers in microseconds, where
a Kubernetes API server takes milliseconds (a GET ~1–5 ms, a create or delete through etcd ~5–20 ms):
without it, the figures would describe a cluster no supervisor meets. It applies alike to 1, 2 and 3
supervisors; ``--api-latency 0`` measures without it.

**Figures.** *events/s*: record transitions written by the supervisors (from the store's history) over
the wall time from their start until every record succeeded, or until ``--cap`` seconds (default 600)
if that comes first: the row then shows fewer than all jobs succeeded, and the rate is over the cap. *requeue latency*: from the transition
recording the failure to the one recording the new incarnation placed, p50/p99 over every job. *kill*:
with 3 supervisors, one is SIGKILLed once a third of the jobs succeeded; its leases expire and the
others take its records over (``dispatch_leases_taken_over_total``, summed); every job must still
succeed. *single*: ``supervisor_bench``'s latency and memory measurements (in-process memory cluster
and store, event → record p99, memory per job) at ``--single`` jobs, and the same latency over a
PostgreSQL store (``single_postgres``: the jobs submitted, leased, then ``--pg-events`` of them ended one
every ``--pg-spacing`` seconds whatever the supervisor is doing). *CPU*: each supervisor's CPU
seconds (its own resource usage), the cluster process's, PostgreSQL's, their sum per transition
("every process"; the ratio of that with 3 supervisors to that with 1 is printed), and how busy the whole
machine was (every process on it: /proc/stat) — so a reader sees whether a ratio is bound by CPU.

Not part of the test suite (speed is measured here, never asserted in tests).
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from dispatch import errors, metrics
from dispatch.backend import Prepared
from dispatch.memory import MemoryBackend, MemorySettings
from dispatch.model import (
    Action,
    Actor,
    Capabilities,
    Cause,
    Change,
    Handle,
    Identity,
    JobRecord,
    JobSpec,
    Observation,
    Policy,
    Rule,
    Share,
    Transition,
)
from dispatch.model._base import decode_text, encode_text
from dispatch.model._decode import STORED_DEPTH
from dispatch.records import PostgresStore
from dispatch.supervise import Supervisor

ROOT = Path(__file__).resolve().parents[1]
POLICY = Policy({Cause.EXIT_CODE: Rule(Action.REQUEUE, max=1, backoff=0.0)})
NAME = "memory"
API_LATENCY = 0.005
"""Default seconds the cluster process waits before each answer (see the module docstring)."""

# --------------------------------------------------------------------------- the cluster process


async def serve_cluster(port_file: str, jobs: int, latency: float) -> None:
    """Host one memory cluster; answer the backend protocols as JSON lines until killed, each call
    after ``latency`` seconds (an API server's time to answer; calls of several clients overlap)."""
    backend = MemoryBackend(
        MemorySettings(
            nodes=min(100_000, 4 * jobs), start_delay=0.0, cessation_delay=0.0, watch_history=20 * jobs
        )
    )

    async def call(req: dict[str, Any]) -> Any:
        op = req["op"]
        if op == "capabilities":
            return (await backend.capabilities()).to_json()
        if op == "start":
            # The object as the client prepared it, as an API server receives it (not rendered again).
            spec, identity = JobSpec.from_json(req["spec"]), Identity.from_json(req["identity"])
            prepared = Prepared(NAME, spec, identity, req["held"], req["request"])
            return (await backend.start(prepared)).to_json()
        if op == "observe":
            return (await backend.observe(Handle.from_json(req["handle"]))).to_json()
        if op == "stop":
            await backend.stop(Handle.from_json(req["handle"]))
            return None
        if op == "ceased":
            return await backend.ceased(Handle.from_json(req["handle"]))
        if op == "list":
            # Each observation encoded straight to its canonical text (not through a dict of it): a
            # listing of 20,000 takes the loop a tenth of the time, as an API server serves a LIST
            # without holding up every other request.
            return msgspec.Raw(b"[" + b",".join(encode_text(o) for o in await backend.list()) + b"]")
        if op == "cluster_id":
            return backend.cluster_id
        raise errors.InvalidError(f"no operation {op!r}", path="op")

    # Each change's line, by cursor, encoded once for every watcher — as an API server's watch cache
    # serializes an event once for all its watchers (k8s.io/apiserver cacher: cachingObject).
    lines: dict[str, bytes] = {}

    def line_of(change: Change) -> bytes:
        line = lines.get(change.cursor)
        if line is None:
            cursor = msgspec.json.encode(change.cursor)
            line = b'{"cursor":%s,"observation":%s}\n' % (cursor, encode_text(change.observation))
            lines[change.cursor] = line
            if len(lines) > 50_000:  # the watchers are seconds behind at most
                del lines[next(iter(lines))]
        return line

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                req = msgspec.json.decode(line)
                if req["op"] == "watch":
                    # A member's share, as a label selector: the cluster sends it only the changes of
                    # its own jobs (an API server filters a watch by label on its side).
                    share = Share.from_json(req["share"]) if req.get("share") is not None else None
                    async for change in backend.watch(req.get("cursor"), share=share):
                        writer.write(line_of(change))
                        await writer.drain()
                    return
                if latency > 0:
                    await asyncio.sleep(latency)
                try:
                    answer: dict[str, Any] = {"ok": await call(req)}
                except errors.DispatchError as exc:
                    answer = {"error": type(exc).__name__, "message": str(exc)}
                writer.write(msgspec.json.encode(answer) + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Only at shutdown: asyncio.run cancels the streams still open. Ending quietly spares the
            # log Python 3.11's stream callback writes for a cancelled handler (fixed in 3.12).
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(client, "127.0.0.1", 0, limit=2**26)
    Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))  # noqa: ASYNC240 - once, at start
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


class _WatchLine(msgspec.Struct):
    cursor: str
    observation: msgspec.Raw  # decoded by the model's own strict decoder


_WATCH_LINE = msgspec.json.Decoder(_WatchLine)


class _ListAnswer(msgspec.Struct):
    ok: list[msgspec.Raw] | None = None  # each decoded by the model's own strict decoder
    error: str | None = None
    message: str = ""


_LIST_ANSWER = msgspec.json.Decoder(_ListAnswer)


def _refusal(name: str, message: str) -> errors.DispatchError:
    """The error the cluster process answered, as the dispatch error of that name."""
    cls: type[errors.DispatchError] = getattr(errors, name, errors.DispatchError)
    return cls(message)


class RemoteBackend:
    """The memory cluster of another process, through the backend protocols (Backend, Watcher,
    CessationSignal). Calls share one connection, one at a time (a supervisor's calls are sequential)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._local = MemoryBackend(MemorySettings(nodes=100_000))  # prepare is pure: done here
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()
        self._caps: Capabilities | None = None
        self._cluster_id: str | None = None

    @property
    def name(self) -> str:
        return NAME

    @property
    def cluster_id(self) -> str:
        assert self._cluster_id is not None, "connect() first"
        return self._cluster_id

    async def connect(self) -> RemoteBackend:
        """Learn the cluster's identity (read once, as an adapter does when it opens)."""
        self._cluster_id = str(await self._call("cluster_id"))
        return self

    async def _call(self, op: str, **args: Any) -> Any:
        answer = msgspec.json.decode(await self._exchange(op, **args))
        if "error" in answer:
            raise _refusal(answer["error"], answer["message"])
        return answer["ok"]

    async def _exchange(self, op: str, **args: Any) -> bytes:
        """Send one call, return its answer's line."""
        async with self._lock:
            if self._conn is None:
                self._conn = await asyncio.open_connection("127.0.0.1", self.port, limit=2**26)
            reader, writer = self._conn
            try:
                writer.write(msgspec.json.encode({"op": op, **args}) + b"\n")
                await writer.drain()
                line = await reader.readline()
            except (ConnectionError, OSError) as exc:
                self._conn = None
                raise errors.UnavailableError(f"memory cluster: {exc}") from None
        if not line:
            self._conn = None
            raise errors.UnavailableError("memory cluster: connection closed")
        return line

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        if self._caps is None:
            self._caps = Capabilities.from_json(await self._call("capabilities"))
        return self._caps

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        return await self._local.prepare(spec, identity, held=held)

    async def start(self, prepared: Prepared) -> Handle:
        prepared.check(NAME)
        body = {
            "spec": prepared.spec.to_json(),
            "identity": prepared.identity.to_json(),
            "held": prepared.held,
            "request": prepared.request,
        }
        return Handle.from_json(await self._call("start", **body))

    async def observe(self, handle: Handle) -> Observation:
        return Observation.from_json(await self._call("observe", handle=handle.to_json()))

    async def stop(self, handle: Handle) -> None:
        await self._call("stop", handle=handle.to_json())

    async def list(self) -> builtins.list[Observation]:
        answer = _LIST_ANSWER.decode(await self._exchange("list"))
        if answer.ok is None:
            raise _refusal(answer.error or "", answer.message)
        return [decode_text(Observation, bytes(o), "observation", max_depth=STORED_DEPTH) for o in answer.ok]

    async def ceased(self, handle: Handle) -> bool:
        return bool(await self._call("ceased", handle=handle.to_json()))

    async def wait_ceased(self, handle: Handle) -> None:
        while not await self.ceased(handle):  # noqa: ASYNC110 - polling the other process is the protocol
            await asyncio.sleep(0.1)

    async def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=2**26)
        try:
            ask = {"op": "watch", "cursor": cursor, "share": share.to_json() if share is not None else None}
            writer.write(msgspec.json.encode(ask) + b"\n")
            await writer.drain()
            while line := await reader.readline():
                got = _WATCH_LINE.decode(line)
                obs = decode_text(Observation, bytes(got.observation), "observation", max_depth=STORED_DEPTH)
                yield Change(obs, got.cursor)
        except (ConnectionError, OSError) as exc:
            raise errors.UnavailableError(f"memory cluster watch: {exc}") from None
        finally:
            writer.close()

    async def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None
        await self._local.close()


# --------------------------------------------------------------------------- a supervisor process


async def supervise(dsn: str, port: int, holder: str, lease: float) -> None:
    """One supervisor until SIGTERM; then print what it counted (and its CPU seconds) as one JSON line."""
    recorder = metrics.enable(daemon="supervisor")
    store = PostgresStore(dsn, max_size=4)
    backend = await RemoteBackend(port).connect()
    sup = Supervisor(backend, store, policy=POLICY, holder=holder, lease=lease, poll=2.0, resync=60.0)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    steps = 0

    async def count(_: Any) -> None:
        nonlocal steps
        steps += 1

    try:
        await sup.run(stop=stop, on_step=count)
    finally:
        await backend.close()
        await store.close()
    text = recorder.exposition().decode()
    takeovers = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dispatch_leases_taken_over_total ")
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    print(json.dumps({"holder": holder, "steps": steps, "takeovers": takeovers, "cpu": cpu}), flush=True)


# --------------------------------------------------------------------------- the driver


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (every core, every process: /proc/stat)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (float(fields[11]) + float(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds a live process, its live children and the children it reaped have used so far:
    PostgreSQL's postmaster and its backends (a backend that exited is counted in its parent's)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += sum(float(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime
    return total


DSN_ENV = "FLEET_BENCH_DSN"
"""How a supervisor process gets the store's URL, password included: in its environment, never on its
command line, where ``ps`` shows it to every user of the machine."""


def _spawn(*args: str, dsn: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, DSN_ENV: dsn} if dsn is not None else None
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _script(i: int, run: float) -> str:
    seconds = run * (0.5 + (i * 7919 % 1000) / 1000)  # spread ±50 %, deterministic
    return f"sleep {seconds:.2f}; env:DISPATCH_EPOCH=1.0: exit 3; exit 0"


async def _write_pending(store: PostgresStore, jobs: int, run: float) -> None:
    now = time.time()
    sem = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        spec = JobSpec(command=("train",), env={"KUBESIM_SCRIPT": _script(i, run)})
        rec = JobRecord(job_id=f"job-{i}", spec=spec, created_at=now, updated_at=now, policy=POLICY)
        async with sem:
            await store.create(rec, Transition(at=now, actor=Actor.USER, what="submitted"))

    await asyncio.gather(*(one(i) for i in range(jobs)))


async def _succeeded(dsn: str) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT count(*) FROM dispatch_records WHERE state = 'succeeded'")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _transitions(dsn: str) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT count(*) FROM dispatch_history")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _requeue_latencies(store: PostgresStore, jobs: int) -> list[float]:
    out: list[float] = []
    for i in range(jobs):
        history = await store.history(f"job-{i}")
        failed = next((t.at for t in history if t.state is not None and t.state.value == "failed"), None)
        placed = [t.at for t in history if t.what == "started"]
        if failed is not None and len(placed) >= 2:
            out.append(placed[1] - failed)
    return out


async def fleet(
    pg: Any, n: int, jobs: int, run: float, lease: float, kill: bool, latency: float, cap: float
) -> dict[str, Any]:
    db = f"fleet_{n}{'_kill' if kill else ''}"
    pg.admin(f"CREATE DATABASE {db} OWNER dispatch")
    dsn = pg.dsn(db)
    port_file = Path(tempfile.gettempdir()) / f"dispatch-fleet-cluster-{os.getpid()}.port"
    port_file.unlink(missing_ok=True)
    cluster = _spawn("cluster", "--port-file", str(port_file), "--jobs", str(jobs), "--latency", str(latency))
    sups: list[subprocess.Popen[str]] = []
    try:
        while not port_file.exists() or not port_file.read_text():  # noqa: ASYNC110 - another process writes it
            await asyncio.sleep(0.05)
        port = int(port_file.read_text())
        store = PostgresStore(dsn, max_size=8)
        await _write_pending(store, jobs, run)
        before = await _transitions(dsn)
        postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
        start = time.perf_counter()
        busy0, total0 = _machine_cpu()
        pg0 = _tree_cpu(postmaster)
        for k in range(n):
            args = ["supervise", "--port", str(port), "--holder", f"sup-{k}"]
            args += ["--lease", str(lease)]
            sups.append(_spawn(*args, dsn=dsn))
        killed_at = None
        done = 0
        deadline = start + cap
        while time.perf_counter() < deadline:
            await asyncio.sleep(1.0)
            done = await _succeeded(dsn)
            if kill and killed_at is None and done >= jobs // 3:
                sups[0].send_signal(signal.SIGKILL)
                killed_at = time.perf_counter() - start
            if done >= jobs:
                break
            if all(p.poll() is not None for p in sups):
                print("  every supervisor exited: see their errors above", flush=True)
                break
        took = time.perf_counter() - start
        busy1, total1 = _machine_cpu()
        pg_cpu = _tree_cpu(postmaster) - pg0
        cluster_cpu = _process_cpu(cluster.pid)
        events = await _transitions(dsn) - before
        reports = []
        for p in sups:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            out, _ = p.communicate(timeout=120)
            reports += [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        lat = sorted(await _requeue_latencies(store, jobs))
        await store.close()
    finally:
        cluster.terminate()  # it ends its serving (and writes its profile, if one is asked for)
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for p in [*sups, cluster]:
            if p.poll() is None:
                p.kill()
                p.wait()
        port_file.unlink(missing_ok=True)
    return {
        "supervisors": n,
        "kill": kill,
        "succeeded": done,
        "jobs": jobs,
        "seconds": took,
        "events": events,
        "events_per_s": events / took,
        "requeue_p50_ms": statistics.median(lat) * 1e3 if lat else math.nan,
        "requeue_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3 if lat else math.nan,
        "takeovers": sum(r["takeovers"] for r in reports),
        "cpu": [round(r["cpu"], 1) for r in reports],
        "cluster_cpu": cluster_cpu,
        "postgres_cpu": pg_cpu,
        "machine_busy": (busy1 - busy0) / (total1 - total0),
        "cores": os.cpu_count() or 1,
        "killed_at_s": killed_at,
    }


def _count_calls(store: Any, task: asyncio.Task[Any], calls: dict[str, list[float]]) -> None:
    """Time every store call ``task`` makes from now on, by method and where it was called from."""
    import traceback

    for name in (
        "get",
        "update",
        "acquire_lease",
        "release_lease",
        "renew_leases",
        "held",
        "leasable",
        "heartbeat",
        "records",
        "counts",
    ):
        real = getattr(store, name)

        def timed(real: Any = real, name: str = name) -> Any:
            async def call(*args: Any, **kwargs: Any) -> Any:
                if asyncio.current_task() is not task:
                    return await real(*args, **kwargs)
                ours = [f for f in traceback.extract_stack(limit=14)[:-1] if "/dispatch/" in f.filename]
                where = (
                    name
                    + " < "
                    + " < ".join(f"{Path(f.filename).stem}:{f.name}" for f in reversed(ours[-4:]))
                )
                t0 = time.perf_counter()
                try:
                    return await real(*args, **kwargs)
                finally:
                    calls.setdefault(where, []).append(time.perf_counter() - t0)

            return call

        setattr(store, name, timed())


class _Stalls:
    """Where the event loop stops turning (``FLEET_BENCH_STALLS=1``): a thread notes the loop thread's
    stack whenever the loop has not turned for ``after`` seconds — a sampling profiler of the stalls
    that hold a watch change back, which a profile of total time does not single out."""

    def __init__(self, after: float = 0.08) -> None:
        import collections
        import threading

        self.after = after
        self.turned = time.perf_counter()
        self.seen: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self.follow: asyncio.Task[Any] | None = None
        self.pool: Any = None
        self.trail: collections.deque[tuple[float, str]] = collections.deque(maxlen=20_000)

    async def _tick(self) -> None:
        while not self._stop.is_set():
            self.turned = time.perf_counter()
            if self.follow is not None:  # what the supervisor awaits, every turn: (time, chain)
                chain = self.awaiting(self.follow)
                if self.pool is not None:  # and the pool, when a call waits for a connection
                    stats = self.pool.get_stats()
                    if stats.get("requests_waiting") or not stats.get("pool_available"):
                        chain += f"  [pool {stats.get('pool_size')} open, {stats.get('pool_available')} free, {stats.get('requests_waiting', 0)} waiting]"
                self.trail.append((time.time(), chain))
            await asyncio.sleep(0.01)

    def during(self, start: float, end: float) -> list[tuple[float, str]]:
        """What the supervisor awaited between ``start`` and ``end`` (wall times): each chain seen,
        with the seconds from ``start`` it was first seen, in order (consecutive repeats once)."""
        out: list[tuple[float, str]] = []
        for at, chain in self.trail:
            if start <= at <= end and (not out or out[-1][1] != chain):
                out.append((at - start, chain))
        return out

    def _watch(self) -> None:
        import traceback

        while not self._stop.wait(0.02):
            if time.perf_counter() - self.turned < self.after:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is not None:
                stack = traceback.extract_stack(frame)
                ours = [f for f in stack if "/dispatch/" in f.filename or "fleet_bench" in f.filename]
                where = " < ".join(
                    f"{Path(f.filename).name}:{f.name}:{f.lineno}" for f in reversed(ours[-4:])
                )
                self.seen[where] += 1

    def start(self) -> asyncio.Task[None]:
        self._thread.start()
        return asyncio.get_running_loop().create_task(self._tick())

    @staticmethod
    def awaiting(task: asyncio.Task[Any]) -> str:
        """What ``task`` awaits now: its chain of coroutines, innermost last (ours only)."""
        names: list[str] = []
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None and ("/dispatch/" in frame.f_code.co_filename):
                names.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        return " > ".join(names[-5:])

    def report(self) -> None:
        self._stop.set()
        total = sum(self.seen.values())
        print(f"  loop stalls over {self.after * 1e3:.0f} ms, sampled every 20 ms: {total} samples")
        for where, n in self.seen.most_common(12):
            print(f"    {n:5d}  {where}")


async def single_postgres(pg: Any, jobs: int, events: int, spacing: float) -> None:
    """One supervisor (``Supervisor.run``, watch mode, defaults: poll 2 s, lease 30 s, resync 60 s) over
    ``jobs`` running jobs of an in-process memory cluster (system clock) and a PostgreSQL store. Then
    ``events`` jobs are made to end, one every ``spacing`` seconds whatever the supervisor is doing (so
    some arrive during its scans and resyncs): event -> record is from the end injected to the
    ``succeeded`` transition the supervisor folded (its ``at``, the same host's clock)."""
    from dispatch.cluster import Cluster

    db = f"single_{jobs}"
    pg.admin(f"CREATE DATABASE {db} OWNER dispatch")
    pglog = bool(os.environ.get("FLEET_BENCH_PGLOG"))
    if pglog:  # what PostgreSQL itself says about the slow moments: printed after the measurement
        for setting in (
            "log_min_duration_statement = 100",
            "log_lock_waits = on",
            "deadlock_timeout = '50ms'",
            "log_autovacuum_min_duration = 0",
            "log_checkpoints = on",
        ):
            pg.admin(f"ALTER SYSTEM SET {setting}")
        pg.admin("SELECT pg_reload_conf()")
    backend = MemoryBackend(
        MemorySettings(nodes=jobs, start_delay=0.0, cessation_delay=0.0, watch_history=4 * jobs)
    )
    store = PostgresStore(pg.dsn(db), max_size=8)
    cluster = Cluster(backend, store)
    hang = JobSpec(command=("train",), env={"KUBESIM_SCRIPT": "hang"})
    sem = asyncio.Semaphore(16)
    t0 = time.perf_counter()

    async def submit(i: int) -> None:
        async with sem:
            await cluster.submit(hang, job_id=f"job-{i}")

    await asyncio.gather(*(submit(i) for i in range(jobs)))
    submitted = time.perf_counter() - t0
    sup = cluster.supervisor()
    stop = asyncio.Event()
    loop = asyncio.create_task(sup.run(stop=stop))
    t0 = time.perf_counter()
    while len(sup.leased) < jobs:  # noqa: ASYNC110 - polling is the measurement
        await asyncio.sleep(0.1)
    warm = time.perf_counter() - t0
    # The steady state: past the first scan of every record newly leased (each observed afresh, one at
    # a time) and the first resync after it.
    await asyncio.sleep(sup.resync + 10.0)
    step = max(1, jobs // events)
    injected: dict[str, float] = {}
    doing: dict[str, str] = {}  # what the supervisor awaited when each event came (FLEET_BENCH_STALLS)
    stalls = _Stalls() if os.environ.get("FLEET_BENCH_STALLS") else None
    ticking = stalls.start() if stalls is not None else None
    calls: dict[str, list[float]] = {}  # the supervisor's store calls while measuring: where from -> seconds
    if stalls is not None:
        stalls.follow = loop
        stalls.pool = store._db._pool
        _count_calls(store, loop, calls)
    busy0, total0 = _machine_cpu()
    cpu0 = time.process_time()
    log_from = (pg.root / "log").stat().st_size if pglog else 0
    measuring = time.time()
    for k in range(events):
        jid = f"job-{k * step}"
        rec = await store.get(jid)
        assert rec.handle is not None
        injected[jid] = time.time()
        if stalls is not None:
            doing[jid] = stalls.awaiting(loop)
        await backend.inject(rec.handle, "exit 0")
        await asyncio.sleep(spacing)
    while True:  # every measured record folded
        states = [(await store.get(j)).state.value for j in injected]
        if all(s == "succeeded" for s in states):
            break
        await asyncio.sleep(0.5)
    busy1, total1 = _machine_cpu()
    cpu = time.process_time() - cpu0
    if stalls is not None and ticking is not None:
        stalls.report()
        ticking.cancel()
    stop.set()
    await loop
    samples = []
    for jid, at in injected.items():
        done = next(
            t.at for t in await store.history(jid) if t.state is not None and t.state.value == "succeeded"
        )
        samples.append(done - at)
    if stalls is not None:
        slow = sorted(((s, j) for j, s in zip(injected, samples, strict=True)), reverse=True)[:8]
        print(
            "  the slowest events (seconds into the measurement), and what the supervisor awaited when each came:"
        )
        for lag, jid in slow:
            print(f"    {lag * 1e3:8.1f} ms  at {injected[jid] - measuring:5.1f} s  {doing.get(jid, '?')}")
        lag, jid = slow[0]
        print("  what the supervisor awaited while the slowest event waited (s after it came):")
        for at, chain in stalls.during(injected[jid], injected[jid] + lag)[:40]:
            print(f"    {at:6.3f}  {chain}")
    if calls:
        print("  the supervisor's slowest kinds of store calls while measuring (count, total, slowest):")
        ranked = sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:10]
        for where, took in ranked:
            print(f"    {len(took):6d} {sum(took):7.2f} s {max(took) * 1e3:8.1f} ms  {where}")
    if pglog:
        with (pg.root / "log").open(errors="replace") as f:
            f.seek(log_from)
            said = [line.rstrip()[:300] for line in f if not line.startswith(("\t", " "))]
        print(
            f"  PostgreSQL's log while measuring (from {time.strftime('%H:%M:%S', time.localtime(measuring))}):"
        )
        for line in said[-40:]:
            print(f"    {line}")
    samples.sort()
    took = spacing * events
    p50 = statistics.median(samples) * 1e3
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e3
    print(
        f"  {jobs:>6} jobs: event->record p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  max {samples[-1] * 1e3:7.2f} ms"
        f"  (n={len(samples)} over {took:.0f} s; submitting took {submitted:.0f} s, leasing all {warm:.1f} s; "
        f"this process {cpu / took * 100:.0f} % of a core while measuring; machine "
        f"{100 * (busy1 - busy0) / (total1 - total0):.0f} % busy of {os.cpu_count()} cores)",
        flush=True,
    )
    await cluster.close()


def _all_cpu(r: dict[str, Any]) -> float:
    """CPU seconds per transition of every process of a run: the supervisors, the cluster process and
    PostgreSQL (a killed supervisor's CPU is not reported, so a kill run's figure is short of it)."""
    return float(sum(r["cpu"]) + r["cluster_cpu"] + r["postgres_cpu"]) / max(1, r["events"])


def _row(r: dict[str, Any]) -> str:
    killed = r["killed_at_s"]
    what = f"{r['supervisors']} supervisor(s)" + (
        f", one killed at {killed:.0f} s" if killed is not None else ""
    )
    return (
        f"  {what:<34} {r['succeeded']:>6}/{r['jobs']} succeeded in {r['seconds']:6.1f} s: "
        f"{r['events_per_s']:7.1f} events/s ({r['events']} transitions); requeue p50 "
        f"{r['requeue_p50_ms']:8.1f} ms p99 {r['requeue_p99_ms']:8.1f} ms; lease takeovers {r['takeovers']:.0f}; "
        f"supervisor CPU s {r['cpu']}, cluster process {r['cluster_cpu']:.1f} s, "
        f"PostgreSQL {r['postgres_cpu']:.1f} s; supervisor CPU per transition "
        f"{1e3 * sum(r['cpu']) / max(1, r['events']):.2f} ms, every process {1e3 * _all_cpu(r):.2f} ms; machine "
        f"{100 * r['machine_busy']:.0f} % busy of {r['cores']} cores (every process on it)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--fleet", type=int, nargs="*", default=[1, 2, 3], help="supervisor counts; none: skip"
    )
    parser.add_argument("--run", type=float, default=2.0, help="seconds each incarnation runs (mean)")
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument(
        "--cap",
        type=float,
        default=600.0,
        help="seconds a configuration runs at most (its rate is still measured)",
    )
    parser.add_argument(
        "--api-latency",
        type=float,
        default=API_LATENCY,
        help="seconds the cluster process takes to answer each call (an API server's latency)",
    )
    parser.add_argument("--no-kill", action="store_true", help="skip the run that kills one of three")
    parser.add_argument("--single", type=int, nargs="*", default=[100_000], help="jobs for one supervisor")
    parser.add_argument("--events", type=int, default=200, help="events of the memory-store measurement")
    parser.add_argument(
        "--pg-events", type=int, default=600, help="events of the PostgreSQL measurement (--single)"
    )
    parser.add_argument("--pg-spacing", type=float, default=0.1, help="seconds between two of those events")
    parser.add_argument(
        "--single-store",
        nargs="*",
        choices=("memory", "postgres"),
        default=["memory", "postgres"],
        help="which stores --single measures",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "records"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    pg = None
    if args.fleet or (args.single and "postgres" in args.single_store):
        from pgserver import PgServer, find_bin  # type: ignore[import-not-found]

        bindir = find_bin()
        if bindir is None:
            raise SystemExit("PostgreSQL's binaries were not found (apt-get install postgresql)")
        pg = PgServer.start(bindir)
    try:
        if args.fleet:
            await _fleets(pg, args)
        if args.single and "memory" in args.single_store:
            import supervisor_bench  # type: ignore[import-not-found]

            print("one supervisor (memory adapter, memory store, watch mode):")
            for n in args.single:
                await supervisor_bench.latency(n, args.events, 0.02)
                await supervisor_bench.memory(n)
        if args.single and "postgres" in args.single_store:
            print("one supervisor (memory adapter in process, PostgreSQL store, watch mode):")
            for n in args.single:
                await single_postgres(pg, n, args.pg_events, args.pg_spacing)
    finally:
        if pg is not None:
            pg.stop()


async def _fleets(pg: Any, args: argparse.Namespace) -> None:
    print(f"fleet over one PostgreSQL ({args.jobs} jobs, each placed, failed, requeued, succeeded):")
    rows = []
    for n in args.fleet:
        rows.append(
            await fleet(
                pg,
                n,
                args.jobs,
                args.run,
                args.lease,
                kill=False,
                latency=args.api_latency,
                cap=args.cap,
            )
        )
        print(_row(rows[-1]), flush=True)
    by = {r["supervisors"]: r for r in rows}
    if 1 in by and 3 in by:
        print(
            f"  ratio of 3 to 1 supervisors: events/s {by[3]['events_per_s'] / by[1]['events_per_s']:.2f}; "
            f"CPU per transition, every process {_all_cpu(by[3]) / _all_cpu(by[1]):.3f}"
        )
    if not args.no_kill:
        r = await fleet(
            pg, 3, args.jobs, args.run, args.lease, kill=True, latency=args.api_latency, cap=args.cap
        )
        print(_row(r))
        print(f"  jobs lost: {r['jobs'] - r['succeeded']}")


def _cli() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("cluster", "supervise"):
        p = argparse.ArgumentParser()
        p.add_argument("role")
        p.add_argument("--port-file")
        p.add_argument("--jobs", type=int, default=0)
        p.add_argument("--port", type=int)
        p.add_argument("--holder")
        p.add_argument("--lease", type=float, default=10.0)
        p.add_argument("--latency", type=float, default=0.0)
        a = p.parse_args()
        if a.role == "cluster":
            work: Any = serve_cluster(a.port_file, a.jobs, a.latency)
        else:
            work = supervise(os.environ[DSN_ENV], a.port, a.holder, a.lease)
        dump = os.environ.get("FLEET_BENCH_PROFILE")
        if not dump:
            asyncio.run(work)
            return
        # Where a process's CPU goes: a cProfile dump timed by CPU, not wall time — on a busy machine
        # the wall clock also counts the waits for a core, which no code change here shortens.
        import cProfile

        profile = cProfile.Profile(time.process_time)
        try:
            profile.runcall(asyncio.run, work)
        finally:
            profile.dump_stats(f"{dump}.{a.holder or 'cluster'}")
        return
    asyncio.run(main())


if __name__ == "__main__":
    _cli()
