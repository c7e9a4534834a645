"""The page's HTTP server: an aiohttp application over a :class:`~dispatch.Cluster` (or a
:class:`~dispatch.Fleet` of them, which reads the same way), its one way in.

Read-only by construction: it calls the cluster's ``records``/``record``/``history`` (the records as
stored), ``changes`` (the store's change feed) and ``output``; never ``Cluster.get``/``list`` (they fold
what the cluster says into the records, which is a write), and never the store itself. Every response carries a Content-Security-Policy that allows only this
server's own script and style, so even markup that escaped :func:`dispatch.ui.pages.esc` could not
run. Bound to loopback, it also refuses requests whose ``Host`` is not a loopback name (a web page
elsewhere cannot reach it through DNS rebinding).
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from dispatch.cluster import Cluster
from dispatch.errors import DispatchError, InvalidError, NotFoundError
from dispatch.logs import SECRETS
from dispatch.model import JobRecord, check_job_id
from dispatch.ui import DEFAULT_ADDRESS
from dispatch.ui.feed import RESYNC, Broadcast
from dispatch.ui.pages import Filters, JobRow, Tail, Unreadable, error_page, job_page, jobs_page

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = [
    "DEFAULT_ADDRESS",
    "Names",
    "Notes",
    "UiServer",
    "cluster_of",
    "is_loopback",
    "make_app",
    "parse_address",
    "serve",
]

TAIL_LINES = 100
"""How many of a node's last output lines the job page shows."""
TAIL_TIMEOUT = 5.0
"""Seconds the job page waits for the cluster to hand over an output tail."""
LINE_CHARS = 2000
"""Longer output lines are cut (a page is for reading, ``dispatch logs`` has them whole)."""
KEEPALIVE = 15.0
"""Seconds between comments on an idle event stream (so proxies and browsers keep it open)."""

Notes = Callable[[Sequence[JobRecord]], Awaitable[Mapping[str, str]]]
"""Why some records are shown as last known (job id -> note), e.g. their dev cluster is gone."""
Names = Callable[[Sequence[str]], Awaitable[Mapping[str, str]]]
"""The names people know clusters by (cluster identity -> name: a config's, a kubeconfig context's),
for those of the given identities that have one."""

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_STATIC = {"ui.css": "text/css", "ui.js": "text/javascript"}
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


@dataclass(frozen=True, slots=True)
class _Context:
    cluster: Cluster | Fleet
    store_label: str
    notes: Notes | None
    loopback_only: bool
    broadcast: Broadcast
    names: Names | None = None


_CONTEXT = web.AppKey("context", _Context)


def parse_address(text: str, path: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one) as ``(host, port)``;
    ``InvalidError`` naming ``path`` otherwise."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidError(f"expected HOST:PORT (e.g. {DEFAULT_ADDRESS}), got {text!r}", path=path)
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8321`` -> ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")]
    return header.rsplit(":", 1)[0]


def cluster_of(record: JobRecord) -> str:
    """The cluster of the record's current incarnation (SPEC §6.1), else the one its handle names, else
    the handle's adapter: records written before dispatch recorded clusters say no more than that."""
    if record.cluster or record.handle is None:
        return record.cluster
    return record.handle.cluster or record.handle.backend


def make_app(
    cluster: Cluster | Fleet,
    *,
    store_label: str = "",
    notes: Notes | None = None,
    names: Names | None = None,
    loopback_only: bool = True,
) -> web.Application:
    """The page's application over ``cluster`` (its records, and its output for tails), read through
    :class:`~dispatch.Cluster` (or :class:`~dispatch.Fleet`) only.

    ``notes`` says which records to show as last known and why; ``names`` what clusters are called;
    ``loopback_only`` refuses requests whose ``Host`` header is not a loopback name (set it when the
    server binds to loopback)."""
    app = web.Application(middlewares=[_guard])
    context = _Context(cluster, store_label, notes, loopback_only, Broadcast(cluster), names)
    app[_CONTEXT] = context
    app.router.add_get("/", _jobs)
    app.router.add_get("/jobs/{job_id}", _job)
    app.router.add_get("/events", _events)
    app.router.add_get("/static/{name}", _static)

    async def start_feed(_: web.Application) -> None:
        await context.broadcast.start()

    async def end_streams(_: web.Application) -> None:
        context.broadcast.close()

    async def stop_feed(_: web.Application) -> None:
        await context.broadcast.stop()

    app.on_startup.append(start_feed)
    app.on_shutdown.append(end_streams)
    app.on_cleanup.append(stop_feed)
    return app


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


