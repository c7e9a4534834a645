"""Preflight (SPEC §9.3): what the cluster serves, what the credentials may do, and the gated probe.

The probe is a TrainJob on ``probeRuntime`` whose pods carry a scheduling gate (created, never
scheduled, consuming nothing). Watching it for the probe window tells whether the Trainer controller
reconciles (a JobSet appears), whether Kueue takes the job (a Workload appears, suspend is set), and
whether pods are visible and their logs readable. The probe is always deleted, even when preflight fails
or is cancelled, and preflight waits (bounded) for it to cease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from msgspec import Struct, field

from dispatch.clock import Clock
from dispatch.errors import (
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    UnavailableError,
    UnsupportedError,
)
from dispatch_kubeflow.errors import AlreadyExistsError
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.names import (
    ADMISSION_CONTROLLER,
    JOBSET_GROUP,
    JOBSET_VERSION,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_JOBSET_NAME,
    NODE_CONTAINER,
    TRAINER_GROUP,
    TRAINER_VERSION,
)
from dispatch_kubeflow.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    CLUSTER_TRAINING_RUNTIMES,
    CRDS,
    JOBSETS,
    LOCAL_QUEUES,
    NAMESPACES,
    PODS,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    WORKLOAD_PRIORITY_CLASSES,
    WORKLOADS,
    group_version_path,
)
from dispatch_kubeflow.runtime import inspect_runtime
from dispatch_kubeflow.settings import Settings
from dispatch_kubeflow.trainer_schema import CRD_NAME, missing_fields, schema_from_crd, schema_from_openapi
from dispatch_kubeflow.trainjob import build_probe

__all__ = [
    "ClusterFacts",
    "admission_check",
    "discover",
    "kueue_objects",
    "probe",
    "probe_runtime",
    "review_access",
    "runtime_path",
]

_log = logging.getLogger(__name__)

_TRAINER_RESOURCES = ("trainjobs", "trainingruntimes", "clustertrainingruntimes")


async def cluster_identity(client: KubeClient) -> str:
    """The cluster's stable identity (SPEC §6.1), read from the cluster itself: the UID of its
    ``kube-system`` namespace, which every process opening the cluster reads alike and a new cluster never
    shares (kubesim makes one per instance). Where the credentials may not read it: the API server's
    address and the fingerprint of its CA."""
    try:
        ns = await client.get_or_none(NAMESPACES.path(None, "kube-system"), what="get namespace kube-system")
    except PermissionDeniedError:
        ns = None
    meta = ns.get("metadata") if isinstance(ns, dict) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if isinstance(uid, str) and uid:
        return f"kubernetes:{uid}"
    ca = f"#ca:{client.ca_fingerprint}" if client.ca_fingerprint else ""
    return f"kubernetes:{client.server}{ca}"


class ClusterFacts(Struct):
    """What preflight learned about the cluster. ``None``: not checked (read-only, observe-only)."""

    kueue: bool = False
    may_write: bool | None = None
    denied: list[str] = field(default_factory=list)
    trainer_reconciles: bool | None = None
    kueue_takes_jobs: bool | None = None
    pods_visible: bool | None = None
    logs_readable: bool | None = None
    probe_ceased: bool | None = None
    probe_left: str = ""
    """What of the probe remained when preflight stopped waiting for it ("" when nothing did)."""
    notes: list[str] = field(default_factory=list)
    probed_at: float | None = None  # when the probe's findings were learned (now, or cached)
    from_cache: bool = False  # the findings came from the host's probe cache, not a probe run now
    trainjob_crd: str = ""
    """The TrainJob CRD's generation and resourceVersion as discover read them ("" when unreadable): part
    of the probe cache's fingerprint, so the CRD is read once per open."""
    hold_refusals: list[str] | None = None
    """Why holds under Kueue cannot work (the admission check is not set up); ``None``: not checked."""


def trainjob_path(namespace: str, name: str | None = None) -> str:
    return TRAINJOBS.path(namespace, name)


def runtime_path(kind: str, name: str, namespace: str | None) -> str:
    """A ``TrainingRuntime`` lives in ``namespace``; a ``ClusterTrainingRuntime`` is cluster-scoped."""
    return (CLUSTER_TRAINING_RUNTIMES if namespace is None else TRAINING_RUNTIMES).path(namespace, name)


