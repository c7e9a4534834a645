"""Opening a cluster: :func:`open` and the :class:`Cluster` it returns (operator and observer)."""

from __future__ import annotations

import random
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dispatch.backend import Backend
from dispatch.clock import Clock
from dispatch.config import Config
from dispatch.errors import InvalidError
from dispatch.model import Capabilities, JobSpec, Policy
from dispatch.records import Store, store_identity
from dispatch.registry import new_backend

from .observer import Observer
from .operator import Operator

if TYPE_CHECKING:
    from dispatch.supervise import Supervisor

__all__ = ["Cluster", "backend_for", "open"]


async def open(
    name: str, config: Config | None = None, *, clock: Clock | None = None, rng: random.Random | None = None
) -> Cluster:
    """Open the cluster of adapter ``name`` with ``config`` and return a :class:`Cluster`.

    The adapter is found in the registry (by import or through the ``dispatch.adapters`` entry points).
    Without ``config.store`` the records go to a :class:`~dispatch.records.SqliteStore` under the user's
    state directory. ``clock`` (tests: a :class:`~dispatch.clock.ManualClock`) times the records and the
    polling of :meth:`Cluster.watch`; ``rng`` draws the records' nonces (the simulation seeds it).
    """
    config = config if config is not None else Config()
    if not isinstance(config, Config):
        raise InvalidError(f"expected a dispatch.Config, got {type(config).__name__}", path="config")
    store = config.store
    if store is None:
        from dispatch.records import SqliteStore, default_store_path  # deferred: sqlite3 is not light

        store = SqliteStore(default_store_path())
    try:
        backend = await backend_for(name, config, store)
    except BaseException:
        if config.store is None:
            await store.close()
        raise
    return Cluster(backend, store, policy=config.policy, clock=clock, rng=rng)


async def backend_for(name: str, config: Config, store: Store) -> Backend:
    """The backend of adapter ``name`` opened with ``config`` for the records of ``store``: the objects it
    creates carry the store's identity, so two stores sharing a cluster leave each other's alone."""
    store_id = await store_identity(store)
    return await new_backend(name, config.adapter_config(name, store_id=store_id))


class Cluster(Operator, Observer):
    """One opened cluster with its records: the operator (:class:`~dispatch.cluster.operator.Operator`),
    the observer (:class:`~dispatch.cluster.observer.Observer`) and its capabilities.

    An async context manager; :meth:`close` closes the backend and the store.
    """

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the backend and the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.backend.close()
        finally:
            await self.store.close()

    def __repr__(self) -> str:
        return f"Cluster(backend={self.backend.name!r}, store={type(self.store).__name__})"

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        """What this cluster can do; with ``spec``, also refuse (``UnsupportedError``, every reason) a
        job it cannot run."""
        return await self.backend.capabilities(spec)

    def supervisor(self, policy: Policy | None = None, **options: Any) -> Supervisor:
        """A :class:`~dispatch.supervise.Supervisor` over this cluster's backend and store, applying
        ``policy`` (default: the cluster's) to records without their own. ``options`` are the
        supervisor's (``holder``, ``lease``, ``poll``, ``unmatched``, ``jobs``, ...)."""
        from dispatch.supervise import Supervisor

        if policy is not None and not isinstance(policy, Policy):
            raise InvalidError(f"expected a Policy, got {type(policy).__name__}", path="policy")
        return Supervisor(
            self.backend,
            self.store,
            policy=policy if policy is not None else self.policy,
            clock=self.clock,
            **options,
        )
