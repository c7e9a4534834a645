"""The one module that talks to the Kubernetes API. Everything above it sees plain JSON dicts.

It uses lightkube (``<2``) for what is hard to get right — kubeconfig and in-cluster configuration,
TLS, exec/token-file authentication — and its HTTP client for plain JSON requests, so swapping the
client library means rewriting this module only. It owns the bounded retries (429, 5xx, lost
connections, with doubling backoff) and the last line of the read-only guarantee: in read-only mode
a write is refused here, before anything is sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from dispatch.clock import Clock, SystemClock
from dispatch.config import check_token
from dispatch.errors import DispatchError, InvalidError, ReadOnlyError
from dispatch_kubeflow.errors import is_retryable, map_status, map_transport

__all__ = ["ApiStatus", "KubeClient", "Retry", "Unreachable", "resource_path"]

_log = logging.getLogger(__name__)

# The libraries below this module that log: none of them logs request headers today (httpcore2 logs
# a request as ``<Request [b'GET']>``), but hpack logs the header fields it encodes and decodes, and
# an HTTP library refusing a header may quote it in the exception it logs. Every token in use is cut
# out of their records, at every level, whatever logging configuration the application has.
LIBRARY_LOGGERS = (
    "httpx2", "httpcore2", "httpcore2.connection", "httpcore2.http11", "httpcore2.http2", "httpcore2.proxy",
    "httpcore2.socks", "httpx", "httpcore", "httpcore.connection", "httpcore.http11", "httpcore.http2",
    "httpcore.proxy", "httpcore.socks", "h11", "h2", "h2.connection", "h2.stream", "hpack", "hpack.hpack",
    "hpack.table", "lightkube", "aiohttp", "aiohttp.client", "aiohttp.internal", "asyncio",
)  # fmt: skip


class _Scrub(logging.Filter):
    """Replaces every live token in a log record (message, arguments, exception text) with ``***``."""

    def __init__(self) -> None:
        super().__init__("dispatch-kubeflow-token-scrub")
        self.tokens: dict[str, int] = {}  # token -> clients using it

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.tokens:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: keep its parts, scrubbed, rather than drop it
            text = f"{record.msg} {record.args}"
        clean = self._clean(text)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        exc_text = self._clean(record.exc_text) if record.exc_text else record.exc_text
        if clean != text or exc_text != record.exc_text:
            record.msg, record.args, record.exc_text = clean, None, exc_text
            if exc_text is not None:
                record.exc_info = None  # the text is what a handler prints; the objects hold the token
        return True

    def _clean(self, text: str) -> str:
        for token in self.tokens:
            text = text.replace(token, "***")
        return text

    def install(self) -> None:
        names = set(LIBRARY_LOGGERS)
        roots = {n.split(".")[0] for n in LIBRARY_LOGGERS}
        names.update(n for n in logging.Logger.manager.loggerDict if n.split(".")[0] in roots)
        for name in names:
            logger = logging.getLogger(name)
            if self not in logger.filters:
                logger.addFilter(self)

    def add(self, token: str) -> None:
        self.install()
        self.tokens[token] = self.tokens.get(token, 0) + 1

    def remove(self, token: str) -> None:
        left = self.tokens.get(token, 0) - 1
        if left > 0:
            self.tokens[token] = left
        else:
            self.tokens.pop(token, None)


SCRUB = _Scrub()


@dataclass(frozen=True, slots=True)
class Retry:
    """Bounded retries: ``attempts`` tries in all, sleeping ``base`` seconds doubling up to ``cap``."""

    attempts: int = 5
    base: float = 0.2
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        return float(min(self.cap, self.base * (2**attempt)))


class ApiStatus(Exception):
    """The API server answered with an error status (after retries, for retryable ones)."""

    def __init__(self, code: int, body: Mapping[str, Any] | None) -> None:
        self.code = code
        self.body = body if isinstance(body, Mapping) else None
        reason = self.body.get("reason", "") if self.body else ""
        message = self.body.get("message", "") if self.body else ""
        super().__init__(f"HTTP {code} {reason}: {message}")

    @property
    def reason(self) -> str:
        reason = self.body.get("reason") if self.body else None
        return reason if isinstance(reason, str) else ""

    def to_error(self, what: str) -> DispatchError:
        return map_status(self.code, self.body, what=what)


class Unreachable(Exception):
    """No usable answer after the retries. ``ambiguous``: a write may have reached the server."""

    def __init__(self, detail: str, *, ambiguous: bool) -> None:
        self.detail = detail
        self.ambiguous = ambiguous
        super().__init__(detail)

    def to_error(self, what: str) -> DispatchError:
        return map_transport(what, self.detail, ambiguous_write=self.ambiguous)


def resource_path(
    group: str,
    version: str,
    plural: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection, an object or a subresource."""
    parts = ["api", version] if not group else ["apis", group, version]
    if namespace is not None:
        parts += ["namespaces", quote(namespace, safe="")]
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/" + "/".join(parts)


