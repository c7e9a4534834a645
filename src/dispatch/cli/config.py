"""The CLI's cluster config file (YAML; JSON or TOML by extension): adapter, settings, store, policy.

```yaml
adapter: memory            # a registered or installed adapter name
settings: {startDelay: 1}  # the adapter's settings (checked strictly by the adapter)
store: {sqlite: jobs.db}   # or {memory: {}}; omitted: SQLite under the user's state directory
policy: {rules: {preempted: {action: requeue, max: 5}}}
readOnly: false
```

Decoded strictly (unknown keys, nulls, duplicate keys, wrong types are refused naming the path). A
relative SQLite path is relative to the config file's directory. The token is never in the file: it
comes from ``DISPATCH_TOKEN`` or ``--token-file``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatch.clock import Clock
from dispatch.cluster import Cluster
from dispatch.cluster import open as open_cluster_async
from dispatch.config import Config
from dispatch.errors import InvalidError
from dispatch.model import DEFAULT_POLICY, Policy
from dispatch.model._decode import (
    Fields,
    as_bool,
    as_object,
    as_str,
    check_plain,
    join,
    load_json,
    load_yaml,
)
from dispatch.records import Store
from dispatch.records.paths import expand_user

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "MEMORY_DEFAULT",
    "TOKEN_ENV",
    "ClusterFile",
    "StoreChoice",
    "load_config",
    "open_cluster",
    "parse_config",
    "read_token",
]

CONFIG_ENV = "DISPATCH_CONFIG"
TOKEN_ENV = "DISPATCH_TOKEN"

MEMORY_DEFAULT = """\
# The embedded default: the in-process memory adapter with short delays, records in SQLite under the
# user's state directory. The policy is the default one with a 1 s backoff, so that the quick start's
# requeue (`dispatch run examples/preempted.yaml`) takes seconds, not minutes.
adapter: memory
settings: {startDelay: 0.5, cessationDelay: 0.5}
policy:
  rules:
    preempted: {action: requeue, max: 3, backoff: 1}
    evicted: {action: requeue, max: 3, backoff: 1}
    node_lost: {action: requeue, max: 3, backoff: 1}
  default: fail
