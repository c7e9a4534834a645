"""Deterministic simulation of the supervisor: ``python -m dispatch.simulate --seeds N [--first S]``.

Each seeded run builds a random workload (jobs, scripts, per-job and cluster policies) on the ``memory``
adapter, then steps one or several :class:`~dispatch.supervise.Supervisor` instances over one store while
the cluster misbehaves: scripted job failures (preemption, node loss, eviction, OOM, exit codes,
timeouts with slow cessation), injected events, API faults (429/500 before a write, lost responses on
create and delete — before or after the write took effect —, failed reads, spurious "gone" readings,
dropped watches, expired cursors) and **supervisor crashes between any two writes** (a crashed
supervisor is dropped without releasing anything and a new one starts from the store). All time comes
from a :class:`~dispatch.clock.ManualClock` and all randomness from the seed, so a seed replays exactly.

The cluster also stops answering for a while (down, a partial answer, an answer that carries errors),
pods take their grace period to terminate, and a failing job reads ``starting`` for a moment before it
fails, as on real controllers.

After every step and at the end the invariants are checked (:mod:`dispatch.invariants`): at most one live incarnation per job; no
two incarnations' compute overlaps; every terminal record has a typed cause; no record is lost; no
acknowledged submission is dropped (every one ends final); every requeue is allowed by the policy
(rule, count, backoff); the history is append-only and explains the record's state and epoch; no state
goes back within an incarnation; no terminal record sits over live compute longer than the stop grace;
an outage concludes nothing (no record lost or cancelled by someone else while its job ran). Each run
reports which fault kinds it hit, so a summary shows every kind exercised. The last
line printed is ``N runs, V violations``; before it, each violation with its seed and the trace lines
that concern it (replay with ``--first SEED --seeds 1 --trace``).
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import importlib
import logging
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from dispatch import decide
from dispatch.backend import Backend, HoldToken, Prepared
from dispatch.clock import Clock, ManualClock
from dispatch.cluster import Cluster
from dispatch.errors import (
    BusyError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.fleet import Fleet, FleetSupervisor, Member, Seat
from dispatch.invariants import Facts, Invariants
from dispatch.memory import MemoryBackend, MemorySettings
from dispatch.memory.cluster import MemoryCluster
from dispatch.model import (
    Absent,
    Action,
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
    State,
    Transition,
)
from dispatch.records import Leasing, Listing, MemoryStore, SqliteStore, Store
from dispatch.supervise import StepReport, Supervisor

__all__ = [
    "ADAPTERS",
    "Crash",
    "Crasher",
    "Faults",
    "FaultyBackend",
    "FaultyStore",
    "Harness",
    "HarnessFactory",
    "MemoryHarness",
    "Result",
    "SkewedClock",
    "load_harness",
    "main",
    "run_seed",
]

T0 = 1_767_225_600.0
FAULT_PHASE = 80.0  # simulated seconds with faults, events and crashes; then they stop
QUIESCE_LIMIT = 1500.0  # simulated seconds within which every job must end final once faults stop


class Crash(Exception):
    """A supervisor killed between two writes (never a DispatchError, so nothing catches it)."""


class Crasher:
    """Counts one supervisor's writes; at the chosen one (before or after it) either raises
    :class:`Crash`, or **pauses** the supervisor mid-step (a process stopped by the OS, a long GC, a
    frozen VM): :attr:`pausing` is set and the write waits for :attr:`wake`, which the run sets only once
    the supervisor's leases have expired and another supervisor may have taken them over (the zombie)."""

    def __init__(self, rng: random.Random, enabled: bool) -> None:
        self.left: int | None = rng.randint(1, 30) if enabled and rng.random() < 0.8 else None
        self.after = rng.random() < 0.5
        self.pause = rng.random() < 0.25
        self.where = ""
        self.pausing = asyncio.Event()
        self.wake = asyncio.Event()

    async def before(self, what: str) -> None:
        await self._tick(what, after=False)

    async def done(self, what: str) -> None:
        await self._tick(what, after=True)

    async def _tick(self, what: str, *, after: bool) -> None:
        if self.left is None or after != self.after:
            return
        self.left -= 1
        if self.left <= 0:
            self.left = None
            self.where = f"{'after' if after else 'before'} {what}"
            if not self.pause:
                raise Crash(self.where)
            self.pausing.set()
            await self.wake.wait()


class Faults:
    """The fault switches of a run (turned off for the quiescent end). ``delay`` moves the whole run's
    time forward (the harness's ``advance``): a slow store or a slow API answer is time that passes for
    everyone while one supervisor waits."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.hits: set[str] = set()
        """The fault kinds this run hit (for the summary: every kind shown exercised by some seed)."""
        self.on = True
        self.write = rng.choice([0.0, 0.1, 0.25])
        self.read = rng.choice([0.0, 0.05, 0.15])
        self.watch = rng.choice([0.0, 0.1, 0.3])
        # Drawn from their own stream, so adding a fault kind leaves the rest of a seed's run as it was.
        more = random.Random(rng.random())
        self.store = more.choice([0.0, 0.0, 0.03, 0.1])  # unavailable, slow, or unknown on commit
        self.latency = more.choice([0.0, 0.05, 0.2])  # an API answer that takes seconds
        self.stale = more.choice([0.0, 0.1, 0.3])  # a list from an earlier moment
        self.disorder = more.choice([0.0, 0.1, 0.3])  # duplicate and out-of-order watch events
        self.later = random.Random(more.random())  # the kinds added since: their own stream again
        self.outage = self.later.choice([0.0, 0.02, 0.05])  # the cluster stops answering for a while
        self.delay: Callable[[float], Awaitable[None]] | None = None

    def hit(self, p: float, kind: str, rng: random.Random | None = None) -> bool:
        """Whether fault ``kind`` (of probability ``p``) strikes now, drawn from ``rng`` (default: the
        run's); the kinds that did are kept."""
        if self.on and p > 0 and (rng or self.rng).random() < p:
            self.hits.add(kind)
            return True
        return False

    async def wait(self, seconds: float) -> None:
        if self.delay is not None:
            await self.delay(seconds)


class SkewedClock:
    """One supervisor's clock: the run's clock plus an offset that may jump (NTP steps, a VM resumed).
    The store judges leases on the run's clock, as a database server judges them on its own."""

    def __init__(self, base: ManualClock, offset: float) -> None:
        self.base = base
        self.offset = offset

    def now(self) -> float:
        return self.base.now() + self.offset

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)


