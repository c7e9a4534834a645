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
from dataclasses import dataclass, field
from typing import Any

from dispatch.clock import Clock
from dispatch.errors import UnsupportedError
from dispatch_kubeflow.kube import ApiStatus, KubeClient, Unreachable, resource_path
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
from dispatch_kubeflow.runtime import inspect_runtime
from dispatch_kubeflow.settings import Settings
from dispatch_kubeflow.trainjob import build_probe

__all__ = [
    "ClusterFacts",
    "admission_check",
    "discover",
    "kueue_objects",
    "probe",
    "review_access",
    "runtime_path",
]

_log = logging.getLogger(__name__)

_TRAINER_RESOURCES = ("trainjobs", "trainingruntimes", "clustertrainingruntimes")


@dataclass(slots=True)
class ClusterFacts:
    """What preflight learned about the cluster. ``None``: not checked (read-only, observe-only)."""

    kueue: bool = False
    may_write: bool | None = None
    denied: list[str] = field(default_factory=list)
    trainer_reconciles: bool | None = None
    kueue_takes_jobs: bool | None = None
    pods_visible: bool | None = None
    logs_readable: bool | None = None
    probe_ceased: bool | None = None
    notes: list[str] = field(default_factory=list)
    hold_refusals: list[str] | None = None
    """Why holds under Kueue cannot work (the admission check is not set up); ``None``: not checked."""


