"""``python -m kubesim serve`` as a user runs it: a subprocess, a kubeconfig, kubectl, then SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import yaml

from .test_kubectl import KUBECTL, kubectl


async def test_serve_writes_kubeconfig_and_stops_on_sigterm(tmp_path: Path) -> None:
    kc = tmp_path / "kubesim.yaml"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubesim",
        "serve",
        "--kubeconfig",
        str(kc),
        "--speed",
        "10",
        "--no-kueue",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        while not any("kubeconfig written" in ln for ln in lines):
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, "serve exited early"
            lines.append(line.decode())
        cfg = yaml.safe_load(kc.read_text())
        assert cfg["current-context"] == "kubesim"
        assert cfg["clusters"][0]["cluster"]["server"].startswith("https://127.0.0.1:")
        assert "certificate-authority-data" in cfg["clusters"][0]["cluster"]
        assert (kc.stat().st_mode & 0o077) == 0  # the token is private to its owner
        token = cfg["users"][0]["user"]["token"]
        assert all(token not in ln for ln in lines)
        # A second serve with the same kubeconfig refuses: it must not overwrite the first one's.
        before = kc.read_bytes()
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(kc),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, second_err = await asyncio.wait_for(second.communicate(), 30)
        assert second.returncode != 0
        assert b"belongs to another kubesim that is still serving" in second_err
        assert kc.read_bytes() == before
        if KUBECTL.exists():
            code, out, err = await kubectl(kc, "get", "clustertrainingruntimes", "-o", "name")
            assert code == 0, err
            assert "clustertrainingruntime.trainer.kubeflow.org/torch-distributed" in out
    finally:
        proc.send_signal(signal.SIGTERM)
        tail_out, tail_err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, tail_err.decode()
    assert b"stopping" in tail_out
