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
from dataclasses import dataclass
from typing import Any, TextIO

from dispatch.model import Capabilities, Cause, Epoch, Evidence, JobRecord, Outcome, State, Transition

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


def outcome_text(outcome: Outcome) -> str:
    return str(outcome)


class Renderer:
    """Writes results to ``out`` (stdout) in the chosen form: JSON, rich (terminal) or plain."""

    def __init__(
        self, *, as_json: bool = False, out: TextIO | None = None, colour: bool | None = None
    ) -> None:
        self.out = out if out is not None else sys.stdout
        self.as_json = as_json
        tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.rich = (tty if colour is None else colour) and not as_json
        self._console: Any = None

    # ------------------------------------------------------------------ primitives

    def line(self, text: str = "", *, style: str | None = None) -> None:
        if self.rich:  # through the console, so a live progress line is redrawn below the text
            self.console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def json(self, value: Any) -> None:
        self.out.write(json.dumps(value, sort_keys=True) + "\n")
        self.out.flush()

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

            table = Table(show_edge=False, header_style="bold")
            for h in headers:
                table.add_column(h)
            for i, row in enumerate(rows):
                table.add_row(*row, style=styles[i] if i < len(styles) and styles[i] else None)
            self.console.print(table)
            return
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
        self.line("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
        for row in rows:
            self.line("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())

    # ------------------------------------------------------------------ dispatch's values

    def record(self, rec: JobRecord, *, gone: str | None = None) -> None:
        """A record; ``gone`` says why its cluster is gone (then it is shown as last known)."""
        if self.as_json:
            self.json({**rec.to_json(), "cluster": {"gone": gone}} if gone else rec.to_json())
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
            pairs.append(("cluster", f"gone: {gone}; shown as last known"))
        width = max(len(k) for k, _ in pairs) + 1
        for key, value in pairs:
            style = _COLOURS.get(rec.state) if key == "state" else None
            self.line(f"{(key + ':').ljust(width)} {value}", style=style)
        self.evidence(rec.outcome.evidence)

    def evidence(self, evidence: Sequence[Evidence], indent: str = "") -> None:
        for ev in evidence:
            self.line(f"{indent}evidence: {ev}")
            for out_line in ev.output:
                self.line(f"{indent}  | {out_line}")

    def records(self, recs: Sequence[JobRecord], *, gone: Mapping[str, str] | None = None) -> None:
        """A table of records; those in ``gone`` (job id → why) are marked ``(cluster gone)``."""
        gone = gone or {}
        if self.as_json:
            self.json(
                [
                    {**r.to_json(), "cluster": {"gone": gone[r.job_id]}} if r.job_id in gone else r.to_json()
                    for r in recs
                ]
            )
            return
        self.table(
            ["job", "state", "cause", "epoch", "updated"],
            [
                [
                    r.job_id,
                    r.state.value + (" (cluster gone)" if r.job_id in gone else ""),
                    r.outcome.cause.value,
                    str(r.epoch),
                    when(r.updated_at),
                ]
                for r in recs
            ],
            styles=[_COLOURS.get(r.state, "") for r in recs],
        )

    def summary(self, rec: JobRecord, what: str = "") -> None:
        """One line about a record (after a write)."""
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
        self.line(text, style=_COLOURS.get(t.state) if t.state else None)

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
        if self.as_json or not yaml_form:
            self.out.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
            self.out.flush()
            return
        import yaml  # deferred: only this command needs it

        self.out.write(yaml.safe_dump(_plain(value), sort_keys=False, default_flow_style=False))
        self.out.flush()


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


@dataclass
class Incarnation:
    """One incarnation as the history tells it: its epoch, how it ended (or where it is), what came next."""

    epoch: Epoch
    state: State = State.PENDING
    cause: Cause = Cause.NONE
    then: str = ""


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
            current = out[t.epoch.n] = Incarnation(t.epoch)
        if current is None:
            continue
        if t.what in ("gave up", "held for a person"):
            current.then = f"{t.what}: {t.why}"
        if t.state is not None and t.what not in ("requeued", "resubmitted"):
            current.state = t.state
            current.cause = t.cause if t.cause is not None else Cause.NONE
    return list(out.values())
