"""The CLI on a writable kubeflow config, as used every day: write commands probe at most once (the
findings are cached in the store), read commands never probe and send no write (kubesim's request log),
``list`` agrees with ``status``, and ``validate`` asks the cluster."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from kubeflow_fixtures import kubeconfig

from dispatch import AdapterConfig, SqliteStore, StoreProbeCache
from dispatch_kubeflow.backend import open_backend
from kubesim.resources import TRAINJOBS
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")

JOB = {
    "command": ["python", "train.py"],
    "nodes": 2,
    "env": {"KUBESIM_SCRIPT": "sleep 600"},
    "extensions": {
        "dispatch/Image": {"ref": "example.org/train:1"},
        "kubeflow/RuntimeRef": {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"},
    },
}


async def _cli(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatch.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def _setup(sim: Simulator, tmp_path: Path) -> tuple[str, str]:
    """A writable config (relative kubeconfig and store) whose store already holds probe findings, as
    after a first command (probed here with a short window instead of the settings' ≥ 10 s)."""
    kubeconfig(tmp_path / "kc.yaml", sim.url, sim.token("admin"))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {"adapter": "kubeflow", "settings": {"kubeconfig": "kc.yaml"}, "store": {"sqlite": "jobs.db"}}
        )
    )
    store = SqliteStore(tmp_path / "jobs.db")
    settings = json.dumps({"kubeconfig": str(tmp_path / "kc.yaml")}).encode()
    backend = await open_backend(
        AdapterConfig("kubeflow", settings, probe_cache=StoreProbeCache(store)), probe_window=0.3
    )
    await backend.close()
    await store.close()
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    return str(cluster), str(job)


def _trainjob_writes(sim: Simulator) -> list[str]:
    return [f"{r.verb} {r.name}" for r in sim.requests.writes() if r.resource.startswith("trainjobs")]


async def test_a_probed_cluster_costs_a_submit_one_create_and_reads_send_no_write(
    sim: Simulator, tmp_path: Path
) -> None:
    cluster, job = await _setup(sim, tmp_path)
    sim.requests.clear()
    code, _out, err = await _cli("--config", cluster, "--json", "submit", job, "--job-id", "daily")
    assert code == 0, err
    assert [w.split()[0] for w in _trainjob_writes(sim)] == ["create"]  # no probe: one create
    assert not any("dispatch-probe" in w for w in _trainjob_writes(sim))
    sim.requests.clear()
    for args in (
        ("status", "daily"),
        ("list",),
        ("history", "daily"),
        ("watch", "--help"),
        ("check", "--read-only"),
        ("logs", "daily"),  # refused (no output capability yet), and still no write
    ):
        await _cli("--config", cluster, *args)
    assert sim.requests.writes() == []


async def _state(cluster: str, job_id: str) -> str:
    code, out, err = await _cli("--config", cluster, "--json", "status", job_id)
    assert code == 0, err
    return str(json.loads(out)["outcome"]["state"])


async def test_read_commands_send_two_requests_once_the_cluster_facts_are_kept(
    sim: Simulator, tmp_path: Path
) -> None:
    """Issue 38: a read command sent 9-13 requests where kubectl sends one. Once a first read has kept the
    cluster's facts (discovery, the CRD's version, the identity), ``status`` of a running job and ``list``
    send two (the TrainJobs and the pods), ``logs --node N`` of a finished job two (the pods, the log),
    ``logs`` of a two-node job three (one log read per node: a pod's log is asked for by its name), and a
    finished job's ``status`` and ``history`` none. Counted on kubesim's request log, through the CLI."""
    cluster, job = await _setup(sim, tmp_path)
    done = tmp_path / "done.yaml"
    done.write_text(yaml.safe_dump({**JOB, "env": {"KUBESIM_SCRIPT": "print hello from {rank}; exit 0"}}))
    for job_id, path in (("reads-run", job), ("reads-done", str(done))):
        code, _out, err = await _cli("--config", cluster, "submit", path, "--job-id", job_id)
        assert code == 0, err
    for _ in range(60):
        await sim.settle()
        sim.advance(1)
        if (await _state(cluster, "reads-run"), await _state(cluster, "reads-done")) == (
            "running",
            "succeeded",
        ):
            break
    else:
        raise AssertionError("the jobs did not reach running and succeeded")

    async def sent(*args: str) -> list[str]:
        before = len(list(sim.requests))
        code, _out, err = await _cli("--config", cluster, *args)
        assert code == 0, err
        return sorted(f"{r.verb} {r.resource}" for r in list(sim.requests)[before:])

    assert await sent("status", "reads-run") == ["list pods", "list trainjobs"]
    assert await sent("list") == ["list pods", "list trainjobs"]
    assert await sent("logs", "reads-done", "--node", "1") == ["get pods/log", "list pods"]
    assert await sent("logs", "reads-done") == ["get pods/log", "get pods/log", "list pods"]
    assert await sent("status", "reads-done") == []
    assert await sent("history", "reads-done") == []


