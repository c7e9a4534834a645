"""The one Kubernetes layer: every request the adapter sends goes through :class:`KubeClient`.

It reads the kubeconfig (or in-cluster configuration) with :mod:`dispatch_kubeflow.kubeconfig`, builds
TLS with :mod:`dispatch_kubeflow.tls`, obtains credentials per request with
:mod:`dispatch_kubeflow.credentials` and sends over :mod:`dispatch_kubeflow.http`, a small HTTP/1.1
client of dispatch's own (httpx2 + httpcore2 + lightkube cost a read command about 0.1 s of CPU to
import, more than the rest of the adapter). It owns, in one place:

- the mapping of transport failures and HTTP error answers to dispatch's errors (:func:`_send` catches
  the transport's exceptions, :func:`dispatch_kubeflow.errors.map_status` maps answers; no other module
  catches an HTTP error — they catch dispatch's);
- the bounded retries (429, 5xx, lost connections, with doubling backoff and ``Retry-After``), and one
  more attempt after a 401 when the credential can be obtained anew (a token file, an exec plugin);
- what every request carries: ``User-Agent: dispatch/<version>`` (so a cluster's audit log shows who
  acted) and, on writes, ``fieldValidation=Strict`` (so a field the cluster's CRD lacks is refused, not
  silently pruned);
- the ``Warning`` headers the server attaches to a write: recorded as findings and logged; an
  ``unknown field`` warning (a server that ignored Strict) is an :class:`~dispatch.errors.UnsupportedError`;
- the last line of the read-only guarantee: in read-only mode a write is refused before anything is sent.

Paths come from :mod:`dispatch_kubeflow.resources`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from msgspec import Struct

import dispatch
import dispatch_kubeflow.http as http
from dispatch import logs, metrics
from dispatch.clock import Clock, SystemClock
from dispatch.config import check_token
from dispatch.errors import InvalidError, ReadOnlyError, UnavailableError, UnsupportedError
from dispatch_kubeflow import protobuf
from dispatch_kubeflow.credentials import CredentialError, Credentials
from dispatch_kubeflow.errors import is_retryable, map_status, map_transport, unavailable_webhook
from dispatch_kubeflow.kubeconfig import load as load_kubeconfig
from dispatch_kubeflow.kubeconfig import proxy_for
from dispatch_kubeflow.resources import SELF_SUBJECT_ACCESS_REVIEWS, group_version_path

__all__ = ["USER_AGENT", "BadWatchEvent", "KubeClient", "Retry", "json_event", "user_agent"]

_log = logging.getLogger(__name__)
_WRITES = frozenset({"POST", "PUT", "PATCH"})
_MAX_FINDINGS = 50
_Items = list[dict[str, Any]]  # spelled here: inside KubeClient, ``list`` is the method


def user_agent() -> str:
    """``dispatch/<version>``: dispatch's version (a test holds it equal to the installed distribution's,
    read here without ``importlib.metadata``, which costs a command about 0.05 s of CPU to import)."""
    return f"dispatch/{dispatch.__version__}"


USER_AGENT = user_agent()

# Libraries that log HTTP traffic. The adapter's own transport logs no header; these, when a process
# uses them beside dispatch (a host's own HTTP client, hpack logging the header fields it encodes), get
# every token in use cut out of their records, at every level, whatever logging configuration it has.
LIBRARY_LOGGERS = (
    "httpx2", "httpcore2", "httpcore2.connection", "httpcore2.http11", "httpcore2.http2", "httpcore2.proxy",
    "httpcore2.socks", "httpx", "httpcore", "httpcore.connection", "httpcore.http11", "httpcore.http2",
    "httpcore.proxy", "httpcore.socks", "h11", "h2", "h2.connection", "h2.stream", "hpack", "hpack.hpack",
    "hpack.table", "lightkube", "aiohttp", "aiohttp.client", "aiohttp.internal", "asyncio",
    "dispatch_kubeflow",
)  # fmt: skip


class Retry(Struct, frozen=True):
    """Bounded retries: ``attempts`` tries in all, sleeping ``base`` seconds doubling up to ``cap``."""

    attempts: int = 5
    base: float = 0.2
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        return float(min(self.cap, self.base * (2**attempt)))


class BadWatchEvent(ValueError):
    """A watch stream sent something that is not a watch event (its position cannot be trusted)."""


class KubeClient:
    """JSON requests to one API server, with retries, raising dispatch's errors; see the module docstring.

    Reads of the built-in kinds the adapter reads in bulk (pods, Jobs, Events, nodes, namespaces) ask for
    protobuf, as client-go's controllers do, and are decoded into the same dicts
    (:mod:`dispatch_kubeflow.protobuf`); ``protobuf = False`` asks for JSON everywhere."""

    protobuf = True

    def __init__(
        self,
        transport: http.Client,
        *,
        server: str,
        credentials: Credentials | None = None,
        retry: Retry | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._http = transport
        self._credentials = credentials
        self.server = server
        self.retry = retry or Retry()
        self._clock = clock or SystemClock()
        self.read_only = False
        self._closed = False
        self.requests = 0
        self.ca_fingerprint = ""
        """SHA-256 of the cluster's CA as the configuration names it ("" when it names none): with the
        server's address, the cluster's identity where its kube-system namespace is not readable."""
        self.findings: list[str] = []
        """Warnings the API server attached to writes (the last fifty), for capabilities' notes."""
        self._tokens: list[str] = []
        self.context_namespace = "default"
        """The namespace the kubeconfig's context names (``default`` when none), as kubectl uses it."""

    def __repr__(self) -> str:
        return f"<dispatch_kubeflow.KubeClient {self.server}>"

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
        if token is not None:
            check_token(token)
        ctx = load_kubeconfig(kubeconfig, context)
        if ctx.token is not None:
            check_token(ctx.token, path="kubeconfig")
        tls = None
        if ctx.server.startswith("https:"):
            from dispatch_kubeflow import tls as tls_

            tls = tls_.context_for(ctx)
        try:
            transport = http.Client(
                ctx.server,
                ssl_context=tls,
                server_hostname=ctx.tls_server_name,
                timeout=timeout,
                headers={"User-Agent": USER_AGENT},
                proxy=proxy_for(ctx, os.environ),
            )
        except ValueError as exc:
            raise InvalidError(f"{ctx.source}: {exc}", path="kubeconfig") from None
        client = cls(transport, server=ctx.server, retry=retry, clock=clock)
        client._credentials = Credentials(ctx, token=token, reveal=client._keep_secret)
        if ctx.ca_data is not None or ctx.ca_file is not None:
            from dispatch_kubeflow.tls import ca_fingerprint

            client.ca_fingerprint = ca_fingerprint(ctx)
        client.context_namespace = ctx.namespace  # kubectl's default namespace ("default" when none)
        for secret in (token, ctx.token, ctx.password):
            if isinstance(secret, str):
                client._keep_secret(secret)
        return client

    def _keep_secret(self, secret: str) -> None:
        """Cut ``secret`` out of every log record for as long as this client is open."""
        if secret in self._tokens:
            return
        logs.redact_loggers(LIBRARY_LOGGERS)
        logs.SECRETS.add(secret)
        self._tokens.append(secret)

    async def close(self) -> None:
        self._closed = True
        try:
            await self._http.close()
        finally:
            while self._tokens:
                logs.SECRETS.remove(self._tokens.pop())

    def _check_open(self, what: str) -> None:
        # A task still running after close (a watch of another event loop) gets dispatch's error, not the
        # HTTP client's RuntimeError.
        if self._closed:
            raise UnavailableError(f"{what}: the connection to {self.server} was closed")

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
        (text with ``accept_text``). ``what`` names the operation in errors (``create TrainJob "x"``).

        Raises dispatch's errors: ``NotFoundError`` (404), ``ConflictError`` (409; ``AlreadyExistsError``
        for a create), ``ExpiredError`` (410), ``InvalidError`` (400/422/webhook denial),
        ``PermissionDeniedError`` (401/403), ``UnavailableError`` (no usable answer after the retries),
        ``OutcomeUnknownError`` (a write that may have reached the server), ``ReadOnlyError`` (a write in
        read-only mode, never sent)."""
        self._check_open(what)
        if method != "GET" and self.read_only:
            raise ReadOnlyError(f"{what}: refused, the backend is read-only (no write request is sent)")
        query = dict(params or {})
        if method in _WRITES:
            query.setdefault("fieldValidation", "Strict")
        content = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"} if not accept_text else {}
        if method == "GET" and not accept_text and self.protobuf and protobuf.wanted(path):
            headers["Accept"] = protobuf.ACCEPT
        if content is not None:
            headers["Content-Type"] = content_type
        ambiguous = False
        detail = ""
        server_wait: float | None = None  # the last answer's Retry-After
        last_refusal: tuple[int, dict[str, Any] | None] | None = (
            None  # the last answer, if a webhook's refusal
        )
        renewed = False  # a credential obtained anew after a 401, once
        attempt = 0
        while attempt < self.retry.attempts:
            if attempt:
                await self._clock.sleep(self._backoff(attempt - 1, server_wait))
                server_wait = None
            attempt += 1
            self.requests += 1
            started = time.monotonic()
            resp, failure = await self._send(method, path, query, content, headers, what)
            _count(method, path, resp.status if resp is not None else 0, time.monotonic() - started)
            if resp is None:
                # The request may have reached the server: a write's effect is now unknown.
                ambiguous = ambiguous or (failure.ambiguous and method != "GET")
                detail = failure.detail
                _log.debug("%s %s: %s (attempt %d)", method, path, detail, attempt)
                continue
            _log.debug("%s %s -> %d", method, path, resp.status)
            if resp.status < 400:
                if method != "GET":
                    self._warnings(resp, what)
                return _answer(resp, self.server, method, accept_text, what)
            status = _status_body(resp)
            if resp.status == 401 and not renewed and self._credentials and self._credentials.renewable:
                renewed = True  # the token file rotated, the plugin's credential expired early: once more
                self._credentials.expire()
                attempt -= 1
                continue
            if is_retryable(resp.status):
                refused = unavailable_webhook(_message_of(status)) is not None
                # A webhook the server could not call refused the write before it was stored: no effect.
                ambiguous = ambiguous or (method != "GET" and resp.status != 429 and not refused)
                detail = f"HTTP {resp.status} {status.get('reason', '') if status else ''}".strip()
                server_wait = _retry_after(resp)
                last_refusal = (resp.status, status) if refused else None
                continue
            raise map_status(resp.status, status, what=what)
        if last_refusal is not None and not ambiguous:
            raise map_status(*last_refusal, what=what)
        raise map_transport(
            what, f"{detail} (after {self.retry.attempts} attempts)", ambiguous_write=ambiguous
        )

    async def _authorized(self, headers: dict[str, str], what: str) -> dict[str, str]:
        """``headers`` with the credential's ``Authorization``; a credential that cannot be obtained (a
        token file, an exec plugin) is the configuration's fault, said before anything is sent."""
        if self._credentials is None:
            return headers
        try:
            value = await self._credentials.header()
        except CredentialError as exc:
            raise InvalidError(
                f"{what}: the kubeconfig's credentials could not be obtained ({exc})", path="kubeconfig"
            ) from None
        return headers if value is None else {**headers, "Authorization": value}

    async def _send(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        content: bytes | None,
        headers: dict[str, str],
        what: str,
    ) -> tuple[http.Response | None, _Failure]:
        """One attempt: the response, or ``None`` and why no answer came. The one place that catches the
        transport's exceptions."""
        sent = await self._authorized(headers, what)
        try:
            resp = await self._http.request(method, path, params=query, body=content, headers=sent)
        except http.ConnectFailed as exc:
            # The reason (refused, TLS certificate not trusted, ...) says what to fix; it holds no credential.
            return None, _Failure(f"ConnectError: cannot connect to {self.server}: {exc}", False)
        except http.ConnectionLost as exc:
            detail = f"{type(exc).__name__}: the connection to {self.server} failed before an answer ({exc})"
            return None, _Failure(detail, True)
        return resp, _NO_FAILURE

    def _warnings(self, resp: http.Response, what: str) -> None:
        """Record the ``Warning`` headers of a write's answer; an unknown field pruned by the server is an
        error (the object lost part of what dispatch sent)."""
        texts = [w for h in resp.header_all("warning") for w in _split_warnings(h)]
        if not texts:
            return
        for text in texts:
            _log.warning("%s: the API server warned: %s", what, text)
            self.findings.append(f"{what}: the API server warned: {text}")
        del self.findings[:-_MAX_FINDINGS]
        pruned = [m.group(1) for t in texts for m in [re.search(_UNKNOWN_FIELD, t)] if m is not None]
        if pruned:
            raise UnsupportedError(
                f"{what}: the API server accepted it but dropped {', '.join(pruned)} (its schema lacks "
                "them, and it ignored fieldValidation=Strict): upgrade Kubeflow Trainer to v2.3, then observe "
                "and stop the object this left behind"
            )

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
        from dispatch.errors import NotFoundError

        try:
            return await self.get(path, what=what)
        except NotFoundError:
            return None

    async def list(
        self,
        path: str,
        *,
        what: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        params = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
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

    async def stream(
        self,
        path: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> AsyncIterator[str]:
        """GET a streaming answer (a watch, a followed log) and yield its lines as they arrive.

        One attempt, no retries: the caller owns resumption (a watch resumes from its last
        resourceVersion, with its own backoff). Raises dispatch's errors as :meth:`request` does for an
        error answer (``ExpiredError`` for 410), and ``UnavailableError`` when no answer came or the
        connection broke mid-stream. ``read_timeout`` bounds the silence between two chunks (``None``: as
        long as the server keeps the stream open)."""
        self._check_open(what)
        headers = await self._authorized({"Accept": "application/json"}, what)
        query = dict(params or {})
        self.requests += 1
        try:
            async with self._http.stream(
                path, params=query, headers=headers, read_timeout=read_timeout
            ) as resp:
                _log.debug("GET %s (stream) -> %d", path, resp.status)
                _count("WATCH" if query.get("watch") else "GET", path, resp.status, None)
                if resp.status >= 400:
                    raise map_status(resp.status, _status_body(await resp.read()), what=what)
                async for line in resp.lines():
                    yield line
        except http.HTTPError as exc:
            raise map_transport(
                what,
                f"{type(exc).__name__}: the stream from {self.server} broke ({exc})",
                ambiguous_write=False,
            ) from None

    async def watch(
        self,
        path: str,
        *,
        what: str,
        params: Mapping[str, str],
        read_timeout: float | None = None,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """GET a watch and yield its events, ``(type, object)``, as they arrive: JSON lines, or protobuf
        frames for the built-in kinds that have them (:mod:`dispatch_kubeflow.protobuf`). Errors as
        :meth:`stream`; an item that is not a watch event raises :class:`BadWatchEvent`. ``opened`` is
        called once the server accepted the watch (a quiet watch may send no event for minutes: its
        acceptance is the answer that says the cluster is there)."""
        self._check_open(what)
        accept = protobuf.ACCEPT if self.protobuf and protobuf.wanted(path) else "application/json"
        headers = await self._authorized({"Accept": accept}, what)
        self.requests += 1
        try:
            async with self._http.stream(
                path, params=dict(params), headers=headers, read_timeout=read_timeout
            ) as resp:
                _log.debug("GET %s (watch) -> %d", path, resp.status)
                _count("WATCH", path, resp.status, None)
                if resp.status >= 400:
                    raise map_status(resp.status, _status_body(await resp.read()), what=what)
                if opened is not None:
                    opened()
                if protobuf.is_protobuf(resp.header("content-type")):
                    frames = protobuf.frames()
                    async for chunk in resp.chunks():
                        for frame in frames.feed(chunk):
                            try:
                                yield protobuf.decode_frame(frame)
                            except protobuf.DecodeError as exc:
                                raise BadWatchEvent(f"a watch frame that cannot be decoded: {exc}") from None
                    if frames.rest:
                        raise BadWatchEvent("the watch stream ended inside a frame")
                    return
                async for line in resp.lines():
                    if line.strip():
                        yield json_event(line)
        except http.HTTPError as exc:
            raise map_transport(
                what,
                f"{type(exc).__name__}: the stream from {self.server} broke ({exc})",
                ambiguous_write=False,
            ) from None

    async def server_fingerprint(self) -> str:
        """SHA-256 of the certificate the API server presents ("" over plain HTTP, or when no connection
        can be made now: the first request then says why)."""
        try:
            der = await self._http.server_certificate()
        except http.HTTPError:
            return ""
        if der is None:
            return ""
        import hashlib

        return hashlib.sha256(der).hexdigest()

    async def served(self, group: str, version: str) -> set[str] | None:
        """The resources served under ``group/version`` (discovery), or ``None`` if it is not served."""
        from dispatch.errors import NotFoundError

        try:
            out = await self.get(
                group_version_path(group, version), what=f"discover {group or 'core'}/{version}"
            )
        except NotFoundError:
            return None
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
            "apiVersion": SELF_SUBJECT_ACCESS_REVIEWS.api_version,
            "kind": SELF_SUBJECT_ACCESS_REVIEWS.kind,
            "spec": {"resourceAttributes": attrs},
        }
        out = await self.create(
            SELF_SUBJECT_ACCESS_REVIEWS.path(), review, what=f"access review ({verb} {resource})"
        )
        status = out.get("status")
        return isinstance(status, dict) and status.get("allowed") is True

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        what: str,
        content_type: str = "application/merge-patch+json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A PATCH: a merge patch unless ``content_type`` says JSON patch (``application/json-patch+json``)
        or server-side apply (``application/apply-patch+yaml``, with ``fieldManager`` in ``params``).

        Errors as :meth:`request`; two refusals matter to a caller that fences its write: a failed JSON
        patch ``test`` op is 422 (``InvalidError``), a stale ``metadata.resourceVersion`` in a merge patch
        is 409 (``ConflictError``)."""
        out = await self.request(
            "PATCH", path, what=what, body=body, content_type=content_type, params=params
        )
        return out if isinstance(out, dict) else {}

    async def replace(self, path: str, body: Mapping[str, Any], *, what: str) -> dict[str, Any]:
        """A PUT; the body's ``metadata.resourceVersion`` makes it conditional (``ConflictError`` when
        stale)."""
        out = await self.request("PUT", path, what=what, body=body)
        return out if isinstance(out, dict) else {}

    async def list_at(self, path: str, *, what: str) -> tuple[_Items, str]:
        """A list and its ``resourceVersion``, from which a watch continues (errors as :meth:`request`)."""
        out = await self.request("GET", path, what=what)
        if not isinstance(out, dict):
            return [], ""
        items = out.get("items")
        rv = (out.get("metadata") or {}).get("resourceVersion", "")
        good = [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
        return good, rv if isinstance(rv, str) else ""


class _Failure(Struct, frozen=True):
    detail: str
    ambiguous: bool


_NO_FAILURE = _Failure("", False)
_UNKNOWN_FIELD = r'unknown field "([^"]+)"'
_WARNING = r'\s*\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"'


def _split_warnings(header: str) -> list[str]:
    """The texts of one ``Warning`` header (RFC 7234: ``299 - "text"``, several comma-separated)."""
    out = [m.group(1).replace('\\"', '"').replace("\\\\", "\\") for m in re.finditer(_WARNING, header)]
    return out or [header.strip()]


def json_event(line: str) -> tuple[str, dict[str, Any]]:
    """One JSON watch line's type and object; :class:`BadWatchEvent` for a line that is not an event."""
    try:
        event = json.loads(line)
    except ValueError:
        raise BadWatchEvent(f"a watch line that is not JSON: {line[:80]!r}") from None
    etype = event.get("type") if isinstance(event, dict) else None
    obj = event.get("object") if isinstance(event, dict) else None
    if not isinstance(etype, str) or not isinstance(obj, dict):
        raise BadWatchEvent(f"a watch line that is not an event: {line[:80]!r}")
    return etype, obj


def _answer(resp: http.Response, server: str, method: str, accept_text: bool, what: str) -> Any:
    if accept_text:
        return resp.text
    if not resp.body:
        return None
    try:
        if protobuf.is_protobuf(resp.header("content-type")):
            return protobuf.decode_body(resp.body)
        return json.loads(resp.body)
    except ValueError:  # protobuf.DecodeError is one
        # Not an API server (a login page, a redirect to one, a proxy): say so, do not crash.
        raise map_transport(
            what,
            f"{server} answered HTTP {resp.status} with something that is not a Kubernetes API answer "
            "(not JSON): is the kubeconfig's server address right?",
            ambiguous_write=method != "GET" and resp.status < 300,
        ) from None


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "WATCH": "watch"}


