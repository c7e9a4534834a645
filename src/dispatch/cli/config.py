"""The CLI's cluster config file (YAML; JSON or TOML by extension): adapter, settings, store, policy.

```yaml
adapter: memory            # a registered or installed adapter name
settings: {startDelay: 1}  # the adapter's settings (checked strictly by the adapter)
store: {sqlite: jobs.db}   # or {memory: {}}, or postgresql://user@host/db; omitted: SQLite under the
                           # user's state directory
policy: {rules: {preempted: {action: requeue, max: 5}}}
readOnly: false
```

Decoded strictly (unknown keys, nulls, duplicate keys, wrong types are refused naming the path). A
relative SQLite path, and a relative ``settings.kubeconfig`` (``slurmConf``, ``workdir``), are relative to the config file's
directory. Files over 1 MiB are refused unread. The token is never in the file: it comes from
``DISPATCH_TOKEN`` or ``--token-file``. A PostgreSQL store's password should not be either: leave it
out of the URL and libpq reads ``PGPASSFILE`` (``~/.pgpass``) or ``PGPASSWORD``; one in the URL
works, but is never shown (``str(StoreChoice)`` is the URL without it).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta

from dispatch.clock import Clock
from dispatch.cluster import Cluster
from dispatch.cluster import open as open_cluster_async
from dispatch.config import Config, check_token
from dispatch.errors import InvalidError
from dispatch.model import DEFAULT_POLICY, Policy
from dispatch.model._base import EMPTY_MAP, Frozen, Model, custom_type, json_schema
from dispatch.model._decode import Fields, as_object, as_str, join, load_json, load_toml, load_yaml
from dispatch.records import Store
from dispatch.records.paths import expand_user

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "MAX_FILE_BYTES",
    "MEMORY_DEFAULT",
    "TOKEN_ENV",
    "ClusterFile",
    "StoreChoice",
    "embedded_config",
    "load_config",
    "open_cluster",
    "parse_config",
    "read_limited",
    "read_token",
]

CONFIG_ENV = "DISPATCH_CONFIG"
TOKEN_ENV = "DISPATCH_TOKEN"

MEMORY_DEFAULT = """\
# The in-process memory adapter with short delays, records in SQLite under the user's state directory
# (for tests and --config; the embedded default is DEFAULT_CONFIG). The policy is the default one with a
# 1 s backoff, so that a requeue takes seconds, not minutes.
adapter: memory
settings: {startDelay: 0.5, cessationDelay: 0.5}
policy:
  rules:
    preempted: {action: requeue, max: 3, backoff: 1}
    evicted: {action: requeue, max: 3, backoff: 1}
    node_lost: {action: requeue, max: 3, backoff: 1}
  default: fail
"""

DEFAULT_CONFIG = """\
# The embedded default (SPEC §11): the Kubeflow adapter against the dev cluster (a kubesim started in the
# background, see `dispatch dev-cluster`), records in SQLite under the user's state directory. The policy
# is the default one with a 1 s backoff, so that the quick start's requeue (`dispatch run
# examples/preempted.yaml`) takes seconds, not minutes. Every dev cluster holds the checkpoint claim.
adapter: kubeflow
settings:
  kubeconfig: <state dir>/dev-cluster/kubeconfig
  checkpointVolume: {claimName: dispatch-checkpoints, mountPath: /checkpoints}
policy:
  rules:
    preempted: {action: requeue, max: 3, backoff: 1}
    evicted: {action: requeue, max: 3, backoff: 1}
    node_lost: {action: requeue, max: 3, backoff: 1}
  default: fail
