"""dispatch's Slurm adapter, registered as ``"slurm"`` (SPEC §13).

Importing this package registers the adapter; it is also found through the ``dispatch.adapters`` entry
point, so ``dispatch.open("slurm", ...)`` works without importing it. Slurm's commands run here
(``transport: local``) or on a login node over ssh (``transport: ssh``).
"""

from dispatch.registry import Adapter, register
from dispatch_slurm.backend import NAME, SlurmBackend, factory, open_backend
from dispatch_slurm.errors import StaleHoldError
from dispatch_slurm.script import ACCEPTED_EXTENSIONS
from dispatch_slurm.settings import Settings, parse_settings, schema

__all__ = [
    "ADAPTER",
    "NAME",
    "Settings",
    "SlurmBackend",
    "StaleHoldError",
    "factory",
    "open_backend",
    "parse_settings",
    "schema",
]

ADAPTER = register(
    Adapter(
        NAME,
        factory,
        parse_settings=parse_settings,
        schema=schema,
        extensions=ACCEPTED_EXTENSIONS,
        summary="Slurm (sbatch/squeue/scontrol, here or on a login node over ssh)",
    )
)
"""The ``slurm`` adapter's descriptor (also the ``dispatch.adapters`` entry point)."""
