"""How the CLI shows things: plain text for pipes, rich tables and colour on a terminal, JSON for programs.

rich is imported only when stdout is a terminal, so scripts and ``--json`` never pay for it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TextIO

from msgspec import Struct, field

from dispatch.model import (
    TERMINAL_STATES,
    Capabilities,
    Cause,
    Epoch,
    Evidence,
    JobRecord,
    Outcome,
    Policy,
    State,
    Transition,
)

__all__ = ["Incarnation", "Renderer", "incarnations_of", "probe_progress", "when"]

_COLOURS = {
    State.SUCCEEDED: "green",
    State.FAILED: "red",
    State.LOST: "magenta",
    State.CANCELLED: "yellow",
    State.RUNNING: "cyan",
    State.HELD: "blue",
}


def when(at: float | None) -> str:
    """An epoch time as UTC ``YYYY-MM-DD HH:MM:SS``."""
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


def printable(text: str) -> str:
    """``text`` safe to write to a terminal: every control character (an escape sequence's ESC, a
    carriage return, a bell; C0, DEL and C1) shown as its escape (``\\x1b``), so that a value a job or
    a cluster wrote cannot move the cursor, recolour or retitle the terminal, or hide what follows."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode() for ch in text
    )


def outcome_text(outcome: Outcome) -> str:
    return str(outcome)