"""
"""What is used when neither ``--config`` nor ``DISPATCH_CONFIG`` names one (see :func:`embedded_config`)."""

DEFAULT_DOCUMENT: Mapping[str, object] = {
    "adapter": "kubeflow",
    "settings": {
        "kubeconfig": "<state dir>/dev-cluster/kubeconfig",
        "checkpointVolume": {"claimName": "dispatch-checkpoints", "mountPath": "/checkpoints"},
    },
    "policy": {
        "rules": {
            cause: {"action": "requeue", "max": 3, "backoff": 1}
            for cause in ("preempted", "evicted", "node_lost")
        },
        "default": "fail",
    },
}
"""``DEFAULT_CONFIG`` decoded (a test holds them equal), which is what :func:`embedded_config` reads."""

MAX_FILE_BYTES = 1 << 20
"""Cluster configs and job files larger than this (1 MiB) are refused before they are parsed."""


class StoreChoice(Frozen):
    """``kind`` is ``"default"`` (SQLite at the default path), ``"sqlite"`` (at ``path``), ``"memory"``
    or ``"postgres"`` (``path`` is the URL, password included if it had one: never print ``path``).

    Not a dataclass: its config form (a URL, ``{sqlite: FILE}``, ``{memory: {}}``) is not an object of
    its attributes, so the model codec reads and writes it through :func:`custom_type`."""

    __slots__ = ("kind", "path")
    kind: str
    path: str | None

    def __init__(self, kind: str = "default", path: str | None = None) -> None:
        self._set(kind=kind, path=path)

    def open(self) -> Store:
        if self.kind == "memory":
            from dispatch.records.memory import MemoryStore

            return MemoryStore()
        if self.kind == "postgres":
            from dispatch.records import PostgresStore

            assert self.path is not None
            return PostgresStore(self.path)
        from dispatch.records import SqliteStore, default_store_path  # deferred: sqlite3 is not light

        return SqliteStore(self.path if self.path is not None else default_store_path())

    def __repr__(self) -> str:
        return f"StoreChoice({str(self)!r})"

    def to_json(self) -> Any:
        """The config file's form (a default store has none: it is omitted)."""
        if self.kind == "memory":
            return {"memory": {}}
        if self.kind == "postgres":
            return self.path
        return {"sqlite": self.path} if self.path is not None else {}

    def __str__(self) -> str:
        if self.kind == "memory":
            return "memory"
        if self.kind == "postgres":
            from dispatch.records.postgres_url import redact_dsn

            return redact_dsn(self.path or "")
        if self.path:
            return f"sqlite:{self.path}"
        from dispatch.records.paths import default_store_path

        return f"sqlite:{default_store_path()} (default)"


custom_type(
    StoreChoice,
    decode=lambda value, path: _store(value, path or "store"),
    encode=lambda value: value.to_json(),
    schema=lambda: {
        "description": "Where the records live: a PostgreSQL URL, {sqlite: FILE} (relative to this file) "
        "or {memory: {}}; omitted: SQLite under the user's state directory.",
        "anyOf": [
            {"type": "string", "pattern": "^postgres(ql)?://"},
            {
                "type": "object",
                "properties": {"sqlite": {"type": "string", "minLength": 1}},
                "required": ["sqlite"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"memory": {"type": "object", "properties": {}, "additionalProperties": False}},
                "required": ["memory"],
                "additionalProperties": False,
            },
        ],
    },
)


class ConfigFile(Model, frozen=True):
    """The keys of a cluster config file, declared once: decoding and the JSON Schema come from here."""

    json_what: ClassVar[str] = "config key"
    json_unknown_first: ClassVar[bool] = (
        True  # "adaptor" is a typo of "adapter": say so, not "adapter is missing"
    )

    adapter: Annotated[
        str,
        Meta(
            min_length=1,
            description="A registered or installed adapter name.",
            extra={"expected": "an adapter name"},
        ),
    ]
    settings: Annotated[
        dict[str, Any], Meta(description="The adapter's settings (checked strictly by the adapter).")
    ] = EMPTY_MAP
    store: StoreChoice = msgspec.field(
        default_factory=StoreChoice
    )  # a factory: the schema writer cannot encode one
    policy: Annotated[Policy, Meta(description="The recovery policy (docs/supervisor.md).")] = DEFAULT_POLICY
    read_only: Annotated[bool, Meta(description="Open the cluster read-only: no probe, no write.")] = False


