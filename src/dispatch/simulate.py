"""Deterministic simulation of the supervisor: ``python -m dispatch.simulate --seeds N [--first S]``.

Each seeded run builds a random workload (jobs, scripts, per-job and cluster policies) on the ``memory``
adapter, then steps one or several :class:`~dispatch.supervise.Supervisor` instances over one store while
the cluster misbehaves: scripted job failures (preemption, node loss, eviction, OOM, exit codes,
timeouts with slow cessation), injected events, API faults (429/500 before a write, lost responses on
create and delete — before or after the write took effect —, failed reads, spurious "gone" readings,
dropped watches, expired cursors) and **supervisor crashes between any two writes** (a crashed
supervisor is dropped without releasing anything and a new one starts from the store). All time comes
from a :class:`~dispatch.clock.ManualClock` and all randomness from the seed, so a seed replays exactly.

After every step and at the end the invariants are checked: at most one live incarnation per job; no
two incarnations' compute overlaps; every terminal record has a typed cause; no record is lost; no
acknowledged submission is dropped (every one ends final); every requeue is allowed by the policy
(rule, count, backoff); the history is append-only and explains the record's state and epoch. The last
line printed is ``N runs, V violations``; before it, each violation with its seed and the trace lines
that concern it (replay with ``--first SEED --seeds 1 --trace``).
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import random
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatch import decide
from dispatch.backend import HoldToken, Prepared
from dispatch.clock import ManualClock
from dispatch.cluster import Cluster
from dispatch.errors import BusyError, DispatchError, OutcomeUnknownError, UnavailableError, UnsupportedError
from dispatch.memory import MemoryBackend, MemorySettings
from dispatch.memory.cluster import MemoryCluster
from dispatch.model import (
    Action,
    Capabilities,
    Cause,
    Change,
    Handle,
    Identity,
    JobRecord,
    JobSpec,
    Observation,
    Outcome,
    Policy,
    Rule,
    State,
    Transition,
)
from dispatch.records import MemoryStore
from dispatch.supervise import Supervisor

__all__ = ["Crash", "FaultyBackend", "Result", "main", "run_seed"]

T0 = 1_767_225_600.0
FAULT_PHASE = 80.0  # simulated seconds with faults, events and crashes; then they stop
QUIESCE_LIMIT = 1500.0  # simulated seconds within which every job must end final once faults stop


class Crash(Exception):
    """A supervisor killed between two writes (never a DispatchError, so nothing catches it)."""


class Crasher:
    """Counts one supervisor's writes; raises :class:`Crash` at the chosen one (before or after it)."""

    def __init__(self, rng: random.Random, enabled: bool) -> None:
        self.left: int | None = rng.randint(1, 30) if enabled and rng.random() < 0.8 else None
        self.after = rng.random() < 0.5
        self.where = ""

    def before(self, what: str) -> None:
        self._tick(what, after=False)

    def done(self, what: str) -> None:
        self._tick(what, after=True)

    def _tick(self, what: str, *, after: bool) -> None:
        if self.left is None or after != self.after:
            return
        self.left -= 1
        if self.left <= 0:
            self.left = None
            self.where = f"{'after' if after else 'before'} {what}"
            raise Crash(self.where)


