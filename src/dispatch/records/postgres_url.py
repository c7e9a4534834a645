"""PostgreSQL connection strings without psycopg: showing one without its password, checking a URL.

Kept apart from :mod:`dispatch.records.postgres` so the CLI can load and print a cluster config that
names a PostgreSQL store even where psycopg is not installed.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote, urlsplit

from dispatch.errors import InvalidError

__all__ = ["check_dsn", "redact_dsn"]

_PAIR = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']*)")


def _params(dsn: str) -> dict[str, str] | None:
    """The connection parameters that name the server (never the password); None if unparsable."""
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
            port = str(parts.port) if parts.port is not None else ""
        except ValueError:
            return None
        query = {k: v[-1] for k, v in parse_qs(parts.query).items() if v}
        return {
            "user": unquote(parts.username or "") or query.get("user", ""),
            "host": unquote(parts.hostname or "") or query.get("host", ""),
            "port": port or query.get("port", ""),
            "dbname": unquote(parts.path.lstrip("/")) or query.get("dbname", ""),
        }
    out: dict[str, str] = {}
    pos = 0
    while pos < len(dsn.rstrip()):
        m = _PAIR.match(dsn, pos)
        if m is None:
            return None
        value = m.group(2)
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        out[m.group(1)] = value
        pos = m.end()
    return {k: out.get(k, "") for k in ("user", "host", "port", "dbname")} | (
        {"host": out["hostaddr"]} if not out.get("host") and out.get("hostaddr") else {}
    )


def redact_dsn(dsn: str) -> str:
    """``postgresql://user@host:port/dbname`` for a connection string (URL or ``key=value`` pairs),
    without its password or any other option. Never raises; an unparsable string is
    ``postgresql://?`` (its text might hold the password, so none of it is shown)."""
    params = _params(dsn) if isinstance(dsn, str) else None
    if params is None:
        return "postgresql://?"
    user, host, port, db = params["user"], params["host"], params["port"], params["dbname"]
    if host.startswith("/"):  # a unix socket directory
        host = f"[{host}]"
    return f"postgresql://{user + '@' if user else ''}{host}{':' + port if port else ''}/{db}"


def check_dsn(url: str, path: str) -> None:
    """``InvalidError`` at ``path`` unless ``url`` is a well-formed ``postgresql://`` URL (the message
    never quotes the URL: it may hold a password)."""
    if _params(url) is None:
        raise InvalidError(
            "not a well-formed postgresql://user@host:port/dbname URL (check the port and any "
            "%-escapes; the URL is not shown because it may hold a password)",
            path=path,
        )
