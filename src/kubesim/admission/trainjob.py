"""TrainJob admission: the v2.3 CRD's schema limits, defaults and CEL rules, and Trainer's webhooks.

Order as on a real server: CRD defaults, mutating webhooks (Trainer stamps ``runtimePatches[].time``),
schema + CEL validation (422 ``Invalid``; when the schema fails CEL rules are skipped and a ``<nil>``
cause says so), then the Trainer validating webhook (403, ``admission webhook ... denied the request``).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

from kubesim.admission.webhook import aggregate, denied
from kubesim.clock import Clock, stamp
from kubesim.controllers.trainjob_build import (
    GROUP,
    MPI_RESERVED,
    TORCH_RESERVED,
    XGBOOST_RESERVED,
    framework_of,
    is_supported,
    registry_key,
    runtime_pod_sets,
)
from kubesim.errors import ApiError, Cause, cached_not_found_message, invalid
from kubesim.jsontypes import (
    BOOLEAN,
    INTEGER,
    STRING,
    STRING_MAP,
    array_of,
    object_of,
    prune_nulls,
    type_causes,
)
from kubesim.resources import CLUSTERTRAININGRUNTIMES, JOBSETS, TRAININGRUNTIMES, TRAINJOBS, ResourceType

__all__ = [
    "DEFAULT_MANAGED_BY",
    "TRAINER_WEBHOOK",
    "default_trainjob",
    "schema_causes",
    "trainer_webhook_causes",
]

DEFAULT_MANAGED_BY = "trainer.kubeflow.org/trainjob-controller"
MANAGED_BY_VALUES = (DEFAULT_MANAGED_BY, "kueue.x-k8s.io/multikueue")
TRAINER_WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
DEFAULTER_WEBHOOK = "defaulter.trainjob.trainer.kubeflow.org"
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)
# A domain-prefixed path, as apimachinery's IsDomainPrefixedPath requires of a patch manager.
_DOMAIN_PREFIXED = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$"
)

RuntimeGetter = Callable[[ResourceType, str | None, str], dict[str, Any]]


def default_trainjob(obj: dict[str, Any]) -> dict[str, Any]:
    """The CRD schema defaults: ``managedBy``, ``suspend: false``, ``runtimeRef.apiGroup``/``kind``."""
    out = copy.deepcopy(obj)
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    # The API server prunes null fields of a custom resource (none of TrainJob's is nullable), so a null
    # in a runtime patch is "not set", never a strategic-merge deletion later.
    spec = out["spec"] = prune_nulls(spec)
    spec.setdefault("managedBy", DEFAULT_MANAGED_BY)
    spec.setdefault("suspend", False)
    ref = spec.get("runtimeRef")
    if isinstance(ref, dict):
        ref.setdefault("apiGroup", GROUP)
        ref.setdefault("kind", "ClusterTrainingRuntime")
    return out


def stamp_patch_times(obj: dict[str, Any], old: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """Trainer's mutating webhook: stamp ``time`` on new or changed runtime patches."""
    out = copy.deepcopy(obj)
    # Malformed shapes are left alone here: schema validation, which runs after mutation, refuses them.
    spec = out.get("spec")
    patches = spec.get("runtimePatches") if isinstance(spec, dict) else None
    if not isinstance(patches, list):
        return out
    old_by_manager = {
        p.get("manager"): p
        for p in ((old or {}).get("spec") or {}).get("runtimePatches") or []
        if isinstance(p, dict) and isinstance(p.get("manager"), str)
    }
    for p in patches:
        if not isinstance(p, dict):
            continue
        manager = p.get("manager")
        prev = old_by_manager.get(manager) if old is not None and isinstance(manager, str) else None
        if prev is not None:
            a = {k: v for k, v in p.items() if k != "time"}
            b = {k: v for k, v in prev.items() if k != "time"}
            if a == b:
                if "time" in prev:
                    p["time"] = prev["time"]
                continue
        if not p.get("time"):
            p["time"] = now
    return out


def _list_map_dups(items: list[Any], key: str, path: str) -> list[Cause]:
    seen: set[Any] = set()
    out: list[Cause] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        k = item.get(key)
        if k in seen:
            out.append(Cause.duplicate(f"{path}[{i}]", {key: k}))
        seen.add(k)
    return out


def _max_items(spec: dict[str, Any], path: str, value: Any, limit: int) -> list[Cause]:
    if isinstance(value, list) and len(value) > limit:
        return [Cause.too_many(path, len(value), limit)]
    return []


