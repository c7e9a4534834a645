"""What happened to an incarnation, and why: SPEC §9.7 as a first-match rule table (pure).

A :class:`Snapshot` is a typed reading of one incarnation's objects — its TrainJob, JobSet, Jobs, pods
and (under Kueue) Workload — parsed tolerantly: a field of the wrong type or a missing one reads as
absent, so a malformed object yields an outcome, never a ``KeyError``/``TypeError``. :data:`RULES` is
the cause table in SPEC §9.7's order; :func:`classify` returns the outcome of the first rule that
matches. Each rule names the signal it reads, and the evidence it returns names the object (kind and
name), the reason, message, node and exit code it came from. ``docs/kubeflow-causes.md`` is generated
from :data:`RULES` (:func:`table_markdown`) and a test keeps the two identical.

Two readings apply to every pod-level rule (disruptions, OOM, image pull, exit codes): while the
incarnation is *failing* (the TrainJob or JobSet is ``Failed``, or a Job is ``Failed``/``FailureTarget``)
the state is ``failed``; otherwise the Job is replacing the pod or restarting the container in place, so
the state is the live one (``starting``/``running``/...) and the cause and evidence say what keeps
happening — a job whose node keeps failing never reads as plain ``running``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from msgspec import Struct

from dispatch.logs import shown
from dispatch.model import Cause, Evidence, Outcome, State
from dispatch_kubeflow.holds import held_by_us
from dispatch_kubeflow.names import ANNOTATION_HOLD, LABEL_QUEUE, NODE_CONTAINER
from dispatch_kubeflow.objects import as_map, meta_of

__all__ = [
    "CONFIG_ERROR_GRACE",
    "IMAGE_PULL_GRACE",
    "RULES",
    "Condition",
    "Container",
    "Job",
    "JobSet",
    "KubeEvent",
    "Pod",
    "Rule",
    "Snapshot",
    "Termination",
    "TrainJob",
    "Workload",
    "classify",
    "table_markdown",
]

IMAGE_PULL_GRACE: Final = 300.0
"""Seconds a pod may wait on an image pull (``ErrImagePull``/``ImagePullBackOff``) before the job is
called ``failed``/``image_pull``: the kubelet's pull back-off doubles from 10 s to its 300 s cap, so five
minutes covers five attempts — enough for a registry hiccup or a pull secret that is being rolled out,
short enough that a typo'd tag does not hold a slot for long. ``InvalidImageName`` can never succeed and
fails at once."""

CONFIG_ERROR_GRACE: Final = 300.0
"""Seconds a container may fail to be created (``CreateContainerConfigError``/``CreateContainerError``: a
Secret, ConfigMap or claim missing) before the job is called ``failed``/``config_error``: long enough for
a Secret that is being rolled out (the kubelet retries on its pod sync back-off), short enough that a job
waiting on a typo does not hold its slot. A pod still ``ContainerCreating`` after this long (a volume that
never mounts) reads ``starting``/``config_error``, and fails after twice as long."""

_KUEUE_PREEMPTION = ("Preempted", "InClusterQueue")
_NODE_LOSS = ("DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet")
_PULL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")
_CONFIG_WAITING = ("CreateContainerConfigError", "CreateContainerError")


# --- tolerant readers ----------------------------------------------------------------------------


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _seq(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(value: Any) -> float | None:
    """An RFC 3339 timestamp as epoch seconds; ``None`` when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


# --- the typed snapshot ---------------------------------------------------------------------------


class Condition(Struct, frozen=True):
    """One ``status.conditions[]`` entry."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    at: float | None = None

    @classmethod
    def parse_all(cls, obj: Mapping[str, Any]) -> tuple[Condition, ...]:
        out = []
        for raw in _list(as_map(obj.get("status")).get("conditions")):
            c = as_map(raw)
            if _str(c.get("type")):
                out.append(
                    cls(
                        type=_str(c.get("type")),
                        status=_str(c.get("status")),
                        reason=_str(c.get("reason")),
                        message=_str(c.get("message")),
                        at=_time(c.get("lastTransitionTime")),
                    )
                )
        return tuple(out)


def _true(conditions: Iterable[Condition], type_: str) -> Condition | None:
    for c in conditions:
        if c.type == type_ and c.status == "True":
            return c
    return None


def _find(conditions: Iterable[Condition], type_: str) -> Condition | None:
    for c in conditions:
        if c.type == type_:
            return c
    return None


class _Object(Struct, frozen=True):
    kind: str
    name: str
    conditions: tuple[Condition, ...] = ()
    deleting: bool = False

    def true(self, type_: str) -> Condition | None:
        return _true(self.conditions, type_)

    def evidence(self, c: Condition | None = None, *, reason: str = "", message: str = "") -> Evidence:
        if c is not None:
            reason, message = c.reason, c.message
        return Evidence(
            kind=self.kind, name=self.name, reason=reason, message=message, at=c.at if c else None
        )


class TrainJob(_Object, frozen=True):
    """The TrainJob: its conditions, suspension, node count, Kueue queue label and dispatch's hold."""

    suspended: bool = False
    num_nodes: int = 1
    queued_in_kueue: bool = False
    held_by_dispatch: bool = False
    """It carries dispatch's hold annotation (:data:`~dispatch_kubeflow.names.ANNOTATION_HOLD`)."""

    @classmethod
    def parse(cls, obj: Mapping[str, Any], name: str = "") -> TrainJob:
        meta = meta_of(obj)
        spec = as_map(obj.get("spec"))
        nodes = _int(as_map(spec.get("trainer")).get("numNodes"))
        return cls(
            kind="TrainJob",
            name=_str(meta.get("name")) or name,
            conditions=Condition.parse_all(obj),
            deleting=bool(meta.get("deletionTimestamp")),
            suspended=spec.get("suspend") is True,
            num_nodes=nodes if nodes is not None and nodes > 0 else 1,
            queued_in_kueue=LABEL_QUEUE in as_map(meta.get("labels")),
            held_by_dispatch=held_by_us(obj) is not None,
        )