class FaultyStore:
    """A :class:`~dispatch.records.Store` as one supervisor sees it: crash and pause points at its
    writes (:class:`Crasher`), and store faults — unavailable before a call (``UnavailableError``), slow
    (the run's time moves on while the call is in flight), and **unknown on commit**: the write committed
    but the answer was lost (``UnavailableError`` or ``OutcomeUnknownError`` after the fact)."""

    def __init__(
        self, inner: Store, crasher: Crasher | None, faults: Faults, trace: list[str], who: str, clock: Clock
    ) -> None:
        self.inner = inner
        self.crasher = crasher
        self.faults = faults
        self.trace = trace
        self.who = who
        self.clock = clock
        self.blind = False  # a broken variant, in a test only: updates ignore the expected revision

    def _note(self, text: str) -> None:
        self.trace.append(f"t={self.clock.now() - T0:.1f} {self.who}: {text}")

    async def _call(self, what: str, call: Callable[[], Awaitable[Any]], *, write: bool) -> Any:
        f = self.faults
        kind = f.rng.choice(["unavailable", "slow", "unknown"]) if f.hit(f.store, "store") else None
        if kind == "unknown" and not write:
            kind = "unavailable"
        if kind == "unavailable":
            self._note(f"store fault: {what} unavailable")
            raise UnavailableError(f"the store is unavailable (injected, on {what})")
        if kind == "slow":
            seconds = f.rng.choice([1.0, 5.0, 20.0])
            self._note(f"store fault: {what} takes {seconds:g} s")
            await f.wait(seconds)
        if write and self.crasher is not None:
            await self.crasher.before(f"store.{what}")
        out = await call()
        if write and self.crasher is not None:
            await self.crasher.done(f"store.{what}")
        if kind == "unknown":
            self._note(f"store fault: {what} committed, its answer lost")
            error = f.rng.choice([UnavailableError, OutcomeUnknownError])
            raise error(f"the store's answer was lost (injected, on {what}; it committed)")
        return out

    async def create(self, record: JobRecord, transition: Transition) -> JobRecord:
        out: JobRecord = await self._call("create", lambda: self.inner.create(record, transition), write=True)
        return out

    async def get(self, job_id: str) -> JobRecord:
        out: JobRecord = await self._call("get", lambda: self.inner.get(job_id), write=False)
        return out

    async def list(self, *, states: Any = None) -> Listing:
        out: Listing = await self._call("list", lambda: self.inner.list(states=states), write=False)
        return out

    async def update(
        self, record: JobRecord, *, expected_revision: int, transitions: Sequence[Transition] = ()
    ) -> JobRecord:
        async def update() -> JobRecord:
            revision = (await self.inner.get(record.job_id)).revision if self.blind else expected_revision
            return await self.inner.update(record, expected_revision=revision, transitions=transitions)

        out: JobRecord = await self._call("update", update, write=True)
        return out

    async def history(self, job_id: str) -> builtins.list[Transition]:
        out: builtins.list[Transition] = await self._call(
            "history", lambda: self.inner.history(job_id), write=False
        )
        return out

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        out: JobRecord = await self._call(
            "acquire_lease", lambda: self.inner.acquire_lease(job_id, holder, ttl), write=True
        )
        return out

    async def release_lease(self, job_id: str, holder: str) -> JobRecord:
        out: JobRecord = await self._call(
            "release_lease", lambda: self.inner.release_lease(job_id, holder), write=True
        )
        return out

    # Leasing (the fleet's queries): the supervisors of a simulation form a fleet, faults and all.

    async def heartbeat(
        self, group: str, holder: str, ttl: float, *, join: bool = False
    ) -> builtins.list[str]:
        assert isinstance(self.inner, Leasing)
        inner = self.inner
        out: builtins.list[str] = await self._call(
            "heartbeat", lambda: inner.heartbeat(group, holder, ttl, join=join), write=True
        )
        return out

    async def leave(self, group: str, holder: str) -> None:
        assert isinstance(self.inner, Leasing)
        inner = self.inner
        await self._call("leave", lambda: inner.leave(group, holder), write=True)

    async def held(self, holder: str, *, after: str = "", limit: int | None = None) -> dict[str, int]:
        assert isinstance(self.inner, Leasing)
        inner = self.inner
        out: dict[str, int] = await self._call(
            "held", lambda: inner.held(holder, after=after, limit=limit), write=False
        )
        return out

    async def leasable(
        self, holder: str, *, states: Any, limit: int, after: str = "", held: Any = None
    ) -> Listing:
        assert isinstance(self.inner, Leasing)
        inner = self.inner
        out: Listing = await self._call(
            "leasable",
            lambda: inner.leasable(holder, states=states, limit=limit, after=after, held=held),
            write=False,
        )
        return out

    async def records(self, job_ids: Any, *, states: Any = None) -> Listing:
        assert isinstance(self.inner, Leasing)
        inner = self.inner
        ids = builtins.list(job_ids)
        out: Listing = await self._call("records", lambda: inner.records(ids, states=states), write=False)
        return out

    async def counts(self) -> dict[State, int]:
        assert isinstance(self.inner, Leasing)
        inner = self.inner
        out: dict[State, int] = await self._call("counts", inner.counts, write=False)
        return out

    async def renew_leases(
        self, holder: str, ttl: float, job_ids: Any, *, group: str | None = None
    ) -> builtins.list[JobRecord]:
        assert isinstance(self.inner, Leasing)
        inner = self.inner
        ids = builtins.list(job_ids)
        out: builtins.list[JobRecord] = await self._call(
            "renew_leases", lambda: inner.renew_leases(holder, ttl, ids, group=group), write=True
        )
        return out

    async def member_lease(self, group: str, job_id: str, holder: str, ttl: float) -> JobRecord:
        assert isinstance(self.inner, Leasing)
        inner = self.inner
        out: JobRecord = await self._call(
            "member_lease", lambda: inner.member_lease(group, job_id, holder, ttl), write=True
        )
        return out

    async def purge(self, older_than: float) -> int:
        return await self.inner.purge(older_than)

    async def close(self) -> None:
        pass  # the store outlives every supervisor


