"""The adapter's settings (SPEC §9.2): strict decoding, defaults, cross-field rules, and the JSON Schema.

:func:`parse_settings` touches no cluster. Every refusal is an :class:`~dispatch.errors.InvalidError`
naming the path of the offending value (``tolerations[0].operator``, ``labels["a b"]``). The schema
(:func:`schema`) describes the shapes; a few rules are checked by the parser only (see
``docs/kubeflow-configuration.md``): the minimum probe window, ``priorityClass``/``admissionCheck``
needing ``queue``, the Kubernetes toleration rules, requests not above limits, dispatch's reserved keys.
"""

# No ``from __future__ import annotations`` here: every open decodes the settings, and msgspec would then
# compile and evaluate each field's annotation text anew in every process (a third of a read command's
# settings time). Written as objects, they are built once, when the module loads.

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta
from msgspec.structs import force_setattr

from dispatch.errors import InvalidError
from dispatch.model.declare import (
    EMPTY_MAP,
    Duration,
    Model,
    as_str,
    check_declared,
    frozen_map,
    json_schema,
    key_path,
    load_json,
    parse_duration,
)
from dispatch_kubeflow.extension import RuntimeRef
from dispatch_kubeflow.names import (
    DOMAIN,
    KIND_CLUSTER_TRAINING_RUNTIME,
    LABEL_MANAGED_BY,
    LABEL_PRIORITY,
    LABEL_QUEUE,
    MAX_ANNOTATION_BYTES,
    OWN_ANNOTATION_BYTES,
    RUNTIME_KINDS,
)

__all__ = [
    "CheckpointVolume",
    "Claim",
    "Duration",
    "ProbeRuntime",
    "PullSecret",
    "Resources",
    "Settings",
    "Toleration",
    "parse_duration",
    "parse_quantity",
    "parse_settings",
    "schema",
]

MIN_PROBE_WINDOW = 10.0
MAX_PROBE_WINDOW = 3600.0
MAX_PROBE_TTL = 720 * 3600.0
MAX_OUTPUT_TAIL_LINES = 10_000
MAX_TOLERATIONS = 128
MAX_PULL_SECRETS = 64

# Regular expressions, written once and shared by the parser and the schema so the two agree.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
QUANTITY = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
ABSOLUTE_PATH = r"^/.*$"
QUEUE_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


# --- the rules no type says ---------------------------------------------------------------------------


def _match(pattern: str, value: str, path: str, what: str, max_len: int) -> str:
    if len(value) > max_len or not re.match(pattern, value):  # compiled on first use, then cached by re
        raise InvalidError(f"{value[:80]!r} is not {what} (at most {max_len} characters)", path=path)
    return value


def _reserved(key: str) -> bool:
    return key.startswith(f"{DOMAIN}/") or key in (LABEL_MANAGED_BY, LABEL_QUEUE, LABEL_PRIORITY)


def _qualified_key(key: str, path: str, what: str) -> None:
    name = key.rsplit("/", 1)[-1]
    prefix = key[: -len(name) - 1] if "/" in key else ""
    if not re.match(QUALIFIED_NAME, key) or len(name) > 63 or len(prefix) > 253:
        raise InvalidError(
            f"{key[:80]!r} is not a valid {what} key: an optional DNS-subdomain prefix and '/', then a name of at most "
            "63 characters (letters, digits, '-', '_', '.', starting and ending with a letter or digit)",
            path=path,
        )


def _map_keys(obj: Mapping[str, Any], path: str, what: str, *, reserved: bool) -> None:
    for key in obj:
        where = key_path(path, key)
        _qualified_key(key, where, what)
        if reserved and _reserved(key):
            raise InvalidError(
                f"{key!r} is one of dispatch's own keys ({DOMAIN}/*, {LABEL_MANAGED_BY}, {LABEL_QUEUE}, {LABEL_PRIORITY}); "
                "use the queue and priorityClass settings for Kueue",
                path=where,
            )


