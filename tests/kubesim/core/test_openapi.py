"""OpenAPI v2/v3 and the stored-only kinds: the operator's manifests in deploy/ apply with kubectl (issue 24)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubesim import Simulator
from kubesim.resources import CLUSTERROLES, DEPLOYMENTS, ROLEBINDINGS, SERVICEACCOUNTS

from .conftest import Raw
from .test_kubectl import KUBECTL, kubectl

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def kubernetes_manifests() -> list[Path]:
    """The files of deploy/ that hold Kubernetes objects, in the order docs/how-to-holds-with-kueue.md
    applies them (rbac.yaml creates the namespace; `kubectl apply -f deploy/` would take the files in
    name order, deployment.yaml first, and fail on a real cluster too). The Prometheus rules and the
    Grafana dashboard are loaded by those tools, not applied (kubectl refuses them: `apiVersion not set`)."""
    out = []
    for path in sorted(DEPLOY.glob("*.yaml"), key=lambda p: (p.name != "rbac.yaml", p.name)):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if all("apiVersion" in d and "kind" in d for d in docs):
            out.append(path)
    return out


def _without_podmonitors(paths: list[Path], tmp: Path) -> list[Path]:
    """The manifests without their PodMonitors: those are the Prometheus operator's kind, which a cluster
    serves only where the operator is installed (kubectl refuses them elsewhere: no matches for kind), and
    kubesim runs no Prometheus operator."""
    out = []
    for path in paths:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") != "PodMonitor"]
        copy = tmp / path.name
        copy.write_text(yaml.safe_dump_all(docs))
        out.append(copy)
    return out


def test_deploy_holds_the_manifests_the_test_applies() -> None:
    names = {p.name for p in kubernetes_manifests()}
    assert {"rbac.yaml", "deployment.yaml", "admission-check.yaml"} <= names


async def test_kubectl_applies_every_manifest_in_deploy(tmp_path: Path) -> None:
    async with Simulator(tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        args = [a for p in _without_podmonitors(kubernetes_manifests(), tmp_path) for a in ("-f", str(p))]
        code, out, err = await kubectl(kc, "apply", *args)
        assert code == 0, err
        assert "deployment.apps/dispatch-admission created" in out
        assert "clusterrole.rbac.authorization.k8s.io/dispatch-admission created" in out
        assert sim.store.exists(SERVICEACCOUNTS, "dispatch-system", "dispatch-admission")
        assert sim.store.exists(CLUSTERROLES, None, "dispatch-admission")
        assert sim.store.exists(ROLEBINDINGS, "dispatch-system", "dispatch-admission-leader")
        deployment = sim.store.get(DEPLOYMENTS, "dispatch-system", "dispatch-admission")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"memory": "256Mi"}  # the pod template survived pruning
        code, out, err = await kubectl(kc, "apply", *args)  # a second apply patches, and changes nothing
        assert code == 0, err
        assert "deployment.apps/dispatch-admission unchanged" in out
        code, out, err = await kubectl(kc, "get", "deploy,sa", "-n", "dispatch-system", "-o", "name")
        assert code == 0, err
        assert "deployment.apps/dispatch-admission" in out and "serviceaccount/dispatch-admission" in out


async def test_explain_answers_for_trainjob_and_deployment(tmp_path: Path) -> None:
    async with Simulator(controllers=[], tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        code, out, err = await kubectl(kc, "explain", "trainjob.spec")
        assert code == 0, err
        assert "runtimeRef\t<Object> -required-" in out or "runtimeRef\t<Object>" in out
        code, out, err = await kubectl(kc, "explain", "deployment.spec.strategy.rollingUpdate")
        assert code == 0, err
        assert "maxSurge" in out and "maxUnavailable" in out
        code, out, err = await kubectl(kc, "explain", "clusterrole.rules")
        assert code == 0 and "verbs\t<[]string>" in out, err


async def test_openapi_v2_is_served_as_json(raw: Raw) -> None:
    headers = raw.headers()
    async with raw.session.get(raw.sim.url + "/openapi/v2", headers=headers) as resp:
        assert resp.status == 200
        doc = await resp.json()
    assert doc["swagger"] == "2.0"
    deployment = doc["definitions"]["io.k8s.api.apps.v1.Deployment"]
    assert deployment["x-kubernetes-group-version-kind"] == [
        {"group": "apps", "version": "v1", "kind": "Deployment"}
    ]
    surge = deployment["properties"]["spec"]["properties"]["strategy"]["properties"]["rollingUpdate"]
    assert surge["properties"]["maxSurge"] == {
        "x-kubernetes-int-or-string": True,
        "type": "string",
        "format": "int-or-string",
    }
    refs = [v for v in _walk(doc) if isinstance(v, str) and v.startswith("#/")]
    assert refs and all(
        r.startswith("#/definitions/") and r.removeprefix("#/definitions/") in doc["definitions"]
        for r in refs
    )
    assert "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs" in doc["paths"]
    # kube-openapi also serves the protobuf form kubectl asks for; kubesim does not (docs/kubesim.md)
    proto = {**headers, "Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}
    async with raw.session.get(raw.sim.url + "/openapi/v2", headers=proto) as resp:
        assert resp.status == 406


def _walk(node: object) -> list[object]:
    if isinstance(node, dict):
        return [v for value in node.values() for v in _walk(value)]
    if isinstance(node, list):
        return [v for value in node for v in _walk(value)]
    return [node]
