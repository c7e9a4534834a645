"""A real, independent client: kubectl (v1.37 from PyPI) against kubesim over HTTPS."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubesim import Simulator
from kubesim.resources import CONFIGMAPS, PODS, TRAINJOBS

from .conftest import running_pod

KUBECTL = Path(sys.executable).parent / "kubectl"
if not KUBECTL.exists():  # pragma: no cover - depends on the environment
    KUBECTL = Path(shutil.which("kubectl") or "kubectl")

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")

TRAINJOB_YAML = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: demo
  labels: {app: demo}
spec:
  runtimeRef: {name: torch-distributed}
  trainer: {numNodes: 2, image: busybox}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  lr: "0.1"
"""


@pytest.fixture
async def ksim() -> AsyncIterator[Simulator]:
    async with Simulator(controllers=[], tls=True) as s:  # kubectl sends tokens only over TLS
        yield s


async def kubectl(kc: Path, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "--kubeconfig",
        str(kc),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_apply_get_patch_delete(ksim: Simulator, tmp_path: Path) -> None:
    kc = ksim.write_kubeconfig(tmp_path / "kc")
    manifest = tmp_path / "demo.yaml"
    manifest.write_text(TRAINJOB_YAML)
    code, out, err = await kubectl(kc, "apply", "-f", str(manifest))
    assert code == 0, err
    assert "trainjob.trainer.kubeflow.org/demo created" in out and "configmap/settings created" in out
    assert ksim.store.get(TRAINJOBS, "default", "demo")["spec"]["trainer"]["numNodes"] == 2

    code, out, err = await kubectl(kc, "get", "trainjob", "demo", "-o", "json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["metadata"]["uid"] == ksim.store.get(TRAINJOBS, "default", "demo")["metadata"]["uid"]

    code, out, err = await kubectl(
        kc, "patch", "trainjob", "demo", "--type", "merge", "-p", '{"spec":{"suspend":true}}'
    )
    assert code == 0, err
    assert ksim.store.get(TRAINJOBS, "default", "demo")["spec"]["suspend"] is True

    code, out, err = await kubectl(kc, "patch", "configmap", "settings", "-p", '{"data":{"epochs":"3"}}')
    assert code == 0, err  # strategic merge patch on a built-in type
    assert ksim.store.get(CONFIGMAPS, "default", "settings")["data"] == {"lr": "0.1", "epochs": "3"}

    # (spec.trainer is immutable by the CRD's CEL rule, which kubesim applies without controllers too)
    changed = TRAINJOB_YAML.replace('lr: "0.1"', 'lr: "0.2"')
    manifest.write_text(changed.replace("  labels: {app: demo}\n", "  labels: {app: demo, tier: x}\n"))
    code, out, err = await kubectl(kc, "apply", "-f", str(manifest))  # re-apply: client-side apply patches
    assert code == 0, err
    tj = ksim.store.get(TRAINJOBS, "default", "demo")
    assert tj["spec"]["trainer"]["numNodes"] == 2 and tj["metadata"]["labels"] == {"app": "demo", "tier": "x"}
    assert tj["spec"]["suspend"] is True  # set by the patch above, not in the manifest: kept
    cm = ksim.store.get(CONFIGMAPS, "default", "settings")
    assert cm["data"] == {"lr": "0.2", "epochs": "3"}

    code, out, err = await kubectl(kc, "get", "trainjobs", "-l", "app=demo", "-o", "name")
    assert code == 0 and out.strip() == "trainjob.trainer.kubeflow.org/demo", err

    code, out, err = await kubectl(kc, "delete", "-f", str(manifest))
    assert code == 0, err
    assert not ksim.store.exists(TRAINJOBS, "default", "demo")


async def test_server_side_apply_and_errors(ksim: Simulator, tmp_path: Path) -> None:
    kc = ksim.write_kubeconfig(tmp_path / "kc")
    code, _out, err = await kubectl(kc, "apply", "--server-side", "-f", "-", stdin=TRAINJOB_YAML)
    assert code == 0, err
    assert ksim.store.exists(TRAINJOBS, "default", "demo")
    code, _out, err = await kubectl(kc, "create", "-f", "-", stdin=TRAINJOB_YAML)
    assert code != 0 and 'trainjobs.trainer.kubeflow.org "demo" already exists' in err
    code, _out, err = await kubectl(kc, "get", "trainjob", "nope")
    assert code != 0 and 'trainjobs.trainer.kubeflow.org "nope" not found' in err


async def test_readonly_kubectl_is_forbidden_to_write(ksim: Simulator, tmp_path: Path) -> None:
    kc = ksim.write_kubeconfig(tmp_path / "ro", token="readonly")
    code, out, err = await kubectl(kc, "get", "configmaps")
    assert code == 0, err
    code, out, err = await kubectl(kc, "apply", "-f", "-", stdin=TRAINJOB_YAML)
    assert code != 0 and "forbidden" in err.lower()
    assert not ksim.store.exists(TRAINJOBS, "default", "demo")
    code, out, err = await kubectl(kc, "auth", "can-i", "create", "trainjobs.trainer.kubeflow.org")
    assert out.strip() == "no"
    code, out, err = await kubectl(kc, "auth", "can-i", "list", "pods")
    assert out.strip() == "yes"


async def test_get_watch_prints_changes(ksim: Simulator, tmp_path: Path) -> None:
    kc = ksim.write_kubeconfig(tmp_path / "kc")
    ksim.store.create(CONFIGMAPS, {"metadata": {"name": "first", "namespace": "default"}})
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "--kubeconfig",
        str(kc),
        "get",
        "configmaps",
        "-w",
        "-o",
        "name",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        first = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert first.decode().strip() == "configmap/first"
        ksim.store.create(CONFIGMAPS, {"metadata": {"name": "second", "namespace": "default"}})
        second = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert second.decode().strip() == "configmap/second"
    finally:
        proc.kill()
        await proc.wait()


async def test_logs(ksim: Simulator, tmp_path: Path) -> None:
    kc = ksim.write_kubeconfig(tmp_path / "kc")
    ksim.store.create(PODS, running_pod("trainer-0"))
    for i in range(3):
        ksim.logs.append("default", "trainer-0", "node", f"step {i}")
    code, out, err = await kubectl(kc, "logs", "trainer-0")
    assert code == 0, err
    assert out == "step 0\nstep 1\nstep 2\n"
    code, out, err = await kubectl(kc, "logs", "trainer-0", "--tail", "1")
    assert out == "step 2\n"
    ksim.logs.close("default", "trainer-0", "node")
    code, out, err = await kubectl(kc, "logs", "-f", "trainer-0", "-c", "node")
    assert code == 0 and out.endswith("step 2\n"), err


async def test_get_prints_server_side_table_columns(ksim: Simulator, tmp_path: Path) -> None:
    kc = ksim.write_kubeconfig(tmp_path / "kc")
    ksim.store.create(PODS, running_pod("trainer-0"))
    code, out, err = await kubectl(kc, "get", "pods")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:4] == ["trainer-0", "1/1", "Running", "0"]
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "--kubeconfig",
        str(kc),
        "get",
        "pods",
        "-w",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split()[0] == "NAME"
        assert (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split()[0] == "trainer-0"
        ksim.store.delete(PODS, "default", "trainer-0")  # graceful: the pod shows as Terminating
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split()
        assert line[0] == "trainer-0" and line[2] == "Terminating"
    finally:
        proc.kill()
        await proc.wait()


async def test_typed_commands_sent_as_protobuf(ksim: Simulator, tmp_path: Path) -> None:
    kc = ksim.write_kubeconfig(tmp_path / "kc")
    code, _out, err = await kubectl(kc, "create", "namespace", "team-a")
    assert code == 0, err
    code, _out, err = await kubectl(kc, "-n", "team-a", "create", "configmap", "cfg", "--from-literal=lr=0.1")
    assert code == 0, err
    cm = ksim.store.get(CONFIGMAPS, "team-a", "cfg")
    assert cm["data"] == {"lr": "0.1"}