def _one_of(value: str, path: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidError(f"unknown value {value!r}; expected one of {', '.join(allowed)}", path=path)
    return value


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY_SPLIT = r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$"


def parse_quantity(value: Any, path: str) -> Decimal:
    """A Kubernetes resource quantity (``"500m"``, ``"4Gi"``, ``2``) as a number; negative ones are refused."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        if value is None:
            as_str(value, path)  # the shared null refusal
        raise InvalidError(
            f'expected a quantity (a string such as "4Gi" or an integer), got {value!r}', path=path
        )
    if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
        # The API server decodes an integer quantity as int64 and refuses larger ones (as a string it is fine).
        raise InvalidError(
            f"{value} is out of range for an integer quantity (at most {_INT64_MAX}); write it as a string, "
            f'e.g. "{value}"',
            path=path,
        )
    text = str(value)
    if len(text) > 64 or not re.match(QUANTITY, text):
        raise InvalidError(f'{text[:80]!r} is not a Kubernetes quantity (e.g. "500m", "4Gi", "2")', path=path)
    m = re.match(_QUANTITY_SPLIT, text)
    assert m is not None  # the pattern above guarantees it
    number, suffix = m.group(1), m.group(2)
    try:
        if suffix in _BINARY:
            amount = Decimal(number) * _BINARY[suffix]
        elif suffix in _DECIMAL:
            amount = Decimal(number) * _DECIMAL[suffix]
        else:
            amount = Decimal(number + suffix)
    except (InvalidOperation, OverflowError):
        raise InvalidError(f"{text!r} is not a usable quantity", path=path) from None
    if amount < 0:
        raise InvalidError(f"{text!r}: resource quantities must not be negative", path=path)
    return amount


# --- the declaration ----------------------------------------------------------------------------------


def _text(
    pattern: str | None = None,
    *,
    expected: str,
    max_length: int | None = None,
    min_length: int | None = None,
    description: str | None = None,
) -> Meta:
    """The declaration of a constrained string: the schema's words, and the parser's when it is refused."""
    return Meta(
        pattern=pattern,
        max_length=max_length,
        min_length=min_length,
        description=description,
        extra={"expected": expected},
    )


DnsLabel = Annotated[
    str,
    _text(
        DNS_LABEL,
        min_length=1,
        max_length=63,
        expected="a DNS-1123 label (lower-case letters, digits and '-'; at most 63 characters)",
    ),
]
Subdomain = Annotated[
    str,
    _text(
        DNS_SUBDOMAIN,
        min_length=1,
        max_length=253,
        expected="a DNS-1123 subdomain (lower-case letters, digits, '-', '.'; at most 253 characters)",
    ),
]
QueueName = Annotated[
    str,
    _text(
        QUEUE_NAME,
        min_length=1,
        max_length=63,
        expected="a Kueue object name usable as a label value (lower-case letters, digits, '-', '.', at most 63 characters)",
    ),
]
LabelValue = Annotated[
    str,
    _text(
        LABEL_VALUE,
        max_length=63,
        expected="a label value (letters, digits, '-', '_', '.'; at most 63 characters)",
    ),
]
NonEmpty = Annotated[str, Meta(min_length=1)]
_KEYS = {"propertyNames": {"pattern": QUALIFIED_NAME, "maxLength": 317}}
"""What the schema says of a map's keys (labels, annotations, node selector, resource names); the
parser checks the parts' lengths too."""
QUANTITY_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": _INT64_MAX},
        {"type": "string", "pattern": QUANTITY, "maxLength": 64},
    ]
}
Quantity = Annotated[Any, Meta(extra_json_schema=QUANTITY_SCHEMA)]
"""A Kubernetes resource quantity: ``"500m"``, ``"4Gi"`` or a whole number (checked by :func:`parse_quantity`)."""
ResourceMap = Annotated[dict[str, Quantity], Meta(extra_json_schema=_KEYS)]


class ProbeRuntime(RuntimeRef, frozen=True):
    """The runtime of the preflight probe: a :class:`RuntimeRef` whose ``kind`` must be written (a
    job's RuntimeRef defaults it; the settings say which runtime a site trusts)."""

    kind: Annotated[str, Meta(extra_json_schema={"enum": list(RUNTIME_KINDS)})]


DEFAULT_PROBE_RUNTIME = ProbeRuntime("torch-distributed", KIND_CLUSTER_TRAINING_RUNTIME)
DEFAULT_PROBE_WINDOW = Duration("10s")
DEFAULT_PROBE_TTL = Duration("1h")


