"""The Simulator: store + controllers + HTTP server + logs + faults + request log, on one event loop.

    async with Simulator() as sim:             # ManualClock, default controllers and fixtures
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        ...                                    # talk to sim.url over HTTP
        await sim.settle()                     # run controllers until nothing is pending
        sim.advance(30)                        # move simulated time, firing timers in order

With a ``RealClock`` a background task runs the controllers continuously; with any clock the server
runs them after each successful write request.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import ssl
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from kubesim import admission
from kubesim.auth import ADMIN, Authenticator, Permissions
from kubesim.behaviour import Behaviours
from kubesim.clock import Clock, ManualClock
from kubesim.events import DEFAULT_EVENT_TTL, EventRecorder, EventTTL
from kubesim.eventsv1 import legacy_event_admission
from kubesim.faults import Faults
from kubesim.kubeconfig import write_kubeconfig as _write_kubeconfig
from kubesim.logs import PodLogs
from kubesim.requestlog import RequestLog
from kubesim.resources import EVENTS, PODS
from kubesim.server import ApiServer
from kubesim.store import ObjectStore, WatchEvent
from kubesim.tls import SelfSignedCert, make_self_signed

if TYPE_CHECKING:
    from kubesim.controllers.actions import Actions
    from kubesim.controllers.processes import ProcessMode

__all__ = ["ADMIN_TOKEN", "Controller", "SettleError", "Simulator"]

log = logging.getLogger(__name__)

#: Pass as ``token=`` to mean "the admin identity's token" (identity names are accepted there too).
ADMIN_TOKEN = ADMIN


class Controller(Protocol):
    """What the simulator needs from a controller."""

    name: str

    def attach(self, sim: Simulator) -> None: ...

    def pending(self) -> bool: ...

    def run_once(self) -> bool: ...


class SettleError(RuntimeError):
    """Controllers kept finding work after ``max_rounds`` rounds."""


class Simulator:
    """An in-process Kubernetes API: see the module docstring."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        controllers: Sequence[Controller] | None = None,
        tokens: Mapping[str, Permissions] | None = None,
        kueue: bool = True,
        nodes: Any = None,
        install_runtimes: bool = True,
        tls: bool = False,
        history_limit: int = 10_000,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 10.0,
        watch_timeout: float = 1800.0,
        request_log_size: int = 100_000,
        disabled_groups: Iterable[str] = (),
        anonymous_auth: bool = True,
        event_ttl: float = DEFAULT_EVENT_TTL,
        recreate_jobset_while_deleting: bool = True,
        node_recovery: str | None = None,
        node_recovery_after: float = 60.0,
        processes: ProcessMode | None = None,
    ) -> None:
        self.clock: Clock = clock if clock is not None else ManualClock()
        self.store = ObjectStore(self.clock, history_limit=history_limit)
        # The installed CRDs' defaults, schema and CEL rules belong to the API server, so they hold with
        # any controllers (or none); webhooks come with the controllers that install them.
        admission.install_crds(self.store, self.clock)
        # The Event registry's validation (pkg/apis/core/validation/events.go), for every Event write.
        self.store.add_admission(EVENTS, legacy_event_admission)
        self.logs = PodLogs(self.clock)
        # The API server forgets Events event_ttl seconds after their last write (--event-ttl); the
        # components' Events go through client-go's correlator.
        self.event_ttl = EventTTL(self.store, self.clock, event_ttl)
        self.recorder = EventRecorder(self.store, self.clock)
        self.faults = Faults()
        self.faults.on_compact(self.store.compact)
        self.requests = RequestLog(request_log_size)
        self.auth = Authenticator([Permissions.admin(), Permissions.readonly()])
        for tok, perms in (tokens or {}).items():
            self.auth.add(perms, tok)
        # As kube-apiserver's --anonymous-auth (default on): a request without credentials is
        # system:anonymous and gets 403 from authorization; off, it is 401.
        self.anonymous_auth = anonymous_auth
        self.kueue = kueue
        # Trainer v2.3.0's behaviour: while a TrainJob is deleted in the foreground its JobSet comes back
        # after each garbage collection, so the deletion never finishes (read by the Trainer controller).
        self.recreate_jobset_while_deleting = recreate_jobset_while_deleting
        # What a lost node's machine does later: None (stays lost), "reboot" or "replace" (an autoscaler).
        if node_recovery not in (None, "reboot", "replace"):
            raise ValueError(f"node_recovery must be None, 'reboot' or 'replace', got {node_recovery!r}")
        if node_recovery_after < 0:
            raise ValueError(f"node_recovery_after must be >= 0 seconds, got {node_recovery_after}")
        self.node_recovery = node_recovery
        self.node_recovery_after = node_recovery_after
        # The kubelet's processes mode: pods without a behaviour script run their command as local
        # processes (read by the kubelet and the volume provisioner at attach).
        self.processes = processes
        # API groups this cluster does not serve (as if their CRDs were not installed); without Kueue
        # the kueue.x-k8s.io group is absent from discovery, like on a cluster without Kueue.
        self.disabled_groups: set[str] = set(disabled_groups)
        if not kueue:
            self.disabled_groups.add("kueue.x-k8s.io")
        self.nodes = nodes
        self.install_runtimes = install_runtimes
        self.tls = tls
        self.cert: SelfSignedCert | None = None
        self._host, self._port = host, port
        self.server = ApiServer(self, bookmark_interval=bookmark_interval, watch_timeout=watch_timeout)
        self.url = ""
        self._kick_handle: asyncio.Handle | None = None
        self._background: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self.controller_errors: list[str] = []
        # Scripts for pods, by name or predicate, read by the kubelet before the pod's KUBESIM_SCRIPT env.
        self.behaviours = Behaviours()
        self.store.subscribe(self._on_pod_event, rt=PODS)
        default = controllers is None
        self.controllers: list[Controller] = (
            list(controllers) if controllers is not None else _default_controllers(self)
        )
        for c in self.controllers:
            c.attach(self)
        if default:
            _install_fixtures(self)

    @property
    def actions(self) -> Actions:
        """Direct disruptions for tests (preempt, evict, OOM, exit, lose or restore a node), acting at once
        through the kubelet controller; :class:`RuntimeError` when this simulator runs no kubelet."""
        from kubesim.controllers.actions import Actions
        from kubesim.controllers.kubelet import KubeletController

        for c in self.controllers:
            if isinstance(c, KubeletController):
                return Actions(c)
        raise RuntimeError("this Simulator runs no kubelet controller, so it has no actions")

    def __repr__(self) -> str:
        return (
            f"Simulator(url={self.url or 'not started'!r}, clock={self.clock!r}, "
            f"controllers={[c.name for c in self.controllers]}, identities={self.auth.identities()})"
        )

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the HTTP server (and, with a real clock, the background controller loop)."""
        ctx: ssl.SSLContext | None = None
        if self.tls:
            self.cert = make_self_signed(self._host)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            with tempfile.TemporaryDirectory(prefix="kubesim-tls-") as d:
                cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
                cert.write_bytes(self.cert.cert_pem)
                fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(self.cert.key_pem)
                ctx.load_cert_chain(str(cert), str(key))
        self.url = await self.server.start(self._host, self._port, ctx)
        # A real API server's watch cache starts from a list at its start: a watch from any earlier
        # resourceVersion (here: the fixtures' writes, made before serving) is answered 410 Expired.
        self.store.expire_before(self.store.resource_version)
        self.event_ttl.arm_pending()
        self._wake = asyncio.Event()
        if not isinstance(self.clock, ManualClock):
            self._background = asyncio.create_task(self._run_background(), name="kubesim-controllers")

    async def stop(self) -> None:
        """Stop the background loop and the HTTP server (ending open watches and log streams)."""
        if self._kick_handle is not None:
            self._kick_handle.cancel()
            self._kick_handle = None
        if self._background is not None:
            self._background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._background
            self._background = None
        for c in self.controllers:  # the kubelet's processes end with the cluster
            close = getattr(c, "close", None)
            if close is not None:
                await close()
        self.logs.end_followers()
        await self.server.stop()

    async def __aenter__(self) -> Simulator:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------------------- running

    def pending(self) -> bool:
        """Whether any controller has queued work."""
        return any(c.pending() for c in self.controllers)

    def settle_now(self, *, max_rounds: int = 10_000) -> int:
        """Run controllers until none has work (synchronously); returns the number of rounds."""
        rounds = 0
        while True:
            busy = [c for c in self.controllers if c.pending()]
            if not busy:
                return rounds
            rounds += 1
            if rounds > max_rounds:
                raise SettleError(
                    f"controllers did not settle after {max_rounds} rounds; still pending: {[c.name for c in busy]}"
                )
            for c in busy:
                c.run_once()

    async def settle(self, *, max_rounds: int = 10_000) -> None:
        """Run controllers until quiescent, then let the event loop deliver what they wrote."""
        self.settle_now(max_rounds=max_rounds)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """ManualClock only: move time forward, firing each timer at its time and settling after each."""
        clock = self.clock
        if not isinstance(clock, ManualClock):
            raise TypeError(f"Simulator.advance needs a ManualClock, this simulator runs on {clock!r}")
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        target = clock.now() + seconds
        self.settle_now()
        while True:
            nxt = clock.next_timer()
            if nxt is None or nxt > target:
                break
            clock.advance(max(0.0, nxt - clock.now()))
            self.settle_now()
        clock.advance(max(0.0, target - clock.now()))
        self.settle_now()

    def kick(self) -> None:
        """Ask for a controller run soon (the server calls this after each successful write)."""
        if self._wake is not None:
            self._wake.set()
        if self._background is None and self._kick_handle is None and self.controllers:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._kick_handle = loop.call_soon(self._kicked)

    def _kicked(self) -> None:
        self._kick_handle = None
        try:
            self.settle_now()
        except Exception as exc:  # keep serving; tests see it in controller_errors
            log.exception("kubesim: controllers failed")
            self.controller_errors.append(f"{type(exc).__name__}: {exc}")

    async def _run_background(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.05)
            self._wake.clear()
            try:
                self.settle_now()
            except Exception as exc:
                log.exception("kubesim: controllers failed")
                self.controller_errors.append(f"{type(exc).__name__}: {exc}")

    def _on_pod_event(self, ev: WatchEvent) -> None:
        if ev.type == "DELETED":
            m = ev.obj["metadata"]
            self.logs.forget(m.get("namespace", ""), m["name"])

    # -------------------------------------------------------------------------- credentials

    def token(self, name: str) -> str:
        """The bearer token of identity ``name`` ("admin", "readonly" or one given in ``tokens``)."""
        return self.auth.token(name)

    def add_identity(self, perms: Permissions, token: str | None = None) -> str:
        """Register another identity after construction; returns its token."""
        return self.auth.add(perms, token)

    def write_kubeconfig(
        self, path: str | os.PathLike[str], *, token: str = ADMIN_TOKEN, namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig for this (started) simulator. ``token`` is an identity name ("admin",
        "readonly", ...) or a literal bearer token."""
        if not self.url:
            raise RuntimeError("Simulator.write_kubeconfig: start the simulator first (await sim.start())")
        user = "kubesim"
        if token in self.auth.identities():
            user = token
            token = self.auth.token(token)
        ca = self.cert.cert_pem if self.cert is not None else None
        return _write_kubeconfig(path, self.url, token, ca_pem=ca, namespace=namespace, user=user)


def _default_controllers(sim: Simulator) -> list[Controller]:
    try:
        pkg = importlib.import_module("kubesim.controllers")
    except ImportError:
        log.warning("kubesim.controllers is not available: running without controllers")
        return []
    factory = getattr(pkg, "default_controllers", None)
    if factory is None:
        log.warning("kubesim.controllers has no default_controllers(): running without controllers")
        return []
    params = inspect.signature(factory).parameters
    kwargs: dict[str, Any] = {}
    for key, value in (
        ("kueue", sim.kueue),
        ("nodes", sim.nodes),
        ("install_runtimes", sim.install_runtimes),
    ):
        if key in params:
            kwargs[key] = value
    result: list[Controller] = list(factory(**kwargs))
    return result


def _install_fixtures(sim: Simulator) -> None:
    try:
        fixtures = importlib.import_module("kubesim.fixtures")
    except ImportError:
        return
    install = getattr(fixtures, "install", None)
    if install is not None:
        install(sim)