def _config(kubeconfig: str | None, context: str | None) -> Any:
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.core.exceptions import ConfigError

    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    except ConfigError as exc:
        where = f"kubeconfig {kubeconfig!r}" if kubeconfig else "in-cluster, $KUBECONFIG or ~/.kube/config"
        raise InvalidError(f"no usable cluster configuration ({where}): {exc}", path="kubeconfig") from None
    except Exception as exc:
        # Never echo the file's text: a kubeconfig holds credentials. Name the problem and the line.
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidError(
            f"{kubeconfig or 'the kubeconfig'} could not be read as a kubeconfig ({type(exc).__name__}{line})",
            path="kubeconfig",
        ) from None
    try:
        single = config.get(context)
    except ConfigError as exc:
        raise InvalidError(str(exc), path="context" if context else "kubeconfig") from None
    except KeyError as exc:
        raise InvalidError(f"the kubeconfig refers to a missing entry {exc}", path="kubeconfig") from None
    return single


class KubeClient:
    """JSON requests to one API server, with retries; see the module docstring."""

    def __init__(
        self, http: Any, *, server: str, retry: Retry | None = None, clock: Clock | None = None
    ) -> None:
        self._http = http
        self.server = server
        self.retry = retry or Retry()
        self._clock = clock or SystemClock()
        self.read_only = False
        self.requests = 0
        self._tokens: list[str] = []

    @classmethod
    def connect(
        cls,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        token: str | None = None,
        timeout: float = 10.0,
        retry: Retry | None = None,
        clock: Clock | None = None,
    ) -> KubeClient:
        """Open a client from a kubeconfig (or in-cluster configuration). ``token``, if given, is sent as
        the bearer token on every request instead of the configuration's own credentials."""
        import httpx2 as httpx
        from lightkube.config.client_adapter import BearerAuth, ConnectionParams
        from lightkube.core.exceptions import ConfigError

        single = _config(kubeconfig, context)
        if token is not None:
            check_token(token)
        static = getattr(getattr(single, "user", None), "token", None)
        if isinstance(static, str):
            check_token(static, path="kubeconfig")
        params = ConnectionParams(timeout=httpx.Timeout(timeout))
        try:
            options = params.httpx_params(single)
        except (ConfigError, OSError, AssertionError, ValueError) as exc:  # ValueError: bad base64 data
            raise InvalidError(
                f"the cluster configuration is incomplete ({type(exc).__name__}: {exc})", path="kubeconfig"
            ) from None
        if token is not None:
            options["auth"] = BearerAuth(token)
        http = httpx.AsyncClient(**options)
        client = cls(http, server=str(single.cluster.server), retry=retry, clock=clock)
        for secret in (token, static):
            if isinstance(secret, str):
                SCRUB.add(secret)
                client._tokens.append(secret)
        return client

    async def close(self) -> None:
        try:
            await self._http.aclose()
        finally:
            while self._tokens:
                SCRUB.remove(self._tokens.pop())

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept_text: bool = False,
    ) -> Any:
        """Send one request (retrying 429, 5xx and lost connections) and return the parsed JSON answer
        (text with ``accept_text``). Raises :class:`ApiStatus` for an error answer,
        :class:`Unreachable` when no answer came, ``ReadOnlyError`` for a write in read-only mode."""
        import httpx2 as httpx
        from lightkube.core.exceptions import ConfigError

        if method != "GET" and self.read_only:
            raise ReadOnlyError(f"{what}: refused, the backend is read-only (no write request is sent)")
        content = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"} if not accept_text else {}
        if content is not None:
            headers["Content-Type"] = content_type
        ambiguous = False
        detail = ""
        server_wait: float | None = None  # the last answer's Retry-After
        for attempt in range(self.retry.attempts):
            if attempt:
                await self._clock.sleep(self._backoff(attempt - 1, server_wait))
                server_wait = None
            self.requests += 1
            try:
                resp = await self._http.request(
                    method, path, params=dict(params or {}), content=content, headers=headers
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                # The reason (refused, TLS certificate not trusted, ...) says what to fix; it holds no credential.
                detail = f"{type(exc).__name__}: cannot connect to {self.server}: {exc}"
                _log.debug("%s %s: %s (attempt %d)", method, path, detail, attempt + 1)
                continue
            except (ConfigError, OSError, ValueError, KeyError) as exc:
                # The kubeconfig's credentials are obtained per request (token file, exec plugin), before
                # anything is sent: like a missing client certificate, the configuration is at fault.
                raise InvalidError(
                    f"{what}: the kubeconfig's credentials could not be obtained ({type(exc).__name__}: {exc})",
                    path="kubeconfig",
                ) from None
            except httpx.TransportError as exc:
                # The request may have reached the server: a write's effect is now unknown.
                ambiguous = ambiguous or method != "GET"
                detail = f"{type(exc).__name__}: the connection to {self.server} failed before an answer"
                _log.debug("%s %s: %s (attempt %d)", method, path, detail, attempt + 1)
                continue
            _log.debug("%s %s -> %d", method, path, resp.status_code)
            if resp.status_code < 400:
                if accept_text:
                    return resp.text
                if not resp.content:
                    return None
                try:
                    return resp.json()
                except ValueError:
                    # Not an API server (a login page, a redirect to one, a proxy): say so, do not crash.
                    raise Unreachable(
                        f"{self.server} answered HTTP {resp.status_code} with something that is not a Kubernetes "
                        "API answer (not JSON): is the kubeconfig's server address right?",
                        ambiguous=method != "GET" and resp.status_code < 300,
                    ) from None
            status = _status_body(resp)
            if is_retryable(resp.status_code):
                ambiguous = ambiguous or (method != "GET" and resp.status_code != 429)
                detail = f"HTTP {resp.status_code} {status.get('reason', '') if status else ''}".strip()
                server_wait = _retry_after(resp)
                continue
            raise ApiStatus(resp.status_code, status)
        raise Unreachable(f"{detail} (after {self.retry.attempts} attempts)", ambiguous=ambiguous)

    def _backoff(self, attempt: int, server_wait: float | None) -> float:
        delay = self.retry.delay(attempt)
        if server_wait is not None:
            delay = min(self.retry.cap, max(delay, server_wait))
        return delay

    # --- conveniences over request() --------------------------------------------------------------

    async def get(self, path: str, *, what: str) -> dict[str, Any]:
        out = await self.request("GET", path, what=what)
        return out if isinstance(out, dict) else {}

    async def get_or_none(self, path: str, *, what: str) -> dict[str, Any] | None:
        try:
            return await self.get(path, what=what)
        except ApiStatus as exc:
            if exc.code == 404:
                return None
            raise

    async def list(self, path: str, *, what: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        out = await self.request("GET", path, what=what, params=params)
        items = out.get("items") if isinstance(out, dict) else None
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    async def create(self, path: str, body: Mapping[str, Any], *, what: str) -> dict[str, Any]:
        out = await self.request("POST", path, what=what, body=body)
        return out if isinstance(out, dict) else {}

    async def delete(
        self, path: str, *, what: str, propagation: str = "Foreground", uid: str | None = None
    ) -> dict[str, Any] | None:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        out = await self.request("DELETE", path, what=what, body=body)
        return out if isinstance(out, dict) else None

    async def served(self, group: str, version: str) -> set[str] | None:
        """The resources served under ``group/version`` (discovery), or ``None`` if it is not served."""
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            out = await self.get(path, what=f"discover {group or 'core'}/{version}")
        except ApiStatus as exc:
            if exc.code in (404, 503):
                return None
            raise
        return {
            r["name"]
            for r in out.get("resources", [])
            if isinstance(r, dict) and isinstance(r.get("name"), str)
        }

    async def allowed(
        self,
        verb: str,
        resource: str,
        *,
        group: str = "",
        namespace: str | None = None,
        subresource: str = "",
    ) -> bool:
        """SelfSubjectAccessReview: may these credentials ``verb`` the resource?"""
        attrs: dict[str, str] = {"verb": verb, "resource": resource, "group": group}
        if namespace is not None:
            attrs["namespace"] = namespace
        if subresource:
            attrs["subresource"] = subresource
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        out = await self.create(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            review,
            what=f"access review ({verb} {resource})",
        )
        status = out.get("status")
        return isinstance(status, dict) and status.get("allowed") is True


def _status_body(resp: Any) -> dict[str, Any] | None:
    try:
        body = resp.json()
    except ValueError:
        return {"message": resp.text[:500]} if resp.text else None
    return body if isinstance(body, dict) else None


def _retry_after(resp: Any) -> float | None:
    value = resp.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