class CheckpointVolume(Model, frozen=True):
    """The PersistentVolumeClaim that provides ``dispatch/SharedCheckpoint`` directories."""

    claim_name: Subdomain
    mount_path: Annotated[str, Meta(extra_json_schema={"maxLength": 4096, "pattern": ABSOLUTE_PATH})]

    def __post_init__(self) -> None:
        check_declared(self)
        mount = self.mount_path
        if not mount.startswith("/"):
            raise InvalidError(f"expected an absolute directory, got {mount!r}", path="mountPath")
        parts = [p for p in mount.split("/") if p]
        if not parts:
            raise InvalidError(
                "the checkpoint volume cannot be mounted over the container's root", path="mountPath"
            )
        if any(p in (".", "..") for p in parts) or ":" in mount or len(mount) > 4096:
            raise InvalidError(
                f"{mount[:80]!r}: use a plain absolute path without '.', '..' or ':'", path="mountPath"
            )
        force_setattr(self, "mount_path", "/" + "/".join(parts))


class Toleration(Model, frozen=True):
    """A toleration of the job's pods, as in Kubernetes (with the rules its API applies)."""

    key: Annotated[str, Meta(extra_json_schema={"maxLength": 317})] = ""
    operator: Annotated[str, Meta(extra_json_schema={"enum": list(_TOLERATION_OPERATORS)})] = "Equal"
    value: Annotated[str, Meta(extra_json_schema={"maxLength": 63})] = ""
    # Absent means every effect; an explicit "" is refused, as the published schema's enum refuses it.
    effect: Annotated[
        str,
        Meta(
            min_length=1,
            extra={"expected": f"one of {', '.join(_TOLERATION_EFFECTS)} (omit it to tolerate every effect)"},
            extra_json_schema={"enum": list(_TOLERATION_EFFECTS)},
        ),
    ] = ""
    toleration_seconds: Annotated[int, Meta(ge=_INT64_MIN, le=_INT64_MAX)] | None = None

    def __post_init__(self) -> None:
        check_declared(self)
        _one_of(self.operator, "operator", _TOLERATION_OPERATORS)
        if self.effect:
            _one_of(self.effect, "effect", _TOLERATION_EFFECTS)
        if self.key:
            _qualified_key(self.key, "key", "toleration")
        elif self.operator != "Exists":
            raise InvalidError('a toleration without a key must use operator "Exists"', path="operator")
        if self.operator == "Exists" and self.value:
            raise InvalidError('a toleration with operator "Exists" must not have a value', path="value")
        if self.value:
            _match(LABEL_VALUE, self.value, "value", "a label value", 63)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise InvalidError(
                'tolerationSeconds applies only to effect "NoExecute"', path="tolerationSeconds"
            )


class PullSecret(Model, frozen=True):
    """An image pull secret of the job's pods, by name."""

    name: Subdomain


class Claim(Model, frozen=True):
    """A dynamic resource claim of each node (``resources.claims``), as in Kubernetes."""

    name: DnsLabel
    request: DnsLabel | None = None


class Resources(Model, frozen=True):
    """Kubernetes ResourceRequirements of each node: ``spec.trainer.resourcesPerNode``."""

    limits: ResourceMap | None = None
    requests: ResourceMap | None = None
    claims: tuple[Claim, ...] | None = None

    def __post_init__(self) -> None:
        for name, amounts in (("limits", self.limits), ("requests", self.requests)):
            for key, qty in (amounts or {}).items():
                where = key_path(name, key)
                _qualified_key(key, where, "resource name")
                parse_quantity(qty, where)
            if amounts is not None:
                force_setattr(self, name, frozen_map(amounts))
        if self.limits and self.requests:
            for key, qty in self.requests.items():
                if key in self.limits and parse_quantity(qty, "") > parse_quantity(self.limits[key], ""):
                    raise InvalidError(
                        f"request {qty!r} is above the limit {self.limits[key]!r}: Kubernetes refuses such a pod",
                        path=key_path("requests", key),
                    )
        names = [c.name for c in self.claims or ()]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise InvalidError(f"duplicate claim {n!r}", path=f"claims[{i}].name")


