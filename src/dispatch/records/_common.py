"""The deciding parts every store shares: input checks, the JSON form of stored values, lease rules.

Both stores run exactly these functions, so they refuse the same inputs with the same errors and take
the same lease decisions; only where the bytes live differs.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import msgspec

from dispatch.errors import ConflictError, InvalidError, UnavailableError
from dispatch.model import JobRecord, Lease, State, Transition
from dispatch.model._base import Model, _enc_hook, _within, decode_text, encode_text
from dispatch.model._decode import STORED_DEPTH, check_plain
from dispatch.records.store import Changes

M = TypeVar("M", bound=Model)

__all__ = [
    "QueueChanges",
    "check_cutoff",
    "check_holder",
    "check_revision",
    "check_states",
    "check_ttl",
    "checked_record",
    "checked_record_text",
    "checked_transition",
    "checked_transitions",
    "decode_record",
    "decode_transition",
    "lease_after_acquire",
    "lease_after_release",
    "record_text",
]


def record_text(record: JobRecord) -> str:
    """The canonical text a store keeps for ``record`` (compact JSON, keys sorted)."""
    return encode_text(record).decode()


def _round_trip(cls: type[M], value: M, where: str) -> tuple[M, str]:
    """``value`` encoded and decoded again, with its text: what a store will keep and give back."""
    if not isinstance(value, cls):
        raise InvalidError(f"expected a {cls.__name__}, got {type(value).__name__}", path=where)
    text = encode_text(value)
    if b"null" in text:
        # msgspec writes NaN, infinities and a None where a value is due as null: name the field and
        # what it holds. (A string that says "null" lands here too, and passes.)
        check_plain(msgspec.to_builtins(value, enc_hook=_enc_hook), "")
    return decode_text(cls, text, where, max_depth=STORED_DEPTH, fresh=True), text.decode()


def checked_record(record: JobRecord) -> JobRecord:
    """``record`` as the store will keep it: encoded and decoded again with the strict decoders.

    A record whose JSON form does not decode (a wrong type in a field, a non-JSON extension value, a
    NaN timestamp) is refused with ``InvalidError`` naming the job and the field, before anything is
    written. Returning the decoded copy means the caller sees exactly what a later ``get`` returns.
    """
    return checked_record_text(record)[0]


def checked_record_text(record: JobRecord) -> tuple[JobRecord, str]:
    """:func:`checked_record`, with the canonical text it was checked in (:func:`record_text` of it)."""
    what = f"record of job {getattr(record, 'job_id', '?')!r}"
    try:
        return _round_trip(JobRecord, record, "record")
    except InvalidError as exc:
        if exc.path == "record" and not isinstance(record, JobRecord):
            raise
        raise InvalidError(
            f"{what} does not survive its JSON form: {exc.detail}",
            path=exc.path if exc.path not in ("record", "document") else None,
        ) from None
    except (TypeError, ValueError, AttributeError, msgspec.EncodeError) as exc:  # a field of the wrong kind
        raise InvalidError(f"{what} cannot be encoded: {exc}") from None


def checked_transitions(job_id: str, transitions: Sequence[Transition]) -> list[tuple[Transition, str]]:
    """Each transition as it will be stored, with its canonical text; ``InvalidError`` naming the
    job and the index of one that does not survive its JSON form."""
    if isinstance(transitions, Transition) or not isinstance(transitions, Sequence):
        raise InvalidError("expected a sequence of Transition values", path="transitions")
    return [checked_transition(job_id, t, f"transitions[{i}]") for i, t in enumerate(transitions)]


def checked_transition(job_id: str, transition: Transition, where: str) -> tuple[Transition, str]:
    """One transition as it will be stored, with its canonical text (see :func:`checked_transitions`)."""
    if not isinstance(transition, Transition):
        raise InvalidError(f"expected a Transition, got {type(transition).__name__}", path=where)
    try:
        return _round_trip(Transition, transition, where)
    except InvalidError as exc:
        raise InvalidError(
            f"a transition of job {job_id!r} does not survive its JSON form: {exc.detail}",
            path=_within(where, exc.path) if exc.path not in (where, "document") else where,
        ) from None
    except (TypeError, ValueError, AttributeError, msgspec.EncodeError) as exc:
        raise InvalidError(f"a transition of job {job_id!r} cannot be encoded: {exc}", path=where) from None


def check_revision(expected_revision: int) -> int:
    if isinstance(expected_revision, bool) or not isinstance(expected_revision, int):
        raise InvalidError(
            f"expected an integer revision, got {expected_revision!r}", path="expected_revision"
        )
    return expected_revision


def decode_record(job_id: str, text: str, where: str) -> JobRecord:
    """Decode a stored record strictly; any failure names the job and ``where`` it is stored."""
    try:
        record = decode_text(JobRecord, text, "record", max_depth=STORED_DEPTH)
    except (InvalidError, TypeError, ValueError, KeyError) as exc:
        raise InvalidError(
            f"the stored record of job {job_id!r} in {where} cannot be decoded: {exc}"
        ) from None
    if record.job_id != job_id:
        raise InvalidError(
            f"the stored record of job {job_id!r} in {where} names another job ({record.job_id!r})"
        )
    return record


def decode_transition(job_id: str, seq: int, text: str, where: str) -> Transition:
    """Decode one stored history entry strictly; any failure names the job, the entry and the store."""
    try:
        return decode_text(Transition, text, "transition", max_depth=STORED_DEPTH)
    except (InvalidError, TypeError, ValueError, KeyError) as exc:
        raise InvalidError(
            f"history entry {seq} of job {job_id!r} in {where} cannot be decoded: {exc}"
        ) from None


def check_states(states: Iterable[State] | None) -> frozenset[State] | None:
    """The states to filter on, each checked to be a :class:`State`."""
    if states is None:
        return None
    if isinstance(states, str | State):
        states = [states]  # type: ignore[list-item]  # a lone state is an easy, harmless slip
    if not isinstance(states, Iterable):
        raise InvalidError(f"expected states, got {type(states).__name__}", path="states")
    out: set[State] = set()
    for i, s in enumerate(states):
        if not isinstance(s, State):
            allowed = ", ".join(m.value for m in State)
            raise InvalidError(f"expected a State ({allowed}), got {s!r}", path=f"states[{i}]")
        out.add(s)
    return frozenset(out)


def state_counts(rows: Iterable[Sequence[object]]) -> dict[State, int]:
    """Rows of ``(state, count)`` as counts by :class:`State`; a state this dispatch does not know (a
    newer one's) is left out, as its records are from a listing."""
    known = {s.value: s for s in State}
    return {known[str(state)]: int(str(n)) for state, n in rows if str(state) in known}


def check_cutoff(older_than: float) -> float:
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, int | float)
        or not math.isfinite(older_than)
    ):
        raise InvalidError(f"expected epoch seconds (a finite number), got {older_than!r}", path="older_than")
    return float(older_than)