async def discover(client: KubeClient, settings: Settings, facts: ClusterFacts) -> None:
    """Check that Trainer and JobSet are served and whether Kueue is; refuse, naming every gap."""
    reasons: list[str] = []
    trainer = await client.served(TRAINER_GROUP, TRAINER_VERSION)
    missing = [r for r in _TRAINER_RESOURCES if trainer is None or r not in trainer]
    if missing:
        reasons.append(
            f"the Trainer API {TRAINER_GROUP}/{TRAINER_VERSION} is not served ({', '.join(missing)} missing): "
            "install Kubeflow Trainer v2.3 (its CRDs and controller)"
        )
    else:
        reasons += await check_trainjob_schema(client, facts)
    jobset = await client.served(JOBSET_GROUP, JOBSET_VERSION)
    if jobset is None or "jobsets" not in jobset:
        reasons.append(
            f"JobSet ({JOBSET_GROUP}/{JOBSET_VERSION} jobsets) is not served: install JobSet v0.12"
        )
    kueue = await client.served(KUEUE_GROUP, KUEUE_VERSION)
    facts.kueue = kueue is not None and "workloads" in kueue
    if settings.queue is not None and not facts.kueue:
        reasons.append(
            f"settings name the Kueue queue {settings.queue!r}, but Kueue ({KUEUE_GROUP}/{KUEUE_VERSION} workloads) "
            "is not served: install Kueue or remove queue"
        )
    if reasons:
        raise UnsupportedError(reasons)


async def check_trainjob_schema(client: KubeClient, facts: ClusterFacts) -> list[str]:
    """Reasons the cluster's TrainJob schema lacks a field dispatch sends (see
    :mod:`dispatch_kubeflow.trainer_schema`): read from the TrainJob CRD, else from the OpenAPI v3 document.
    When neither can be read, a note says so (Strict field validation still refuses a missing field)."""
    schema = None
    try:
        crd = await client.get_or_none(
            CRDS.path(name=CRD_NAME), what=f'get CustomResourceDefinition "{CRD_NAME}"'
        )
        schema = schema_from_crd(crd)
        if crd is not None:
            meta = crd.get("metadata") or {}
            facts.trainjob_crd = (
                f"generation={meta.get('generation')},resourceVersion={meta.get('resourceVersion')}"
            )
    except (PermissionDeniedError, InvalidError):
        pass
    if schema is None:
        path = "/openapi/v3" + group_version_path(TRAINER_GROUP, TRAINER_VERSION)
        try:
            schema = schema_from_openapi(
                await client.get(path, what="read the OpenAPI v3 document of the Trainer API")
            )
        except (PermissionDeniedError, NotFoundError, InvalidError):
            schema = None
    if schema is None:
        facts.notes.append(
            "the TrainJob schema could not be read (neither its CRD nor the OpenAPI v3 document): the Trainer "
            "version is unchecked; writes use fieldValidation=Strict, so a field it lacks is refused, not dropped"
        )
        return []
    return missing_fields(schema)


