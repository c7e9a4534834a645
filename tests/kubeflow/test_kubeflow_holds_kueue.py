"""Holds under Kueue, end to end over real HTTP: the adapter writes the hold annotation, dispatch-admission
(in-process) turns it into the Workload's admission check state, kubesim's Kueue admits or evicts."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from admission_fixtures import CHECK, install_check, running, settle
from kubeflow_fixtures import config, ident, install, spec, torch_runtime, variant

from dispatch import Cause, Cluster, Handle, MemoryStore, Mode, State, UnsupportedError
from dispatch.backend import place
from dispatch_kubeflow import Backend, StaleHoldError
from dispatch_kubeflow.admission import AdmissionController
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.names import ANNOTATION_HOLD, LABEL_NONCE
from dispatch_kubeflow.naming import identity_labels, native_name
from kubesim.auth import Permissions, Rule
from kubesim.fixtures import add_admission_check
from kubesim.resources import ADMISSIONCHECKS, CLUSTERQUEUES, PODS, TRAINJOBS, WORKLOADS
from kubesim.sim import Simulator
from kubesim.store import WatchEvent

RUNTIME = "dispatch-holds"
KUBECTL = Path(sys.executable).parent / "kubectl"


def _runtime() -> dict[str, Any]:
    rt = variant(torch_runtime(), RUNTIME)
    job = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    job["spec"]["backoffLimit"] = 0
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return rt


class World:
    def __init__(self, sim: Simulator, kc: str, ctl: AdmissionController, backend: Backend) -> None:
        self.sim, self.kc, self.ctl, self.backend = sim, kc, ctl, backend
        self.states: list[tuple[str, str]] = []  # (workload, check state) as committed, in order
        sim.store.subscribe(self._record, rt=WORKLOADS)

    def _record(self, ev: WatchEvent) -> None:
        for c in (ev.obj.get("status") or {}).get("admissionChecks") or []:
            entry = (ev.obj["metadata"]["name"], c["state"])
            import os

            if os.environ.get("DBG") and c["name"] == CHECK:
                print(
                    entry,
                    c.get("message"),
                    [(x["type"], x["status"], x["reason"]) for x in ev.obj["status"].get("conditions", [])],
                )
            if c["name"] == CHECK and (not self.states or self.states[-1] != entry):
                self.states.append(entry)

    async def settle(self, seconds: float = 0) -> None:
        if seconds:
            self.sim.advance(seconds)
        await settle(self.sim, self.ctl)

    def workload(self, handle: Handle) -> dict[str, Any]:
        name = handle.ref.split("/", 1)[1]
        (wl,) = [
            w
            for w in self.sim.store.list(WORKLOADS, "default")[0]
            if any(o["name"] == name for o in w["metadata"].get("ownerReferences", []))
        ]
        return wl

    def check(self, handle: Handle) -> dict[str, Any]:
        (c,) = [c for c in self.workload(handle)["status"]["admissionChecks"] if c["name"] == CHECK]
        return c

    def condition(self, handle: Handle, ctype: str) -> tuple[str, str] | None:
        for c in self.workload(handle)["status"].get("conditions", []):
            if c["type"] == ctype:
                return c["status"], c["reason"]
        return None

    def pods(self, handle: Handle) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in identity_labels(handle.identity).items())
        return self.sim.store.list(PODS, "default", label_selector=selector)[0]

    def trainjob(self, handle: Handle) -> dict[str, Any]:
        return self.sim.store.get(TRAINJOBS, "default", handle.ref.split("/", 1)[1])


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with Simulator(install_runtimes=False, tls=True) as sim:
        install(sim, torch_runtime(), _runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        async with running(kc) as ctl:
            await settle(sim, ctl)
            backend = await open_backend(
                config({"kubeconfig": kc, "queue": "user-queue", "admissionCheck": CHECK}), probe_window=0.2
            )
            try:
                w = World(sim, kc, ctl, backend)
                await w.settle()
                yield w
            finally:
                await backend.close()


def _spec() -> Any:
    return spec(RUNTIME, env={"KUBESIM_SCRIPT": "print started; hang"})


async def test_the_controller_activates_the_check_and_the_adapter_can_hold(world: World) -> None:
    ac = world.sim.store.get(ADMISSIONCHECKS, None, CHECK)
    (active,) = [c for c in ac["status"]["conditions"] if c["type"] == "Active"]
    assert (active["status"], active["reason"]) == ("True", "Active")
    caps = await world.backend.capabilities()
    assert caps.holds and caps.queueing
    assert any("admission check 'dispatch-hold'" in n for n in caps.notes)


async def test_held_release_run_hold_evict_release_succeed(world: World) -> None:
    b = world.backend
    handle = await place(b, _spec(), ident("kq-held"), held=True)
    await world.settle()
    # Held: the check stays Pending, the job unadmitted and suspended (by Kueue), state held.
    assert world.check(handle)["state"] == "Pending"
    assert "held by dispatch" in world.check(handle)["message"]
    assert world.condition(handle, "QuotaReserved") == ("True", "QuotaReserved")
    assert world.condition(handle, "Admitted") in (None, ("False", "UnsatisfiedAdmissionChecks"))
    for _ in range(3):
        await world.settle(60)
        obs = await b.observe(handle)
        assert obs.state is State.HELD, obs.outcome
        assert world.pods(handle) == []
    assert obs.outcome.evidence[0].reason == "HeldByDispatch"
    assert ANNOTATION_HOLD in obs.outcome.evidence[0].message

    token = await b.hold(handle)  # idempotent on a job created held: its token
    assert token == world.trainjob(handle)["metadata"]["annotations"][ANNOTATION_HOLD]
    with pytest.raises(StaleHoldError, match="another hold"):
        await b.release(handle, type(token)(f"{token}-not-this-one"))
    await b.release(handle, token)
    await world.settle()
    assert world.check(handle)["state"] == "Ready"
    assert world.condition(handle, "Admitted") == ("True", "Admitted")
    await world.settle(5)
    assert (await b.observe(handle)).state is State.RUNNING

    # Holding a running job: Retry, Kueue evicts it, the check goes back to Pending, the job is held.
    second = await b.hold(handle)
    assert second != token
    await world.settle()
    await world.settle(60)  # the pods terminate gracefully
    wl_name = world.workload(handle)["metadata"]["name"]
    mine = [s for w, s in world.states if w == wl_name]
    # (kubesim's Kueue may re-admit from a stale copy and evict again before the reset sticks: the
    # order Ready → Retry → Pending and the end state are what dispatch-admission is responsible for.)
    ready = mine.index("Ready")
    assert mine[:ready] == ["Pending"] and mine[ready + 1] == "Retry" and mine[-1] == "Pending", mine
    (evictions,) = world.workload(handle)["status"]["schedulingStats"]["evictions"]
    assert evictions["reason"] == "AdmissionCheck"
    assert world.trainjob(handle)["spec"]["suspend"] is True
    assert [p for p in world.pods(handle) if not p["metadata"].get("deletionTimestamp")] == []
    held = (await b.observe(handle)).outcome
    # Suspended by Kueue after the eviction, and requeued: our hold (cause table row 2), not a queue.
    assert (held.state, held.cause) == (State.HELD, Cause.NONE), held
    assert held.evidence[0].reason == "HeldByDispatch", held
    with pytest.raises(StaleHoldError):
        await b.release(handle, token)  # the first hold's token is stale

    await b.release(handle, second)
    await world.settle(5)
    assert world.check(handle)["state"] == "Ready"
    assert (await b.observe(handle)).state is State.RUNNING
    for pod in world.pods(handle):
        world.sim.actions.exit("default", pod["metadata"]["name"], 0)
    await world.settle(5)
    assert (await b.observe(handle)).state is State.SUCCEEDED
    with pytest.raises(StaleHoldError, match="no hold"):
        await b.release(handle, second)


async def test_a_release_aimed_at_an_older_incarnation_is_stale(world: World) -> None:
    b = world.backend
    newer = await place(b, _spec(), ident("kq-inc", n=2), held=True)
    token = await b.hold(newer)
    older = Handle(newer.backend, ident("kq-inc", n=1), newer.ref)
    with pytest.raises(StaleHoldError, match="older incarnation"):
        await b.release(older, token)
    gone = Handle(newer.backend, ident("kq-inc", n=1), f"default/{native_name(ident('kq-inc', n=1))}")
    with pytest.raises(StaleHoldError, match="no longer exists"):
        await b.release(gone, token)
    assert world.trainjob(newer)["metadata"]["annotations"][ANNOTATION_HOLD] == token


async def test_submit_held_dry_run_shows_exactly_what_submit_creates(world: World) -> None:
    cluster = Cluster(world.backend, MemoryStore())
    shown = await cluster.dry_run(_spec(), job_id="kq-dry", held=True)
    rec = await cluster.submit(_spec(), job_id="kq-dry", held=True)
    assert rec.handle is not None
    stored = world.trainjob(rec.handle)
    # The same object but the record's nonce, which a submit draws afresh (and the name's hash covers).
    assert stored["metadata"]["annotations"] == shown["metadata"]["annotations"]
    assert _but_nonce(stored["metadata"]["labels"]) == _but_nonce(shown["metadata"]["labels"])
    assert stored["metadata"]["labels"][LABEL_NONCE] == rec.nonce
    assert shown["metadata"]["annotations"][ANNOTATION_HOLD] == rec.hold_token
    assert "suspend" not in shown["spec"]  # Kueue owns suspend; the admission check holds it
    await world.settle()
    assert (await cluster.get("kq-dry")).state is State.HELD
    # Through the host: release with the recorded token, the job runs; hold again, it is held.
    await cluster.release("kq-dry")
    await world.settle(5)
    assert (await cluster.get("kq-dry")).state is State.RUNNING
    rec = await cluster.hold("kq-dry")
    assert rec.hold_token is not None and rec.hold_token != shown["metadata"]["annotations"][ANNOTATION_HOLD]
    await world.settle(60)
    assert (await cluster.get("kq-dry")).state is State.HELD


async def test_kubectl_shows_the_admission_check_states(world: World) -> None:
    b = world.backend
    held = await place(b, _spec(), ident("kq-ctl-held"), held=True)
    free = await place(b, _spec(), ident("kq-ctl-free"))
    await world.settle(5)

    async def kubectl(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL),
            "--kubeconfig",
            world.kc,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode()

    table = await kubectl("get", "workloads")
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    held_wl, free_wl = world.workload(held)["metadata"]["name"], world.workload(free)["metadata"]["name"]
    assert rows[held_wl][1:4] == ["user-queue", "cluster-queue", "False"]
    assert rows[free_wl][1:4] == ["user-queue", "cluster-queue", "True"]
    columns = "NAME:.metadata.name,CHECK:.status.admissionChecks[*].name,STATE:.status.admissionChecks[*].state,MESSAGE:.status.admissionChecks[*].message"
    table = await kubectl("get", "workloads", "-o", f"custom-columns={columns}")
    lines = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert lines[held_wl].split()[1:3] == [CHECK, "Pending"] and "held by dispatch" in lines[held_wl]
    assert lines[free_wl].split()[1:] == [CHECK, "Ready", "not", "held", "by", "dispatch"]
    ac = json.loads(await kubectl("get", "admissionchecks", CHECK, "-o", "json"))
    assert ac["spec"]["controllerName"] == "dispatch.dev/admission"


async def test_holds_are_refused_with_every_reason_without_a_working_check(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime(), _runtime())
        # Served by another controller, never activated, and not listed by the queue's ClusterQueue.
        add_admission_check(sim.store, "other", "example.org/other")
        cq = sim.store.get(CLUSTERQUEUES, None, "cluster-queue")
        cq["spec"]["admissionChecksStrategy"]["admissionChecks"] = []
        sim.store.replace(CLUSTERQUEUES, cq)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        b = await open_backend(
            config({"kubeconfig": kc, "queue": "user-queue", "admissionCheck": "other"}), probe_window=0.1
        )
        try:
            caps = await b.capabilities()
            assert not caps.holds
            notes = [n for n in caps.notes if n.startswith("holds: ")]
            assert len(notes) == 3, caps.notes
            writes = len(sim.requests.writes())
            with pytest.raises(UnsupportedError) as info:
                await place(b, _spec(), ident("kq-refused"), held=True)
            assert len(info.value.reasons) == 3
            assert "names controller 'example.org/other'" in info.value.reasons[0]
            assert "is not Active" in info.value.reasons[1]
            assert "does not list" in info.value.reasons[2]
            assert len(sim.requests.writes()) == writes
            cluster = Cluster(b, MemoryStore())
            with pytest.raises(UnsupportedError) as info:
                await cluster.submit(_spec(), job_id="kq-refused", held=True)
            assert any("is not Active" in r for r in info.value.reasons)
        finally:
            await b.close()


async def test_a_clusterqueue_the_credentials_may_not_read_turns_holds_off_with_the_reason(
    tmp_path: Path,
) -> None:
    """Preflight only reads; a ClusterQueue it may not get (403) is a reason holds are off, not a failed open."""
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime(), _runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        async with running(kc) as ctl:
            await settle(sim, ctl)
            rules = [
                Rule.of(
                    "*", ["", "batch", "trainer.kubeflow.org", "jobset.x-k8s.io", "authorization.k8s.io"]
                ),
                Rule.of(
                    ["get", "list", "watch"],
                    "kueue.x-k8s.io",
                    ["workloads", "localqueues", "workloadpriorityclasses", "admissionchecks"],
                ),
            ]
            token = sim.add_identity(Permissions.custom("no-clusterqueues", rules))
            settings = {"kubeconfig": kc, "queue": "user-queue", "admissionCheck": CHECK}
            b = await open_backend(config(settings, token=token), probe_window=0.1)
            try:
                caps = await b.capabilities()
                assert caps.mode is Mode.READ_WRITE and caps.queueing and not caps.holds, caps
                (note,) = [n for n in caps.notes if n.startswith("holds: ")]
                assert "could not read ClusterQueue 'cluster-queue'" in note and "grant get" in note, note
            finally:
                await b.close()


def _without_store_label(obj: Any) -> int:
    """Remove every ``dispatch.io/store`` label from ``obj``; how many there were."""
    n = 0
    if isinstance(obj, dict):
        n += obj.pop("dispatch.io/store", None) is not None
        n += sum(_without_store_label(v) for v in obj.values())
    elif isinstance(obj, list):
        n += sum(_without_store_label(v) for v in obj)
    return n


async def test_cli_submit_held_dry_run_shows_what_submit_held_creates(world: World, tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.yaml"
    settings = {"kubeconfig": world.kc, "queue": "user-queue", "admissionCheck": CHECK}
    cluster_file.write_text(
        yaml.safe_dump(
            {"adapter": "kubeflow", "settings": settings, "store": {"sqlite": str(tmp_path / "j.db")}}
        )
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(_spec().to_json()))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatch.cli",
        "--config",
        str(cluster_file),
        "--json",
        "submit",
        str(job_file),
        "--held",
        "--dry-run",
        "--job-id",
        "kq-cli",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    shown = json.loads(out)
    writes = len(world.sim.requests.writes())
    assert not world.sim.store.list(TRAINJOBS, "default")[0] or all(
        t["metadata"]["name"] != shown["metadata"]["name"]
        for t in world.sim.store.list(TRAINJOBS, "default")[0]
    )
    rec = await Cluster(world.backend, MemoryStore()).submit(_spec(), job_id="kq-cli", held=True)
    assert rec.handle is not None and len(world.sim.requests.writes()) > writes
    stored = world.trainjob(rec.handle)
    # The CLI's store marks what it creates (dispatch.io/store: the TrainJob and, through the runtime
    # patch, its JobSet, Jobs and pods); this test's backend was opened without a store.
    assert _without_store_label(shown) == 4
    for part in ("annotations", "namespace"):
        assert stored["metadata"][part] == shown["metadata"][part], part
    # The same but the record's nonce, which the submit drew afresh (the name's hash covers it).
    assert _but_nonce(stored["metadata"]["labels"]) == _but_nonce(shown["metadata"]["labels"])
    assert stored["metadata"]["name"].rsplit("-", 1)[0] == shown["metadata"]["name"].rsplit("-", 1)[0]
    # What the server added: Trainer's managedBy default, Kueue's suspend and its own runtime patch
    sent = {k: v for k, v in stored["spec"].items() if k not in ("suspend", "managedBy")}
    sent["runtimePatches"] = [  # (and the time the Trainer webhook stamps on each patch)
        {k: v for k, v in p.items() if k != "time"}
        for p in sent["runtimePatches"]
        if p["manager"] != "kueue.x-k8s.io/manager"
    ]
    assert _strip_nonce(sent) == _strip_nonce(shown["spec"])


def _but_nonce(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != LABEL_NONCE}


def _strip_nonce(value: Any) -> Any:
    """``value`` without the nonce label anywhere in it (the runtime patch labels the pods with it)."""
    if isinstance(value, dict):
        return {k: _strip_nonce(v) for k, v in value.items() if k != LABEL_NONCE}
    if isinstance(value, list):
        return [_strip_nonce(v) for v in value]
    return value


@pytest.fixture
def recorder() -> Any:
    from dispatch import metrics

    rec = metrics.enable()
    try:
        yield rec
    finally:
        metrics.disable()


async def test_the_controller_counts_the_check_states_it_writes_and_says_it_leads(
    recorder: Any, world: World
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    b = world.backend
    handle = await place(b, _spec(), ident("kq-metrics"), held=True)
    await world.settle()
    assert world.check(handle)["state"] == "Pending"
    assert (await b.observe(handle)).state is State.HELD
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(recorder.exposition().decode())
        for s in f.samples
    }
    assert samples[("dispatch_admission_leader", ())] == 1.0
    assert samples[("dispatch_admission_checks_total", (("state", "Pending"),))] >= 1.0


async def test_a_probe_queued_through_its_window_still_follows_pods(tmp_path: Path) -> None:
    """Under Kueue the probe can wait in its queue the whole window and show no pod (here: nobody serves
    the queue's admission check while the backend opens). Pods are followed all the same: a job admitted
    later reads running. (Under load the probe saw no pod in its window, the backend stopped following
    pods, and every job read "starting" for good.)"""
    async with Simulator(install_runtimes=False, tls=True) as sim:
        install(sim, torch_runtime(), _runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        backend = await open_backend(
            config({"kubeconfig": kc, "queue": "user-queue", "admissionCheck": CHECK}), probe_window=0.2
        )
        try:
            async with running(kc) as ctl:
                world = World(sim, kc, ctl, backend)
                handle = await place(backend, _spec(), ident("kq-late"))
                states = []
                for _ in range(20):
                    await world.settle(5)
                    obs = await backend.observe(handle)
                    states.append(obs.state)
                    if obs.state is State.RUNNING:
                        break
                assert states[-1] is State.RUNNING, states
                assert world.pods(handle), "the job's pods exist"
            assert backend.facts.pods_visible is None, backend.facts  # unknown, not "cannot be read"
            caps = await backend.capabilities()
            assert caps.cessation and caps.output
            assert any("no pod of the probe appeared" in n for n in caps.notes), caps.notes
        finally:
            await backend.close()
