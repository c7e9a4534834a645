"""The Kubeflow SDK (package ``kubeflow``), a real and independent client, against kubesim over HTTP."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from kubesim.resources import CONFIGMAPS
from kubesim.sim import Simulator

pytest.importorskip("kubeflow.trainer", reason="the Kubeflow SDK comes with the dev extra")


async def _open_trainer_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, *, drop_configmap: bool
) -> tuple[list[str], set[str]]:
    from kubeflow.trainer import KubernetesBackendConfig, TrainerClient

    async with Simulator() as sim:
        if drop_configmap:
            sim.store.delete(CONFIGMAPS, "kubeflow-system", "kubeflow-trainer-public")
        path = tmp_path / "kubeconfig"
        sim.write_kubeconfig(str(path))
        config = KubernetesBackendConfig(config_file=str(path))
        with caplog.at_level(logging.WARNING):
            client = await asyncio.to_thread(TrainerClient, config)
            runtimes = await asyncio.to_thread(client.list_runtimes)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return warnings, {r.name for r in runtimes}


async def test_trainer_client_opens_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A Trainer install publishes kubeflow-system/kubeflow-trainer-public, which TrainerClient() reads.
    warnings, runtimes = await _open_trainer_client(tmp_path, caplog, drop_configmap=False)
    assert warnings == []
    assert "torch-distributed" in runtimes


async def test_without_the_trainer_configmap_the_sdk_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The control for the test above: the SDK does warn when the ConfigMap is missing.
    warnings, _ = await _open_trainer_client(tmp_path, caplog, drop_configmap=True)
    assert any("kubeflow-trainer-public" in w for w in warnings)