@web.middleware
async def _guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Host check, security headers, and errors as pages (never a traceback)."""
    context = request.app[_CONTEXT]
    now = time.time()
    if context.loopback_only and not is_loopback(_host_name(request.host or "")):
        response: web.StreamResponse = _html(
            error_page(421, "misdirected request", "this page answers only at a loopback address", now=now),
            421,
        )
        response.headers.update(_HEADERS)
        return response
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _html(error_page(exc.status, exc.reason, exc.text or exc.reason, now=now), exc.status)
    except InvalidError as exc:
        response = _html(error_page(400, "bad request", str(exc), now=now), 400)
    except NotFoundError as exc:
        response = _html(error_page(404, "not found", str(exc), now=now), 404)
    except DispatchError as exc:
        response = _html(error_page(503, "store unavailable", str(exc), now=now), 503)
    except Exception as exc:  # a defect below us: one line, scrubbed, never a traceback
        message = SECRETS.scrub(" ".join(str(exc).split()))[:300]
        response = _html(
            error_page(
                500, "unexpected error", f"{type(exc).__name__}: {message} (a dispatch defect)", now=now
            ),
            500,
        )
    response.headers.update(_HEADERS)
    return response


async def _here(context: _Context) -> str:
    """The identity of the cluster the page was opened on ("" while it cannot be reached, and for a
    fleet): a backend opened on first use knows it once open."""
    cluster = context.cluster
    if not isinstance(cluster, Cluster):
        return ""
    try:
        await cluster.backend.capabilities()
        return cluster.backend.cluster_id
    except DispatchError:
        return ""


def _fleet(context: _Context) -> tuple[list[str], set[str]]:
    """A fleet's clusters: their names, and the identities of those known ((), () for one cluster)."""
    cluster = context.cluster
    if isinstance(cluster, Cluster):
        return [], set()
    return [m.name for m in cluster.members], {m.seat.identity for m in cluster.members if m.seat.identity}


async def _names(context: _Context, clusters: Sequence[str]) -> Mapping[str, str]:
    wanted = sorted({c for c in clusters if c})
    return await context.names(wanted) if context.names is not None and wanted else {}


async def _rows(context: _Context, records: Sequence[JobRecord]) -> list[JobRow]:
    here = await _here(context)
    fleet, own = _fleet(context)
    notes = await context.notes(records) if context.notes is not None else {}
    names = await _names(context, [cluster_of(r) for r in records])
    rows = []
    for rec in records:
        note = notes.get(rec.job_id, "")
        if not note and here and rec.cluster and rec.cluster != here:
            note = "not this one"  # as every command shows a record of another cluster (SPEC §6.1)
        if not note and fleet and rec.cluster and rec.cluster not in own:
            note = "not one of this fleet's"
        cluster = cluster_of(rec)
        rows.append(JobRow(rec, cluster, note, names.get(cluster, "")))
    return rows


async def _jobs(request: web.Request) -> web.Response:
    context = request.app[_CONTEXT]
    filters = Filters.parse(request.query)
    listing = await context.cluster.records()
    rows: list[JobRow | Unreadable] = [*await _rows(context, listing)]
    rows += [Unreadable(u.job_id, u.reason) for u in listing.unreadable]
    here = await _here(context)
    named = await _names(context, [here])
    page = jobs_page(
        rows,
        filters,
        now=time.time(),
        store=context.store_label,
        cluster=here,
        cluster_name=named.get(here, ""),
        fleet=_fleet(context)[0],
    )
    return _html(page)


def _failing(rec: JobRecord) -> int:
    """The node the page opens on: the one a failure's evidence is about, else node 0."""
    rank = rec.outcome.failed_rank
    return rank if rank is not None and 0 <= rank < rec.spec.nodes else 0


