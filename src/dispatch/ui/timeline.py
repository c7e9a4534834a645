"""A job's incarnations on a timeline: pure functions from a record's history to bars, then to geometry.

:func:`timeline` reads the history (the append-only transitions every store keeps) and returns one
:class:`Bar` per incarnation: from its placement on the cluster to its end, split into the states it
went through, with the cause that ended it and how the next incarnation followed (a requeue under a
policy rule after a backoff, or a resubmit). :func:`layout` turns that into rectangles and labels on a
canvas of a given width, which :mod:`dispatch.ui.pages` prints as SVG. Nothing here reads a clock:
``now`` is an argument, so the same history always draws the same picture.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dispatch.model import Cause, Epoch, State, Transition

__all__ = [
    "Bar",
    "Box",
    "Follow",
    "Geometry",
    "Line",
    "Mark",
    "Row",
    "Segment",
    "Text",
    "Timeline",
    "cluster_label",
    "layout",
    "ticks",
    "timeline",
]

# Transitions that open the next incarnation: they carry its epoch, and belong to it, not to the one
# they follow.
_OPENERS = ("requeued", "resubmitted")
# Transitions that say the supervisor stopped here for good (the policy gave up, or waits for a person).
_FINAL = ("gave up", "held for a person")


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of one state within an incarnation."""

    state: State
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Mark:
    """Something that happened to an incarnation without changing its state (hold, cancel requested,
    a start whose outcome is unknown...): a tick on its bar."""

    at: float
    text: str


@dataclass(frozen=True, slots=True)
class Follow:
    """How the next incarnation followed this one: ``requeued`` (by the supervisor, under a policy
    rule, after a backoff) or ``resubmitted`` (by the user). ``rule`` and ``backoff`` are what the
    history's requeue line names; empty/None when it does not name them (``text`` is its own words)."""

    kind: str
    at: float
    epoch: Epoch
    text: str
    rule: str = ""
    backoff: float | None = None
    attempt: str = ""

    @property
    def label(self) -> str:
        """One line for the picture: ``requeued as 2.1 · rule preempted · backoff 1 s``."""
        if self.kind != "requeued":
            return f"resubmitted as {self.epoch}"
        parts = [f"requeued as {self.epoch}"]
        if self.attempt:
            parts.append(self.attempt)
        if self.rule:
            parts.append(f"rule {self.rule}")
        if self.backoff is not None:
            parts.append(f"backoff {_seconds(self.backoff)}")
        return " · ".join(parts)


@dataclass(frozen=True, slots=True)
class Bar:
    """One incarnation: placed at ``start``, ended (or still going, ``live``) at ``end``."""

    epoch: Epoch
    start: float
    end: float
    segments: tuple[Segment, ...]
    state: State
    cause: Cause
    placed: bool
    live: bool
    evidence: tuple[str, ...] = ()
    marks: tuple[Mark, ...] = ()
    follow: Follow | None = None
    final: str = ""
    cluster: str = ""
    """The identity of the cluster it was placed on (its last placing line's; empty when the history
    does not say)."""

    @property
    def label(self) -> str:
        """What ended it (its cause; the state when there is no cause), or where it is now."""
        if self.state.terminal and self.cause is not Cause.NONE:
            return self.cause.value
        return self.state.value


@dataclass(frozen=True, slots=True)
class Timeline:
    """Every incarnation of one job, oldest first, and the span of time they cover."""

    start: float
    end: float
    bars: tuple[Bar, ...]


@dataclass
class _Group:
    epoch: Epoch
    items: list[Transition] = field(default_factory=list)


def _groups(history: Sequence[Transition]) -> list[_Group]:
    """The history split by incarnation (epoch ``N``), in order. An entry without an epoch belongs to
    the incarnation before it (entries before any epoch are dropped: there is nothing to draw them on)."""
    groups: list[_Group] = []
    for t in history:
        if t.epoch is not None and (not groups or groups[-1].epoch.n != t.epoch.n):
            if any(g.epoch.n == t.epoch.n for g in groups):
                # A late entry of an older incarnation (e.g. a write settled after the requeue).
                next(g for g in groups if g.epoch.n == t.epoch.n).items.append(t)
                continue
            groups.append(_Group(t.epoch))
        if groups:
            groups[-1].items.append(t)
    return groups


