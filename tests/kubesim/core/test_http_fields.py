"""Unknown fields over real HTTP: pruned, and warned about, refused or ignored as fieldValidation asks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubesim import Simulator
from kubesim.resources import CONFIGMAPS, PODS, TRAINJOBS

from .conftest import Raw, configmap, trainjob

TJ = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
POD = "/api/v1/namespaces/default/pods"
CM = "/api/v1/namespaces/default/configmaps"


async def send(
    raw: Raw,
    method: str,
    path: str,
    body: Any,
    *,
    params: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any, list[str]]:
    """(status, body, every Warning header) — warnings repeat, so read them all."""
    async with raw.session.request(
        method,
        raw.sim.url + path,
        data=json.dumps(body),
        headers=raw.headers(content_type),
        params=params or {},
    ) as resp:
        return resp.status, json.loads(await resp.text()), resp.headers.getall("Warning", [])


def bogus_trainjob(name: str) -> dict[str, Any]:
    body = trainjob(name)
    body["spec"]["bogus"] = 1
    body["spec"]["trainer"]["numNodez"] = 2
    body["metadata"]["colour"] = "red"
    return body


async def test_warn_is_the_default_and_prunes(sim: Simulator, raw: Raw) -> None:
    code, obj, warnings = await send(raw, "POST", TJ, bogus_trainjob("t"))
    assert code == 201
    assert warnings == [
        '299 - "unknown field \\"metadata.colour\\""',
        '299 - "unknown field \\"spec.bogus\\""',
        '299 - "unknown field \\"spec.trainer.numNodez\\""',
    ]
    stored = sim.store.get(TRAINJOBS, "default", "t")
    for o in (obj, stored):
        assert "bogus" not in o["spec"] and "numNodez" not in o["spec"]["trainer"]
        assert "colour" not in o["metadata"]
        assert o["spec"]["trainer"] == {"numNodes": 1}  # known fields stay


async def test_strict_refuses_with_every_unknown_field(sim: Simulator, raw: Raw) -> None:
    code, body, _ = await send(raw, "POST", TJ, bogus_trainjob("t"), params={"fieldValidation": "Strict"})
    assert code == 400 and body["reason"] == "BadRequest"
    assert body["message"] == (  # transformDecodeError names the kind on create and update
        'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: '
        'strict decoding error: unknown field "metadata.colour", unknown field "spec.bogus", '
        'unknown field "spec.trainer.numNodez"'
    )
    assert not sim.store.exists(TRAINJOBS, "default", "t")


async def test_ignore_prunes_silently(sim: Simulator, raw: Raw) -> None:
    code, obj, warnings = await send(
        raw, "POST", TJ, bogus_trainjob("t"), params={"fieldValidation": "Ignore"}
    )
    assert code == 201 and warnings == [] and "bogus" not in obj["spec"]


async def test_built_in_kinds_nested_and_in_lists(sim: Simulator, raw: Raw) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "image": "busybox", "ports": [{"containerPort": 80, "hostPot": 1}]},
                {"name": "b", "image": "busybox", "imagePullPolicyy": "Always"},
            ],
            "restartPolicy": "Never",
        },
    }
    code, _, warnings = await send(raw, "POST", POD, pod)
    assert code == 201
    assert warnings == [
        '299 - "unknown field \\"spec.containers[0].ports[0].hostPot\\""',
        '299 - "unknown field \\"spec.containers[1].imagePullPolicyy\\""',
    ]
    stored = sim.store.get(PODS, "default", "p")
    assert stored["spec"]["containers"][0]["ports"][0]["containerPort"] == 80
    assert "imagePullPolicyy" not in stored["spec"]["containers"][1]
    assert stored["spec"]["restartPolicy"] == "Never"
    cm = configmap("c")
    cm["datta"] = {"k": "v"}
    code, body, _ = await send(raw, "POST", CM, cm, params={"fieldValidation": "Strict"})
    assert code == 400 and body["message"] == (
        'ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: unknown field "datta"'
    )
    code, _obj, _ = await send(raw, "PUT", CM + "/c", cm)
    assert code == 404  # (not created above)


async def test_update_and_patches_prune_the_result(sim: Simulator, raw: Raw) -> None:
    code, _created, _ = await send(raw, "POST", CM, configmap("c"))
    assert code == 201
    code, obj, warnings = await send(
        raw, "PATCH", CM + "/c", {"extra": 1, "data": {"k": "2"}}, content_type="application/merge-patch+json"
    )
    assert code == 200 and obj["data"] == {"k": "2"} and "extra" not in obj
    assert warnings == ['299 - "unknown field \\"extra\\""']
    obj["immutible"] = True
    code, out, warnings = await send(raw, "PUT", CM + "/c", obj)
    assert code == 200 and "immutible" not in out and warnings == ['299 - "unknown field \\"immutible\\""']
    apply = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "dataa": {}}
    code, body, _ = await send(
        raw,
        "PATCH",
        CM + "/c",
        apply,
        params={"fieldManager": "me", "fieldValidation": "Strict"},
        content_type="application/apply-patch+yaml",
    )
    assert code == 400 and body["message"] == 'strict decoding error: unknown field "dataa"'
    code, body, _ = await send(
        raw,
        "PATCH",
        TJ + "/missing",
        [{"op": "add", "path": "/spec/x", "value": 1}],
        content_type="application/json-patch+json",
    )
    assert code == 404
    await send(raw, "POST", TJ, trainjob("t"))
    code, body, warnings = await send(
        raw,
        "PATCH",
        TJ + "/t",
        [{"op": "add", "path": "/spec/x", "value": 1}],
        content_type="application/json-patch+json",
    )
    assert code == 200 and "x" not in body["spec"] and warnings == ['299 - "unknown field \\"spec.x\\""']
    assert "x" not in sim.store.get(TRAINJOBS, "default", "t")["spec"]
    assert sim.store.get(CONFIGMAPS, "default", "c")["data"] == {"k": "2"}


async def test_preserved_and_map_fields_are_kept(sim: Simulator, raw: Raw) -> None:
    """Labels, annotations, resource maps and env entries are declared fields: nothing is lost."""
    body = trainjob("t")
    body["metadata"]["labels"] = {"a": "b"}
    body["spec"]["trainer"].update(
        resourcesPerNode={"limits": {"nvidia.com/gpu": 1}}, env=[{"name": "X", "value": "1"}]
    )
    code, obj, warnings = await send(raw, "POST", TJ, body, params={"fieldValidation": "Strict"})
    assert code == 201 and warnings == []
    assert obj["spec"]["trainer"]["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 1}}
    assert obj["metadata"]["labels"] == {"a": "b"}


async def test_kubectl_sends_strict_and_hears_the_refusal(tmp_path: Path) -> None:
    from .test_kubectl import KUBECTL, kubectl

    if not KUBECTL.exists():  # pragma: no cover - depends on the environment
        pytest.skip("kubectl is not installed")
    async with Simulator(controllers=[], tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        manifest = tmp_path / "tj.yaml"
        manifest.write_text(
            "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: t}\n"
            "spec:\n  runtimeRef: {name: torch-distributed}\n  trainer: {numNodes: 1, nodes: 2}\n"
        )
        code, _, err = await kubectl(kc, "create", "-f", str(manifest))
        assert code != 0 and 'strict decoding error: unknown field "spec.trainer.nodes"' in err
        assert not sim.store.exists(TRAINJOBS, "default", "t")
        code, _out, err = await kubectl(kc, "create", "--validate=warn", "-f", str(manifest))
        assert code == 0, err
        assert 'unknown field "spec.trainer.nodes"' in err  # kubectl prints the server's warning
        assert sim.store.get(TRAINJOBS, "default", "t")["spec"]["trainer"] == {"numNodes": 1}
