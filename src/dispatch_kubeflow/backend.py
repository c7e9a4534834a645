"""The Kubeflow Trainer backend: :class:`Backend` and :func:`factory` (SPEC §9.3–§9.5).

The deciding parts are pure and live beside this module (settings, runtime rules, TrainJob building,
naming, error mapping, state); this module does the I/O around them through :mod:`dispatch_kubeflow.kube`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dispatch.backend import HoldToken, Prepared
from dispatch.clock import Clock, SystemClock
from dispatch.config import AdapterConfig
from dispatch.errors import (
    ConflictError,
    InvalidError,
    NotFoundError,
    ReadOnlyError,
    UnsupportedError,
)
from dispatch.model import Capabilities, Handle, Identity, JobSpec, Limits, Mode, Observation
from dispatch_kubeflow import naming
from dispatch_kubeflow.errors import StaleHoldError
from dispatch_kubeflow.holds import held_by_us, new_token, pointer
from dispatch_kubeflow.kube import ApiStatus, KubeClient, Retry, Unreachable, resource_path
from dispatch_kubeflow.names import (
    ANNOTATION_HOLD,
    LABEL_INCARNATION,
    LABEL_JOB_HASH,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    MAX_COMMAND,
    MAX_ENV,
    NAME,
)
from dispatch_kubeflow.preflight import (
    ClusterFacts,
    admission_check,
    discover,
    kueue_objects,
    probe,
    review_access,
    runtime_path,
    trainjob_path,
)
from dispatch_kubeflow.runtime import check_runtime, inspect_runtime
from dispatch_kubeflow.settings import Settings, parse_settings
from dispatch_kubeflow.state import cancelled, lost, outcome_of
from dispatch_kubeflow.trainjob import (
    ACCEPTED_EXTENSIONS,
    build_trainjob,
    job_extensions,
    unsupported_extensions,
)

__all__ = ["Backend", "factory", "open_backend"]

_log = logging.getLogger(__name__)
_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB_HASH}"


async def factory(cfg: AdapterConfig) -> Backend:
    """Open the Kubeflow adapter from an :class:`~dispatch.config.AdapterConfig` (runs preflight unless
    read-only; takes at least the probe window, ten seconds or more, unless read-only or observe-only)."""
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
    facts = ClusterFacts()
    try:
        try:
            await discover(client, settings, facts)
            if cfg.read_only:
                facts.notes += await kueue_objects(client, settings, facts)
            else:
                await review_access(client, settings, facts)
                if facts.may_write:
                    await probe(client, settings, facts, window=window, clock=clock)
                else:
                    client.read_only = True
                    facts.notes += await kueue_objects(client, settings, facts)
            await admission_check(client, settings, facts)
        except ApiStatus as exc:
            raise exc.to_error(f"preflight of the cluster at {client.server}") from None
        except Unreachable as exc:
            raise exc.to_error(f"preflight of the cluster at {client.server}") from None
    except BaseException:
        await client.close()
        raise
    return Backend(client, settings, facts, read_only=cfg.read_only, clock=clock)


class Backend:
    """One opened Kubeflow Trainer cluster (namespace ``settings.namespace``).

    Implements the ``Backend``, ``Holder`` and ``IdentityWeakener`` protocols of :mod:`dispatch.backend`.
    """

    def __init__(
        self, client: KubeClient, settings: Settings, facts: ClusterFacts, *, read_only: bool, clock: Clock
    ) -> None:
        self._client = client
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
        # Refs this backend deleted: a TrainJob gone after our own stop was cancelled, not lost. (Across
        # restarts the host's record decides: "record says we cancelled" comes first in SPEC §9.7.)
        self._stopped: set[str] = set()

    def __repr__(self) -> str:
        return f"<dispatch_kubeflow.Backend {self._client.server} namespace={self.settings.namespace!r} {self.mode}>"

    @property
    def name(self) -> str:
        return NAME

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
        return self._capabilities(inspect_runtime(runtime).max_nodes)

    async def _checked_runtime(self, spec: JobSpec) -> dict[str, Any]:
        if not isinstance(spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(spec).__name__}", path="spec")
        _, ref, _ = job_extensions(spec)
        reasons = unsupported_extensions(spec, self.settings)
        ns = self.settings.runtime_namespace(ref.kind)
        where = f'{ref.kind} "{ref.runtime}"'
        try:
            runtime = await self._client.get_or_none(
                runtime_path(ref.kind, ref.runtime, ns), what=f"get {where}"
            )
        except (ApiStatus, Unreachable) as exc:
            raise exc.to_error(f"get {where}") from None
        if runtime is None:
            place = f" in namespace {ns!r}" if ns else ""
            reasons.append(f"{where} was not found{place}")
            raise UnsupportedError(reasons)
        reasons += check_runtime(runtime, spec, kind=ref.kind)
        if reasons:
            raise UnsupportedError(reasons)
        return runtime

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
            spec, identity, self.settings, inspect_runtime(runtime), held=held, kueue=self.queueing
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
        return Handle(NAME, identity, f"{self.settings.namespace}/{name}")

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
            await self._client.create(path, obj, what=what)
            _log.info("created TrainJob %s/%s for %s", self.settings.namespace, name, identity)
            return self._handle(identity, name)
        except ApiStatus as exc:
            if exc.code != 409 or exc.reason != "AlreadyExists":
                raise exc.to_error(what) from None
        except Unreachable as exc:
            # The create may have landed; the identity lookup settles it when the cluster answers.
            try:
                existing = await self._client.get_or_none(
                    trainjob_path(self.settings.namespace, name), what=what
                )
            except (ApiStatus, Unreachable):
                raise exc.to_error(what) from None
            if existing is None:
                raise exc.to_error(what) from None
            return self._adopt(existing, identity, name)
        existing = await self._get(name, what=f'get TrainJob "{name}"')
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
        _log.info("adopted existing TrainJob %s/%s for %s", self.settings.namespace, name, identity)
        return self._handle(identity, name)

    async def _get(self, name: str, *, what: str) -> dict[str, Any] | None:
        try:
            return await self._client.get_or_none(trainjob_path(self.settings.namespace, name), what=what)
        except (ApiStatus, Unreachable) as exc:
            raise exc.to_error(what) from None

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

    async def _pods(self, selector: str) -> list[dict[str, Any]]:
        path = resource_path("", "v1", "pods", namespace=self.settings.namespace)
        try:
            return await self._client.list(path, what="list pods", label_selector=selector)
        except ApiStatus as exc:
            if exc.code in (401, 403):
                return []  # pods unreadable with these credentials: read the TrainJob alone
            raise exc.to_error("list pods") from None
        except Unreachable as exc:
            raise exc.to_error("list pods") from None

    async def observe(self, handle: Handle) -> Observation:
        """The state of the incarnation as its TrainJob and pods show it now; a TrainJob that is gone is
        reported ``lost``."""
        name = self._name_of(handle)
        obj = await self._get(name, what=f'get TrainJob "{handle.ref}"')
        if obj is None:
            gone = cancelled(name) if handle.ref in self._stopped else lost(name)
            return Observation(handle, gone, self._clock.now())
        self._check_owner(obj, handle)
        labels = naming.identity_labels(handle.identity)
        pods = await self._pods(
            f"{LABEL_JOB_HASH}={labels[LABEL_JOB_HASH]},{LABEL_INCARNATION}={labels[LABEL_INCARNATION]}"
        )
        return Observation(handle, outcome_of(obj, pods), self._clock.now())

    async def stop(self, handle: Handle) -> None:
        """Delete the incarnation's TrainJob with foreground propagation (its JobSet and pods go with it).
        Idempotent: a TrainJob already gone is fine. Returns before the pods are gone."""
        self._refuse_writes(f"stop {handle}")
        name = self._name_of(handle)
        obj = await self._get(name, what=f'get TrainJob "{handle.ref}"')
        if obj is None:
            return
        self._check_owner(obj, handle)
        self._stopped.add(handle.ref)
        what = f'delete TrainJob "{handle.ref}"'
        try:
            await self._client.delete(
                trainjob_path(self.settings.namespace, name),
                what=what,
                propagation="Foreground",
                uid=obj["metadata"].get("uid"),
            )
        except ApiStatus as exc:
            if exc.code == 404:
                return
            raise exc.to_error(what) from None
        except Unreachable as exc:
            raise exc.to_error(what) from None

    async def list(self) -> list[Observation]:
        """An observation of every TrainJob in the namespace that carries dispatch's identity. Objects whose
        marks are inconsistent are skipped with a warning."""
        what = f"list TrainJobs in namespace {self.settings.namespace!r}"
        try:
            items = await self._client.list(
                trainjob_path(self.settings.namespace), what=what, label_selector=_SELECTOR
            )
        except (ApiStatus, Unreachable) as exc:
            raise exc.to_error(what) from None
        pods_by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in await self._pods(_SELECTOR):
            labels = pod.get("metadata", {}).get("labels", {})
            pods_by_key.setdefault(
                (labels.get(LABEL_JOB_HASH, ""), labels.get(LABEL_INCARNATION, "")), []
            ).append(pod)
        now = self._clock.now()
        out: list[Observation] = []
        for obj in items:
            try:
                identity = naming.identity_of(obj)
            except ConflictError as exc:
                _log.warning("skipping a TrainJob with inconsistent dispatch marks: %s", exc)
                continue
            if identity is None:
                continue
            labels = obj.get("metadata", {}).get("labels", {})
            pods = pods_by_key.get((labels.get(LABEL_JOB_HASH, ""), labels.get(LABEL_INCARNATION, "")), [])
            handle = self._handle(identity, obj["metadata"]["name"])
            out.append(Observation(handle, outcome_of(obj, pods), now))
        return out

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        if not self._closed:
            self._closed = True
            await self._client.close()

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
            outcome = outcome_of(obj)
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
                await self._client.patch(trainjob_path(self.settings.namespace, name), body, what=what)
            except ApiStatus as exc:
                if exc.code == 409:
                    continue  # changed under us: read again (someone else's hold is then returned)
                raise exc.to_error(what) from None
            except Unreachable as exc:
                raise exc.to_error(what) from None
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
        assert obj is not None
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": pointer(ANNOTATION_HOLD), "value": token},
            {"op": "remove", "path": pointer(ANNOTATION_HOLD)},
        ]
        if not self.queueing:
            ops.append({"op": "add", "path": "/spec/suspend", "value": False})
        try:
            await self._client.patch(
                trainjob_path(self.settings.namespace, name),
                ops,
                what=what,
                content_type="application/json-patch+json",
            )
        except ApiStatus as exc:
            if exc.code in (404, 409, 422):
                # The test op failed (or the object went): tell a stale hold from another refusal.
                self._check_hold(await self._get(name, what=what), handle, token, what)
            raise exc.to_error(what) from None
        except Unreachable as exc:
            raise exc.to_error(what) from None
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

    # --- IdentityWeakener ----------------------------------------------------------------------------

    def native_name(self, identity: Identity) -> str:
        """The TrainJob name of ``identity`` (see :func:`dispatch_kubeflow.naming.native_name`)."""
        return naming.native_name(identity)

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        """The identity a TrainJob carries, ``None`` if none; ``ConflictError`` if inconsistent."""
        return naming.identity_of(obj)
