"""Request bodies the API server must refuse cleanly: YAML alias bombs, deep nesting, non-JSON YAML values."""

from __future__ import annotations

from kubesim import Simulator
from kubesim.resources import CONFIGMAPS as CONFIGMAPS_RT

from .conftest import Raw

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def alias_bomb(levels: int = 9) -> str:
    """A few hundred bytes of YAML whose aliases expand to 10**levels strings."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: bomb", 'a0: &a0 ["xxxxxxxxxx"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    lines.append(f"extra: *a{levels - 1}")
    return "\n".join(lines) + "\n"


async def test_a_yaml_alias_bomb_is_400_not_unbounded_memory(raw: Raw, sim: Simulator) -> None:
    status, body, _ = await raw.request("POST", CONFIGMAPS, alias_bomb(), content_type="application/yaml")
    assert status == 400, body
    assert body["reason"] == "BadRequest"
    assert "excessive aliasing" in body["message"]
    assert not sim.store.exists(CONFIGMAPS_RT, "default", "bomb")


async def test_an_alias_bomb_in_server_side_apply_is_400(raw: Raw) -> None:
    status, body, _ = await raw.request(
        "PATCH",
        CONFIGMAPS + "/bomb",
        alias_bomb(),
        content_type="application/apply-patch+yaml",
        params={"fieldManager": "t"},
    )
    assert status == 400, body
    assert "excessive aliasing" in body["message"]


async def test_modest_yaml_aliases_still_work(raw: Raw) -> None:
    doc = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: anchors\n  labels: &l {app: x}\n"
        "  annotations: *l\ndata: {k: v}\n"
    )
    status, body, _ = await raw.request("POST", CONFIGMAPS, doc, content_type="application/yaml")
    assert status == 201, body
    assert body["metadata"]["annotations"] == {"app": "x"}


async def test_yaml_timestamps_stay_strings(raw: Raw) -> None:
    doc = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dates\ndata:\n  day: 2026-11-30\n"
    status, body, _ = await raw.request("POST", CONFIGMAPS, doc, content_type="application/yaml")
    assert status == 201, body
    assert body["data"]["day"] == "2026-11-30"


async def test_yaml_values_json_cannot_hold_are_400(raw: Raw) -> None:
    doc = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: binary\nbinaryData:\n  b: !!binary aGk=\n"
    status, body, _ = await raw.request("POST", CONFIGMAPS, doc, content_type="application/yaml")
    assert status == 400, body
    assert body["reason"] == "BadRequest"


async def test_deeply_nested_bodies_are_400_not_500(raw: Raw) -> None:
    depth = 5000
    deep_json = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"deep"},"x":' + "[" * depth
    deep_json += "]" * depth + "}"
    status, body, _ = await raw.request("POST", CONFIGMAPS, deep_json)
    assert status == 400, body
    assert "nested" in body["message"]
    deep_yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: deep}\nx: " + "[" * depth + "]" * depth
    status, body, _ = await raw.request("POST", CONFIGMAPS, deep_yaml, content_type="application/yaml")
    assert status == 400, body
    status, body, _ = await raw.request(
        "PATCH", CONFIGMAPS + "/deep", "[" * depth + "]" * depth, content_type="application/merge-patch+json"
    )
    assert status == 400, body


async def test_wrongly_typed_delete_options_are_400_not_500(raw: Raw, sim: Simulator) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    status, body, _ = await raw.request("POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 201, body
    for options, field in (
        ({"gracePeriodSeconds": "x"}, "gracePeriodSeconds"),
        ({"gracePeriodSeconds": True}, "gracePeriodSeconds"),
        ({"preconditions": "x"}, "preconditions"),
        ({"preconditions": {"uid": 5}}, "preconditions.uid"),
        ({"dryRun": "All"}, "dryRun"),
    ):
        status, body, _ = await raw.request("DELETE", "/api/v1/namespaces/default/pods/p", options)
        assert status == 400, (options, body)
        assert body["reason"] == "BadRequest"
        assert field in body["message"]
    status, body, _ = await raw.request(
        "DELETE", "/api/v1/namespaces/default/pods/p", {"gracePeriodSeconds": 0}
    )
    assert status == 200, body