_META = object_of(labels=STRING_MAP, annotations=STRING_MAP)
_ENV_VAR = object_of(name=STRING, value=STRING, valueFrom=object_of())
_CONTAINER_PATCH = object_of(
    name=STRING, env=array_of(_ENV_VAR), volumeMounts=array_of(object_of()), securityContext=object_of()
)
_POD_SPEC_PATCH = object_of(
    serviceAccountName=STRING,
    volumes=array_of(object_of()),
    initContainers=array_of(_CONTAINER_PATCH),
    containers=array_of(_CONTAINER_PATCH),
    imagePullSecrets=array_of(object_of()),
    securityContext=object_of(),
    nodeSelector=STRING_MAP,
    affinity=object_of(),
    tolerations=array_of(object_of()),
    schedulingGates=array_of(object_of(name=STRING)),
    terminationGracePeriodSeconds=INTEGER,
)
_RUNTIME_PATCH = object_of(
    manager=STRING,
    time=STRING,
    trainingRuntimeSpec=object_of(
        template=object_of(
            metadata=_META,
            spec=object_of(
                replicatedJobs=array_of(
                    object_of(
                        name=STRING,
                        template=object_of(
                            metadata=_META,
                            spec=object_of(template=object_of(metadata=_META, spec=_POD_SPEC_PATCH)),
                        ),
                    )
                )
            ),
        )
    ),
)
_INITIALIZER = object_of(storageUri=STRING, env=array_of(_ENV_VAR), secretRef=object_of(name=STRING))
# The JSON types of the fields kubesim reads (admission, controllers); other fields are stored as given.
_SPEC = object_of(
    runtimeRef=object_of(name=STRING, apiGroup=STRING, kind=STRING),
    suspend=BOOLEAN,
    managedBy=STRING,
    activeDeadlineSeconds=INTEGER,
    runtimePatches=array_of(_RUNTIME_PATCH),
    initializer=object_of(dataset=_INITIALIZER, model=_INITIALIZER),
    trainer=object_of(
        image=STRING,
        command=array_of(STRING),
        args=array_of(STRING),
        env=array_of(_ENV_VAR),
        numNodes=INTEGER,
        numProcPerNode=INTEGER,
        resourcesPerNode=object_of(limits=object_of(), requests=object_of()),
    ),
)


# Go types of the TrainJob fields whose JSON type kubesim checks (trainer/v1alpha1 trainjob_types.go);
# other integers are int32, as most are.
_GO_TYPES = {"spec.activeDeadlineSeconds": "int64", "spec.trainer.env.value": "string"}
_GO_VALUE = {"string": "string", "integer": "number", "number": "number", "boolean": "bool", "array": "array"}


def go_decode_error(obj: dict[str, Any]) -> str | None:
    """encoding/json's ``UnmarshalTypeError`` text for the first field of the wrong JSON type, as a Go
    program decoding the TrainJob reports it (``json: cannot unmarshal string into Go struct field
    TrainJob.spec.trainer.numProcPerNode of type int32``), or None."""
    causes = type_causes(prune_nulls(obj.get("spec")), _SPEC, "spec")
    # FieldValueTypeInvalid reads `Invalid value: "<json type>": ...`; Go decodes a null into a zero value
    causes = [c for c in causes if c.message.split('"')[1] != "null"]
    if not causes:
        return None
    cause = causes[0]
    got = cause.message.split('"')[1]
    want = cause.message.rsplit(" must be of type ", 1)[1].split(":")[0]
    path = re.sub(r"\[\d+\]", "", cause.field)
    go_type = _GO_TYPES.get(path) or {"integer": "int32", "boolean": "bool", "string": "string"}.get(
        want, want
    )
    if want == "array":
        go_type = "[]string"
    elif want == "object":
        go_type = "map[string]interface {}" if path.endswith(("limits", "requests")) else "struct"
    return f"json: cannot unmarshal {_GO_VALUE.get(got, got)} into Go struct field TrainJob.{path} of type {go_type}"


