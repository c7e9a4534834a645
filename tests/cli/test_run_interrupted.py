"""Ctrl-C during ``dispatch run``'s requeue backoff: the job is pending, and nothing starts it until a
supervisor runs; the message says so, and names ``dispatch supervise``. A real process (SIGINT), over a
SQLite store and the in-process memory cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dispatch.records import SqliteStore


async def _state(db: Path, job_id: str) -> tuple[str, str] | None:
    store = SqliteStore(db)
    try:
        found = [r for r in await store.list() if r.job_id == job_id]
        return (found[0].state.value, str(found[0].epoch)) if found else None
    finally:
        await store.close()


def test_ctrl_c_in_the_requeue_backoff_says_the_job_is_pending_and_who_starts_it(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "adapter: memory\nsettings: {startDelay: 0, cessationDelay: 0.2}\nstore: {sqlite: jobs.db}\n"
        "policy: {rules: {preempted: {action: requeue, max: 2, backoff: 3600}}}\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        'command: [train]\nenv: {KUBESIM_SCRIPT: "env:DISPATCH_EPOCH=1.0: preempt; sleep 1; exit 0"}\n'
    )
    env = {**os.environ, "DISPATCH_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatch.cli", "--config", str(config), "run", str(job), "--job-id", "waits"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        state = None
        for _ in range(1500):  # until the requeue is recorded: pending at 2.1, in its hour of backoff
            db = tmp_path / "jobs.db"
            state = asyncio.run(_state(db, "waits")) if db.exists() else None
            if state == ("pending", "2.1"):
                break
            time.sleep(0.2)
        assert state == ("pending", "2.1"), state
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "interrupted: job waits is pending (2.1)" in err, err
    assert f"`dispatch --config {config} supervise` will start it" in err