class FaultyBackend:
    """A backend over a shared :class:`MemoryCluster` that injects API faults and crashes.

    Writes (``start``, ``stop``) may fail before taking effect (429 → ``BusyError``, 500 →
    ``UnavailableError``), lose their response before or after taking effect (``OutcomeUnknownError``),
    or crash the supervisor. Reads may fail (``UnavailableError``) and ``observe`` may once report the
    incarnation gone when it is not (a stale read). Watches drop mid-stream and resume from expired
    cursors (relists)."""

    def __init__(
        self, cluster: MemoryCluster, faults: Faults, crasher: Crasher | None, trace: list[str], who: str
    ) -> None:
        self.inner = MemoryBackend(cluster=cluster)
        self.faults = faults
        self.crasher = crasher
        self.trace = trace
        self.who = who
        self._listed: list[tuple[float, list[Observation]]] = []  # earlier lists, for stale answers

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def cluster_id(self) -> str:
        return self.inner.cluster_id

    def _note(self, text: str) -> None:
        self.trace.append(f"t={self.inner.cluster.clock.now() - T0:.1f} {self.who}: {text}")

    async def _write_fault(self, what: str) -> str | None:
        f = self.faults
        if f.hit(f.latency, "latency"):
            seconds = f.rng.choice([0.5, 3.0, 15.0])
            self._note(f"fault: {what} takes {seconds:g} s")
            await f.wait(seconds)
        if not f.hit(f.write, "write"):
            return None
        kind = f.rng.choice(["429", "500", "lost-before", "lost-after"])
        self._note(f"fault {kind} on {what}")
        if kind == "429":
            raise BusyError(f"{what}: 429 Too Many Requests (injected)")
        if kind == "500":
            raise UnavailableError(f"{what}: 500 Internal Server Error (injected)")
        if kind == "lost-before":
            raise OutcomeUnknownError(f"{what}: the response was lost (injected, not applied)")
        return kind

    async def _read_fault(self, what: str) -> None:
        f = self.faults
        if f.hit(f.latency, "latency"):
            seconds = f.rng.choice([0.5, 3.0, 15.0])
            self._note(f"fault: {what} answers after {seconds:g} s")
            await f.wait(seconds)
        if f.hit(f.read, "read"):
            self._note(f"fault 500 on {what}")
            raise UnavailableError(f"{what}: 500 Internal Server Error (injected)")

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return await self.inner.capabilities(spec)

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        return await self.inner.prepare(spec, identity, held=held)

    async def start(self, prepared: Prepared) -> Handle:
        what = f"start {prepared.identity}"
        if self.crasher is not None:
            await self.crasher.before(what)
        kind = await self._write_fault(what)
        handle = await self.inner.start(prepared)
        if self.crasher is not None:
            await self.crasher.done(what)
        if kind == "lost-after":
            raise OutcomeUnknownError(f"{what}: the response was lost (injected, applied)")
        return handle

    async def stop(self, handle: Handle) -> None:
        what = f"stop {handle.identity}"
        if self.crasher is not None:
            await self.crasher.before(what)
        kind = await self._write_fault(what)
        await self.inner.stop(handle)
        if self.crasher is not None:
            await self.crasher.done(what)
        if kind == "lost-after":
            raise OutcomeUnknownError(f"{what}: the response was lost (injected, applied)")

    async def observe(self, handle: Handle) -> Observation | Absent:
        await self._read_fault(f"observe {handle.identity}")
        obs = await self.inner.observe(handle)
        f = self.faults
        if f.hit(f.read, "absent") and isinstance(obs, Observation) and not obs.outcome.terminal:
            self._note(f"fault: stale read shows {handle.identity} absent")
            return Absent(handle, obs.at)
        return obs

    async def list(self) -> list[Observation]:
        await self._read_fault("list")
        listed = await self.inner.list()
        now = self.inner.cluster.clock.now()
        self._listed = [(at, old) for at, old in self._listed[-4:] if now - at <= 30.0] + [(now, listed)]
        f = self.faults
        if len(self._listed) > 1 and f.hit(f.stale, "stale list"):
            # A list from a lagging replica: what every object was at an earlier moment, and what has gone
            # since still there. Never without an object that exists now: a loss is confirmed by absence
            # from a fresh list, so Backend.list must be complete (Kubernetes: a quorum read).
            at, old = f.rng.choice(self._listed[:-1])
            self._note(f"fault: stale list from t={at - T0:.1f}")
            earlier = {o.handle.identity: o for o in old}
            now_ids = {o.handle.identity for o in listed}
            gone = [o for o in old if o.handle.identity not in now_ids]
            return [earlier.get(o.handle.identity, o) for o in listed] + gone
        return listed

    async def close(self) -> None:
        await self.inner.close()

    async def hold(self, handle: Handle) -> HoldToken:
        return await self.inner.hold(handle)

    async def release(self, handle: Handle, token: HoldToken) -> None:
        await self.inner.release(handle, token)

    def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        return self._watch(cursor, share)

    async def _watch(self, cursor: str | None, share: Share | None) -> AsyncIterator[Change]:
        f = self.faults
        if cursor is not None and f.hit(f.watch, "expired cursor"):
            self._note("fault: watch cursor expired (relist)")
            cursor = None
        inner = self.inner.watch(cursor, share=share)
        held: Change | None = None  # a change delivered after the next one (out of order)
        try:
            async for change in inner:
                if f.hit(f.watch / 4, "dropped watch"):
                    self._note("fault: watch dropped")
                    raise UnavailableError("the watch connection dropped (injected)")
                if held is None and f.hit(f.disorder, "disorder"):
                    if f.rng.random() < 0.5:
                        self._note(f"fault: watch event of {change.handle.identity} twice")
                        yield change
                    else:
                        self._note(f"fault: watch event of {change.handle.identity} late")
                        held = change
                        continue
                yield change
                if held is not None:
                    yield held
                    held = None
        finally:
            await inner.aclose()  # type: ignore[attr-defined]

    async def ceased(self, handle: Handle) -> bool:
        await self._read_fault(f"ceased {handle.identity}")
        return await self.inner.ceased(handle)

    async def wait_ceased(self, handle: Handle) -> None:
        await self.inner.wait_ceased(handle)

    def native_name(self, identity: Identity) -> str:
        return self.inner.native_name(identity)

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        return self.inner.identity_of(obj)


# ---------------------------------------------------------------------------------------- harnesses


class Members(Protocol):
    """A harness of a fleet of clusters (SPEC §15), beside what every harness does."""

    clusters: tuple[str, ...]

    async def open_member(self, name: str, faults: Faults, crasher: Crasher | None, who: str) -> Backend:
        """A writable backend on the fleet's cluster ``name``."""