class ClustersFile(Model, frozen=True):
    """A config file naming several clusters (profiles), one of them the default; ``dispatch --cluster
    NAME`` picks another. Told from a one-cluster file by its ``clusters`` key."""

    json_what: ClassVar[str] = "config key"
    json_unknown_first: ClassVar[bool] = True

    clusters: Annotated[
        dict[str, ConfigFile],
        Meta(
            min_length=1, description="The clusters by name, each a cluster config (adapter, settings, ...)."
        ),
    ]
    default: Annotated[
        str,
        Meta(description="The name of the cluster used without --cluster (may be omitted with one cluster)."),
    ] = ""


class ClusterFile(ConfigFile, frozen=True):
    """A decoded cluster config file (or the embedded default, ``source == "<default>"``)."""

    source: str = "<default>"
    embedded: bool = False
    """The embedded default: the dev cluster, started by the commands that need it."""
    cluster: str = ""
    """The cluster's name in a file naming several (``clusters:``); empty for a one-cluster file."""


def parse_config(
    text: str | bytes, *, source: str = "<default>", base: Path | None = None, cluster: str | None = None
) -> ClusterFile:
    """Decode a cluster config document strictly: YAML, or JSON / TOML for a ``.json`` / ``.toml`` source.
    Every error names the file and the path in it (``cluster.yaml: settings.namespace: ...``).

    A document with ``clusters:`` names several; ``cluster`` picks one (else its ``default``, else its
    only one). ``cluster`` given for a one-cluster document is an error."""
    try:
        return _parse_config(text, source, base, cluster)
    except InvalidError as exc:
        raise _in_file(exc, source) from None


def _in_file(exc: InvalidError, source: str) -> InvalidError:
    if source == "<default>" or str(exc).startswith(f"{source}:"):
        return exc
    err = InvalidError(exc.detail, path=exc.path)
    err.args = (f"{source}: {exc}",)
    return err


def check_settings(cf: ClusterFile) -> None:
    """Decode the settings with the adapter's own ``parse_settings`` when its descriptor has one (it
    touches no cluster), so a bad setting is reported as ``<file>: settings.<path>: ...`` before anything
    opens. An unknown or broken adapter is left for opening to report."""
    import json as _json

    from dispatch.errors import NotFoundError
    from dispatch.registry import describe

    try:
        parse = describe(cf.adapter).parse_settings
    except NotFoundError:
        return
    if parse is None:
        return
    try:
        parse(_json.dumps(dict(cf.settings)).encode())
    except InvalidError as exc:
        path = f"settings.{exc.path}" if exc.path and exc.path != "settings" else "settings"
        err = InvalidError(exc.detail, path=path)
        err.args = (f"{cf.source}: {path}: {exc.detail}",)
        raise err from None


_RELATIVE_PATHS = ("kubeconfig", "slurmConf", "workdir")
"""Adapter settings that name a file or directory (kubeflow's kubeconfig, slurm's slurmConf and workdir)."""


def _parse_config(text: str | bytes, source: str, base: Path | None, cluster: str | None) -> ClusterFile:
    what = source
    if source.endswith(".json"):
        raw = load_json(text, what=what)
    elif source.endswith(".toml"):
        raw = load_toml(text, what=what)
    else:
        raw = load_yaml(text, what=what)
    return _config_from(raw, source, base, cluster)


def _config_from(raw: object, source: str, base: Path | None, cluster: str | None) -> ClusterFile:
    name = ""
    if isinstance(raw, Mapping) and "clusters" in raw:
        name, doc = _pick(ClustersFile.from_json(raw), cluster)
    elif cluster:
        raise InvalidError(
            f"--cluster {cluster}: this file describes one cluster (no `clusters:` key naming several)",
            path="clusters",
        )
    else:
        doc = ConfigFile.from_json(raw)
    settings = dict(doc.settings)
    for key in _RELATIVE_PATHS:
        value = settings.get(key)
        if isinstance(value, str) and value and base is not None:
            # Like store.sqlite: a relative path is relative to the config file, not to where you are.
            path = expand_user(value, what=f"settings.{key}")
            settings[key] = str(path) if path.is_absolute() else os.path.normpath(base / path)
    store = doc.store
    if store.kind == "sqlite" and store.path and base is not None and not Path(store.path).is_absolute():
        store = StoreChoice("sqlite", str(base / store.path))
    return ClusterFile(doc.adapter, settings, store, doc.policy, doc.read_only, source, cluster=name)