def trainjob_path(namespace: str, name: str | None = None) -> str:
    return resource_path(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", namespace=namespace, name=name)


def runtime_path(kind: str, name: str, namespace: str | None) -> str:
    """A ``TrainingRuntime`` lives in ``namespace``; a ``ClusterTrainingRuntime`` is cluster-scoped."""
    plural = "clustertrainingruntimes" if namespace is None else "trainingruntimes"
    return resource_path(TRAINER_GROUP, TRAINER_VERSION, plural, namespace=namespace, name=name)


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


async def review_access(client: KubeClient, settings: Settings, facts: ClusterFacts) -> None:
    """SelfSubjectAccessReviews: may we create, patch and delete TrainJobs, read pods and their logs?"""
    ns = settings.namespace

    async def ask(verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
        try:
            return await client.allowed(verb, resource, group=group, namespace=ns, subresource=subresource)
        except ApiStatus as exc:
            facts.notes.append(
                f"could not ask the API server whether it may {verb} {resource} (HTTP {exc.code})"
            )
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
    if not facts.trainer_reconciles:
        js = resource_path(JOBSET_GROUP, JOBSET_VERSION, "jobsets", namespace=ns, name=name)
        if await client.get_or_none(js, what=f'get JobSet "{name}"') is not None:
            facts.trainer_reconciles = True
    if facts.kueue and not facts.kueue_takes_jobs:
        uid = tj.get("metadata", {}).get("uid")
        path = resource_path(KUEUE_GROUP, KUEUE_VERSION, "workloads", namespace=ns)
        with contextlib.suppress(ApiStatus):
            for wl in await client.list(path, what="list Kueue Workloads"):
                owners = wl.get("metadata", {}).get("ownerReferences") or []
                if any(isinstance(o, Mapping) and o.get("uid") == uid for o in owners):
                    facts.kueue_takes_jobs = True
    if not facts.pods_visible or facts.logs_readable is None:
        pods_path = resource_path("", "v1", "pods", namespace=ns)
        try:
            pods = await client.list(
                pods_path, what="list probe pods", label_selector=f"{LABEL_JOBSET_NAME}={name}"
            )
        except ApiStatus as exc:
            if exc.code in (401, 403):
                facts.pods_visible = False
                return None
            raise
        if pods:
            facts.pods_visible = True
            pod = pods[0].get("metadata", {}).get("name", "")
            log_path = resource_path("", "v1", "pods", namespace=ns, name=pod, subresource="log")
            try:
                await client.request(
                    "GET",
                    log_path,
                    what="read probe log",
                    params={"container": NODE_CONTAINER},
                    accept_text=True,
                )
                facts.logs_readable = True
            except ApiStatus as exc:
                # A gated pod's container has not started: 400 "waiting to start" still proves we may read.
                if exc.code in (400, 200):
                    facts.logs_readable = True
                elif exc.code in (401, 403):
                    facts.logs_readable = False
    return None


async def kueue_objects(client: KubeClient, settings: Settings, facts: ClusterFacts) -> list[str]:
    """Reasons why the Kueue objects the settings name are missing (a typo'd queue would leave every job
    waiting forever). Objects the credentials may not read are noted, not refused."""
    if not facts.kueue:
        return []
    wanted = [
        ("LocalQueue", "localqueues", settings.queue, settings.namespace),
        ("WorkloadPriorityClass", "workloadpriorityclasses", settings.priority_class, None),
        ("AdmissionCheck", "admissionchecks", settings.admission_check, None),
    ]
    reasons: list[str] = []
    for kind, plural, name, ns in wanted:
        if name is None:
            continue
        path = resource_path(KUEUE_GROUP, KUEUE_VERSION, plural, namespace=ns, name=name)
        try:
            found = await client.get_or_none(path, what=f'get Kueue {kind} "{name}"')
        except ApiStatus as exc:
            facts.notes.append(f'could not check that Kueue {kind} "{name}" exists (HTTP {exc.code})')
            continue
        if found is None:
            place = f" in namespace {ns!r}" if ns else ""
            reasons.append(f'the Kueue {kind} "{name}" named in the settings does not exist{place}')
    return reasons


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
        except ApiStatus as exc:
            reasons.append(f"could not read {what} (HTTP {exc.code}): grant get on it to check holds")
            return None

    ac = await read(
        resource_path(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", name=name), f"AdmissionCheck {name!r}"
    )
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
    lq = await read(
        resource_path(
            KUEUE_GROUP, KUEUE_VERSION, "localqueues", namespace=settings.namespace, name=settings.queue
        ),
        f"LocalQueue {settings.queue!r}",
    )
    if lq is not None:
        cq_name = (lq.get("spec") or {}).get("clusterQueue")
        cq = await read(
            resource_path(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", name=str(cq_name)),
            f"ClusterQueue {cq_name!r}",
        )
        if cq is not None and name not in _check_names(cq):
            reasons.append(
                f'the ClusterQueue "{cq_name}" behind queue {settings.queue!r} does not list {where} '
                "(spec.admissionChecksStrategy.admissionChecks): its jobs would not wait for holds"
            )
    facts.hold_refusals = reasons
    return reasons


async def probe(
    client: KubeClient, settings: Settings, facts: ClusterFacts, *, window: float, clock: Clock
) -> None:
    """Create the gated probe, watch it for ``window`` seconds, learn, delete it and wait for it to cease.
    Raises :class:`UnsupportedError` explaining why when the cluster cannot run jobs."""
    missing = await kueue_objects(client, settings, facts)
    if missing:
        raise UnsupportedError(missing)
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
    name = f"dispatch-probe-{secrets.token_hex(4)}"
    body = build_probe(name, settings, inspect_runtime(runtime))
    try:
        await client.create(trainjob_path(settings.namespace), body, what=f'create probe TrainJob "{name}"')
    except ApiStatus as exc:
        # AlreadyExists: an earlier attempt of this very create landed and its answer was lost (the client
        # retried); the random name is ours, so the probe is there and is watched like any other.
        if exc.code != 409 or exc.reason != "AlreadyExists":
            message = (exc.body or {}).get("message", "") if exc.body else ""
            if exc.code in (400, 422) or "denied the request" in str(message):
                raise UnsupportedError(
                    f"the cluster refused the probe TrainJob on {where} (HTTP {exc.code}): {message}: a webhook or "
                    "the CRD schema refuses it; check the Trainer version (v2.3) and the runtime"
                ) from None
            raise exc.to_error(f'create probe TrainJob "{name}"') from None
    except Unreachable as exc:
        # The create may have landed: remove whatever is there before giving up.
        await _cleanup_shielded(client, settings, name, facts, window=window, clock=clock)
        if facts.probe_ceased:
            raise Unreachable(exc.detail, ambiguous=False) from None  # no probe remains: nothing is unknown
        raise
    try:
        await _watch(client, settings, name, facts, window=window, clock=clock)
    finally:
        await _cleanup_shielded(client, settings, name, facts, window=window, clock=clock)


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
    facts.pods_visible = False
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
    if not facts.pods_visible:
        facts.notes.append(
            "no pod of the probe was visible: pods cannot be read, or the JobSet/Job controllers are not running"
        )


async def _cleanup(
    client: KubeClient, settings: Settings, name: str, facts: ClusterFacts, *, window: float, clock: Clock
) -> None:
    path = trainjob_path(settings.namespace, name)
    try:
        await client.delete(path, what=f'delete probe TrainJob "{name}"', propagation="Foreground")
    except ApiStatus as exc:
        if exc.code != 404:
            facts.notes.append(
                f'could not delete the probe TrainJob "{name}" (HTTP {exc.code}); delete it by hand'
            )
            facts.probe_ceased = False
            return
    except Unreachable as exc:
        facts.notes.append(f'could not delete the probe TrainJob "{name}" ({exc.detail}); delete it by hand')
        facts.probe_ceased = False
        return
    pods_path = resource_path("", "v1", "pods", namespace=settings.namespace)
    deadline = clock.now() + max(window, 10.0)
    while True:
        try:
            gone = await client.get_or_none(path, what=f'get probe TrainJob "{name}"') is None
            pods = (
                await client.list(
                    pods_path, what="list probe pods", label_selector=f"{LABEL_JOBSET_NAME}={name}"
                )
                if gone
                else []
            )
        except ApiStatus as exc:
            if exc.code not in (401, 403):
                raise exc.to_error(f'watch the probe TrainJob "{name}" cease') from None
            facts.probe_ceased = None  # its pods cannot be seen with these credentials
            return
        except Unreachable:
            gone, pods = False, []
        if gone and not pods:
            facts.probe_ceased = True
            return
        if clock.now() >= deadline:
            facts.probe_ceased = False
            facts.notes.append(
                f'the probe TrainJob "{name}" had not ceased when preflight ended; the cluster will remove it'
            )
            return
        await clock.sleep(0.1)