class JobSet(_Object, frozen=True):
    """The JobSet the Trainer made of the TrainJob: its conditions and restart count."""

    restarts: int = 0

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> JobSet:
        meta = meta_of(obj)
        return cls(
            kind="JobSet",
            name=_str(meta.get("name")),
            conditions=Condition.parse_all(obj),
            deleting=bool(meta.get("deletionTimestamp")),
            restarts=_int(as_map(obj.get("status")).get("restarts")) or 0,
        )


class Job(_Object, frozen=True):
    """One of the JobSet's batch/v1 Jobs."""

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Job:
        meta = meta_of(obj)
        return cls(
            kind="Job",
            name=_str(meta.get("name")),
            conditions=Condition.parse_all(obj),
            deleting=bool(meta.get("deletionTimestamp")),
        )


class Termination(Struct, frozen=True):
    """A container's ``terminated`` state (current or last)."""

    reason: str
    message: str
    exit_code: int | None
    at: float | None

    @classmethod
    def parse(cls, state: Any) -> Termination | None:
        term = as_map(state).get("terminated")
        if not isinstance(term, Mapping):
            return None
        return cls(
            reason=_str(term.get("reason")),
            message=_str(term.get("message")),
            exit_code=_int(term.get("exitCode")),
            at=_time(term.get("finishedAt")),
        )


class Container(Struct, frozen=True):
    """One ``status.containerStatuses[]`` entry (init containers included, flagged)."""

    name: str
    waiting: str = ""
    waiting_message: str = ""
    running: bool = False
    terminated: Termination | None = None
    last: Termination | None = None
    restarts: int = 0
    init: bool = False

    @classmethod
    def parse(cls, raw: Any, *, init: bool = False) -> Container:
        cs = as_map(raw)
        state = as_map(cs.get("state"))
        waiting = as_map(state.get("waiting"))
        return cls(
            name=_str(cs.get("name")),
            waiting=_str(waiting.get("reason")),
            waiting_message=_str(waiting.get("message")),
            running=isinstance(state.get("running"), Mapping),
            terminated=Termination.parse(state),
            last=Termination.parse(cs.get("lastState")),
            restarts=_int(cs.get("restartCount")) or 0,
            init=init,
        )


class Pod(_Object, frozen=True):
    """A pod of the incarnation: phase, node, status reason, conditions and container states."""

    phase: str = ""
    node: str | None = None
    reason: str = ""
    message: str = ""
    created: float | None = None
    containers: tuple[Container, ...] = ()

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Pod:
        meta = meta_of(obj)
        status = as_map(obj.get("status"))
        containers = [Container.parse(c, init=True) for c in _list(status.get("initContainerStatuses"))]
        containers += [Container.parse(c) for c in _list(status.get("containerStatuses"))]
        return cls(
            kind="Pod",
            name=_str(meta.get("name")),
            conditions=Condition.parse_all(obj),
            deleting=bool(meta.get("deletionTimestamp")),
            phase=_str(status.get("phase")),
            node=_str(as_map(obj.get("spec")).get("nodeName")) or None,
            reason=_str(status.get("reason")),
            message=_str(status.get("message")),
            created=_time(meta.get("creationTimestamp")),
            containers=tuple(containers),
        )

    def container_evidence(
        self, c: Container, term: Termination | None = None, *, reason: str = "", message: str = ""
    ) -> Evidence:
        """Evidence from one of this pod's containers (a container other than ``node`` is named)."""
        if term is not None:
            reason, message = term.reason, term.message
        prefix = "" if c.name == NODE_CONTAINER else f"container {c.name}: "
        return Evidence(
            kind="Pod",
            name=self.name,
            reason=reason,
            message=f"{prefix}{message}" if message or prefix else "",
            exit_code=term.exit_code if term is not None else None,
            node=self.node,
            at=term.at if term is not None else None,
        )

    def disruption_evidence(self, c: Condition) -> Evidence:
        return Evidence(
            kind="Pod", name=self.name, reason=c.reason, message=c.message, node=self.node, at=c.at
        )


