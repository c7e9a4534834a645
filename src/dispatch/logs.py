"""Structured logs for the daemons (``dispatch supervise``, ``dispatch-admission``): JSON lines or text.

dispatch logs through the standard :mod:`logging` module only (loggers under ``dispatch``,
``dispatch_kubeflow`` and ``dispatch_slurm``), so a host application routes it as it likes; :func:`configure` is what the
daemons call for ``--log-format json|text``. A JSON line carries ``time``, ``level``, ``logger``,
``message`` and, when the call site gives them (``extra={...}``), ``job_id``, ``epoch``, ``action`` and
``cause``. Secrets never reach a line: the HTTP client libraries below dispatch are kept at WARNING (at
DEBUG they would log request headers, bearer tokens included), and every line passes a filter that
blanks registered secrets and anything after ``Bearer``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import IO, Any

from dispatch.errors import InvalidError

__all__ = [
    "FIELDS",
    "LOGGERS",
    "MARK",
    "SECRETS",
    "JsonFormatter",
    "RedactSecrets",
    "Secrets",
    "configure",
    "redact_loggers",
    "secret",
    "shown",
    "structured",
]

FIELDS = ("job_id", "epoch", "action", "cause")
"""Context fields a log call may pass with ``extra=`` and a JSON line then carries."""

LOGGERS = ("dispatch", "dispatch_kubeflow", "dispatch_slurm")
"""The loggers :func:`configure` sends out: the host's and each adapter package's."""

# Loggers of the libraries under us that log request headers (tokens) at DEBUG.
_WIRE_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2", "hpack", "h2", "aiohttp.client", "urllib3")
_BEARER = r"(?i)(bearer\s+)[^\s'\",]+"
MARK = "***"
"""What a secret is replaced with, everywhere."""


class Secrets:
    """The secrets live in this process (tokens, passwords), counted by their users, and the one place
    that blanks them — and anything after ``Bearer`` — from text: log lines, error messages."""

    def __init__(self) -> None:
        self._live: dict[str, int] = {}

    def add(self, value: str) -> None:
        """A user of ``value`` begins; too short a value (under 4 characters) is not a secret to hunt."""
        if isinstance(value, str) and len(value) >= 4:
            self._live[value] = self._live.get(value, 0) + 1

    def remove(self, value: str) -> None:
        """A user of ``value`` is done; the last one's leaving forgets it."""
        left = self._live.get(value, 0) - 1
        if left > 0:
            self._live[value] = left
        else:
            self._live.pop(value, None)

    def __contains__(self, value: object) -> bool:
        return value in self._live

    def scrub(self, text: str) -> str:
        """``text`` with every live secret and bearer token replaced by :data:`MARK`."""
        for value in self._live:
            if value in text:
                text = text.replace(value, MARK)
        return re.sub(_BEARER, rf"\1{MARK}", text)


SECRETS = Secrets()


def secret(value: str) -> None:
    """Register a secret (a token, a password) that must never appear in a log line, for the life of
    the process (``SECRETS.add``/``remove`` count users instead)."""
    SECRETS.add(value)


class RedactSecrets(logging.Filter):
    """Blanks the live secrets in a record: its message, arguments and exception text (a handler prints
    the text; the exception objects, which may hold the secret, are dropped once it is rendered)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: keep its parts, scrubbed, rather than drop it
            text = f"{record.msg} {record.args}"
        clean = SECRETS.scrub(text)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        exc_text = SECRETS.scrub(record.exc_text) if record.exc_text else record.exc_text
        if clean != text or exc_text != record.exc_text:
            record.msg, record.args, record.exc_text = clean, None, exc_text
            if exc_text is not None:
                record.exc_info = None
        return True


_REDACT = RedactSecrets()


def redact_loggers(names: tuple[str, ...]) -> None:
    """Put the filter on the loggers ``names`` and on every logger under their packages that exists, so
    a library that logs a request header at DEBUG logs it blanked (whatever handler a host attached)."""
    roots = {n.split(".")[0] for n in names}
    found = set(names) | {n for n in logging.Logger.manager.loggerDict if n.split(".")[0] in roots}
    for name in found:
        logger = logging.getLogger(name)
        if _REDACT not in logger.filters:
            logger.addFilter(_REDACT)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, RFC 3339), level, logger, message, the context fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": SECRETS.scrub(record.getMessage()),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = str(value)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["error"] = SECRETS.scrub(f"{type(exc).__name__}: {exc}")
        return json.dumps(out, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(
            f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) is not None
        )
        line = super().format(record)
        return SECRETS.scrub(f"{line} {context}" if context else line)


def configure(
    fmt: str = "text", *, level: int | str = logging.INFO, stream: IO[str] | None = None
) -> logging.Handler:
    """Send dispatch's logs to ``stream`` (stderr) as ``json`` lines or ``text``; return the handler.

    Only dispatch's loggers (:data:`LOGGERS`) are configured, and the HTTP libraries' loggers are held
    at WARNING so no request header is ever logged."""
    if fmt not in ("json", "text"):
        raise InvalidError(f"expected json or text, got {fmt!r}", path="log-format")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handler.addFilter(_REDACT)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
    for name in _WIRE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return handler


def structured() -> bool:
    """True while dispatch's logs go out as JSON lines (``--log-format json``): then a daemon writes
    everything else it says on stderr — probe steps, its final error — as JSON lines too."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger("dispatch").handlers)


def shown(value: Any, hidden: frozenset[str]) -> str:
    """``Type(field=value, ...)`` of a msgspec ``Struct`` without its ``hidden`` fields: the repr of a value
    that holds a token, a password, key material or a bulky body (as ``field(repr=False)`` of a dataclass)."""
    fields = ", ".join(f"{n}={getattr(value, n)!r}" for n in value.__struct_fields__ if n not in hidden)
    return f"{type(value).__name__}({fields})"
