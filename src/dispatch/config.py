"""How a cluster is opened: :class:`Config` for :func:`dispatch.open`, :class:`AdapterConfig` for adapters."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from msgspec import Struct, field
from msgspec.structs import force_setattr

from dispatch.errors import InvalidError
from dispatch.model import DEFAULT_POLICY, Policy
from dispatch.probecache import ProbeCache
from dispatch.records.store import Store

__all__ = ["STORE_ID", "AdapterConfig", "Config", "check_token"]

STORE_ID = r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?"
"""A store identity: empty, or a DNS-1123 label (it goes into a Kubernetes label value as it is)."""


def check_token(token: object, path: str = "token") -> str:
    """``token`` if it can be sent as a bearer token, else ``InvalidError`` (which never shows it).

    A token is visible ASCII (``!`` to ``~``): a newline, a space, another control character or a
    non-ASCII character cannot go in an HTTP header, and an HTTP library that refuses it may quote
    the header (and so the token) in its error or its debug log. Surrounding whitespace is the
    caller's to strip (``--token-file`` and ``$DISPATCH_TOKEN`` are stripped)."""
    if not isinstance(token, str) or not token:
        raise InvalidError("expected a non-empty string", path=path)
    for i, ch in enumerate(token):
        if not "!" <= ch <= "~":
            kind = (
                "a space"
                if ch == " "
                else ("a control character" if ch.isascii() else "a non-ASCII character")
            )
            raise InvalidError(
                f"the token holds {kind} at position {i + 1}, which cannot be sent in an HTTP header "
                "(the token is not shown); a token is visible ASCII",
                path=path,
            )
    return token


def _check_cache(cache: object) -> None:
    if cache is not None and not isinstance(cache, ProbeCache):
        raise InvalidError(
            f"expected a ProbeCache (get/put), e.g. StoreProbeCache(store), got {type(cache).__name__}",
            path="probe_cache",
        )


def _redacted(token: str | None) -> str:
    return "None" if token is None else "'***'"


class AdapterConfig(Struct, frozen=True):
    """What an adapter's factory receives: its name, its settings as JSON bytes, read-only mode and an
    optional bearer token. The token never appears in ``repr`` or ``str``.

    ``probe_cache`` (optional, keyword) is where the host keeps what the adapter's preflight probe
    learned (:mod:`dispatch.probecache`); an adapter without a probe ignores it. Without one, the
    adapter's factory probes on every open.

    ``store_id`` (optional, keyword) is the identity of the host's record store: the backend marks every
    object it creates with it and leaves objects marked with another store's alone, so two stores sharing
    a cluster never adopt, fold or delete each other's objects. Empty: no mark, every object is ours."""

    backend: str
    settings: bytes = b"{}"
    read_only: bool = False
    token: str | None = None
    probe_cache: ProbeCache | None = None
    store_id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend:
            raise InvalidError("expected the adapter's name", path="backend")
        if not isinstance(self.store_id, str) or not re.fullmatch(STORE_ID, self.store_id):
            raise InvalidError(
                f"expected up to 63 characters from a-z 0-9 -, got {self.store_id!r}", path="store_id"
            )
        if isinstance(self.settings, str):
            force_setattr(self, "settings", self.settings.encode("utf-8", "surrogatepass"))
        if not isinstance(self.settings, bytes):
            raise InvalidError("expected JSON bytes", path="settings")
        if not isinstance(self.read_only, bool):
            raise InvalidError(f"expected True or False, got {self.read_only!r}", path="read_only")
        if self.token is not None:
            check_token(self.token)
        _check_cache(self.probe_cache)

    def __repr__(self) -> str:
        return (
            f"AdapterConfig(backend={self.backend!r}, settings=<{len(self.settings)} bytes>, "
            f"read_only={self.read_only!r}, token={_redacted(self.token)})"
        )

    __str__ = __repr__


class Config(Struct, frozen=True):
    """How :func:`dispatch.open` opens a cluster.

    ``adapter`` (the adapter's settings) is serialised to JSON and handed to the adapter as bytes.
    ``store`` defaults to a :class:`~dispatch.records.SqliteStore` under the user's state directory;
    ``policy`` is the recovery policy of jobs that do not bring their own. ``probe_cache`` is handed to
    the adapter's factory (see :class:`AdapterConfig`).
    """

    adapter: Mapping[str, Any] = field(default_factory=dict)
    store: Store | None = None
    policy: Policy = DEFAULT_POLICY
    read_only: bool = False
    token: str | None = None
    probe_cache: ProbeCache | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.adapter, Mapping):
            raise InvalidError("expected a mapping of adapter settings", path="adapter")
        if not isinstance(self.policy, Policy):
            raise InvalidError("expected a Policy", path="policy")
        if not isinstance(self.read_only, bool):
            raise InvalidError(f"expected True or False, got {self.read_only!r}", path="read_only")
        if self.store is not None and not isinstance(self.store, Store):
            raise InvalidError(
                f"expected a Store (e.g. SqliteStore(path)), got {type(self.store).__name__}", path="store"
            )
        if self.token is not None:
            check_token(self.token)
        _check_cache(self.probe_cache)

    def adapter_config(self, name: str, *, store_id: str = "") -> AdapterConfig:
        try:
            settings = json.dumps(self.adapter, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidError(f"adapter settings are not JSON-serialisable: {exc}", path="adapter") from None
        return AdapterConfig(
            name,
            settings,
            read_only=self.read_only,
            token=self.token,
            probe_cache=self.probe_cache,
            store_id=store_id,
        )

    def __repr__(self) -> str:
        return (
            f"Config(adapter={dict(self.adapter)!r}, store={self.store!r}, policy=<Policy>, "
            f"read_only={self.read_only!r}, token={_redacted(self.token)})"
        )

    __str__ = __repr__
