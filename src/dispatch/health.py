"""Health of a daemon (``dispatch supervise``, ``dispatch-admission``) for Kubernetes' probes.

The daemon marks what it just did successfully — ``loop`` (its main loop turned), ``store`` (a store
call answered), ``cluster`` (the cluster API answered) — and says how long each may go unmarked
(:meth:`Health.expect`). ``/healthz`` (liveness) is ok while the loop turns; ``/readyz`` (readiness)
while every expectation holds. For liveness a check never marked since it was expected counts from the
expectation, so a daemon starting up is given the same grace; for readiness it fails until it passed
once (a daemon is not ready before its first turn of the loop read the store and the cluster). Time is
the monotonic clock: probes are about this process, not about the simulated clocks of tests. A daemon
that knows it is not ready (reconnecting to its cluster, or its cluster does not answer) says why with
:meth:`Health.block` until :meth:`Health.unblock`.

:func:`reconnect_delay` is the capped, jittered backoff of a daemon's reconnects.

:func:`serve` answers the probes beside ``/metrics`` on the metrics address.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["LIVENESS", "Health", "current", "reconnect_delay", "serve"]

RECONNECT_BASE = 1.0
RECONNECT_CAP = 30.0


def reconnect_delay(
    attempt: int,
    *,
    base: float = RECONNECT_BASE,
    cap: float = RECONNECT_CAP,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before reconnect ``attempt`` (0 for the first retry): doubling from ``base``, at
    most ``cap``, then jittered down to half at random, so that daemons that lost the same server do not
    all come back in the same instant."""
    ceiling = min(cap, base * 2 ** min(attempt, 32))
    return float(ceiling * (0.5 + 0.5 * (rng or random).random()))


LIVENESS = "loop"
"""The check ``/healthz`` looks at; ``/readyz`` looks at every expected check."""


class Health:
    """When each check last passed, and how stale each may be."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()  # marked from the event loop, read from the server's threads
        self._within: dict[str, float] = {}
        self._since: dict[str, float] = {}  # when each check was first expected
        self._last: dict[str, float] = {}
        self._blocked = ""  # why the daemon knows it is not ready ("": nothing)

    def block(self, why: str) -> None:
        """The daemon is not ready, and says why (e.g. reconnecting to its cluster)."""
        with self._lock:
            self._blocked = why or "not ready"

    def unblock(self) -> None:
        with self._lock:
            self._blocked = ""

    def expect(self, check: str, within: float) -> None:
        """``check`` must pass at least every ``within`` seconds for the daemon to be ready."""
        with self._lock:
            self._within[check] = float(within)
            self._since.setdefault(check, self._clock())

    def mark(self, check: str) -> None:
        """``check`` passed just now."""
        with self._lock:
            self._last[check] = self._clock()

    def failing(self, checks: tuple[str, ...] | None = None, *, grace: bool = False) -> list[str]:
        """The expected checks (of ``checks``, default all) that are stale, each with how stale; one never
        marked fails, unless ``grace`` counts it from its expectation."""
        now = self._clock()
        out = []
        with self._lock:
            names = sorted(self._within) if checks is None else [c for c in checks if c in self._within]
            for c in names:
                last = self._last.get(c)
                if last is None and not grace:
                    out.append(f"{c}: not ok yet (expected {now - self._since[c]:.0f} s ago)")
                    continue
                last = self._since[c] if last is None else last
                if now - last > self._within[c]:
                    out.append(f"{c}: last ok {now - last:.0f} s ago (allowed {self._within[c]:g} s)")
        return out

    def live(self) -> list[str]:
        """Why the daemon is not alive (empty: it is)."""
        return self.failing((LIVENESS,), grace=True)

    def ready(self) -> list[str]:
        """Why the daemon is not ready (empty: it is). Not before its loop declared what it needs."""
        with self._lock:
            started, blocked = LIVENESS in self._within, self._blocked
        if not started:
            return ["starting: the main loop has not begun"]
        return ([blocked] if blocked else []) + self.failing()


_current = Health()


def current() -> Health:
    """The process's health (one per daemon process)."""
    return _current


def serve(host: str, port: int, metrics: Callable[[], bytes]) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (``metrics()``), ``/healthz`` and ``/readyz`` on ``host:port`` from a daemon
    thread; the caller shuts the server down."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._answer(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
                return
            if path in ("/healthz", "/readyz"):
                why = _current.live() if path == "/healthz" else _current.ready()
                body = ("ok\n" if not why else "\n".join(why) + "\n").encode()
                self._answer(503 if why else 200, body, "text/plain; charset=utf-8")
                return
            self._answer(404, b"not found: /metrics, /healthz, /readyz\n", "text/plain; charset=utf-8")

        def _answer(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds is not worth a log line

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="dispatch-metrics", daemon=True).start()
    return server
