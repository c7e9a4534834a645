"""Prometheus metrics of the supervisor and ``dispatch-admission``: declared once, served on request.

Every metric is declared in :data:`METRICS` (name, kind, help, labels); the docs table in
``docs/operations.md`` is generated from it and a test keeps the two identical. Label values come from
small closed sets (states, causes, verbs, resources, status classes, kinds) — never a job id — so the
number of series stays bounded however many jobs run.

Instrumented code calls :func:`current` and records through the object it returns: a no-op
:class:`Metrics` until a host calls :func:`enable` (``dispatch supervise --metrics-address``), so
library users pay nothing and need no extra package. ``prometheus-client`` is the optional extra
``dispatch-train[metrics]``; it is imported only by :func:`enable`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from msgspec import Struct

from dispatch.errors import InvalidError, UnsupportedError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["DAEMONS", "METRICS", "Metric", "Metrics", "current", "disable", "enable", "status_class"]

# Seconds: from a millisecond to a few minutes (event→record lag, API latency, supervisor steps).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metric(Struct, frozen=True):
    """One metric's declaration (Prometheus naming: ``dispatch_`` prefix, ``_total`` counters, seconds)."""

    name: str
    kind: str  # "counter", "gauge" or "histogram"
    help: str
    labels: tuple[str, ...] = ()
    daemons: tuple[str, ...] = ("supervisor",)  # which daemons export it (see DAEMONS)


DAEMONS = ("supervisor", "admission")
"""The daemons that export metrics; each exports only the metrics that name it."""
_BOTH = DAEMONS

METRICS: tuple[Metric, ...] = (
    Metric(
        "dispatch_jobs",
        "gauge",
        "Job records in the store by coarse state (store-wide; as of the last resync, every 60 s by default).",
        ("state",),
    ),
    Metric(
        "dispatch_jobs_starting_oldest_seconds",
        "gauge",
        "How long the job starting longest has been starting (store-wide; 0 when none is).",
        (),
    ),
    Metric(
        "dispatch_outcomes_total",
        "counter",
        "Jobs that reached a terminal outcome, by state and cause.",
        ("state", "cause"),
    ),
    Metric(
        "dispatch_requeues_total",
        "counter",
        "Automatic requeues, by the cause and the policy rule that allowed them.",
        ("cause", "rule"),
    ),
    Metric("dispatch_incarnations_started_total", "counter", "Incarnations placed on the cluster.", ()),
    Metric(
        "dispatch_api_requests_total",
        "counter",
        "Requests to the cluster API, by verb, resource and status class (429 on its own).",
        ("verb", "resource", "status"),
        _BOTH,
    ),
    Metric(
        "dispatch_api_request_duration_seconds",
        "histogram",
        "Latency of requests to the cluster API.",
        ("verb", "resource"),
        _BOTH,
    ),
    Metric(
        "dispatch_watch_restarts_total",
        "counter",
        "Watch streams restarted, by kind and reason (dropped, expired, error).",
        ("kind", "reason"),
        _BOTH,
    ),
    Metric(
        "dispatch_watch_relists_total",
        "counter",
        "Full relists after an expired resourceVersion, by kind.",
        ("kind",),
        _BOTH,
    ),
    Metric(
        "dispatch_event_record_lag_seconds",
        "histogram",
        "Time from a cluster observation to its record write.",
        (),
    ),
    Metric("dispatch_leases_held", "gauge", "Records this process holds a lease on.", ()),
    Metric("dispatch_leases_taken_over_total", "counter", "Expired leases of another holder taken over.", ()),
    Metric("dispatch_leases_lost_total", "counter", "Leases this process lost before it released them.", ()),
    Metric(
        "dispatch_store_conflicts_total",
        "counter",
        "Record writes refused as stale (compare-and-swap conflicts).",
        (),
    ),
    Metric("dispatch_store_errors_total", "counter", "Store calls of the supervisor that failed.", ()),
    Metric("dispatch_supervisor_step_duration_seconds", "histogram", "Duration of one supervisor step.", ()),
    Metric(
        "dispatch_admission_checks_total",
        "counter",
        "Admission check states written by dispatch-admission.",
        ("state",),
        ("admission",),
    ),
    Metric(
        "dispatch_admission_leader",
        "gauge",
        "1 while this dispatch-admission replica is the leader.",
        (),
        ("admission",),
    ),
)
"""Every metric dispatch exposes."""

_BY_NAME = {m.name: m for m in METRICS}


def status_class(code: int) -> str:
    """An HTTP status as its class (``2xx``…), ``429`` on its own (throttling is not the caller's
    fault, unlike the rest of ``4xx``: the API alert counts it), or ``error`` when no answer came."""
    if code == 429:
        return "429"
    return f"{code // 100}xx" if 100 <= code < 600 else "error"


