"""deploy/supervisor.yaml: the supervisor in-cluster. Its RBAC is the least that works — derived from the
requests the adapter makes over a supervised lifecycle (a requeue, a hold and release, a cancel), every
verb it grants used, and the same lifecycle run on kubesim under a token with exactly its rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeflow_fixtures import STOCK, config, install, kubeconfig, manifest_rules, spec

from dispatch import Action, Cause, ManualClock, Policy, Rule, State
from dispatch.cli.config import load_config
from dispatch.cluster import Cluster
from dispatch.records import MemoryStore
from dispatch_kubeflow.backend import open_backend
from kubesim.auth import Permissions
from kubesim.sim import Simulator

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ACCOUNT = "system:serviceaccount:dispatch-system:dispatch-supervisor"
REQUEUE = Rule(Action.REQUEUE, max=2, backoff=5.0)
POLICY = Policy({Cause.EXIT_CODE: REQUEUE, Cause.UNKNOWN: REQUEUE})
# Granted but not exercised by a lifecycle on ClusterTrainingRuntimes: a job naming a namespaced
# TrainingRuntime reads it before it is placed.
NOT_EXERCISED = {("get", "trainer.kubeflow.org", "trainingruntimes")}


def manifests() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DEPLOY / "supervisor.yaml").read_text()))


def of_kind(kind: str) -> dict[str, Any]:
    (found,) = [m for m in manifests() if m["kind"] == kind]
    return found


async def lifecycle(sim: Simulator, kc: str, run: str) -> dict[str, State]:
    """A supervisor over three jobs: one fails once and is requeued, one is held and released, one is
    cancelled (job ids ending ``run``: each run has its own TrainJobs). Returns their final states."""
    backend = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
    try:
        clock = ManualClock()
        cluster = Cluster(backend, MemoryStore(clock), clock=clock, policy=POLICY)
        script = "env:DISPATCH_EPOCH=1.0: sleep 5; env:DISPATCH_EPOCH=1.0: exit 3; sleep 5; exit 0"
        await cluster.submit(spec(nodes=2, env={"KUBESIM_SCRIPT": script}), job_id=f"requeued-{run}")
        await cluster.submit(spec(env={"KUBESIM_SCRIPT": "sleep 20; exit 0"}), job_id=f"held-{run}")
        await cluster.submit(spec(env={"KUBESIM_SCRIPT": "sleep 60; exit 0"}), job_id=f"cancelled-{run}")
        sup = cluster.supervisor(poll=1.0, lease=30.0)
        sup.keep_watching()
        # A requeue waits until the failed incarnation's pods have terminated (its record is stopping till
        # then): give the second incarnation time to run to its end.
        for i in range(100):
            await sup.step()
            if i == 3:
                await cluster.hold(f"held-{run}")
                await cluster.cancel(f"cancelled-{run}")
            if i == 10:
                await cluster.release(f"held-{run}")
            await sim.settle()
            sim.advance(2)
            clock.advance(2)
        await sup.close()
        return {j: (await cluster.store.get(f"{j}-{run}")).state for j in ("requeued", "held", "cancelled")}
    finally:
        await backend.close()


def used(sim: Simulator, identity: str) -> set[tuple[str, str, str]]:
    """(verb, API group, resource) of every resource request ``identity`` made."""
    out = set()
    for r in sim.requests:
        if r.identity != identity or not r.verb:
            continue
        group = "" if r.path.startswith("/api/") else r.path.split("/")[2]
        out.add((r.verb, group, r.resource))
    return out


def granted() -> set[tuple[str, str, str]]:
    return {
        (verb, group, resource)
        for m in manifests()
        if m["kind"] in ("Role", "ClusterRole")
        for rule in m["rules"]
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


# Creating SelfSubjectAccessReviews is every authenticated user's (system:basic-user).
GIVEN_TO_ALL = {("create", "authorization.k8s.io", "selfsubjectaccessreviews")}


@pytest.mark.asyncio(loop_scope="function")
async def test_the_supervisor_rbac_is_exactly_what_a_supervised_lifecycle_uses(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False) as sim:
        install(sim, *(make() for make in STOCK.values()))
        admin = kubeconfig(tmp_path / "admin", sim.url, sim.token("admin"))
        assert await lifecycle(sim, admin, "admin") == {
            "requeued": State.SUCCEEDED,
            "held": State.SUCCEEDED,
            "cancelled": State.CANCELLED,
        }
        needed = used(sim, "admin") - GIVEN_TO_ALL
        assert needed <= granted(), needed - granted()
        assert granted() - needed == NOT_EXERCISED, "granted but never used: not least"

        token = sim.add_identity(Permissions.custom(ACCOUNT, manifest_rules(manifests())))
        exact = kubeconfig(tmp_path / "exact", sim.url, token)
        assert await lifecycle(sim, exact, "exact") == {
            "requeued": State.SUCCEEDED,
            "held": State.SUCCEEDED,
            "cancelled": State.CANCELLED,
        }
        refused = [(r.verb, r.path) for r in sim.requests if r.identity == ACCOUNT and r.status == 403]
        assert refused == []


def test_the_deployment_runs_supervise_with_probes_metrics_and_the_store_secret(tmp_path: Path) -> None:
    deployment = of_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == of_kind("ServiceAccount")["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["command"] == ["dispatch", "supervise"]
    assert "--metrics-address=0.0.0.0:9464" in container["args"]
    assert deployment["spec"]["replicas"] >= 2
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in container["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == of_kind("Secret")["metadata"]["name"]
    # The config the ConfigMap mounts is one dispatch loads: the Kubeflow adapter on PostgreSQL.
    path = tmp_path / "cluster.yaml"
    path.write_text(of_kind("ConfigMap")["data"]["cluster.yaml"])
    cf = load_config(str(path))
    assert (cf.adapter, cf.store.kind) == ("kubeflow", "postgres")
    role = of_kind("Role")
    assert role["metadata"]["namespace"] == of_kind("RoleBinding")["metadata"]["namespace"]
    assert (
        yaml.safe_load(of_kind("ConfigMap")["data"]["cluster.yaml"])["settings"]["namespace"]
        == (role["metadata"]["namespace"])
    )
    # The PodMonitor lives apart, for clusters that run the Prometheus operator (docs/operations.md).
    (monitor,) = [
        m
        for m in yaml.safe_load_all((DEPLOY / "monitoring" / "podmonitors.yaml").read_text())
        if m["metadata"]["name"] == deployment["metadata"]["name"]
    ]
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert of_kind("Service")["spec"]["ports"][0]["targetPort"] == "metrics"
