"""The kubeflow Watcher over real HTTP on kubesim: one stream per kind for every job, no per-job requests,
resumption from resourceVersions and from a cursor in a new process, relisting on 410 without losing a
transition, dropped streams, 429/5xx with backoff, bookmarks, and malformed input kept typed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, ident, kubeconfig
from kubeflow_live import Collector, Live, job, live

from dispatch import Absent, InvalidError, State
from dispatch.backend import place
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import BadWatchEvent, json_event
from dispatch_kubeflow.watching import (
    DISPATCH_SELECTOR,
    View,
    _parse_event,
    _Resync,
    kinds,
)
from kubesim.auth import Permissions, Rule
from kubesim.requestlog import RequestRecord
from kubesim.resources import CONFIGMAPS, TRAINJOBS

KINDS = {"trainjobs", "jobsets", "jobs", "pods", "workloads"}
RUNTIMES = {"clustertrainingruntimes", "trainingruntimes"}
"""The informer also follows the runtimes (prepare reads them from its cache), with no selector."""


@pytest_asyncio.fixture
async def lv(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path):
        yield x


def window_of(lv: Live, start: int) -> list[RequestRecord]:
    n = lv.sim.requests.total - start
    return list(lv.sim.requests)[-n:] if n > 0 else []


def _watches(lv: Live) -> list[tuple[str, dict[str, str]]]:
    return [(r.resource, r.query_dict()) for r in lv.sim.requests.filter(verb="watch")]


async def test_one_stream_per_kind_for_every_job_and_no_per_job_requests(lv: Live) -> None:
    backend = await lv.open()
    before = lv.sim.requests.total  # the informer starts with the first read: prepare's runtime check
    handles = [await place(backend, job(), ident(f"many-{i}")) for i in range(12)]
    watch = Collector(backend.watch())
    try:
        await lv.until(lambda: all(watch.last(h) is State.RUNNING for h in handles), "every job running")
        # The jobs can read running from the first listings before every kind's watch request has reached
        # the server (the streams open concurrently; on a loaded machine one lags): the steady state
        # starts once each kind is watched, else that late watch would count as a steady-state request.
        await lv.until(
            lambda: {r.resource for r in window_of(lv, before) if r.verb == "watch"} >= KINDS | RUNTIMES,
            "every kind watched",
        )
        steady = lv.sim.requests.total
        last_time = list(lv.sim.requests)[-1].time
        for _ in range(10):
            lv.sim.advance(5)
            await lv.settle()
        extra = window_of(lv, steady)
        assert not extra, f"the steady state sent requests: {[(r.verb, r.path, r.query) for r in extra]}"
    finally:
        await watch.close()
    sent = [r for r in window_of(lv, before) if r.time <= last_time]
    lists = [r for r in sent if r.verb == "list"]
    watches = [r for r in sent if r.verb == "watch"]
    assert sorted(r.resource for r in lists) == sorted(KINDS | RUNTIMES), [r.resource for r in lists]
    assert sorted(r.resource for r in watches) == sorted(KINDS | RUNTIMES), [r.resource for r in watches]
    creates = [r for r in sent if r.verb == "create"]
    assert len(creates) == len(handles), "one create per job, and no runtime read per submit"
    sent = [r for r in sent if r.verb != "create"]
    for r in (*lists, *watches):
        if r.resource in RUNTIMES:
            continue
        q = r.query_dict()
        assert "labelSelector" in q, r
        if r.resource != "workloads":
            assert q["labelSelector"] == DISPATCH_SELECTOR
    for r in watches:
        q = r.query_dict()
        assert q["allowWatchBookmarks"] == "true" and q["resourceVersion"], q
    assert {r.verb for r in sent} == {"list", "watch"}, (
        f"a per-job request was sent: {[(r.verb, r.path) for r in sent]}"
    )
    # Each incarnation's changes are real changes, in order.
    for h in handles:
        states = watch.states(h)
        assert states[-1] is State.RUNNING
        assert all(a != b for a, b in zip(watch.of(h), watch.of(h)[1:], strict=False))


async def test_dropped_streams_resume_from_their_resource_version(lv: Live) -> None:
    backend = await lv.open()
    h = await place(backend, job(), ident("drop"))
    watch = Collector(backend.watch())
    try:
        await lv.until(lambda: watch.last(h) is State.RUNNING, "running")
        n = len(_watches(lv))
        lv.sim.faults.drop_watches(abort=True)  # cut mid-stream
        await lv.until(lambda: len(_watches(lv)) >= n + len(KINDS), "the watches reopened")
        reopened = _watches(lv)[n:]
        assert all(q["resourceVersion"] not in ("", "0") for _, q in reopened), reopened
        assert not [r for r in list(lv.sim.requests)[-len(KINDS) :] if r.verb == "list"], "it relisted"
        pod = lv.pods(h)[0]["metadata"]["name"]
        lv.sim.actions.exit("default", pod, 0)
        await lv.until(lambda: watch.last(h) is State.SUCCEEDED, "succeeded after the drop")
    finally:
        await watch.close()


async def test_expired_history_relists_and_emits_what_changed_meanwhile(lv: Live) -> None:
    """While the streams are down (5xx, then 429, with backoff) the job succeeds and the history is
    compacted: the watch comes back with 410, relists, and emits the success — nothing is lost."""
    backend = await lv.open()
    h = await place(backend, job(), ident("expired"))
    other = await place(backend, job(), ident("expired-gone"))
    watch = Collector(backend.watch())
    try:
        await lv.until(
            lambda: watch.last(h) is State.RUNNING and watch.last(other) is State.RUNNING, "running"
        )
        lv.sim.faults.fail_next(len(KINDS), 500, verb="watch")
        lv.sim.faults.fail_next(len(KINDS), 429, verb="watch", retry_after=0)
        lv.sim.faults.drop_watches()
        for pod in lv.pods(h):
            lv.sim.actions.exit("default", pod["metadata"]["name"], 0)
        lv.sim.store.delete(TRAINJOBS, "default", other.ref.split("/")[1])  # deleted behind our back
        lv.sim.settle_now()
        lv.sim.faults.compact()
        await lv.until(
            lambda: watch.last(h) is State.SUCCEEDED and watch.absent(other),
            "the relist",
            limit=60,
        )
    finally:
        await watch.close()
    assert [r for r in lv.sim.requests.filter(verb="watch") if r.status in (429, 500)], "no fault was met"
    assert len(lv.sim.requests.filter(verb="list")) >= 2 * len(KINDS) - 1, "it never relisted"


async def test_a_watch_that_cannot_reach_the_cluster_says_so_at_once_while_the_cache_answers(
    lv: Live,
) -> None:
    """Issue 38: while the streams fail (503, retried with backoff) the cache still answers reads, so a
    listing says nothing of whether the cluster answers. The feed's trouble does, from the first failure
    (not once the retries ran out), and so does the supervisor's account of its cluster; both clear once
    every stream was accepted again."""
    from dispatch import MemoryStore
    from dispatch.cluster import Cluster

    backend = await lv.open()
    h = await place(backend, job(), ident("trouble"))
    sup = Cluster(backend, MemoryStore()).supervisor(poll=1.0, lease=30.0)
    sup.keep_watching()
    try:
        await lv.until(lambda: backend.informer.running and backend.feed.last(h.ref) is not None, "following")
        await sup.step()
        assert backend.feed.trouble is None and sup.unreachable is None
        lv.sim.faults.fail_next(3 * len(KINDS | RUNTIMES), 503, verb="watch", retry_after=0)
        lv.sim.faults.drop_watches()
        await lv.until(lambda: backend.feed.trouble is not None, "the trouble")
        trouble = backend.feed.trouble
        assert trouble is not None and "watch" in trouble.reason and "503" in trouble.reason, trouble
        assert [o.handle for o in await backend.list()] == [h], "the cache answers meanwhile"
        await sup.step()  # its listing, from the cache, does not make the cluster answer
        assert sup.unreachable is not None and sup.unreachable.at <= trouble.at
        await lv.until(lambda: backend.feed.trouble is None, "every stream accepted again")
        await sup.step()
        assert sup.unreachable is None
    finally:
        await sup.close()
    assert [r for r in lv.sim.requests.filter(verb="watch") if r.status == 503], "no fault was met"


@pytest_asyncio.fixture
async def lv_bookmarks(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path, bookmark_interval=0.05):
        yield x


async def test_bookmarks_keep_the_resource_version_fresh(lv_bookmarks: Live) -> None:
    """Events outside dispatch's selector move the server's resourceVersion; bookmarks carry it to the
    watch, so a stream reopened after the history was compacted resumes without relisting."""
    lv = lv_bookmarks
    backend = await lv.open()
    h = await place(backend, job(), ident("bookmarks"))
    watch = Collector(backend.watch())
    try:
        await lv.until(lambda: watch.last(h) is State.RUNNING, "running")
        first = watch.of(h)[-1].cursor
        for i in range(5):  # churn nobody watches
            lv.sim.store.create(CONFIGMAPS, {"metadata": {"name": f"other-{i}", "namespace": "default"}})
        await asyncio.sleep(0.3)  # bookmarks arrive (real time)
        lists = len(lv.sim.requests.filter(verb="list"))
        lv.sim.faults.compact()
        lv.sim.faults.drop_watches()
        await lv.until(lambda: len(_watches(lv)) >= 2 * len(KINDS), "reopened")
        await asyncio.sleep(0.1)
        assert len(lv.sim.requests.filter(verb="list")) == lists, "it had to relist: bookmarks were ignored"
        assert first
    finally:
        await watch.close()


async def test_a_cursor_of_another_process_relists_and_what_went_meanwhile_reads_absent(lv: Live) -> None:
    """A cursor of another process (or one no feed holds) relists: the new process's watch starts from the
    current reading of every incarnation — the success of one job, the unchanged other — and an incarnation
    deleted meanwhile, which no listing shows, reads absent when the host asks for it (its records are
    read at start, so the host learns of the deletion from the reading, not from the watch)."""
    first = await lv.open()
    watch = Collector(first.watch())
    # The quiet one first, settled (its Job, JobSet and TrainJob count its ready pods after it reads
    # running): nothing of it changes after the cursor, taken at the others' last change.
    quiet = await place(first, job(), ident("resume-quiet"))
    await lv.until(lambda: watch.last(quiet) is State.RUNNING, "the quiet one running")
    for _ in range(3):
        lv.sim.advance(1)
        await lv.settle()
    done = await place(first, job(), ident("resume-done"))
    gone = await place(first, job(), ident("resume-gone"))
    try:
        await lv.until(lambda: all(watch.last(x) is State.RUNNING for x in (done, gone, quiet)), "running")
        cursor = watch.changes[-1].cursor
    finally:
        await watch.close()
    await first.close()
    for pod in lv.pods(done):
        lv.sim.actions.exit("default", pod["metadata"]["name"], 0)
    lv.sim.store.delete(TRAINJOBS, "default", gone.ref.split("/")[1])
    lv.sim.settle_now()
    second = await lv.open()
    resumed = Collector(second.watch(cursor))
    try:
        await lv.until(
            lambda: resumed.last(done) is State.SUCCEEDED and resumed.last(quiet) is State.RUNNING,
            "the relisted readings",
        )
    finally:
        await resumed.close()
    waited = 0
    while not isinstance(await second.observe(gone), Absent):  # its pods terminate, then nothing is left
        assert waited < 100, "a TrainJob deleted with its pods gone does not read absent"
        lv.sim.advance(5)
        await lv.settle()
        waited += 1


async def test_a_cursor_that_is_not_text_is_invalid_and_any_other_relists(lv: Live) -> None:
    backend = await lv.open()
    with pytest.raises(InvalidError) as caught:
        async for _ in backend.watch(5):  # type: ignore[arg-type]
            break
    assert caught.value.path == "cursor"
    h = await place(backend, job(), ident("garbage-cursor"))
    relisted = Collector(backend.watch("not a cursor of this feed"))
    try:
        await lv.until(lambda: relisted.last(h) is State.RUNNING, "running, from a relist")
    finally:
        await relisted.close()


def test_malformed_watch_events_are_typed() -> None:
    for line in (
        "not json",
        "[]",
        '{"type": "ADDED"}',
        '{"type": "WHAT", "object": {"metadata": {}}}',
        '{"type": "ADDED", "object": {"metadata": 3}}',
    ):
        with pytest.raises((_Resync, BadWatchEvent)):
            _parse_event(*json_event(line))
    view = View(kinds("default", kueue=True))
    # objects missing fields, or of the wrong shape, never raise
    for obj in ({}, {"metadata": None}, {"metadata": {"name": 3}}, {"metadata": {"labels": "x", "uid": "u"}}):
        assert view.apply("pods", "ADDED", obj) == set()
        assert view.apply("trainjobs", "DELETED", obj) <= {None}  # type: ignore[operator]
    assert view.apply("trainjobs", "ADDED", {"metadata": {"name": "x", "uid": "u1", "labels": {}}}) == {"x"}
    assert view.keys() == set(), "a TrainJob without dispatch's identity is not an incarnation"
    assert view.touched_since({"trainjobs": "abc"}) is None


async def test_a_kind_the_credentials_cannot_read_is_left_out(lv: Live, tmp_path: Path) -> None:
    """Credentials that may not read Kueue Workloads still watch every job, from the other kinds."""
    groups = ["", "batch", "trainer.kubeflow.org", "jobset.x-k8s.io", "authorization.k8s.io"]
    token = lv.sim.add_identity(Permissions("no-kueue", (Rule.of("*", groups, "*"),)))
    kc = kubeconfig(tmp_path / "kc-no-kueue", lv.sim.url, token)
    backend = await open_backend(config({"kubeconfig": kc}), probe_window=0.1)
    lv.opened.append(backend)
    h = await place(backend, job(), ident("no-kueue"))
    watch = Collector(backend.watch())
    try:
        await lv.until(lambda: watch.last(h) is State.RUNNING, "running")
    finally:
        await watch.close()
    denied = [r for r in lv.sim.requests.filter(identity="no-kueue") if r.resource == "workloads"]
    assert denied and all(r.status == 403 for r in denied)
