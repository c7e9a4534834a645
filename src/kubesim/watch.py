"""Watch streams: history replay, live events, selector transitions, bookmarks, watch-list, timeouts.

``WatchHub`` serves ``?watch=1`` requests for the HTTP server and tracks the open streams (so faults can
drop them). Deciding parts are pure functions (``parse_watch_request``, ``transition``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kubesim import protowire
from kubesim.errors import ApiError, Cause, bad_request
from kubesim.requestlog import RequestRecord
from kubesim.resources import ResourceType
from kubesim.selectors import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector
from kubesim.store import ObjectStore, WatchEvent

__all__ = [
    "WatchHub",
    "WatchRequest",
    "check_list_options",
    "invalid_options",
    "open_stream",
    "parse_watch_request",
    "query_bool",
    "query_int64",
    "transition",
]

_QUEUE_LIMIT = 50_000  # events a consumer may fall behind before it is disconnected
_PRE_TIMEOUT = 2.0  # seconds before a watch's deadline the watch cache sends a last bookmark
_SER_CACHE = 4096  # serialized objects kept, so N watchers of one change serialize it once
_LAG_CHECK = 0.01  # seconds between looks at a lagging watch's fault

Render = Callable[[dict[str, Any]], Any]  # what a watch sends for an object (itself, or a Table)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DECIMAL = re.compile(r"[+-]?[0-9]+")


def query_bool(v: str | None) -> bool:
    """A boolean query parameter as the apiserver's parameter codec reads it: absent, ``0`` or ``false``
    (any case) is false; anything else, even ``maybe`` or an empty value, is true."""
    return v is not None and v != "0" and v.lower() != "false"


def query_int64(q: Mapping[str, str], key: str) -> int | None:
    """An integer query parameter (None when absent or empty); 400 with Go's ``strconv.ParseInt`` message
    for anything else that is not a decimal int64, as the parameter codec answers."""
    v = q.get(key)
    if v is None or v == "":
        return None
    if not _DECIMAL.fullmatch(v):
        raise bad_request(f"strconv.ParseInt: parsing {json.dumps(v)}: invalid syntax")
    n = int(v)
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise bad_request(f"strconv.ParseInt: parsing {json.dumps(v)}: value out of range")
    return n


def invalid_options(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    """422 Invalid for request options (``ListOptions.meta.k8s.io ""``, ``PodLogOptions "pod"``), worded
    and detailed as apimachinery's ``NewInvalid`` (an empty name or group is omitted from the details)."""
    qualified = f"{kind}.{group}" if group else kind
    listed = str(causes[0]) if len(causes) == 1 else "[" + ", ".join(str(c) for c in causes) + "]"
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [c.as_dict() for c in causes]
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {listed}', details=details)


