"""Settings of the ``memory`` adapter, decoded strictly from the adapter's JSON settings bytes."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from dispatch.errors import InvalidError
from dispatch.memory.script import DEFAULT_SCRIPT, parse_script
from dispatch.model._decode import INT_MAX, INT_MIN, Fields, as_int, as_number, as_str, load_json

__all__ = ["MemorySettings", "parse_settings", "schema"]

_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")

MAX_NODES = 100_000
"""The largest simulated cluster: every node is an object in memory, made when the cluster opens."""

MAX_WATCH_HISTORY = 10_000_000
"""The most changes kept for resuming watches."""


@dataclass(frozen=True, slots=True)
class MemorySettings:
    """The simulated cluster's shape and pace. JSON keys (camelCase) in brackets.

    - ``nodes`` (``nodes``): capacity in nodes; a job takes one node per ``JobSpec.nodes``. Default 4.
    - ``start_delay`` (``startDelay``): seconds a job spends ``starting`` once it has nodes. Default 1.
    - ``cessation_delay`` (``cessationDelay``): seconds from ``stop`` (or a timeout kill, or a hold of a
      running job) until the job's compute is gone. Default 2.
    - ``image_pull_grace`` (``imagePullGrace``): seconds a job whose image cannot be pulled stays
      ``starting``/``image_pull`` before it fails. Default 10.
    - ``default_script`` (``defaultScript``): the behaviour of a job without ``KUBESIM_SCRIPT``.
      Default ``"sleep 5; exit 0"``.
    - ``watch_history`` (``watchHistory``): changes kept for resuming watches; an older cursor relists.
      Default 10000.
    - ``cluster`` (``cluster``): a name under which the cluster is shared by every backend opened in
      this process with the same name (and the same settings). Default: a private cluster.
    """

    nodes: int = 4
    start_delay: float = 1.0
    cessation_delay: float = 2.0
    image_pull_grace: float = 10.0
    default_script: str = DEFAULT_SCRIPT
    watch_history: int = 10_000
    cluster: str | None = None

    def __post_init__(self) -> None:
        for key, count, most in (
            ("nodes", self.nodes, MAX_NODES),
            ("watchHistory", self.watch_history, MAX_WATCH_HISTORY),
        ):
            if isinstance(count, bool) or not isinstance(count, int):
                raise InvalidError(f"expected an integer, got {count!r}", path=key)
            _at_least(count, 1, key)
            if count > most:
                raise InvalidError(f"must be at most {most:,}, got {count}", path=key)
        for key, value in (
            ("startDelay", self.start_delay),
            ("cessationDelay", self.cessation_delay),
            ("imagePullGrace", self.image_pull_grace),
        ):
            _at_least(value, 0, key)
        if not isinstance(self.default_script, str):
            raise InvalidError(f"expected a script, got {self.default_script!r}", path="defaultScript")
        parse_script(self.default_script, path="defaultScript")
        if self.cluster is not None and not (
            isinstance(self.cluster, str) and _CLUSTER_NAME.match(self.cluster)
        ):
            raise InvalidError(
                f"expected 1 to 63 characters from A-Z a-z 0-9 . _ -, got {self.cluster!r}", path="cluster"
            )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "nodes": self.nodes,
            "startDelay": self.start_delay,
            "cessationDelay": self.cessation_delay,
            "imagePullGrace": self.image_pull_grace,
            "defaultScript": self.default_script,
            "watchHistory": self.watch_history,
        }
        if self.cluster is not None:
            out["cluster"] = self.cluster
        return out


def _at_least(value: float, low: float, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidError(f"expected a finite number, got {type(value).__name__}", path=path)
    # A huge int would overflow math.isfinite, and could not even be shown in the message.
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise InvalidError(f"integer out of range; integers are 64-bit (at most {INT_MAX})", path=path)
    if not math.isfinite(value):
        raise InvalidError(f"expected a finite number, got {value!r}", path=path)
    if value < low:
        raise InvalidError(f"must be at least {low}, got {value}", path=path)


def parse_settings(raw: bytes | str) -> MemorySettings:
    """Decode the settings bytes strictly: unknown keys, nulls, duplicate keys, trailing data and
    out-of-range values are refused with :class:`InvalidError` naming the key."""
    value = load_json(raw or b"{}", what="settings")
    f = Fields(value, "", what="memory setting")
    defaults = MemorySettings()
    settings = MemorySettings(
        nodes=f.optional("nodes", as_int, defaults.nodes),
        start_delay=f.optional("startDelay", as_number, defaults.start_delay),
        cessation_delay=f.optional("cessationDelay", as_number, defaults.cessation_delay),
        image_pull_grace=f.optional("imagePullGrace", as_number, defaults.image_pull_grace),
        default_script=f.optional("defaultScript", as_str, defaults.default_script),
        watch_history=f.optional("watchHistory", as_int, defaults.watch_history),
        cluster=f.optional("cluster", as_str, None),
    )
    f.done()
    return settings


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the memory adapter's settings."""
    seconds = {"type": "number", "minimum": 0}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "dispatch memory adapter settings",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "nodes": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_NODES,
                "default": 4,
                "description": "capacity in nodes",
            },
            "startDelay": {**seconds, "default": 1, "description": "seconds spent starting"},
            "cessationDelay": {
                **seconds,
                "default": 2,
                "description": "seconds from stop until compute is gone",
            },
            "imagePullGrace": {**seconds, "default": 10, "description": "seconds before a bad image fails"},
            "defaultScript": {"type": "string", "default": DEFAULT_SCRIPT, "description": "behaviour script"},
            "watchHistory": {"type": "integer", "minimum": 1, "maximum": MAX_WATCH_HISTORY, "default": 10000},
            "cluster": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"},
        },
    }
