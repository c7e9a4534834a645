"""The page's server over real HTTP: the pages, their filters, what they refuse, escaping, the live
stream. The records are written to the store by the host's own record changes; the page only reads."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dispatch import decide
from dispatch.cluster import Cluster
from dispatch.memory import MemoryBackend, MemorySettings
from dispatch.model import Actor, Cause, Evidence, JobRecord, JobSpec, Outcome, State, Transition
from dispatch.records import MemoryStore, SqliteStore, Store
from dispatch.ui.app import UiServer, serve

SPEC = JobSpec(command=("python", "train.py"), nodes=2)
SCRIPT = "<script>alert('x')</script>"
IMG = "<img src=x onerror=alert(1)>"


async def _submit(store: Store, job: str, outcome: Outcome | None = None) -> JobRecord:
    rec, first = decide.submitted(job, SPEC, policy=None, held=False, now=1000.0)
    rec = await store.create(rec, first)
    if outcome is not None:
        t = Transition(
            at=1001.0,
            actor=Actor.CLUSTER,
            what=outcome.state.value,
            state=outcome.state,
            cause=outcome.cause,
            epoch=rec.epoch,
            why="; ".join(str(e) for e in outcome.evidence),
        )
        rec = await store.update(
            rec.replace(outcome=outcome), expected_revision=rec.revision, transitions=[t]
        )
    return rec


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[tuple[UiServer, Store]]:
    store = MemoryStore()
    cluster = Cluster(MemoryBackend(MemorySettings()), store)
    async with cluster:
        server = await serve(cluster, "127.0.0.1:0", store_label="memory")
        async with server:
            yield server, store


async def _get(url: str, **headers: str) -> tuple[int, str, aiohttp.typedefs.LooseHeaders]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as r:
        return r.status, await r.text(), r.headers


async def test_the_jobs_page_lists_every_job_and_filters_by_query(page: tuple[UiServer, Store]) -> None:
    server, store = page
    await _submit(store, "a")
    await _submit(store, "b", Outcome(State.FAILED, Cause.PREEMPTED))
    status, body, headers = await _get(server.url)
    assert status == 200
    assert 'data-job="a"' in body and 'data-job="b"' in body and 'href="/jobs/b"' in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    status, body, _ = await _get(server.url + "?state=failed&cause=preempted")
    assert status == 200 and 'data-job="b"' in body and 'data-job="a"' not in body
    assert "1 of 2 jobs" in body
    assert '<option value="failed" selected>' in body  # the form shows what is chosen, without JS
    status, body, _ = await _get(server.url + "?state=exploded")
    assert status == 400
    assert "unknown state &#x27;exploded&#x27;: use one of pending, queued" in body
    # Read-only: after every page above (and the job pages), the records are as they were.
    before = {r.job_id: (r.revision, r.updated_at) for r in await store.list()}
    for path in ("jobs/a", "jobs/b", "jobs/b?node=1", ""):
        assert (await _get(server.url + path))[0] == 200
    assert {r.job_id: (r.revision, r.updated_at) for r in await store.list()} == before


async def test_an_unknown_job_and_a_job_id_holding_html_are_shown_as_text(
    page: tuple[UiServer, Store],
) -> None:
    server, _ = page
    status, body, _ = await _get(server.url + "jobs/nope")
    assert status == 404 and "no record for job &#x27;nope&#x27;" in body
    status, body, _ = await _get(server.url + "jobs/" + IMG)
    assert status == 404
    assert IMG not in body and "no job &#x27;&lt;img src=x onerror=alert(1)&gt;&#x27;: not a job id" in body


async def test_evidence_and_output_holding_html_are_text(page: tuple[UiServer, Store]) -> None:
    server, store = page
    ev = Evidence(kind="MemoryJob", name="j-1", reason="Error", message=SCRIPT, output=(SCRIPT, "last line"))
    await _submit(store, "j", Outcome(State.FAILED, Cause.EXIT_CODE, (ev,)))
    status, body, _ = await _get(server.url + "jobs/j")
    assert status == 200
    assert SCRIPT not in body
    assert body.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") >= 3  # message, output, history
    assert '<g class="bar" data-epoch="1.0" data-state="failed" data-cause="exit_code"' in body
    assert "not on the cluster yet" in body  # no handle: no output to ask for


async def test_the_job_page_refuses_a_node_it_does_not_have(page: tuple[UiServer, Store]) -> None:
    server, store = page
    await _submit(store, "j")
    status, body, _ = await _get(server.url + "jobs/j?node=2")
    assert status == 400 and "node must be an integer from 0 to 1" in body
    status, body, _ = await _get(server.url + "jobs/j?nodes=1")
    assert status == 400 and "unknown query parameter &#x27;nodes&#x27;" in body


async def test_on_loopback_a_request_for_another_host_is_refused(page: tuple[UiServer, Store]) -> None:
    server, _ = page
    status, body, _ = await _get(server.url, Host="attacker.example")
    assert status == 421 and "loopback" in body
    assert (await _get(server.url, Host=f"localhost:{server.port}"))[0] == 200


async def test_writes_are_not_served(page: tuple[UiServer, Store]) -> None:
    server, _ = page
    async with aiohttp.ClientSession() as http, http.post(server.url) as r:
        assert r.status == 405


async def _events(url: str, want: int) -> list[str]:
    """The first ``want`` events of the stream at ``url`` ("event: data" strings)."""
    out: list[str] = []
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        kind = ""
        async for raw in r.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: ") and kind:
                out.append(f"{kind}: {line.removeprefix('data: ')}")
                if len(out) == want:
                    return out
    return out


async def test_changes_arrive_as_server_sent_events(page: tuple[UiServer, Store]) -> None:
    server, store = page
    everything = asyncio.create_task(_events(server.url + "events", 2))
    only_b = asyncio.create_task(_events(server.url + "events?job=b", 1))
    await asyncio.sleep(0.3)  # both streams are open
    await _submit(store, "a")
    await _submit(store, "b")
    assert await asyncio.wait_for(everything, 10) == ["change: a", "change: b"]
    assert await asyncio.wait_for(only_b, 10) == ["change: b"]


class _NoFeed:
    """A store without the optional change feed (as a third-party store may be): the page polls it."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "changes":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_a_store_without_a_change_feed_is_polled() -> None:
    inner = MemoryStore()
    store = _NoFeed(inner)
    cluster = Cluster(MemoryBackend(MemorySettings()), store)  # type: ignore[arg-type]
    from dispatch.records import ChangeNotifier

    assert not isinstance(store, ChangeNotifier)
    async with cluster, await serve(cluster, "127.0.0.1:0") as server:
        stream = asyncio.create_task(_events(server.url + "events", 1))
        await asyncio.sleep(0.3)
        await _submit(inner, "polled")
        assert await asyncio.wait_for(stream, 10) == ["change: polled"]


