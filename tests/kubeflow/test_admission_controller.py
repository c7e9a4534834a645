"""dispatch-admission on its own, over real HTTP on kubesim: leader election with a Lease, the shipped
least RBAC, the console script and SIGTERM, watches surviving an expired resourceVersion."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from admission_fixtures import CHECK, TASKS, caught_up, install_check, running, settle
from kubeflow_fixtures import install, manifest_rules, torch_runtime

from dispatch.errors import InvalidError
from dispatch_kubeflow.admission import LeaseSettings
from dispatch_kubeflow.names import ANNOTATION_HOLD
from kubesim.auth import Permissions
from kubesim.resources import ADMISSIONCHECKS, LEASES, NAMESPACES, TRAINJOBS, WORKLOADS
from kubesim.sim import Simulator

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
FAST = {"duration": 2.0, "renew_deadline": 1.5, "retry_period": 0.2}


def _trainjob(name: str, *, held: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
    }
    if held:
        meta["annotations"] = {ANNOTATION_HOLD: "h-test"}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1, "image": "x"}},
    }


def _check(sim: Simulator, trainjob: str) -> dict[str, Any]:
    for wl in sim.store.list(WORKLOADS, "default")[0]:
        if any(o["name"] == trainjob for o in wl["metadata"].get("ownerReferences", [])):
            for c in (wl.get("status") or {}).get("admissionChecks") or []:
                if c["name"] == CHECK:
                    return dict(c)
    return {}


def _check_state(sim: Simulator, trainjob: str) -> str | None:
    """The check's state as dispatch-admission wrote it (``None`` until it has: Kueue's initial
    ``Pending`` carries no message of ours)."""
    c = _check(sim, trainjob)
    return c.get("state") if "by dispatch" in c.get("message", "") else None


def _active(sim: Simulator) -> bool:
    ac = sim.store.get(ADMISSIONCHECKS, None, CHECK)
    return any(
        c["type"] == "Active" and c["status"] == "True" for c in ac.get("status", {}).get("conditions", [])
    )


def _renewed(sim: Simulator, ns: str = "default") -> float:
    """The lease's renewTime, in seconds since the epoch."""
    (lease,) = [x for x in sim.store.list(LEASES, ns)[0] if x["metadata"]["name"] == "dispatch-admission"]
    stamp = datetime.strptime(lease["spec"]["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return stamp.timestamp()


def _holder(sim: Simulator, ns: str = "default") -> str | None:
    items = [
        lease for lease in sim.store.list(LEASES, ns)[0] if lease["metadata"]["name"] == "dispatch-admission"
    ]
    return items[0]["spec"].get("holderIdentity") if items else None


async def _until(what: str, done: Any, patience: float = 10.0) -> float:
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > patience:
            raise AssertionError(f"{what}: not within {patience}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def test_lease_settings_are_checked() -> None:
    with pytest.raises(InvalidError, match="renew deadline"):
        LeaseSettings(duration=5, renew_deadline=6, retry_period=1)
    with pytest.raises(InvalidError, match="identity"):
        LeaseSettings(identity="")


async def test_two_replicas_one_leader_takeover_after_a_kill_and_at_once_after_a_clean_stop(
    tmp_path: Path,
) -> None:
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        lease_a = LeaseSettings(namespace="default", identity="replica-a", **FAST)
        lease_b = LeaseSettings(namespace="default", identity="replica-b", **FAST)
        async with running(kc, lease=lease_a) as a, running(kc, lease=lease_b) as b:
            await _until("a leader", lambda: a.leading or b.leading)
            leader, standby = (a, b) if a.leading else (b, a)
            for _ in range(40):  # two seconds: never both, and the standby never writes
                assert not (a.leading and b.leading)
                await asyncio.sleep(0.05)
            await settle(sim, leader)
            assert _active(sim)
            assert standby.reconciler is None and standby.stats["writes"] == 0
            assert _holder(sim) == leader.lease.identity

            # Kill the leader (its task cancelled: no release, the lease must expire).
            task = TASKS[leader]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert not leader.leading
            last = _renewed(sim)  # the dead leader's last renewal, as the lease records it
            took = await _until("takeover", lambda: standby.leading, patience=10)
            after_renewal = time.time() - last
            # Never before the lease expired (how soon after is client-go's retry period plus this
            # machine's load: not asserted).
            assert after_renewal >= FAST["duration"], (took, after_renewal)
            assert _holder(sim) == standby.lease.identity

            # The new leader acts: a held TrainJob's check is Pending, an unheld one's Ready.
            sim.store.create(TRAINJOBS, _trainjob("held", held=True))
            sim.store.create(TRAINJOBS, _trainjob("free", held=False))
            await settle(sim, standby)
            assert (_check_state(sim, "held"), _check_state(sim, "free")) == ("Pending", "Ready")

            # A clean stop releases the lease: a new replica takes over without waiting for expiry.
            await standby.stop()
            assert _holder(sim) == ""
            lease_c = LeaseSettings(
                namespace="default", identity="replica-c", duration=15, renew_deadline=10, retry_period=0.2
            )
            async with running(kc, lease=lease_c) as c:
                took = await _until("takeover of a released lease", lambda: c.leading, patience=5)
                assert took < 1.0, took
                await settle(sim, c)
                tj = sim.store.get(TRAINJOBS, "default", "held")
                tj["metadata"]["annotations"].pop(ANNOTATION_HOLD)
                sim.store.replace(TRAINJOBS, tj)
                await settle(sim, c)
                assert _check_state(sim, "held") == "Ready"


async def test_the_shipped_rbac_is_enough_and_the_lease_rules_are_needed(tmp_path: Path) -> None:
    manifests = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    (ac,) = yaml.safe_load_all((DEPLOY / "admission-check.yaml").read_text())
    assert ac["metadata"]["name"] == CHECK and ac["spec"]["controllerName"] == "dispatch.dev/admission"
    (deployment,) = [
        d for d in yaml.safe_load_all((DEPLOY / "deployment.yaml").read_text()) if d["kind"] == "Deployment"
    ]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "dispatch-admission"
    rules = manifest_rules(manifests)
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime())
        install_check(sim)
        sim.store.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "dispatch-system"}}
        )
        token = sim.add_identity(
            Permissions.custom("system:serviceaccount:dispatch-system:dispatch-admission", rules)
        )
        kc = str(sim.write_kubeconfig(tmp_path / "kc", token=token))
        lease = LeaseSettings(namespace="dispatch-system", identity="rbac", **FAST)
        async with running(kc, lease=lease) as ctl:
            await _until("leading", lambda: ctl.leading)
            await settle(sim, ctl)
            assert _active(sim)
            sim.store.create(TRAINJOBS, _trainjob("held", held=True))
            await settle(sim, ctl)
            assert _check_state(sim, "held") == "Pending"
            assert ctl.stats["errors"] == 0
            assert _holder(sim, "dispatch-system") == "rbac"

        # Without the leader-election Role it never leads, so it never acts.
        role = [r for m in manifests if m["kind"] == "ClusterRole" for r in manifest_rules([m])]
        token = sim.add_identity(Permissions.custom("no-lease", role))
        kc2 = str(sim.write_kubeconfig(tmp_path / "kc2", token=token))
        async with running(
            kc2, lease=LeaseSettings(namespace="dispatch-system", identity="x", **FAST)
        ) as ctl:
            await asyncio.sleep(1.0)
            assert not ctl.leading and ctl.reconciler is None


