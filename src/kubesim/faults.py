"""Fault injection for the API server: latency, 429/500 answers, dropped watches, lagging watches,
compacted history, unavailable admission webhooks.

Reachable as ``sim.faults``. Faults apply to HTTP requests only (controllers talk to the store directly).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kubesim.errors import ApiError, internal, too_many_requests

__all__ = ["Faults", "Predicate"]

Predicate = Callable[[str, str], bool]  # (verb, path) -> applies?


@dataclass
class _Failure:
    remaining: int
    code: int
    verb: str | None
    path: re.Pattern[str] | None
    predicate: Predicate | None
    retry_after: int
    message: str

    def matches(self, verb: str, path: str) -> bool:
        if self.verb is not None and verb != self.verb:
            return False
        if self.path is not None and not self.path.search(path):
            return False
        return self.predicate is None or self.predicate(verb, path)


class Faults:
    """What the next requests should suffer. All knobs are plain attributes/methods; ``clear()`` resets."""

    def __init__(self) -> None:
        self.latency: float = 0.0  # seconds of real time added to every request
        self._failures: list[_Failure] = []
        self._losses: list[_Failure] = []
        self._warnings: list[_Failure] = []
        self._drop_listeners: list[Callable[[bool], None]] = []
        self._compact: Callable[[], None] | None = None
        self.injected = 0  # how many requests were failed on purpose
        self._webhooks_down: dict[str, str] = {}  # component -> the error of calling its webhooks
        self._lagging: list[re.Pattern[str]] = []

    def __repr__(self) -> str:
        return f"Faults(latency={self.latency}, pending_failures={sum(f.remaining for f in self._failures)})"

    def set_latency(self, seconds: float) -> None:
        """Delay every request by ``seconds`` (real time) before it is handled."""
        if seconds < 0:
            raise ValueError(f"latency must be >= 0, got {seconds}")
        self.latency = seconds

    def fail_next(
        self,
        n: int = 1,
        code: int = 429,
        *,
        verb: str | None = None,
        path: str | None = None,
        predicate: Predicate | None = None,
        retry_after: int = 1,
        message: str = "injected fault",
    ) -> None:
        """Answer the next ``n`` matching requests with ``code`` (429 with Retry-After, or 500/503/...).

        ``verb`` is the Kubernetes verb (get/list/watch/create/update/patch/delete/deletecollection);
        ``path`` a regular expression searched in the URL path; ``predicate(verb, path)`` anything else."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if code < 400 or code > 599:
            raise ValueError(f"code must be an HTTP error status (400-599), got {code}")
        self._failures.append(
            _Failure(n, code, verb, re.compile(path) if path else None, predicate, retry_after, message)
        )

    def check(self, verb: str, path: str) -> ApiError | None:
        """The error to answer for this request instead of handling it, if a fault applies."""
        for f in self._failures:
            if f.remaining > 0 and f.matches(verb, path):
                f.remaining -= 1
                if f.remaining == 0:
                    self._failures.remove(f)
                self.injected += 1
                if f.code == 429:
                    return too_many_requests(f.retry_after)
                if f.code == 500:
                    return internal(f.message)
                err = ApiError(
                    f.code,
                    {503: "ServiceUnavailable", 504: "Timeout"}.get(f.code, "InternalError"),
                    f.message,
                )
                if f.code == 503:
                    err.details = {"retryAfterSeconds": f.retry_after}
                return err
        return None

    def lose_response_next(
        self,
        n: int = 1,
        *,
        verb: str | None = None,
        path: str | None = None,
        predicate: Predicate | None = None,
    ) -> None:
        """Handle the next ``n`` matching requests normally, then cut the connection instead of answering:
        the write happened, the client cannot know it (for "outcome unknown" handling)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self._losses.append(_Failure(n, 0, verb, re.compile(path) if path else None, predicate, 0, ""))

    def should_lose_response(self, verb: str, path: str) -> bool:
        """Whether this (already handled) request's response is to be lost."""
        for f in self._losses:
            if f.remaining > 0 and f.matches(verb, path):
                f.remaining -= 1
                if f.remaining == 0:
                    self._losses.remove(f)
                self.injected += 1
                return True
        return False

    def warn_next(self, text: str, n: int = 1, *, verb: str | None = None, path: str | None = None) -> None:
        """Answer the next ``n`` matching successful requests with a ``Warning: 299 - "<text>"`` header, as
        an API server does for a deprecated API or a field it dropped under ``fieldValidation=Warn``."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self._warnings.append(_Failure(n, 0, verb, re.compile(path) if path else None, None, 0, text))

    def warnings_for(self, verb: str, path: str) -> list[str]:
        """The warning texts to attach to this (successful) request's answer."""
        out = []
        for f in list(self._warnings):
            if f.remaining > 0 and f.matches(verb, path):
                f.remaining -= 1
                if f.remaining == 0:
                    self._warnings.remove(f)
                out.append(f.message)
        return out

    def retry_after(self, err: ApiError) -> int | None:
        if err.details and "retryAfterSeconds" in err.details:
            return int(err.details["retryAfterSeconds"])
        return None

    def on_drop(self, fn: Callable[[bool], None]) -> None:
        """Register the server's watch-dropping callback."""
        self._drop_listeners.append(fn)

    def on_compact(self, fn: Callable[[], None]) -> None:
        self._compact = fn

    def drop_watches(self, *, abort: bool = False) -> None:
        """End every open watch stream now: cleanly (the response ends), or ``abort=True`` to cut the
        connection mid-stream."""
        for fn in list(self._drop_listeners):
            fn(abort)

    def lag_watches(self, path: str) -> None:
        """Hold back the changes every watch whose URL path matches ``path`` would deliver, until
        :meth:`catch_up`: they arrive late but in order, as from an API server whose watch cache for one
        resource lags behind etcd. Each resource is its own stream, so a real client has no order across
        kinds (client-go's informers make none): a Job's failure can arrive before its pod's."""
        self._lagging.append(re.compile(path))

    def catch_up(self) -> None:
        """Deliver what lagging watches held back, and stop holding."""
        self._lagging.clear()

    def lagging(self, path: str) -> bool:
        """Whether a watch of ``path`` holds its changes back now."""
        return any(p.search(path) for p in self._lagging)

    def compact(self) -> None:
        """Drop the watch history now: resuming from an older resourceVersion is answered 410 Expired."""
        if self._compact is not None:
            self._compact()

    def webhooks_unavailable(
        self,
        component: str = "trainer",
        *,
        error: str = "dial tcp 10.96.183.62:443: connect: connection refused",
    ) -> None:
        """Make ``component``'s admission webhooks unreachable (its controller is down): every write they
        intercept — from clients and controllers alike — is answered 500 ``Internal error occurred: failed
        calling webhook "<name>": failed to call webhook: Post "<url>": <error>``, as the API server
        answers for a ``failurePolicy: Fail`` webhook it cannot call. Components: ``trainer``."""
        if component != "trainer":
            raise ValueError(f"no webhooks of {component!r} are simulated; components: trainer")
        self._webhooks_down[component] = error

    def webhooks_available(self, component: str = "trainer") -> None:
        """``component``'s webhooks answer again."""
        self._webhooks_down.pop(component, None)

    def webhook_error(self, component: str) -> str | None:
        """The error of calling ``component``'s webhooks now, or None when they answer."""
        return self._webhooks_down.get(component)

    def clear(self) -> None:
        """Remove latency, pending failures, lagging watches and unavailable webhooks."""
        self._webhooks_down.clear()
        self._lagging.clear()
        self.latency = 0.0
        self._failures.clear()
        self._losses.clear()
        self._warnings.clear()