_UNDER = re.compile(r"\bunder rule ([A-Za-z0-9_.-]+)")
_RULE = re.compile(r"\b(default )?rule ([a-z_]+)\b")
_AFTER = re.compile(r"\bafter (\d+(?:\.\d+)?(?:e[+-]?\d+)?) s\b")
_BACKOFF = re.compile(r"\bbackoff (\d+(?:\.\d+)?(?:e[+-]?\d+)?) s\b")
_ATTEMPT = re.compile(r"\brequeue (\d+) of (\d+)\b")


def _follow(t: Transition) -> Follow:
    """Read the rule, the attempt and the backoff from a requeue line (``decide.requeued`` writes
    "... policy rule preempted: requeue (max 3, backoff 1 s, ...): requeue 1 of 3 under rule preempted,
    after 1 s"; before rules had their own budgets, the line ended "requeue 1 of 3, after 1 s", and the
    rule was the one the policy text names, ``default`` for the default rule). The wait actually
    applied ("after X s") wins over the rule's base backoff."""
    assert t.epoch is not None
    if t.what != "requeued":
        return Follow(kind=t.what, at=t.at, epoch=t.epoch, text=t.why)
    under = _UNDER.search(t.why)
    named = _RULE.search(t.why)
    rule = under.group(1) if under else ("default" if named.group(1) else named.group(2)) if named else ""
    wait = _AFTER.search(t.why) or _BACKOFF.search(t.why)
    attempt = _ATTEMPT.search(t.why)
    return Follow(
        kind="requeued",
        at=t.at,
        epoch=t.epoch,
        text=t.why,
        rule=rule,
        backoff=float(wait.group(1)) if wait else None,
        attempt=f"{attempt.group(1)} of {attempt.group(2)}" if attempt else "",
    )


def _bar(group: _Group, following: _Group | None, now: float) -> Bar:
    items = group.items
    opener_at = items[0].at
    placed_at = next((t.at for t in items if t.what in ("started", "adopted")), None)
    if placed_at is None:
        # Never placed by a start we recorded: begin where the cluster first reported something.
        placed_at = next(
            (t.at for t in items if t.state is not None and t.state is not State.PENDING), opener_at
        )
    state, cause = State.PENDING, Cause.NONE
    seg_start = placed_at
    segments: list[Segment] = []
    evidence: list[str] = []
    marks: list[Mark] = []
    final = ""
    end: float | None = None
    for t in items:
        if t.what in _FINAL:
            final = f"{t.what}: {t.why}" if t.why else t.what
            continue
        if t.state is None or t.what in _OPENERS:
            if t.what not in _OPENERS and t.what != "started" and end is None and t.at >= placed_at:
                marks.append(Mark(t.at, f"{t.what}: {t.why}" if t.why else t.what))
            continue
        if end is not None:
            continue  # a terminal incarnation does not change any more
        if t.why and t.cause is not None and t.cause is not Cause.NONE:
            # A later reading that repeats an earlier one whole (and adds to it) replaces it.
            evidence = [e for e in evidence if e not in t.why] + [t.why]
        at = max(t.at, placed_at)
        if t.state is not state:
            if at > seg_start:
                segments.append(Segment(state, seg_start, at))
            state, seg_start = t.state, at
        cause = t.cause if t.cause is not None else Cause.NONE
        if t.state.terminal:
            end = at
    live = False
    if end is None:
        # Not ended: it runs until now, or until the next incarnation took over (a record moved on).
        end = following.items[0].at if following is not None else max(now, seg_start)
        live = following is None
        if end > seg_start:
            segments.append(Segment(state, seg_start, end))
    follow = None
    if following is not None and following.items[0].what in _OPENERS:
        follow = _follow(following.items[0])
    return Bar(
        epoch=group.epoch,
        start=placed_at,
        end=end,
        segments=tuple(segments),
        state=state,
        cause=cause,
        placed=any(t.what in ("started", "adopted") for t in items),
        live=live,
        evidence=tuple(evidence),
        marks=tuple(marks),
        follow=follow,
        final=final,
        cluster=next((t.cluster for t in reversed(items) if t.cluster), ""),
    )