class Workload(_Object, frozen=True):
    """The Kueue Workload of the TrainJob: conditions, ``spec.active`` and eviction history."""

    active: bool = True
    eviction_causes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Workload:
        meta = meta_of(obj)
        status = as_map(obj.get("status"))
        causes = tuple(
            _str(as_map(e).get("underlyingCause"))
            for e in _list(as_map(status.get("schedulingStats")).get("evictions"))
            if _str(as_map(e).get("underlyingCause"))
        )
        return cls(
            kind="Workload",
            name=_str(meta.get("name")),
            conditions=Condition.parse_all(obj),
            deleting=bool(meta.get("deletionTimestamp")),
            active=as_map(obj.get("spec")).get("active") is not False,
            eviction_causes=causes,
        )

    @property
    def finished(self) -> bool:
        return self.true("Finished") is not None


class KubeEvent(Struct, frozen=True):
    """A Kubernetes Event about one of the incarnation's objects (kept by the API server about an hour,
    after its pods are gone): what it is about, its reason and message."""

    kind: str
    name: str
    reason: str
    message: str = ""
    at: float | None = None

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> KubeEvent:
        about = as_map(obj.get("involvedObject") or obj.get("regarding"))
        return cls(
            kind=_str(about.get("kind")),
            name=_str(about.get("name")),
            reason=_str(obj.get("reason")),
            message=_str(obj.get("message") or obj.get("note")),
            at=_time(obj.get("lastTimestamp") or obj.get("eventTime") or obj.get("firstTimestamp")),
        )

    def evidence(self) -> Evidence:
        return Evidence(kind=self.kind, name=self.name, reason=self.reason, message=self.message, at=self.at)


class Snapshot(Struct, frozen=True):
    """One incarnation as its objects show it at ``now`` (epoch seconds).

    ``trainjob`` is ``None`` when the TrainJob is confirmed gone. ``stopped`` is true when dispatch itself
    deleted it (the record says we cancelled). Build it with :meth:`of` from raw API objects.
    """

    name: str
    trainjob: TrainJob | None
    jobset: JobSet | None = None
    jobs: tuple[Job, ...] = ()
    pods: tuple[Pod, ...] = ()
    workload: Workload | None = None
    stopped: bool = False
    now: float | None = None
    image_pull_grace: float = IMAGE_PULL_GRACE
    config_error_grace: float = CONFIG_ERROR_GRACE
    events: tuple[KubeEvent, ...] = ()
    """Events of the incarnation's objects, read only for a failure nothing else explains."""

    @classmethod
    def of(
        cls,
        name: str,
        trainjob: Any,
        *,
        jobset: Any = None,
        jobs: Sequence[Any] = (),
        pods: Sequence[Any] = (),
        workload: Any = None,
        stopped: bool = False,
        now: float | None = None,
        image_pull_grace: float = IMAGE_PULL_GRACE,
        events: Sequence[Any] = (),
    ) -> Snapshot:
        """Parse raw API objects (dicts) into a snapshot; anything that is not an object is skipped."""
        return cls(
            name=name,
            trainjob=TrainJob.parse(trainjob, name) if isinstance(trainjob, Mapping) else None,
            jobset=JobSet.parse(jobset) if isinstance(jobset, Mapping) else None,
            jobs=tuple(Job.parse(j) for j in _seq(jobs) if isinstance(j, Mapping)),
            pods=tuple(Pod.parse(p) for p in _seq(pods) if isinstance(p, Mapping)),
            workload=Workload.parse(workload) if isinstance(workload, Mapping) else None,
            stopped=stopped,
            now=now,
            image_pull_grace=image_pull_grace,
            events=tuple(KubeEvent.parse(e) for e in _seq(events) if isinstance(e, Mapping)),
        )

    # --- derived readings -------------------------------------------------------------------------

    @property
    def failing(self) -> Condition | None:
        """The condition that says the incarnation is failing (TrainJob/JobSet ``Failed``, a Job's
        ``Failed`` or ``FailureTarget``), or ``None``."""
        for obj in (self.trainjob, self.jobset, *self.jobs):
            if obj is None:
                continue
            c = obj.true("Failed") or obj.true("FailureTarget")
            if c is not None:
                return c
        return None

    def live_state(self) -> State:
        """Queued, held, starting or running: the state of an incarnation no rule ends."""
        tj = self.trainjob
        if tj is None:
            return State.STARTING
        wl = self.workload
        if tj.suspended:
            return State.QUEUED if tj.queued_in_kueue or wl is not None else State.HELD
        if wl is not None and not wl.true("QuotaReserved") and not wl.finished:
            return State.QUEUED
        # Pods still to run or running (a node that already succeeded counts as done, not as starting).
        live = [p for p in self.pods if not p.deleting and p.phase not in ("Succeeded", "Failed")]
        running = [p for p in live if p.phase == "Running"]
        done = sum(1 for p in self.pods if p.phase == "Succeeded")
        if running and len(running) == len(live) and len(running) + done >= tj.num_nodes:
            return State.RUNNING
        if not live and done >= tj.num_nodes:
            return State.RUNNING  # every node finished; the TrainJob says Complete next, not "starting" again
        return State.STARTING

    def pod_state(self) -> State:
        """The state for a pod-level cause: ``failed`` while failing, else the live state."""
        return State.FAILED if self.failing is not None else self.live_state()

    def supporting(self) -> tuple[Evidence, ...]:
        """Evidence of *why the incarnation is failing*, to put after a pod-level cause: the root of the
        chain first. A failing Job's own condition (``BackoffLimitExceeded``, ``DeadlineExceeded``…) is what
        failed; the JobSet's ``FailedJobs`` reacts to it and the TrainJob copies the JobSet's (Trainer
        v2.3.0's jobset plugin), each a reconcile later on a real cluster, so the Job's is the one to name."""
        if self.failing is None:
            return ()
        for obj in (*self.jobs, self.jobset, self.trainjob):
            if obj is None:
                continue
            c = obj.true("Failed") or obj.true("FailureTarget")
            if c is not None:
                return (obj.evidence(c),)
        return ()


