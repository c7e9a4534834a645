"""Where the embedded store lives when nobody says otherwise."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dispatch.errors import InvalidError

__all__ = ["STORE_FILE", "default_store_path", "expand_user"]

STORE_FILE = "jobs.db"


def default_store_path(environ: Mapping[str, str] | None = None) -> Path:
    """The default :class:`~dispatch.records.SqliteStore` file.

    ``$DISPATCH_STATE_DIR/jobs.db`` when that is set; else ``$XDG_STATE_HOME/dispatch/jobs.db`` (the
    XDG base-directory rule: only an absolute ``XDG_STATE_HOME`` counts); else
    ``~/.local/state/dispatch/jobs.db``. Nothing is created here; the store creates its directory.
    """
    env = os.environ if environ is None else environ
    override = env.get("DISPATCH_STATE_DIR", "")
    if override:
        return expand_user(override, what="DISPATCH_STATE_DIR") / STORE_FILE
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "dispatch" / STORE_FILE
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "state" / "dispatch" / STORE_FILE


def expand_user(path: str, *, what: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; ``InvalidError`` at ``what`` when that user
    (or the home directory) cannot be found, instead of pathlib's bare ``RuntimeError``; and when the
    path holds a NUL character, which no file name can (the OS calls would raise ``ValueError``)."""
    if "\x00" in path:
        raise InvalidError("a file path cannot contain a NUL character", path=what)
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise InvalidError(f"cannot expand {path!r}: no such user or home directory", path=what) from None
