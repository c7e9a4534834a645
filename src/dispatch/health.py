"""A daemon's health over HTTP, beside its ``/metrics``: ``/healthz`` (the process serves: 200 while it
runs) and ``/readyz`` (200 once it is connected to its cluster and store and its last step went through;
503 with the reason while it is reconnecting). Also the capped, jittered backoff of its reconnects.

One small HTTP server (a thread) serves all three paths; :mod:`dispatch.metrics` starts it.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["READINESS", "Readiness", "reconnect_delay", "serve"]

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


class Readiness:
    """Whether the daemon is ready, and why not (thread-safe: the HTTP thread reads it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._why: str = "starting"

    def ready(self) -> None:
        with self._lock:
            self._why = ""

    def not_ready(self, why: str) -> None:
        with self._lock:
            self._why = why or "not ready"

    def state(self) -> tuple[bool, str]:
        with self._lock:
            return not self._why, self._why


READINESS = Readiness()
"""The process's readiness, set by the supervisor daemon (``dispatch supervise``)."""


def serve(
    host: str, port: int, metrics: Callable[[], bytes], readiness: Readiness = READINESS
) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (Prometheus text), ``/healthz`` and ``/readyz`` on ``host:port`` in a daemon
    thread; returns the server (``server_address`` has the bound port; ``shutdown()`` stops it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._answer(200, b"ok\n", "text/plain; charset=utf-8")
            elif path == "/readyz":
                ok, why = readiness.state()
                self._answer(
                    200 if ok else 503, (b"ok" if ok else why.encode()) + b"\n", "text/plain; charset=utf-8"
                )
            elif path == "/metrics":
                self._answer(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._answer(404, b"not found: /metrics, /healthz, /readyz\n", "text/plain; charset=utf-8")

        def _answer(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="dispatch-health", daemon=True).start()
    return server
