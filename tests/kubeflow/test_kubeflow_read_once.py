"""A read-only backend's first read lists once and opens no watch (a command that asks once); its next
read, and every read of a backend that may write, follows the cluster with list+watch. Counted on
kubesim's request log."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import pytest
from kubeflow_fixtures import config, ident, kubeconfig, spec

from dispatch import Cause, Observation, State
from dispatch.backend import place
from dispatch_kubeflow.backend import Backend, open_backend
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _since(sim: Simulator, before: int, identity: str) -> list[tuple[str, str]]:
    return [(r.verb, r.resource) for r in list(sim.requests)[before:] if r.identity == identity]


async def _watching(sim: Simulator, before: int, identity: str) -> set[str]:
    """The resources this identity opened a watch on since ``before``, once the streams' tasks ran."""
    for _ in range(200):
        found = {res for verb, res in _since(sim, before, identity) if verb == "watch"}
        if found:
            return found
        await asyncio.sleep(0.01)
    return set()


async def test_a_read_only_first_read_lists_once_and_watches_nothing(sim: Simulator, tmp_path: Path) -> None:
    writer = await open_backend(
        config({"kubeconfig": kubeconfig(tmp_path / "w", sim.url, sim.token("admin"))}), probe_window=0.3
    )
    try:
        handle = await place(writer, spec(), ident("read-once"))
    finally:
        await writer.close()
    kc = kubeconfig(tmp_path / "r", sim.url, sim.token("readonly"))
    reader = await open_backend(config({"kubeconfig": kc}, read_only=True))
    try:
        before = len(list(sim.requests))
        obs = await reader.observe(handle)
        assert obs.handle == handle
        first = _since(sim, before, "readonly")
        # A job that runs plainly reads from its TrainJob and pods alone (dispatch_kubeflow.plain).
        assert first == [("list", "trainjobs"), ("list", "pods")], first
        before = len(list(sim.requests))
        await reader.list()  # the second read starts the feed
        assert "trainjobs" in await _watching(sim, before, "readonly")
    finally:
        await reader.close()


async def test_a_backend_that_may_write_watches_from_its_first_read(sim: Simulator, tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "w", sim.url, sim.token("admin"))
    b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
    try:
        before = len(list(sim.requests))
        await b.list()
        assert "trainjobs" in await _watching(sim, before, "admin")
    finally:
        await b.close()


async def test_a_first_read_of_a_job_that_is_not_plain_reads_every_kind(
    sim: Simulator, tmp_path: Path
) -> None:
    """A job whose container failed reads what its Job and JobSet say too: the first read lists the
    JobSets, Jobs (and Workloads), once the TrainJobs and pods show that they are needed."""
    writer = await open_backend(
        config({"kubeconfig": kubeconfig(tmp_path / "w", sim.url, sim.token("admin"))}), probe_window=0.3
    )
    try:
        handle = await place(writer, spec(env={"KUBESIM_SCRIPT": "exit 3"}), ident("read-once-failed"))
        for _ in range(100):
            await sim.settle()
            sim.advance(1)
            if (await writer.observe(handle)).outcome.cause.value == "exit_code":
                break  # a container ended with code 3 (and restarts in place)
    finally:
        await writer.close()
    kc = kubeconfig(tmp_path / "r", sim.url, sim.token("readonly"))
    reader = await open_backend(config({"kubeconfig": kc}, read_only=True))
    try:
        before = len(list(sim.requests))
        obs = await reader.observe(handle)
        first = _since(sim, before, "readonly")
        assert first[:2] == [("list", "trainjobs"), ("list", "pods")], first
        assert {res for _, res in first[2:]} >= {"jobsets", "jobs"}, first
        assert obs.outcome.cause.value == "exit_code", obs.outcome
    finally:
        await reader.close()


