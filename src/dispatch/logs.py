"""Structured logs for the daemons (``dispatch supervise``, ``dispatch-admission``): JSON lines or text.

dispatch logs through the standard :mod:`logging` module only (loggers under ``dispatch`` and
``dispatch_kubeflow``), so a host application routes it as it likes; :func:`configure` is what the
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

__all__ = ["FIELDS", "JsonFormatter", "RedactSecrets", "configure", "secret"]

FIELDS = ("job_id", "epoch", "action", "cause")
"""Context fields a log call may pass with ``extra=`` and a JSON line then carries."""

# Loggers of the libraries under us that log request headers (tokens) at DEBUG.
_WIRE_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2", "hpack", "h2", "aiohttp.client", "urllib3")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\",]+")
_secrets: set[str] = set()


def secret(value: str) -> None:
    """Register a secret (a token, a password) that must never appear in a log line."""
    if isinstance(value, str) and len(value) >= 4:
        _secrets.add(value)


class RedactSecrets(logging.Filter):
    """Blanks registered secrets and bearer tokens in a record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = _redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def _redact(text: str) -> str:
    for value in _secrets:
        if value in text:
            text = text.replace(value, "[redacted]")
    return _BEARER.sub(r"\1[redacted]", text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, RFC 3339), level, logger, message, the context fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _redact(record.getMessage()),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = str(value)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["error"] = _redact(f"{type(exc).__name__}: {exc}")
        return json.dumps(out, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(
            f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) is not None
        )
        line = super().format(record)
        return _redact(f"{line} {context}" if context else line)


def configure(
    fmt: str = "text", *, level: int | str = logging.INFO, stream: IO[str] | None = None
) -> logging.Handler:
    """Send dispatch's logs to ``stream`` (stderr) as ``json`` lines or ``text``; return the handler.

    Only the ``dispatch`` and ``dispatch_kubeflow`` loggers are configured, and the HTTP libraries'
    loggers are held at WARNING so no request header is ever logged."""
    if fmt not in ("json", "text"):
        raise InvalidError(f"expected json or text, got {fmt!r}", path="log-format")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handler.addFilter(RedactSecrets())
    for name in ("dispatch", "dispatch_kubeflow"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
    for name in _WIRE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return handler