def _pick(doc: ClustersFile, cluster: str | None) -> tuple[str, ConfigFile]:
    """The cluster named ``cluster``, else the file's default, else its only one."""
    names = ", ".join(sorted(doc.clusters))
    if cluster:
        if cluster not in doc.clusters:
            raise InvalidError(
                f"--cluster {cluster}: no such cluster; this file names: {names}", path="clusters"
            )
        return cluster, doc.clusters[cluster]
    if doc.default:
        if doc.default not in doc.clusters:
            raise InvalidError(f"{doc.default!r} is not one of the clusters: {names}", path="default")
        return doc.default, doc.clusters[doc.default]
    if len(doc.clusters) == 1:
        return next(iter(doc.clusters.items()))
    raise InvalidError(
        f"several clusters ({names}) and no default: give `default: NAME` or `dispatch --cluster NAME`",
        path="default",
    )


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a cluster config file, derived from :class:`ConfigFile`."""
    return json_schema(
        ConfigFile,
        title="dispatch cluster config",
        description="The CLI's cluster config file (docs/cli.md).",
    )


def clusters_schema() -> dict[str, Any]:
    """The JSON Schema of a config file naming several clusters, derived from :class:`ClustersFile`."""
    return json_schema(
        ClustersFile,
        title="dispatch clusters config",
        description="A config file naming several clusters and a default (docs/cli.md).",
    )


def _store(value: Any, path: str) -> StoreChoice:
    if isinstance(value, str):
        return _store_url(value, path)
    obj = as_object(value, path)
    if len(obj) != 1:
        raise InvalidError('expected exactly one of "sqlite" or "memory"', path=path)
    f = Fields(obj, path, what="store")
    if f.has("sqlite"):
        where = f.required("sqlite", as_str)
        if not where:
            raise InvalidError("expected a file path", path=f"{path}.sqlite")
        result = StoreChoice("sqlite", str(expand_user(where, what=f"{path}.sqlite")))
    elif f.has("memory"):
        empty = Fields(f.required("memory", as_object), f"{path}.memory", what="memory store option")
        empty.done()
        result = StoreChoice("memory")
    else:
        key = next(iter(obj))
        raise InvalidError(f'unknown store "{key}"; expected "sqlite" or "memory"', path=join(path, key))
    f.done()
    return result


def _store_url(value: str, path: str) -> StoreChoice:
    """``store: postgresql://user@host:port/dbname`` (or ``postgres://``): a PostgreSQL store."""
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme not in ("postgresql", "postgres"):
        shown = f"a {scheme}:// URL" if scheme else "a string that is not a URL"
        raise InvalidError(
            f"expected a postgresql://user@host:port/dbname URL, or {{sqlite: FILE}} or {{memory: {{}}}}; got {shown}",
            path=path,
        )
    from dispatch.records.postgres_url import check_dsn

    check_dsn(value, path)  # malformed URLs are refused at load time, without echoing them
    return StoreChoice("postgres", value)


PROJECT_FILE = "dispatch.yaml"
"""A project's config, found in the working directory."""


