"""Opening a fleet of clusters over one store: :func:`open_fleet` and what it takes per cluster
(:class:`Berth`).

Each cluster is opened as :func:`dispatch.open` opens one (its adapter and :class:`~dispatch.Config`),
over the fleet's one store and under its one policy. A cluster that cannot be opened does not stop the
others: it joins the fleet closed (``Member.cluster is None``, ``seat.down`` saying why) and is tried
again by :meth:`Fleet.open_members` (every command that places a job, and the fleet's supervisor).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from dispatch.clock import Clock
from dispatch.cluster import Cluster, backend_for
from dispatch.config import Config
from dispatch.errors import InvalidError
from dispatch.model import DEFAULT_POLICY, Policy
from dispatch.records import Store

from .fleet import Fleet, Member
from .placer import PATIENCE, Seat

__all__ = ["Berth", "open_fleet"]


@dataclass(frozen=True, slots=True)
class Berth:
    """How one cluster of a fleet is opened: its ``adapter`` and ``config`` (settings, token, read-only,
    probe cache; its store and policy are the fleet's, so ``config.store`` is unset or the fleet's, and
    ``config.policy`` the default or the fleet's) and ``checkpoints``, the name of the checkpoint
    directory its jobs see (clusters that see the same directory give the same name)."""

    adapter: str
    config: Config = field(default_factory=Config)
    checkpoints: str = ""


async def open_fleet(
    clusters: Mapping[str, Berth],
    store: Store | None = None,
    *,
    policy: Policy = DEFAULT_POLICY,
    weights: Mapping[str, float] | None = None,
    patience: float = PATIENCE,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> Fleet:
    """Open the fleet of ``clusters`` (by name, in the order placement tries them unless ``weights``
    spread the jobs) over ``store`` (default: SQLite under the user's state directory).

    A cluster that cannot be opened joins closed, ``seat.down`` saying why; its identity is known from
    the store when an earlier process opened it. ``weights`` (name -> weight > 0) and ``patience`` are
    :class:`Fleet`'s. Wrong arguments (no cluster, a store or policy of its own, a weight for a cluster
    the fleet does not have) are an ``InvalidError`` naming them, and nothing is opened."""
    _check(clusters, store, policy, weights)
    own = store is None
    if store is None:
        from dispatch.records import SqliteStore, default_store_path  # deferred: sqlite3 is not light

        store = SqliteStore(default_store_path())
    shared: Store = store
    members = []
    for name, berth in clusters.items():

        async def reopen(berth: Berth = berth) -> Cluster:
            backend = await backend_for(berth.adapter, berth.config, shared)
            return Cluster(backend, shared, policy=policy, clock=clock, rng=rng)

        members.append(Member(Seat(name, checkpoints=berth.checkpoints), reopen=reopen))
    fleet = Fleet(members, shared, policy=policy, clock=clock, weights=weights, patience=patience, rng=rng)
    try:
        await fleet.open_members()
    except BaseException:
        for m in fleet.members:
            if m.cluster is not None:
                await m.cluster.backend.close()
        if own:
            await shared.close()
        raise
    return fleet


def _check(
    clusters: Mapping[str, Berth],
    store: Store | None,
    policy: Policy,
    weights: Mapping[str, float] | None,
) -> None:
    if not isinstance(clusters, Mapping) or not clusters:
        raise InvalidError("expected the clusters by name, at least one", path="clusters")
    if store is not None and not isinstance(store, Store):
        raise InvalidError(f"expected a Store, got {type(store).__name__}", path="store")
    if not isinstance(policy, Policy):
        raise InvalidError(f"expected a Policy, got {type(policy).__name__}", path="policy")
    for name, berth in clusters.items():
        where = f"clusters[{name!r}]"
        if not isinstance(name, str) or not name:
            raise InvalidError("expected a cluster name", path=where)
        if not isinstance(berth, Berth):
            raise InvalidError(f"expected a Berth(adapter, config), got {type(berth).__name__}", path=where)
        if not isinstance(berth.config, Config):
            raise InvalidError(f"expected a dispatch.Config, got {type(berth.config).__name__}", path=where)
        if berth.config.store is not None and berth.config.store is not store:
            raise InvalidError(
                "a fleet shares one store: leave config.store unset (or the fleet's) and give the store "
                "to open_fleet",
                path=f"{where}.config.store",
            )
        if berth.config.policy not in (DEFAULT_POLICY, policy):
            raise InvalidError(
                "a fleet shares one policy: leave config.policy unset and give the policy to open_fleet",
                path=f"{where}.config.policy",
            )
    if not weights:
        return
    for name in clusters:
        if name not in weights:
            raise InvalidError(
                "with weights, every cluster has one (a number above 0)", path=f"weights[{name!r}]"
            )
    for name, weight in weights.items():
        if name not in clusters:
            raise InvalidError(
                f"no cluster {name!r} in this fleet; it has: {', '.join(clusters)}", path=f"weights[{name!r}]"
            )
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < float("inf"):
            raise InvalidError(f"expected a number above 0, got {weight!r}", path=f"weights[{name!r}]")
