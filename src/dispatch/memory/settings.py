"""Settings of the ``memory`` adapter, decoded strictly from the adapter's JSON settings bytes."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from msgspec import Meta

from dispatch.memory.script import DEFAULT_SCRIPT, parse_script
from dispatch.model.declare import Model, check_declared, json_schema, load_json

__all__ = ["MemorySettings", "parse_settings", "schema"]

_CLUSTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"

MAX_NODES = 100_000
"""The largest simulated cluster: every node is an object in memory, made when the cluster opens."""

MAX_WATCH_HISTORY = 10_000_000
"""The most changes kept for resuming watches."""


class MemorySettings(Model, frozen=True):
    """The simulated cluster's shape and pace; the JSON keys are the camelCase names. Every field is
    described once, here, and the JSON Schema (:func:`schema`) is derived from it."""

    json_what: ClassVar[str] = "memory setting"

    nodes: Annotated[
        int, Meta(ge=1, le=MAX_NODES, description="capacity in nodes; a job takes one node per JobSpec.nodes")
    ] = 4
    start_delay: Annotated[
        float, Meta(ge=0, description="seconds a job spends starting once it has nodes")
    ] = 1.0
    cessation_delay: Annotated[
        float,
        Meta(
            ge=0,
            description="seconds from stop (or a timeout kill, or a hold of a running job) until the job's "
            "compute is gone",
        ),
    ] = 2.0
    image_pull_grace: Annotated[
        float,
        Meta(ge=0, description="seconds a job whose image cannot be pulled stays starting before it fails"),
    ] = 10.0
    default_script: Annotated[
        str, Meta(description="the behaviour of a job without KUBESIM_SCRIPT (see docs/memory-adapter.md)")
    ] = DEFAULT_SCRIPT
    watch_history: Annotated[
        int,
        Meta(
            ge=1,
            le=MAX_WATCH_HISTORY,
            description="changes kept for resuming watches; an older cursor relists",
        ),
    ] = 10_000
    cluster: (
        Annotated[
            str,
            Meta(
                pattern=_CLUSTER_NAME,
                extra={"expected": "a cluster name (1 to 63 characters from A-Z a-z 0-9 . _ -)"},
                description="a name under which the cluster is shared by every backend opened in this "
                "process with the same name (and the same settings); default: a private cluster",
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        check_declared(self)
        parse_script(self.default_script, path="defaultScript")


def parse_settings(raw: bytes | str) -> MemorySettings:
    """Decode the settings bytes strictly: unknown keys, nulls, duplicate keys, trailing data and
    out-of-range values are refused with :class:`InvalidError` naming the key."""
    return MemorySettings.from_json(load_json(raw or b"{}", what="settings"))


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the memory adapter's settings, derived from :class:`MemorySettings`."""
    return json_schema(
        MemorySettings,
        title="dispatch memory adapter settings",
        description="The simulated cluster's shape and pace (docs/memory-adapter.md).",
    )