class Settings(Model, frozen=True):
    """The decoded settings of the Kubeflow adapter, with defaults applied (see §9.2 and the docs).

    Each field is declared once, here: the parser (:func:`parse_settings`) and the JSON Schema
    (:func:`schema`) are derived from it. The rules no schema can say are checked by ``__post_init__``
    (listed in ``docs/kubeflow-configuration.md``)."""

    json_what: ClassVar[str] = "setting"

    namespace: Annotated[
        DnsLabel,
        Meta(
            description="Namespace of the TrainJobs (and of a TrainingRuntime). A DNS-1123 label. "
            "Default: the kubeconfig context's namespace, as kubectl's (default when it names none)."
        ),
    ] = "default"
    kubeconfig: (
        Annotated[
            NonEmpty,
            Meta(
                description="Path of a kubeconfig file. Default: in-cluster, then $KUBECONFIG, then ~/.kube/config."
            ),
        ]
        | None
    ) = None
    context: (
        Annotated[NonEmpty, Meta(description="kubeconfig context. Default: the current context.")] | None
    ) = None
    probe_runtime: Annotated[ProbeRuntime, Meta(description="The runtime of the preflight probe.")] = (
        DEFAULT_PROBE_RUNTIME
    )
    # A Duration default goes through a factory: msgspec's schema writer cannot encode one, so the
    # schema's default is the text.
    probe_window: Annotated[
        Duration,
        Meta(
            description='How long preflight watches the probe (e.g. "10s", "1m"); at least 10s, at most 1h.',
            extra_json_schema={"default": DEFAULT_PROBE_WINDOW.text},
        ),
    ] = msgspec.field(default_factory=lambda: DEFAULT_PROBE_WINDOW)
    probe_ttl: Annotated[
        Duration,
        Meta(
            description='How long cached probe findings are reused when the host hands a probe cache (e.g. "1h"; '
            '"0s": never); at most 720h.',
            extra_json_schema={"default": DEFAULT_PROBE_TTL.text},
        ),
    ] = msgspec.field(default_factory=lambda: DEFAULT_PROBE_TTL, name="probeTTL")
    queue: (
        Annotated[QueueName, Meta(description="Kueue LocalQueue: label kueue.x-k8s.io/queue-name.")] | None
    ) = None
    priority_class: (
        Annotated[
            QueueName,
            Meta(
                description="Kueue WorkloadPriorityClass: label kueue.x-k8s.io/priority-class. Requires queue."
            ),
        ]
        | None
    ) = None
    admission_check: (
        Annotated[
            Subdomain, Meta(description="Kueue AdmissionCheck served by dispatch-admission. Requires queue.")
        ]
        | None
    ) = None
    labels: Annotated[
        dict[str, LabelValue],
        Meta(
            description="Labels added to every TrainJob (not dispatch's own keys).", extra_json_schema=_KEYS
        ),
    ] = EMPTY_MAP
    annotations: Annotated[
        dict[str, str],
        Meta(
            description="Annotations added to every TrainJob (not dispatch's own keys).",
            extra_json_schema=_KEYS,
        ),
    ] = EMPTY_MAP
    service_account_name: (
        Annotated[Subdomain, Meta(description="Service account of the job's pods.")] | None
    ) = None
    node_selector: Annotated[
        dict[str, LabelValue], Meta(description="Node selector of the job's pods.", extra_json_schema=_KEYS)
    ] = EMPTY_MAP
    tolerations: Annotated[
        tuple[Toleration, ...],
        Meta(
            max_length=MAX_TOLERATIONS,
            description="Tolerations of the job's pods, as in Kubernetes.",
            extra={"expected": f"at most {MAX_TOLERATIONS} tolerations"},
        ),
    ] = ()
    image_pull_secrets: Annotated[
        tuple[PullSecret, ...],
        Meta(
            max_length=MAX_PULL_SECRETS,
            description="Image pull secrets of the job's pods, as in Kubernetes.",
            extra={"expected": f"at most {MAX_PULL_SECRETS} image pull secrets"},
        ),
    ] = ()
    resources_per_node: (
        Annotated[
            Resources,
            Meta(description="Kubernetes ResourceRequirements of each node: spec.trainer.resourcesPerNode."),
        ]
        | None
    ) = None
    checkpoint_volume: (
        Annotated[
            CheckpointVolume,
            Meta(
                description="PersistentVolumeClaim for dispatch/SharedCheckpoint; a job's dir must be under mountPath."
            ),
        ]
        | None
    ) = None
    default_image: (
        Annotated[
            NonEmpty,
            Meta(
                description="The image of a job that names none (dispatch/Image): a job file written for every "
                "cluster of a fleet, Slurm's too, carries no image."
            ),
        ]
        | None
    ) = None
    default_runtime: (
        Annotated[
            RuntimeRef,
            Meta(description="The Trainer runtime of a job that names none (kubeflow/RuntimeRef)."),
        ]
        | None
    ) = None
    output_tail_lines: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_OUTPUT_TAIL_LINES,
            description="Lines of output kept as evidence of a failure.",
            extra={"expected": f"an integer between 0 and {MAX_OUTPUT_TAIL_LINES}"},
        ),
    ] = 50

    def __post_init__(self) -> None:
        check_declared(self)
        if self.probe_window < MIN_PROBE_WINDOW:
            raise InvalidError(
                f"the probe window must be at least 10s (got {self.probe_window.text!r}): the probe needs time to "
                "see the controllers act",
                path="probeWindow",
            )
        if self.probe_window > MAX_PROBE_WINDOW:
            raise InvalidError(
                f"the probe window must be at most 1h (got {self.probe_window.text!r})", path="probeWindow"
            )
        if self.probe_ttl > MAX_PROBE_TTL:
            raise InvalidError(
                f"the probe TTL must be at most 720h (30 days), got {self.probe_ttl.text!r}", path="probeTTL"
            )
        for name, value in (("queue", self.queue), ("priorityClass", self.priority_class)):
            if value is not None and not re.match(DNS_SUBDOMAIN, value):
                raise InvalidError(
                    f"{value[:80]!r} is not a Kueue object name usable as a label value "
                    "(lower-case letters, digits, '-', '.', at most 63 characters)",
                    path=name,
                )
        if self.priority_class is not None and self.queue is None:
            raise InvalidError("priorityClass is a Kueue priority: it requires queue", path="priorityClass")
        if self.admission_check is not None and self.queue is None:
            raise InvalidError(
                "admissionCheck is a Kueue admission check: it requires queue", path="admissionCheck"
            )
        _map_keys(self.labels, "labels", "label", reserved=True)
        _map_keys(self.annotations, "annotations", "annotation", reserved=True)
        _map_keys(self.node_selector, "nodeSelector", "node selector", reserved=False)
        # The API server counts UTF-8 bytes of every annotation, dispatch's own included (SPEC §9.5).
        size = sum(len(k.encode()) + len(v.encode()) for k, v in self.annotations.items())
        budget = MAX_ANNOTATION_BYTES - OWN_ANNOTATION_BYTES
        if size > budget:
            raise InvalidError(
                f"annotations take {size} bytes (keys and values, UTF-8); at most {budget} are allowed: the API "
                f"server's limit is {MAX_ANNOTATION_BYTES} bytes for all annotations and dispatch's own take up to "
                f"{OWN_ANNOTATION_BYTES}",
                path="annotations",
            )
        names = [p.name for p in self.image_pull_secrets]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise InvalidError(
                    f"duplicate image pull secret {name!r}", path=f"imagePullSecrets[{i}].name"
                )
        for name in ("labels", "annotations", "node_selector"):
            force_setattr(self, name, frozen_map(getattr(self, name)))

    def runtime_namespace(self, kind: str) -> str | None:
        """Where a runtime of ``kind`` lives: a ``TrainingRuntime`` in ``namespace``, a cluster one nowhere."""
        return self.namespace if kind != KIND_CLUSTER_TRAINING_RUNTIME else None


