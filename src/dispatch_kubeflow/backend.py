"""The Kubeflow Trainer backend: :class:`Backend` and :func:`factory` (SPEC §9.3–§9.5).

The deciding parts are pure and live beside this module (settings, runtime rules, TrainJob building,
naming, error mapping, the cause table in :mod:`dispatch_kubeflow.causes`); this module does the I/O around
them through :mod:`dispatch_kubeflow.kube` (the one Kubernetes layer, which raises dispatch's errors) and
:mod:`dispatch_kubeflow.reading`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from dispatch.backend import HoldToken, Prepared
from dispatch.clock import Clock, SystemClock
from dispatch.config import AdapterConfig
from dispatch.errors import (
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    ReadOnlyError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.feed import Feed
from dispatch.model import (
    Absent,
    Capabilities,
    Cause,
    Change,
    Compute,
    Evidence,
    Handle,
    Identity,
    JobSpec,
    Limits,
    Mode,
    Observation,
    State,
)
from dispatch.probecache import ProbeCache
from dispatch_kubeflow import cessation, naming, output, probecache
from dispatch_kubeflow.clusterfacts import discover_cached
from dispatch_kubeflow.errors import AlreadyExistsError, StaleHoldError
from dispatch_kubeflow.events import decision_event, events_path
from dispatch_kubeflow.holds import held_by_us, new_token, pointer
from dispatch_kubeflow.incarnation import (
    Tail,
    attach_output,
    failed_node_pods,
    remains,
    terminated_node,
    with_stuck_deletion,
)
from dispatch_kubeflow.informer import Informer
from dispatch_kubeflow.kube import KubeClient, Retry
from dispatch_kubeflow.names import (
    ANNOTATION_HOLD,
    LABEL_STORE,
    MAX_COMMAND,
    MAX_ENV,
    NAME,
)
from dispatch_kubeflow.objects import labels_of
from dispatch_kubeflow.output import Pods
from dispatch_kubeflow.plain import plain
from dispatch_kubeflow.preflight import (
    ClusterFacts,
    admission_check,
    cluster_identity,
    discover,
    kueue_objects,
    probe,
    probe_runtime,
    review_access,
    runtime_path,
    trainjob_path,
)
from dispatch_kubeflow.reading import confirm_gone, events_of
from dispatch_kubeflow.resources import CLUSTER_TRAINING_RUNTIMES, NODES, TRAINING_RUNTIMES
from dispatch_kubeflow.runtime import check_runtime, inspect_runtime
from dispatch_kubeflow.settings import Settings, parse_settings
from dispatch_kubeflow.trainjob import (
    ACCEPTED_EXTENSIONS,
    build_trainjob,
    job_extensions,
    unsupported_extensions,
)
from dispatch_kubeflow.watching import (
    Kind,
    Parts,
    View,
    kinds,
    runtime_kind_key,
    runtime_kinds,
)

__all__ = ["Backend", "factory", "open_backend"]

_log = logging.getLogger(__name__)

PODS_REUSED = 2.0
"""Seconds a read-only process reuses the pods it listed, to read the output of another node (see
:meth:`Backend._listed_pods`)."""


async def factory(cfg: AdapterConfig) -> Backend:
    """Open the Kubeflow adapter from an :class:`~dispatch.config.AdapterConfig` (runs preflight unless
    read-only; takes at least the probe window, ten seconds or more, unless read-only or observe-only,
    or the config carries a ``probe_cache`` holding findings whose fingerprint still matches)."""
    return await open_backend(cfg)


async def open_backend(
    cfg: AdapterConfig,
    *,
    probe_window: float | None = None,
    clock: Clock | None = None,
    retry: Retry | None = None,
) -> Backend:
    """:func:`factory` with knobs for tests and tools: ``probe_window`` (seconds; overrides the settings,
    which refuse less than 10 s), the ``clock`` preflight waits on, and the request ``retry`` policy."""
    if not isinstance(cfg, AdapterConfig):
        raise InvalidError(f"expected an AdapterConfig, got {type(cfg).__name__}", path="cfg")
    if cfg.backend != NAME:
        raise InvalidError(f"this is the {NAME!r} adapter, not {cfg.backend!r}", path="backend")
    settings = parse_settings(cfg.settings)
    clock = clock or SystemClock()
    window = settings.probe_window if probe_window is None else probe_window
    client = KubeClient.connect(
        kubeconfig=settings.kubeconfig, context=settings.context, token=cfg.token, retry=retry, clock=clock
    )
    client.read_only = cfg.read_only  # from the first request on: not one write may leave the process
    if "namespace" not in json.loads(cfg.settings or b"{}"):  # as kubectl: the context's namespace
        settings = settings.replace(namespace=client.context_namespace)
    facts = ClusterFacts()
    cluster = ""
    try:
        if cfg.read_only:  # what does not change per command, from the host's cache (clusterfacts)
            cluster = await discover_cached(client, settings, facts, cfg.probe_cache, now=clock.now())
            facts.notes += await kueue_objects(client, settings, facts)
        else:
            await discover(client, settings, facts)
            await review_access(client, settings, facts)
            if facts.may_write and cfg.probe_cache is not None:
                await _probe_or_reuse(client, settings, facts, cfg.probe_cache, window=window, clock=clock)
            elif facts.may_write:
                await probe(client, settings, facts, window=window, clock=clock)
                facts.probed_at = clock.now()
            else:
                client.read_only = True
                facts.notes += await kueue_objects(client, settings, facts)
        await admission_check(client, settings, facts)
        cluster = cluster or await cluster_identity(client)  # on every open, read-only ones included
    except BaseException:
        await client.close()
        raise
    return Backend(
        client,
        settings,
        facts,
        read_only=cfg.read_only,
        clock=clock,
        cluster_id=cluster,
        store_id=cfg.store_id,
    )


async def _probe_or_reuse(
    client: KubeClient,
    settings: Settings,
    facts: ClusterFacts,
    cache: ProbeCache,
    *,
    window: float,
    clock: Clock,
) -> None:
    """Reuse the cached findings when their fingerprint still matches and ``probeTTL`` has not passed;
    else probe and keep what it learned. See :mod:`dispatch_kubeflow.probecache`."""
    runtime = await probe_runtime(client, settings)
    key = probecache.cache_key(client.server, settings)
    print_ = await probecache.fingerprint(client, runtime, facts)
    found = await probecache.lookup(cache, key, print_, now=clock.now(), ttl=settings.probe_ttl)
    if found is not None:
        missing = await kueue_objects(client, settings, facts)  # objects may go without the runtime moving
        if missing:
            raise UnsupportedError(missing)
        learned, at = found
        probecache.apply(facts, learned, at)
        _log.info("probe: reused the findings of %s (fingerprint unchanged)", _utc(at))
        return
    before = len(facts.notes)
    await probe(client, settings, facts, window=window, clock=clock, runtime=runtime)
    facts.probed_at = clock.now()
    await probecache.remember(cache, key, print_, probecache.findings(facts, before), now=facts.probed_at)


def _schedulable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def _utc(at: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


class Backend:
    """One opened Kubeflow Trainer cluster (namespace ``settings.namespace``).

    Implements the ``Backend``, ``Holder``, ``IdentityWeakener`` and ``DecisionRecorder`` protocols of
    :mod:`dispatch.backend`.
    """

    def __init__(
        self,
        client: KubeClient,
        settings: Settings,
        facts: ClusterFacts,
        *,
        read_only: bool,
        clock: Clock,
        cluster_id: str = "",
        store_id: str = "",
    ) -> None:
        self._client = client
        self._cluster_id = cluster_id or f"kubernetes:{client.server}"
        self.store_id = store_id
        """The host's store identity: labels every object this backend creates; objects labelled with
        another store's are not read, adopted or changed ("": no label, every object is ours)."""
        self.settings = settings
        self.facts = facts
        self.mode = (
            Mode.READ_ONLY
            if read_only
            else Mode.OBSERVE_ONLY
            if facts.may_write is False
            else Mode.READ_WRITE
        )
        self._clock = clock
        self._closed = False
        self._listed_once = False
        self._pods_read: tuple[str, float, Pods] | None = None
        """The incarnation whose pods a read-only process last listed to read output, when, and them."""
        # The one reading path (SPEC §9.6): every reader of this process shares this cache; the host's
        # feed (every watch) is filled from it.
        self.feed = Feed(self._fill)
        """The host's feed, which this backend fills from the informer (its readings, and whether the
        cluster answers it: :meth:`Feed.troubled`)."""
        self.informer = Informer(
            client,
            settings.namespace,
            [*self._incarnation_kinds(), *runtime_kinds(settings.namespace)],
            on_change=self._changed,
            clock=clock,
            on_trouble=self.feed.troubled,
        )

    def _incarnation_kinds(self) -> list[Kind]:
        return kinds(
            self.settings.namespace,
            kueue=self.facts.kueue,
            pods=self.facts.pods_visible is not False,
            store=self.store_id,
        )

    def __repr__(self) -> str:
        return f"<dispatch_kubeflow.Backend {self._client.server} namespace={self.settings.namespace!r} {self.mode}>"

    @property
    def name(self) -> str:
        return NAME

    @property
    def cluster_id(self) -> str:
        """The cluster's identity, read on open (:func:`~dispatch_kubeflow.preflight.cluster_identity`)."""
        return self._cluster_id

    # --- capabilities ------------------------------------------------------------------------------

    @property
    def queueing(self) -> bool:
        """Jobs go through Kueue: it is installed and settings name a queue (and it did not ignore the probe)."""
        return (
            self.facts.kueue and self.settings.queue is not None and self.facts.kueue_takes_jobs is not False
        )

    def _capabilities(self, max_nodes: int | None = None) -> Capabilities:
        writable = self.mode is Mode.READ_WRITE
        checkpoint = self.settings.checkpoint_volume is not None
        extensions = set(ACCEPTED_EXTENSIONS) if checkpoint else set(ACCEPTED_EXTENSIONS[:2])
        notes = [
            f"namespace {self.settings.namespace!r}",
            f"Kueue {'installed' if self.facts.kueue else 'absent'}",
        ]
        for label, value in (
            ("Trainer reconciles", self.facts.trainer_reconciles),
            ("Kueue takes jobs", self.facts.kueue_takes_jobs),
            ("pods visible", self.facts.pods_visible),
            ("logs readable", self.facts.logs_readable),
        ):
            if value is not None:
                notes.append(f"{label}: {'yes' if value else 'no'}")
        notes += self.facts.notes
        notes += self._client.findings  # warnings the API server attached to our writes
        if self.facts.from_cache and self.facts.probed_at is not None:
            notes.append(
                f"probe findings reused from {_utc(self.facts.probed_at)} (fingerprint unchanged, within "
                f"probeTTL {self.settings.probe_ttl:g}s); `dispatch check --refresh` probes again"
            )
        if self.mode is Mode.READ_ONLY:
            notes.append("read-only: opened without the probe; every write is refused")
        refusals = self._hold_refusals()
        if writable and not refusals:
            how = (
                f"the admission check {self.settings.admission_check!r} (dispatch-admission)"
                if self.queueing
                else "spec.suspend"
            )
            notes.append(f"holds: through {how} and the annotation {ANNOTATION_HOLD}")
        notes += [f"holds: {r}" for r in refusals]
        return Capabilities(
            mode=self.mode,
            holds=writable and not refusals,
            watch=True,
            cessation=self.facts.pods_visible is not False,
            output=self.facts.pods_visible is not False and self.facts.logs_readable is not False,
            shared_checkpoint=checkpoint,
            queueing=self.queueing,
            extensions=frozenset(extensions),
            limits=Limits(
                max_env=MAX_ENV - (3 if checkpoint else 2), max_command=MAX_COMMAND, max_nodes=max_nodes
            ),
            notes=tuple(notes),
        )

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        """What this cluster can do. With ``spec``: read its runtime and refuse (``UnsupportedError``,
        every reason at once) what this cluster cannot run; a missing required extension is
        ``InvalidError``. Creates nothing."""
        if spec is None:
            return self._capabilities()
        runtime = await self._checked_runtime(spec)
        caps = self._capabilities(inspect_runtime(runtime).max_nodes)
        capacity = await self._capacity_note(spec)
        return caps.replace(notes=(*caps.notes, capacity)) if capacity else caps

    async def _capacity_note(self, spec: JobSpec) -> str | None:
        """A warning when the job asks for more nodes than the cluster has ready and schedulable now. Not a
        refusal: a cluster may grow (autoscaling) or pods may share nodes. ``None`` when nodes cannot be
        read with these credentials (nodes are cluster-scoped; many submitters may not list them)."""
        try:
            nodes = await self._client.list(NODES.path(), what="list nodes")
        except DispatchError:  # not readable here (or not now): a warning is not worth a failure
            return None
        ready = [n for n in nodes if _schedulable(n)]
        if spec.nodes <= len(ready):
            return None
        return (
            f"warning: the job asks for {spec.nodes} nodes and the cluster has {len(ready)} ready, schedulable "
            "nodes now: it will wait for capacity unless the cluster grows"
        )

    async def _checked_runtime(self, spec: JobSpec) -> dict[str, Any]:
        if not isinstance(spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(spec).__name__}", path="spec")
        _, ref, _ = job_extensions(spec, self.settings)
        reasons = unsupported_extensions(spec, self.settings)
        ns = self.settings.runtime_namespace(ref.kind)
        where = f'{ref.kind} "{ref.runtime}"'
        runtime = await self._runtime(ref.kind, ref.runtime, ns, what=f"get {where}")
        if runtime is None:
            place = f" in namespace {ns!r}" if ns else ""
            reasons.append(
                f'extensions["kubeflow/RuntimeRef"].name: {where} was not found{place}; '
                + await self._runtimes_there(ref.kind, ns)
            )
            raise UnsupportedError(reasons)
        reasons += check_runtime(runtime, spec, kind=ref.kind)
        if reasons:
            raise UnsupportedError(reasons)
        return runtime

    async def _runtime(
        self, kind: str, name: str, namespace: str | None, *, what: str
    ) -> dict[str, Any] | None:
        """The runtime from the shared cache (the runtimes are watched, not read per submit); read from
        the cluster when the cache does not follow runtimes (not listable with these credentials) or does
        not have it yet (created a moment ago)."""
        await self.informer.sync()
        cached = self.informer.objects(runtime_kind_key(kind), name)
        if cached:
            return cached[0]
        return await self._client.get_or_none(runtime_path(kind, name, namespace), what=what)

    async def _runtimes_there(self, kind: str, namespace: str | None) -> str:
        """The runtimes of ``kind`` that exist where one was looked for: the alternatives to name."""
        resource = CLUSTER_TRAINING_RUNTIMES if namespace is None else TRAINING_RUNTIMES
        try:
            found = await self._client.list(resource.path(namespace), what=f"list {kind}s")
        except DispatchError:  # not readable here: the error still names what was missing
            return f"the {kind}s that exist could not be listed"
        names = sorted(str(o.get("metadata", {}).get("name")) for o in found)
        return f"{kind}s that exist: {', '.join(names)}" if names else f"no {kind} exists there"

    # --- prepare / start ---------------------------------------------------------------------------

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        """Every check :meth:`start` makes — the runtime is read once, here — and the TrainJob it will
        create. Nothing is written, so it works on a read-only or observe-only backend (a dry run)."""
        if not isinstance(identity, Identity):
            raise InvalidError(f"expected an Identity, got {type(identity).__name__}", path="identity")
        if not isinstance(held, bool):
            raise InvalidError(f"expected True or False, got {held!r}", path="held")
        if held and self._hold_refusals():
            raise UnsupportedError(self._hold_refusals())
        runtime = await self._checked_runtime(spec)
        obj = build_trainjob(
            spec,
            identity,
            self.settings,
            inspect_runtime(runtime),
            held=held,
            kueue=self.queueing,
            store=self.store_id,
        )
        return Prepared(NAME, spec, identity, held, obj)

    def _refuse_writes(self, what: str) -> None:
        if self.mode is not Mode.READ_WRITE:
            mode = (
                "read-only"
                if self.mode is Mode.READ_ONLY
                else "observe-only (its credentials may not write TrainJobs)"
            )
            raise ReadOnlyError(f"{what}: the kubeflow backend is {mode}")

    def _handle(self, identity: Identity, name: str) -> Handle:
        return Handle(NAME, identity, f"{self.settings.namespace}/{name}", cluster=self._cluster_id)

    async def start(self, prepared: Prepared) -> Handle:
        """Create the TrainJob :meth:`prepare` built (suspended if held; not under Kueue), exactly as built.

        Idempotent per identity: an existing TrainJob of the same incarnation is adopted; one of another
        identity under the same name is a ``ConflictError``. A create whose answer was lost is
        ``OutcomeUnknownError`` (starting again settles it)."""
        if not isinstance(prepared, Prepared):
            raise InvalidError(
                f"expected a Prepared (from prepare), got {type(prepared).__name__}", path="prepared"
            )
        identity = prepared.check(NAME).identity
        self._refuse_writes(f"start {identity}")
        obj = prepared.request
        name = naming.native_name(identity)
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or meta.get("name") != name:
            raise InvalidError(
                f'the prepared TrainJob must be named "{name}" (the native name of {identity})',
                path="prepared.request.metadata.name",
            )
        what = f'create TrainJob "{name}" in namespace {self.settings.namespace!r}'
        path = trainjob_path(self.settings.namespace)
        try:
            self._remember(await self._client.create(path, obj, what=what))
            _log.info("created TrainJob %s/%s for %s", self.settings.namespace, name, identity)
            return self._handle(identity, name)
        except AlreadyExistsError:
            pass
        except UnsupportedError:
            # The server took it but dropped fields it does not know (it ignored Strict validation): the
            # job would run without them (its checkpoint volume, its time limit...). Take it back.
            await self._withdraw(name, what)
            raise
        except OutcomeUnknownError:
            # The create may have landed; the identity lookup settles it when the cluster answers.
            try:
                existing = await self._client.get_or_none(
                    trainjob_path(self.settings.namespace, name), what=what
                )
            except DispatchError:
                existing = None
            if existing is None:
                raise
            return self._adopt(existing, identity, name)
        try:
            existing = await self._get(name, what=f'get TrainJob "{name}"')
        except (UnavailableError, OutcomeUnknownError) as exc:
            # AlreadyExists (perhaps our own earlier attempt, whose answer was lost) and the lookup that
            # would tell failed: whether this incarnation is on the cluster cannot be known yet.
            raise OutcomeUnknownError(
                f"{what}: the name is taken and the identity lookup failed ({exc}); it may or may not have taken "
                "effect: observe (or start the same identity again) before acting again"
            ) from None
        if existing is None:
            raise ConflictError(
                f"{what}: it existed a moment ago and is gone now (being deleted?); start again"
            )
        return self._adopt(existing, identity, name)

    def _adopt(self, existing: Mapping[str, Any], identity: Identity, name: str) -> Handle:
        found = naming.identity_of(existing)
        if found is None:
            raise ConflictError(
                f'TrainJob "{name}" in namespace {self.settings.namespace!r} already exists and was not created by '
                "dispatch; delete or rename it"
            )
        if not found.same_incarnation(identity):
            raise ConflictError(
                f'TrainJob "{name}" in namespace {self.settings.namespace!r} belongs to {found}, not {identity}'
            )
        self._check_store(existing, f'TrainJob "{name}" in namespace {self.settings.namespace!r}')
        _log.info("adopted existing TrainJob %s/%s for %s", self.settings.namespace, name, identity)
        return self._handle(identity, name)

    def _remember(self, written: dict[str, Any]) -> None:
        """What this process wrote is what it reads back at once (the watch brings the same soon)."""
        if isinstance(written.get("metadata"), Mapping):
            self.informer.remember("trainjobs", written)

    async def _withdraw(self, name: str, what: str) -> None:
        """Delete a TrainJob this backend just created and must not leave running; a failure is logged
        (the caller's error already says what happened)."""
        try:
            await self._client.delete(
                trainjob_path(self.settings.namespace, name),
                what=f"withdraw after {what}",
                propagation="Background",  # never foreground: Trainer v2.3.0 would re-apply its JobSet
            )
        except DispatchError as exc:
            _log.warning("%s: could not delete it again: %s", what, exc)

    async def _get(self, name: str, *, what: str) -> dict[str, Any] | None:
        return await self._client.get_or_none(trainjob_path(self.settings.namespace, name), what=what)

    # --- Holder (SPEC §9.6) ----------------------------------------------------------------------------

    def _hold_refusals(self) -> tuple[str, ...]:
        """Why this cluster cannot hold (empty: it can). Read-only modes are refused by the writes."""
        if not self.queueing:
            return ()
        if self.settings.admission_check is None:
            return (
                "jobs go through Kueue, which owns spec.suspend: set settings admissionCheck to an AdmissionCheck "
                "served by dispatch-admission (docs/how-to-holds-with-kueue.md)",
            )
        if self.facts.hold_refusals is None:
            return (f"the admission check {self.settings.admission_check!r} was not checked",)
        return tuple(self.facts.hold_refusals)

    async def hold(self, handle: Handle) -> HoldToken:
        """Hold the incarnation: the hold annotation (with a fresh token) on its TrainJob and, without
        Kueue, ``spec.suspend``; under Kueue ``dispatch-admission`` keeps it unadmitted, or evicts it if it
        runs. Idempotent: an incarnation already held returns the token it carries. Written with a
        resourceVersion precondition, so a concurrent hold is never overwritten."""
        self._refuse_writes(f"hold {handle}")
        name = self._name_of(handle)
        refusals = self._hold_refusals()
        if refusals:
            raise UnsupportedError(refusals)
        what = f'hold TrainJob "{handle.ref}"'
        for _ in range(5):
            obj = await self._get(name, what=what)
            if obj is None:
                raise NotFoundError(f"{what}: the TrainJob no longer exists; nothing to hold")
            self._check_owner(obj, handle)
            # The TrainJob alone says whether the job ended (Complete, Failed, being deleted).
            from dispatch_kubeflow.causes import Snapshot, classify

            outcome = classify(Snapshot.of(name, obj, now=self._clock.now()))
            if outcome.terminal:
                raise ConflictError(f"{what}: the job already ended ({outcome}); nothing to hold")
            token = held_by_us(obj)
            suspend = not self.queueing
            if token is not None and (not suspend or obj.get("spec", {}).get("suspend") is True):
                return HoldToken(token)
            token = token or new_token()
            body: dict[str, Any] = {
                "metadata": {
                    "resourceVersion": obj["metadata"]["resourceVersion"],
                    "annotations": {ANNOTATION_HOLD: token},
                }
            }
            if suspend:
                body["spec"] = {"suspend": True}
            try:
                patched = await self._client.patch(
                    trainjob_path(self.settings.namespace, name), body, what=what
                )
            except ConflictError:
                continue  # the resourceVersion precondition (409): read again (someone's hold is then returned)
            self._remember(patched)
            _log.info("held TrainJob %s for %s", handle.ref, handle.identity)
            return HoldToken(token)
        raise ConflictError(f"{what}: the TrainJob kept changing; observe it and hold again")

    async def release(self, handle: Handle, token: HoldToken) -> None:
        """Release our hold. ``StaleHoldError`` when the TrainJob shows no hold or another token, or is
        gone or belongs to another incarnation. The patch tests the annotation's value, so a hold that
        changes between the read and the write is detected, never removed."""
        self._refuse_writes(f"release {handle}")
        name = self._name_of(handle)
        if not isinstance(token, str) or not token:
            raise InvalidError(f"expected a hold token (a non-empty string), got {token!r}", path="token")
        what = f'release the hold on TrainJob "{handle.ref}"'
        obj = await self._get(name, what=what)
        self._check_hold(obj, handle, token, what)
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": pointer(ANNOTATION_HOLD), "value": token},
            {"op": "remove", "path": pointer(ANNOTATION_HOLD)},
        ]
        if not self.queueing:
            ops.append({"op": "add", "path": "/spec/suspend", "value": False})
        try:
            self._remember(
                await self._client.patch(
                    trainjob_path(self.settings.namespace, name),
                    ops,
                    what=what,
                    content_type="application/json-patch+json",
                )
            )
        except (InvalidError, ConflictError, NotFoundError):
            # The test op failed (422, InvalidError), or the object changed or went: a stale hold is told
            # from another refusal by reading what the cluster shows now.
            self._check_hold(await self._get(name, what=what), handle, token, what)
            raise
        _log.info("released TrainJob %s for %s", handle.ref, handle.identity)

    def _check_hold(self, obj: Mapping[str, Any] | None, handle: Handle, token: str, what: str) -> None:
        if obj is None:
            raise StaleHoldError(f"{what}: the TrainJob no longer exists, and its hold went with it")
        found = naming.identity_of(obj)
        if found is None or not found.same_incarnation(handle.identity):
            raise StaleHoldError(
                f"{what}: the TrainJob belongs to {found or 'no dispatch identity'}, not {handle.identity} "
                "(the hold targets an older incarnation)"
            )
        shown = held_by_us(obj)
        if shown != token:
            cluster = "another hold" if shown else "no hold"
            raise StaleHoldError(
                f"{what}: stale hold token: the cluster shows {cluster} (annotation {ANNOTATION_HOLD}); "
                "hold it again to get a fresh token"
            )

    # --- observe / stop / list -----------------------------------------------------------------------

    def _name_of(self, handle: Handle) -> str:
        if not isinstance(handle, Handle) or handle.backend != NAME:
            raise InvalidError(f"not a {NAME} handle: {handle!r}", path="handle")
        ns, _, name = handle.ref.partition("/")
        if ns != self.settings.namespace or not name:
            raise InvalidError(
                f"handle {handle.ref!r} is not in this backend's namespace {self.settings.namespace!r}",
                path="handle.ref",
            )
        return name

    def _check_owner(self, obj: Mapping[str, Any], handle: Handle) -> None:
        found = naming.identity_of(obj)
        if found is None or not found.same_incarnation(handle.identity):
            raise ConflictError(
                f'TrainJob "{handle.ref}" carries {found or "no dispatch identity"}, not {handle.identity}'
            )
        self._check_store(obj, f'TrainJob "{handle.ref}"')

    def _check_store(self, obj: Mapping[str, Any], what: str) -> None:
        """Refuse an object another store's host created (SPEC §6.1): never adopted, folded or changed."""
        if not self.store_id:
            return
        labels = labels_of(obj)
        theirs = labels.get(LABEL_STORE, "")
        if theirs != self.store_id:
            whose = f"store {theirs!r}" if theirs else "no store"
            raise ConflictError(f"{what} belongs to {whose}, not to this one ({self.store_id!r})")

    def _reading(self, name: str, identity: Identity, parts: Parts) -> Observation | Absent:
        """The one reading of an incarnation, for ``observe``, ``list`` and the feed: the cause table over
        its cached objects, a deletion that does not complete, the output tails of failed nodes read while
        their pods were there, and whether its compute remains. A TrainJob gone with nothing of it left is
        :class:`~dispatch.model.Absent`; gone with pods still terminating, it is ending (``stopping``,
        cancelled) until they go. Who stopped it, and what that makes of the record, the host decides."""
        # Imported here: its rule table is a tenth of the adapter's import time, and a command that reads
        # nothing (`logs` of a finished job) never needs it.
        from dispatch_kubeflow.causes import Snapshot, classify

        now = self._clock.now()
        handle = self._handle(identity, name)
        compute = self._compute(parts)
        extras = self.informer.extras(name)
        if parts.trainjob is None and compute is not Compute.PRESENT:
            left = remains(None, parts.jobset, parts.pods)
            ev = Evidence(
                kind="TrainJob",
                name=name,
                reason="NotFound",
                message="the TrainJob is gone, and no pod of it remains"
                + ("" if left.jobset is None else f" (its JobSet {left.jobset!r} is going)"),
                at=now,
            )
            return Absent(handle, now, (ev,))
        snapshot = Snapshot.of(
            name,
            parts.trainjob,
            jobset=parts.jobset,
            jobs=parts.jobs,
            pods=parts.pods,
            workload=parts.workload,
            now=now,
            events=extras.events or (),
        )
        outcome = classify(snapshot)
        outcome = with_stuck_deletion(outcome, name, parts, now=now, deletions=self.informer.deletions)
        outcome = attach_output(outcome, list(extras.tails.values()))
        return Observation(handle, outcome, now, compute)

    def _compute(self, parts: Parts) -> Compute:
        """Whether compute of the incarnation remains: a pod not yet finished (running, pending, or
        terminating). A pod the credentials may not see leaves it unknown."""
        if not self.informer.follows("pods"):
            return Compute.UNKNOWN
        live = [p for p in parts.pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        return Compute.PRESENT if live else Compute.GONE

    async def _changed(self, name: str, identity: Identity) -> None:
        """The informer's word that incarnation ``name`` changed: read it into the feed."""
        parts = self.informer.parts(name)
        await self._watch_tails(name, parts)
        self.feed.offer(self._reading(name, identity, parts))

    async def _fill(self, feed: Feed) -> None:
        """The feed's source: the informer's list+watch streams, until they fail. The informer reads every
        incarnation into the feed when it starts (:meth:`Informer.sync`) and each one an event touches
        after that (:meth:`_changed`). This task starts nothing itself — a watch starts the informer in the
        caller's own task (:meth:`watch`), so what a process sends happens in the order it asked for it."""
        await self.informer.following()
        await self.informer.done()

    async def _read_tails(self, name: str, trainjob: Mapping[str, Any], pods: list[dict[str, Any]]) -> None:
        """Read the output tail of every failed node of the incarnation not read yet — while its pod is
        still there (JobSet deletes failed pods). Not for a TrainJob being deleted: a stop's SIGTERM is no
        failure. Unreadable logs are left out (the evidence then has no output)."""
        meta = trainjob.get("metadata")
        if (
            not isinstance(meta, Mapping)
            or meta.get("deletionTimestamp")
            or self.facts.logs_readable is False
        ):
            return
        extras = self.informer.extras(name)
        for pod in failed_node_pods(pods):
            pmeta = pod.get("metadata", {})
            term = terminated_node(pod)
            if term is None:
                continue
            key = (str(pmeta.get("uid", "")), term[2])
            if key in extras.tails_read:
                continue
            extras.tails_read.add(key)
            try:
                lines = await output.read_tail(
                    self._client,
                    self.settings.namespace,
                    str(pmeta.get("name", "")),
                    lines=self.settings.output_tail_lines,
                    previous=term[0],
                )
            except DispatchError as exc:
                _log.info("could not read the output tail of pod %s: %s", pmeta.get("name"), exc)
                continue
            tail = Tail.of(pod, lines)
            extras.tails[tail.pod] = tail

    async def _current(self, name: str | None = None) -> None:
        """The shared cache, current for a read (of incarnation ``name``, or of all). A read-only backend's
        first read, when no feed runs, lists the incarnation kinds once and watches nothing (a read command
        asks once: list+watch of seven kinds cost it twice the requests and CPU of its answer) — the
        TrainJobs and pods first, the JobSets, Jobs and Workloads only when an incarnation read is not
        :func:`~dispatch_kubeflow.plain.plain`; every later read starts the feed, as every read of a backend
        that writes (the supervisor) does from the first."""
        if self.mode is Mode.READ_ONLY and not self._listed_once and not self.informer.running:
            self._listed_once = True

            def enough(view: View) -> bool:
                names = [name] if name is not None else sorted(view.identities)
                return all(plain(view.parts(n).trainjob, view.parts(n).pods) for n in names)

            await self.informer.snapshot({k.key for k in self._incarnation_kinds()}, enough=enough)
            return
        await self.informer.sync()

    async def observe(self, handle: Handle) -> Observation | Absent:
        """A reading of the incarnation, classified by the cause table (:mod:`dispatch_kubeflow.causes`)
        from the shared cache, as of the last event it received (what this process wrote itself shows at
        once). A TrainJob the cache does not hold is read from the cluster, and told gone only after a
        second, differently routed read; gone with nothing of it left, the incarnation is absent."""
        name = self._name_of(handle)
        await self._current(name)
        parts = self.informer.parts(name)
        obj = parts.trainjob
        if obj is None:
            obj = await self._get(name, what=f'get TrainJob "{handle.ref}"')
            if obj is None:
                obj = await confirm_gone(self._client, self.settings.namespace, name)
            if obj is not None:
                self.informer.remember("trainjobs", obj)  # created a moment ago: the watch brings it soon
                parts = Parts(obj, parts.jobset, parts.jobs, parts.pods, parts.workload)
        if obj is not None:
            self._check_owner(obj, handle)
            await self._watch_tails(name, parts)
        return self._reading(name, handle.identity, parts)

    async def stop(self, handle: Handle) -> None:
        """Suspend the incarnation (under Kueue: deactivate its Workload), then delete its TrainJob in the
        background (its JobSet and pods go after it); see :func:`cessation.stop`, which converges on
        Trainer v2.3.0 (a foreground deletion by someone else included). Idempotent: a TrainJob already
        gone, or already being deleted in the background, is fine. Returns before the pods are gone."""
        self._refuse_writes(f"stop {handle}")
        name = self._name_of(handle)
        obj = await self._get(name, what=f'get TrainJob "{handle.ref}"')
        if obj is None:
            return
        self._check_owner(obj, handle)
        await cessation.stop(
            self._client, obj, ref=handle.ref, kueue=self.facts.kueue, queueing=self.queueing
        )

    async def record_decision(
        self, handle: Handle, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """An Event on the incarnation's TrainJob (``kubectl describe trainjob`` lists it); nothing when
        the TrainJob is gone or the credentials may not write (observe-only, read-only)."""
        if self.mode is not Mode.READ_WRITE:
            return
        name = self._name_of(handle)
        obj = await self._get(name, what=f'get TrainJob "{handle.ref}"')
        if obj is None:
            return
        body = decision_event(obj, reason, message, warning=warning, at=time.time())
        what = f'create Event {reason} on TrainJob "{handle.ref}"'
        await self._client.create(events_path(self.settings.namespace), body, what=what)

    async def list(self) -> list[Observation]:
        """A reading of every incarnation in the namespace that carries this store's marks and is still on
        the cluster (its TrainJob, or compute left of it), from the shared cache (one list+watch per kind
        for the whole process, never a request per job). Objects whose marks are inconsistent are skipped
        with a warning."""
        await self._current()
        out: list[Observation] = []
        for name, identity in sorted(self.informer.identities().items()):
            parts = self.informer.parts(name)
            if parts.trainjob is None and not parts.pods:
                continue
            reading = self._reading(name, identity, parts)
            if isinstance(reading, Observation):
                out.append(reading)
        return out

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        if not self._closed:
            self._closed = True
            await self.feed.close()
            await self.informer.close()
            await self._client.close()

    # --- Watcher ---------------------------------------------------------------------------------------

    def watch(self, cursor: str | None = None) -> AsyncIterator[Change]:
        """Changes of every incarnation in the namespace, from the host's feed, which the shared informer
        fills (one list+watch per kind for the whole process, however many watches are open). Resumable
        from any change's cursor; a cursor the feed does not hold (another process's, an old one) relists."""
        return self._watch(cursor, None)

    async def _watch(self, cursor: str | None, job_id: str | None) -> AsyncIterator[Change]:
        await self._current()  # the informer started here, in the watcher's task
        changes = self.feed.watch(cursor, job_id=job_id)
        try:
            async for change in changes:
                yield change
        finally:
            await changes.aclose()  # type: ignore[attr-defined]

    def watch_job(self, job_id: str) -> AsyncIterator[Change]:
        """The changes of job ``job_id``'s incarnations only (``JobWatcher``): a thousand jobs each
        followed on its own cost what one watch of them all does."""
        if not isinstance(job_id, str) or not job_id:
            raise InvalidError(f"expected a job id, got {job_id!r}", path="job_id")
        return self._watch(None, job_id)

    async def _watch_tails(self, name: str, parts: Parts) -> None:
        """What must be read before an incarnation is read: the output tails of failed nodes while their
        pods are there, and — for a failure nothing cached explains — the Events that outlive the pods."""
        if parts.trainjob is not None and failed_node_pods(parts.pods):
            await self._read_tails(name, parts.trainjob, parts.pods)
        extras = self.informer.extras(name)
        # Only once the pods are gone: while they are there they say more, and a failure read before its
        # pods' last statuses arrive (another stream) must not cost a list of the namespace's Events.
        if parts.trainjob is not None and not parts.pods and extras.events is None:
            before = self.feed.last(f"{self.settings.namespace}/{name}")
            if (
                isinstance(before, Observation)
                and before.outcome.terminal
                and before.cause not in (Cause.NONE, Cause.UNKNOWN)
            ):
                # This process read the failure's cause while the pods were there (and the host's record
                # keeps it): the Events cannot add to it, and are not worth a list of the namespace's.
                extras.events = []
                return
            identity = self.informer.identities().get(name)
            if identity is None:
                return
            reading = self._reading(name, identity, parts)
            if isinstance(reading, Observation) and (reading.state, reading.cause) == (
                State.FAILED,
                Cause.UNKNOWN,
            ):
                extras.events = await events_of(self._client, self.settings.namespace, name)

    # --- CessationSignal -------------------------------------------------------------------------------

    async def ceased(self, handle: Handle) -> bool:
        """True only when the incarnation's TrainJob, its JobSet and every pod of it are gone."""
        left, _ = await cessation.read_remains(self._client, handle, self._name_of(handle))
        self.informer.deletions.stuck_for(left, self._clock.now())  # starts the clock of a deletion seen here
        return left.ceased

    async def require_ceased(self, handle: Handle) -> None:
        """Return if the incarnation has ceased; else raise :class:`~dispatch_kubeflow.PodsRemainError`
        naming what remains (which pods, terminating since when; a deletion that does not complete)."""
        await cessation.require_ceased(
            self._client, handle, self._name_of(handle), clock=self._clock, deletions=self.informer.deletions
        )

    async def wait_ceased(self, handle: Handle) -> None:
        """Return once :meth:`ceased` is true, waiting on watches; bound it with ``asyncio.timeout``."""
        await cessation.wait_ceased(self._client, handle, self._name_of(handle), clock=self._clock)

    # --- OutputReader ----------------------------------------------------------------------------------

    async def output(
        self,
        handle: Handle,
        *,
        node: int = 0,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
        since: float | None = None,
        timestamps: bool = False,
    ) -> AsyncIterator[str]:
        """Lines of the ``node`` container of node ``node`` (its completion index); ``follow`` waits for a
        node that has not started and streams until it ends; ``previous``: the last terminated container of
        a pod that restarted in place; ``since`` and ``timestamps``: the kubelet's ``sinceSeconds`` and
        ``timestamps``."""
        name = self._name_of(handle)
        num_nodes: int | None = None
        if follow:
            obj = await self._get(name, what=f'get TrainJob "{handle.ref}"')
            if obj is None:
                raise NotFoundError(f'TrainJob "{handle.ref}" is gone: nothing to follow')
            self._check_owner(obj, handle)
            n = obj.get("spec", {}).get("trainer", {}).get("numNodes")
            num_nodes = n if isinstance(n, int) and not isinstance(n, bool) else None
        async for line in output.stream_output(
            self._client,
            self.settings.namespace,
            handle.identity,
            node=node,
            follow=follow,
            tail=tail,
            previous=previous,
            num_nodes=num_nodes,
            since=since,
            timestamps=timestamps,
            pods=await self._listed_pods(name, handle.identity),
        ):
            yield line

    async def _listed_pods(self, name: str, identity: Identity) -> Pods | None:
        """The pods of incarnation ``name`` for a read-only process that asks once (a command): what it
        listed a moment ago — the snapshot of its first read (``status`` refreshing the record before
        ``logs`` reads), or the listing of its last output read of that incarnation — else one listing of
        every node's pods, kept for the next node. ``None`` (each read lists its node's pods) for a
        process that follows the cluster or may write. A listing at most :data:`PODS_REUSED` seconds old
        is what a listing that took that long would have given; an older one is listed again."""
        if self.mode is not Mode.READ_ONLY or self.informer.running:
            return None
        now = time.monotonic()
        snapped = self.informer.listed_at.get("pods")
        if snapped is not None and now - snapped <= PODS_REUSED and self.informer.follows("pods"):
            return self.informer.parts(name).pods, self.informer.rvs.get("pods", "")
        if (
            self._pods_read is not None
            and self._pods_read[0] == name
            and now - self._pods_read[1] <= PODS_REUSED
        ):
            return self._pods_read[2]
        pods = await output.incarnation_pods(self._client, self.settings.namespace, identity)
        self._pods_read = (name, time.monotonic(), pods)
        return pods

    # --- IdentityWeakener ----------------------------------------------------------------------------

    def native_name(self, identity: Identity) -> str:
        """The TrainJob name of ``identity`` (see :func:`dispatch_kubeflow.naming.native_name`)."""
        return naming.native_name(identity)

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        """The identity a TrainJob carries, ``None`` if none; ``ConflictError`` if inconsistent."""
        return naming.identity_of(obj)