def timeline(history: Sequence[Transition], now: float) -> Timeline:
    """The incarnations in ``history`` (oldest first) as bars; an incarnation that has not ended runs
    until ``now``."""
    groups = _groups(history)
    bars = tuple(_bar(g, groups[i + 1] if i + 1 < len(groups) else None, now) for i, g in enumerate(groups))
    if not bars:
        at = history[0].at if history else now
        return Timeline(at, at, ())
    # From the first placement: what came before it (the submission) is not drawn.
    start = min(b.start for b in bars)
    end = max(b.end for b in bars)
    return Timeline(start, end, bars)


# ------------------------------------------------------------------------------------ geometry


@dataclass(frozen=True, slots=True)
class Box:
    """A rectangle; ``kind`` is its CSS class (a state's name, ``gap``, ``mark``, ``end``)."""

    x: float
    y: float
    w: float
    h: float
    kind: str
    title: str = ""


@dataclass(frozen=True, slots=True)
class Text:
    """A label; ``anchor`` is SVG's ``text-anchor`` (``start``/``end``)."""

    x: float
    y: float
    text: str
    kind: str
    anchor: str = "start"


Line = tuple[float, float, float, float, str]
"""A line from ``(x1, y1)`` to ``(x2, y2)`` with its CSS class (``tick``, ``wait``)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One incarnation's drawing: its bar's boxes, its labels, and the line to the next one."""

    bar: Bar
    boxes: tuple[Box, ...]
    texts: tuple[Text, ...]
    lines: tuple[Line, ...]


@dataclass(frozen=True, slots=True)
class Geometry:
    """What to draw, in pixels, on a ``width`` x ``height`` canvas: the time axis, then a row per
    incarnation."""

    width: float
    height: float
    axis: tuple[Text, ...]
    grid: tuple[Line, ...]
    rows: tuple[Row, ...]


LEFT = 64.0
"""Room for the epoch (and under it the cluster) at the left of each row (pixels)."""
CLUSTER_CHARS = 9
"""A cluster's name under the epoch is cut to this many characters (the bar's tooltip has it whole)."""
RIGHT = 16.0
ROW = 58.0
BAR = 18.0
TOP = 26.0
END_CAP = 6.0
"""The width of the cap that shows a terminal state at a bar's end (so an instant outcome shows)."""


def cluster_label(bar: Bar, names: Mapping[str, str] | None) -> str:
    """What a bar says of its cluster: its name (its identity when it has none), only where ``names``
    is given (a fleet's page)."""
    if names is None or not bar.cluster:
        return ""
    return names.get(bar.cluster) or bar.cluster


def ticks(start: float, end: float, most: int = 6) -> list[float]:
    """Round times between ``start`` and ``end`` for the axis: at most ``most``, on a step of 0.1 s to
    a day (1, 2, 5 times a power of ten seconds, 15/30 s, minutes, hours)."""
    span = end - start
    if span <= 0:
        return [start]
    steps = (
        0.1,
        0.2,
        0.5,
        1,
        2,
        5,
        10,
        15,
        30,
        60,
        120,
        300,
        600,
        900,
        1800,
        3600,
        7200,
        21600,
        43200,
        86400,
    )
    step: float | None = next((s for s in steps if span / s <= most), None)
    if step is None:
        step = 86400 * 10 ** math.ceil(math.log10(span / 86400 / most))
    # Whole multiples of the step (counted in steps, so 0.1 s steps add up without drift).
    first = math.ceil(start / step - 1e-9)
    last = math.floor(end / step + 1e-9)
    return [round(i * step, 3) for i in range(first, last + 1)]


def _clock(at: float, fine: bool = False) -> str:
    """``HH:MM:SS`` (UTC); ``fine`` adds tenths, for an axis whose steps are under a second."""
    moment = datetime.fromtimestamp(at, UTC)
    return moment.strftime("%H:%M:%S") + (f".{moment.microsecond // 100_000}" if fine else "")


def _seconds(value: float) -> str:
    return f"{value:g} s"


