"""A config file naming a fleet of clusters (SPEC §15): the ``clusters:`` of a profiles file, plus a
``placement:`` rule.

```yaml
clusters:
  slurm: {adapter: slurm, settings: {...}, checkpoints: lab-nfs, store: postgresql://db/jobs}
  k8s:   {adapter: kubeflow, settings: {...}, checkpoints: lab-nfs}
placement:
  order: [slurm, k8s]      # or weights: {slurm: 1, k8s: 3}
  patience: 300            # seconds a job may wait on a cluster for capacity (default: 300)
```

Without ``placement:`` the same ``clusters:`` are profiles (``dispatch --cluster NAME`` picks one, see
:mod:`dispatch.cli.config`). With it every command works on all of them at once, as one fleet: over one
store and one policy, which every cluster names alike or leaves out. Decoding and the JSON Schema come
from the declarations here (:class:`FleetFile`), as the one-cluster file's do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from msgspec import Meta, Struct

from dispatch.cli.config import (
    ClusterFile,
    ConfigFile,
    StoreChoice,
    check_settings,
    config_from,
    discover,
    in_file,
    is_fleet,
    read_document,
    read_limited,
    resolved,
)
from dispatch.errors import InvalidError
from dispatch.model import DEFAULT_POLICY, Policy
from dispatch.model._base import EMPTY_MAP, Model, json_schema
from dispatch.model._decode import key_path
from dispatch.placement import PATIENCE

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = [
    "NAME",
    "FleetConfig",
    "FleetFile",
    "MemberFile",
    "PlacementFile",
    "fleet_schema",
    "load",
    "open_configured_fleet",
    "parse",
]

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
"""A cluster's name in a fleet: it goes into ``--cluster a,b`` lists and the store's notes."""


class MemberFile(ConfigFile, frozen=True):
    """One cluster of a fleet: a cluster config, and the checkpoint directory its jobs see."""

    json_what: ClassVar[str] = "config key"
    json_unknown_first: ClassVar[bool] = True

    checkpoints: Annotated[
        str,
        Meta(
            description="The name of the checkpoint directory this cluster's jobs see: clusters that see "
            "the same directory give the same name, and a job requeued from one to another resumes from "
            "its checkpoints (else it starts over, and its history says so)."
        ),
    ] = ""


class PlacementFile(Model, frozen=True):
    """Where each incarnation goes: the first cluster, in ``order`` or by ``weights``, that takes it."""

    json_what: ClassVar[str] = "placement key"
    json_unknown_first: ClassVar[bool] = True

    order: Annotated[
        tuple[str, ...],
        Meta(description="Every cluster once, in the order placement tries them."),
    ] = ()
    weights: Annotated[
        dict[str, Annotated[float, Meta(gt=0)]],
        Meta(
            description="Every cluster with a weight above 0: each job's clusters are tried in a weighted "
            "random order of its own, so jobs spread over them in proportion."
        ),
    ] = EMPTY_MAP
    patience: Annotated[
        float,
        Meta(
            gt=0,
            description="Seconds a job may wait on a cluster for capacity before that cluster counts as "
            "refusing new jobs.",
        ),
    ] = PATIENCE


class FleetFile(Model, frozen=True):
    """The keys of a fleet config file, declared once: decoding and the JSON Schema come from here."""

    json_what: ClassVar[str] = "config key"
    json_unknown_first: ClassVar[bool] = True

    clusters: Annotated[
        dict[str, MemberFile],
        Meta(
            min_length=1,
            description="The clusters of the fleet by name, each a cluster config (adapter, settings, ...); "
            "they share one store and one policy, which each names alike or leaves out.",
        ),
    ]
    placement: Annotated[
        PlacementFile,
        Meta(description="The placement rule: `order` or `weights`, and `patience` (docs/fleet.md)."),
    ]

    def __post_init__(self) -> None:
        names = list(self.clusters)
        for name in names:
            if not re.fullmatch(NAME, name):
                raise InvalidError(
                    f"{name!r} cannot name a cluster of a fleet: use 1 to 63 characters from A-Z a-z 0-9 . _ - "
                    "(no comma: names go into --cluster a,b)",
                    path=key_path("clusters", name),
                )
        _check_placement(self.placement, names)
        _one("store", {n: m.store for n, m in self.clusters.items()}, StoreChoice())
        _one("policy", {n: m.policy for n, m in self.clusters.items()}, DEFAULT_POLICY)


def _check_placement(placement: PlacementFile, names: list[str]) -> None:
    order, weights = placement.order, placement.weights
    allowed = ", ".join(names)
    if bool(order) == bool(weights):
        raise InvalidError(
            f"give `order: [{allowed}]` (tried in that order) or `weights: {{NAME: W, ...}}` (spread by "
            "weight), one of them",
            path="placement",
        )
    for i, name in enumerate(order):
        if name not in names:
            raise InvalidError(
                f"no cluster {name!r} in this file; it names: {allowed}", path=f"placement.order[{i}]"
            )
        if name in order[:i]:
            raise InvalidError(f"{name!r} is listed twice", path=f"placement.order[{i}]")
    for name in weights:
        if name not in names:
            raise InvalidError(
                f"no cluster {name!r} in this file; it names: {allowed}",
                path=key_path("placement.weights", name),
            )
    key = "order" if order else "weights"
    missing = [n for n in names if n not in (order or weights)]
    if missing:
        raise InvalidError(
            f"every cluster of the fleet must be in it; missing: {', '.join(missing)}",
            path=f"placement.{key}",
        )


def _one(key: str, given: Mapping[str, Any], unset: Any) -> None:
    """A fleet shares one store and one policy: those the clusters name must be the same."""
    named = [(n, v) for n, v in given.items() if v != unset]
    for name, value in named[1:]:
        first, theirs = named[0]
        if value != theirs:
            shown = f"{theirs} and {value}" if key == "store" else "different policies"
            raise InvalidError(
                f"a fleet shares one {key}: {key_path('clusters', first)} and {key_path('clusters', name)} name "
                f"{shown}; give "
                f"every cluster the same {key}, or name it in one and leave it out of the others",
                path=f"{key_path('clusters', name)}.{key}",
            )


class FleetConfig(Struct, frozen=True):
    """A decoded fleet config file: its clusters (each a :class:`ClusterFile` with its name in
    ``cluster``, the fleet's store and policy, its ``checkpoints``), in the configured order, and the
    placement rule. ``embedded`` and ``read_only`` are those of a :class:`ClusterFile`, for the commands
    that ask (a fleet is never the embedded default; a cluster of it may be read-only). A Struct, not a
    dataclass: it is on a read command's path (docs/architecture.md)."""

    source: str
    members: tuple[ClusterFile, ...]
    store: StoreChoice
    policy: Policy
    weights: Mapping[str, float] | None = None
    patience: float = PATIENCE
    embedded: ClassVar[bool] = False
    read_only: ClassVar[bool] = False

    @property
    def names(self) -> list[str]:
        return [m.cluster for m in self.members]

    def member(self, name: str) -> ClusterFile:
        for m in self.members:
            if m.cluster == name:
                return m
        raise InvalidError(
            f"no cluster {name!r} in {self.source}; it names: {', '.join(self.names)}", path="--cluster"
        )


def parse(text: str | bytes, *, source: str, base: Path | None = None) -> FleetConfig:
    """Decode a fleet config document strictly (YAML, or JSON / TOML by ``source``'s extension); every
    error names the file and the path in it."""
    try:
        return _fleet_from(read_document(text, source), source, base)
    except InvalidError as exc:
        raise in_file(exc, source) from None


def _fleet_from(raw: object, source: str, base: Path | None) -> FleetConfig:
    doc = FleetFile.from_json(raw)
    store = next((m.store for m in doc.clusters.values() if m.store != StoreChoice()), StoreChoice())
    policy = next((m.policy for m in doc.clusters.values() if m.policy != DEFAULT_POLICY), DEFAULT_POLICY)
    placement = doc.placement
    names = list(placement.order) or list(doc.clusters)
    members = []
    for name in names:
        m = doc.clusters[name]
        one = resolved(m.replace(store=store, policy=policy), source, base, name)
        members.append(one.replace(checkpoints=m.checkpoints))
    return FleetConfig(
        source,
        tuple(members),
        members[0].store,
        policy,
        weights=dict(placement.weights) or None,
        patience=placement.patience,
    )


def load(
    path: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cluster: str | None = None,
    cwd: Path | None = None,
) -> ClusterFile | FleetConfig:
    """The config :func:`~dispatch.cli.config.discover` finds — one cluster, a profile of a file naming
    several (``cluster``), or a fleet — else the embedded default. Each cluster's settings are checked by
    its adapter (without opening anything)."""
    p, _ = discover(path, environ=environ, cwd=cwd)
    if p is None:
        from dispatch.cli.config import load_config

        return load_config(path, environ=environ, cluster=cluster, cwd=cwd)
    data = read_limited(p, "cluster config")
    source, base = str(p), p.resolve().parent
    try:
        raw = read_document(data, source)
        found = _fleet_from(raw, source, base) if is_fleet(raw) else config_from(raw, source, base, cluster)
    except InvalidError as exc:
        raise in_file(exc, source) from None
    if isinstance(found, ClusterFile):
        check_settings(found)
        return found
    for member in found.members:
        _member_settings(member)
    return found


def _member_settings(member: ClusterFile) -> None:
    """The adapter's check of one cluster's settings, its errors naming the cluster."""
    try:
        check_settings(member)
    except InvalidError as exc:
        path = f"{key_path('clusters', member.cluster)}.{exc.path}"
        err = InvalidError(exc.detail, path=path)
        err.args = (f"{member.source}: {path}: {exc.detail}",)
        raise err from None


def fleet_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a fleet config file, derived from :class:`FleetFile`."""
    return json_schema(
        FleetFile,
        title="dispatch fleet config",
        description="A config file naming a fleet of clusters and its placement rule (docs/fleet.md).",
    )


async def open_configured_fleet(
    cf: FleetConfig, *, token: str | None = None, read_only: bool = False, refresh: bool = False
) -> Fleet:
    """Open the fleet a config file describes, over its one store (:func:`dispatch.open_fleet`): each
    cluster with its adapter and settings, the probe cache kept in the store (``refresh``: probe again),
    read-only when ``read_only`` or its own ``readOnly`` says so. A cluster that cannot be opened joins
    closed (``dispatch clusters`` says why)."""
    from dispatch.config import Config
    from dispatch.fleet import Berth, open_fleet
    from dispatch.probecache import StoreProbeCache
    from dispatch.records.store import KeyValues

    store = cf.store.open()
    cache = StoreProbeCache(store, refresh=refresh) if isinstance(store, KeyValues) else None
    berths = {
        m.cluster: Berth(
            m.adapter,
            Config(
                adapter=m.settings,
                read_only=read_only or m.read_only,
                token=token,
                probe_cache=cache,
            ),
            checkpoints=m.checkpoints,
        )
        for m in cf.members
    }
    try:
        return await open_fleet(berths, store, policy=cf.policy, weights=cf.weights, patience=cf.patience)
    except BaseException:
        await store.close()
        raise
