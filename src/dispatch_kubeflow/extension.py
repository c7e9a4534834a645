"""The ``kubeflow/RuntimeRef`` extension: which Trainer runtime a job runs on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from dispatch.errors import InvalidError
from dispatch.model import Extension, register_extension
from dispatch.model._decode import Fields, as_str
from dispatch_kubeflow.names import KIND_CLUSTER_TRAINING_RUNTIME, RUNTIME_KINDS

__all__ = ["RuntimeRef", "check_runtime_name"]

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def check_runtime_name(name: str, path: str) -> str:
    """A runtime is a Kubernetes object: its name is a DNS-1123 subdomain of at most 253 characters."""
    if not name or len(name) > 253 or not _SUBDOMAIN.match(name):
        raise InvalidError(
            f"invalid runtime name {name[:80]!r}: a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 253 characters)",
            path=path,
        )
    return name


def check_runtime_kind(kind: str, path: str) -> str:
    if kind not in RUNTIME_KINDS:
        raise InvalidError(
            f"unknown runtime kind {kind!r}; expected one of {', '.join(RUNTIME_KINDS)}", path=path
        )
    return kind


@register_extension
@dataclass(frozen=True, slots=True)
class RuntimeRef(Extension):
    """``kubeflow/RuntimeRef``: the Trainer runtime a job runs on.

    JSON: ``{"kind": "ClusterTrainingRuntime" | "TrainingRuntime", "name": "<runtime>"}``; ``kind`` defaults
    to ``ClusterTrainingRuntime`` as it does in Trainer. A ``TrainingRuntime`` is looked up in the adapter's
    namespace. The field is ``runtime`` (not ``name``, which every extension type reserves for its own name).
    """

    NAME: ClassVar[str] = "kubeflow/RuntimeRef"
    runtime: str
    kind: str = KIND_CLUSTER_TRAINING_RUNTIME

    def __post_init__(self) -> None:
        where = f'extensions["{self.NAME}"]'
        if not isinstance(self.runtime, str):
            raise InvalidError("expected a string", path=f"{where}.name")
        if not isinstance(self.kind, str):
            raise InvalidError("expected a string", path=f"{where}.kind")
        check_runtime_name(self.runtime, f"{where}.name")
        check_runtime_kind(self.kind, f"{where}.kind")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.runtime}

    @classmethod
    def from_json(cls, value: Any, path: str) -> RuntimeRef:
        f = Fields(value, path)
        kind = f.optional("kind", as_str, KIND_CLUSTER_TRAINING_RUNTIME)
        name = f.required("name", as_str)
        f.done()
        check_runtime_kind(kind, f"{path}.kind")
        check_runtime_name(name, f"{path}.name")
        return cls(name, kind)
