"""dispatch's Kubeflow Trainer v2 adapter, registered as ``"kubeflow"``.

Importing this package registers the adapter (``dispatch.register("kubeflow", factory)``) and the
``kubeflow/RuntimeRef`` extension. It is also found through the ``dispatch.adapters`` entry point, so
``dispatch.open("kubeflow", ...)`` works without importing it.
"""

from dispatch.registry import Adapter, register
from dispatch_kubeflow.backend import Backend, factory
from dispatch_kubeflow.errors import PodsRemainError, StaleHoldError
from dispatch_kubeflow.extension import RuntimeRef
from dispatch_kubeflow.names import KIND_CLUSTER_TRAINING_RUNTIME, KIND_TRAINING_RUNTIME, NAME
from dispatch_kubeflow.settings import Settings, parse_settings, schema
from dispatch_kubeflow.trainjob import ACCEPTED_EXTENSIONS

__all__ = [
    "ADAPTER",
    "KIND_CLUSTER_TRAINING_RUNTIME",
    "KIND_TRAINING_RUNTIME",
    "NAME",
    "Backend",
    "PodsRemainError",
    "RuntimeRef",
    "Settings",
    "StaleHoldError",
    "factory",
    "parse_settings",
    "schema",
]

ADAPTER = register(
    Adapter(
        NAME,
        factory,
        parse_settings=parse_settings,
        schema=schema,
        extensions=frozenset(ACCEPTED_EXTENSIONS),
        summary="Kubeflow Trainer v2 on Kubernetes (TrainJobs run as JobSets, optionally queued by Kueue)",
    )
)
"""The ``kubeflow`` adapter's descriptor (also the ``dispatch.adapters`` entry point)."""
