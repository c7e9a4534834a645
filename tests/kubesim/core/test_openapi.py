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


def test_deploy_holds_only_kubernetes_objects_and_the_namespace_sorts_first() -> None:
    """What `kubectl apply -f deploy/` reads (cli-runtime's ExpandPathsToFileVisitors: the .json, .yaml,
    .yml files of the directory in name order, no subdirectory without -R) is Kubernetes objects only,
    and the Namespace comes before every object placed in it."""
    files = sorted(p for p in DEPLOY.iterdir() if p.suffix in (".json", ".yaml", ".yml"))
    docs = [d for p in files for d in yaml.safe_load_all(p.read_text()) if d]
    assert docs and all("apiVersion" in d and "kind" in d for d in docs)
    assert "PodMonitor" not in {d["kind"] for d in docs}  # deploy/monitoring/: the operator's kind
    first = [i for i, d in enumerate(docs) if d["kind"] == "Namespace"]
    placed = [i for i, d in enumerate(docs) if d["metadata"].get("namespace") == "dispatch-system"]
    assert first and placed and first[0] < min(placed)


async def test_kubectl_apply_of_the_deploy_directory(tmp_path: Path) -> None:
    async with Simulator(tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        code, out, err = await kubectl(kc, "apply", "-f", f"{DEPLOY}/")
        assert code == 0, err
        assert "namespace/dispatch-system created" in out
        assert "deployment.apps/dispatch-admission created" in out
        assert "clusterrole.rbac.authorization.k8s.io/dispatch-admission created" in out
        assert sim.store.exists(SERVICEACCOUNTS, "dispatch-system", "dispatch-admission")
        assert sim.store.exists(CLUSTERROLES, None, "dispatch-admission")
        assert sim.store.exists(ROLEBINDINGS, "dispatch-system", "dispatch-admission-leader")
        deployment = sim.store.get(DEPLOYMENTS, "dispatch-system", "dispatch-admission")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"memory": "256Mi"}  # the pod template survived pruning
        code, out, err = await kubectl(kc, "apply", "-f", f"{DEPLOY}/")  # a second apply changes nothing
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