async def review_access(client: KubeClient, settings: Settings, facts: ClusterFacts) -> None:
    """SelfSubjectAccessReviews: may we create, patch and delete TrainJobs, read pods and their logs?"""
    ns = settings.namespace

    async def ask(verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
        try:
            return await client.allowed(verb, resource, group=group, namespace=ns, subresource=subresource)
        except (PermissionDeniedError, NotFoundError, InvalidError) as exc:
            facts.notes.append(f"could not ask the API server whether it may {verb} {resource} ({exc})")
            return False

    for verb in ("create", "patch", "delete"):
        if not await ask(verb, "trainjobs", TRAINER_GROUP):
            facts.denied.append(verb)
    facts.may_write = not facts.denied
    if facts.denied:
        facts.notes.append(
            f"observe-only: these credentials may not {', '.join(facts.denied)} TrainJobs in namespace {ns!r}"
        )
    facts.pods_visible = await ask("list", "pods")
    facts.logs_readable = await ask("get", "pods", subresource="log")


async def _poll_once(
    client: KubeClient, settings: Settings, name: str, facts: ClusterFacts, seen: dict[str, Any]
) -> str | None:
    """One look at the probe; returns a reason to stop (a failure) or ``None``."""
    ns = settings.namespace
    tj = await client.get_or_none(trainjob_path(ns, name), what=f'get probe TrainJob "{name}"')
    if tj is None:
        return f'the probe TrainJob "{name}" disappeared while being watched (deleted by someone else?)'
    for c in tj.get("status", {}).get("conditions", []) or []:
        if isinstance(c, Mapping) and c.get("type") == "Failed" and c.get("status") == "True":
            return f"the Trainer failed the probe: {c.get('reason', '')}: {c.get('message', '')}"
    if tj.get("spec", {}).get("suspend") is True:
        seen["suspended"] = True
    if (
        not facts.trainer_reconciles
        and await client.get_or_none(JOBSETS.path(ns, name), what=f'get JobSet "{name}"') is not None
    ):
        facts.trainer_reconciles = True
    if facts.kueue and not facts.kueue_takes_jobs:
        uid = tj.get("metadata", {}).get("uid")
        with contextlib.suppress(PermissionDeniedError, NotFoundError):
            for wl in await client.list(WORKLOADS.path(ns), what="list Kueue Workloads"):
                owners = wl.get("metadata", {}).get("ownerReferences") or []
                if any(isinstance(o, Mapping) and o.get("uid") == uid for o in owners):
                    facts.kueue_takes_jobs = True
    if not facts.pods_visible or facts.logs_readable is None:
        try:
            pods = await client.list(
                PODS.path(ns), what="list probe pods", label_selector=f"{LABEL_JOBSET_NAME}={name}"
            )
        except PermissionDeniedError:
            facts.pods_visible = False
            return None
        if pods:
            facts.pods_visible = True
            pod = pods[0].get("metadata", {}).get("name", "")
            try:
                await client.request(
                    "GET",
                    PODS.path(ns, pod, "log"),
                    what="read probe log",
                    params={"container": NODE_CONTAINER},
                    accept_text=True,
                )
                facts.logs_readable = True
            except InvalidError:
                # A gated pod's container has not started: 400 "waiting to start" still proves we may read.
                facts.logs_readable = True
            except PermissionDeniedError:
                facts.logs_readable = False
            except NotFoundError:
                pass  # the pod went away between the list and the read: try again next time
    return None


async def kueue_objects(client: KubeClient, settings: Settings, facts: ClusterFacts) -> list[str]:
    """Reasons why the Kueue objects the settings name are missing (a typo'd queue would leave every job
    waiting forever). Objects the credentials may not read are noted, not refused."""
    if not facts.kueue:
        return []
    wanted = [
        (LOCAL_QUEUES, settings.queue, settings.namespace, "queue"),
        (WORKLOAD_PRIORITY_CLASSES, settings.priority_class, None, "priorityClass"),
        (ADMISSION_CHECKS, settings.admission_check, None, "admissionCheck"),
    ]
    reasons: list[str] = []
    for resource, name, ns, key in wanted:
        if name is None:
            continue
        kind = resource.kind
        try:
            found = await client.get_or_none(resource.path(ns, name), what=f'get Kueue {kind} "{name}"')
        except (PermissionDeniedError, InvalidError) as exc:
            facts.notes.append(f'could not check that Kueue {kind} "{name}" exists ({exc})')
            continue
        if found is None:
            place = f" in namespace {ns!r}" if ns else ""
            reasons.append(
                f'settings.{key}: the Kueue {kind} "{name}" named in the settings does not exist{place}; '
                + await _existing(client, resource, ns)
            )
    return reasons


async def _existing(client: KubeClient, resource: Any, namespace: str | None) -> str:
    """The objects of ``resource`` that exist (where one was looked for): the alternatives to name."""
    kind = resource.kind
    try:
        found = await client.list(resource.path(namespace), what=f"list Kueue {kind}s")
    except DispatchError:  # not readable here: the reason still names what is missing
        return f"the {kind}s that exist could not be listed"
    names = sorted(str((o.get("metadata") or {}).get("name")) for o in found)
    return f"{kind}s that exist: {', '.join(names)}" if names else f"no {kind} exists there"


def _check_names(cq: Mapping[str, Any]) -> list[str]:
    spec = cq.get("spec") if isinstance(cq.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    strategy = spec.get("admissionChecksStrategy")
    listed = strategy.get("admissionChecks") if isinstance(strategy, Mapping) else None
    names = [str(c.get("name")) for c in listed or [] if isinstance(c, Mapping)]
    plain = spec.get("admissionChecks")
    return names + [str(c) for c in plain or [] if isinstance(c, str)]


async def admission_check(client: KubeClient, settings: Settings, facts: ClusterFacts) -> list[str]:
    """Why the hold admission check (settings ``admissionCheck``) cannot hold jobs, every reason: it must
    exist, name :data:`ADMISSION_CONTROLLER`, be ``Active`` (set by a running ``dispatch-admission``), and
    be listed by the ClusterQueue behind ``queue``. Sets ``facts.hold_refusals``; only reads."""
    name = settings.admission_check
    if name is None or settings.queue is None or not facts.kueue:
        return []
    reasons: list[str] = []
    where = f'the Kueue AdmissionCheck "{name}"'

    async def read(path: str, what: str) -> dict[str, Any] | None:
        try:
            return await client.get_or_none(path, what=what)
        except (PermissionDeniedError, InvalidError) as exc:
            reasons.append(f"could not read {what} ({exc}): grant get on it to check holds")
            return None

    ac = await read(ADMISSION_CHECKS.path(name=name), f"AdmissionCheck {name!r}")
    if ac is not None:
        controller = (ac.get("spec") or {}).get("controllerName")
        if controller != ADMISSION_CONTROLLER:
            reasons.append(
                f"{where} names controller {controller!r}, not {ADMISSION_CONTROLLER!r} (dispatch-admission)"
            )
        conditions = (ac.get("status") or {}).get("conditions") or []
        active = any(
            isinstance(c, Mapping) and c.get("type") == "Active" and c.get("status") == "True"
            for c in conditions
        )
        if not active:
            reasons.append(
                f"{where} is not Active: is dispatch-admission running? (it marks the check Active)"
            )
    elif not reasons:
        reasons.append(f"{where} does not exist: apply deploy/admission-check.yaml")
    lq = await read(LOCAL_QUEUES.path(settings.namespace, settings.queue), f"LocalQueue {settings.queue!r}")
    if lq is not None:
        cq_name = (lq.get("spec") or {}).get("clusterQueue")
        cq = await read(CLUSTER_QUEUES.path(name=str(cq_name)), f"ClusterQueue {cq_name!r}")
        if cq is not None and name not in _check_names(cq):
            reasons.append(
                f'the ClusterQueue "{cq_name}" behind queue {settings.queue!r} does not list {where} '
                "(spec.admissionChecksStrategy.admissionChecks): its jobs would not wait for holds"
            )
    facts.hold_refusals = reasons
    return reasons


async def probe_runtime(client: KubeClient, settings: Settings) -> dict[str, Any]:
    """The runtime the probe runs on; :class:`UnsupportedError` when it is missing."""
    ref = settings.probe_runtime
    where = f'probeRuntime {ref.kind} "{ref.runtime}"'
    runtime = await client.get_or_none(
        runtime_path(ref.kind, ref.runtime, settings.runtime_namespace(ref.kind)), what=f"get {where}"
    )
    if runtime is None:
        ns = f" in namespace {settings.namespace!r}" if settings.runtime_namespace(ref.kind) else ""
        raise UnsupportedError(
            f"{where} was not found{ns}: install it, or name an existing runtime in probeRuntime"
        )
    return runtime


async def probe(
    client: KubeClient,
    settings: Settings,
    facts: ClusterFacts,
    *,
    window: float,
    clock: Clock,
    runtime: dict[str, Any] | None = None,
) -> None:
    """Create the gated probe, watch it for ``window`` seconds, learn, delete it and wait for it to cease.
    Raises :class:`UnsupportedError` explaining why when the cluster cannot run jobs. ``runtime`` is the
    probe runtime when the caller has read it already."""
    missing = await kueue_objects(client, settings, facts)
    if missing:
        raise UnsupportedError(missing)
    ref = settings.probe_runtime
    where = f'probeRuntime {ref.kind} "{ref.runtime}"'
    if runtime is None:
        runtime = await probe_runtime(client, settings)
    _log.info("probe: creating a gated TrainJob on %s and watching it for %gs", where, window)
    name = f"dispatch-probe-{secrets.token_hex(4)}"
    body = build_probe(name, settings, inspect_runtime(runtime))
    what = f'create probe TrainJob "{name}"'
    try:
        await client.create(trainjob_path(settings.namespace), body, what=what)
    except AlreadyExistsError:
        # An earlier attempt of this very create landed and its answer was lost (the client retried); the
        # random name is ours, so the probe is there and is watched like any other.
        pass
    except InvalidError as exc:
        raise UnsupportedError(
            f"the cluster refused the probe TrainJob on {where}: {exc.detail}: a webhook or the CRD schema "
            "refuses it; check the Trainer version (v2.3) and the runtime"
        ) from None
    except UnsupportedError as exc:
        # Created, but the server dropped fields it does not know: take the probe back before refusing.
        await _cleanup_shielded(client, settings, name, facts, window=window, clock=clock)
        if facts.probe_ceased is False:
            raise _left_behind(exc, settings, name, facts) from None
        raise
    except OutcomeUnknownError as exc:
        # The create may have landed: remove whatever is there before giving up.
        await _cleanup_shielded(client, settings, name, facts, window=window, clock=clock)
        if facts.probe_ceased:  # no probe remains: nothing is unknown, the cluster was just unreachable
            raise UnavailableError(str(exc)) from None
        raise _left_behind(exc, settings, name, facts) from None
    except asyncio.CancelledError:
        # Cancelled while the create was in flight: it may have landed, and nobody else knows the name.
        await _cleanup_shielded(client, settings, name, facts, window=window, clock=clock)
        raise
    _log.info(
        'probe: watching TrainJob "%s" for %gs (Trainer reconciles? Kueue takes it? pods and logs visible?)',
        name,
        window,
    )
    try:
        await _watch(client, settings, name, facts, window=window, clock=clock)
    except DispatchError as exc:
        await _cleanup_shielded(client, settings, name, facts, window=window, clock=clock)
        if facts.probe_ceased is False:
            raise _left_behind(exc, settings, name, facts) from None
        raise
    except BaseException:
        await _cleanup_shielded(client, settings, name, facts, window=window, clock=clock)
        raise
    await _cleanup_shielded(client, settings, name, facts, window=window, clock=clock)


def _left_behind(exc: DispatchError, settings: Settings, name: str, facts: ClusterFacts) -> DispatchError:
    """``exc``, of the same class, saying which probe preflight left behind and how to remove it."""
    ns = settings.namespace
    left = facts.probe_left or "it had not gone when preflight gave up"
    unfinalize = """'{"metadata":{"finalizers":null}}'"""
    how = (
        f'preflight left its probe TrainJob "{name}" behind in namespace {ns!r} ({left}); remove it with: '
        f"kubectl -n {ns} delete trainjob {name} --wait=false; if it stays (a finalizer nobody removes, e.g. "
        f"foregroundDeletion without a garbage collector): kubectl -n {ns} patch trainjob {name} --type=merge "
        f"-p {unfinalize}"
    )
    if isinstance(exc, UnsupportedError):
        return type(exc)([*exc.reasons, how])
    if isinstance(exc, InvalidError):
        return InvalidError(f"{exc.detail}; {how}", path=exc.path)
    return type(exc)(f"{exc}; {how}")


async def _cleanup_shielded(
    client: KubeClient, settings: Settings, name: str, facts: ClusterFacts, *, window: float, clock: Clock
) -> None:
    """:func:`_cleanup`, finished even when the caller is cancelled: the probe must not outlive preflight."""
    cleanup = asyncio.ensure_future(_cleanup(client, settings, name, facts, window=window, clock=clock))
    try:
        await asyncio.shield(cleanup)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await cleanup
        raise


async def _watch(
    client: KubeClient, settings: Settings, name: str, facts: ClusterFacts, *, window: float, clock: Clock
) -> None:
    seen: dict[str, Any] = {}
    facts.trainer_reconciles = False
    if facts.kueue:
        facts.kueue_takes_jobs = False
    # The access review said what we may do; the probe shows what the cluster does. Keep the review's
    # answer about logs only if no probe pod appears to try them on.
    allowed_logs = facts.logs_readable
    # Whether pods can be read is what listing them answers (a denial says no), never whether a probe pod
    # appeared in the window: under Kueue the probe may wait in its queue the whole window (a loaded or
    # full cluster), and a job's pods must be followed all the same — not following them, every job
    # would read "starting" for good. Unknown until a listing answers.
    facts.pods_visible = None
    facts.logs_readable = None
    interval = max(0.05, min(1.0, window / 10))
    deadline = clock.now() + window
    while True:
        failure = await _poll_once(client, settings, name, facts, seen)
        if failure is not None:
            raise UnsupportedError(failure)
        left = deadline - clock.now()
        if left <= 0:
            break
        await clock.sleep(min(interval, left))
    if not facts.trainer_reconciles:
        raise UnsupportedError(
            f'the Trainer controller did not reconcile the probe TrainJob "{name}" within {window:g}s (no JobSet '
            "appeared): is the Trainer controller running and watching this namespace?"
        )
    if facts.kueue and settings.queue is not None and not facts.kueue_takes_jobs:
        facts.notes.append(
            f"Kueue did not take the probe (no Workload appeared for queue {settings.queue!r}): is Kueue's "
            "trainer.kubeflow.org/trainjob integration enabled?"
        )
    if seen.get("suspended"):
        facts.notes.append("Kueue suspended the probe on creation, as it does with every job it queues")
    if facts.logs_readable is None:
        facts.logs_readable = allowed_logs
    if facts.pods_visible is False:
        facts.notes.append("pods cannot be read with these credentials: no cessation, no output")
    elif facts.pods_visible is None:
        facts.notes.append(
            f"no pod of the probe appeared within {window:g}s (Kueue kept it queued, or the JobSet/Job "
            "controllers are slow or not running); pods are followed all the same"
        )


async def _cleanup(
    client: KubeClient, settings: Settings, name: str, facts: ClusterFacts, *, window: float, clock: Clock
) -> None:
    """Delete the probe (in the background: a foreground deletion never ends on Trainer v2.3.0, which
    re-applies the JobSet meanwhile; see :mod:`dispatch_kubeflow.cessation`) and wait, bounded, for all of
    it to go. Whatever remains is described in ``facts.probe_left``."""
    path = trainjob_path(settings.namespace, name)
    facts.probe_left = ""
    _log.info('probe: deleting TrainJob "%s" and waiting for its pods to go', name)
    try:
        await client.delete(path, what=f'delete probe TrainJob "{name}"', propagation="Background")
    except NotFoundError:
        pass
    except DispatchError as exc:
        facts.probe_left = f"deleting it failed: {exc}"
        facts.notes.append(f'could not delete the probe TrainJob "{name}" ({exc}); delete it by hand')
        facts.probe_ceased = False
        return
    deadline = clock.now() + max(window, 10.0)
    tj: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = []
    while True:
        try:
            tj = await client.get_or_none(path, what=f'get probe TrainJob "{name}"')
            pods = (
                await client.list(
                    PODS.path(settings.namespace),
                    what="list probe pods",
                    label_selector=f"{LABEL_JOBSET_NAME}={name}",
                )
                if tj is None
                else []
            )
        except PermissionDeniedError:
            facts.probe_ceased = None  # its pods cannot be seen with these credentials
            return
        except UnavailableError:
            tj, pods = {}, []
        if tj is None and not pods:
            facts.probe_ceased = True
            return
        if clock.now() >= deadline:
            facts.probe_ceased = False
            facts.probe_left = _remains(tj, pods)
            facts.notes.append(
                f'the probe TrainJob "{name}" had not ceased when preflight ended ({facts.probe_left})'
            )
            return
        await clock.sleep(0.1)


def _remains(tj: Mapping[str, Any] | None, pods: list[dict[str, Any]]) -> str:
    if tj is None:
        names = ", ".join(str(p.get("metadata", {}).get("name", "")) for p in pods)
        return f"the TrainJob is gone, {len(pods)} pod(s) remain: {names}"
    if not tj:
        return "the cluster stopped answering while it was being deleted"
    meta = tj.get("metadata") if isinstance(tj.get("metadata"), Mapping) else {}
    finalizers = meta.get("finalizers") if isinstance(meta, Mapping) else None
    since = meta.get("deletionTimestamp") if isinstance(meta, Mapping) else None
    text = f"being deleted since {since}" if since else "still there"
    if isinstance(finalizers, list) and finalizers:
        text += f", waiting on finalizers {', '.join(str(f) for f in finalizers)}"
    return text