def schema_causes(obj: dict[str, Any]) -> list[Cause]:
    """Structural schema errors (types, required fields, lengths, item counts, minimums, list-map keys)."""
    spec = obj.get("spec")
    if spec is None:
        return [Cause.required("spec")]
    causes = type_causes(spec, _SPEC, "spec")
    if causes or not isinstance(spec, dict):
        return causes
    ref = spec.get("runtimeRef")
    if not isinstance(ref, dict):
        causes.append(Cause.required("spec.runtimeRef"))
    else:
        name = ref.get("name")
        if name is None:
            causes.append(Cause.required("spec.runtimeRef.name"))
        elif isinstance(name, str) and len(name) < 1:
            causes.append(
                Cause.invalid_value(
                    "spec.runtimeRef.name",
                    name,
                    "spec.runtimeRef.name in body should be at least 1 chars long",
                )
            )
        elif isinstance(name, str) and len(name) > 253:
            causes.append(Cause.too_long("spec.runtimeRef.name", 253))
        for f in ("apiGroup", "kind"):
            if isinstance(ref.get(f), str) and len(ref[f]) > 253:
                causes.append(Cause.too_long(f"spec.runtimeRef.{f}", 253))
    managed_by = spec.get("managedBy")
    if isinstance(managed_by, str) and len(managed_by) > 253:
        causes.append(Cause.too_long("spec.managedBy", 253))
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and (not isinstance(ads, int) or isinstance(ads, bool) or ads < 1):
        causes.append(
            Cause.invalid_value(
                "spec.activeDeadlineSeconds",
                ads,
                "spec.activeDeadlineSeconds in body should be greater than or equal to 1",
            )
        )
    trainer = spec.get("trainer")
    if isinstance(trainer, dict):
        image = trainer.get("image")
        if isinstance(image, str) and len(image) > 500:
            causes.append(Cause.too_long("spec.trainer.image", 500))
        for f in ("command", "args"):
            causes += _max_items(spec, f"spec.trainer.{f}", trainer.get(f), 128)
            for i, item in enumerate(trainer.get(f) or []):
                if isinstance(item, str) and len(item) > 1048576:
                    causes.append(Cause.too_long(f"spec.trainer.{f}[{i}]", 1048576))
        env = trainer.get("env")
        causes += _max_items(spec, "spec.trainer.env", env, 128)
        if isinstance(env, list):
            for i, e in enumerate(env):
                if not isinstance(e, dict) or not e.get("name"):
                    causes.append(Cause.required(f"spec.trainer.env[{i}].name"))
            causes += _list_map_dups(env, "name", "spec.trainer.env")
    patches = spec.get("runtimePatches")
    if isinstance(patches, list):
        causes += _max_items(spec, "spec.runtimePatches", patches, 16)
        for i, p in enumerate(patches):
            if not isinstance(p, dict) or p.get("manager") is None:
                causes.append(Cause.required(f"spec.runtimePatches[{i}].manager"))
            elif isinstance(p.get("manager"), str) and not p["manager"]:
                causes.append(
                    Cause.invalid_value(
                        f"spec.runtimePatches[{i}].manager",
                        "",
                        f"spec.runtimePatches[{i}].manager in body should be at least 1 chars long",
                    )
                )
            elif isinstance(p.get("manager"), str) and len(p["manager"]) > 253:
                causes.append(Cause.too_long(f"spec.runtimePatches[{i}].manager", 253))
        causes += _list_map_dups(patches, "manager", "spec.runtimePatches")
    return causes


def _cel_value_cause(path: str, value: Any, message: str) -> Cause:
    # Scalars are shown with the message; objects and lists are not (as the real server prints them).
    if isinstance(value, dict | list):
        return Cause.invalid_detail(path, message)
    return Cause.invalid_value(path, value, message)