# --- the rules -----------------------------------------------------------------------------------

Match = Callable[[Snapshot], Outcome | None]


class Rule(Struct, frozen=True):
    """One row of the cause table: the signal it reads (as the docs show it), the objects it reads,
    the state/cause it yields (as the docs show it) and the matcher."""

    name: str
    signal: str
    reads: str
    yields: str
    match: Match

    def __repr__(self) -> str:
        return shown(self, frozenset({"match"}))  # a function: its repr says nothing


def _we_cancelled(s: Snapshot) -> Outcome | None:
    if not s.stopped:
        return None
    tj = s.trainjob
    if tj is None:
        ev = Evidence(kind="TrainJob", name=s.name, reason="Deleted", message="deleted by dispatch (stop)")
    else:
        ev = tj.evidence(reason="Deleting", message="being deleted by dispatch (stop)")
    return Outcome(State.CANCELLED, Cause.CANCELLED, (ev,))


def _held(s: Snapshot) -> Outcome | None:
    """Our hold in effect: the hold annotation on a TrainJob that is suspended (by us without Kueue, by
    Kueue while ``dispatch-admission`` keeps the check ``Pending``) or whose Workload Kueue is evicting
    (the ``Retry`` dispatch-admission wrote for a held job that was running). A job that already ended or
    is failing reads as such; a hold not yet in effect (the job still runs) reads as the job does."""
    tj = s.trainjob
    if (
        tj is None
        or not tj.held_by_dispatch
        or tj.deleting
        or tj.true("Complete") is not None
        or s.failing is not None
    ):
        return None
    wl = s.workload
    if wl is not None and (not wl.active or wl.true("DeactivationTarget") is not None):
        return None  # Kueue deactivated it (maximum execution time, requeuing limit): that ends the job
    evicted = wl.true("Evicted") if wl is not None and not wl.finished else None
    if not tj.suspended and evicted is None:
        return None
    how = "spec.suspend is true" if tj.suspended else "Kueue is evicting it"
    ev = tj.evidence(
        reason="HeldByDispatch", message=f"annotation {ANNOTATION_HOLD} is set (held by dispatch); {how}"
    )
    return Outcome(
        State.HELD, Cause.NONE, (ev,) if evicted is None or wl is None else (ev, wl.evidence(evicted))
    )


def _kueue_active(s: Snapshot) -> Workload | None:
    """The Workload, while Kueue's word on it still counts (the TrainJob has not finished)."""
    wl = s.workload
    tj = s.trainjob
    if wl is None or tj is None or wl.finished or tj.true("Complete") or tj.true("Failed"):
        return None
    return wl


def _kueue_preempted(s: Snapshot) -> Outcome | None:
    wl = _kueue_active(s)
    if wl is None:
        return None
    evicted = wl.true("Evicted")
    preempted = wl.true("Preempted")
    if evicted is not None and evicted.reason in _KUEUE_PREEMPTION:
        ev = [wl.evidence(evicted)]
        if preempted is not None:
            ev.append(wl.evidence(preempted))
        return Outcome(State.QUEUED, Cause.PREEMPTED, tuple(ev))
    if preempted is not None and (
        preempted.reason in _KUEUE_PREEMPTION or preempted.reason.startswith("InCohort")
    ):
        return Outcome(State.QUEUED, Cause.PREEMPTED, (wl.evidence(preempted),))
    return None


def _kueue_node_failures(s: Snapshot) -> Outcome | None:
    wl = _kueue_active(s)
    evicted = wl.true("Evicted") if wl is not None else None
    if wl is None or evicted is None or evicted.reason != "NodeFailures":
        return None
    return Outcome(State.QUEUED, Cause.NODE_LOST, (wl.evidence(evicted),))


def _kueue_no_capacity(s: Snapshot) -> Outcome | None:
    wl = _kueue_active(s)
    if wl is None:
        return None
    evicted = wl.true("Evicted")
    if evicted is not None and evicted.reason == "PodsReadyTimeout":
        return Outcome(State.QUEUED, Cause.NO_CAPACITY, (wl.evidence(evicted),))
    if not wl.active and "RequeuingLimitExceeded" in _deactivation(wl):
        return Outcome(State.FAILED, Cause.NO_CAPACITY, _deactivation_evidence(wl))
    quota = _find(wl.conditions, "QuotaReserved")
    if (
        quota is not None
        and quota.status == "False"
        and quota.reason in ("NoMatchingFlavor", "ExceedsMaxQuota")
    ):
        return Outcome(State.QUEUED, Cause.NO_CAPACITY, (wl.evidence(quota),))
    return None