def resource_of(path: str) -> tuple[str, bool]:
    """The resource a REST path names (``pods``, ``pods/log``, ``trainjobs``) and whether it is a
    collection — a bounded label for metrics, whatever the object's name."""
    parts = [p for p in path.split("?")[0].strip("/").split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else parts
    if len(parts) >= 3 and parts[0] == "namespaces":
        parts = parts[2:]
    if not parts:
        return "discovery", False
    resource = parts[0] if len(parts) < 3 else f"{parts[0]}/{parts[2]}"
    return resource, len(parts) == 1


def _count(method: str, path: str, code: int, seconds: float | None) -> None:
    """Count one answered (or failed) request in the process's metrics (a no-op unless enabled)."""
    recorder = metrics.current()
    if not recorder.enabled:
        return
    resource, collection = resource_of(path)
    verb = _VERBS.get(method) or ("list" if collection else "get")
    recorder.inc(
        "dispatch_api_requests_total",
        {"verb": verb, "resource": resource, "status": metrics.status_class(code)},
    )
    if seconds is not None:
        recorder.observe(
            "dispatch_api_request_duration_seconds", seconds, {"verb": verb, "resource": resource}
        )


def _status_body(resp: http.Response) -> dict[str, Any] | None:
    try:
        if protobuf.is_protobuf(resp.header("content-type")):
            return protobuf.decode_body(resp.body)
        body = json.loads(resp.body)
    except ValueError:
        return {"message": resp.text[:500]} if resp.body else None
    return body if isinstance(body, dict) else None


def _message_of(status: Mapping[str, Any] | None) -> str:
    message = status.get("message") if status else None
    return message if isinstance(message, str) else ""


def _retry_after(resp: http.Response) -> float | None:
    value = resp.header("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
