"""A cluster kept in a JSON file, so that it outlives the supervisor processes the tests kill.

It implements the required ``Backend`` protocol and ``CessationSignal`` (no watcher: the supervisor
polls), on real time. Its one job script: incarnation 1 is preempted ``RUN`` seconds after it is
created, incarnation 2 and later succeed after ``RUN`` seconds; an incarnation's compute lingers
``LINGER`` seconds after it ends or is stopped. Every create is logged, with ``overlap`` when another
incarnation of the job still had compute (what cessation exists to prevent).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from dispatch.backend import Prepared
from dispatch.errors import ConflictError
from dispatch.model import (
    Capabilities,
    Cause,
    Epoch,
    Evidence,
    Handle,
    Identity,
    JobSpec,
    Observation,
    Outcome,
    State,
)

RUN = 0.4
LINGER = 1.0


class FileCluster:
    """``Backend`` + ``CessationSignal`` over the JSON file at ``path``. One process at a time."""

    name = "file"

    def __init__(self, path: str | Path, *, kill_at: str = "") -> None:
        self.path = Path(path)
        self.kill_at = kill_at
        self.cluster_id = f"file:{self.path.resolve()}"  # the file is the cluster

    def load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"objects": {}, "log": []}
        data: dict[str, Any] = json.loads(self.path.read_text())
        return data

    def _save(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)  # a process killed mid-write leaves the old file or the new one

    @staticmethod
    def _handle(obj: dict[str, Any]) -> Handle:
        return Handle("file", Identity(obj["job"], Epoch.parse(obj["epoch"])), obj["ref"])

    @staticmethod
    def _compute_until(obj: dict[str, Any]) -> float:
        end = obj["created"] + RUN
        if obj["stopped"] is not None and obj["stopped"] < end:
            end = obj["stopped"]
        return end + LINGER

    def _outcome(self, obj: dict[str, Any], now: float) -> Outcome:
        end = obj["created"] + RUN
        ev = (Evidence("FileJob", obj["ref"], "Scripted", f"incarnation {obj['epoch']}", at=now),)
        if obj["stopped"] is not None and obj["stopped"] < end:
            return Outcome(State.CANCELLED, Cause.CANCELLED, ev)
        if now < end:
            return Outcome(State.RUNNING, Cause.NONE, ev)
        if Epoch.parse(obj["epoch"]).n == 1:
            return Outcome(State.FAILED, Cause.PREEMPTED, ev)
        return Outcome(State.SUCCEEDED, Cause.NONE, ev)

    def _die(self, point: str) -> None:
        if self.kill_at == point:
            os.kill(os.getpid(), 9)  # SIGKILL: nothing after this line runs, no lease is released

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return Capabilities(cessation=True, notes=("a cluster in a JSON file, for process tests",))

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        return Prepared("file", spec, identity, held, {"ref": f"{identity.job_id}-{identity.epoch.n}"})

    async def start(self, prepared: Prepared) -> Handle:
        data = self.load()
        ident = prepared.identity
        ref = f"{ident.job_id}-{ident.epoch.n}"
        now = time.time()
        existing = data["objects"].get(ref)
        if existing is not None:
            if Epoch.parse(existing["epoch"]).n != ident.epoch.n:
                raise ConflictError(f"{ref} belongs to another incarnation")
            return self._handle(existing)
        overlap = [
            o["ref"]
            for o in data["objects"].values()
            if o["job"] == ident.job_id and self._compute_until(o) > now
        ]
        obj = {"ref": ref, "job": ident.job_id, "epoch": str(ident.epoch), "created": now, "stopped": None}
        data["objects"][ref] = obj
        data["log"].append({"create": ref, "at": now, "overlap": overlap})
        self._save(data)
        self._die(f"start-{ident.epoch.n}")
        return self._handle(obj)

    async def observe(self, handle: Handle) -> Observation:
        now = time.time()
        obj = self.load()["objects"].get(handle.ref)
        if obj is None:
            return Observation(handle, Outcome(State.LOST, Cause.UNKNOWN), now)
        return Observation(self._handle(obj), self._outcome(obj, now), now)

    async def stop(self, handle: Handle) -> None:
        data = self.load()
        obj = data["objects"].get(handle.ref)
        if obj is None or obj["stopped"] is not None:
            return
        obj["stopped"] = time.time()
        data["log"].append({"stop": handle.ref, "at": obj["stopped"]})
        self._save(data)
        self._die(f"stop-{handle.identity.epoch.n}")

    async def list(self) -> list[Observation]:
        now = time.time()
        return [
            Observation(self._handle(o), self._outcome(o, now), now) for o in self.load()["objects"].values()
        ]

    async def close(self) -> None:
        pass

    async def ceased(self, handle: Handle) -> bool:
        obj = self.load()["objects"].get(handle.ref)
        return obj is None or time.time() >= self._compute_until(obj)

    async def wait_ceased(self, handle: Handle) -> None:
        import asyncio

        obj = self.load()["objects"].get(handle.ref)
        if obj is not None:  # the compute's end is known in advance: sleep until then
            await asyncio.sleep(max(0.0, self._compute_until(obj) - time.time()))