async def test_watches_relist_after_an_expired_resource_version(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False, history_limit=5) as sim:
        install(sim, torch_runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        async with running(kc) as ctl:
            await settle(sim, ctl)
            assert ctl.reconciler is not None
            lists = ctl.stats["lists"]
            for i in range(4):
                sim.store.create(TRAINJOBS, _trainjob(f"j{i}", held=i % 2 == 0))
            # Drop every stream with its history compacted: resuming from the last version seen is 410 Gone.
            sim.faults.compact()
            sim.faults.drop_watches()
            await settle(sim, ctl)
            await caught_up(sim, ctl)
            assert [_check_state(sim, f"j{i}") for i in range(4)] == ["Pending", "Ready", "Pending", "Ready"]
            assert ctl.stats["lists"] > lists, ctl.stats  # a watch met the compaction: 410, relisted


async def test_watches_resume_after_a_cut_stream_and_relist_after_a_refused_watch(tmp_path: Path) -> None:
    """A stream cut mid-way (no answer: UnavailableError) resumes from the last version seen, with no new
    list; a watch refused outright (403 while RBAC is being fixed) lists afresh once it is allowed."""
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        async with running(kc) as ctl:
            await settle(sim, ctl)
            lists, watches = ctl.stats["lists"], ctl.stats["watches"]
            sim.faults.drop_watches(abort=True)
            sim.store.create(TRAINJOBS, _trainjob("cut", held=True))
            await settle(sim, ctl)
            assert _check_state(sim, "cut") == "Pending"
            assert ctl.stats["lists"] == lists and ctl.stats["watches"] > watches, ctl.stats
            sim.faults.fail_next(1, 403, verb="watch", path="/trainjobs$")
            sim.faults.drop_watches()
            sim.store.create(TRAINJOBS, _trainjob("refused", held=False))
            await settle(sim, ctl)
            assert _check_state(sim, "refused") == "Ready"
            assert sim.faults.injected == 1 and ctl.stats["lists"] == lists + 1, ctl.stats


async def test_the_console_script_serves_and_releases_the_lease_on_sigterm(tmp_path: Path) -> None:
    from kubesim.clock import RealClock

    async with Simulator(install_runtimes=False, clock=RealClock()) as sim:
        install(sim, torch_runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        script = Path(sys.executable).parent / "dispatch-admission"
        proc = await asyncio.create_subprocess_exec(
            str(script),
            "--kubeconfig",
            kc,
            "--lease-namespace",
            "default",
            "--identity",
            "cli-replica",
            "--lease-duration",
            "15",
            "--retry-period",
            "0.2",
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await _until(
                "the script leads and activates the check",
                lambda: _active(sim) and _holder(sim) == "cli-replica",
                patience=20,
            )
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 20)
            assert proc.returncode == 0, err.decode()
            assert _holder(sim) == ""
            assert "released lease" in err.decode()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_a_leader_that_cannot_renew_stops_acting_before_its_lease_can_expire(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        async with running(kc, lease=LeaseSettings(namespace="default", identity="a", **FAST)) as ctl:
            await _until("leading", lambda: ctl.leading)
            # The API server keeps answering 503 (with Retry-After) to every Lease request: the client's
            # own retries would outlast the renew deadline, so each attempt is cut off at it.
            sim.faults.fail_next(100_000, 503, path="/leases")
            await _until("stopped leading", lambda: not ctl.leading, patience=10)
            since = time.time() - _renewed(sim)
            # Before any standby could take the lease over (the lease duration after its last renewal).
            assert FAST["renew_deadline"] <= since < FAST["duration"], since
            assert ctl.reconciler is not None and ctl.reconciler.informers  # it had been acting
            sim.faults.clear()
            await _until("leading again", lambda: ctl.leading, patience=10)
            await settle(sim, ctl)
            assert _active(sim)


async def test_a_failed_status_write_is_retried(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        async with running(kc) as ctl:
            await settle(sim, ctl)
            # More 500s than the client retries: the write fails once, and is tried again later.
            sim.faults.fail_next(6, 500, verb="patch", path="/workloads/.*/status")
            sim.store.create(TRAINJOBS, _trainjob("held", held=True))
            await sim.settle()
            await _until(
                "the check written",
                lambda: "held by dispatch" in _check(sim, "held").get("message", ""),
                patience=20,
            )
            assert ctl.stats["errors"] == 1
