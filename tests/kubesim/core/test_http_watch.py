"""Watch over real HTTP: resume, 410 after compaction, bookmarks, watch-list, timeouts, selectors, drops."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap

from kubesim import Simulator
from kubesim.resources import CONFIGMAPS

from .conftest import Raw, configmap

CM = "/api/v1/namespaces/default/configmaps"


async def _until(pred: Any, sim: Simulator) -> None:
    for _ in range(2000):
        if pred():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


class Stream:
    """A watch stream read in the background, events collected as they arrive."""

    def __init__(self, raw: Raw, path: str, params: dict[str, str]) -> None:
        self.events: list[dict[str, Any]] = []
        self.done = asyncio.Event()
        self.task = asyncio.create_task(self._run(raw, path, params))

    async def _run(self, raw: Raw, path: str, params: dict[str, str]) -> None:
        try:
            async with raw.session.get(raw.sim.url + path, headers=raw.headers(), params=params) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    if line.strip():
                        self.events.append(json.loads(line))
        finally:
            self.done.set()

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def close(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass


async def test_watch_from_list_rv_sees_consecutive_changes(raw: Raw, sim: Simulator) -> None:
    _, lst, _ = await raw.request("GET", CM)
    rv = lst["metadata"]["resourceVersion"]
    s = Stream(raw, CM, {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "5"})
    await _until(lambda: sim.server.active_watches() == 1, sim)
    await raw.request("POST", CM, configmap("a"))
    await raw.request("PATCH", CM + "/a", {"data": {"k": "2"}}, content_type="application/merge-patch+json")
    await raw.request("DELETE", CM + "/a")
    await _until(lambda: len(s.events) >= 3, sim)
    await s.close()
    assert s.types()[:3] == ["ADDED", "MODIFIED", "DELETED"]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in s.events[:3]]
    assert rvs == [int(rv) + 1, int(rv) + 2, int(rv) + 3]


async def test_watch_resumes_from_history(raw: Raw, sim: Simulator) -> None:
    rv = sim.store.resource_version
    sim.store.create(CONFIGMAPS, configmap("a"))
    sim.store.create(CONFIGMAPS, configmap("b"))
    events = await raw.stream_lines(
        CM, {"watch": "true", "resourceVersion": str(rv), "timeoutSeconds": "1"}, limit=2
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b")]


async def test_too_old_resource_version_is_one_410_error_event(raw: Raw, sim: Simulator) -> None:
    sim.store.create(CONFIGMAPS, configmap("a"))
    old = sim.store.resource_version
    sim.store.create(CONFIGMAPS, configmap("b"))
    sim.faults.compact()
    events = await raw.stream_lines(CM, {"watch": "1", "resourceVersion": str(old - 1)})
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {old - 1} ({sim.store.resource_version})",
        "reason": "Expired",
        "code": 410,
    }


async def test_bounded_history_expires_old_versions() -> None:
    async with Simulator(controllers=[], history_limit=3) as sim:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            raw = Raw(sim, session, sim.token("admin"))
            start = sim.store.resource_version
            for i in range(5):
                sim.store.create(CONFIGMAPS, configmap(f"c{i}"))
            events = await raw.stream_lines(CM, {"watch": "1", "resourceVersion": str(start)})
            assert events[0]["object"]["code"] == 410


async def test_bookmarks_carry_only_resource_version(raw: Raw, sim: Simulator) -> None:
    sim.store.create(CONFIGMAPS, configmap("a"))
    rv = str(sim.store.resource_version)
    events = await raw.stream_lines(
        CM,
        {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "5"},
        limit=2,
    )
    assert [e["type"] for e in events] == ["BOOKMARK", "BOOKMARK"]
    assert events[0]["object"] == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": rv},
    }


async def test_watch_list_sends_initial_events_then_marked_bookmark(raw: Raw, sim: Simulator) -> None:
    sim.store.create(CONFIGMAPS, configmap("a"))
    sim.store.create(CONFIGMAPS, configmap("b"))
    events = await raw.stream_lines(
        CM,
        {
            "watch": "1",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "5",
        },
        limit=3,
    )
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    bm = events[2]["object"]["metadata"]
    assert bm["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert bm["resourceVersion"] == str(sim.store.resource_version)
    code, _body, _ = await raw.request("GET", CM, params={"watch": "1", "sendInitialEvents": "true"})
    assert code == 422


async def test_timeout_seconds_ends_the_stream(raw: Raw, sim: Simulator) -> None:
    events = await raw.stream_lines(
        CM, {"watch": "1", "resourceVersion": str(sim.store.resource_version), "timeoutSeconds": "1"}
    )
    assert events == []
    assert sim.server.active_watches() == 0


async def test_label_selector_transitions(raw: Raw, sim: Simulator) -> None:
    sim.store.create(CONFIGMAPS, configmap("a", labels={"app": "x"}))
    rv = str(sim.store.resource_version)
    s = Stream(
        raw, CM, {"watch": "1", "resourceVersion": rv, "labelSelector": "app=x", "timeoutSeconds": "5"}
    )
    await _until(lambda: sim.server.active_watches() == 1, sim)
    sim.store.mutate(CONFIGMAPS, "default", "a", lambda o: o["metadata"]["labels"].update(app="y"))
    sim.store.create(CONFIGMAPS, configmap("other"))
    sim.store.mutate(CONFIGMAPS, "default", "a", lambda o: o["metadata"]["labels"].update(app="x"))
    await _until(lambda: len(s.events) >= 2, sim)
    await s.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in s.events] == [
        ("DELETED", "a"),
        ("ADDED", "a"),
    ]


async def test_field_selector_on_watch_and_no_rv_starts_with_state(raw: Raw, sim: Simulator) -> None:
    sim.store.create(CONFIGMAPS, configmap("a"))
    sim.store.create(CONFIGMAPS, configmap("b"))
    events = await raw.stream_lines(
        CM, {"watch": "1", "fieldSelector": "metadata.name=b", "timeoutSeconds": "1"}
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]
    code, body, _ = await raw.request("GET", CM, params={"watch": "1", "labelSelector": "a in (b"})
    assert code == 400 and body["reason"] == "BadRequest"


async def test_dropped_watches_end_and_lightkube_resumes(client: AsyncClient, sim: Simulator) -> None:
    seen: list[tuple[str, str]] = []

    async def consume() -> None:
        async for etype, obj in client.watch(ConfigMap, namespace="default"):
            seen.append((etype, obj.metadata.name))
            if len(seen) == 2:
                return

    task = asyncio.create_task(consume())
    await _until(lambda: sim.server.active_watches() == 1, sim)
    sim.store.create(CONFIGMAPS, configmap("a"))
    rv_a = str(sim.store.resource_version)
    await _until(lambda: len(seen) == 1, sim)
    sim.faults.drop_watches()
    sim.store.create(CONFIGMAPS, configmap("b"))  # happens before the client reconnects
    await asyncio.wait_for(task, 10)
    assert seen == [("ADDED", "a"), ("ADDED", "b")]
    watches = sim.requests.filter(verb="watch")
    assert len(watches) == 2  # lightkube reconnected from its last resourceVersion
    assert watches[1].query_dict().get("resourceVersion") == rv_a


async def test_aborted_watch_cuts_the_connection(raw: Raw, sim: Simulator) -> None:
    s = Stream(raw, CM, {"watch": "1", "timeoutSeconds": "30"})
    await _until(lambda: sim.server.active_watches() == 1, sim)
    sim.faults.drop_watches(abort=True)
    await asyncio.wait_for(s.done.wait(), 5)
    assert sim.server.active_watches() == 0
    with pytest.raises(Exception):  # noqa: B017 - the client sees a broken stream, whatever its type
        await s.task


async def test_lightkube_sees_410_on_a_compacted_resume(client: AsyncClient, sim: Simulator) -> None:
    from lightkube.core.exceptions import ApiError as LkApiError

    sim.store.create(CONFIGMAPS, configmap("a"))
    old = str(sim.store.resource_version)
    sim.store.create(CONFIGMAPS, configmap("b"))
    sim.faults.compact()
    with pytest.raises(LkApiError) as ei:
        async for _ in client.watch(ConfigMap, namespace="default", resource_version=old):
            pass
    assert ei.value.status.code == 410 and ei.value.status.reason == "Expired"


async def test_watch_from_before_the_server_started_is_expired() -> None:
    """The fixtures' writes happen before the server serves: like a watch cache that starts with a list,
    a watch from one of their resourceVersions gets one 410 ERROR event, not a replay of history."""
    sim = Simulator(controllers=[])
    first = sim.store.create(CONFIGMAPS, configmap("before"))["metadata"]["resourceVersion"]
    sim.store.create(CONFIGMAPS, configmap("before2"))
    async with sim:
        import aiohttp

        start = sim.store.resource_version
        async with aiohttp.ClientSession() as session:
            raw = Raw(sim, session, sim.token("admin"))
            params = {"watch": "1", "resourceVersion": first, "timeoutSeconds": "1"}
            events = await raw.stream_lines(CM, params)
            assert [e["type"] for e in events] == ["ERROR"]
            assert events[0]["object"]["code"] == 410
            assert events[0]["object"]["message"] == f"too old resource version: {first} ({start})"
            # every resourceVersion handed out since the start stays watchable
            sim.store.create(CONFIGMAPS, configmap("after"))
            events = await raw.stream_lines(
                CM, {"watch": "1", "resourceVersion": str(start), "timeoutSeconds": "1"}, limit=1
            )
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "after")]


async def test_a_bookmark_comes_shortly_before_the_timeout() -> None:
    """Bookmarks every 60 s, a 3 s watch: the watch cache still sends one about 2 s before the deadline,
    so the client can resume from it."""
    async with Simulator(controllers=[], bookmark_interval=60) as sim:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            raw = Raw(sim, session, sim.token("admin"))
            rv = str(sim.store.resource_version)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            params = {
                "watch": "1",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "3",
            }
            events = await raw.stream_lines(CM, params)
            assert loop.time() - t0 >= 2.9
            assert [e["type"] for e in events] == ["BOOKMARK"]
            assert events[0]["object"]["metadata"]["resourceVersion"] == rv
            # without allowWatchBookmarks, none
            params.pop("allowWatchBookmarks")
            params["timeoutSeconds"] = "1"
            assert await raw.stream_lines(CM, params) == []
