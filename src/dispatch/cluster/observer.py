"""The observer's reads of an opened cluster: :class:`Observer`.

``get``, ``list`` and ``watch`` fold what the cluster reports into the records with
:func:`dispatch.fold.fold` (an absent reading only once a second, complete answer confirms it:
:class:`~dispatch.reader.Reader`); while the cluster does not answer they show the records as last
stored. ``record``, ``records``, ``history``, ``changes`` and the notes read the store alone; ``output``
reads a job's output from the cluster.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable
from typing import Any

from dispatch.backend import JobWatcher, OutputReader, Watcher, known
from dispatch.errors import (
    BusyError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OtherClusterError,
    UnsupportedError,
)
from dispatch.fold import matches
from dispatch.model import Absent, Change, JobRecord, Observation, State, Transition, Unreachable
from dispatch.model._decode import as_enum
from dispatch.records import ChangeNotifier, Changes, KeyValues, Listing

from .base import POLL_MAX, POLL_MIN, ClusterBase

__all__ = ["Observer"]


class Observer(ClusterBase):
    """What an observer reads of an opened cluster (see the module docstring): a part of
    :class:`~dispatch.cluster.Cluster`."""

    async def list(self, states: Iterable[State] | None = None) -> Listing:
        """Every record (optionally only in ``states``), oldest first; records of this cluster that are
        not terminal are refreshed from one listing of the cluster, others' are shown as last known.
        Stored records that cannot be read are left out and named in the listing's ``unreadable``."""
        wanted = None if states is None else _states(states)
        listing = await self.store.list()
        records: builtins.list[JobRecord] = listing
        unfinished = [r for r in records if not r.outcome.terminal]
        live = [r for r in unfinished if await self.belongs(r)]
        listed = await self._reader.listing() if live else None
        if live and not isinstance(listed, Unreachable):
            assert listed is not None
            by_id: dict[str, JobRecord] = {r.job_id: r for r in records}
            seen: set[str] = set()
            for obs in listed:
                rec = by_id.get(obs.handle.identity.job_id)
                if rec is not None and not rec.outcome.terminal and matches(rec, obs):
                    by_id[rec.job_id] = await self._fold(rec.job_id, obs)
                    seen.add(rec.job_id)
            # A live record the listing does not show (its object was deleted behind our back): read it,
            # as get() would (the listing is the second reading), so list and status never disagree.
            for rec in live:
                if rec.job_id not in seen and rec.handle is not None:
                    missing = await self._reader.read(rec, listed)
                    if isinstance(missing, Observation | Absent):
                        by_id[rec.job_id] = await self._fold(rec.job_id, missing, confirmed=True)
            records = [by_id[r.job_id] for r in records]
        return Listing((r for r in records if wanted is None or r.state in wanted), listing.unreadable)

    async def watch(self, job_id: str | None = None) -> AsyncIterator[JobRecord]:
        """Yield records as they change: first the current record(s), then each change.

        With ``job_id`` the stream ends once the job's record is terminal. Uses the backend's
        :class:`~dispatch.backend.Watcher` when it has one, else polls ``observe`` with a backoff.
        """
        if job_id is not None:
            rec = await self.store.get(job_id)  # NotFoundError early, before any waiting
            if not rec.outcome.terminal and not await self.belongs(rec):  # another cluster's: shown as is
                yield rec
                return
        if isinstance(self.backend, Watcher) and (await self.backend.capabilities()).watch:
            stream: AsyncIterator[JobRecord] = self._watch_changes(self.backend, job_id)
        else:
            stream = self._watch_polling(job_id)
        async for rec in stream:
            yield rec

    async def _watch_changes(self, watcher: Watcher, job_id: str | None) -> AsyncIterator[JobRecord]:
        last: dict[str, int] = {}
        for rec in await self._snapshot(job_id):
            last[rec.job_id] = rec.revision
            yield rec
            if job_id is not None and rec.outcome.terminal:
                return
        cursor: str | None = None
        pause = POLL_MIN
        while True:
            # One job's watch costs that job's changes, not every job's, where the backend can say so.
            changes = (
                watcher.watch_job(job_id)
                if job_id is not None and isinstance(watcher, JobWatcher)
                else watcher.watch(cursor)
            )
            try:
                async for change in changes:
                    cursor, pause = change.cursor, POLL_MIN
                    self._reader.answered()
                    folded = await self._fold_reading(change, job_id)
                    if folded is None:
                        continue
                    rec = folded
                    if last.get(rec.job_id) != rec.revision:
                        last[rec.job_id] = rec.revision
                        yield rec
                    if job_id is not None and rec.outcome.terminal:
                        return
            except DispatchError as exc:
                # The cluster stopped answering: nothing is concluded from it. Watch again, from where
                # the feed was (a relist when that is gone), after a pause that doubles while it lasts.
                if self._reader.note(exc) is None:
                    raise
            finally:
                aclose = getattr(changes, "aclose", None)
                if aclose is not None:
                    await aclose()
            await self.clock.sleep(pause)
            pause = min(pause * 2, POLL_MAX)

    async def _fold_reading(self, change: Change, job_id: str | None) -> JobRecord | None:
        """Fold one watched change into its record (an absent reading once a second read confirms it);
        ``None`` when it is not this watch's or not this process's to fold."""
        ident = change.handle.identity
        if job_id is not None and ident.job_id != job_id:
            return None
        reading: Observation | Absent = change.reading
        if isinstance(reading, Absent):
            second = await self._reader.confirm(reading)
            if isinstance(second, Unreachable):
                return None
            reading = second
        try:
            return await self._fold(ident.job_id, reading, confirmed=True)
        except NotFoundError:
            return None  # an object of ours that matches no record: the supervisor's business
        except OtherClusterError:
            return None  # a record of another cluster: not this process's to fold

    async def _watch_polling(self, job_id: str | None) -> AsyncIterator[JobRecord]:
        last: dict[str, int] = {}
        delay = POLL_MIN
        while True:
            changed = False
            for rec in await self._snapshot(job_id):
                if last.get(rec.job_id) != rec.revision:
                    last[rec.job_id] = rec.revision
                    changed = True
                    yield rec
                if job_id is not None and rec.outcome.terminal:
                    return
            delay = POLL_MIN if changed else min(delay * 2, POLL_MAX)
            await self.clock.sleep(delay)

    async def _snapshot(self, job_id: str | None) -> builtins.list[JobRecord]:
        if job_id is not None:
            return [await self.get(job_id)]
        # The backend's feed may hold a current reading of every live record already (Slurm: the answers
        # of the sbatch that just queued them): the records folded from them are the present, and a
        # listing would cost a command to say the same. Else one listing of the cluster refreshes every
        # record (a get each cost one reading per record).
        stored = await self.store.list()
        live = [r for r in stored if not r.outcome.terminal and await self.belongs(r)]
        handles = [r.handle for r in live if r.handle is not None]
        if len(handles) == len(live) and known(self.backend, handles):
            return builtins.list(stored)
        return builtins.list(await self.list())

    async def output(
        self,
        job_id: str,
        *,
        node: int = 0,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
        since: float | None = None,
        timestamps: bool = False,
    ) -> AsyncIterator[str]:
        """Lines of output of node ``node`` of the job's current incarnation (``previous``: its last
        terminated run, when it restarted in place; ``since``: only the last ``since`` seconds';
        ``timestamps``: each line prefixed with the RFC 3339 time it was written). ``UnsupportedError``
        when the adapter cannot read output."""
        if not isinstance(self.backend, OutputReader) or not (await self.backend.capabilities()).output:
            raise UnsupportedError(
                f"cluster {self.backend.name!r} cannot read job output (capability 'output')"
            )
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise InvalidError(f"expected a node index >= 0, got {node!r}", path="node")
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise InvalidError(f"expected a line count >= 0, got {tail!r}", path="tail")
        if since is not None and (
            isinstance(since, bool) or not isinstance(since, int | float) or since <= 0
        ):
            raise InvalidError(f"expected a number of seconds > 0, got {since!r}", path="since")
        rec = await self.store.get(job_id)
        if rec.handle is None:
            raise BusyError(f"job {job_id!r} is not on the cluster yet; retry once it is")
        if not isinstance(previous, bool) or not isinstance(timestamps, bool):
            raise InvalidError(
                "expected True or False", path="previous" if not isinstance(previous, bool) else "timestamps"
            )
        # Only what was asked for: a reader that predates an option still serves the plain reads.
        asked: dict[str, Any] = {"previous": previous, "since": since, "timestamps": timestamps}
        options = {k: v for k, v in asked.items() if v not in (None, False)}
        async for line in self.backend.output(rec.handle, node=node, follow=follow, tail=tail, **options):
            yield line

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The job's transitions, oldest first."""
        return await self.store.history(job_id)

    async def record(self, job_id: str) -> JobRecord:
        """The job's record as last stored, not refreshed from the cluster (:meth:`get` refreshes it)."""
        return await self.store.get(job_id)

    async def records(self) -> Listing:
        """Every record as last stored, oldest first, not refreshed (:meth:`list` refreshes them)."""
        return await self.store.list()

    def changes(self) -> Changes | None:
        """The store's change feed (job ids as records change, whichever process wrote them), or ``None``
        for a store without one: then :meth:`records` is what there is to poll."""
        return self.store.changes() if isinstance(self.store, ChangeNotifier) else None

    async def note(self, key: str) -> str | None:
        """A value kept beside the records (the store's key-value table); ``None`` when unset or when
        the store has no such table."""
        return await self.store.get_value(key) if isinstance(self.store, KeyValues) else None

    async def set_note(self, key: str, value: str | None) -> None:
        """Keep ``value`` under ``key`` beside the records (``None`` deletes it); a store without a
        key-value table keeps nothing."""
        if isinstance(self.store, KeyValues):
            await self.store.put_value(key, value)


def _states(states: Any) -> frozenset[State]:
    """``states`` as a set of :class:`State`; one state alone (a ``State`` is also a ``str``) is allowed.
    An unknown name is refused rather than silently matching nothing."""
    if isinstance(states, str):
        states = [states]
    try:
        items = builtins.list(states)
    except TypeError:
        raise InvalidError(f"expected states, got {type(states).__name__}", path="states") from None
    return frozenset(as_enum(State, s, f"states[{i}]") for i, s in enumerate(items))
