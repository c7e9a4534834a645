"""The ``kubeflow/RuntimeRef`` extension: which Trainer runtime a job runs on."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

from dispatch.errors import InvalidError
from dispatch.model import Extension, register_extension
from dispatch.model.declare import Model
from dispatch_kubeflow.names import KIND_CLUSTER_TRAINING_RUNTIME, RUNTIME_KINDS

__all__ = ["RuntimeRef", "check_runtime_name"]

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Kubernetes object name (DNS-1123 subdomain); shared with the settings' schema."""
_SUBDOMAIN = DNS_SUBDOMAIN


def check_runtime_name(name: str, path: str) -> str:
    """A runtime is a Kubernetes object: its name is a DNS-1123 subdomain of at most 253 characters."""
    if not name or len(name) > 253 or not re.match(_SUBDOMAIN, name):
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
class RuntimeRef(Model, Extension, omit_defaults=False, frozen=True):
    """``kubeflow/RuntimeRef``: the Trainer runtime a job runs on.

    JSON: ``{"kind": "ClusterTrainingRuntime" | "TrainingRuntime", "name": "<runtime>"}``; ``kind`` defaults
    to ``ClusterTrainingRuntime`` as it does in Trainer. A ``TrainingRuntime`` is looked up in the adapter's
    namespace. The attribute is ``runtime`` (not ``name``, which every extension type reserves for its own
    name); its JSON key is ``name``.
    """

    NAME: ClassVar[str] = "kubeflow/RuntimeRef"
    # The schema's words; __post_init__ checks them with messages that say what a runtime is.
    runtime: Annotated[
        str, Meta(extra_json_schema={"minLength": 1, "maxLength": 253, "pattern": DNS_SUBDOMAIN})
    ] = msgspec.field(name="name")
    kind: Annotated[str, Meta(extra_json_schema={"enum": list(RUNTIME_KINDS)})] = (
        KIND_CLUSTER_TRAINING_RUNTIME
    )

    def __post_init__(self) -> None:
        if not isinstance(self.runtime, str):
            raise InvalidError("expected a string", path="name")
        if not isinstance(self.kind, str):
            raise InvalidError("expected a string", path="kind")
        check_runtime_name(self.runtime, "name")
        check_runtime_kind(self.kind, "kind")