def layout(tl: Timeline, width: float = 960.0, names: Mapping[str, str] | None = None) -> Geometry:
    """The picture of ``tl`` on a canvas ``width`` pixels wide: per incarnation a row with its epoch and
    the cluster it was placed on (``names``: cluster identity -> what people call it; only when given,
    as a fleet does), a bar from placement to end split into coloured state segments, a cap in the colour
    of its terminal state, ticks for marks, its end label (the cause) and, when one followed, how the next
    incarnation did (rule and backoff); a dashed line leads into a bar from the requeue that made it."""
    span = max(tl.end - tl.start, 1e-9)
    inner = max(width - LEFT - RIGHT, 1.0)

    def x(at: float) -> float:
        return round(LEFT + (at - tl.start) / span * inner, 2)

    height = TOP + ROW * max(len(tl.bars), 1) + 8
    axis: list[Text] = []
    grid: list[Line] = []
    marks = ticks(tl.start, tl.end)
    fine = len(marks) > 1 and marks[1] - marks[0] < 1
    for at in marks:
        tx = x(at)
        grid.append((tx, TOP - 6, tx, height - 8, "tick"))
        axis.append(Text(tx, TOP - 10, _clock(at, fine), "axis", "middle"))
    rows: list[Row] = []
    for i, bar in enumerate(tl.bars):
        boxes: list[Box] = []
        texts: list[Text] = []
        lines: list[Line] = []
        y = TOP + i * ROW + 8
        texts.append(Text(8, y + BAR - 4, str(bar.epoch), "epoch"))
        where = cluster_label(bar, names)
        if where:
            short = where if len(where) <= CLUSTER_CHARS else where[: CLUSTER_CHARS - 1] + "…"
            texts.append(Text(8, y + BAR + 14, short, "cluster"))
        x0, x1 = x(bar.start), x(bar.end)
        on = f" on {where}" if where else ""
        boxes.append(Box(x0, y, max(x1 - x0, 0.0), BAR, "track", f"incarnation {bar.epoch}{on}"))
        for seg in bar.segments:
            sx0, sx1 = x(seg.start), x(seg.end)
            took = _seconds(round(seg.end - seg.start, 1))
            title = f"{seg.state.value} {_clock(seg.start)}–{_clock(seg.end)} ({took})"
            boxes.append(Box(sx0, y, max(sx1 - sx0, 0.5), BAR, seg.state.value, title))
        if bar.state.terminal:
            cap_x = min(max(x1 - END_CAP, LEFT), width - RIGHT - END_CAP)
            boxes.append(Box(cap_x, y - 3, END_CAP, BAR + 6, f"end {bar.state.value}", bar.label))
        for mark in bar.marks:
            boxes.append(Box(x(mark.at) - 1, y - 4, 2, BAR + 8, "mark", mark.text))
        # The end label under the bar's end: right-aligned when the end is in the right half, so that
        # it stays on the canvas.
        anchor = "end" if x1 > LEFT + inner / 2 else "start"
        label = bar.label + (" (live)" if bar.live else "")
        if bar.final:
            label += " · " + bar.final.split(":")[0]
        texts.append(Text(x1, y + BAR + 14, label, f"label {bar.state.value}", anchor))
        if bar.follow is not None:
            texts.append(Text(x1, y + BAR + 28, bar.follow.label, "follow", anchor))
        before = tl.bars[i - 1].follow if i > 0 else None
        if before is not None and before.at < bar.start:
            # The wait between the requeue (or resubmit) and this placement: the backoff, then the
            # previous incarnation's compute going away; dashed, leading into the bar.
            lines.append((x(before.at), y + BAR / 2, x0, y + BAR / 2, "wait"))
            if x0 - x(before.at) > 80:  # room for a word on it
                mid = (x(before.at) + x0) / 2
                texts.append(
                    Text(
                        mid,
                        y + BAR / 2 - 4,
                        f"waited {_seconds(round(bar.start - before.at, 1))}",
                        "wait",
                        "middle",
                    )
                )
        rows.append(Row(bar, tuple(boxes), tuple(texts), tuple(lines)))
    return Geometry(width, height, tuple(axis), tuple(grid), tuple(rows))