class Renderer:
    """Writes results to ``out`` (stdout) in the chosen form: JSON, rich (terminal) or plain."""

    def __init__(
        self,
        *,
        as_json: bool = False,
        out: TextIO | None = None,
        colour: bool | None = None,
        output: str = "text",
        no_headers: bool = False,
        epoch_times: bool = False,
    ) -> None:
        self.out = out if out is not None else sys.stdout
        self.output = "json" if as_json else output
        self.as_json = self.output in ("json", "yaml")
        """Machine-readable output (``-o json`` or ``-o yaml``): values go through :meth:`json`."""
        self.no_headers = no_headers
        self.epoch_times = epoch_times
        tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.rich = (tty if colour is None else colour) and self.output in ("text", "wide")
        self._console: Any = None
        self._documents = 0

    # ------------------------------------------------------------------ primitives

    def line(self, text: str = "", *, style: str | None = None) -> None:
        if self.rich:  # through the console, so a live progress line is redrawn below the text
            self.console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def text(self, text: str) -> None:
        """Text as it is (a script), ending with one newline."""
        self.out.write(text if text.endswith("\n") else text + "\n")
        self.out.flush()

    def json(self, value: Any) -> None:
        """One value for programs: a JSON line (``-o json``) or a YAML document (``-o yaml``); times as
        RFC 3339 text unless epoch seconds were asked for."""
        if not self.epoch_times:
            value = rfc3339_times(value)
        if self.output == "yaml":
            self._documents += 1
            self.out.write(("---\n" if self._documents > 1 else "") + _yaml(value, sort_keys=True))
        else:
            self.out.write(json.dumps(value, sort_keys=True) + "\n")
        self.out.flush()

    def names(self, job_ids: Iterable[str]) -> None:
        """``-o name``: only the job ids, one a line (for ``xargs``)."""
        for job_id in job_ids:
            self.line(job_id)

    @property
    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console  # deferred: rich is only for terminals

            self._console = Console(file=self.out)
        return self._console

    def progress(self, text: str) -> AbstractContextManager[Any]:
        """A live status line (spinner) on a terminal while waiting; nothing elsewhere. The returned
        object's ``update(text)`` changes it (``None`` when there is no status line)."""
        if not self.rich:
            return nullcontext(None)
        status: AbstractContextManager[Any] = self.console.status(text)
        return status

    def live_jobs(self) -> AbstractContextManager[Any]:
        """On a terminal, a live table with one line per job (state, cause, epoch, elapsed), redrawn as
        records change; its ``update(records)`` replaces the lines. ``None`` when not a terminal."""
        if not self.rich:
            return nullcontext(None)
        from rich.live import Live

        renderer = self

        class _Jobs:
            def __init__(self) -> None:
                self.records: dict[str, JobRecord] = {}
                self.live = Live(
                    self._table(), console=renderer.console, auto_refresh=True, refresh_per_second=1
                )

            def _table(self) -> Any:
                from rich.table import Table

                table = Table(show_edge=False, header_style="bold")
                for h in ("job", "state", "cause", "epoch", "elapsed"):
                    table.add_column(h)
                now = time.time()
                for r in self.records.values():
                    table.add_row(
                        r.job_id,
                        r.state.value,
                        r.outcome.cause.value,
                        str(r.epoch),
                        f"{max(0.0, (r.updated_at if r.outcome.terminal else now) - r.created_at):.0f}s",
                        style=_COLOURS.get(r.state),
                    )
                return table

            def update(self, rec: JobRecord) -> None:
                self.records[rec.job_id] = rec
                self.live.update(self._table())

            def __enter__(self) -> _Jobs:
                self.live.__enter__()
                return self

            def __exit__(self, *exc: object) -> None:
                self.live.__exit__(None, None, None)

        return _Jobs()

    def table(
        self, headers: Sequence[str], rows: Iterable[Sequence[str]], *, styles: Sequence[str] = ()
    ) -> None:
        rows = [list(r) for r in rows]
        if self.rich:
            from rich.table import Table

            table = Table(show_edge=False, header_style="bold", show_header=not self.no_headers)
            for h in headers:
                table.add_column(h)
            for i, row in enumerate(rows):
                table.add_row(*row, style=styles[i] if i < len(styles) and styles[i] else None)
            self.console.print(table)
            return
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
        if not self.no_headers:
            self.line("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
        for row in rows:
            self.line("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())

    # ------------------------------------------------------------------ dispatch's values

    def record(self, rec: JobRecord, *, gone: str | None = None) -> None:
        """A record; ``gone`` says why this process does not refresh it — its cluster is another one, or
        is gone — so it is shown as last known."""
        if self.output == "name":
            self.line(rec.job_id)
            return
        if self.as_json:
            self.json({**rec.to_json(), "lastKnown": gone} if gone else rec.to_json())
            return
        pairs: list[tuple[str, str]] = [
            ("job", rec.job_id),
            ("state", rec.state.value),
            ("cause", rec.outcome.cause.value),
            ("epoch", str(rec.epoch)),
            ("handle", str(rec.handle) if rec.handle else "-"),
            ("created", when(rec.created_at)),
            ("updated", when(rec.updated_at)),
        ]
        if rec.hold_requested:
            pairs.append(("hold", "requested"))
        if rec.cancel_requested:
            pairs.append(("cancel", "requested"))
        if rec.unknown_write:
            pairs.append(("unknown", rec.unknown_write))
        if gone:
            pairs.append(("cluster", f"{gone}; shown as last known"))
        elif rec.cluster and self.output == "wide":
            pairs.append(("cluster", rec.cluster))
        width = max(len(k) for k, _ in pairs) + 1
        for key, value in pairs:
            style = _COLOURS.get(rec.state) if key == "state" else None
            self.line(f"{(key + ':').ljust(width)} {value}", style=style)
        self.evidence(rec.outcome.evidence)

    def evidence(self, evidence: Sequence[Evidence], indent: str = "") -> None:
        for ev in evidence:
            self.line(f"{indent}evidence: {printable(str(ev))}")
            for out_line in ev.output:
                self.line(f"{indent}  | {printable(out_line)}")

    def records(self, recs: Sequence[JobRecord], *, gone: Mapping[str, str] | None = None) -> None:
        """A table of records; those in ``gone`` (job id → why) are marked ``(last known)``: their
        cluster is another one, or is gone."""
        gone = gone or {}
        if self.output == "name":
            self.names(r.job_id for r in recs)
            return
        if self.as_json:
            self.json(
                [
                    {**r.to_json(), "lastKnown": gone[r.job_id]} if r.job_id in gone else r.to_json()
                    for r in recs
                ]
            )
            return
        wide = self.output == "wide"
        headers = ["job", "state", "cause", "epoch", "updated"]
        if wide:
            headers += ["created", "handle", "intents"]
        rows = []
        for r in recs:
            row = [
                r.job_id,
                r.state.value + (" (last known)" if r.job_id in gone else ""),
                r.outcome.cause.value,
                str(r.epoch),
                when(r.updated_at),
            ]
            if wide:
                intents = [k for k, on in (("hold", r.hold_requested), ("cancel", r.cancel_requested)) if on]
                row += [when(r.created_at), str(r.handle) if r.handle else "-", ",".join(intents) or "-"]
            rows.append(row)
        self.table(headers, rows, styles=[_COLOURS.get(r.state, "") for r in recs])

    def summary(self, rec: JobRecord, what: str = "") -> None:
        """One line about a record (after a write)."""
        if self.output == "name":
            self.line(rec.job_id)
            return
        if self.as_json:
            self.json(rec.to_json())
            return
        prefix = f"{what} " if what else ""
        self.line(
            f"{prefix}{rec.job_id}@{rec.epoch}: {outcome_text(rec.outcome)}", style=_COLOURS.get(rec.state)
        )

    def transition(self, job_id: str, t: Transition) -> None:
        if self.as_json:
            self.json({"jobId": job_id, "transition": t.to_json()})
            return
        parts = [when(t.at), f"{job_id}@{t.epoch}" if t.epoch else job_id, t.actor.value, t.what]
        if t.state is not None and t.state.value != t.what:
            parts.append(t.state.value)
        if t.cause is not None and t.cause.value != "none":
            parts.append(f"({t.cause.value})")
        text = "  ".join(parts)
        if t.why:
            text += f"  — {t.why}"
        self.line(printable(text), style=_COLOURS.get(t.state) if t.state else None)

    def transitions(self, job_id: str, ts: Sequence[Transition], *, incarnations: bool = False) -> None:
        if self.as_json:
            self.json([t.to_json() for t in ts])
            return
        for t in ts:
            self.transition(job_id, t)
        if incarnations:
            self.line("incarnations:")
            for inc in incarnations_of(ts):
                text = f"  {inc.epoch.n} ({job_id}@{inc.epoch}): {inc.state.value} / {inc.cause.value}"
                if inc.then:
                    text += f"  — {inc.then}"
                self.line(text, style=_COLOURS.get(inc.state))

    def outcome(self, rec: JobRecord) -> None:
        """The final typed outcome of ``dispatch run``."""
        if self.as_json:
            self.json({"record": rec.to_json()})
            return
        o = rec.outcome
        self.line(
            f"outcome: {o.state.value} / {o.cause.value}  ({rec.job_id}@{rec.epoch})",
            style=_COLOURS.get(o.state),
        )
        self.evidence(o.evidence, indent="  ")

    def describe(
        self, rec: JobRecord, ts: Sequence[Transition], steps: Sequence[str], *, gone: str | None = None
    ) -> None:
        """One job whole: the record, the spec, every incarnation as a timeline (states, causes,
        evidence, the rule of each requeue), its cluster objects, and the next steps."""
        incs = incarnations_of(ts)
        if self.as_json:
            self.json(
                {
                    "record": rec.to_json(),
                    "incarnations": [i.to_json() for i in incs],
                    "history": [t.to_json() for t in ts],
                    "next": list(steps),
                }
                | ({"cluster": {"gone": gone}} if gone else {})
            )
            return
        self.record(rec, gone=gone)
        spec = rec.spec
        self.line("spec:")
        self.line(f"  command: {printable(str(list(spec.command)))}")
        self.line(f"  nodes: {spec.nodes}")
        if spec.env:
            self.line(f"  env: {printable(', '.join(f'{k}={v}' for k, v in spec.env.items()))}")
        for name, value in spec.extensions.to_json().items():
            self.line(f"  {name}: {json.dumps(value, sort_keys=True)}")
        policy = rec.policy
        if policy is None:
            shown = "the cluster default"
        elif policy == Policy():
            shown = "no requeue: every failure is final (`run --no-supervise`)"
        else:
            shown = json.dumps(policy.to_json())
        self.line(f"  policy: {shown}")
        self.line("incarnations:")
        for inc in incs:
            span = f"{when(inc.since)} → {when(inc.until) if inc.until is not None else 'now'}"
            self.line(
                f"  {inc.epoch}  {inc.state.value} / {inc.cause.value}  ({span})",
                style=_COLOURS.get(inc.state),
            )
            for obj in inc.objects:
                self.line(f"    object: {obj}")
            for step in inc.steps:
                self.line(f"    {printable(step)}")
            if inc.then:
                self.line(f"    then: {printable(inc.then)}")
        if steps:
            self.line("next:")
            for step in steps:
                self.line(f"  {step}")

    def capabilities(self, adapter: str, source: str, store: str, caps: Capabilities) -> None:
        if self.as_json:
            self.json({"adapter": adapter, "config": source, "store": store, "capabilities": caps.to_json()})
            return
        self.line(f"adapter:  {adapter}")
        self.line(f"config:   {source}")
        self.line(f"store:    {store}")
        flags = caps.to_json()
        self.line(f"{'mode:':<18}{caps.mode.value.replace('_', '-')}")
        for key in (
            "holds",
            "watch",
            "output",
            "cessation",
            "sharedCheckpoint",
            "queueing",
        ):
            self.line(f"{key + ':':<18}{'yes' if flags[key] else 'no'}")
        self.line(f"{'extensions:':<18}{', '.join(sorted(caps.extensions)) or '-'}")
        limits = caps.limits.to_json()
        self.line(f"{'limits:':<18}{', '.join(f'{k}={v}' for k, v in limits.items()) or '-'}")
        for note in caps.notes:
            self.line(f"note: {note}")

    def mapping(self, value: Mapping[str, Any], *, yaml_form: bool = True) -> None:
        """A native object (dry run) or a schema: YAML for people, JSON with ``--json``."""
        if self.output == "yaml":
            yaml_form = True
        elif self.as_json or not yaml_form:
            self.out.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
            self.out.flush()
            return
        self.out.write(_yaml(value, sort_keys=False))
        self.out.flush()


TIME_KEYS = frozenset({"at", "createdAt", "updatedAt", "expiresAt", "notBefore"})
"""The keys of dispatch's JSON whose numbers are times (epoch seconds in the model's own JSON)."""


def rfc3339(at: float) -> str:
    """An epoch time as RFC 3339 text in UTC, to the microsecond: ``2026-12-01T17:28:39.123456Z``."""
    import datetime

    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat().replace("+00:00", "Z")


def rfc3339_times(value: Any) -> Any:
    """``value`` (plain JSON) with the numbers under :data:`TIME_KEYS` as RFC 3339 text."""
    if isinstance(value, Mapping):
        return {
            k: rfc3339(v)
            if k in TIME_KEYS and isinstance(v, int | float) and not isinstance(v, bool)
            else rfc3339_times(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [rfc3339_times(v) for v in value]
    return value


def _yaml(value: Any, *, sort_keys: bool) -> str:
    """``value`` as YAML for people: a text of several lines (a script, a message) as a literal block,
    line for line, rather than one quoted string full of ``\\n``."""
    import yaml  # deferred: only -o yaml and dry runs need it

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        # PyYAML's emitter falls back to a quoted string where a block cannot hold the text exactly.
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)

    Dumper.add_representer(str, text)
    # allow_unicode: else one character outside ASCII (a script's comment, a job's message) turns the
    # whole text into one escaped, double-quoted string (PyYAML's block needs every character printable).
    dumped: str = yaml.dump(
        _plain(value), Dumper=Dumper, sort_keys=sort_keys, default_flow_style=False, allow_unicode=True
    )
    return dumped


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class _ProbeLog(logging.Handler):
    """Shows an adapter's ``probe: ...`` log lines as they come: in the spinner, or on stderr."""

    def __init__(self, show: Any) -> None:
        super().__init__(logging.INFO)
        self._show = show

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a broken log call must not break the command
            return
        if text.startswith("probe:"):
            self._show(text)


@contextmanager
def probe_progress(renderer: Renderer, text: str, quiet: bool = False) -> Iterator[None]:
    """While a cluster opens: a spinner (terminal) naming what the adapter's probe waits for, else the
    probe's steps as plain lines on stderr; nothing with ``quiet`` (``--json``).

    Adapters report their probe through :mod:`logging` (``INFO`` records starting ``probe:``), so the
    host needs no adapter import to show them."""
    if quiet:
        yield
        return
    root = logging.getLogger()
    level = root.level
    with renderer.progress(text) as status:
        if status is not None:

            def show(line: str) -> None:
                status.update(f"{text}: {line}")
        else:

            def show(line: str) -> None:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()

        handler = _ProbeLog(show)
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        try:
            yield
        finally:
            root.removeHandler(handler)
            root.setLevel(level)


class Incarnation(Struct):
    """One incarnation as the history tells it: its epoch, how it ended (or where it is), what came next,
    when it began and ended, the cluster objects it was placed as, and the evidence of its states."""

    epoch: Epoch
    state: State = State.PENDING
    cause: Cause = Cause.NONE
    then: str = ""
    since: float | None = None
    until: float | None = None
    objects: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": str(self.epoch),
            "state": self.state.value,
            "cause": self.cause.value,
            "then": self.then,
            "since": self.since,
            "until": self.until,
            "objects": list(self.objects),
            "steps": list(self.steps),
        }


def incarnations_of(ts: Sequence[Transition]) -> list[Incarnation]:
    """Every incarnation in a history, oldest first, with its last state and why it was followed by the
    next one (a requeue and the policy rule that allowed it, a resubmit) or given up."""
    out: dict[int, Incarnation] = {}
    current: Incarnation | None = None
    for t in ts:
        if t.epoch is not None and t.epoch.n not in out:
            if current is not None and not current.then:
                if t.what == "requeued":
                    current.then = f"requeued as {t.epoch}: {t.why}"
                elif t.what == "resubmitted":
                    current.then = f"resubmitted as {t.epoch} by the user"
            current = out[t.epoch.n] = Incarnation(t.epoch, since=t.at)
        if current is None:
            continue
        if t.what in ("gave up", "held for a person"):
            current.then = f"{t.what}: {t.why}"
        if t.what == "started" and t.why:
            current.objects.append(t.why)
        if t.state is not None and t.what not in ("requeued", "resubmitted"):
            current.state = t.state
            current.cause = t.cause if t.cause is not None else Cause.NONE
            current.steps.append(
                f"{when(t.at)}  {t.actor.value} {t.what}"
                + (f" ({t.cause.value})" if t.cause is not None and t.cause is not Cause.NONE else "")
                + (f"  — {t.why}" if t.why and t.what != "started" else "")
            )
            if t.state in TERMINAL_STATES and current.until is None:
                current.until = t.at
    return list(out.values())