def _deactivation(wl: Workload) -> str:
    """Why Kueue deactivated the Workload, as text holding the reason (v0.19 records it as the
    ``DeactivationTarget`` reason, the ``Evicted`` message and the eviction's ``underlyingCause``)."""
    parts = list(wl.eviction_causes)
    for type_ in ("DeactivationTarget", "Evicted"):
        c = wl.true(type_)
        if c is not None:
            parts += [c.reason, c.message]
    text = " ".join(parts)
    if "maximum execution time" in text:
        text += " MaximumExecutionTimeExceeded"
    return text


def _deactivation_evidence(wl: Workload) -> tuple[Evidence, ...]:
    c = wl.true("DeactivationTarget") or wl.true("Evicted")
    return (wl.evidence(c) if c is not None else wl.evidence(reason="Deactivated"),)


def _kueue_max_exec(s: Snapshot) -> Outcome | None:
    wl = _kueue_active(s)
    if wl is None or "MaximumExecutionTimeExceeded" not in _deactivation(wl):
        return None
    if wl.active and wl.true("DeactivationTarget") is None:
        return None
    return Outcome(State.FAILED, Cause.TIMEOUT, _deactivation_evidence(wl))


def _disruption(reasons: Callable[[Pod, Condition], bool], cause: Cause) -> Match:
    def match(s: Snapshot) -> Outcome | None:
        for pod in s.pods:
            c = pod.true("DisruptionTarget")
            if c is not None and reasons(pod, c):
                return Outcome(s.pod_state(), cause, (pod.disruption_evidence(c), *s.supporting()))
        return None

    return match


def _pressure_eviction(pod: Pod) -> bool:
    return pod.reason == "Evicted"


def _evicted(s: Snapshot) -> Outcome | None:
    found = _disruption(lambda _p, c: c.reason == "EvictionByEvictionAPI", Cause.EVICTED)(s)
    if found is not None:
        return found
    for pod in s.pods:
        if _pressure_eviction(pod):
            ev = Evidence(kind="Pod", name=pod.name, reason=pod.reason, message=pod.message, node=pod.node)
            return Outcome(s.pod_state(), Cause.EVICTED, (ev, *s.supporting()))
    return None


def _oom(s: Snapshot) -> Outcome | None:
    for pod in s.pods:
        for c in pod.containers:
            for term in (c.terminated, c.last):
                if term is not None and term.reason == "OOMKilled":
                    ev = pod.container_evidence(c, term)
                    ev = _with_restarts(ev, c)
                    return Outcome(s.pod_state(), Cause.OUT_OF_MEMORY, (ev, *s.supporting()))
    return None


def _with_restarts(ev: Evidence, c: Container) -> Evidence:
    if not c.restarts:
        return ev
    note = f"restarted {c.restarts} time{'s' if c.restarts != 1 else ''}"
    message = f"{ev.message} ({note})" if ev.message else note
    return Evidence(ev.kind, ev.name, ev.reason, message, ev.exit_code, ev.node, ev.at, ev.output)


def _trainjob_failed(*reasons: str) -> Callable[[Snapshot], Condition | None]:
    def find(s: Snapshot) -> Condition | None:
        c = s.trainjob.true("Failed") if s.trainjob is not None else None
        return c if c is not None and c.reason in reasons else None

    return find


def _deadline(s: Snapshot) -> Outcome | None:
    c = _trainjob_failed("DeadlineExceeded")(s)
    if c is not None and s.trainjob is not None:
        return Outcome(State.FAILED, Cause.TIMEOUT, (s.trainjob.evidence(c),))
    if s.failing is not None:
        for job in s.jobs:
            jc = job.true("Failed") or job.true("FailureTarget")
            if jc is not None and jc.reason == "DeadlineExceeded":
                return Outcome(State.FAILED, Cause.TIMEOUT, (job.evidence(jc), *s.supporting()))
    return None


def _invalid(s: Snapshot) -> Outcome | None:
    c = _trainjob_failed("TrainingRuntimeNotSupported")(s)
    if c is None or s.trainjob is None:
        return None
    return Outcome(State.FAILED, Cause.INVALID_SPEC, (s.trainjob.evidence(c),))


def _image_pull(s: Snapshot) -> Outcome | None:
    for pod in s.pods:
        if pod.deleting:
            continue
        for c in pod.containers:
            if c.waiting not in _PULL_WAITING:
                continue
            ev = pod.container_evidence(c, reason=c.waiting, message=c.waiting_message)
            since = _scheduled_at(pod)
            waited = s.now - since if s.now is not None and since is not None else None
            hopeless = c.waiting == "InvalidImageName"
            if s.failing is not None or hopeless or (waited is not None and waited >= s.image_pull_grace):
                if waited is not None and not hopeless and s.failing is None:
                    note = f"still pulling after {waited:.0f}s (grace {s.image_pull_grace:.0f}s)"
                    ev = Evidence(ev.kind, ev.name, ev.reason, f"{ev.message} ({note})", node=ev.node)
                return Outcome(State.FAILED, Cause.IMAGE_PULL, (ev, *s.supporting()))
            return Outcome(State.STARTING, Cause.IMAGE_PULL, (ev,))
    return None


def _scheduled_at(pod: Pod) -> float | None:
    c = _true(pod.conditions, "PodScheduled")
    return c.at if c is not None and c.at is not None else pod.created