def parse_settings(raw: bytes) -> Settings:
    """Decode the adapter's settings strictly, apply defaults and check every rule. Touches no cluster.

    Raises :class:`~dispatch.errors.InvalidError` (naming the path) for an unknown key at any level, a
    duplicate key, trailing data, a ``null``, a value of the wrong type or shape, or a broken rule.
    """
    if not isinstance(raw, str | bytes | bytearray):
        raise InvalidError(f"expected JSON bytes, got {type(raw).__name__}", path="settings")
    try:
        # Text goes to the decoder as it is: encoding it here would raise on a lone surrogate.
        return Settings.from_json(load_json(raw, what="settings"))
    except RecursionError:
        raise InvalidError("nested too deeply", path="settings") from None


# --- schema ------------------------------------------------------------------------------------------


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the adapter's settings, for a host to publish: derived from
    :class:`Settings`.

    Every object with fixed keys has ``additionalProperties: false``; maps (labels, annotations, node
    selector, resource quantities) give ``additionalProperties`` a schema for their values. The parser
    additionally enforces the rules listed in ``docs/kubeflow-configuration.md``.
    """
    return json_schema(
        Settings,
        title="dispatch kubeflow adapter settings",
        description="The Kubeflow adapter's settings (docs/kubeflow-configuration.md).",
        id="https://dispatch.dev/schemas/kubeflow-settings.json",
    )