"""

DEFAULT_CONFIG = MEMORY_DEFAULT
"""The config used when neither ``--config`` nor ``DISPATCH_CONFIG`` names one (switch it here)."""


@dataclass(frozen=True, slots=True)
class StoreChoice:
    """``kind`` is ``"default"`` (SQLite at the default path), ``"sqlite"`` (at ``path``) or ``"memory"``."""

    kind: str = "default"
    path: str | None = None

    def open(self) -> Store:
        if self.kind == "memory":
            from dispatch.records.memory import MemoryStore

            return MemoryStore()
        from dispatch.records import SqliteStore, default_store_path  # deferred: sqlite3 is not light

        return SqliteStore(self.path if self.path is not None else default_store_path())

    def __str__(self) -> str:
        if self.kind == "memory":
            return "memory"
        if self.path:
            return f"sqlite:{self.path}"
        from dispatch.records.paths import default_store_path

        return f"sqlite:{default_store_path()} (default)"


@dataclass(frozen=True, slots=True)
class ClusterFile:
    """A decoded cluster config file (or the embedded default, ``source == "<default>"``)."""

    adapter: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    store: StoreChoice = field(default_factory=StoreChoice)
    policy: Policy = DEFAULT_POLICY
    read_only: bool = False
    source: str = "<default>"


def parse_config(text: str | bytes, *, source: str = "<default>", base: Path | None = None) -> ClusterFile:
    """Decode a cluster config document strictly: YAML, or JSON / TOML for a ``.json`` / ``.toml`` source."""
    what = source
    if source.endswith(".json"):
        raw = load_json(text, what=what)
    elif source.endswith(".toml"):
        raw = _load_toml(text, what)
    else:
        raw = load_yaml(text, what=what)
    f = Fields(raw, "", what="config key")
    adapter = f.required("adapter", as_str)
    if not adapter:
        raise InvalidError("expected an adapter name", path="adapter")
    settings: dict[str, Any] = f.optional("settings", _settings, {})
    store = f.optional("store", lambda v, p: _store(v, p, base), StoreChoice())
    policy = f.optional("policy", Policy.from_json, DEFAULT_POLICY)
    read_only = f.optional("readOnly", as_bool, False)
    f.done()
    return ClusterFile(adapter, settings, store, policy, read_only, source)


def _load_toml(text: str | bytes, what: str) -> Any:
    import tomllib  # deferred: only TOML configs need it

    try:
        data = text.decode("utf-8") if isinstance(text, bytes) else text
        # TOML itself refuses duplicate keys and has no null; dates are refused below (check_plain).
        return check_plain(tomllib.loads(data), "")
    except UnicodeDecodeError as exc:
        raise InvalidError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=what) from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidError(f"not valid TOML: {exc}", path=what) from None


def _settings(value: Any, path: str) -> dict[str, Any]:
    plain: dict[str, Any] = check_plain(as_object(value, path), path)
    return plain


def _store(value: Any, path: str, base: Path | None) -> StoreChoice:
    obj = as_object(value, path)
    if len(obj) != 1:
        raise InvalidError('expected exactly one of "sqlite" or "memory"', path=path)
    f = Fields(obj, path, what="store")
    if f.has("sqlite"):
        where = f.required("sqlite", as_str)
        if not where:
            raise InvalidError("expected a file path", path=f"{path}.sqlite")
        p = expand_user(where, what=f"{path}.sqlite")
        if not p.is_absolute() and base is not None:
            p = base / p
        result = StoreChoice("sqlite", str(p))
    elif f.has("memory"):
        empty = Fields(f.required("memory", as_object), f"{path}.memory", what="memory store option")
        empty.done()
        result = StoreChoice("memory")
    else:
        key = next(iter(obj))
        raise InvalidError(f'unknown store "{key}"; expected "sqlite" or "memory"', path=join(path, key))
    f.done()
    return result


def load_config(path: str | None = None, *, environ: Mapping[str, str] | None = None) -> ClusterFile:
    """The cluster config named by ``path``, else by ``$DISPATCH_CONFIG``, else the embedded default."""
    env = os.environ if environ is None else environ
    chosen = path or env.get(CONFIG_ENV) or None
    if chosen is None:
        return parse_config(DEFAULT_CONFIG)
    p = expand_user(chosen, what=CONFIG_ENV if path is None else "--config")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InvalidError(f"cannot read the cluster config: {exc.strerror}", path=str(p)) from None
    return parse_config(data, source=str(p), base=p.resolve().parent)


def read_token(token_file: str | None = None, *, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token from ``token_file`` (first), else ``$DISPATCH_TOKEN``; never printed."""
    env = os.environ if environ is None else environ
    if token_file:
        try:
            token = expand_user(token_file, what="--token-file").read_text().strip()
        except OSError as exc:
            raise InvalidError(f"cannot read the token file: {exc.strerror}", path=token_file) from None
        except UnicodeDecodeError:  # the message would quote the file's bytes: say nothing of them
            raise InvalidError("the token file is not UTF-8 text", path=token_file) from None
        if not token:
            raise InvalidError("the token file is empty", path=token_file)
        return token
    return env.get(TOKEN_ENV) or None


async def open_cluster(cf: ClusterFile, *, token: str | None = None, clock: Clock | None = None) -> Cluster:
    """Open the cluster a config file describes."""
    store = cf.store.open()
    config = Config(adapter=cf.settings, store=store, policy=cf.policy, read_only=cf.read_only, token=token)
    try:
        return await open_cluster_async(cf.adapter, config, clock=clock)
    except BaseException:
        await store.close()
        raise
