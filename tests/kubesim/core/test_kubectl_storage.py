"""kubectl and storage: applying a PersistentVolumeClaim binds it through the default StorageClass."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubesim import Simulator

from .test_kubectl import KUBECTL, kubectl

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(tls=True) as s:  # the PV controller and the fixtures' StorageClasses
        yield s


async def test_kubectl_apply_of_a_claim(sim: Simulator, tmp_path: Path) -> None:
    kc = sim.write_kubeconfig(tmp_path / "kc")
    manifest = tmp_path / "pvc.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: checkpoints}\n"
        "spec:\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 10Gi}}\n"
    )
    code, out, err = await kubectl(kc, "apply", "-f", str(manifest))
    assert code == 0, err
    assert "persistentvolumeclaim/checkpoints created" in out
    await sim.settle()
    code, out, err = await kubectl(kc, "get", "pvc", "checkpoints", "-o", "jsonpath={.status.phase}")
    assert (code, out) == (0, "Bound"), err
    code, out, err = await kubectl(kc, "get", "storageclass", "-o", "name")
    assert code == 0 and "storageclass.storage.k8s.io/standard" in out, err
