"""The command line's habits on kubesim over real HTTP, across processes: `logs` of every node at once with
a node prefix, or of one, and a reason (never silence, never "retry later") when there is nothing to
read; `list -w`; a refused job file naming the runtimes that exist."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from test_kubeflow_cli_everyday import JOB, _cli, _setup

from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _submit(tmp_path: Path, cluster: str, script: str, job_id: str, *extra: str) -> None:
    job = tmp_path / f"{job_id}.yaml"
    job.write_text(yaml.safe_dump({**JOB, "env": {"KUBESIM_SCRIPT": script}}))
    code, _out, err = await _cli("--config", cluster, "submit", str(job), "--job-id", job_id, *extra)
    assert code == 0, err


async def test_logs_reads_every_node_with_a_prefix_or_one_node(sim: Simulator, tmp_path: Path) -> None:
    cluster, _ = await _setup(sim, tmp_path)
    await _submit(tmp_path, cluster, "rank=0: print zero; rank=1: print one; exit 0", "two")
    await sim.settle()
    sim.advance(1)  # both nodes ended at once; their Job syncs that a batch period later (a manual clock)
    code, _out, err = await _cli("--config", cluster, "watch", "two")
    assert code == 0, err
    code, out, err = await _cli("--config", cluster, "logs", "two")
    assert code == 0, err
    assert sorted(out.splitlines()) == ["[node 0] zero", "[node 1] one"]
    code, out, _err = await _cli("--config", cluster, "logs", "two", "--node", "1")
    assert out.splitlines() == ["one"]
    code, out, _err = await _cli("--config", cluster, "logs", "two", "-o", "json")
    assert sorted((v["node"], v["line"]) for v in map(json.loads, out.splitlines())) == [
        (0, "zero"),
        (1, "one"),
    ]
    code, out, err = await _cli(
        "--config", cluster, "logs", "two", "--node", "1", "--timestamps", "--since", "1h"
    )
    assert code == 0, err
    (stamped,) = out.splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z one", stamped), stamped
    code, _out, err = await _cli("--config", cluster, "logs", "two", "--since", "soon")
    assert code == 2 and "--since: 'soon': expected a duration such as 30s, 5m or 1h30m" in err, err
    code, _out, err = await _cli("--config", cluster, "logs", "two", "--node", "5")
    assert code == 2 and "node 5 does not exist: two has 2 node(s), 0 to 1" in err
    code, _out, err = await _cli("--config", cluster, "logs", "two", "--node", "0", "--previous")
    assert code == 1 and "has no earlier run" in err and "retry" not in err
    code, _out, err = await _cli("--config", cluster, "logs", "two", "--epoch", "2")
    assert code == 1 and "two has no incarnation 2: the current one is 1.0" in err


async def test_logs_of_a_held_job_says_why_there_is_nothing(sim: Simulator, tmp_path: Path) -> None:
    cluster, _ = await _setup(sim, tmp_path)
    await _submit(tmp_path, cluster, "print never", "held", "--held")
    for extra in ((), ("--follow",)):
        code, out, err = await _cli("--config", cluster, "logs", "held", *extra)
        assert code == 0 and out == ""
        assert (
            f"held@1.0 is held: its nodes do not run until `dispatch --config {cluster} release held`" in err
        )


async def test_an_unknown_runtime_names_the_file_the_path_and_the_runtimes_that_exist(
    sim: Simulator, tmp_path: Path
) -> None:
    cluster, _ = await _setup(sim, tmp_path)
    missing = tmp_path / "missing.yaml"
    ref = {"kind": "ClusterTrainingRuntime", "name": "torch-distribted"}
    missing.write_text(
        yaml.safe_dump({**JOB, "extensions": {**JOB["extensions"], "kubeflow/RuntimeRef": ref}})
    )  # type: ignore[dict-item]
    for command in ("validate", "submit"):
        code, _out, err = await _cli("--config", cluster, command, str(missing))
        assert code == 1
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith(
                f'error: {missing}: extensions["kubeflow/RuntimeRef"].name: ClusterTrainingRuntime '
                '"torch-distribted" was not found; ClusterTrainingRuntimes that exist: '
            )
        ), err
        assert "torch-distributed" in err


async def test_list_watch_prints_the_list_then_a_row_per_change(sim: Simulator, tmp_path: Path) -> None:
    cluster, _ = await _setup(sim, tmp_path)
    await _submit(tmp_path, cluster, "sleep 600", "w1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    proc = await asyncio.create_subprocess_exec(
        *(
            sys.executable,
            "-m",
            "dispatch.cli",
            "--config",
            cluster,
            "list",
            "-w",
            "-l",
            "env.KUBESIM_SCRIPT=sleep 600",
        ),
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None

        async def row() -> list[str]:
            return (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().split()  # type: ignore[union-attr]

        assert (await row())[0] == "JOB"
        first = await row()
        assert first[0] == "w1" and first[1] in ("pending", "running")
        code, _out, err = await _cli("--config", cluster, "cancel", "w1")
        assert code == 0, err
        changed = await row()
        assert changed[:2] == ["w1", "stopping"], changed  # its pods terminate, with their grace period
        sim.advance(60)  # past the pods' grace period (the simulated cluster's clock is a manual one)
        await sim.settle()
        while changed[1] != "cancelled":  # rows of the states on the way come first
            assert changed[0] == "w1"
            changed = await row()
    finally:
        proc.terminate()
        await proc.wait()


async def test_the_namespace_is_the_contexts_unless_given(sim: Simulator, tmp_path: Path) -> None:
    """As kubectl's: the kubeconfig context's namespace by default; settings.namespace, then -n, win."""
    cluster, job = await _setup(sim, tmp_path)
    kc = tmp_path / "kc.yaml"
    doc = yaml.safe_load(kc.read_text())
    for context in doc["contexts"]:
        context["context"]["namespace"] = "team-a"
    kc.write_text(yaml.safe_dump(doc))

    async def namespace(*extra: str) -> str:
        code, out, err = await _cli("--config", cluster, *extra, "submit", job, "--dry-run", "-o", "json")
        assert code == 0, err
        return str(json.loads(out)["metadata"]["namespace"])

    assert await namespace() == "team-a"
    assert await namespace("-n", "team-b") == "team-b"
    code, _out, err = await _cli("--config", cluster, "--context", "nope", "submit", job, "--dry-run")
    assert code == 2 and "error: context: " in err and "no context 'nope' (contexts there: kubesim)" in err, (
        err
    )


async def test_a_misspelt_queue_names_the_file_and_the_queues_that_exist(
    sim: Simulator, tmp_path: Path
) -> None:
    cluster, job = await _setup(sim, tmp_path)
    conf = tmp_path / "cluster.yaml"  # _setup's, now naming a queue with a typo
    assert cluster == str(conf)
    conf.write_text(
        yaml.safe_dump(
            {
                "adapter": "kubeflow",
                "settings": {"kubeconfig": "kc.yaml", "queue": "user-qeue"},
                "store": {"sqlite": "jobs.db"},
            }
        )
    )
    code, _out, err = await _cli("--config", cluster, "submit", job)
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        f'error: {conf}: settings.queue: the Kueue LocalQueue "user-qeue" named in the settings does not exist '
        "in namespace 'default'; LocalQueues that exist: user-queue"
    ), err
