"""A supervisor process SIGKILLed at each point of a requeue, then restarted: the requeue completes
exactly once (one requeue recorded, incarnation 2 created once, never while incarnation 1 had compute).

Real processes, a real SQLite store, and a cluster in a JSON file (``file_cluster``) that outlives them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatch import Actor, JobSpec, decide
from dispatch.model import Epoch, State
from dispatch.records import SqliteStore

CHILD = Path(__file__).with_name("supervisor_child.py")
TIMEOUT = 60.0  # guards against a hung child only

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")


def child(db: Path, cluster: Path, holder: str, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(CHILD), str(db), str(cluster), holder] + ([kill_at] if kill_at else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, cwd=CHILD.parent)


async def submit(db: Path) -> None:
    store = SqliteStore(db)
    try:
        rec, first = decide.submitted(
            "job-a", JobSpec(command=("train",)), policy=None, held=False, now=time.time()
        )
        await store.create(rec, first)
    finally:
        await store.close()


async def read(db: Path) -> tuple[object, list[object]]:
    store = SqliteStore(db)
    try:
        return await store.get("job-a"), await store.history("job-a")
    finally:
        await store.close()


@pytest.mark.parametrize("kill_at", ["requeued", "stop-1", "ceased", "start-2"])
def test_a_supervisor_killed_mid_requeue_and_restarted_finishes_it_exactly_once(
    tmp_path: Path, kill_at: str
) -> None:
    db, cluster = tmp_path / "jobs.db", tmp_path / "cluster.json"
    asyncio.run(submit(db))
    first = child(db, cluster, "first", kill_at)
    assert first.returncode == -9, first.stderr  # it really died by SIGKILL at that point
    rec, _ = asyncio.run(read(db))
    assert rec.lease is not None and rec.lease.holder == "first"  # nothing released: it just died
    second = child(db, cluster, "second")
    assert second.returncode == 0 and second.stdout.strip() == "done", second.stderr
    rec, history = asyncio.run(read(db))
    assert (rec.state, rec.epoch, rec.unknown_write) == (State.SUCCEEDED, Epoch(2, 1), None)
    whats = [t.what for t in history]
    assert whats.count("requeued") == 1
    started = [(t.epoch, t.actor) for t in history if t.what == "started"]
    # Killed right after creating incarnation 2, the supervisor never wrote its "started": the restarted
    # one found the object by its identity and folded its reading, which writes the line instead (every
    # placed incarnation has one, whoever wrote it first).
    second_by = Actor.CLUSTER if kill_at == "start-2" else Actor.SUPERVISOR
    assert [e for e, _ in started] == [Epoch(1, 0), Epoch(2, 1)] and started[1][1] is second_by
    assert [t.state for t in history if t.state is not None and t.epoch == Epoch(2, 1)][-1] is State.SUCCEEDED
    log = json.loads(cluster.read_text())["log"]
    creates = [e for e in log if "create" in e]
    assert [e["create"] for e in creates] == ["job-a-1", "job-a-2"]  # each incarnation exactly once
    assert all(e["overlap"] == [] for e in creates)  # 2 started only once 1's compute was gone
