"""Pod logs over HTTP, as the API server's log REST handler proxies them from the kubelet
(``pkg/registry/core/pod/rest/log.go``, ``ValidatePodLogOptions``; the kubelet's choice of instance)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from kubesim.clock import Clock, parse_rfc3339, rfc3339
from kubesim.errors import Cause, bad_request
from kubesim.logs import LogLine, PodLogs
from kubesim.requestlog import RequestRecord
from kubesim.resources import PODS
from kubesim.store import ObjectStore
from kubesim.watch import invalid_options, open_stream, query_bool, query_int64

__all__ = ["LogSource", "serve_pod_log"]


class LogSource(Protocol):
    """What serving a log needs from the simulator."""

    @property
    def store(self) -> ObjectStore: ...
    @property
    def logs(self) -> PodLogs: ...
    @property
    def clock(self) -> Clock: ...


def _log_option_causes(q: dict[str, str]) -> list[Cause]:
    """The rules PodLogOptions validation applies (upstream ValidatePodLogOptions), with its messages."""
    causes: list[Cause] = []
    tail, limit_bytes = query_int64(q, "tailLines"), query_int64(q, "limitBytes")
    since = query_int64(q, "sinceSeconds")
    if tail is not None and tail < 0:
        causes.append(Cause.invalid_value("tailLines", tail, "must be greater than or equal to 0"))
    if limit_bytes is not None and limit_bytes < 1:
        causes.append(Cause.invalid_value("limitBytes", limit_bytes, "must be greater than 0"))
    if since is not None and q.get("sinceTime"):
        causes.append(Cause.forbidden("", "at most one of `sinceTime` or `sinceSeconds` may be specified"))
    elif since is not None and since < 1:
        causes.append(Cause.invalid_value("sinceSeconds", since, "must be greater than 0"))
    return causes


async def serve_pod_log(
    request: web.Request,
    sim: LogSource,
    ns: str,
    name: str,
    q: dict[str, str],
    record: Callable[[int], RequestRecord],
) -> web.StreamResponse:
    """GET pods/{name}/log: the options validated, the container and instance chosen as the kubelet does,
    then the lines (``follow``: streamed while the container runs)."""
    store, logs, clock = sim.store, sim.logs, sim.clock
    causes = _log_option_causes(q)  # checked before the pod is looked up, as the log REST handler does
    if causes:
        raise invalid_options("PodLogOptions", "", name, causes)
    pod = store.get(PODS, ns, name)
    spec = pod.get("spec") or {}
    containers = [c.get("name") for c in spec.get("containers") or []]
    inits = [c.get("name") for c in spec.get("initContainers") or []]
    container = q.get("container")
    if not container:
        if len(containers) != 1:
            msg = (
                f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]"
            )
            if inits:
                msg += f" or one of the init containers: [{' '.join(inits)}]"
            raise bad_request(msg)
        container = containers[0]
    elif container not in containers and container not in inits:
        raise bad_request(f"container {container} is not valid for pod {name}")
    want_previous = query_bool(q.get("previous"))
    if not spec.get("nodeName"):
        # not scheduled yet: the apiserver has no kubelet to ask and answers an empty log
        resp0 = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await resp0.prepare(request)
        record(200)
        await resp0.write_eof()
        return resp0
    entries_override, running = _log_source(logs, ns, name, container, pod, want_previous)
    tail = query_int64(q, "tailLines")
    since_s = query_int64(q, "sinceSeconds")
    since = clock.wall(clock.now()) - since_s if since_s is not None else None
    if q.get("sinceTime"):
        try:
            since = parse_rfc3339(q["sinceTime"])
        except ValueError as exc:
            raise bad_request(str(exc)) from None
    limit_bytes = query_int64(q, "limitBytes")
    timestamps = query_bool(q.get("timestamps"))
    follow = query_bool(q.get("follow")) and running and entries_override is None
    resp, send = await open_stream(request, record, {"Content-Type": "text/plain"})

    sent = 0
    if follow:
        lines = logs.follow(ns, name, container, tail=tail, since=since)
        async for ln in lines:
            data = ((rfc3339(ln.time) + " ") if timestamps else "") + ln.text + "\n"
            chunk = data.encode()
            if limit_bytes is not None and sent + len(chunk) > limit_bytes:
                await send(chunk[: limit_bytes - sent])
                break
            await send(chunk)
            sent += len(chunk)
    else:
        entries = entries_override if entries_override is not None else logs.entries(ns, name, container)
        if since is not None:
            entries = [e for e in entries if e.time >= since]
        if tail is not None:
            entries = entries[-tail:] if tail > 0 else []
        out = "".join(
            ((rfc3339(e.time) + " ") if timestamps else "") + e.text + "\n" for e in entries
        ).encode()
        if limit_bytes is not None:
            out = out[:limit_bytes]
        await send(out)
    await resp.write_eof()
    return resp


def _log_source(
    logs: PodLogs, ns: str, name: str, container: str, pod: dict[str, Any], previous: bool
) -> tuple[list[LogLine] | None, bool]:
    """Which instance's log to serve, decided like the kubelet does: (lines of an earlier instance or
    None for the current one, whether the current instance runs); 400 when there is no log to serve."""
    status = pod.get("status") or {}
    statuses = (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
    cs = next((s for s in statuses if s.get("name") == container), None)
    if cs is None:
        raise bad_request(f'container "{container}" in pod "{name}" is not available')
    state = cs.get("state") or {}
    last_terminated = (cs.get("lastState") or {}).get("terminated")
    earlier = logs.previous(ns, name, container)
    if previous:
        if not last_terminated and earlier is None:
            raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
        return earlier or [], False
    if "running" in state:
        return None, True
    if "terminated" in state:
        return None, False
    if last_terminated:  # restarting (e.g. CrashLoopBackOff): the last run's log
        return earlier or [], False
    if "waiting" in state:
        reason = (state.get("waiting") or {}).get("reason") or ""
        detail = {
            "ErrImagePull": "image can't be pulled",
            "ImagePullBackOff": "trying and failing to pull image",
        }.get(reason, reason)
        raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: {detail}')
    raise bad_request(f'container "{container}" in pod "{name}" is waiting to start - no logs yet')
