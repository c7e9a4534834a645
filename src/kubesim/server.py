"""The HTTP face of kubesim: an aiohttp application speaking the Kubernetes REST API.

Routing, authentication/authorization, discovery, CRUD/patch/delete, list paging, watch streams (with
history replay, selectors, bookmarks, watch-list, timeouts), pod logs, SelfSubjectAccessReview, fault
injection and the request log. Object semantics live in ``store.py``; this module translates HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from kubesim import discovery, protobuf, protowire
from kubesim.auth import ANONYMOUS, Authenticator, Permissions
from kubesim.bodies import BodyError, decode_json, decode_yaml
from kubesim.clock import Clock
from kubesim.deleteoptions import delete_options
from kubesim.errors import (
    ApiError,
    bad_request,
    forbidden,
    internal,
    invalid,
    method_not_allowed,
    unauthorized,
    unsupported_media_type,
)
from kubesim.eventsv1 import from_v1, strict_causes, to_v1, update_causes
from kubesim.faults import Faults
from kubesim.fields import prune_unknown
from kubesim.logs import PodLogs
from kubesim.patch import (
    APPLY,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from kubesim.podlogs import serve_pod_log
from kubesim.requestlog import WRITE_VERBS, RequestLog, RequestRecord
from kubesim.resources import (
    CONFIGMAPS,
    EVENTS,
    EVENTS_V1,
    REGISTRY,
    SELFSUBJECTACCESSREVIEWS,
    SELFSUBJECTREVIEWS,
    SELFSUBJECTRULESREVIEWS,
    ResourceType,
    by_plural,
)
from kubesim.reviews import self_subject_access_review, self_subject_review, self_subject_rules_review
from kubesim.store import ObjectStore
from kubesim.strategies import strategy_for
from kubesim.tables import table, wants_table
from kubesim.watch import (
    WatchHub,
    check_list_options,
    parse_watch_request,
    query_bool,
    query_int64,
)


class Cluster(Protocol):
    """What the HTTP face needs from the simulator it serves (``kubesim.sim.Simulator`` is one): the
    storage, clock, logs, faults, identities and request log behind it, and a way to wake its
    controllers. Typed here so the server does not import the simulator that builds it."""

    @property
    def store(self) -> ObjectStore: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def logs(self) -> PodLogs: ...
    @property
    def faults(self) -> Faults: ...
    @property
    def auth(self) -> Authenticator: ...
    @property
    def requests(self) -> RequestLog: ...
    @property
    def disabled_groups(self) -> set[str]: ...
    @property
    def anonymous_auth(self) -> bool: ...
    def kick(self) -> None: ...


__all__ = ["KUBE_VERSION", "ApiServer", "Cluster"]

log = logging.getLogger(__name__)

KUBE_VERSION = discovery.KUBE_VERSION
_HEALTH = ("healthz", "livez", "readyz")
_JSON = "application/json"
_SELF_REVIEWS = (SELFSUBJECTACCESSREVIEWS, SELFSUBJECTRULESREVIEWS, SELFSUBJECTREVIEWS)
# The pseudo-resources the impersonation filter authorizes ("impersonate" on users/groups, core group).
_IMPERSONATED = {
    "users": ResourceType("", "v1", "User", "users", False),
    "groups": ResourceType("", "v1", "Group", "groups", False),
}


@dataclass
class RequestInfo:
    """What a URL addresses."""

    verb: str = ""
    rt: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str = ""
    legacy_watch: bool = False


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


_OBJECT = web.ResponseKey("object", object)
"""The object a JSON response was made from, kept to answer in protobuf instead."""


def _json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    resp = web.Response(body=_dumps(body), status=status, content_type=_JSON, headers=headers)
    resp[_OBJECT] = body  # kept, to be answered in protobuf instead when the client asked for it
    return resp


def _in_protobuf(rt: ResourceType, resp: web.Response) -> web.Response:
    """``resp`` with its object (an object of ``rt``, its list, a Status) encoded in protobuf."""
    obj = resp.get(_OBJECT)
    if not isinstance(obj, dict) or obj.get("kind") == "Table":
        return resp
    out = web.Response(
        body=protowire.encode_body(rt, obj), status=resp.status, content_type=protowire.MEDIA_TYPE
    )
    for name, value in resp.headers.items():
        if name.lower() not in ("content-type", "content-length"):
            out.headers.add(name, value)
    return out


def _error_response(err: ApiError) -> web.Response:
    headers = {}
    if err.code in (429, 503) and err.details and "retryAfterSeconds" in err.details:
        headers["Retry-After"] = str(err.details["retryAfterSeconds"])
    return _json_response(err.status(), err.code, headers)


class _FieldValidation:
    """Drops the fields a kind does not know from a request body, answering as ``fieldValidation`` asks:
    ``Strict`` 400 (apimachinery's ``StrictDecodingError`` wording), ``Warn`` (the default) one
    ``Warning`` header per field, ``Ignore`` nothing."""

    def __init__(self, rt: ResourceType, mode: str | None, *, decoding: bool = False) -> None:
        self.rt = rt
        self.mode = mode or "Warn"
        self.warnings: list[str] = []
        # create and update decode the body into the kind, and transformDecodeError
        # (apiserver handlers/rest.go) names it: `TrainJob in version "v1alpha1" cannot be handled as ...`
        self.prefix = (
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: ' if decoding else ""
        )

    def __call__(self, obj: dict[str, Any]) -> None:
        if not isinstance(obj, dict):
            return
        paths = prune_unknown(self.rt, obj)
        if not paths:
            return
        if self.mode == "Strict":
            unknown = ", ".join(f'unknown field "{p}"' for p in paths)
            raise bad_request(f"{self.prefix}strict decoding error: {unknown}")
        if self.mode == "Warn":
            self.warnings += [
                f'unknown field "{p}"' for p in paths if f'unknown field "{p}"' not in self.warnings
            ]

    def respond(self, body: Any, status: int = 200) -> web.Response:
        resp = _json_response(body, status)
        for text in self.warnings:  # RFC 7234 warn-code 299, agent "-", as the apiserver's warning recorder
            resp.headers.add("Warning", f"299 - {json.dumps(text)}")
        return resp


def _accepts_json(accept: str) -> bool:
    """Whether an Accept header admits JSON (no header, ``*/*`` and ``application/*`` do)."""
    if not accept.strip():
        return True
    types = {part.split(";")[0].strip() for part in accept.split(",")}
    return bool(types & {"application/json", "application/*", "*/*"})


def _not_found_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", details={})


class ApiServer:
    """Serves one simulated cluster over HTTP(S) on loopback."""

    def __init__(
        self, sim: Cluster, *, bookmark_interval: float = 10.0, watch_timeout: float = 1800.0
    ) -> None:
        self.sim = sim
        self.watch_timeout = watch_timeout
        self.watches = WatchHub(sim.store, bookmark_interval=bookmark_interval, lagging=sim.faults.lagging)
        self._runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.scheme = "http"
        # (namespace, name) of ConfigMaps a RoleBinding lets every authenticated user get (fixtures add
        # the Trainer install's kubeflow-trainer-public)
        self.authenticated_reads: set[tuple[str, str]] = set()
        self.app = web.Application(client_max_size=16 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self._handle)
        sim.faults.on_drop(self.watches.drop)

    def __repr__(self) -> str:
        return f"ApiServer({self.url or 'not started'}, watches={self.watches.active()})"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}" if self.port else ""

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None
    ) -> str:
        """Listen on ``host:port`` (0 = an ephemeral port); returns the base URL."""
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=ssl_context)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.host = host
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        self.scheme = "https" if ssl_context is not None else "http"
        return self.url

    async def stop(self) -> None:
        self.watches.drop(False)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def active_watches(self) -> int:
        """Number of open watch streams."""
        return self.watches.active()

    # ------------------------------------------------------------------------------------ entry

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        sim = self.sim
        info = RequestInfo()
        perms: Permissions | None = None
        status = 500
        rec: RequestRecord | None = None
        final: web.StreamResponse | None = None
        proto = False  # the answer goes out in protobuf (a built-in kind, and the client asked for it)

        def record(code: int, response_bytes: int = 0) -> RequestRecord:
            nonlocal rec
            if rec is not None:
                return rec
            res = ""
            if info.rt is not None:
                res = info.rt.plural + (f"/{info.subresource}" if info.subresource else "")
            rec = RequestRecord(
                method=request.method,
                path=request.path,
                query=tuple(request.query.items()),
                verb=info.verb,
                identity=perms.name if perms is not None else "",
                status=code,
                time=time.time(),
                sim_time=sim.clock.now(),
                resource=res,
                namespace=info.namespace or "",
                name=info.name or "",
                request_bytes=request.content_length or 0,
                response_bytes=response_bytes,
                user_agent=request.headers.get("User-Agent", ""),
            )
            sim.requests.record(rec)
            return rec

        if log.isEnabledFor(logging.DEBUG):  # never the Authorization header
            log.debug(
                "%s %s content-type=%s accept=%s",
                request.method,
                request.path_qs,
                request.headers.get("Content-Type"),
                request.headers.get("Accept"),
            )
        try:
            if sim.faults.latency > 0:
                await asyncio.sleep(sim.faults.latency)
            parts = [p for p in request.path.split("/") if p]
            if parts and parts[0] in _HEALTH and len(parts) == 1:
                status = 200
                final = web.Response(text="ok", content_type="text/plain")
                return final
            info = self._parse(request, parts)
            if info.rt is not None and info.subresource in ("", "status"):
                try:
                    proto = protowire.accepts(request.headers.get("Accept"), info.rt) == protowire.MEDIA_TYPE
                except ApiError:
                    proto = False  # errors before the handler negotiates are JSON; the handler says 406
            header = request.headers.get("Authorization")
            if header:
                perms = sim.auth.authenticate(header)
                if perms is None:  # credentials that do not authenticate are refused, never anonymous
                    raise unauthorized()
            elif sim.anonymous_auth:
                perms = Permissions.anonymous()
            else:
                raise unauthorized()
            perms = self._impersonate(request, perms)
            fault = sim.faults.check(info.verb or request.method.lower(), request.path)
            if fault is not None:
                raise fault
            if info.rt is None:
                if perms.is_anonymous and parts[:1] != ["version"]:
                    # RBAC's default bindings: system:public-info-viewer (/version, /healthz, /livez,
                    # /readyz) is bound to unauthenticated users, system:discovery only to authenticated
                    raise forbidden(perms.name, request.method.lower(), None, path=request.path)
                resp: web.StreamResponse = self._non_resource(request, parts)
            else:
                self._authorize(perms, info)
                if info.subresource in ("", "status"):
                    protowire.accepts(request.headers.get("Accept"), info.rt)  # 406 before any effect
                resp = await self._resource(request, info, perms, record, proto=proto)
            if proto and isinstance(resp, web.Response) and info.rt is not None:
                resp = _in_protobuf(info.rt, resp)
            status = resp.status
            if info.verb and not resp.prepared and sim.faults.should_lose_response(info.verb, request.path):
                status = 0  # handled, but the client never hears back
                if request.transport is not None:
                    request.transport.abort()
                return web.Response(status=204)  # never written: the connection is gone
            if info.verb and not resp.prepared and resp.status < 400:
                for text in sim.faults.warnings_for(info.verb, request.path):
                    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
                    resp.headers.add("Warning", f'299 - "{escaped}"')
            final = resp
            return resp
        except ApiError as err:
            status = err.code
            final = _error_response(err)
            if proto and info.rt is not None:
                final = _in_protobuf(info.rt, final)
            return final
        except (ConnectionResetError, asyncio.CancelledError):
            status = 499 if rec is None else status
            raise
        except Exception as exc:  # never leak a traceback (or anything else) to the client
            log.exception("kubesim: unhandled error for %s %s", request.method, request.path)
            status = 500
            final = _error_response(internal(f"{type(exc).__name__}: {exc}"))
            return final
        finally:
            body = getattr(final, "body", None) if isinstance(final, web.Response) else None
            done = record(status, len(body) if isinstance(body, bytes) else 0)
            if final is not None:
                done.content_type = final.content_type
            sim.requests.finish(done)
            if info.verb in WRITE_VERBS and status < 400:
                sim.kick()

    # ---------------------------------------------------------------------------------- routing

    def _parse(self, request: web.Request, parts: list[str]) -> RequestInfo:
        info = RequestInfo()
        if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return info
        if not rest:
            return info
        if rest[0] == "watch":
            info.legacy_watch = True
            rest = rest[1:]
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            info.namespace = rest[1]
            rest = rest[2:]
        if not rest or len(rest) > 3:
            raise _not_found_path()
        rt = by_plural(group, rest[0])
        if rt is None or rt.version != version or rt.group in self.sim.disabled_groups:
            raise _not_found_path()
        info.rt = rt
        info.name = rest[1] if len(rest) >= 2 else None
        info.subresource = rest[2] if len(rest) == 3 else ""
        if info.subresource and info.subresource not in rt.subresources:
            raise _not_found_path()
        if info.namespace is not None and not rt.namespaced:
            raise _not_found_path()
        if rt.namespaced and info.namespace is None and info.name is not None:
            raise _not_found_path()
        m = request.method
        q = request.query
        if m == "GET":
            if info.legacy_watch or query_bool(q.get("watch")):
                info.verb = "watch"
            else:
                info.verb = "get" if info.name else "list"
        elif m == "POST":
            if info.name:
                raise method_not_allowed()
            info.verb = "create"
        elif m == "PUT":
            info.verb = "update"
        elif m == "PATCH":
            info.verb = "patch"
        elif m == "DELETE":
            info.verb = "delete" if info.name else "deletecollection"
        else:
            raise method_not_allowed()
        if info.verb not in rt.verbs:
            raise method_not_allowed()
        if info.verb in ("update", "patch") and not info.name:
            raise method_not_allowed()
        if info.subresource == "log" and info.verb != "get":
            raise method_not_allowed()
        if info.subresource and info.verb in ("delete", "deletecollection"):
            raise method_not_allowed()  # a subresource is read, replaced or patched, never deleted
        return info

    def _impersonate(self, request: web.Request, perms: Permissions) -> Permissions:
        """The identity the request acts as: the authenticated one, or the one it impersonates
        (``Impersonate-User``/``-Group`` headers, ``kubectl --as``) when it may (verb ``impersonate`` on
        ``users``/``groups``, as the impersonation filter asks the authorizer); 403 otherwise."""
        headers = request.headers
        as_user = headers.get("Impersonate-User")
        as_groups = headers.getall("Impersonate-Group", [])
        others = [h for h in headers if h.lower().startswith(("impersonate-extra-", "impersonate-uid"))]
        if as_user is None:
            if as_groups or others:
                raise internal("requested impersonation of groups or extra without impersonating a user")
            return perms
        for resource, name in [("users", as_user)] + [("groups", g) for g in as_groups]:
            if not perms.allows("impersonate", "", resource, "", None):
                raise forbidden(perms.name, "impersonate", _IMPERSONATED[resource], name=name)
        if as_user == ANONYMOUS:
            return Permissions.anonymous()
        # a user kubesim knows acts with its rules; any other name is a user no role is bound to
        return self.sim.auth.by_name(as_user) or Permissions(as_user)

    def _authorize(self, perms: Permissions, info: RequestInfo) -> None:
        rt = info.rt
        assert rt is not None
        if rt in _SELF_REVIEWS and not perms.is_anonymous:
            return  # every authenticated user may ask who it is and what it may do (system:basic-user)
        if (
            rt is CONFIGMAPS
            and info.verb == "get"
            and not info.subresource
            and not perms.is_anonymous
            and (info.namespace or "", info.name or "") in self.authenticated_reads
        ):
            return
        if not perms.allows(info.verb, rt.group, rt.plural, info.subresource, info.namespace):
            raise forbidden(
                perms.name,
                info.verb,
                rt,
                namespace=info.namespace,
                name=info.name,
                subresource=info.subresource or None,
            )

    # ---------------------------------------------------------------------------- non-resource

    def _served(self) -> list[ResourceType]:
        """The registered types this simulator serves (a disabled API group is "not installed")."""
        return [rt for rt in REGISTRY.values() if rt.group not in self.sim.disabled_groups]

    def _non_resource(self, request: web.Request, parts: list[str]) -> web.Response:
        if request.method != "GET":
            raise method_not_allowed()
        if parts == ["openapi", "v2"] and not _accepts_json(request.headers.get("Accept", "")):
            # kube-openapi serves v2 as protobuf too (what kubectl asks for); kubesim only as JSON.
            raise ApiError(406, "NotAcceptable", "only application/json is served for /openapi/v2")
        doc = discovery.document(parts, self._served(), f"{self.host}:{self.port}")
        if doc is None:
            raise _not_found_path()
        return _json_response(doc)

    # ------------------------------------------------------------------------------ resources

    async def _resource(
        self,
        request: web.Request,
        info: RequestInfo,
        perms: Permissions,
        record: Callable[[int], RequestRecord],
        *,
        proto: bool = False,
    ) -> web.StreamResponse:
        """Serve a request on a resource path: one handler per verb (``proto``: a watch answers in
        protobuf frames; other answers are turned into protobuf by the caller)."""
        q = dict(request.query)
        fv = q.get("fieldValidation")
        if fv is not None and fv not in ("Ignore", "Warn", "Strict"):
            raise bad_request(
                f'fieldValidation: Unsupported value: "{fv}": supported values: "Ignore", "Warn", "Strict"'
            )
        if info.verb in ("list", "watch", "deletecollection"):
            check_list_options(q, watch=info.verb == "watch")
        if info.rt is EVENTS_V1:
            try:
                return await self._events_v1(request, info, q, record)
            except ConnectionResetError:  # the client went away mid-watch
                return web.Response(status=200)
        try:
            if info.verb == "get" and info.subresource == "log":
                return await serve_pod_log(
                    request, self.sim, info.namespace or "", info.name or "", q, record
                )
            if info.verb == "watch":
                return await self._watch(request, info, q, record, proto=proto)
        except ConnectionResetError:  # the client went away mid-stream
            return web.Response(status=200)
        if info.verb == "get":
            return self._get(request, info, q)
        if info.verb == "list":
            return self._list_response(request, info, q)
        if info.verb == "create":
            return await self._create(request, info, q, perms)
        if info.verb == "update":
            return await self._update(request, info, q)
        if info.verb == "patch":
            return await self._patch(request, info, q, self._dry_run(q))
        if info.verb == "delete":
            return await self._delete(request, info, q)
        if info.verb == "deletecollection":
            return await self._delete_collection(request, info, q)
        raise method_not_allowed()

    async def _events_v1(
        self,
        request: web.Request,
        info: RequestInfo,
        q: dict[str, str],
        record: Callable[[int], RequestRecord],
    ) -> web.StreamResponse:
        """``events.k8s.io/v1``: the stored core Events, converted both ways (kubesim.eventsv1), with the
        strict validation that version brings; deletes are the core ones."""
        store = self.sim.store
        name = info.name or ""
        core_info = dataclasses.replace(info, rt=EVENTS)
        if info.verb == "get":
            return _json_response(
                self._table_or(request, EVENTS_V1, q, to_v1(store.get(EVENTS, info.namespace, name)))
            )
        if info.verb == "list":
            body = self._list(EVENTS, info.namespace, q)
            body.update(
                kind="EventList", apiVersion=EVENTS_V1.api_version, items=[to_v1(i) for i in body["items"]]
            )
            return _json_response(self._table_or(request, EVENTS_V1, q, body))
        if info.verb == "watch":
            wr = parse_watch_request(
                EVENTS, info.namespace, info.name, q, default_timeout=self.watch_timeout, render=to_v1
            )
            return await self.watches.stream(request, wr, record)
        if info.verb in ("delete", "deletecollection"):
            if info.verb == "delete":
                return await self._delete(request, core_info, q)
            return await self._delete_collection(request, core_info, q)
        if info.verb == "create":
            body = await self._body(request)
            self._check_body(EVENTS_V1, body, info)
            fields = _FieldValidation(EVENTS_V1, q.get("fieldValidation"))
            fields(body)
            stored = from_v1(body)
            causes = strict_causes(stored)
            if causes:
                raise invalid(EVENTS_V1, str((body.get("metadata") or {}).get("name") or ""), causes)
            obj = store.create(EVENTS, stored, dry_run=self._dry_run(q))
            return fields.respond(to_v1(obj), 201)
        current = store.get(EVENTS, info.namespace, name)
        if info.verb == "update":
            body = await self._body(request)
            self._check_body(EVENTS_V1, body, info)
        else:  # patch: applied to the events.k8s.io/v1 view, as the server patches in the request's version
            body = self._patch_view(request.content_type, to_v1(current), await request.read())
        fields = _FieldValidation(EVENTS_V1, q.get("fieldValidation"))
        fields(body)
        new = from_v1(body)
        new["metadata"].update(name=name, namespace=info.namespace)
        causes = update_causes(new, current)
        if causes:
            raise invalid(EVENTS_V1, name, causes)
        obj = store.replace(EVENTS, new, dry_run=self._dry_run(q), require_resource_version=False)
        return fields.respond(to_v1(obj))

    @staticmethod
    def _patch_view(ctype: str, current: dict[str, Any], raw: bytes) -> dict[str, Any]:
        try:
            body = decode_json(raw or b"null")
        except BodyError as exc:
            raise bad_request(f"the patch body could not be decoded: {exc}") from None
        if ctype == JSON_PATCH:
            patched = json_patch(current, body)
        elif ctype in (MERGE_PATCH, STRATEGIC_MERGE_PATCH) and isinstance(body, dict):
            patched = (
                merge_patch(current, body) if ctype == MERGE_PATCH else strategic_merge_patch(current, body)
            )
        elif ctype in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
            raise bad_request("a merge patch must be a JSON object")
        else:
            raise unsupported_media_type(ctype)
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise ApiError(422, "Invalid", "the patched object must be a JSON object with metadata")
        return patched

    def _table_or(
        self, request: web.Request, rt: ResourceType, q: dict[str, str], body: dict[str, Any]
    ) -> Any:
        """``body`` (an object or a list), or the Table kubectl asked for."""
        if not wants_table(request.headers.get("Accept")):
            return body
        meta = body["metadata"]
        items = body["items"] if str(body.get("kind", "")).endswith("List") else [body]
        return table(
            rt,
            items,
            self.sim.clock.wall(self.sim.clock.now()),
            resource_version=meta["resourceVersion"],
            include_object=q.get("includeObject", "Metadata"),
            list_meta={k: v for k, v in meta.items() if k in ("continue", "remainingItemCount")},
        )

    def _get(self, request: web.Request, info: RequestInfo, q: dict[str, str]) -> web.Response:
        assert info.rt is not None
        obj = self.sim.store.get(info.rt, info.namespace, info.name or "")
        return _json_response(self._table_or(request, info.rt, q, obj))

    def _list_response(self, request: web.Request, info: RequestInfo, q: dict[str, str]) -> web.Response:
        assert info.rt is not None
        return _json_response(self._table_or(request, info.rt, q, self._list(info.rt, info.namespace, q)))

    async def _create(
        self, request: web.Request, info: RequestInfo, q: dict[str, str], perms: Permissions
    ) -> web.Response:
        rt = info.rt
        assert rt is not None
        body = await self._body(request)
        if rt is SELFSUBJECTACCESSREVIEWS:
            return _json_response(self_subject_access_review(body, perms), 201)
        if rt is SELFSUBJECTRULESREVIEWS:
            return _json_response(self_subject_rules_review(body, perms), 201)
        if rt is SELFSUBJECTREVIEWS:
            return _json_response(self_subject_review(perms), 201)
        self._check_body(rt, body, info)
        fields = _FieldValidation(rt, q.get("fieldValidation"), decoding=True)
        fields(body)
        obj = self.sim.store.create(rt, body, dry_run=self._dry_run(q), reset_status=True)
        return fields.respond(obj, 201)

    async def _update(self, request: web.Request, info: RequestInfo, q: dict[str, str]) -> web.Response:
        rt = info.rt
        assert rt is not None
        body = await self._body(request)
        self._check_body(rt, body, info)
        fields = _FieldValidation(rt, q.get("fieldValidation"), decoding=True)
        fields(body)
        obj = self.sim.store.replace(
            rt,
            body,
            subresource=info.subresource or None,
            dry_run=self._dry_run(q),
            # custom resources refuse unconditional updates, built-in types allow them
            require_resource_version=not strategy_for(rt).unconditional_update and not info.subresource,
        )
        return fields.respond(obj)

    async def _delete(self, request: web.Request, info: RequestInfo, q: dict[str, str]) -> web.Response:
        rt = info.rt
        assert rt is not None
        store = self.sim.store
        opts = delete_options(await request.read() if request.can_read_body else b"", q)
        dry_run = self._dry_run(q) or opts["dry_run"]
        name = info.name or ""
        obj = store.delete(
            rt,
            info.namespace,
            name,
            propagation=opts["propagation"],
            grace_period_seconds=opts["grace"],
            dry_run=dry_run,
            preconditions=opts["preconditions"],
        )
        if dry_run:
            return _json_response(obj)
        if store.exists(rt, info.namespace, name):
            # Finalizers, foreground deletion or a pod's grace period keep it: the apiserver's delete
            # handler answers 200 with the object, and 202 only when the client sent
            # orphanDependents=false (kept for old clients).
            return _json_response(obj, 202 if opts["orphan_false"] else 200)
        if strategy_for(rt).returns_deleted_object:
            return _json_response(obj)
        # Gone at once: the generic registry answers a Status naming what was deleted (custom resources
        # included); only pods, services and namespaces return the deleted object.
        details: dict[str, Any] = {"name": name}
        if rt.group:
            details["group"] = rt.group
        details.update(kind=rt.plural, uid=obj["metadata"]["uid"])
        return _json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
        )

    async def _delete_collection(
        self, request: web.Request, info: RequestInfo, q: dict[str, str]
    ) -> web.Response:
        rt = info.rt
        assert rt is not None
        store = self.sim.store
        opts = delete_options(await request.read() if request.can_read_body else b"", q)
        items, _ = store.list(
            rt, info.namespace, label_selector=q.get("labelSelector"), field_selector=q.get("fieldSelector")
        )
        deleted = []
        for it in items:
            m = it["metadata"]
            try:
                deleted.append(
                    store.delete(
                        rt,
                        m.get("namespace"),
                        m["name"],
                        propagation=opts["propagation"],
                        grace_period_seconds=opts["grace"],
                        dry_run=self._dry_run(q) or opts["dry_run"],
                    )
                )
            except ApiError as err:
                if err.code != 404:  # already gone by a cascade: fine
                    raise
        meta = {"resourceVersion": str(store.resource_version)}
        return _json_response(
            {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": deleted}
        )

    @staticmethod
    def _dry_run(q: dict[str, str]) -> bool:
        v = q.get("dryRun")
        if v is None or v == "":
            return False
        if v != "All":
            raise bad_request(f'dryRun: Unsupported value: "{v}": supported values: "All"')
        return True

    async def _body(self, request: web.Request) -> Any:
        ctype = request.content_type or _JSON
        if "protobuf" in ctype:
            return protobuf.decode(await request.read())
        if "cbor" in ctype:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{_JSON}, application/yaml",
            )
        raw = await request.read()
        if not raw:
            raise bad_request("the request body is empty")
        try:
            if "yaml" in ctype:
                return decode_yaml(raw)
            return decode_json(raw)
        except BodyError as exc:
            raise bad_request(
                f"the request body is not valid {'YAML' if 'yaml' in ctype else 'JSON'}: {exc}"
            ) from None

    @staticmethod
    def _check_body(rt: ResourceType, body: Any, info: RequestInfo) -> None:
        if not isinstance(body, dict):
            raise bad_request(f"the body must be a {rt.kind} object")
        av, kind = body.get("apiVersion"), body.get("kind")
        if av and av != rt.api_version:
            raise bad_request(
                f"the API version in the data ({av}) does not match the expected API version ({rt.api_version})"
            )
        if kind and kind != rt.kind:
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            ns = meta.get("namespace")
            if ns and ns != info.namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            if info.namespace is None:
                raise _not_found_path()
            meta["namespace"] = info.namespace
        if info.name is not None:
            if meta.get("name") and meta["name"] != info.name:
                raise bad_request(
                    f"the name of the object ({meta['name']}) does not match the name on the URL ({info.name})"
                )
            meta["name"] = info.name

    async def _patch(
        self, request: web.Request, info: RequestInfo, q: dict[str, str], dry_run: bool
    ) -> web.Response:
        rt = info.rt
        assert rt is not None
        ctype = request.content_type
        if ctype not in (MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE_PATCH, APPLY):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{JSON_PATCH}, {MERGE_PATCH}, {APPLY}, {STRATEGIC_MERGE_PATCH}",
            )
        force = q.get("force")
        if force is not None and ctype != APPLY:
            raise ApiError(422, "Invalid", "force: Forbidden: may not be specified for non-apply patch")
        raw = await request.read()
        try:
            body = decode_yaml(raw) if ctype == APPLY else decode_json(raw or b"null")
        except BodyError as exc:
            raise bad_request(f"the patch body could not be decoded: {exc}") from None
        store = self.sim.store
        existed = store.exists(rt, info.namespace, info.name or "")
        fields = _FieldValidation(rt, q.get("fieldValidation"))
        obj = store.patch(
            rt,
            info.namespace,
            info.name or "",
            body,
            ctype,
            subresource=info.subresource or None,
            dry_run=dry_run,
            field_manager=q.get("fieldManager"),
            force=query_bool(force),
            prune=fields,
        )
        return fields.respond(obj, 201 if ctype == APPLY and not existed else 200)

    # ---------------------------------------------------------------------------------- list

    def _list(self, rt: ResourceType, namespace: str | None, q: dict[str, str]) -> dict[str, Any]:
        store = self.sim.store
        rv = q.get("resourceVersion")
        if rv not in (None, "", "0"):
            try:
                rv_int = int(rv)
            except ValueError:
                raise bad_request(f"resourceVersion: Invalid value: {rv!r}: must be an integer") from None
            if rv_int > store.resource_version:
                raise ApiError(
                    504,
                    "Timeout",
                    f"Timeout: Too large resource version: {rv_int}, current: {store.resource_version}",
                    details={"retryAfterSeconds": 1},
                )
            if q.get("resourceVersionMatch") == "Exact" and rv_int != store.resource_version:
                raise ApiError(
                    410, "Expired", f"too old resource version: {rv_int} ({store.resource_version})"
                )
        items, list_rv = store.list(
            rt, namespace, label_selector=q.get("labelSelector"), field_selector=q.get("fieldSelector")
        )
        meta: dict[str, Any] = {"resourceVersion": list_rv}
        cont = q.get("continue")
        if cont:
            try:
                token = json.loads(base64.urlsafe_b64decode(cont.encode() + b"==="))
                start = str(token["start"])
                list_rv = str(token["rv"])
                meta["resourceVersion"] = list_rv
            except (ValueError, KeyError, TypeError, binascii.Error):
                raise bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion"
                ) from None
            items = [i for i in items if self._key(i) > start]
        limit = query_int64(q, "limit")
        if limit is not None and limit > 0 and len(items) > limit:
            rest = len(items) - limit
            items = items[:limit]
            token_body = {"rv": int(list_rv), "start": self._key(items[-1])}
            meta["continue"] = base64.urlsafe_b64encode(_dumps(token_body)).decode().rstrip("=")
            meta["remainingItemCount"] = rest
        return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": items}

    @staticmethod
    def _key(obj: dict[str, Any]) -> str:
        m = obj["metadata"]
        return f"{m.get('namespace', '')}/{m['name']}"

    # --------------------------------------------------------------------------------- watch

    async def _watch(
        self,
        request: web.Request,
        info: RequestInfo,
        q: dict[str, str],
        record: Callable[[int], RequestRecord],
        *,
        proto: bool = False,
    ) -> web.StreamResponse:
        rt = info.rt
        assert rt is not None
        render: Callable[[dict[str, Any]], Any] | None = None
        if wants_table(request.headers.get("Accept")):
            include = q.get("includeObject", "Metadata")
            clock = self.sim.clock

            def render(obj: dict[str, Any]) -> Any:
                rv = obj["metadata"]["resourceVersion"]
                return table(rt, [obj], clock.wall(clock.now()), resource_version=rv, include_object=include)

        wr = parse_watch_request(
            rt,
            info.namespace,
            info.name,
            q,
            default_timeout=self.watch_timeout,
            render=render,
            protobuf=proto and render is None,
        )
        return await self.watches.stream(request, wr, record)
