"""The adapter's settings (SPEC §9.2): strict decoding, defaults, cross-field rules, and the JSON Schema.

:func:`parse_settings` touches no cluster. Every refusal is an :class:`~dispatch.errors.InvalidError`
naming the path of the offending value (``tolerations[0].operator``, ``labels["a b"]``). The schema
(:func:`schema`) describes the shapes; a few rules are checked by the parser only (see
``docs/kubeflow-configuration.md``): the minimum probe window, ``priorityClass``/``admissionCheck``
needing ``queue``, the Kubernetes toleration rules, requests not above limits, dispatch's reserved keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any

from dispatch.errors import InvalidError
from dispatch.model._decode import Fields, as_int, as_list, as_mapping, as_object, as_str, key_path, load_json
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

__all__ = ["CheckpointVolume", "Settings", "parse_duration", "parse_quantity", "parse_settings", "schema"]

MIN_PROBE_WINDOW = 10.0
MAX_PROBE_WINDOW = 3600.0
DEFAULT_PROBE_TTL = 3600.0
MAX_PROBE_TTL = 720 * 3600.0
DEFAULT_PROBE_RUNTIME = RuntimeRef("torch-distributed", KIND_CLUSTER_TRAINING_RUNTIME)
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
DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
QUANTITY = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
ABSOLUTE_PATH = r"^/.*$"
QUEUE_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

_RE = {p: re.compile(p) for p in (DNS_LABEL, DNS_SUBDOMAIN, LABEL_VALUE, QUALIFIED_NAME, DURATION, QUANTITY)}
_RE_QUEUE = re.compile(QUEUE_NAME)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class CheckpointVolume:
    """The PersistentVolumeClaim that provides ``dispatch/SharedCheckpoint`` directories."""

    claim_name: str
    mount_path: str


@dataclass(frozen=True, slots=True, eq=True)
class Settings:
    """The decoded settings of the Kubeflow adapter, with defaults applied (see §9.2 and the docs)."""

    namespace: str = "default"
    kubeconfig: str | None = None
    context: str | None = None
    probe_runtime: RuntimeRef = DEFAULT_PROBE_RUNTIME
    probe_window: float = MIN_PROBE_WINDOW
    probe_ttl: float = DEFAULT_PROBE_TTL
    queue: str | None = None
    priority_class: str | None = None
    admission_check: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    service_account_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    tolerations: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    image_pull_secrets: tuple[str, ...] = ()
    resources_per_node: Mapping[str, Any] | None = field(default=None, hash=False)
    checkpoint_volume: CheckpointVolume | None = None
    output_tail_lines: int = 50

    def __post_init__(self) -> None:
        for name in ("labels", "annotations", "node_selector"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def runtime_namespace(self, kind: str) -> str | None:
        """Where a runtime of ``kind`` lives: a ``TrainingRuntime`` in ``namespace``, a cluster one nowhere."""
        return self.namespace if kind != KIND_CLUSTER_TRAINING_RUNTIME else None


def parse_settings(raw: bytes) -> Settings:
    """Decode the adapter's settings strictly, apply defaults and check every rule. Touches no cluster.

    Raises :class:`~dispatch.errors.InvalidError` (naming the path) for an unknown key at any level, a
    duplicate key, trailing data, a ``null``, a value of the wrong type or shape, or a broken rule.
    """
    if isinstance(raw, str):
        raw = raw.encode()
    if not isinstance(raw, bytes | bytearray):
        raise InvalidError(f"expected JSON bytes, got {type(raw).__name__}", path="settings")
    try:
        doc = load_json(bytes(raw), what="settings")
        return _decode(doc)
    except RecursionError:
        raise InvalidError("nested too deeply", path="settings") from None


def _decode(doc: Any) -> Settings:
    f = Fields(doc, "", what="setting")
    namespace = f.optional("namespace", _dns_label, "default")
    kubeconfig = f.optional("kubeconfig", _non_empty, None)
    context = f.optional("context", _non_empty, None)
    probe_runtime = f.optional("probeRuntime", _probe_runtime, DEFAULT_PROBE_RUNTIME)
    probe_window = f.optional("probeWindow", _probe_window, MIN_PROBE_WINDOW)
    probe_ttl = f.optional("probeTTL", _probe_ttl, DEFAULT_PROBE_TTL)
    queue = f.optional("queue", _queue_name, None)
    priority_class = f.optional("priorityClass", _queue_name, None)
    admission_check = f.optional("admissionCheck", _subdomain, None)
    labels = f.optional("labels", _labels, dict[str, str]())
    annotations = f.optional("annotations", _annotations, dict[str, str]())
    service_account = f.optional("serviceAccountName", _subdomain, None)
    node_selector = f.optional("nodeSelector", _node_selector, dict[str, str]())
    tolerations = f.optional("tolerations", _tolerations, list[dict[str, Any]]())
    pull_secrets = f.optional("imagePullSecrets", _pull_secrets, list[str]())
    resources = f.optional("resourcesPerNode", _resources, None)
    checkpoint = f.optional("checkpointVolume", _checkpoint_volume, None)
    tail = f.optional("outputTailLines", _tail_lines, 50)
    f.done()
    if priority_class is not None and queue is None:
        raise InvalidError("priorityClass is a Kueue priority: it requires queue", path="priorityClass")
    if admission_check is not None and queue is None:
        raise InvalidError(
            "admissionCheck is a Kueue admission check: it requires queue", path="admissionCheck"
        )
    return Settings(
        namespace=namespace,
        kubeconfig=kubeconfig,
        context=context,
        probe_runtime=probe_runtime,
        probe_window=probe_window,
        probe_ttl=probe_ttl,
        queue=queue,
        priority_class=priority_class,
        admission_check=admission_check,
        labels=labels,
        annotations=annotations,
        service_account_name=service_account,
        node_selector=node_selector,
        tolerations=tuple(tolerations),
        image_pull_secrets=tuple(pull_secrets),
        resources_per_node=resources,
        checkpoint_volume=checkpoint,
        output_tail_lines=tail,
    )


# --- field readers -----------------------------------------------------------------------------------


def _match(pattern: str, value: str, path: str, what: str, max_len: int) -> str:
    if len(value) > max_len or not _RE[pattern].match(value):
        raise InvalidError(f"{value[:80]!r} is not {what} (at most {max_len} characters)", path=path)
    return value


def _dns_label(value: Any, path: str) -> str:
    text = as_str(value, path)
    return _match(DNS_LABEL, text, path, "a DNS-1123 label (lower-case letters, digits and '-')", 63)


def _subdomain(value: Any, path: str) -> str:
    text = as_str(value, path)
    return _match(
        DNS_SUBDOMAIN, text, path, "a DNS-1123 subdomain (lower-case letters, digits, '-', '.')", 253
    )


def _queue_name(value: Any, path: str) -> str:
    # Kueue object names that also become label values: a DNS subdomain of at most 63 characters.
    text = as_str(value, path)
    if len(text) > 63 or not _RE_QUEUE.match(text) or not _RE[DNS_SUBDOMAIN].match(text):
        raise InvalidError(
            f"{text[:80]!r} is not a Kueue object name usable as a label value "
            "(lower-case letters, digits, '-', '.', at most 63 characters)",
            path=path,
        )
    return text


def _non_empty(value: Any, path: str) -> str:
    text = as_str(value, path)
    if not text:
        raise InvalidError("must not be empty; omit the key to use the default", path=path)
    return text


def _probe_runtime(value: Any, path: str) -> RuntimeRef:
    f = Fields(value, path)
    kind = f.required("kind", as_str)
    name = f.required("name", as_str)
    f.done()
    if kind not in RUNTIME_KINDS:
        raise InvalidError(
            f"unknown runtime kind {kind!r}; expected one of {', '.join(RUNTIME_KINDS)}", path=f"{path}.kind"
        )
    _match(DNS_SUBDOMAIN, name, f"{path}.name", "a runtime name (a DNS-1123 subdomain)", 253)
    return RuntimeRef(name, kind)


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")


def parse_duration(text: str, path: str = "duration") -> float:
    """Seconds in a duration string such as ``"10s"``, ``"1m"``, ``"1m30s"``, ``"1500ms"``."""
    if len(text) > 64 or not _RE[DURATION].match(text):
        raise InvalidError(
            f'{text[:80]!r} is not a duration: write a number and a unit (ms, s, m, h), e.g. "10s", "1m30s"',
            path=path,
        )
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))


def _probe_ttl(value: Any, path: str) -> float:
    seconds = parse_duration(as_str(value, path), path)
    if seconds > MAX_PROBE_TTL:
        raise InvalidError(f"the probe TTL must be at most 720h (30 days), got {value!r}", path=path)
    return seconds


def _probe_window(value: Any, path: str) -> float:
    seconds = parse_duration(as_str(value, path), path)
    if seconds < MIN_PROBE_WINDOW:
        raise InvalidError(
            f"the probe window must be at least 10s (got {value!r}): the probe needs time to see the controllers act",
            path=path,
        )
    if seconds > MAX_PROBE_WINDOW:
        raise InvalidError(f"the probe window must be at most 1h (got {value!r})", path=path)
    return seconds


def _reserved(key: str) -> bool:
    return key.startswith(f"{DOMAIN}/") or key in (LABEL_MANAGED_BY, LABEL_QUEUE, LABEL_PRIORITY)


def _qualified_key(key: str, path: str, what: str) -> None:
    name = key.rsplit("/", 1)[-1]
    prefix = key[: -len(name) - 1] if "/" in key else ""
    if not _RE[QUALIFIED_NAME].match(key) or len(name) > 63 or len(prefix) > 253:
        raise InvalidError(
            f"{key[:80]!r} is not a valid {what} key: an optional DNS-subdomain prefix and '/', then a name of at most "
            "63 characters (letters, digits, '-', '_', '.', starting and ending with a letter or digit)",
            path=path,
        )


def _label_value(value: Any, path: str) -> str:
    text = as_str(value, path)
    return _match(LABEL_VALUE, text, path, "a label value (letters, digits, '-', '_', '.')", 63)


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


def _labels(value: Any, path: str) -> dict[str, str]:
    out = as_mapping(value, path, _label_value)
    _map_keys(out, path, "label", reserved=True)
    return out


def _annotations(value: Any, path: str) -> dict[str, str]:
    out = as_mapping(value, path, as_str)
    _map_keys(out, path, "annotation", reserved=True)
    # The API server counts UTF-8 bytes of every annotation, dispatch's own included (SPEC §9.5).
    size = sum(len(k.encode()) + len(v.encode()) for k, v in out.items())
    budget = MAX_ANNOTATION_BYTES - OWN_ANNOTATION_BYTES
    if size > budget:
        raise InvalidError(
            f"annotations take {size} bytes (keys and values, UTF-8); at most {budget} are allowed: the API "
            f"server's limit is {MAX_ANNOTATION_BYTES} bytes for all annotations and dispatch's own take up to "
            f"{OWN_ANNOTATION_BYTES}",
            path=path,
        )
    return out


def _node_selector(value: Any, path: str) -> dict[str, str]:
    out = as_mapping(value, path, _label_value)
    _map_keys(out, path, "node selector", reserved=False)
    return out


def _one_of(value: Any, path: str, allowed: tuple[str, ...]) -> str:
    text = as_str(value, path)
    if text not in allowed:
        raise InvalidError(f"unknown value {text!r}; expected one of {', '.join(allowed)}", path=path)
    return text


def _toleration(value: Any, path: str) -> dict[str, Any]:
    f = Fields(value, path)
    key = f.optional("key", as_str, "")
    operator = f.optional("operator", lambda v, p: _one_of(v, p, _TOLERATION_OPERATORS), "Equal")
    tval = f.optional("value", as_str, "")
    effect = f.optional("effect", lambda v, p: _one_of(v, p, _TOLERATION_EFFECTS), "")
    seconds = f.optional("tolerationSeconds", as_int, None)
    f.done()
    # The rules the Kubernetes API applies to a pod's tolerations.
    if key:
        _qualified_key(key, f"{path}.key", "toleration")
    elif operator != "Exists":
        raise InvalidError('a toleration without a key must use operator "Exists"', path=f"{path}.operator")
    if operator == "Exists" and tval:
        raise InvalidError('a toleration with operator "Exists" must not have a value', path=f"{path}.value")
    if tval:
        _match(LABEL_VALUE, tval, f"{path}.value", "a label value", 63)
    if seconds is not None and not _INT64_MIN <= seconds <= _INT64_MAX:
        raise InvalidError(
            f"{seconds} does not fit Kubernetes' 64-bit tolerationSeconds", path=f"{path}.tolerationSeconds"
        )
    if seconds is not None and effect != "NoExecute":
        raise InvalidError(
            'tolerationSeconds applies only to effect "NoExecute"', path=f"{path}.tolerationSeconds"
        )
    out: dict[str, Any] = {}
    if key:
        out["key"] = key
    out["operator"] = operator
    if tval:
        out["value"] = tval
    if effect:
        out["effect"] = effect
    if seconds is not None:
        out["tolerationSeconds"] = seconds
    return out


def _tolerations(value: Any, path: str) -> list[dict[str, Any]]:
    items = as_list(value, path, _toleration)
    if len(items) > MAX_TOLERATIONS:
        raise InvalidError(f"at most {MAX_TOLERATIONS} tolerations", path=path)
    return items


def _pull_secret(value: Any, path: str) -> str:
    f = Fields(value, path)
    name = f.required("name", _subdomain)
    f.done()
    return name


def _pull_secrets(value: Any, path: str) -> list[str]:
    names = as_list(value, path, _pull_secret)
    if len(names) > MAX_PULL_SECRETS:
        raise InvalidError(f"at most {MAX_PULL_SECRETS} image pull secrets", path=path)
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidError(f"duplicate image pull secret {name!r}", path=f"{path}[{i}].name")
    return names


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
_QUANTITY_SPLIT = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$")


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
    if len(text) > 64 or not _RE[QUANTITY].match(text):
        raise InvalidError(f'{text[:80]!r} is not a Kubernetes quantity (e.g. "500m", "4Gi", "2")', path=path)
    m = _QUANTITY_SPLIT.match(text)
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


def _resource_map(value: Any, path: str) -> dict[str, Any]:
    obj = as_object(value, path)
    out: dict[str, Any] = {}
    for name, qty in obj.items():
        where = key_path(path, name)
        _qualified_key(name, where, "resource name")
        parse_quantity(qty, where)
        out[name] = qty
    return out


def _claim(value: Any, path: str) -> dict[str, str]:
    f = Fields(value, path)
    name = f.required("name", _dns_label)
    request = f.optional("request", _dns_label, None)
    f.done()
    return {"name": name} if request is None else {"name": name, "request": request}


def _resources(value: Any, path: str) -> dict[str, Any]:
    f = Fields(value, path)
    limits = f.optional("limits", _resource_map, None)
    requests = f.optional("requests", _resource_map, None)
    claims = f.optional("claims", lambda v, p: as_list(v, p, _claim), None)
    f.done()
    if limits and requests:
        for name, qty in requests.items():
            if name in limits and parse_quantity(qty, "") > parse_quantity(limits[name], ""):
                raise InvalidError(
                    f"request {qty!r} is above the limit {limits[name]!r}: Kubernetes refuses such a pod",
                    path=key_path(f"{path}.requests", name),
                )
    out: dict[str, Any] = {}
    if limits is not None:
        out["limits"] = limits
    if requests is not None:
        out["requests"] = requests
    if claims is not None:
        names = [c["name"] for c in claims]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise InvalidError(f"duplicate claim {n!r}", path=f"{path}.claims[{i}].name")
        out["claims"] = claims
    return out


def _checkpoint_volume(value: Any, path: str) -> CheckpointVolume:
    f = Fields(value, path)
    claim = f.required("claimName", _subdomain)
    mount = f.required("mountPath", as_str)
    f.done()
    where = f"{path}.mountPath"
    if not mount.startswith("/"):
        raise InvalidError(f"expected an absolute directory, got {mount!r}", path=where)
    parts = [p for p in mount.split("/") if p]
    if not parts:
        raise InvalidError("the checkpoint volume cannot be mounted over the container's root", path=where)
    if any(p in (".", "..") for p in parts) or ":" in mount or len(mount) > 4096:
        raise InvalidError(f"{mount[:80]!r}: use a plain absolute path without '.', '..' or ':'", path=where)
    return CheckpointVolume(claim, "/" + "/".join(parts))


def _tail_lines(value: Any, path: str) -> int:
    n = as_int(value, path)
    if not 0 <= n <= MAX_OUTPUT_TAIL_LINES:
        raise InvalidError(f"must be between 0 and {MAX_OUTPUT_TAIL_LINES}, got {n}", path=path)
    return n


# --- schema ------------------------------------------------------------------------------------------


def _string_map(value_schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "propertyNames": {"pattern": QUALIFIED_NAME, "maxLength": 317},
        "additionalProperties": value_schema,
    }


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the adapter's settings, for a host to publish.

    Every object with fixed keys has ``additionalProperties: false``; maps (labels, annotations, node
    selector, resource quantities) give ``additionalProperties`` a schema for their values. The parser
    additionally enforces the rules listed in ``docs/kubeflow-configuration.md``.
    """
    label_value = {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE}
    quantity = {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": _INT64_MAX},
            {"type": "string", "pattern": QUANTITY, "maxLength": 64},
        ]
    }
    resource_map = {
        "type": "object",
        "propertyNames": {"pattern": QUALIFIED_NAME, "maxLength": 317},
        "additionalProperties": quantity,
    }
    queue_name = {"type": "string", "minLength": 1, "maxLength": 63, "pattern": QUEUE_NAME}
    subdomain = {"type": "string", "minLength": 1, "maxLength": 253, "pattern": DNS_SUBDOMAIN}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://dispatch.dev/schemas/kubeflow-settings.json",
        "title": "dispatch kubeflow adapter settings",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "namespace": {
                "description": "Namespace of the TrainJobs (and of a TrainingRuntime). A DNS-1123 label.",
                "type": "string",
                "minLength": 1,
                "maxLength": 63,
                "pattern": DNS_LABEL,
                "default": "default",
            },
            "kubeconfig": {
                "description": "Path of a kubeconfig file. Default: in-cluster, then $KUBECONFIG, then ~/.kube/config.",
                "type": "string",
                "minLength": 1,
            },
            "context": {
                "description": "kubeconfig context. Default: the current context.",
                "type": "string",
                "minLength": 1,
            },
            "probeRuntime": {
                "description": "The runtime of the preflight probe.",
                "type": "object",
                "additionalProperties": False,
                "required": ["kind", "name"],
                "properties": {
                    "kind": {"enum": list(RUNTIME_KINDS)},
                    "name": subdomain,
                },
                "default": {"kind": KIND_CLUSTER_TRAINING_RUNTIME, "name": "torch-distributed"},
            },
            "probeWindow": {
                "description": 'How long preflight watches the probe (e.g. "10s", "1m"); at least 10s, at most 1h.',
                "type": "string",
                "maxLength": 64,
                "pattern": DURATION,
                "default": "10s",
            },
            "probeTTL": {
                "description": 'How long cached probe findings are reused when the host hands a probe cache (e.g. "1h"; "0s": never); at most 720h.',
                "type": "string",
                "maxLength": 64,
                "pattern": DURATION,
                "default": "1h",
            },
            "queue": {"description": "Kueue LocalQueue: label kueue.x-k8s.io/queue-name.", **queue_name},
            "priorityClass": {
                "description": "Kueue WorkloadPriorityClass: label kueue.x-k8s.io/priority-class. Requires queue.",
                **queue_name,
            },
            "admissionCheck": {
                "description": "Kueue AdmissionCheck served by dispatch-admission. Requires queue.",
                **subdomain,
            },
            "labels": _string_map(label_value, "Labels added to every TrainJob (not dispatch's own keys)."),
            "annotations": _string_map(
                {"type": "string"}, "Annotations added to every TrainJob (not dispatch's own keys)."
            ),
            "serviceAccountName": {"description": "Service account of the job's pods.", **subdomain},
            "nodeSelector": _string_map(label_value, "Node selector of the job's pods."),
            "tolerations": {
                "description": "Tolerations of the job's pods, as in Kubernetes.",
                "type": "array",
                "maxItems": MAX_TOLERATIONS,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "key": {"type": "string", "maxLength": 317},
                        "operator": {"enum": list(_TOLERATION_OPERATORS)},
                        "value": {"type": "string", "maxLength": 63},
                        "effect": {"enum": list(_TOLERATION_EFFECTS)},
                        "tolerationSeconds": {
                            "type": "integer",
                            "minimum": _INT64_MIN,
                            "maximum": _INT64_MAX,
                        },
                    },
                },
            },
            "imagePullSecrets": {
                "description": "Image pull secrets of the job's pods, as in Kubernetes.",
                "type": "array",
                "maxItems": MAX_PULL_SECRETS,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {"name": subdomain},
                },
            },
            "resourcesPerNode": {
                "description": "Kubernetes ResourceRequirements of each node: spec.trainer.resourcesPerNode.",
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "limits": resource_map,
                    "requests": resource_map,
                    "claims": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string", "maxLength": 63, "pattern": DNS_LABEL},
                                "request": {"type": "string", "maxLength": 63, "pattern": DNS_LABEL},
                            },
                        },
                    },
                },
            },
            "checkpointVolume": {
                "description": "PersistentVolumeClaim for dispatch/SharedCheckpoint; a job's dir must be under mountPath.",
                "type": "object",
                "additionalProperties": False,
                "required": ["claimName", "mountPath"],
                "properties": {
                    "claimName": subdomain,
                    "mountPath": {"type": "string", "maxLength": 4096, "pattern": ABSOLUTE_PATH},
                },
            },
            "outputTailLines": {
                "description": "Lines of output kept as evidence of a failure.",
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_OUTPUT_TAIL_LINES,
                "default": 50,
            },
        },
    }
