"""Supervising a fleet of clusters: :class:`FleetSupervisor`, one :class:`~dispatch.supervise.Supervisor`
per cluster, sharing the store and the fleet's placer.

Each member supervisor changes only the records of its own cluster (SPEC §6.1); a next incarnation is
placed by the placer, and handed to another cluster's supervisor by the record's last write on its old
one. A cluster that cannot be opened is tried again every ``reopen`` seconds meanwhile its records wait
as last known, and the other clusters' supervisors go on: one cluster never blocks the others.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from dispatch.clock import Clock
from dispatch.errors import DispatchError
from dispatch.model import Policy
from dispatch.supervise import StepReport, Supervisor

if TYPE_CHECKING:
    from .fleet import Fleet, Member

__all__ = ["REOPEN", "FleetSupervisor"]

log = logging.getLogger("dispatch.supervise")

REOPEN = 15.0
"""Seconds between two attempts to open a cluster of the fleet that could not be opened."""


class FleetSupervisor:
    """Supervises every cluster of ``fleet`` (see the module docstring). ``options`` are each member
    supervisor's; ``holder`` (default: the host's) gets ``/<cluster name>`` appended per cluster."""

    def __init__(self, fleet: Fleet, *, policy: Policy, holder: str | None = None, **options: Any) -> None:
        self.fleet = fleet
        self.policy = policy
        self.options = options
        self.holder = holder or ""
        self.supervisors: dict[str, Supervisor] = {}
        for m in fleet.members:
            self._member(m)

    def _member(self, member: Member) -> Supervisor | None:
        """The supervisor of an opened cluster (made on first need), ``None`` for one not opened."""
        got = self.supervisors.get(member.name)
        if got is None and member.cluster is not None:
            holder = f"{self.holder}/{member.name}" if self.holder else None
            got = Supervisor(
                member.cluster.backend,
                self.fleet.store,
                policy=self.policy,
                clock=self.fleet.clock,
                holder=holder,
                placer=self.fleet.placer,
                **self.options,
            )
            self.supervisors[member.name] = got
            member.seat.unreachable = lambda: got.unreachable if got is not None else None
        return got

    @property
    def clock(self) -> Clock:
        return self.fleet.clock

    @property
    def leased(self) -> frozenset[str]:
        """The job ids every member supervisor leases."""
        return frozenset(j for sup in self.supervisors.values() for j in sup.leased)

    @property
    def capacity(self) -> int | None:
        capacity = self.options.get("capacity")
        return capacity * len(self.supervisors) if isinstance(capacity, int) else None

    async def step(self) -> StepReport:
        """One step of each member supervisor, in the fleet's order; a step that fails on one cluster is
        reported and the others still step."""
        merged = StepReport()
        for m in self.fleet.members:
            sup = self._member(m)
            if sup is None:
                continue
            try:
                report = await sup.step()
            except DispatchError as exc:
                merged.errors.append(f"{m.name}: the step failed: {type(exc).__name__}: {exc}")
                continue
            merged.changes += report.changes
            merged.folded += report.folded
            merged.actions.extend(report.actions)
            merged.errors.extend(f"{m.name}: {e}" for e in report.errors)
            merged.unreadable.extend(u for u in report.unreadable if u not in merged.unreadable)
            merged.leased += report.leased
        return merged

    async def run(
        self,
        *,
        stop: asyncio.Event | None = None,
        until: Callable[[], Awaitable[bool]] | None = None,
        on_step: Callable[[StepReport], Awaitable[None]] | None = None,
    ) -> None:
        """Run every member supervisor until ``stop`` is set or ``until()`` is true (asked by each after
        each of its steps), opening meanwhile the clusters that could not be opened."""
        stop = stop if stop is not None else asyncio.Event()

        async def done() -> bool:
            if until is not None and await until():
                stop.set()
            return stop.is_set()

        tasks: dict[str, asyncio.Task[None]] = {}

        def launch() -> None:
            for m in self.fleet.members:
                sup = self._member(m)
                if sup is not None and m.name not in tasks:
                    tasks[m.name] = asyncio.ensure_future(sup.run(stop=stop, until=done, on_step=on_step))

        launch()
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                waiting: builtins.set[asyncio.Future[Any]] = {stopper, *tasks.values()}
                closed = [m for m in self.fleet.members if m.cluster is None]
                finished, _ = await asyncio.wait(
                    waiting, timeout=REOPEN if closed else None, return_when=asyncio.FIRST_COMPLETED
                )
                for task in finished:
                    if task is not stopper and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                if closed:
                    await self.fleet.open_members()
                    launch()
        finally:
            stop.set()
            stopper.cancel()
            await asyncio.gather(stopper, *tasks.values(), return_exceptions=True)
            await self.close()

    async def close(self) -> None:
        """Release every member supervisor's leases. Idempotent."""
        for sup in self.supervisors.values():
            await sup.close()

    def __repr__(self) -> str:
        return f"FleetSupervisor({', '.join(self.supervisors)})"
