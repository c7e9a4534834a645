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


async def test_serve_readonly_kubeconfig_no_controllers_and_request_log(tmp_path: Path) -> None:
    import json

    kc, ro, log = tmp_path / "admin.yaml", tmp_path / "ro.yaml", tmp_path / "requests.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubesim",
        "serve",
        "--kubeconfig",
        str(kc),
        "--readonly-kubeconfig",
        str(ro),
        "--no-controllers",
        "--request-log",
        str(log),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        while not any("request log" in ln for ln in lines):
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, "serve exited early"
            lines.append(line.decode())
        assert "no controllers" in lines[0]
        tokens = [yaml.safe_load(p.read_text())["users"][0]["user"]["token"] for p in (kc, ro)]
        assert tokens[0] != tokens[1] and (ro.stat().st_mode & 0o077) == 0
        assert all(t not in ln for t in tokens for ln in lines)  # never printed
        if KUBECTL.exists():
            code, out, err = await kubectl(ro, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
            assert code == 0 and out == "readonly", err
            code, _, err = await kubectl(ro, "create", "configmap", "x")
            assert code != 0 and "forbidden" in err
            # no fixtures: no runtimes, no nodes; the CRD's rules still hold
            code, out, err = await kubectl(kc, "get", "clustertrainingruntimes,nodes", "-o", "name")
            assert code == 0 and out.strip() == "", err
            bad = tmp_path / "bad.yaml"
            bad.write_text(
                "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: 9bad}\n"
                "spec: {runtimeRef: {name: x}}\n"
            )
            code, _, err = await kubectl(kc, "create", "-f", str(bad))
            assert code != 0 and "RFC 1035" in err
    finally:
        proc.send_signal(signal.SIGTERM)
        _, tail_err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, tail_err.decode()
    if KUBECTL.exists():
        records = [json.loads(ln) for ln in log.read_text().splitlines()]
        assert records, "no request logged"
        assert set(records[0]) >= {"time", "identity", "userAgent", "verb", "path", "status", "bytes"}
        creates = [r for r in records if r["verb"] == "create" and r["path"].endswith("/configmaps")]
        assert creates and creates[0]["identity"] == "readonly" and creates[0]["status"] == 403
        assert creates[0]["userAgent"].startswith("kubectl")
        assert any(r["status"] == 200 and r["bytes"] > 0 for r in records)
        text = log.read_text()
        assert all(t not in text for t in tokens)