def _unschedulable(s: Snapshot) -> Outcome | None:
    if s.failing is not None:
        return None  # a pod-level signal never keeps a failing job live: the rules below name the failure
    for pod in s.pods:
        c = _find(pod.conditions, "PodScheduled")
        if c is not None and c.status == "False" and c.reason == "Unschedulable" and not pod.deleting:
            ev = Evidence(kind="Pod", name=pod.name, reason=c.reason, message=c.message, at=c.at)
            return Outcome(State.QUEUED, Cause.NO_CAPACITY, (ev,))
    return None


def _exit_code(s: Snapshot) -> Outcome | None:
    if s.failing is None:
        return None
    found = _failed_container(s)
    if found is None:
        return None
    return Outcome(State.FAILED, Cause.EXIT_CODE, (found, *s.supporting()))


def _failed_container(s: Snapshot) -> Evidence | None:
    """The first non-zero exit of a ``node`` container (then of any container), current or last."""
    for wanted in (True, False):
        for pod in s.pods:
            for c in pod.containers:
                if (c.name == NODE_CONTAINER) != wanted:
                    continue
                for term in (c.terminated, c.last):
                    if term is not None and term.exit_code not in (None, 0):
                        return _with_restarts(pod.container_evidence(c, term), c)
    return None


def _complete(s: Snapshot) -> Outcome | None:
    """The TrainJob says ``Complete``: succeeded, whatever a pod shows (an ``OOMKilled`` with exit code 0
    under memory pressure, kubernetes/kubernetes#116042); containers restarted in place on the way go into
    the evidence, so a success that needed retries says so."""
    c = s.trainjob.true("Complete") if s.trainjob is not None else None
    if c is None or s.trainjob is None:
        return None
    return Outcome(State.SUCCEEDED, Cause.NONE, (s.trainjob.evidence(c), *_container_history(s)))


def _container_history(s: Snapshot) -> tuple[Evidence, ...]:
    """What containers went through before now: each restart in place (its last termination) and each
    termination that says more than ``Completed`` (an ``OOMKilled`` with exit code 0)."""
    out: list[Evidence] = []
    for pod in s.pods:
        for c in pod.containers:
            if c.restarts and c.last is not None:
                out.append(_with_restarts(pod.container_evidence(c, c.last), c))
            elif c.terminated is not None and c.terminated.reason not in ("", "Completed"):
                out.append(pod.container_evidence(c, c.terminated))
    return tuple(out)


def _config_error(s: Snapshot) -> Outcome | None:
    for pod in s.pods:
        if pod.deleting:
            continue
        for c in pod.containers:
            stuck = c.waiting == "ContainerCreating"
            if c.waiting not in _CONFIG_WAITING and not stuck:
                continue
            since = _scheduled_at(pod)
            waited = s.now - since if s.now is not None and since is not None else None
            grace = s.config_error_grace * (2 if stuck else 1)
            if stuck and (waited is None or waited < s.config_error_grace):
                continue  # creating containers takes a while: not a problem yet
            ev = pod.container_evidence(c, reason=c.waiting, message=c.waiting_message)
            if s.failing is not None or (waited is not None and waited >= grace):
                if waited is not None and s.failing is None:
                    note = f"containers not created after {waited:.0f}s (grace {grace:.0f}s)"
                    message = f"{ev.message} ({note})" if ev.message else note
                    ev = Evidence(ev.kind, ev.name, ev.reason, message, node=ev.node)
                return Outcome(State.FAILED, Cause.CONFIG_ERROR, (ev, *s.supporting()))
            return Outcome(State.STARTING, Cause.CONFIG_ERROR, (ev,))
    return None


def _gone(s: Snapshot) -> Outcome | None:
    if s.trainjob is None:
        ev = Evidence(
            kind="TrainJob",
            name=s.name,
            reason="NotFound",
            message="the TrainJob no longer exists and dispatch did not delete it",
        )
        return Outcome(State.LOST, Cause.UNKNOWN, (ev,))
    if s.trainjob.deleting:
        ev = s.trainjob.evidence(
            reason="Deleting", message="the TrainJob is being deleted, and not by dispatch"
        )
        return Outcome(State.LOST, Cause.UNKNOWN, (ev,))
    return None


_EVENT_CAUSES = {
    "Preempted": Cause.PREEMPTED,  # the scheduler's (pod) or Kueue's (Workload) preemption
    "TaintManagerEviction": Cause.NODE_LOST,
    "NodeNotReady": Cause.NODE_LOST,
    "Evicted": Cause.EVICTED,  # the kubelet's node-pressure eviction
    "OOMKilling": Cause.OUT_OF_MEMORY,
}
_WORKLOAD_CAUSES = {
    "Preempted": Cause.PREEMPTED,
    "InClusterQueue": Cause.PREEMPTED,
    "NodeFailures": Cause.NODE_LOST,
}