class Harness(Facts, Protocol):
    """The cluster side of one seeded run (see docs/supervisor.md, "Harnesses").

    A harness owns the simulated cluster on the run's :class:`ManualClock`: it opens writable backends on
    it (with the run's API faults and a supervisor's crash points), builds job specs for it, injects the
    scripted cluster events, moves time and reports the facts the invariants are checked against."""

    name: str
    nodes: int

    async def start(self) -> None:
        """Bring the cluster up (before any backend is opened)."""

    async def open(self, faults: Faults, crasher: Crasher | None, who: str) -> Backend:
        """A writable backend on the cluster for ``who`` (a supervisor life, or the user)."""

    def spec(self, script: str, nodes: int, time_limit: int | None) -> JobSpec:
        """A job of ``nodes`` nodes whose every node runs the behaviour ``script``."""

    async def events(self, rng: random.Random, faults: Faults) -> None:
        """Maybe inject a cluster event (and API faults the cluster itself injects) this step."""

    async def disappear(self) -> None:
        """Preempt every incarnation that runs, then remove every object from the cluster (the evidence
        of why each ended disappears before anyone reads it)."""

    async def advance(self, seconds: float) -> None:
        """Move the cluster's and the run's clock forward."""

    async def close(self) -> None:
        """Tear the cluster down."""


HarnessFactory = Callable[[random.Random, ManualClock, list[str]], Harness]
"""Builds the harness of one run from the run's random source, clock and trace."""


class MemoryHarness:
    """The ``memory`` adapter's :class:`MemoryCluster`, with :class:`FaultyBackend` for API faults."""

    name = "memory"
    others_stop = False  # a vanished job is gone at once: absent, then lost
    clusters: tuple[str, ...] = ()

    def __init__(
        self, rng: random.Random, clock: ManualClock, trace: list[str], *, index: int = 0, label: str = ""
    ) -> None:
        self.label = label  # the cluster's name in a fleet's trace lines
        self.clock = clock
        self.trace = trace
        self.settings = MemorySettings(
            nodes=rng.choice([2, 3, 4]),
            start_delay=rng.choice([0.0, 1.0, 3.0]),
            cessation_delay=rng.choice([0.0, 2.0, 10.0]),
            watch_history=rng.choice([3, 20, 10_000]),
        )
        self.nodes = self.settings.nodes
        self.cluster = MemoryCluster(self.settings, clock=clock, rng=random.Random(index))

    async def start(self) -> None:
        pass

    async def open(self, faults: Faults, crasher: Crasher | None, who: str) -> Backend:
        return FaultyBackend(self.cluster, faults, crasher, self.trace, who)

    async def open_member(self, name: str, faults: Faults, crasher: Crasher | None, who: str) -> Backend:
        raise InvalidError(f"one cluster, not a fleet: no member {name!r}", path="cluster")

    @property
    def who(self) -> str:
        return f"cluster {self.label}" if self.label else "cluster"

    def spec(self, script: str, nodes: int, time_limit: int | None) -> JobSpec:
        return JobSpec(command=("train",), nodes=nodes, env={"KUBESIM_SCRIPT": script}, time_limit=time_limit)

    async def events(self, rng: random.Random, faults: Faults) -> None:
        if self.cluster.answering() is None and faults.hit(faults.outage, "outage", faults.later):
            how = faults.later.choice(["down", "partial", "errors"])
            seconds = faults.later.choice([2.0, 10.0, 40.0])
            self.trace.append(f"t={self.clock.now() - T0:.1f} {self.who}: OUTAGE ({how}) for {seconds:g} s")
            self.cluster.outage(seconds, how)
            faults.hits.add(f"outage {how}")
        if rng.random() < 0.15:
            live = [o for o in self._truth() if o.state in (State.STARTING, State.RUNNING)]
            if live:
                obs = rng.choice(live)
                event = rng.choice(
                    ["preempt", "lose-node", "evict", "oom", "exit 0", "exit 2", "slow-stop 20", "vanish"]
                )
                if event == "slow-stop 20" and faults.later.random() < 0.3:
                    # Compute that would stay after the job ends until someone stops it (pods of a job
                    # that failed for its configuration; a Trainer re-creating a JobSet).
                    event = "slow-stop 900"
                    faults.hits.add("compute left behind")
                self.trace.append(f"t={self.clock.now() - T0:.1f} {self.who}: {event} {obs.handle.identity}")
                backend = MemoryBackend(cluster=self.cluster)
                if event == "vanish":
                    await backend.vanish(obs.handle)
                else:
                    await backend.inject(obs.handle, event)

    def _truth(self) -> list[Observation]:
        """What the cluster holds, read past any outage (the run's view, not a client's)."""
        now = self.cluster.sync()
        jobs = sorted(self.cluster.timeline.jobs.values(), key=lambda j: j.seq)
        return [Observation(j.handle, self.cluster.outcome_of(j), now) for j in jobs]

    async def disappear(self) -> None:
        backend = MemoryBackend(cluster=self.cluster)
        self.cluster.outage(0)  # the objects are removed by the cluster's owner, not read by a client
        for obs in self._truth():
            if obs.state in (State.STARTING, State.RUNNING):
                await backend.inject(obs.handle, "preempt")
            self.trace.append(
                f"t={self.clock.now() - T0:.1f} {self.who}: preempted, then gone: {obs.handle.identity}"
            )
            await backend.vanish(obs.handle)

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def live(self) -> list[Identity]:
        return [j.identity for j in self.cluster.timeline.jobs.values() if j.live]

    def on_cluster(self) -> set[Identity]:
        return {j.identity for j in self.cluster.timeline.jobs.values()}

    def with_compute(self) -> set[Identity]:
        return {j.identity for j in self.cluster.timeline.jobs.values() if j.nodes}

    def created(self, job_id: str) -> list[Identity]:
        return [j.identity for j in self.cluster.timeline.incarnations.get(job_id, [])]

    def overlaps(self) -> list[tuple[str, str]]:
        return [
            (ov.running.job_id, f"{ov.started} started while {ov.running} had compute")
            for ov in self.cluster.overlaps
        ]

    async def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------- workload

_CAUSES = [
    Cause.PREEMPTED,
    Cause.EVICTED,
    Cause.NODE_LOST,
    Cause.OUT_OF_MEMORY,
    Cause.EXIT_CODE,
    Cause.TIMEOUT,
]


def _policy(rng: random.Random) -> Policy:
    rules: dict[Cause, Rule] = {}
    for cause in _CAUSES:
        roll = rng.random()
        if roll < 0.5:
            rules[cause] = Rule(
                Action.REQUEUE,
                max=rng.randint(0, 3),
                backoff=rng.choice([0.0, 1.0, 5.0, 20.0]),
                backoff_cap=40.0,
            )
        elif roll < 0.6:
            rules[cause] = Rule(Action.HOLD)
        elif roll < 0.8:
            rules[cause] = Rule(Action.FAIL)
    return Policy(rules)


