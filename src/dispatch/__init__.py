"""dispatch: submit and supervise multi-node training jobs on the scheduler a site already runs.

Import this one package: it re-exports the model, the errors, opening a cluster and the stores.
Importing it is light; adapters, stores and the CLI load what they need when used.
"""

from typing import TYPE_CHECKING, Any

from dispatch.backend import (
    Backend,
    CessationSignal,
    Holder,
    HoldToken,
    IdentityWeakener,
    OutputReader,
    Prepared,
    Watcher,
)
from dispatch.clock import Clock, ManualClock, SystemClock
from dispatch.cluster import Cluster, open
from dispatch.config import AdapterConfig, Config
from dispatch.errors import (
    BusyError,
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OtherClusterError,
    OutcomeUnknownError,
    PermissionDeniedError,
    ReadOnlyError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import (
    DEFAULT_POLICY,
    ENV_PREFIX,
    EPOCH_BOUND,
    Absent,
    Action,
    Actor,
    Capabilities,
    Cause,
    Change,
    Compute,
    Epoch,
    Evidence,
    Extension,
    Extensions,
    Handle,
    Identity,
    Image,
    JobRecord,
    JobSpec,
    Lease,
    Limits,
    Mode,
    Observation,
    OpaqueExtension,
    Outcome,
    Plan,
    PlanAction,
    Policy,
    Reading,
    Rule,
    SharedCheckpoint,
    State,
    Transition,
    Unreachable,
    register_extension,
)
from dispatch.probecache import MemoryProbeCache, ProbeCache, StoreProbeCache
from dispatch.records import Store
from dispatch.registry import Adapter, adapters, describe, new_backend, register

if TYPE_CHECKING:
    from dispatch.fleet import Berth, Fleet, open_fleet
    from dispatch.records import MemoryStore, PostgresStore, SqliteStore, default_store_path

__version__ = "0.1.0"

_LAZY = {"MemoryStore", "PostgresStore", "SqliteStore", "default_store_path"}
_FLEET = {"Berth", "Fleet", "open_fleet"}


def __getattr__(name: str) -> Any:
    # The stores load sqlite3 and threads, a fleet the supervisor; keep ``import dispatch`` light by
    # loading them on first use.
    if name in _LAZY:
        import dispatch.records as records

        return getattr(records, name)
    if name in _FLEET:
        import dispatch.fleet as fleet

        return getattr(fleet, name)
    raise AttributeError(f"module 'dispatch' has no attribute {name!r}")


__all__ = [
    "DEFAULT_POLICY",
    "ENV_PREFIX",
    "EPOCH_BOUND",
    "Absent",
    "Action",
    "Actor",
    "Adapter",
    "AdapterConfig",
    "Backend",
    "Berth",
    "BusyError",
    "Capabilities",
    "Cause",
    "CessationSignal",
    "Change",
    "Clock",
    "Cluster",
    "Compute",
    "Config",
    "ConflictError",
    "DispatchError",
    "Epoch",
    "Evidence",
    "Extension",
    "Extensions",
    "Fleet",
    "Handle",
    "HoldToken",
    "Holder",
    "Identity",
    "IdentityWeakener",
    "Image",
    "InvalidError",
    "JobRecord",
    "JobSpec",
    "Lease",
    "Limits",
    "ManualClock",
    "MemoryProbeCache",
    "MemoryStore",
    "Mode",
    "NotFoundError",
    "Observation",
    "OpaqueExtension",
    "OtherClusterError",
    "Outcome",
    "OutcomeUnknownError",
    "OutputReader",
    "PermissionDeniedError",
    "Plan",
    "PlanAction",
    "Policy",
    "PostgresStore",
    "Prepared",
    "ProbeCache",
    "ReadOnlyError",
    "Reading",
    "Rule",
    "SharedCheckpoint",
    "SqliteStore",
    "State",
    "Store",
    "StoreProbeCache",
    "SystemClock",
    "Transition",
    "UnavailableError",
    "Unreachable",
    "UnsupportedError",
    "Watcher",
    "adapters",
    "default_store_path",
    "describe",
    "new_backend",
    "open",
    "open_fleet",
    "register",
    "register_extension",
]