async def test_an_unreadable_record_is_reported_not_a_blank_page(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    await _submit(store, "bad")
    await _submit(store, "good")
    raw = sqlite3.connect(tmp_path / "jobs.db")
    body = raw.execute("SELECT body FROM records WHERE job_id = 'bad'").fetchone()[0]
    raw.execute(
        "UPDATE records SET body = ? WHERE job_id = 'bad'", (body.replace('"nodes":2', '"nodes":"two"'),)
    )
    raw.commit()
    raw.close()
    cluster = Cluster(MemoryBackend(MemorySettings()), store)
    async with cluster, await serve(cluster, "127.0.0.1:0") as server:
        status, page_text, _ = await _get(server.url)
    assert status == 200
    row = re.search(r'<tr class="unreadable">.*?</tr>', page_text)
    assert row is not None and "<code>bad</code>" in row.group(0) and "unreadable record" in row.group(0)
    assert 'data-job="good"' in page_text  # the others are read and shown


async def test_a_busy_address_is_a_clear_error() -> None:
    store = MemoryStore()
    cluster = Cluster(MemoryBackend(MemorySettings()), store)
    async with cluster, await serve(cluster, "127.0.0.1:0") as server:
        from dispatch.errors import InvalidError, UnavailableError

        with pytest.raises(UnavailableError, match=f"cannot serve the page at 127.0.0.1:{server.port}"):
            await serve(cluster, f"127.0.0.1:{server.port}")
        with pytest.raises(InvalidError, match="expected HOST:PORT"):
            await serve(cluster, "8321")


async def test_records_of_another_cluster_are_shown_as_such(page: tuple[UiServer, Store]) -> None:
    server, store = page
    rec = await _submit(store, "elsewhere")
    await store.update(rec.replace(cluster="kubernetes:other-uid"), expected_revision=rec.revision)
    status, body, _ = await _get(server.url)
    assert "this cluster: <code>memory:" in body  # what "not this one" is measured against
    row = re.search(r'<tr class="job-row" data-job="elsewhere".*?</tr>', body)
    assert row is not None and "kubernetes:other-uid" in row.group(0) and "(not this one)" in row.group(0)
    status, body, _ = await _get(server.url + "?cluster=kubernetes:other-uid")
    assert 'data-job="elsewhere"' in body and '<option value="kubernetes:other-uid" selected>' in body
    status, body, _ = await _get(server.url + "jobs/elsewhere")
    assert status == 200 and "(not this one)" in body
    assert "not read: the record&#x27;s cluster is not this one" in body


async def test_stopping_the_server_ends_open_event_streams() -> None:
    store = MemoryStore()
    cluster = Cluster(MemoryBackend(MemorySettings()), store)
    async with cluster, aiohttp.ClientSession() as http:
        server = await serve(cluster, "127.0.0.1:0")
        async with http.get(server.url + "events") as stream:
            assert (await stream.content.readline()).startswith(b"retry:")
            await server.close()  # returns although a stream is open
            rest = await stream.content.read()
        assert b"event:" not in rest


async def test_a_store_that_cannot_be_read_is_a_503_page_saying_why(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    cluster = Cluster(MemoryBackend(MemorySettings()), store)
    async with cluster, await serve(cluster, "127.0.0.1:0") as server:
        await store.close()
        status, body, _ = await _get(server.url)
    assert status == 503 and "store unavailable" in body and "closed" in body