async def test_list_agrees_with_status_when_the_trainjob_is_deleted(sim: Simulator, tmp_path: Path) -> None:
    cluster, job = await _setup(sim, tmp_path)
    code, out, err = await _cli("--config", cluster, "--json", "submit", job, "--job-id", "vanishing")
    assert code == 0, err
    name = json.loads(out)["handle"]["ref"].split("/")[1]
    sim.store.delete(TRAINJOBS, "default", name)  # deleted behind dispatch's back
    await sim.settle()
    code, out, err = await _cli("--config", cluster, "--json", "list")
    assert code == 0, err
    (listed,) = [r for r in json.loads(out) if r["jobId"] == "vanishing"]
    code, out, err = await _cli("--config", cluster, "--json", "status", "vanishing")
    # The TrainJob went at once; its pods terminate after it: stopping, then failed/cancelled (someone
    # else stopped it). Either way the two commands agree.
    assert listed["outcome"]["state"] == json.loads(out)["outcome"]["state"]
    assert listed["outcome"]["state"] in ("stopping", "failed"), listed["outcome"]


async def test_validate_with_a_cluster_asks_it_read_only(sim: Simulator, tmp_path: Path) -> None:
    cluster, _ = await _setup(sim, tmp_path)
    sim.requests.clear()
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(JOB))
    code, out, err = await _cli("--config", cluster, "validate", str(good))
    assert code == 0, err
    assert "would accept it" in out
    assert "warning" not in err
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump({**JOB, "nodes": 8}))  # the module's cluster has 4 nodes
    code, out, err = await _cli("--config", cluster, "validate", str(big))
    assert code == 0, err  # a warning, not a refusal: clusters grow
    assert "warning: the job asks for 8 nodes and the cluster has 4 ready, schedulable nodes" in err
    missing = tmp_path / "missing.yaml"
    missing.write_text(
        yaml.safe_dump({**JOB, "extensions": {**JOB["extensions"], "kubeflow/RuntimeRef": {"name": "nope"}}})  # type: ignore[dict-item]
    )
    code, out, err = await _cli("--config", cluster, "validate", str(missing))
    assert code == 1 and '"nope" was not found' in err, err
    assert sim.requests.writes() == []


@pytest.mark.timeout(600)
async def test_check_refresh_probes_again_and_keeps_the_new_findings(sim: Simulator, tmp_path: Path) -> None:
    """The one CLI test that pays the real probe window (≥ 10 s): --refresh ignores the cached entry."""
    cluster, _ = await _setup(sim, tmp_path)
    store = SqliteStore(tmp_path / "jobs.db")
    (key,) = await _keys(store)
    before = json.loads(await store.get_value(key) or "")["at"]
    await store.close()
    sim.requests.clear()
    code, _out, err = await _cli("--config", cluster, "check", "--refresh")
    assert code == 0, err
    assert any(w.startswith("delete dispatch-probe-") for w in _trainjob_writes(sim))
    assert "probe: creating a gated TrainJob" in err
    store = SqliteStore(tmp_path / "jobs.db")
    assert json.loads(await store.get_value(key) or "")["at"] > before
    await store.close()
    code, _out, err = await _cli("--config", cluster, "check", "--refresh", "--read-only")
    assert code == 2 and "give one of them" in err


async def _keys(store: SqliteStore) -> list[str]:
    import sqlite3

    raw = sqlite3.connect(store.path)
    try:
        return [k for (k,) in raw.execute("SELECT key FROM kv WHERE key LIKE 'probe/%'")]
    finally:
        raw.close()


async def test_reads_answer_from_the_store_while_the_api_server_is_down(tmp_path: Path) -> None:
    """With the API server down, ``status``, ``list``, ``history`` and ``describe`` answer from the store —
    the record as last known, marked ``cluster unreachable since T (why)`` — and nothing is concluded from
    the outage: once the server is back the job reads as it is, never ``lost``."""
    from kubeflow_fixtures import STOCK, install

    async with Simulator(install_runtimes=False) as sim:
        install(sim, *(make() for make in STOCK.values()))
        cluster, job = await _setup(sim, tmp_path)
        code, _out, err = await _cli("--config", cluster, "--json", "submit", job, "--job-id", "outage")
        assert code == 0, err
        port = sim._port = int(sim.url.rsplit(":", 1)[1])
        await sim.stop()
        try:
            for args in (("status", "outage"), ("list",), ("history", "outage"), ("describe", "outage")):
                code, out, err = await _cli("--config", cluster, *args)
                assert code == 0, (args, out, err)
                if args[0] in ("status", "list"):
                    assert "cluster unreachable since" in out + err, (args, out, err)
                    assert "lost" not in out
            code, out, err = await _cli("--config", cluster, "--json", "status", "outage")
            assert code == 0, err
            shown = json.loads(out)
            assert shown["outcome"]["state"] in ("pending", "queued", "starting", "running")
            assert "cluster unreachable since" in shown["lastKnown"]
        finally:
            sim._port = port
            await sim.start()
        code, out, err = await _cli("--config", cluster, "--json", "status", "outage")
        assert code == 0, err
        shown = json.loads(out)
        assert "lastKnown" not in shown and shown["outcome"]["state"] != "lost", shown