def check_holder(holder: str) -> str:
    if not isinstance(holder, str) or not holder.strip():
        raise InvalidError(f"a lease holder is a non-empty string, got {holder!r}", path="holder")
    return holder


def check_ttl(ttl: float) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0:
        raise InvalidError(f"a lease lasts a positive, finite number of seconds, got {ttl!r}", path="ttl")
    return float(ttl)


def lease_after_acquire(job_id: str, current: Lease | None, holder: str, ttl: float, now: float) -> Lease:
    """The lease after ``holder`` asks for it at ``now``: granted when free, expired or already
    ``holder``'s; otherwise ``ConflictError`` naming the holder and when its lease ends."""
    if current is not None and current.holder != holder and current.live(now):
        raise ConflictError(
            f"job {job_id!r} is leased by {current.holder!r} for another "
            f"{current.expires_at - now:.3g}s; {holder!r} cannot take it"
        )
    return Lease(holder, now + ttl)


def lease_after_release(
    job_id: str, current: Lease | None, holder: str, now: float
) -> tuple[bool, Lease | None]:
    """``(changed, lease)`` after ``holder`` gives the lease up at ``now``.

    Releasing a lease one does not hold is a no-op when nobody holds it live (nothing to give up, so
    releasing twice is harmless); ``ConflictError`` when another holder has it now.
    """
    if current is None:
        return False, None
    if current.holder == holder:
        return True, None
    if current.live(now):
        raise ConflictError(f"job {job_id!r} is leased by {current.holder!r}, not {holder!r}")
    return False, current


class QueueChanges(Changes):
    """A change feed the store pushes job ids into (from any thread), in the subscriber's loop."""

    def __init__(self, subscribers: set[QueueChanges], where: str, closed: Callable[[], bool]) -> None:
        self._subscribers = subscribers
        self._where = where
        self._closed = closed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._subscribers.add(self)
        if self._closed():
            self._queue.put_nowait(None)

    def push(self, job_id: str | None) -> None:
        """Report ``job_id`` changed; ``None`` means the store closed (the feed then raises)."""
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, job_id)
        except RuntimeError:  # the subscriber's loop is gone: nobody is listening any more
            self._subscribers.discard(self)

    async def _next(self) -> str:
        job_id = await self._queue.get()
        if job_id is None:
            self._queue.put_nowait(None)  # stays ended for later calls
            raise UnavailableError(f"{self._where} is closed; its change feed ended")
        return job_id

    async def _stop(self) -> None:
        self._subscribers.discard(self)
        self._loop = None