def cel_causes(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """The CRD's CEL rules: the name rules at the root, managedBy values, and immutable fields."""
    causes: list[Cause] = []
    name = str((obj.get("metadata") or {}).get("name") or "")
    if not _RFC1035.match(name):
        causes.append(Cause.invalid_detail("<nil>", "metadata.name must match RFC 1035 DNS label format"))
    if len(name) > 63:
        causes.append(Cause.invalid_detail("<nil>", "metadata.name must be no more than 63 characters"))
    spec = obj.get("spec") or {}
    managed_by = spec.get("managedBy")
    if managed_by is not None and managed_by not in MANAGED_BY_VALUES:
        causes.append(
            Cause.invalid_value(
                "spec.managedBy",
                managed_by,
                "ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set",
            )
        )
    if old is not None:
        old_spec = old.get("spec") or {}
        # Transition rules (self == oldSelf) run only when the field exists in both old and new.
        for f in ("activeDeadlineSeconds", "initializer", "managedBy", "runtimeRef", "trainer"):
            if f in spec and f in old_spec and spec[f] != old_spec[f]:
                causes.append(_cel_value_cause(f"spec.{f}", spec[f], "field is immutable"))
    return causes


def crd_validate(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Schema then CEL, as the apiextensions server runs them."""
    causes = schema_causes(obj)
    if causes:
        return [*causes, Cause.invalid_value("<nil>", None, _NOT_CHECKED)]
    return cel_causes(obj, old)


def _rjob_containers(runtime: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rjob in ((runtime.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "replicatedJobs"
    ) or []:
        pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        names = {
            str(c.get("name")) for c in (pod.get("containers") or []) + (pod.get("initContainers") or [])
        }
        out[str(rjob.get("name"))] = names
    return out


def _runtime_ref_json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"name": ref.get("name"), "apiGroup": ref.get("apiGroup"), "kind": ref.get("kind")}


def trainer_webhook_causes(
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    get: RuntimeGetter,
) -> tuple[str | None, list[Cause]]:
    """Trainer's validating webhook. Returns (plain error, field causes); either refuses the request.

    ``get(rt, namespace, name)`` reads an object (raising ApiError 404 when absent).
    """
    if not is_supported(obj):
        return f"unsupported runtime: {registry_key(obj)}", []
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ref = spec.get("runtimeRef") or {}
    cluster = ref.get("kind") == "ClusterTrainingRuntime"
    try:
        if cluster:
            runtime = get(CLUSTERTRAININGRUNTIMES, None, str(ref.get("name")))
        else:
            runtime = get(TRAININGRUNTIMES, meta.get("namespace"), str(ref.get("name")))
    except ApiError as e:
        if e.code != 404:
            raise
        which = "clusterTrainingRuntime" if cluster else "trainingRuntime"
        path = "spec.RuntimeRef" if cluster else "spec.runtimeRef"
        missing = cached_not_found_message(
            CLUSTERTRAININGRUNTIMES if cluster else TRAININGRUNTIMES, str(ref.get("name"))
        )
        # the RuntimeRef struct is printed as JSON in its Go field order (name, apiGroup, kind), not sorted
        value = json.dumps(_runtime_ref_json(ref), separators=(",", ":"))
        detail = f"{missing}: specified {which} must be created before the TrainJob is created"
        return None, [Cause(path, f"Invalid value: {value}: {detail}")]
    causes: list[Cause] = []
    fw = framework_of(runtime)
    trainer = spec.get("trainer")
    env = list((trainer or {}).get("env") or []) if isinstance(trainer, dict) else []
    env_names = [str(e.get("name")) for e in env if isinstance(e, dict)]
    if fw in ("torch", "mpi"):
        reserved = TORCH_RESERVED if fw == "torch" else MPI_RESERVED
        bad = sorted({n for n in env_names if n in reserved})
        if bad:
            causes.append(
                Cause.invalid_value(
                    "spec.trainer.env",
                    env,
                    f"must not have reserved envs, invalid envs configured: [{' '.join(bad)}]",
                )
            )
    elif fw == "xgboost":
        for i, n in enumerate(env_names):
            if n in XGBOOST_RESERVED:
                causes.append(
                    Cause.forbidden(f"spec.trainer.env[{i}]", f"{n} is reserved for the XGBoost runtime")
                )
    if fw == "mpi" and isinstance(trainer, dict) and trainer.get("numNodes") is not None:
        mpi = ((runtime.get("spec") or {}).get("mlPolicy") or {}).get("mpi") or {}
        names = {ps.name for ps in runtime_pod_sets(obj, runtime)}
        if mpi.get("runLauncherAsNode") and not {"node", "launcher"} <= names and trainer["numNodes"] != 1:
            causes.append(
                Cause.invalid_value(
                    "spec.trainer.numNodes",
                    trainer["numNodes"],
                    "must have 1 when MPI trainingRuntime with enabled runLauncherAsNode does not have either "
                    "launcher and node",
                )
            )
    causes += _patch_causes(obj, old, runtime, get)
    return None, causes


def _patch_causes(
    obj: dict[str, Any], old: dict[str, Any] | None, runtime: dict[str, Any], get: RuntimeGetter
) -> list[Cause]:
    path = "spec.runtimePatches"
    spec = obj.get("spec") or {}
    patches = list(spec.get("runtimePatches") or [])
    causes: list[Cause] = []
    if old is not None:
        old_spec = old.get("spec") or {}
        if patches != list(old_spec.get("runtimePatches") or []):
            if not old_spec.get("suspend") and not spec.get("suspend"):
                causes.append(
                    Cause.forbidden(
                        path,
                        "RuntimePatches can only be modified when the TrainJob is suspended before or after the update",
                    )
                )
            else:
                meta = obj.get("metadata") or {}
                try:
                    js = get(JOBSETS, meta.get("namespace"), str(meta.get("name")))
                except ApiError as e:
                    if e.code != 404:
                        raise
                    js = {}
                for rj in (js.get("status") or {}).get("replicatedJobsStatus") or []:
                    if int(rj.get("active") or 0) > 0:
                        causes.append(
                            Cause.forbidden(
                                path,
                                f"RuntimePatches cannot be modified when the JobSet's ReplicatedJob {rj.get('name')} "
                                "is still active",
                            )
                        )
    containers = _rjob_containers(runtime)
    for p in patches:
        manager = str(p.get("manager") or "")
        if not _DOMAIN_PREFIXED.match(manager):
            causes.append(
                Cause.invalid_value(
                    f"{path}.manager", manager, 'must be a domain-prefixed path (such as "acme.io/foo")'
                )
            )
        tmpl = ((p.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        for rpatch in tmpl.get("replicatedJobs") or []:
            rname = str(rpatch.get("name"))
            if rname not in containers:
                causes.append(
                    Cause.invalid_value(
                        path,
                        patches,
                        "must not have replicated job that doesn't exist in the runtime job template",
                    )
                )
                continue
            pod = (((rpatch.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for c in pod.get("initContainers") or []:
                if c.get("name") not in containers[rname]:
                    causes.append(
                        Cause.invalid_value(
                            path,
                            patches,
                            f"must not have initContainer that doesn't exist in the runtime job {rname}",
                        )
                    )
            for c in pod.get("containers") or []:
                if c.get("name") not in containers[rname]:
                    causes.append(
                        Cause.invalid_value(
                            path,
                            patches,
                            f"must not have container that doesn't exist in the runtime job {rname}",
                        )
                    )
                elif c.get("env") and c.get("name") in ("dataset-initializer", "model-initializer", "node"):
                    causes.append(
                        Cause.invalid_value(
                            path,
                            patches,
                            "must not have envs for the dataset-initializer, model-initializer, node containers",
                        )
                    )
    return causes


class TrainJobAdmission:
    """The hooks a real cluster runs for TrainJobs, bound to a store reader and a clock:
    ``crd_mutate``/``crd_validate`` (what the API server does for the CRD) and
    ``webhook_mutate``/``webhook_validate`` (Trainer's webhooks, which a controller install registers)."""

    def __init__(self, get: RuntimeGetter, clock: Clock) -> None:
        self._get = get
        self._clock = clock

    def crd_mutate(
        self, operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The CRD's schema defaults only."""
        if rt != TRAINJOBS or operation not in ("CREATE", "UPDATE"):
            return None
        return default_trainjob(obj)

    def webhook_mutate(
        self, operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """Trainer's defaulting webhook only (runtime patch timestamps). Mutating webhooks run before the
        CRD schema is checked, and this one first decodes the object into its Go type: a wrong JSON type
        (``numProcPerNode: "auto"``) fails there, a 400 from the webhook rather than the schema's 422."""
        if rt != TRAINJOBS or operation not in ("CREATE", "UPDATE"):
            return None
        message = go_decode_error(obj)
        if message is not None:
            # admission.Errored(400, err): ToStatusErr keeps the webhook's code and leaves the reason empty
            prefix = f'admission webhook "{DEFAULTER_WEBHOOK}" denied the request: '
            raise ApiError(400, "", prefix + message)
        return stamp_patch_times(
            obj, old if operation == "UPDATE" else None, stamp(self._clock, self._clock.now())
        )

    def crd_validate(
        self, operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """Schema + CEL only (422)."""
        if rt != TRAINJOBS or operation not in ("CREATE", "UPDATE"):
            return None
        prev = old if operation == "UPDATE" else None
        if prev is not None and obj.get("spec") == prev.get("spec"):
            return None
        causes = crd_validate(obj, prev)
        if causes:
            raise invalid(TRAINJOBS, str((obj.get("metadata") or {}).get("name") or ""), causes)
        return None

    def webhook_validate(
        self, operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """Trainer's validating webhook only (403 denial); registered after ``crd_validate``, so it only
        sees objects the schema accepted."""
        if rt != TRAINJOBS or operation not in ("CREATE", "UPDATE"):
            return None
        prev = old if operation == "UPDATE" else None
        if prev is not None and obj.get("spec") == prev.get("spec"):
            return None
        plain, wcauses = trainer_webhook_causes(obj, prev, self._get)
        if plain is not None:
            raise denied(TRAINER_WEBHOOK, plain)
        if wcauses:
            raise denied(TRAINER_WEBHOOK, aggregate(wcauses))
        return None


__all__ += ["TrainJobAdmission", "cel_causes", "crd_validate", "stamp_patch_times"]