def discover(
    path: str | None = None, *, environ: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[Path | None, str]:
    """Which config file applies, and what named it: ``--config``, else ``$DISPATCH_CONFIG``, else
    ``./dispatch.yaml``, else ``$XDG_CONFIG_HOME/dispatch/config.yaml`` (``~/.config`` when unset);
    ``(None, "<default>")`` when none does (the embedded default)."""
    env = os.environ if environ is None else environ
    if path:
        return expand_user(path, what="--config"), "--config"
    if env.get(CONFIG_ENV):
        return expand_user(env[CONFIG_ENV], what=CONFIG_ENV), CONFIG_ENV
    project = (cwd if cwd is not None else Path.cwd()) / PROJECT_FILE
    if project.is_file():
        return project, "./" + PROJECT_FILE
    xdg = env.get("XDG_CONFIG_HOME") or ""
    home = Path(xdg) if Path(xdg).is_absolute() else expand_user("~", what="$HOME") / ".config"
    user = home / "dispatch" / "config.yaml"
    if user.is_file():
        return user, "$XDG_CONFIG_HOME/dispatch/config.yaml"
    return None, "<default>"


def load_config(
    path: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cluster: str | None = None,
    cwd: Path | None = None,
) -> ClusterFile:
    """The cluster config :func:`discover` finds (``cluster``: one of the clusters it names), else the
    embedded default."""
    p, _ = discover(path, environ=environ, cwd=cwd)
    if p is None:
        if cluster:
            raise InvalidError(
                f"--cluster {cluster}: no config file names clusters (looked for --config, ${CONFIG_ENV}, "
                f"./{PROJECT_FILE} and $XDG_CONFIG_HOME/dispatch/config.yaml)",
                path="--cluster",
            )
        return embedded_config()
    data = read_limited(p, "cluster config")
    cf = parse_config(data, source=str(p), base=p.resolve().parent, cluster=cluster)
    check_settings(cf)
    return cf


def dev_dir() -> Path:
    """``<state dir>/dev-cluster`` (beside the default store: ``$DISPATCH_STATE_DIR`` when set)."""
    from dispatch.records.paths import default_store_path

    return default_store_path().parent / "dev-cluster"


def embedded_config() -> ClusterFile:
    """The embedded default: the ``kubeflow`` adapter on the dev cluster's kubeconfig, the default store."""
    # Its policy and adapter; the kubeconfig is the real path. From the decoded document: no YAML parser
    # to import for the commonest command line (the parser costs a read command ~0.03 s of CPU).
    cf = _config_from(DEFAULT_DOCUMENT, "<default>", None, None)
    return cf.replace(settings={**cf.settings, "kubeconfig": str(dev_dir() / "kubeconfig")}, embedded=True)


def read_limited(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path``; ``InvalidError`` naming it when it cannot be read, is not a regular file
    (a FIFO would wait for a writer, a device never end) or exceeds ``limit``."""
    import stat

    try:
        # Opened without blocking (a FIFO's open waits for a writer), then checked before any read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}
                kind = kinds.get(stat.S_IFMT(mode), "a device")
                raise InvalidError(
                    f"the {what} is {kind}: dispatch reads only a regular file", path=str(path)
                )
            data = f.read(limit + 1)
    except OSError as exc:
        raise InvalidError(f"cannot read the {what}: {exc.strerror}", path=str(path)) from None
    if len(data) > limit:
        raise InvalidError(
            f"the {what} is larger than {limit // 1024} KiB; dispatch refuses files this large",
            path=str(path),
        )
    return data


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
        return check_token(token, path=token_file)
    # Stripped like the file: `export DISPATCH_TOKEN="$(cat token)"` keeps no newline, but an echo
    # piped through other tools may.
    token = env.get(TOKEN_ENV, "").strip()
    return check_token(token, path=TOKEN_ENV) if token else None


async def open_cluster(
    cf: ClusterFile,
    *,
    token: str | None = None,
    clock: Clock | None = None,
    refresh: bool = False,
    lazy: bool = False,
) -> Cluster:
    """Open the cluster a config file describes. The adapter gets a probe cache kept in the store (when
    the store has a key-value table); ``refresh`` makes it probe again (``dispatch check --refresh``).
    ``lazy`` (read-only configs only): the adapter is opened by the first call that needs the cluster."""
    from dispatch.probecache import StoreProbeCache
    from dispatch.records.store import KeyValues

    store = cf.store.open()
    cache = StoreProbeCache(store, refresh=refresh) if isinstance(store, KeyValues) else None
    config = Config(
        adapter=cf.settings,
        store=store,
        policy=cf.policy,
        read_only=cf.read_only,
        token=token,
        probe_cache=cache,
    )
    if lazy and cf.read_only:
        from dispatch.cli.lazy import LazyBackend
        from dispatch.cluster import backend_for

        opener = functools.partial(backend_for, cf.adapter, config, store)
        return Cluster(LazyBackend(cf.adapter, opener), store, policy=cf.policy, clock=clock)
    try:
        return await open_cluster_async(cf.adapter, config, clock=clock)
    except BaseException:
        await store.close()
        raise
