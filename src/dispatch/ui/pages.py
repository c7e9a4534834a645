"""The pages, as HTML text: pure functions of records, histories and output lines (no I/O).

Everything printed goes through :func:`esc` (text and attribute values alike), so a job id, a cause's
message or an output line holding ``<script>`` is shown as text. The markup links only to this
server's own ``/static`` files; the pages are complete without JavaScript (the script only makes them
live), and every value in ``#live`` is rendered here, so a live update is the same page, re-fetched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from dispatch.decide import FINAL_PLANS, current_handle
from dispatch.errors import InvalidError
from dispatch.model import Cause, Evidence, JobRecord, State, Transition
from dispatch.ui.timeline import Box, Geometry, Line, Text, Timeline, cluster_label, layout, timeline

__all__ = [
    "Filters",
    "JobRow",
    "Tail",
    "Unreadable",
    "age",
    "error_page",
    "esc",
    "job_page",
    "jobs_page",
    "svg",
]

TITLE = "dispatch"
MAX_ROWS = 1000
"""The jobs page shows at most this many jobs (the newest); the filters narrow the rest."""


def esc(value: object) -> str:
    """``value`` as HTML text, safe in element content and in double-quoted attribute values."""
    return escape(str(value), quote=True)


@dataclass(frozen=True, slots=True)
class JobRow:
    """A record as the pages show it: ``cluster`` is where its current incarnation was placed (its
    identity; ``cluster_name`` what people call it, when known), ``note`` says when that is not the
    cluster this page reads from (or the cluster is gone)."""

    record: JobRecord
    cluster: str
    note: str = ""
    cluster_name: str = ""

    def cluster_html(self) -> str:
        """The cluster by its name (its identity in the tooltip), else by its identity."""
        note = f' <span class="note">({esc(self.note)})</span>' if self.note else ""
        if self.cluster_name:
            return f'<span title="{esc(self.cluster)}">{esc(self.cluster_name)}</span>{note}'
        return esc(self.cluster or "-") + note


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A stored record that cannot be read (corrupt, a newer schema, another adapter's handle)."""

    job_id: str
    message: str


@dataclass(frozen=True, slots=True)
class Tail:
    """The last lines of one node's output, or why there are none (``note``)."""

    node: int
    nodes: int
    lines: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True, slots=True)
class Filters:
    """The jobs page's filters (query parameters ``state``, ``cause``, ``cluster``; empty: any)."""

    state: State | None = None
    cause: Cause | None = None
    cluster: str | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> Filters:
        """Read the filters from a query; ``InvalidError`` naming the parameter and what is allowed."""
        unknown = sorted(set(query) - {"state", "cause", "cluster"})
        if unknown:
            raise InvalidError(
                f"unknown query parameter {unknown[0]!r}: the jobs page takes state, cause and cluster",
                path=unknown[0],
            )
        state = query.get("state") or None
        cause = query.get("cause") or None
        if state is not None and state not in State._value2member_map_:
            allowed = ", ".join(s.value for s in State)
            raise InvalidError(f"unknown state {state[:60]!r}: use one of {allowed}", path="state")
        if cause is not None and cause not in Cause._value2member_map_:
            allowed = ", ".join(c.value for c in Cause)
            raise InvalidError(f"unknown cause {cause[:60]!r}: use one of {allowed}", path="cause")
        return cls(
            State(state) if state is not None else None,
            Cause(cause) if cause is not None else None,
            query.get("cluster") or None,
        )

    def keep(self, row: JobRow) -> bool:
        """Whether the row passes every filter (the cluster by its identity, or by its name)."""
        rec = row.record
        return (
            (self.state is None or rec.state is self.state)
            and (self.cause is None or rec.outcome.cause is self.cause)
            and (self.cluster is None or self.cluster in (row.cluster, row.cluster_name))
        )

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.state, self.cause, self.cluster))


# ------------------------------------------------------------------------------------ formatting