def _node(query: Mapping[str, str], nodes: int, default: int = 0) -> int:
    text = query.get("node", str(default))
    if not text.isdigit() or int(text) >= max(nodes, 1):
        raise InvalidError(
            f"node must be an integer from 0 to {max(nodes, 1) - 1}, got {text[:20]!r}", path="node"
        )
    return int(text)


async def _tail(context: _Context, row: JobRow, node: int) -> Tail:
    rec = row.record
    nodes = rec.spec.nodes
    if row.note:
        return Tail(node, nodes, note=f"not read: the record's cluster is {row.note}")
    if rec.handle is None:
        return Tail(node, nodes, note="not on the cluster yet")
    lines: list[str] = []
    try:
        async with asyncio.timeout(TAIL_TIMEOUT):
            async for line in context.cluster.output(rec.job_id, node=node, tail=TAIL_LINES):
                lines.append(line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " …")
    except DispatchError as exc:
        return Tail(node, nodes, tuple(lines), note=f"cannot read the output: {exc}")
    except TimeoutError:
        return Tail(node, nodes, tuple(lines), note=f"the cluster did not answer within {TAIL_TIMEOUT:g} s")
    return Tail(node, nodes, tuple(lines[-TAIL_LINES:]), note="" if lines else "no output yet")


async def _job(request: web.Request) -> web.Response:
    context = request.app[_CONTEXT]
    job_id = request.match_info["job_id"]
    try:
        check_job_id(job_id)
    except InvalidError:
        raise NotFoundError(f"no job {job_id[:253]!r}: not a job id") from None
    unknown = sorted(set(request.query) - {"node"})
    if unknown:
        raise InvalidError(
            f"unknown query parameter {unknown[0]!r}: the job page takes node", path=unknown[0]
        )
    rec = await context.cluster.record(job_id)
    history = await context.cluster.history(job_id)
    row = (await _rows(context, [rec]))[0]
    tail = await _tail(context, row, _node(request.query, rec.spec.nodes, _failing(rec)))
    # In a fleet each incarnation's bar names its cluster (alone, every one is on the same cluster).
    names = await _names(context, [t.cluster for t in history]) if _fleet(context)[0] else None
    return _html(job_page(row, history, tail, now=time.time(), names=names))


async def _events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``change`` with a job id for each changed record (only ``job``'s when the
    query names one), ``resync`` when changes may have been missed."""
    context = request.app[_CONTEXT]
    only = request.query.get("job") or None
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    response.headers.update({k: v for k, v in _HEADERS.items() if k != "Cache-Control"})
    await response.prepare(request)
    await response.write(b"retry: 2000\n: live\n\n")
    with context.broadcast.subscription() as queue:
        while True:
            try:
                job_id = await asyncio.wait_for(queue.get(), KEEPALIVE)
            except TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
            if job_id is None:  # the server is stopping
                break
            if job_id == RESYNC:
                await response.write(b"event: resync\ndata: \n\n")
            elif only is None or job_id == only:
                await response.write(f"event: change\ndata: {job_id}\n\n".encode())
    return response


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kind = _STATIC.get(name)
    if kind is None:
        raise web.HTTPNotFound(text=f"no static file {name[:60]!r}")
    text = resources.files("dispatch.ui").joinpath("static", name).read_text(encoding="utf-8")
    return web.Response(text=text, content_type=kind, charset="utf-8")


class UiServer:
    """A running page server (see :func:`serve`); :meth:`close` stops it."""

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        self._runner = runner
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> UiServer:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def serve(
    cluster: Cluster | Fleet,
    address: str = DEFAULT_ADDRESS,
    *,
    store_label: str = "",
    notes: Notes | None = None,
    names: Names | None = None,
    path: str = "address",
) -> UiServer:
    """Serve the page for ``cluster`` at ``address`` (``HOST:PORT``, port 0 picks one) in this event
    loop until :meth:`UiServer.close`. ``path`` names the option in errors."""
    host, port = parse_address(address, path)
    app = make_app(
        cluster, store_label=store_label, notes=notes, names=names, loopback_only=is_loopback(host)
    )
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        from dispatch.errors import UnavailableError

        raise UnavailableError(f"cannot serve the page at {address}: {exc.strerror or exc}") from None
    return UiServer(runner, host, int(runner.addresses[0][1]))