def _outlived(s: Snapshot) -> Outcome | None:
    """A failure whose pods are gone: what outlives them names the cause — the Kueue Workload's eviction
    history, a condition message naming an OOM kill, the Events of the incarnation's objects."""
    if s.failing is None:
        return None
    wl = s.workload
    if wl is not None:
        for type_ in ("Evicted", "Preempted", "Requeued"):
            c = wl.true(type_)
            if c is not None and c.reason in _WORKLOAD_CAUSES:
                return Outcome(State.FAILED, _WORKLOAD_CAUSES[c.reason], (wl.evidence(c), *s.supporting()))
    for obj in (o for o in (s.trainjob, s.jobset, *s.jobs) if o is not None):
        for c in obj.conditions:
            if "OOMKilled" in c.message:
                return Outcome(State.FAILED, Cause.OUT_OF_MEMORY, (obj.evidence(c), *s.supporting()))
    for event in s.events:
        cause = _EVENT_CAUSES.get(event.reason)
        if cause is not None:
            return Outcome(State.FAILED, cause, (event.evidence(), *s.supporting()))
    return None


def _failed_otherwise(s: Snapshot) -> Outcome | None:
    if s.failing is None:
        return None
    return Outcome(State.FAILED, Cause.UNKNOWN, s.supporting())


_REQUEUE_CAUSES = {
    "Preempted": Cause.PREEMPTED,
    "NodeFailures": Cause.NODE_LOST,
    "PodsReadyTimeout": Cause.NO_CAPACITY,
}


def _restarting(s: Snapshot) -> Outcome | None:
    """Containers restarted in place, pods replaced, the JobSet recreated or Kueue requeued the job, while
    it goes on: say what ended the earlier attempts."""
    evidence: list[Evidence] = []
    cause = Cause.UNKNOWN
    wl = s.workload
    requeued = wl.true("Requeued") if wl is not None and not wl.finished else None
    if wl is not None and requeued is not None and requeued.reason in _REQUEUE_CAUSES:
        evidence.append(wl.evidence(requeued))
        cause = _REQUEUE_CAUSES[requeued.reason]
    for pod in s.pods:
        for c in pod.containers:
            # In place (OnFailure): lastState; replaced by the Job (Never): the failed pod's state.
            term = c.last if c.restarts else c.terminated if pod.phase == "Failed" else None
            if term is not None:
                evidence.append(_with_restarts(pod.container_evidence(c, term), c))
                if cause is Cause.UNKNOWN and term.exit_code not in (None, 0):
                    cause = Cause.EXIT_CODE
    if s.jobset is not None and s.jobset.restarts:
        evidence.append(
            s.jobset.evidence(
                reason="Restarts", message=f"the JobSet was recreated {s.jobset.restarts} times"
            )
        )
    if not evidence:
        return None
    return Outcome(s.live_state(), cause, tuple(evidence))


def _live(s: Snapshot) -> Outcome | None:
    tj = s.trainjob
    state = s.live_state()
    if tj is None:
        return Outcome(state, Cause.NONE)
    if state in (State.QUEUED, State.HELD):
        c = tj.true("Suspended")
        ev = tj.evidence(c) if c is not None else tj.evidence(reason="Suspended")
        wl = s.workload
        quota = _find(wl.conditions, "QuotaReserved") if wl is not None else None
        extra = (
            (wl.evidence(quota),) if wl is not None and quota is not None and quota.status == "False" else ()
        )
        return Outcome(state, Cause.NONE, (ev, *extra))
    return Outcome(state, Cause.NONE)


_POD = "failed (the live state while the Job replaces the pod)"