def _utc(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


def when(at: float | None) -> str:
    """An epoch time as ``YYYY-MM-DD HH:MM:SS`` (UTC)."""
    return "-" if at is None else _utc(at).strftime("%Y-%m-%d %H:%M:%S")


def clock(at: float) -> str:
    return _utc(at).strftime("%H:%M:%S")


def age(seconds: float) -> str:
    """A duration as people read it: ``0.4 s``, ``45 s``, ``3 min 12 s``, ``2 h 5 min``, ``3 d 4 h``."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f} s"
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def job_href(job_id: str, node: int | None = None) -> str:
    """The job page's address (a job id is ``[A-Za-z0-9._-]``: nothing in it needs quoting in a URL)."""
    return f"/jobs/{job_id}" + (f"?node={node}" if node is not None else "")


def _pill(state: State, text: str | None = None) -> str:
    return f'<span class="pill {esc(state.value)}">{esc(text or state.value)}</span>'


def _cause(cause: Cause) -> str:
    if cause is Cause.NONE:
        return '<span class="none">none</span>'
    return f'<span class="cause">{esc(cause.value)}</span>'


# ------------------------------------------------------------------------------------ the frame


def _page(title: str, body: str, *, live: str, job: str = "", now: float = 0.0) -> str:
    """The frame every page shares. ``live`` is the region a live update replaces; ``job`` which job
    it follows (empty: every job)."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{esc(title)} · {TITLE}</title>
<link rel="stylesheet" href="/static/ui.css">
<script src="/static/ui.js" defer></script>
</head>
<body>
<header class="top">
<a class="brand" href="/">dispatch</a>
<nav><a href="/">jobs</a></nav>
<span id="live-status" class="live" hidden>connecting…</span>
<noscript><span class="live off">not live: reload to refresh</span></noscript>
</header>
{body}
<main id="live" data-job="{esc(job)}" data-rendered="{now:.3f}">
{live}
</main>
<footer>read-only · rendered {esc(when(now))} UTC</footer>
</body>
</html>
"""


def error_page(status: int, title: str, message: str, *, now: float = 0.0) -> str:
    """A page saying what went wrong (the status, and the message as text)."""
    body = f'<h1>{esc(title)}</h1>\n<p class="error">{esc(message)}</p>\n<p><a href="/">all jobs</a></p>'
    return _page(f"{status} {title}", "", live=body, now=now)


# ------------------------------------------------------------------------------------ jobs page


def _options(
    name: str, values: Iterable[str], chosen: str | None, labels: Mapping[str, str] | None = None
) -> str:
    items = [f'<option value=""{"" if chosen else " selected"}>any {esc(name)}</option>']
    for v in values:
        sel = " selected" if v == chosen else ""
        items.append(f'<option value="{esc(v)}"{sel}>{esc((labels or {}).get(v) or v)}</option>')
    return f'<select name="{esc(name)}" aria-label="{esc(name)}">' + "".join(items) + "</select>"


def jobs_page(
    rows: Sequence[JobRow | Unreadable],
    filters: Filters,
    *,
    now: float,
    store: str = "",
    cluster: str = "",
    cluster_name: str = "",
    fleet: Sequence[str] = (),
) -> str:
    """Every job (those ``filters`` keep; the newest first, at most :data:`MAX_ROWS`) with its state,
    cause, cluster, epoch, age and last change; unreadable records on their own rows, first. ``store``
    and ``cluster`` (``cluster_name``), or ``fleet`` (its clusters' names), say what the page reads
    (records of another cluster are marked as such)."""
    readable = [r for r in rows if isinstance(r, JobRow)]
    # A fleet's clusters are chosen by name, each of them (those without jobs too); others by identity.
    named = {r.cluster: r.cluster_name for r in readable if r.cluster and r.cluster_name in fleet}
    clusters = sorted(
        {named.get(r.cluster, r.cluster) for r in readable if r.cluster}
        | set(fleet)
        | ({filters.cluster} if filters.cluster else set())
    )
    form = (
        '<form class="filters" method="get" action="/">'
        + _options("state", (s.value for s in State), filters.state.value if filters.state else None)
        + _options("cause", (c.value for c in Cause), filters.cause.value if filters.cause else None)
        + _options("cluster", clusters, filters.cluster, {r.cluster: r.cluster_name for r in readable})
        + '<button type="submit">filter</button>'
        + ('<a class="clear" href="/">clear</a>' if filters.active else "")
        + "</form>"
    )
    # Unreadable records first (they want a person), then the newest jobs first, at most MAX_ROWS.
    broken = [r for r in rows if isinstance(r, Unreadable)]
    kept = sorted((r for r in readable if filters.keep(r)), key=lambda r: r.record.created_at, reverse=True)
    shown: list[JobRow | Unreadable] = [*broken, *kept[:MAX_ROWS]]
    counts: dict[State, int] = {}
    for r in readable:
        counts[r.record.state] = counts.get(r.record.state, 0) + 1
    summary = " ".join(
        f'<a class="count {esc(s.value)}" href="/?state={esc(s.value)}">{counts[s]} {esc(s.value)}</a>'
        for s in State
        if s in counts
    )
    lines: list[str] = []
    for shown_row in shown:
        if isinstance(shown_row, Unreadable):
            lines.append(
                f'<tr class="unreadable"><td class="job"><code>{esc(shown_row.job_id)}</code></td>'
                f'<td colspan="6">unreadable record: {esc(shown_row.message)}</td></tr>'
            )
            continue
        r = shown_row
        rec = r.record
        lines.append(
            f'<tr class="job-row" data-job="{esc(rec.job_id)}" data-state="{esc(rec.state.value)}">'
            f'<td class="job"><a href="{esc(job_href(rec.job_id))}">{esc(rec.job_id)}</a></td>'
            f"<td>{_pill(rec.state)}</td>"
            f"<td>{_cause(rec.outcome.cause)}</td>"
            f'<td class="cluster">{r.cluster_html()}</td>'
            f'<td class="num">{esc(rec.epoch)}</td>'
            f'<td class="num" title="created {esc(when(rec.created_at))} UTC">{esc(age(now - rec.created_at))}</td>'
            f'<td class="num" title="{esc(when(rec.updated_at))} UTC">{esc(age(now - rec.updated_at))} ago</td>'
            "</tr>"
        )
    if not lines:
        empty = "no job matches these filters" if filters.active and rows else "no jobs yet"
        lines.append(f'<tr class="empty"><td colspan="7">{esc(empty)}</td></tr>')
    total = f"{len(broken) + len(kept)} of {len(rows)} jobs" if filters.active else f"{len(rows)} jobs"
    if len(kept) > MAX_ROWS:
        total += f" (the newest {MAX_ROWS} shown: the filters narrow it)"
    live = (
        f'<p class="meta"><span id="total">{esc(total)}</span> {summary}</p>'
        '<table class="jobs"><thead><tr><th>job</th><th>state</th><th>cause</th><th>cluster</th>'
        '<th class="num">epoch</th><th class="num">age</th><th class="num">updated</th></tr></thead>'
        "<tbody>" + "".join(lines) + "</tbody></table>"
    )
    where = [f"store: <code>{esc(store)}</code>"] if store else []
    if cluster_name:
        where += [f"this cluster: {esc(cluster_name)} (<code>{esc(cluster)}</code>)"]
    elif cluster:
        where += [f"this cluster: <code>{esc(cluster)}</code>"]
    if fleet:
        where += [f"this fleet: {esc(', '.join(fleet))}"]
    head = "<h1>Jobs</h1>" + (f'<p class="meta">{" · ".join(where)}</p>' if where else "") + form
    return _page("jobs", head, live=live, now=now)


# ------------------------------------------------------------------------------------ job page


def _num(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def _line(line: Line) -> str:
    x1, y1, x2, y2, kind = line
    return f'<line class="{esc(kind)}" x1="{_num(x1)}" y1="{_num(y1)}" x2="{_num(x2)}" y2="{_num(y2)}"/>'


def _text(t: Text) -> str:
    return (
        f'<text class="{esc(t.kind)}" x="{_num(t.x)}" y="{_num(t.y)}" '
        f'text-anchor="{esc(t.anchor)}">{esc(t.text)}</text>'
    )


def _box(b: Box) -> str:
    title = f"<title>{esc(b.title)}</title>" if b.title else ""
    return (
        f'<rect class="{esc(b.kind)}" x="{_num(b.x)}" y="{_num(b.y)}" width="{_num(b.w)}" '
        f'height="{_num(b.h)}" rx="2">{title}</rect>'
    )


def svg(geo: Geometry, names: Mapping[str, str] | None = None) -> str:
    """The timeline as inline SVG: a ``g.bar`` per incarnation (its epoch, state, cause, the rule of
    the requeue that followed and, in a fleet, the cluster it was placed on as data attributes), each box
    with a ``<title>`` (a tooltip)."""
    out = [
        f'<svg class="timeline" viewBox="0 0 {_num(geo.width)} {_num(geo.height)}" '
        f'width="{_num(geo.width)}" height="{_num(geo.height)}" role="img" '
        f'aria-label="{len(geo.rows)} incarnation(s) on a timeline" xmlns="http://www.w3.org/2000/svg">',
        *map(_line, geo.grid),
        *map(_text, geo.axis),
    ]
    for row in geo.rows:
        bar = row.bar
        rule = bar.follow.rule if bar.follow else ""
        where = cluster_label(bar, names)
        out.append(
            f'<g class="bar" data-epoch="{esc(bar.epoch)}" data-state="{esc(bar.state.value)}" '
            f'data-cause="{esc(bar.cause.value)}" data-rule="{esc(rule)}"'
            + (f' data-cluster="{esc(where)}">' if where else ">")
        )
        out += [*map(_line, row.lines), *map(_box, row.boxes), *map(_text, row.texts), "</g>"]
    out.append("</svg>")
    return "".join(out)


def _legend(tl: Timeline) -> str:
    seen = {seg.state for bar in tl.bars for seg in bar.segments} | {
        bar.state for bar in tl.bars if bar.state.terminal
    }
    return (
        '<p class="legend">'
        + " ".join(f'<span class="key {esc(s.value)}"></span>{esc(s.value)}' for s in State if s in seen)
        + "</p>"
    )


def _evidence(ev: Evidence) -> str:
    out = [f"<li><code>{esc(ev.kind)}/{esc(ev.name)}</code>"]
    if ev.reason:
        out.append(f' <span class="reason">{esc(ev.reason)}</span>')
    if ev.exit_code is not None:
        out.append(f" exit code {esc(ev.exit_code)}")
    if ev.node:
        out.append(f" on node {esc(ev.node)}")
    if ev.at is not None:
        out.append(f' <span class="meta">at {esc(when(ev.at))}</span>')
    if ev.message:
        out.append(f'<div class="message">{esc(ev.message)}</div>')
    if ev.output:
        out.append('<pre class="output">' + "\n".join(esc(line) for line in ev.output) + "</pre>")
    out.append("</li>")
    return "".join(out)


def _incarnations(rec: JobRecord, tl: Timeline, names: Mapping[str, str] | None) -> str:
    out: list[str] = []
    for bar in reversed(tl.bars):  # the newest first: that is what one looks for
        current = bar.epoch.n == rec.epoch.n
        where = cluster_label(bar, names)
        head = f"{_pill(bar.state, bar.label)}" + (
            f' <span class="on">on {esc(where)}</span>' if where else ""
        )
        took = f"{clock(bar.start)} → {clock(bar.end)}" + (" (still going)" if bar.live else "")
        out.append(
            f'<article class="incarnation" data-epoch="{esc(bar.epoch)}"><h3>incarnation '
            f'<code>{esc(bar.epoch)}</code> {head} <span class="meta">{esc(took)} · {esc(age(bar.end - bar.start))}'
            f"{'' if bar.placed else ' · never placed'}</span></h3>"
        )
        items: list[str] = []
        if current and rec.outcome.evidence:
            items.extend(_evidence(ev) for ev in rec.outcome.evidence)
        else:
            items.extend(f"<li>{esc(text)}</li>" for text in bar.evidence)
        if items:
            out.append('<ul class="evidence">' + "".join(items) + "</ul>")
        elif bar.state.terminal:
            out.append('<p class="meta">no evidence recorded</p>')
        for mark in bar.marks:
            out.append(f'<p class="mark-note">{esc(clock(mark.at))} {esc(mark.text)}</p>')
        if bar.follow is not None:
            out.append(f'<p class="then">then {esc(bar.follow.kind)}: {esc(bar.follow.text)}</p>')
        if bar.final:
            out.append(f'<p class="then">{esc(bar.final)}</p>')
        out.append("</article>")
    return "".join(out)


def _tail(rec: JobRecord, tail: Tail) -> str:
    nodes = " ".join(
        f'<a class="node{" chosen" if n == tail.node else ""}" href="{esc(job_href(rec.job_id, node=n))}">node {n}</a>'
        for n in range(max(tail.nodes, 1))
    )
    body = (
        '<pre class="output" id="tail">' + "\n".join(esc(line) for line in tail.lines) + "</pre>"
        if tail.lines
        else f'<p class="meta" id="tail">{esc(tail.note or "no output")}</p>'
    )
    # The output is the handle's: during a requeue that is still the previous incarnation's.
    epoch = rec.handle.identity.epoch if rec.handle is not None else rec.epoch
    return (
        f'<section><h2>Output <span class="meta">incarnation {esc(epoch)}, node {tail.node}, last '
        f'{len(tail.lines)} line(s)</span></h2><p class="nodes">{nodes}</p>{body}</section>'
    )


def _history(history: Sequence[Transition]) -> str:
    rows = []
    for t in history:
        state = _pill(t.state) if t.state is not None else ""
        cause = _cause(t.cause) if t.cause is not None and t.cause is not Cause.NONE else ""
        rows.append(
            f'<tr><td class="num">{esc(when(t.at))}</td><td>{esc(t.epoch or "")}</td>'
            f"<td>{esc(t.actor.value)}</td><td>{esc(t.what)}</td><td>{state} {cause}</td>"
            f'<td class="why">{esc(t.why)}</td></tr>'
        )
    return (
        '<section><h2>History</h2><table class="history"><thead><tr><th>at (UTC)</th><th>epoch</th>'
        "<th>actor</th><th>what</th><th>state</th><th>why</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></section>"
    )


def job_page(
    row: JobRow,
    history: Sequence[Transition],
    tail: Tail,
    *,
    now: float,
    names: Mapping[str, str] | None = None,
) -> str:
    """One job: its summary, its incarnations on a timeline, the evidence of each, the output tail of
    the chosen node, its history as text, and its spec. ``names`` (a fleet's: cluster identity -> name)
    names on each incarnation the cluster it was placed on."""
    rec = row.record
    tl = timeline(history, now)
    facts: list[tuple[str, str]] = [
        ("state", _pill(rec.state)),
        ("cause", _cause(rec.outcome.cause)),
        ("epoch", f"<code>{esc(rec.epoch)}</code>"),
        ("cluster", row.cluster_html()),
        ("handle", f"<code>{esc(rec.handle)}</code>" if rec.handle else "-"),
        ("created", f"{esc(when(rec.created_at))} UTC ({esc(age(now - rec.created_at))} ago)"),
        ("updated", f"{esc(when(rec.updated_at))} UTC"),
    ]
    # The plan is the next step while the incarnation waits to be placed (a requeue's backoff), and the
    # last word once given up (fail, hold); otherwise it is what was decided before, not what is next.
    waiting = not rec.outcome.terminal and current_handle(rec) is None
    if rec.plan is not None and (waiting or rec.plan.action in FINAL_PLANS):
        nb = f" not before {when(rec.plan.not_before)} UTC" if rec.plan.not_before is not None else ""
        facts.append(("plan", esc(f"{rec.plan.action.value}: {rec.plan.reason}{nb}")))
    for flag, text in (
        (rec.hold_requested, "hold requested"),
        (rec.cancel_requested, "cancel requested"),
    ):
        if flag:
            facts.append(("intent", esc(text)))
    if rec.unknown_write:
        facts.append(("unknown write", esc(rec.unknown_write)))
    if rec.lease is not None:
        facts.append(("lease", esc(f"{rec.lease.holder} until {when(rec.lease.expires_at)} UTC")))
    summary = '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    picture = (
        svg(layout(tl, names=names), names) + _legend(tl)
        if tl.bars
        else '<p class="meta">no incarnation recorded yet</p>'
    )
    spec = json.dumps(rec.spec.to_json(), indent=2, sort_keys=False)
    head = f'<p class="crumbs"><a href="/">all jobs</a></p><h1>job <code>{esc(rec.job_id)}</code></h1>'
    live = (
        summary
        + f'<section><h2>Incarnations <span class="meta">{len(tl.bars)}</span></h2>'
        + f'<div class="scroll">{picture}</div></section>'
        + f"<section><h2>Evidence</h2>{_incarnations(rec, tl, names)}</section>"
        + _tail(rec, tail)
        + _history(history)
        + f'<section><h2>Spec</h2><pre class="spec">{esc(spec)}</pre></section>'
    )
    return _page(f"job {rec.job_id}", head, live=live, job=rec.job_id, now=now)