class Faults:
    """The fault switches of a run (turned off for the quiescent end)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.on = True
        self.write = rng.choice([0.0, 0.1, 0.25])
        self.read = rng.choice([0.0, 0.05, 0.15])
        self.watch = rng.choice([0.0, 0.1, 0.3])

    def hit(self, p: float) -> bool:
        return self.on and p > 0 and self.rng.random() < p


class CrashingStore:
    """A :class:`~dispatch.records.Store` that crashes its supervisor at a chosen write."""

    def __init__(self, inner: MemoryStore, crasher: Crasher, trace: list[str]) -> None:
        self.inner = inner
        self.crasher = crasher

    async def create(self, record: JobRecord, transition: Transition) -> JobRecord:
        self.crasher.before("store.create")
        out = await self.inner.create(record, transition)
        self.crasher.done("store.create")
        return out

    async def get(self, job_id: str) -> JobRecord:
        return await self.inner.get(job_id)

    async def list(self, *, states: Any = None) -> list[JobRecord]:
        return await self.inner.list(states=states)

    async def update(
        self, record: JobRecord, *, expected_revision: int, transitions: Sequence[Transition] = ()
    ) -> JobRecord:
        self.crasher.before("store.update")
        out = await self.inner.update(record, expected_revision=expected_revision, transitions=transitions)
        self.crasher.done("store.update")
        return out

    async def history(self, job_id: str) -> builtins.list[Transition]:
        return await self.inner.history(job_id)

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        self.crasher.before("store.acquire_lease")
        out = await self.inner.acquire_lease(job_id, holder, ttl)
        self.crasher.done("store.acquire_lease")
        return out

    async def release_lease(self, job_id: str, holder: str) -> JobRecord:
        self.crasher.before("store.release_lease")
        out = await self.inner.release_lease(job_id, holder)
        self.crasher.done("store.release_lease")
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

    @property
    def name(self) -> str:
        return self.inner.name

    def _note(self, text: str) -> None:
        self.trace.append(f"t={self.inner.cluster.clock.now() - T0:.1f} {self.who}: {text}")

    def _write_fault(self, what: str) -> str | None:
        f = self.faults
        if not f.hit(f.write):
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

    def _read_fault(self, what: str) -> None:
        f = self.faults
        if f.hit(f.read):
            self._note(f"fault 500 on {what}")
            raise UnavailableError(f"{what}: 500 Internal Server Error (injected)")

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return await self.inner.capabilities(spec)

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        return await self.inner.prepare(spec, identity, held=held)

    async def start(self, prepared: Prepared) -> Handle:
        what = f"start {prepared.identity}"
        if self.crasher is not None:
            self.crasher.before(what)
        kind = self._write_fault(what)
        handle = await self.inner.start(prepared)
        if self.crasher is not None:
            self.crasher.done(what)
        if kind == "lost-after":
            raise OutcomeUnknownError(f"{what}: the response was lost (injected, applied)")
        return handle

    async def stop(self, handle: Handle) -> None:
        what = f"stop {handle.identity}"
        if self.crasher is not None:
            self.crasher.before(what)
        kind = self._write_fault(what)
        await self.inner.stop(handle)
        if self.crasher is not None:
            self.crasher.done(what)
        if kind == "lost-after":
            raise OutcomeUnknownError(f"{what}: the response was lost (injected, applied)")

    async def observe(self, handle: Handle) -> Observation:
        self._read_fault(f"observe {handle.identity}")
        obs = await self.inner.observe(handle)
        f = self.faults
        if f.hit(f.read) and not obs.outcome.terminal:
            self._note(f"fault: stale read shows {handle.identity} gone")
            return Observation(handle, Outcome(State.LOST, Cause.UNKNOWN), obs.at)
        return obs

    async def list(self) -> list[Observation]:
        self._read_fault("list")
        return await self.inner.list()

    async def close(self) -> None:
        await self.inner.close()

    async def hold(self, handle: Handle) -> HoldToken:
        return await self.inner.hold(handle)

    async def release(self, handle: Handle, token: HoldToken) -> None:
        await self.inner.release(handle, token)

    def watch(self, cursor: str | None = None) -> AsyncIterator[Change]:
        return self._watch(cursor)

    async def _watch(self, cursor: str | None) -> AsyncIterator[Change]:
        f = self.faults
        if cursor is not None and f.hit(f.watch):
            self._note("fault: watch cursor expired (relist)")
            cursor = None
        inner = self.inner.watch(cursor)
        try:
            async for change in inner:
                if f.hit(f.watch / 4):
                    self._note("fault: watch dropped")
                    raise UnavailableError("the watch connection dropped (injected)")
                yield change
        finally:
            await inner.aclose()  # type: ignore[attr-defined]

    async def ceased(self, handle: Handle) -> bool:
        self._read_fault(f"ceased {handle.identity}")
        return await self.inner.ceased(handle)

    async def wait_ceased(self, handle: Handle) -> None:
        await self.inner.wait_ceased(handle)

    def native_name(self, identity: Identity) -> str:
        return self.inner.native_name(identity)

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        return self.inner.identity_of(obj)


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


@dataclass
class Result:
    """One run: its seed, the violations found (each with the trace lines that concern it)."""

    seed: int
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    steps: int = 0


class _Run:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        rng = self.rng
        self.clock = ManualClock(T0)
        self.trace: list[str] = []
        self.settings = MemorySettings(
            nodes=rng.choice([2, 3, 4]),
            start_delay=rng.choice([0.0, 1.0, 3.0]),
            cessation_delay=rng.choice([0.0, 2.0, 10.0]),
            watch_history=rng.choice([3, 20, 10_000]),
        )
        self.cluster = MemoryCluster(self.settings, clock=self.clock)
        self.store = MemoryStore(self.clock)
        self.faults = Faults(rng)
        self.policy = _policy(rng)
        self.crashes = rng.random() < 0.85
        self.user = Cluster(
            FaultyBackend(self.cluster, self.faults, None, self.trace, "user"),
            self.store,
            policy=self.policy,
            clock=self.clock,
        )
        self.supervisors: list[Supervisor | None] = []
        self.generation: list[int] = []
        self.restart_at: list[float] = []
        self.lease = rng.choice([10.0, 30.0])
        self.poll = rng.choice([0.0, 1.0, 4.0])
        self.resync = rng.choice([0.0, 5.0, 30.0])
        for i in range(rng.choice([1, 1, 2, 3])):
            self.supervisors.append(None)
            self.generation.append(0)
            self.restart_at.append(0.0)
            self._restart(i)
        self.acked: set[str] = set()
        self.submits: list[tuple[float, str, JobSpec, Policy | None]] = []
        for j in range(rng.randint(1, 5)):
            script, limit = _script(rng)
            spec = JobSpec(
                command=("train",),
                nodes=rng.randint(1, min(2, self.settings.nodes)),
                env={"KUBESIM_SCRIPT": script},
                time_limit=limit,
            )
            own = _policy(rng) if rng.random() < 0.3 else None
            self.submits.append((rng.choice([0.0, 0.0, 5.0, 20.0]), f"job-{j}", spec, own))
        self.histories: dict[str, list[Transition]] = {}
        self.violations: list[tuple[str, str]] = []  # (job id or "", message)
        self.steps = 0

    def note(self, text: str) -> None:
        self.trace.append(f"t={self.clock.now() - T0:.1f} {text}")

    def _restart(self, i: int) -> None:
        self.generation[i] += 1
        holder = f"s{i}.{self.generation[i]}"
        crasher = Crasher(self.rng, self.crashes)
        self.supervisors[i] = Supervisor(
            FaultyBackend(self.cluster, self.faults, crasher, self.trace, holder),
            CrashingStore(self.store, crasher, self.trace),
            policy=self.policy,
            clock=self.clock,
            holder=holder,
            lease=self.lease,
            poll=self.poll,
            resync=self.resync,
            capacity=self.rng.choice([None, None, 1, 2]),
        )
        self.note(f"{holder}: started")

    async def run(self) -> Result:
        rng = self.rng
        end_faults = T0 + FAULT_PHASE
        while True:
            now = self.clock.now()
            quiet = now >= end_faults
            if quiet and self.faults.on:
                self.faults.on = False
                self.crashes = False
                self.note("faults, events and crashes stop")
            await self._submissions(now)
            if not quiet:
                await self._events()
            for i, sup in enumerate(self.supervisors):
                if sup is None:
                    if now >= self.restart_at[i]:
                        self._restart(i)
                    continue
                try:
                    report = await sup.step()
                except Crash as crash:
                    self.note(f"{sup.holder}: CRASH {crash}")
                    self.supervisors[i] = None
                    self.restart_at[i] = now + rng.choice([0.0, 5.0, 40.0])
                    continue
                except Exception as exc:
                    self._violate("", f"{sup.holder} raised {type(exc).__name__}: {exc}")
                    self.supervisors[i] = None
                    self.restart_at[i] = now
                    continue
                self.steps += 1
                for a in report.actions:
                    self.note(f"{sup.holder}: {a}")
                for e in report.errors:
                    self.note(f"{sup.holder}: error {e}")
                await self._check()
            if quiet and len(self.acked) == len(self.submits) and await self._all_final():
                break
            if now - T0 > FAULT_PHASE + QUIESCE_LIMIT:
                for rec in await self.store.list():
                    if not decide.final(rec, self.policy, now):
                        self._violate(
                            rec.job_id, f"{rec.job_id} never ended: {rec.outcome} epoch {rec.epoch}"
                        )
                break
            self.clock.advance(rng.choice([0.5, 1.0, 2.0, 5.0]) if not quiet else 2.0)
        await self._check(final=True)
        return Result(self.seed, self._report(), self.trace, self.steps)

    async def _submissions(self, now: float) -> None:
        for at, job_id, spec, own in self.submits:
            if job_id in self.acked or now < T0 + at:
                continue
            try:
                await self.user.submit(spec, job_id=job_id, policy=own)
                self.note(f"user: submitted {job_id}")
            except DispatchError as exc:
                self.note(f"user: submit {job_id}: {type(exc).__name__}: {exc}")
            try:
                await self.store.get(job_id)
                self.acked.add(job_id)  # the record exists: the submission was acknowledged
            except DispatchError:
                pass

    async def _events(self) -> None:
        rng = self.rng
        if rng.random() < 0.15:
            live = [o for o in self.cluster.observations() if o.state in (State.STARTING, State.RUNNING)]
            if live:
                obs = rng.choice(live)
                event = rng.choice(
                    ["preempt", "lose-node", "evict", "oom", "exit 0", "exit 2", "slow-stop 20", "vanish"]
                )
                self.note(f"cluster: {event} {obs.handle.identity}")
                backend = MemoryBackend(cluster=self.cluster)
                if event == "vanish":
                    await backend.vanish(obs.handle)
                else:
                    await backend.inject(obs.handle, event)
        if rng.random() < 0.03 and self.acked:
            job_id = rng.choice(sorted(self.acked))
            self.note(f"user: cancel {job_id}")
            try:
                await self.user.cancel(job_id)
            except DispatchError as exc:
                self.note(f"user: cancel {job_id}: {type(exc).__name__}: {exc}")

    async def _all_final(self) -> bool:
        now = self.clock.now()
        for rec in await self.store.list():
            if not decide.final(rec, self.policy, now):
                return False
        return not any(
            o.state not in (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.LOST)
            for o in self.cluster.observations()
        )

    def _violate(self, job_id: str, message: str) -> None:
        if (job_id, message) not in self.violations:
            self.violations.append((job_id, message))
            self.note(f"VIOLATION {message}")

    async def _check(self, *, final: bool = False) -> None:
        now = self.clock.now()
        live: dict[str, list[Identity]] = {}
        for obs in self.cluster.observations():
            if not obs.outcome.terminal:
                live.setdefault(obs.handle.identity.job_id, []).append(obs.handle.identity)
        for job_id, idents in live.items():
            if len(idents) > 1:
                self._violate(
                    job_id, f"{job_id}: {len(idents)} live incarnations: {', '.join(map(str, idents))}"
                )
        for ov in self.cluster.overlaps:
            self._violate(
                ov.running.job_id, f"compute overlap: {ov.started} started while {ov.running} had compute"
            )
        records = {r.job_id: r for r in await self.store.list()}
        on_cluster = {o.handle.identity for o in self.cluster.observations()}
        for rec in records.values():
            if rec.state is State.LOST and Identity(rec.job_id, rec.epoch) in on_cluster:
                self._violate(
                    rec.job_id, f"{rec.job_id}: recorded lost, but {rec.job_id}@{rec.epoch} is on the cluster"
                )
        for job_id in self.acked:
            if job_id not in records:
                self._violate(job_id, f"{job_id}: acknowledged, but its record is gone")
        for job_id, rec in records.items():
            self._check_record(rec, await self.store.history(job_id), final=final, now=now)

    def _check_record(self, rec: JobRecord, history: list[Transition], *, final: bool, now: float) -> None:
        jid = rec.job_id
        old = self.histories.get(jid, [])
        if history[: len(old)] != old:
            self._violate(jid, f"{jid}: history rewritten (was {len(old)} entries)")
        self.histories[jid] = history
        o = rec.outcome
        if o.terminal:
            typed = {
                State.SUCCEEDED: o.cause is Cause.NONE,
                State.CANCELLED: o.cause is Cause.CANCELLED,
                State.FAILED: o.cause is not Cause.NONE,
                State.LOST: True,
            }[o.state]
            if not typed:
                self._violate(jid, f"{jid}: terminal {o.state.value} with cause {o.cause.value}")
        stateful = [t for t in history if t.state is not None]
        last = stateful[-1] if stateful else None
        if last is None or last.state is not rec.state or (last.cause or Cause.NONE) is not o.cause:
            shown = f"{last.state}/{last.cause}" if last is not None else "nothing"
            self._violate(jid, f"{jid}: record {rec.state.value}/{o.cause.value} but history says {shown}")
        epochs = [t.epoch for t in history if t.epoch is not None]
        if not epochs or epochs[-1] != rec.epoch:
            self._violate(jid, f"{jid}: record epoch {rec.epoch} not explained by its history")
        policy = rec.policy if rec.policy is not None else self.policy
        for i, t in enumerate(history):
            if t.what != "requeued":
                continue
            before = [p for p in history[:i] if p.state is not None]
            cause = before[-1].cause if before else None
            prev_epoch = next((p.epoch for p in reversed(history[:i]) if p.epoch is not None), None)
            rule = policy.rule_for(cause) if cause is not None else None
            assert t.epoch is not None
            if rule is None or rule.action is not Action.REQUEUE or t.epoch.r > rule.max:
                self._violate(jid, f"{jid}: requeue to {t.epoch} after {cause} not allowed by the policy")
                continue
            if prev_epoch is None or prev_epoch.requeued() != t.epoch:
                self._violate(jid, f"{jid}: requeue from {prev_epoch} to {t.epoch} skips an epoch")
            start = next((s for s in history[i:] if s.what == "started" and s.epoch == t.epoch), None)
            if start is not None and start.at + 1e-9 < t.at + rule.delay(t.epoch.r):
                self._violate(
                    jid, f"{jid}: {t.epoch} started before its backoff of {rule.delay(t.epoch.r):g} s"
                )
        created = [j.identity for j in self.cluster._incarnations.get(jid, [])]
        for ident in created:
            if ident.epoch.n > rec.epoch.n:
                self._violate(jid, f"{jid}: {ident} exists but the record is at {rec.epoch}")
        ns = [i.epoch.n for i in created]
        if len(ns) != len(set(ns)):
            self._violate(jid, f"{jid}: an incarnation was created twice: {ns}")

    def _report(self) -> list[str]:
        out = []
        for job_id, message in self.violations:
            lines = [
                ln for ln in self.trace if (job_id and job_id in ln) or "CRASH" in ln or "VIOLATION" in ln
            ]
            out.append(f"{message}\n" + "\n".join(f"    {ln}" for ln in lines[-40:]))
        return out


async def run_seed(seed: int, adapter: str = "memory") -> Result:
    """Run seed ``seed`` and return what it found."""
    if adapter != "memory":
        raise UnsupportedError_(adapter)
    return await _Run(seed).run()


def UnsupportedError_(adapter: str) -> DispatchError:

    return UnsupportedError(
        f"the simulation runs on the memory adapter; --adapter {adapter} is not implemented yet"
    )


def main(argv: list[str] | None = None) -> int:
    """The command line: run the seeds, print violations, end with ``N runs, V violations``."""
    parser = argparse.ArgumentParser(prog="python -m dispatch.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeded runs")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--adapter", choices=["memory", "kubeflow"], default="memory")
    parser.add_argument("--trace", action="store_true", help="print every run's whole trace")
    args = parser.parse_args(argv)
    if args.seeds < 0:
        parser.error("--seeds must be >= 0")
    started = time.perf_counter()
    violations = 0
    for seed in range(args.first, args.first + args.seeds):
        try:
            result = asyncio.run(run_seed(seed, args.adapter))
        except DispatchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.trace:
            print(f"--- seed {seed}")
            print("\n".join(result.trace))
        for v in result.violations:
            violations += 1
            print(f"seed {seed}: {v}")
    took = time.perf_counter() - started
    print(f"({took:.1f} s)", file=sys.stderr)
    print(f"{args.seeds} runs, {violations} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