RULES: Final[tuple[Rule, ...]] = (
    Rule(
        "we_cancelled",
        "the record says we cancelled (dispatch deleted the TrainJob)",
        "host record",
        "cancelled / cancelled",
        _we_cancelled,
    ),
    Rule(
        "held",
        f"TrainJob annotated `{ANNOTATION_HOLD}` (dispatch's hold) and suspended, or its Workload `Evicted` for any "
        "reason (an `AdmissionCheck` eviction of a held job is the hold, not a preemption); not once it ended, "
        "is failing or Kueue deactivated it",
        "TrainJob, Workload",
        "held / none",
        _held,
    ),
    Rule(
        "complete",
        "TrainJob `Complete` — before any pod-level signal: a pod `OOMKilled` with exit code 0 or a container restarted in place does not keep a finished job live (the restarts go into the evidence)",
        "TrainJob, Pod",
        "succeeded / none",
        _complete,
    ),
    Rule(
        "kueue_preempted",
        "Workload `Evicted` reason `Preempted`, or `Preempted` reasons `InClusterQueue`, `InCohort…`",
        "Workload",
        "queued / preempted",
        _kueue_preempted,
    ),
    Rule(
        "kueue_node_failures",
        "Workload `Evicted` reason `NodeFailures`",
        "Workload",
        "queued / node_lost",
        _kueue_node_failures,
    ),
    Rule(
        "kueue_no_capacity",
        "Workload `Evicted` `PodsReadyTimeout`; `QuotaReserved=False` `NoMatchingFlavor`/`ExceedsMaxQuota`; deactivated `RequeuingLimitExceeded`",
        "Workload",
        "queued / no_capacity (failed once deactivated)",
        _kueue_no_capacity,
    ),
    Rule(
        "kueue_max_exec",
        "Workload deactivated for `MaximumExecutionTimeExceeded`",
        "Workload",
        "failed / timeout",
        _kueue_max_exec,
    ),
    Rule(
        "pod_preempted",
        "pod `DisruptionTarget` reason `PreemptionByScheduler`",
        "Pod",
        f"{_POD} / preempted",
        _disruption(lambda _p, c: c.reason == "PreemptionByScheduler", Cause.PREEMPTED),
    ),
    Rule(
        "pod_node_lost",
        "pod `DisruptionTarget` reasons `DeletionByTaintManager`, `DeletionByPodGC`, `TerminationByKubelet` (not a node-pressure eviction)",
        "Pod",
        f"{_POD} / node_lost",
        _disruption(lambda p, c: c.reason in _NODE_LOSS and not _pressure_eviction(p), Cause.NODE_LOST),
    ),
    Rule(
        "pod_evicted",
        "pod `DisruptionTarget` reason `EvictionByEvictionAPI`; pod `status.reason: Evicted`",
        "Pod",
        f"{_POD} / evicted",
        _evicted,
    ),
    Rule(
        "oom",
        "container `terminated.reason: OOMKilled` in `state` or `lastState`",
        "Pod",
        f"{_POD} / out_of_memory",
        _oom,
    ),
    Rule(
        "deadline",
        "TrainJob `Failed` `DeadlineExceeded` (or, while failing, a Job's `DeadlineExceeded`)",
        "TrainJob, Job",
        "failed / timeout",
        _deadline,
    ),
    Rule(
        "invalid_spec",
        "TrainJob `Failed` `TrainingRuntimeNotSupported` (a create refused by a webhook is an `InvalidError` from `start`)",
        "TrainJob",
        "failed / invalid_spec",
        _invalid,
    ),
    Rule(
        "image_pull",
        f"container waiting `ErrImagePull`/`ImagePullBackOff`/`InvalidImageName` (fails after {IMAGE_PULL_GRACE:.0f} s, `InvalidImageName` at once)",
        "Pod",
        "starting / image_pull (then failed)",
        _image_pull,
    ),
    Rule(
        "config_error",
        f"container waiting `CreateContainerConfigError`/`CreateContainerError` (a missing Secret, ConfigMap or claim; fails after {CONFIG_ERROR_GRACE:.0f} s), or `ContainerCreating` for {CONFIG_ERROR_GRACE:.0f} s (fails after {2 * CONFIG_ERROR_GRACE:.0f} s); the kubelet's message is the evidence",
        "Pod",
        "starting / config_error (then failed)",
        _config_error,
    ),
    Rule(
        "unschedulable",
        "pod `PodScheduled=False` reason `Unschedulable`",
        "Pod",
        "queued / no_capacity",
        _unschedulable,
    ),
    Rule(
        "exit_code",
        "TrainJob `Failed` (or a Job failing) with a container exit code ≠ 0 (`state` or `lastState`)",
        "TrainJob, JobSet, Job, Pod",
        "failed / exit_code",
        _exit_code,
    ),
    Rule(
        "gone",
        "TrainJob gone (confirmed by a second read) or being deleted, not by us",
        "TrainJob",
        "lost / unknown",
        _gone,
    ),
    Rule(
        "outlived",
        "failing with its pods gone: the Workload's `Evicted`/`Preempted`/`Requeued` reason, a condition message naming `OOMKilled`, or an Event of the incarnation's objects (`Preempted`, `TaintManagerEviction`, `NodeNotReady`, `Evicted`, `OOMKilling`)",
        "Workload, TrainJob, JobSet, Job, Event",
        "failed / preempted, node_lost, evicted, out_of_memory",
        _outlived,
    ),
    Rule(
        "failed_otherwise",
        "TrainJob, JobSet or Job failing with no other signal",
        "TrainJob, JobSet, Job",
        "failed / unknown",
        _failed_otherwise,
    ),
    Rule(
        "restarting",
        "Kueue requeued the job (`Requeued=True` `Preempted`/`NodeFailures`/`PodsReadyTimeout`), a container restarted in place (`restartCount`, `lastState`), a failed pod the Job replaces, or JobSet `status.restarts` > 0",
        "Workload, Pod, JobSet",
        "the live state / preempted, node_lost, no_capacity, exit_code (or unknown)",
        _restarting,
    ),
    Rule(
        "live",
        "none of the above: suspended → queued (Kueue) or held; every pod that has not finished `Running` (and all nodes there or done) → running; else starting",
        "TrainJob, Workload, Pod",
        "queued, held, starting or running / none",
        _live,
    ),
)


def classify(snapshot: Snapshot) -> Outcome:
    """The outcome of the first rule of :data:`RULES` that matches ``snapshot``."""
    for rule in RULES:
        out = rule.match(snapshot)
        if out is not None:
            return out
    raise AssertionError("the last rule always matches")  # pragma: no cover


def rule_of(snapshot: Snapshot) -> Rule:
    """The rule that decides ``snapshot`` (for tests and diagnostics)."""
    for rule in RULES:
        if rule.match(snapshot) is not None:
            return rule
    raise AssertionError("the last rule always matches")  # pragma: no cover


def table_markdown() -> str:
    """The cause table as Markdown, one row per rule, in order (docs/kubeflow-causes.md holds it)."""
    lines = ["| # | signal | reads | state / cause |", "| --- | --- | --- | --- |"]
    for i, rule in enumerate(RULES, 1):
        lines.append(f"| {i} | {rule.signal} | {rule.reads} | {rule.yields} |")
    return "\n".join(lines) + "\n"