def check_list_options(q: Mapping[str, str], *, watch: bool) -> None:
    """Decode and validate the ListOptions of a list, watch or deletecollection as the apiserver does: 400
    for a number that does not parse, then 422 ``ListOptions.meta.k8s.io "" is invalid`` with every rule
    broken (apimachinery's ValidateListOptions, the WatchList feature on)."""
    query_int64(q, "limit")
    query_int64(q, "timeoutSeconds")
    match = q.get("resourceVersionMatch") or ""
    rv = q.get("resourceVersion") or ""
    has_initial = "sendInitialEvents" in q
    causes: list[Cause] = []
    if watch:
        if has_initial and match != "NotOlderThan":
            causes.append(
                Cause.forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )
            )
        if query_bool(q.get("sendInitialEvents")) and not query_bool(q.get("allowWatchBookmarks")):
            causes.append(
                Cause.forbidden(
                    "allowWatchBookmarks", "sendInitialEvents requires setting allowWatchBookmarks to true"
                )
            )
        if match:
            if not has_initial:
                causes.append(
                    Cause.forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    )
                )
            if match != "NotOlderThan":
                causes.append(Cause.not_supported("resourceVersionMatch", match, ["NotOlderThan"]))
            if q.get("continue"):
                causes.append(
                    Cause.forbidden(
                        "resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"
                    )
                )
    else:
        if match:
            if not rv:
                causes.append(
                    Cause.forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )
                )
            if q.get("continue"):
                causes.append(
                    Cause.forbidden(
                        "resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"
                    )
                )
            if match not in ("Exact", "NotOlderThan"):
                causes.append(
                    Cause.not_supported("resourceVersionMatch", match, ["Exact", "NotOlderThan", ""])
                )
            if match == "Exact" and rv == "0":
                causes.append(
                    Cause.forbidden(
                        "resourceVersionMatch",
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
        if has_initial:
            causes.append(Cause.forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    if causes:
        raise invalid_options("ListOptions", "meta.k8s.io", "", causes)


@dataclass(frozen=True)
class WatchRequest:
    """What a watch asked for."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    labels: LabelSelector
    fields: FieldSelector
    resource_version: str | None
    bookmarks: bool
    send_initial: bool
    timeout: float
    render: Render | None = None  # None: send objects as they are
    protobuf: bool = False  # length-prefixed protobuf WatchEvent frames instead of JSON lines

    def matches(self, obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        if self.name is not None and meta.get("name") != self.name:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)


def parse_watch_request(
    rt: ResourceType,
    namespace: str | None,
    name: str | None,
    q: Mapping[str, str],
    *,
    default_timeout: float,
    render: Render | None = None,
    protobuf: bool = False,
) -> WatchRequest:
    """Validate the query of a watch (400 for bad selectors or numbers, 422 for bad ListOptions)."""
    check_list_options(q, watch=True)
    bookmarks = query_bool(q.get("allowWatchBookmarks"))
    send_initial = query_bool(q.get("sendInitialEvents"))
    seconds = query_int64(q, "timeoutSeconds")
    # 0 (or none) is the server's default; a negative timeout expires at once, as Go's timer does
    timeout = default_timeout if not seconds else float(seconds)
    return WatchRequest(
        rt=rt,
        namespace=namespace,
        name=name,
        labels=parse_label_selector(q.get("labelSelector")),
        fields=parse_field_selector(rt, q.get("fieldSelector")),
        resource_version=q.get("resourceVersion"),
        bookmarks=bookmarks,
        send_initial=send_initial,
        timeout=timeout,
        render=render,
        protobuf=protobuf,
    )


def transition(event_type: str, matches_now: bool, matched_before: bool) -> str | None:
    """The event type a filtered watch sends, like the watch cache: an object entering the filter is
    ADDED, one leaving it DELETED, one outside it nothing."""
    if event_type in ("ADDED", "DELETED"):
        return event_type if matches_now else None
    if matches_now and matched_before:
        return "MODIFIED"
    if matches_now:
        return "ADDED"
    if matched_before:
        return "DELETED"
    return None


class _Watcher:
    __slots__ = ("abort", "queue")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        self.abort = False


async def open_stream(
    request: web.Request, record: Callable[[int], RequestRecord], headers: Mapping[str, str]
) -> tuple[web.StreamResponse, Callable[[bytes], Awaitable[None]]]:
    """Start a chunked 200 response and return it with a ``send`` that counts the bytes it writes into the
    request log (watch and log streams both account for what they send)."""
    resp = web.StreamResponse(status=200, headers=dict(headers))
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    rec = record(200)
    rec.content_type = resp.content_type

    async def send(data: bytes) -> None:
        rec.response_bytes += len(data)
        await resp.write(data)

    return resp, send


class WatchHub:
    """The open watch streams of one server."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        bookmark_interval: float,
        lagging: Callable[[str], bool] = lambda _: False,
    ) -> None:
        self.store = store
        self.bookmark_interval = bookmark_interval
        self._lagging = lagging  # whether a watch of this URL path holds its changes back now (a fault)
        self._watchers: set[_Watcher] = set()
        self._ser_cache: OrderedDict[tuple[int, bool], bytes] = OrderedDict()

    def active(self) -> int:
        """Number of open watch streams."""
        return len(self._watchers)

    def drop(self, abort: bool) -> None:
        """End every open stream (``abort``: cut the connection instead of ending the response)."""
        for w in list(self._watchers):
            w.abort = abort
            w.queue.put_nowait(None)

    def _line(self, etype: str, ev: WatchEvent, wr: WatchRequest) -> bytes:
        if wr.render is not None:
            return _dumps({"type": etype, "object": wr.render(ev.obj)}) + b"\n"
        key = (ev.resource_version, wr.protobuf)  # a resourceVersion is unique per change: a safe key
        encoded = self._ser_cache.get(key)
        if encoded is None:
            encoded = protowire.encode_body(wr.rt, ev.obj) if wr.protobuf else _dumps(ev.obj)
            self._ser_cache[key] = encoded
            if len(self._ser_cache) > _SER_CACHE:
                self._ser_cache.popitem(last=False)
        if wr.protobuf:
            return protowire.frame(etype, encoded)
        return b'{"type":"' + etype.encode() + b'","object":' + encoded + b"}\n"

    @staticmethod
    def _send_object(wr: WatchRequest, etype: str, obj: dict[str, Any]) -> bytes:
        """An event not of the store's history (an initial ADDED, a BOOKMARK, an ERROR)."""
        if wr.protobuf:
            return protowire.frame(etype, protowire.encode_body(wr.rt, obj))
        shown = wr.render(obj) if wr.render is not None and etype == "ADDED" else obj
        return _dumps({"type": etype, "object": shown}) + b"\n"

    def _event(self, wr: WatchRequest, ev: WatchEvent) -> bytes | None:
        before = ev.old is not None and wr.matches(ev.old)
        etype = transition(ev.type, wr.matches(ev.obj), before)
        return None if etype is None else self._line(etype, ev, wr)

    def _next_bookmark(self, now: float, deadline: float) -> float | None:
        """When the next bookmark is due: every ``bookmark_interval``, and also ``_PRE_TIMEOUT`` seconds
        before the watch's deadline (the watch cache's ``nextBookmarkTime``), none once that has passed."""
        due = now + self.bookmark_interval
        pre_timeout = deadline - _PRE_TIMEOUT
        if pre_timeout < due:
            due = pre_timeout
        return None if due <= now else due

    def _bookmark(self, wr: WatchRequest, rv: int, *, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": wr.rt.kind, "apiVersion": wr.rt.api_version, "metadata": meta}
        return self._send_object(wr, "BOOKMARK", obj)

    async def stream(
        self, request: web.Request, wr: WatchRequest, record: Callable[[int], RequestRecord]
    ) -> web.StreamResponse:
        """Serve one watch until its timeout, a drop, or the client leaving."""
        store = self.store
        watcher = _Watcher()

        def on_event(ev: WatchEvent) -> None:
            if wr.namespace is not None and ev.namespace != wr.namespace:
                return
            if watcher.queue.qsize() >= _QUEUE_LIMIT:
                watcher.queue.put_nowait(None)  # unresponsive consumer: close it, as the watch cache does
                return
            watcher.queue.put_nowait(ev)

        # Subscribe before reading the state, in the same synchronous step: no change can fall between.
        unsubscribe = store.subscribe(on_event, rt=wr.rt)
        self._watchers.add(watcher)
        try:
            initial: list[dict[str, Any]] = []
            replay: list[WatchEvent] = []
            error: ApiError | None = None
            if wr.send_initial or wr.resource_version in (None, "", "0"):
                items, list_rv = store.list(wr.rt, wr.namespace)
                initial = [o for o in items if wr.matches(o)]
                last_rv = int(list_rv)
            else:
                try:
                    replay = store.events_since(wr.rt, wr.namespace, wr.resource_version or "0")
                    last_rv = int(wr.resource_version or 0)
                except ApiError as err:
                    if err.code == 400:
                        raise
                    error = err  # 410 Expired (or too large): one ERROR event, as a real server sends
                    last_rv = store.resource_version
            media = protowire.WATCH_MEDIA_TYPE if wr.protobuf else "application/json"
            resp, send = await open_stream(
                request, record, {"Content-Type": media, "Cache-Control": "no-cache, private"}
            )

            if error is not None:
                await send(self._send_object(wr, "ERROR", error.status()))
                await resp.write_eof()
                return resp
            for obj in initial:
                await send(self._send_object(wr, "ADDED", obj))
            for ev in replay:
                line = self._event(wr, ev)
                if line is not None:
                    await send(line)
                last_rv = max(last_rv, ev.resource_version)
            if wr.send_initial:
                await send(self._bookmark(wr, last_rv, initial_end=True))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wr.timeout
            next_bookmark = self._next_bookmark(loop.time(), deadline) if wr.bookmarks else None
            while True:
                now = loop.time()
                remaining = deadline - now
                if remaining <= 0:
                    break
                wait = remaining if next_bookmark is None else max(0.0, min(remaining, next_bookmark - now))
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if next_bookmark is not None and loop.time() >= next_bookmark:
                        # An empty queue means every change so far was delivered: resuming from the
                        # current resourceVersion loses nothing.
                        if watcher.queue.empty() and loop.time() < deadline:
                            await send(self._bookmark(wr, store.resource_version))
                        next_bookmark = self._next_bookmark(loop.time(), deadline)
                    continue
                if item is None:
                    if watcher.abort and request.transport is not None:
                        request.transport.close()
                        return resp
                    break
                if item.resource_version <= last_rv:
                    continue
                while self._lagging(request.path):  # noqa: ASYNC110 - set from another thread: polled
                    await asyncio.sleep(_LAG_CHECK)
                last_rv = item.resource_version
                line = self._event(wr, item)
                if line is not None:
                    await send(line)
            await resp.write_eof()
            return resp
        finally:
            unsubscribe()
            self._watchers.discard(watcher)