class Metrics:
    """Records metrics. This base class records nothing: see :func:`enable`."""

    enabled = False

    def inc(self, name: str, labels: Mapping[str, str] | None = None, amount: float = 1.0) -> None:
        """Add ``amount`` to counter ``name``."""

    def set(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        """Set gauge ``name``."""

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        """Observe ``value`` in histogram ``name``."""

    def set_all(self, name: str, label: str, values: Mapping[str, float], every: Iterable[str] = ()) -> None:
        """Set gauge ``name`` for each value of ``label`` (``every`` listed values default to 0)."""

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return b""


class _Unexported:
    """A declared metric this daemon does not export: recording it does nothing."""

    def inc(self, amount: float = 1.0) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


_UNEXPORTED = _Unexported()


class _Prometheus(Metrics):
    enabled = True

    def __init__(self, daemon: str | None = None) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError:  # pragma: no cover - depends on the installation
            raise UnsupportedError(
                "metrics need the prometheus-client package: pip install 'dispatch-train[metrics]'"
            ) from None
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=True)
        self._m: dict[str, Any] = {}
        # A daemon exports only its own metrics: no constant zeros for the other daemon's series.
        for m in METRICS if daemon is None else [m for m in METRICS if daemon in m.daemons]:
            # prometheus-client appends _total to counters itself: declare them without it.
            if m.kind == "counter":
                self._m[m.name] = Counter(
                    m.name.removesuffix("_total"), m.help, m.labels, registry=self.registry
                )
            elif m.kind == "gauge":
                self._m[m.name] = Gauge(m.name, m.help, m.labels, registry=self.registry)
            else:
                self._m[m.name] = Histogram(
                    m.name, m.help, m.labels, buckets=_BUCKETS, registry=self.registry
                )
        self._server: Any = None
        self._children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}

    def _child(self, name: str, labels: Mapping[str, str] | None) -> Any:
        # Label sets are few (bounded by design): remember each series, so recording is one dict lookup.
        key = (name, tuple(labels.items()) if labels else ())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child(name, labels)
        return child

    def _new_child(self, name: str, labels: Mapping[str, str] | None) -> Any:
        decl = _BY_NAME.get(name)
        if decl is None:
            raise InvalidError(f"no metric named {name!r}", path="name")
        metric = self._m.get(name)
        if metric is None:  # shared code (the Kubernetes layer) records what only the other daemon exports
            return _UNEXPORTED
        if not decl.labels:
            return metric
        given = dict(labels or {})
        if set(given) != set(decl.labels):
            raise InvalidError(f"{name} takes labels {list(decl.labels)}, got {sorted(given)}", path="labels")
        return metric.labels(**given)

    def inc(self, name: str, labels: Mapping[str, str] | None = None, amount: float = 1.0) -> None:
        self._child(name, labels).inc(amount)

    def set(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        self._child(name, labels).set(value)

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        self._child(name, labels).observe(value)

    def set_all(self, name: str, label: str, values: Mapping[str, float], every: Iterable[str] = ()) -> None:
        for key in {*every, *values}:
            self.set(name, values.get(key, 0.0), {label: key})

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics``, ``/healthz`` and ``/readyz`` (:mod:`dispatch.health`) on ``host:port``
        (a background thread); return the bound port."""
        from dispatch.health import serve

        self._server = serve(host, port, self.exposition)
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


_NULL = Metrics()
_current: Metrics = _NULL


def current() -> Metrics:
    """The process's metrics: a no-op unless :func:`enable` was called."""
    return _current


def enable(address: str | None = None, *, daemon: str | None = None) -> Metrics:
    """Start recording metrics in this process and, with ``address`` (``host:port``; port 0 picks a free
    one), serve them over HTTP at ``/metrics`` (with the health probes). ``daemon`` (one of
    :data:`DAEMONS`) exports only that daemon's metrics; ``None`` exports all. Returns the recorder;
    :func:`disable` undoes it."""
    global _current
    if _current.enabled:
        return _current
    if daemon is not None and daemon not in DAEMONS:
        raise InvalidError(f"expected one of {', '.join(DAEMONS)}, got {daemon!r}", path="daemon")
    recorder = _Prometheus(daemon)
    if address is not None:
        host, port = _address(address)
        recorder.serve(host, port)
    _current = recorder
    return recorder


def disable() -> None:
    """Stop recording (and serving) metrics."""
    global _current
    if isinstance(_current, _Prometheus):
        _current.close()
    _current = _NULL


def served_port() -> int | None:
    """The port metrics are served on, if they are."""
    server = getattr(_current, "_server", None)
    return int(server.server_address[1]) if server is not None else None


def _address(text: str) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidError(f"expected HOST:PORT (e.g. 127.0.0.1:9464), got {text!r}", path="metrics-address")
    return host.strip("[]") or "127.0.0.1", int(port)
