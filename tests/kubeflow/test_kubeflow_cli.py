"""The CLI on the kubeflow adapter against kubesim: ``check``, ``submit --dry-run`` and ``schema``.

The CLI runs as a subprocess (it owns its event loop) while kubesim serves from the test's loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubeflow_fixtures import kubeconfig

from dispatch_kubeflow import schema
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")

JOB = {
    "command": ["python", "train.py"],
    "nodes": 2,
    "extensions": {
        "dispatch/Image": {"ref": "example.org/train:1"},
        "kubeflow/RuntimeRef": {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"},
    },
}


async def _cli(*args: str, token: str | None = None) -> tuple[int, str, str]:
    env = dict(os.environ)
    env.pop("DISPATCH_TOKEN", None)
    if token is not None:
        env["DISPATCH_TOKEN"] = token
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


def _files(tmp_path: Path, kc: str, *, read_only: bool = True) -> tuple[str, str]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {
                "adapter": "kubeflow",
                "settings": {"kubeconfig": kc},
                "readOnly": read_only,
                "store": {"sqlite": str(tmp_path / "jobs.db")},
            }
        )
    )
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    return str(cluster), str(job)


@pytest.fixture
def files(sim: Simulator, tmp_path: Path) -> tuple[str, str]:
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    return _files(tmp_path, kc)


async def test_check_prints_the_capabilities(files: tuple[str, str]) -> None:
    cluster, _ = files
    code, out, err = await _cli("--config", cluster, "--json", "check")
    assert code == 0, err
    caps: dict[str, Any] = json.loads(out)["capabilities"]
    assert caps["mode"] == "read_only"
    assert set(caps["extensions"]) == {"dispatch/Image", "kubeflow/RuntimeRef"}


async def test_submit_dry_run_prints_the_trainjob(files: tuple[str, str], sim: Simulator) -> None:
    cluster, job = files
    writes = len(sim.requests.writes())
    code, out, err = await _cli(
        "--config", cluster, "--json", "submit", "--dry-run", "--job-id", "cli-1", job
    )
    assert code == 0, err
    tj = json.loads(out)
    assert tj["kind"] == "TrainJob" and tj["spec"]["trainer"]["numNodes"] == 2
    assert tj["metadata"]["annotations"]["dispatch.dev/job-id"] == "cli-1"
    assert len(sim.requests.writes()) == writes


async def test_dry_run_on_a_writable_config_opens_read_only(sim: Simulator, tmp_path: Path) -> None:
    """A dry run only reads: even with a writable config it runs no probe and sends no write at all."""
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    cluster, job = _files(tmp_path, kc, read_only=False)
    writes = len(sim.requests.writes())
    code, out, err = await _cli(
        "--config", cluster, "--json", "submit", "--dry-run", "--job-id", "cli-2", job
    )
    assert code == 0, err
    assert json.loads(out)["metadata"]["annotations"]["dispatch.dev/job-id"] == "cli-2"
    assert len(sim.requests.writes()) == writes


async def test_the_token_never_reaches_the_output(sim: Simulator, tmp_path: Path) -> None:
    cluster, _ = _files(tmp_path, kubeconfig(tmp_path / "kc", sim.url, "placeholder"))
    secret = "wrong-token-visible-nowhere-42"
    code, out, err = await _cli("--config", cluster, "check", token=secret)
    assert code != 0
    assert secret not in out and secret not in err
    assert "401" in out + err or "credentials" in out + err


async def test_dispatch_token_is_stripped_and_a_malformed_one_is_refused_before_any_request(
    sim: Simulator, tmp_path: Path
) -> None:
    cluster, _ = _files(tmp_path, kubeconfig(tmp_path / "kc", sim.url, "placeholder"))
    # `export DISPATCH_TOKEN="$(cat token)\n"`-style surrounding whitespace: stripped, as from --token-file.
    code, out, err = await _cli("--config", cluster, "check", token=f" {sim.token('admin')}\n")
    assert code == 0, err
    before = len(list(sim.requests))
    secret = "visible-nowhere-7q"
    code, out, err = await _cli("--config", cluster, "check", token=f"{secret}\nX-Injected: 1")
    assert code == 2
    assert err.count("\n") == 1 and "cannot be sent in an HTTP header" in err
    assert secret not in out + err
    assert len(list(sim.requests)) == before  # refused before anything was sent


async def test_schema_command_prints_the_published_schema() -> None:
    code, out, err = await _cli("--json", "schema", "kubeflow")
    assert code == 0, err
    printed = json.loads(out)
    assert printed == schema()
    jsonschema.Draft202012Validator.check_schema(printed)
