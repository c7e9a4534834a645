"""The one module that talks to the Kubernetes API. Everything above it sees plain JSON dicts.

It uses lightkube (``<2``) for what is hard to get right — kubeconfig and in-cluster configuration,
TLS, exec/token-file authentication — and its HTTP client for plain JSON requests, so swapping the
client library means rewriting this module only. It owns the bounded retries (429, 5xx, lost
connections, with doubling backoff) and the last line of the read-only guarantee: in read-only mode
a write is refused here, before anything is sent.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from dispatch.clock import Clock, SystemClock
from dispatch.errors import DispatchError, InvalidError, ReadOnlyError
from dispatch_kubeflow.errors import is_retryable, map_status, map_transport

__all__ = ["ApiStatus", "KubeClient", "Retry", "Unreachable", "resource_path"]

_log = logging.getLogger(__name__)


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
        return cls(http, server=str(single.cluster.server), retry=retry, clock=clock)

    async def close(self) -> None:
        await self._http.aclose()

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

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        what: str,
        content_type: str = "application/merge-patch+json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A PATCH (merge patch unless ``content_type`` says JSON patch or apply), with
        ``fieldValidation=Strict`` like every write."""
        query = {"fieldValidation": "Strict", **(params or {})}
        out = await self.request("PATCH", path, what=what, body=body, content_type=content_type, params=query)
        return out if isinstance(out, dict) else {}

    async def replace(self, path: str, body: Mapping[str, Any], *, what: str) -> dict[str, Any]:
        """A PUT; the body's ``metadata.resourceVersion`` makes it conditional (409 when stale)."""
        out = await self.request("PUT", path, what=what, body=body, params={"fieldValidation": "Strict"})
        return out if isinstance(out, dict) else {}

    async def list_at(self, path: str, *, what: str) -> tuple[builtins.list[dict[str, Any]], str]:
        """A list and its ``resourceVersion``, from which a watch continues."""
        out = await self.request("GET", path, what=what)
        if not isinstance(out, dict):
            return [], ""
        items = out.get("items")
        rv = (out.get("metadata") or {}).get("resourceVersion", "")
        good = [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
        return good, rv if isinstance(rv, str) else ""

    async def watch(
        self, path: str, *, resource_version: str, what: str, server_timeout: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream the watch events of the collection at ``path`` from ``resource_version`` (with
        bookmarks) until the server ends the stream (after ``server_timeout`` seconds at most). An expired
        version raises :class:`ApiStatus` 410, whether the server answers 410 or sends an ``ERROR``
        event carrying it: the caller lists again. A lost connection raises :class:`Unreachable`."""
        import httpx2 as httpx

        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(server_timeout),
        }
        self.requests += 1
        try:
            async with self._http.stream(
                "GET",
                path,
                params=params,
                headers={"Accept": "application/json"},
                timeout=server_timeout + 30,
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise ApiStatus(resp.status_code, _status_body(resp))
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        raise Unreachable(
                            f"{what}: the watch stream sent something that is not JSON", ambiguous=False
                        ) from None
                    if not isinstance(event, dict):
                        continue
                    if event.get("type") == "ERROR":
                        obj = event.get("object")
                        status = obj if isinstance(obj, dict) else {}
                        code = status.get("code")
                        raise ApiStatus(code if isinstance(code, int) else 500, status)
                    yield event
        except httpx.TransportError as exc:
            raise Unreachable(
                f"{what}: {type(exc).__name__}: the watch connection to {self.server} failed", ambiguous=False
            ) from None

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