async def test_a_read_only_process_reads_every_nodes_output_with_one_listing_of_its_pods(
    sim: Simulator, tmp_path: Path
) -> None:
    """Issue 38, `dispatch logs`: the pods of the incarnation are listed once for all its nodes (not once
    per node), and not at all after a first read whose snapshot listed them a moment ago (``status``
    refreshing the record before ``logs`` reads): then each node costs its log read alone."""
    writer = await open_backend(
        config({"kubeconfig": kubeconfig(tmp_path / "w", sim.url, sim.token("admin"))}), probe_window=0.3
    )
    try:
        script = "print hello from {rank}; hang"
        handle = await place(writer, spec(nodes=3, env={"KUBESIM_SCRIPT": script}), ident("read-logs"))
        for _ in range(100):
            await sim.settle()
            sim.advance(1)
            if (await writer.observe(handle)).outcome.state.value == "running":
                break
    finally:
        await writer.close()
    kc = kubeconfig(tmp_path / "r", sim.url, sim.token("readonly"))

    async def read_every_node(reader: Backend) -> list[list[str]]:
        return [[line async for line in reader.output(handle, node=n)] for n in range(3)]

    reader = await open_backend(config({"kubeconfig": kc}, read_only=True))
    try:
        before = len(list(sim.requests))
        assert await read_every_node(reader) == [[f"hello from {n}"] for n in range(3)]
        sent = _since(sim, before, "readonly")
        assert sent == [("list", "pods"), *[("get", "pods/log")] * 3], sent
    finally:
        await reader.close()
    reader = await open_backend(config({"kubeconfig": kc}, read_only=True))
    try:
        before = len(list(sim.requests))
        await reader.observe(handle)
        assert await read_every_node(reader) == [[f"hello from {n}"] for n in range(3)]
        sent = _since(sim, before, "readonly")
        assert sent == [("list", "trainjobs"), ("list", "pods"), *[("get", "pods/log")] * 3], sent
    finally:
        await reader.close()


SCRIPTS = (
    "print a; sleep 3; exit 0",
    "sleep 2; rank=1: exit 3",
    "sleep 2; rank=0: oom",
    "sleep 2; oom-but-exit-0",
    "sleep 2; rank=1: preempt; hang",
    "sleep 2; rank=0: lose-node; hang",
    "sleep 2; rank=1: evict; hang",
    "config-error missing-secret",
    "hang",
)


@pytest.mark.parametrize("runtime", ["torch-distributed", "no-restarts"])
async def test_a_plain_incarnation_reads_the_same_from_its_trainjob_and_pods_alone(
    tmp_path: Path, runtime: str
) -> None:
    """Wherever plain() lets a command skip the JobSets, Jobs and Workloads, the cause table reads from the
    TrainJob and pods alone what it reads from every kind: checked at every step of jobs that succeed, fail,
    run out of memory, are preempted, lose a node, are evicted, cannot start, run past a deadline, or are
    stopped."""
    from kubeflow_live import live, no_restart_runtime  # noqa: F401  (the runtimes are installed by live)

    from dispatch.model import JobSpec
    from dispatch_kubeflow.plain import plain
    from dispatch_kubeflow.watching import Parts, View, kinds
    from kubesim.resources import JOBS, JOBSETS, PODS, TRAINJOBS, WORKLOADS

    async for lv in live(tmp_path):
        # The cluster's time: a reading's ages (how long containers have waited) are the same for both.
        backend = await lv.open(sim_time=True)
        handles = []
        for i, script in enumerate(SCRIPTS):
            job: JobSpec = spec(runtime, nodes=2, env={"KUBESIM_SCRIPT": script})
            handles.append(await place(backend, job, ident(f"plain-{i}")))
        deadline = spec(runtime, nodes=2, env={"KUBESIM_SCRIPT": "hang"}, time_limit=20)
        handles.append(await place(backend, deadline, ident("plain-deadline")))
        checked = skipped = 0
        read: dict[str, set[tuple[State, Cause]]] = defaultdict(set)  # job id -> what was read of it
        for step in range(90):
            await lv.settle()
            if step == 10:
                await backend.stop(handles[-2])  # the "hang" job, stopped
            # Every kind as the cluster holds it now (one consistent moment, as the lists of a command
            # follow one another within milliseconds; the informer's separate streams may lag each other).
            view = View(kinds("default", kueue=True))
            for key, rt in (
                ("trainjobs", TRAINJOBS),
                ("jobsets", JOBSETS),
                ("jobs", JOBS),
                ("pods", PODS),
                ("workloads", WORKLOADS),
            ):
                view.replace(key, lv.sim.store.list(rt, "default")[0])
            for name in sorted(view.identities):
                parts = view.parts(name)
                if not plain(parts.trainjob, parts.pods):
                    skipped += 1
                    continue
                checked += 1
                alone = Parts(trainjob=parts.trainjob, pods=parts.pods)
                identity = view.identities[name]
                read_alone = backend._reading(name, identity, alone)
                read_whole = backend._reading(name, identity, parts)
                assert isinstance(read_alone, Observation) and isinstance(read_whole, Observation)
                read[identity.job_id].add((read_whole.state, read_whole.cause))
                assert (read_alone.outcome, read_alone.compute) == (read_whole.outcome, read_whole.compute), (
                    name,
                    step,
                )
            # A second at a time while jobs start and end; then past the config error's grace, so the pod
            # that cannot start is read failed too.
            lv.sim.advance(1 if step < 60 else 10)
        assert checked and skipped, (checked, skipped)
        stuck = f"plain-{SCRIPTS.index('config-error missing-secret')}"
        assert (State.FAILED, Cause.CONFIG_ERROR) in read[stuck], read[stuck]