def _script(rng: random.Random) -> tuple[str, int | None]:
    a, b = rng.choice([0, 1, 3, 8]), rng.choice([1, 2, 5])
    first = "env:DISPATCH_EPOCH=1.0: "
    choices: list[tuple[str, int | None]] = [
        (f"sleep {a}; exit 0", None),
        (f"{first}sleep {a}; {first}preempt; sleep {b}; exit 0", None),
        (f"sleep {a}; preempt", None),
        (f"sleep {a}; rank=0: oom; sleep {b}; exit 0", None),
        (f"sleep {a}; exit {rng.choice([1, 3, 42])}", None),
        (f"{first}sleep {a}; {first}lose-node; sleep {b}; exit 0", None),
        (f"sleep {a}; evict", None),
        (f"slow-stop {rng.choice([3, 15, 40])}; hang", rng.choice([5, 10])),
        (f"slow-stop {rng.choice([3, 15])}; sleep {a + 30}; exit 0", None),
    ]
    return rng.choice(choices)


_ACTION_HITS = (
    ("the first other cluster that takes it", "placed elsewhere"),
    ("queued without capacity for", "given up for capacity"),
    (": waits (no cluster", "no cluster takes it"),
)
"""Supervisor actions counted with the fault kinds a run hit (what a fleet's runs must exercise)."""

Process = Supervisor | FleetSupervisor
"""A supervisor process of a run: of one cluster, or of a fleet of clusters."""


async def _close(process: Process | Cluster | Fleet) -> None:
    """Close a process's connections to the cluster(s) (not the store: the run closes it)."""
    if isinstance(process, Supervisor | Cluster):
        await process.backend.close()
        return
    fleet = process.fleet if isinstance(process, FleetSupervisor) else process
    for m in fleet.members:
        if m.cluster is not None:
            await m.cluster.backend.close()


@dataclass
class Result:
    """One run: its seed, the violations found (each with the trace lines that concern it)."""

    seed: int
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    steps: int = 0
    hits: frozenset[str] = frozenset()
    """The fault kinds the run hit."""


class _User:
    """The user's side of a run: the jobs submitted (each acknowledged once its record exists), and the
    other operations — cancel, hold (released later), resubmit, purge, forget the gone cluster's record —
    through the user's own :class:`Cluster` or :class:`Fleet` (``client``, opened by the run)."""

    def __init__(
        self,
        submits: list[tuple[float, str, JobSpec, Policy | None]],
        *,
        ops: bool,
        orphan: str | None,
        extra: random.Random,
        invariants: Invariants,
        note: Callable[[str], None],
    ) -> None:
        self.submits = submits
        self.ops = ops  # user operations: hold/release, resubmit, purge
        self.orphan = orphan  # a record of a gone cluster: forget it
        self.extra = extra
        self.invariants = invariants
        self.note = note
        self.client: Cluster | Fleet | None = None
        self.store: Store = MemoryStore()
        self.acked: set[str] = set()
        self.held: dict[str, float] = {}  # job id -> when the user releases it
        self.purged: set[str] = set()

    def opened(self, client: Cluster | Fleet, store: Store) -> None:
        self.client, self.store = client, store

    async def cancel_one(self, rng: random.Random) -> None:
        """Now and then, cancel one of the jobs."""
        assert self.client is not None
        if rng.random() < 0.03 and self.acked - self.purged:
            job_id = rng.choice(sorted(self.acked - self.purged))
            await self._do(f"cancel {job_id}", self.client.cancel(job_id))

    async def submissions(self, now: float) -> None:
        """Submit each job whose time has come and that is not acknowledged yet."""
        assert self.client is not None
        for at, job_id, spec, own in self.submits:
            if job_id in self.acked or now < T0 + at:
                continue
            try:
                await self.client.submit(spec, job_id=job_id, policy=own)
                self.note(f"user: submitted {job_id}")
            except DispatchError as exc:
                self.note(f"user: submit {job_id}: {type(exc).__name__}: {exc}")
            try:
                await self.store.get(job_id)
                self.acked.add(job_id)  # the record exists: the submission was acknowledged
            except DispatchError:
                pass

    async def _do(self, what: str, call: Awaitable[Any]) -> bool:
        self.note(f"user: {what}")
        try:
            await call
        except DispatchError as exc:
            self.note(f"user: {what}: {type(exc).__name__}: {exc}")
            return False
        return True

    async def _record(self, job_id: str) -> JobRecord | None:
        try:
            return await self.store.get(job_id)
        except NotFoundError:  # purged (a terminal record, even one held)
            return None

    async def operations(self, now: float, quiet: bool) -> None:
        """The user's other operations: hold (released later), resubmit a finished job, purge finished
        records, forget the gone cluster's record."""
        user, extra = self.client, self.extra
        assert user is not None
        for job_id, at in sorted(self.held.items()):
            if now >= at or quiet:
                if await self._do(f"release {job_id}", user.release(job_id)):
                    del self.held[job_id]
                else:
                    rec = await self._record(job_id)
                    if rec is None or rec.outcome.terminal or rec.hold_token is None:
                        del self.held[job_id]  # it ended (or was purged): nothing to release
        orphan = self.orphan
        if orphan is not None and (quiet or extra.random() < 0.02):
            forgotten = await self._do(f"forget {orphan}", user.forget(orphan, "its cluster is gone"))
            self.orphan = None if forgotten else orphan
        if not self.ops or quiet:
            return
        mine = sorted(self.acked - self.purged)
        roll = extra.random()
        if roll < 0.02 and mine:
            job_id = extra.choice(mine)
            if job_id not in self.held:
                await self._do(f"hold {job_id}", user.hold(job_id))
                # Held even when the read after the hold failed: the user sees it and releases it later.
                rec = await self._record(job_id)
                if rec is not None and rec.hold_token is not None:
                    self.held[job_id] = now + extra.choice([1.0, 10.0, 40.0])
        elif roll < 0.04 and mine:
            job_id = extra.choice(mine)
            await self._do(f"resubmit {job_id}", user.resubmit(job_id, wait=0))
        elif roll < 0.05:
            before = {r.job_id: r for r in await self.store.list()}
            cutoff = now - extra.choice([0.0, 10.0, 30.0])
            if await self._do(f"purge older than t={cutoff - T0:.1f}", user.purge(cutoff)):
                after = {r.job_id for r in await self.store.list()}
                for job_id, rec in before.items():
                    if job_id not in after:
                        # SPEC §6: purge deletes terminal records, even one its policy would requeue.
                        if not rec.outcome.terminal:
                            self.invariants.violate(
                                job_id, f"{job_id}: purge deleted a {rec.state.value} record"
                            )
                        self.purged.add(job_id)
                        self.invariants.forget(job_id)
                        self.note(f"user: purged {job_id}")


class _Run:
    def __init__(
        self, seed: int, harness: HarnessFactory, *, lease_check: bool = True, store: str | None = None
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        rng = self.rng
        # The fault kinds added later draw from their own stream, so the earlier kinds of a seed still
        # play out as they did (the regression seeds keep their meaning).
        self.extra = random.Random(seed * 1_000_003 + 17)
        extra = self.extra
        # Names and nonces (supervisors', records') from a stream of their own, so they replay exactly
        # and draw nothing from the streams above.
        self.names = random.Random(seed * 7_919 + 5)
        self.clock = ManualClock(T0)
        self.trace: list[str] = []
        self.cluster = harness(rng, self.clock, self.trace)
        # A fleet's cluster names (a harness of one cluster, such as the Kubeflow one, may not say).
        self.fleet: tuple[str, ...] = tuple(getattr(self.cluster, "clusters", ()))
        self.store_kind = store if store is not None else extra.choice(["memory"] * 19 + ["sqlite"])
        self.store: Store = MemoryStore(self.clock)
        self._dir: Path | None = None
        self.faults = Faults(rng)
        self.faults.delay = self._delay
        # A harness may shape the policies (a fleet's requeues go elsewhere), from a stream of its own.
        shape: Callable[[Policy], Policy] = getattr(self.cluster, "shape", lambda p: p)
        self.policy = shape(_policy(rng))
        self.crashes = rng.random() < 0.85
        self.supervisors: list[Process | None] = []
        self.crashers: list[Crasher | None] = []
        self.planned: list[tuple[Crasher, int | None] | None] = []  # a life drawn, its backend not yet open
        self.generation: list[int] = []
        self.restart_at: list[float] = []
        self.lease = rng.choice([10.0, 30.0])
        self.poll = rng.choice([0.0, 1.0, 4.0])
        self.resync = rng.choice([0.0, 5.0, 30.0])
        self.lease_check = lease_check  # False only in a test: the zombie's writes go unchecked
        self.zombies: list[tuple[Process, asyncio.Future[StepReport], Crasher, float]] = []
        self.skewed = extra.random() < 0.5  # supervisors' clocks disagree with the store's, and jump
        for i in range(rng.choice([1, 1, 2, 3])):
            self.supervisors.append(None)
            self.crashers.append(None)
            self.planned.append(None)
            self.generation.append(0)
            self.restart_at.append(0.0)
            self._plan(i)
        submits: list[tuple[float, str, JobSpec, Policy | None]] = []
        for j in range(rng.randint(1, 5)):
            script, limit = _script(rng)
            spec = self.cluster.spec(script, rng.randint(1, min(2, self.cluster.nodes)), limit)
            own = shape(_policy(rng)) if rng.random() < 0.3 else None
            submits.append((rng.choice([0.0, 0.0, 5.0, 20.0]), f"job-{j}", spec, own))
        # A long absence of every supervisor, while the cluster preempts and its evidence disappears.
        self.absence: tuple[float, float] | None = (
            (T0 + extra.uniform(5.0, 60.0), extra.choice([120.0, 300.0, 900.0]))
            if extra.random() < 0.15
            else None
        )
        self.back_at = T0  # when the supervisors came back from their long absence
        # job id -> the last time no running supervisor could take it: each was at its capacity with
        # other jobs (a supervisor with a capacity leaves the rest to others; here there may be none).
        self.unattended: dict[str, float] = {}
        ops = extra.random() < 0.5
        orphan = "orphan-0" if extra.random() < 0.15 else None
        self.corrupt = "corrupt-0" if self.store_kind == "sqlite" and extra.random() < 0.5 else None
        self.corrupt_reported = False
        self.invariants = Invariants(
            self.cluster, self.clock, policy=self.policy, lease=self.lease, poll=self.poll, note=self.note
        )
        self.side = _User(
            submits, ops=ops, orphan=orphan, extra=extra, invariants=self.invariants, note=self.note
        )
        self.steps = 0

    def note(self, text: str) -> None:
        self.trace.append(f"t={self.clock.now() - T0:.1f} {text}")

    async def _delay(self, seconds: float) -> None:
        await self.cluster.advance(seconds)

    def _plan(self, i: int) -> None:
        """Draw supervisor ``i``'s next life (its crash point and capacity); :meth:`_open` starts it."""
        self.generation[i] += 1
        crasher = Crasher(self.rng, self.crashes)
        self.planned[i] = (crasher, self.rng.choice([None, None, 1, 2]))
        self.note(f"s{i}.{self.generation[i]}: started")

    async def _open(self, i: int) -> None:
        planned = self.planned[i]
        assert planned is not None
        self.planned[i] = None
        crasher, capacity = planned
        holder = f"s{i}.{self.generation[i]}"
        offset = self.extra.uniform(-self.lease / 4, self.lease / 4) if self.skewed else 0.0
        clock = SkewedClock(self.clock, offset)
        if offset:
            self.note(f"{holder}: clock off by {offset:+.1f} s")
        self.crashers[i] = crasher
        store = FaultyStore(self.store, crasher, self.faults, self.trace, holder, self.clock)
        options: dict[str, Any] = {
            "holder": holder,
            "lease": self.lease,
            "poll": self.poll,
            "resync": self.resync,
            "capacity": capacity,
        }
        if self.fleet:
            fleet = await self._fleet(crasher, holder, store, clock)
            self.supervisors[i] = fleet.supervisor(rng=random.Random(self.names.random()), **options)
            return
        self.supervisors[i] = Supervisor(
            await self.cluster.open(self.faults, crasher, holder),
            store,
            policy=self.policy,
            clock=clock,
            rng=random.Random(self.names.random()),
            **options,
        )

    async def _fleet(self, crasher: Crasher | None, who: str, store: Store, clock: Clock) -> Fleet:
        """The fleet of clusters ``who`` opens (every cluster of the harness), over ``store``."""
        members = []
        for name in self.fleet:
            backend = await cast(Members, self.cluster).open_member(name, self.faults, crasher, who)
            cluster = Cluster(
                backend, store, policy=self.policy, clock=clock, rng=random.Random(self.names.random())
            )
            members.append(Member(Seat(name, checkpoints="shared"), cluster))
        return Fleet(members, store, policy=self.policy, clock=clock, rng=random.Random(self.names.random()))

    async def run(self) -> Result:
        await self.cluster.start()
        try:
            if self.store_kind == "sqlite":
                self._dir = Path(tempfile.mkdtemp(prefix="dispatch-sim-store-"))
                self.store = SqliteStore(self._dir / "records.db", clock=self.clock)
            self.note(f"store: {self.store_kind}")
            user: Cluster | Fleet
            if self.fleet:
                user = await self._fleet(None, "user", self.store, self.clock)
            else:
                user = Cluster(
                    await self.cluster.open(self.faults, None, "user"),
                    self.store,
                    policy=self.policy,
                    clock=self.clock,
                    rng=random.Random(self.names.random()),
                )
            self.side.opened(user, self.store)
            await self._plant(user)
            return await self._run()
        finally:
            for _, task, crasher, _ in self.zombies:
                task.cancel()
                crasher.wake.set()
                await asyncio.gather(task, return_exceptions=True)
            for sup in [*self.supervisors, *(z[0] for z in self.zombies)]:
                if sup is not None:
                    await _close(sup)
            if self.side.client is not None:
                await _close(self.side.client)
            await self.cluster.close()
            await self.store.close()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    async def _plant(self, user: Cluster | Fleet) -> None:
        """The records no submission makes: one of a cluster that is gone (for ``forget``), and one
        whose row is corrupt (SQLite: every supervisor must report it and go on with the others)."""
        spec = self.cluster.spec("sleep 1; exit 0", 1, None)
        here = user.cluster_id if isinstance(user, Cluster) else user.members[0].seat.identity
        planted = [(self.side.orphan, "gone-cluster"), (self.corrupt, here)]
        for job_id, cluster in planted:
            if job_id is None:
                continue
            record, first = decide.submitted(
                job_id, spec, policy=None, held=False, now=self.clock.now(), cluster=cluster
            )
            await self.store.create(record, first)
            self.note(f"user: planted {job_id} (cluster {cluster})")
        if self.corrupt is not None and self._dir is not None:
            conn = sqlite3.connect(self._dir / "records.db")
            with conn:
                conn.execute(
                    "UPDATE records SET body = '{\"not\": a record' WHERE job_id = ?", (self.corrupt,)
                )
            conn.close()
            self.note(f"user: corrupted the row of {self.corrupt}")

    async def _step(self, i: int, sup: Process, now: float) -> StepReport | None:
        """One step of supervisor ``i``, or ``None`` when it crashed or paused mid-step (a zombie)."""
        crasher = self.crashers[i]
        assert crasher is not None
        task = asyncio.ensure_future(sup.step())
        paused = asyncio.ensure_future(crasher.pausing.wait())
        await asyncio.wait({task, paused}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            # Paused past its lease: another life starts at once (the orchestrator saw it hang) and takes
            # the records over once the leases expire; this one wakes later and finishes its step.
            wake_at = now + self.lease + self.extra.choice([1.0, 10.0, 60.0])
            self.note(f"{sup.holder}: PAUSED {crasher.where} until t={wake_at - T0:.1f}")
            self.zombies.append((sup, task, crasher, wake_at))
            self.supervisors[i] = None
            self.restart_at[i] = now
            return None
        paused.cancel()
        try:
            return task.result()
        except Crash as crash:
            self.note(f"{sup.holder}: CRASH {crash}")
            await _close(sup)  # the process died: its connections with it
            self.supervisors[i] = None
            self.restart_at[i] = now + self.rng.choice([0.0, 5.0, 40.0])
        except DispatchError as exc:
            # What Supervisor.run does with a step that failed (the store went away): try again later.
            return StepReport(errors=[f"the step failed: {type(exc).__name__}: {exc}"])
        except Exception as exc:
            self.invariants.violate("", f"{sup.holder} raised {type(exc).__name__}: {exc}")
            await _close(sup)
            self.supervisors[i] = None
            self.restart_at[i] = now
        return None

    async def _wake(self, now: float) -> None:
        """Wake the zombies whose time has come: each finishes the step it was in, then is stopped."""
        for z in [z for z in self.zombies if z[3] <= now]:
            self.zombies.remove(z)
            sup, task, crasher, _ = z
            self.note(f"{sup.holder}: WAKES (its leases have expired)")
            if not self.lease_check:
                # The deliberately broken variant: the zombie's writes are neither checked against its
                # lease nor compared-and-swapped (the write computed before the pause lands as is).
                assert isinstance(sup, Supervisor), "the broken variant runs on one cluster"
                sup._writer.holder = None
                cast(FaultyStore, sup.store).blind = True
            crasher.wake.set()
            try:
                report = await task
            except DispatchError as exc:
                self.note(f"{sup.holder}: the step failed: {type(exc).__name__}: {exc}")
            except Exception as exc:
                self.invariants.violate("", f"{sup.holder} (woken) raised {type(exc).__name__}: {exc}")
            else:
                self._noted(sup, report)
            await _close(sup)
            await self._check()

    def _noted(self, sup: Process, report: StepReport) -> None:
        for a in report.actions:
            self.note(f"{sup.holder}: {a}")
            for words, hit in _ACTION_HITS:
                if words in a:
                    self.faults.hits.add(hit)
        for e in report.errors:
            self.note(f"{sup.holder}: error {e}")
        for u in report.unreadable:  # named once per supervisor, apart from the errors of its actions
            self.note(f"{sup.holder}: skipped {u}")
            if self.corrupt is not None and self.corrupt in u:
                self.corrupt_reported = True

    async def _absent(self, now: float) -> None:
        """Every supervisor goes away for a long time; meanwhile the cluster preempts what runs and the
        objects disappear, so nobody ever reads why they ended."""
        assert self.absence is not None
        length = self.absence[1]
        self.absence = None
        self.back_at = now + length
        self.note(f"every supervisor is gone for {length:g} s")
        for i, sup in enumerate(self.supervisors):
            if sup is not None:
                await _close(sup)
                self.supervisors[i] = None
            self.planned[i] = None
            self.restart_at[i] = now + length
        await self.cluster.disappear()

    async def _run(self) -> Result:
        rng = self.rng
        end_faults = T0 + FAULT_PHASE
        for i, planned in enumerate(self.planned):
            if planned is not None:
                await self._open(i)
        while True:
            now = self.clock.now()
            quiet = now >= end_faults
            if quiet and self.faults.on:
                self.faults.on = False
                self.crashes = False
                self.note("faults, events and crashes stop")
            await self.side.submissions(now)
            if not quiet:
                await self._events()
            if self.absence is not None and now >= self.absence[0]:
                await self._absent(now)
            await self.side.operations(now, quiet)
            await self._wake(now)
            for i, sup in enumerate(self.supervisors):
                if sup is None:
                    if now >= self.restart_at[i]:
                        self._plan(i)
                        await self._open(i)
                    continue
                if self.skewed and not quiet and self.extra.random() < 0.02:
                    clock = cast(SkewedClock, sup.clock)
                    jump = self.extra.choice([-self.lease / 4, self.lease / 4, 2 * self.lease])
                    clock.offset = min(max(clock.offset + jump, -self.lease / 4), 2 * self.lease)
                    self.note(f"{sup.holder}: clock jumps {jump:+.1f} s (off by {clock.offset:+.1f} s)")
                report = await self._step(i, sup, now)
                if report is None:
                    continue
                self.steps += 1
                self._noted(sup, report)
                await self._check()
            done = (
                quiet
                and len(self.side.acked) == len(self.side.submits)
                and not self.zombies
                and not self.side.held
            )
            if done and await self._all_final():
                break
            if now - T0 > FAULT_PHASE + QUIESCE_LIMIT:
                for rec in await self.store.list():
                    if not decide.final(rec, self.policy, now):
                        self.invariants.violate(
                            rec.job_id, f"{rec.job_id} never ended: {rec.outcome} epoch {rec.epoch}"
                        )
                break
            await self.cluster.advance(rng.choice([0.5, 1.0, 2.0, 5.0]) if not quiet else 2.0)
        await self._check(final=True)
        if self.corrupt is not None and not self.corrupt_reported and self.steps:
            self.invariants.violate(
                self.corrupt, f"{self.corrupt}: its row is corrupt, and no supervisor reported it"
            )
        return Result(
            self.seed, self.invariants.report(self.trace), self.trace, self.steps, frozenset(self.faults.hits)
        )

    async def _events(self) -> None:
        await self.cluster.events(self.rng, self.faults)
        await self.side.cancel_one(self.rng)

    async def _check(self, *, final: bool = False) -> None:
        now = self.clock.now()
        running = [sup for sup in self.supervisors if sup is not None]
        full = [sup.leased for sup in running if sup.capacity is not None and len(sup.leased) >= sup.capacity]
        if running and len(full) == len(running):
            for rec in await self.store.list():
                if not any(rec.job_id in leased for leased in full):
                    self.unattended[rec.job_id] = now
        await self.invariants.check(
            self.store,
            acked=self.side.acked,
            purged=self.side.purged,
            back_at=self.back_at,
            unattended=self.unattended,
            final=final,
        )

    async def _all_final(self) -> bool:
        now = self.clock.now()
        for rec in await self.store.list():
            if not decide.final(rec, self.policy, now):
                return False
        return not self.cluster.live()


ADAPTERS = {
    "memory": "dispatch.simulate:MemoryHarness",
    "kubeflow": "kubeflow_sim_harness:KubeflowHarness",
    "fleet": "dispatch.simulate_fleet:FleetHarness",
}
"""The harness each ``--adapter`` names. The Kubeflow one drives kubesim, which ``dispatch`` may not import
(tests/test_layout.py): it lives beside the Kubeflow tests, in tests/kubeflow/kubeflow_sim_harness.py."""

HARNESS_DIRS = ("tests/kubeflow",)
"""Where a harness module not importable as is is looked for, relative to the working directory (the
repository root: the Kubeflow harness is test code, not part of any installed package)."""


def load_harness(name: str) -> HarnessFactory:
    """The harness factory ``name`` designates: an adapter name of :data:`ADAPTERS`, or ``module:attr``
    (the module imported as is, else from :data:`HARNESS_DIRS`)."""
    target = ADAPTERS.get(name, name)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        allowed = ", ".join(ADAPTERS)
        raise InvalidError(f"expected an adapter ({allowed}) or module:attr, got {name!r}", path="harness")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise UnsupportedError(
                f"harness {target!r} needs {exc.name!r}, which is not installed (the dev extra has it)"
            ) from None
        found = [d for d in HARNESS_DIRS if (Path(d) / f"{module_name}.py").is_file()]
        if not found:
            where = ", ".join(HARNESS_DIRS)
            raise UnsupportedError(
                f"harness module {module_name!r} is not importable, nor in {where} under {Path.cwd()} "
                "(run from the repository root)"
            ) from None
        sys.path.insert(0, str(Path(found[0]).resolve()))
        module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InvalidError(f"{module_name} has no harness {attr!r}", path="harness")
    return cast(HarnessFactory, factory)


async def run_seed(
    seed: int, adapter: str | HarnessFactory = "memory", *, lease_check: bool = True, store: str | None = None
) -> Result:
    """Run seed ``seed`` on ``adapter`` (a name of :data:`ADAPTERS`, ``module:attr``, or a harness
    factory) and return what it found. ``store``: ``memory`` or ``sqlite`` instead of the seed's draw.
    ``lease_check=False`` is a deliberately broken variant for tests: a supervisor woken after a pause
    past its lease writes without the lease check and without compare-and-swap."""
    harness = load_harness(adapter) if isinstance(adapter, str) else adapter
    return await _Run(seed, harness, lease_check=lease_check, store=store).run()


def main(argv: list[str] | None = None) -> int:
    """The command line: run the seeds, print violations, end with ``N runs, V violations``."""
    parser = argparse.ArgumentParser(prog="python -m dispatch.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeded runs")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--adapter", choices=sorted(ADAPTERS), default="memory")
    parser.add_argument(
        "--harness", metavar="MODULE:ATTR", help="any importable harness factory (overrides --adapter)"
    )
    parser.add_argument("--trace", action="store_true", help="print every run's whole trace")
    args = parser.parse_args(argv)
    if args.seeds < 0:
        parser.error("--seeds must be >= 0")
    # The supervisors' warnings are in each run's trace already; unhandled, logging would print them.
    logging.getLogger("dispatch").addHandler(logging.NullHandler())
    started = time.perf_counter()
    violations = 0
    hits: dict[str, int] = {}
    try:
        harness = load_harness(args.harness or args.adapter)
    except DispatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for seed in range(args.first, args.first + args.seeds):
        try:
            result = asyncio.run(run_seed(seed, harness))
        except DispatchError as exc:
            print(f"error: seed {seed}: {exc}", file=sys.stderr)
            return 2
        if args.trace:
            print(f"--- seed {seed}")
            print("\n".join(result.trace))
        for v in result.violations:
            violations += 1
            print(f"seed {seed}: {v}")
        for kind in result.hits:
            hits[kind] = hits.get(kind, 0) + 1
    took = time.perf_counter() - started
    print(f"({took:.1f} s)", file=sys.stderr)
    print("fault kinds hit (runs): " + ", ".join(f"{k} {n}" for k, n in sorted(hits.items())))
    print(f"{args.seeds} runs, {violations} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
