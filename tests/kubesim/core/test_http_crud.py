"""CRUD over real HTTP: status codes, Status bodies, metadata, CAS, dry run, patch types, paging."""

from __future__ import annotations

import asyncio

import pytest
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError as LkApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod
from lightkube.types import PatchType

from kubesim import Simulator
from kubesim.resources import CONFIGMAPS, PODS

from .conftest import Raw, TrainJob, configmap, trainjob

TJ = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
CM = "/api/v1/namespaces/default/configmaps"


async def test_create_is_201_with_server_metadata(raw: Raw, sim: Simulator) -> None:
    code, body, _ = await raw.request("POST", TJ, trainjob("a"))
    assert code == 201
    meta = body["metadata"]
    assert meta["resourceVersion"] == str(sim.store.resource_version)
    assert meta["generation"] == 1 and meta["uid"] and meta["creationTimestamp"].endswith("Z")
    code, again, _ = await raw.request("GET", TJ + "/a")
    assert code == 200 and again == body


async def test_lightkube_roundtrip_with_generic_resource(client: AsyncClient) -> None:
    created = await client.create(TrainJob(trainjob("lk")))
    assert created.metadata.uid
    got = await client.get(TrainJob, "lk", namespace="default")
    assert got.spec["runtimeRef"]["name"] == "torch-distributed"
    names = [o.metadata.name async for o in client.list(TrainJob, namespace="default")]
    assert names == ["lk"]
    await client.delete(TrainJob, "lk", namespace="default")
    with pytest.raises(LkApiError) as ei:
        await client.get(TrainJob, "lk", namespace="default")
    assert ei.value.status.code == 404


async def test_already_exists_status_body(raw: Raw) -> None:
    await raw.request("POST", TJ, trainjob("a"))
    code, body, _ = await raw.request("POST", TJ, trainjob("a"))
    assert code == 409
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'trainjobs.trainer.kubeflow.org "a" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "a", "group": "trainer.kubeflow.org", "kind": "trainjobs"},
        "code": 409,
    }


async def test_not_found_and_unknown_paths(raw: Raw) -> None:
    code, body, _ = await raw.request("GET", CM + "/nope")
    assert code == 404 and body["reason"] == "NotFound" and body["message"] == 'configmaps "nope" not found'
    code, body, _ = await raw.request("GET", "/apis/example.com/v1/widgets")
    assert code == 404 and body["kind"] == "Status"


async def test_namespace_must_exist(raw: Raw) -> None:
    code, body, _ = await raw.request("POST", "/api/v1/namespaces/ghost/configmaps", configmap("c", "ghost"))
    assert code == 404 and body["message"] == 'namespaces "ghost" not found'
    assert body["details"] == {"name": "ghost", "kind": "namespaces"}


async def test_invalid_label_is_422_with_causes(raw: Raw) -> None:
    code, body, _ = await raw.request("POST", CM, configmap("c", labels={"team": "-bad-"}))
    assert code == 422 and body["reason"] == "Invalid"
    assert body["message"].startswith('ConfigMap "c" is invalid: metadata.labels: Invalid value: "-bad-": ')
    cause = body["details"]["causes"][0]
    assert cause["reason"] == "FieldValueInvalid" and cause["field"] == "metadata.labels"
    long_key = "a" * 254 + "/x"
    code, body, _ = await raw.request("POST", CM, configmap("d", labels={long_key: "v"}))
    assert code == 422 and "prefix part must be no more than 253 characters" in body["message"]


async def test_body_namespace_mismatch_is_400(raw: Raw) -> None:
    code, body, _ = await raw.request("POST", CM, configmap("c", "other"))
    assert code == 400 and "does not match the namespace" in body["message"]


async def test_dry_run_create(raw: Raw, sim: Simulator) -> None:
    rv = sim.store.resource_version
    code, body, _ = await raw.request("POST", TJ, trainjob("d"), params={"dryRun": "All"})
    assert code == 201 and body["metadata"]["uid"] and "resourceVersion" not in body["metadata"]
    assert (await raw.request("GET", TJ + "/d"))[0] == 404
    assert sim.store.resource_version == rv
    code, body, _ = await raw.request("POST", TJ, trainjob("d"), params={"dryRun": "Some"})
    assert code == 400


async def test_update_with_stale_resource_version_conflicts(client: AsyncClient) -> None:
    cm = await client.create(ConfigMap(metadata=ObjectMeta(name="c", namespace="default"), data={"a": "1"}))
    cm.data = {"a": "2"}
    await client.replace(cm)
    cm.data = {"a": "3"}
    with pytest.raises(LkApiError) as ei:
        await client.replace(cm)
    assert ei.value.status.code == 409 and ei.value.status.reason == "Conflict"
    assert "the object has been modified" in ei.value.status.message


async def test_put_on_custom_resource_needs_resource_version(raw: Raw) -> None:
    await raw.request("POST", TJ, trainjob("a"))
    code, body, _ = await raw.request("PUT", TJ + "/a", trainjob("a"))
    assert code == 422 and body["message"] == (
        'trainjobs.trainer.kubeflow.org "a" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
        "must be specified for an update"
    )


async def test_status_subresource_is_separate(raw: Raw) -> None:
    _, created, _ = await raw.request("POST", TJ, trainjob("a"))
    created["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    created["spec"]["suspend"] = True
    code, main, _ = await raw.request("PUT", TJ + "/a", created)
    assert code == 200 and "status" not in main and main["metadata"]["generation"] == 2
    code, st, _ = await raw.request(
        "PATCH",
        TJ + "/a/status",
        {"status": {"conditions": [{"type": "Complete", "status": "True"}]}, "spec": {"suspend": False}},
        content_type="application/merge-patch+json",
    )
    assert code == 200 and st["status"]["conditions"][0]["type"] == "Complete"
    assert st["spec"]["suspend"] is True and st["metadata"]["generation"] == 2


async def test_patch_types_over_http(client: AsyncClient, sim: Simulator) -> None:
    sim.store.create(
        PODS,
        {
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "node", "image": "busybox"}]},
        },
    )
    out = await client.patch(
        Pod,
        "p",
        {"spec": {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}]}},
        namespace="default",
    )  # strategic merge (lightkube's default)
    assert out.spec.containers[0].image == "busybox" and out.spec.containers[0].env[0].name == "A"
    out = await client.patch(
        Pod,
        "p",
        [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}],
        namespace="default",
        patch_type=PatchType.JSON,
    )
    assert out.metadata.labels == {"x": "y"}
    tj = await client.create(TrainJob(trainjob("t")))
    out2 = await client.patch(
        TrainJob, "t", {"spec": {"suspend": True}}, namespace="default", patch_type=PatchType.MERGE
    )
    assert out2.spec["suspend"] is True and out2.metadata.generation == 2
    with pytest.raises(LkApiError) as ei:  # strategic merge patch is not served for custom resources
        await client.patch(TrainJob, "t", {"spec": {"suspend": False}}, namespace="default")
    assert ei.value.status.code == 415
    assert tj.metadata.name == "t"


async def test_server_side_apply_creates_then_merges(client: AsyncClient) -> None:
    first = await client.apply(TrainJob(trainjob("ssa")), field_manager="dispatch")
    assert first.metadata.generation == 1
    body = trainjob("ssa")
    body["spec"]["suspend"] = True
    second = await client.apply(TrainJob(body), field_manager="dispatch")
    assert second.spec["suspend"] is True and second.metadata.generation == 2


async def test_generate_name(raw: Raw) -> None:
    body = configmap("")
    body["metadata"] = {"generateName": "cfg-"}
    code, out, _ = await raw.request("POST", CM, body)
    assert code == 201 and out["metadata"]["name"].startswith("cfg-") and len(out["metadata"]["name"]) == 9


async def test_list_paging_and_resource_version(raw: Raw, sim: Simulator) -> None:
    for i in range(5):
        await raw.request("POST", CM, configmap(f"c{i}"))
    code, page, _ = await raw.request("GET", CM, params={"limit": "2"})
    assert code == 200 and [i["metadata"]["name"] for i in page["items"]] == ["c0", "c1"]
    assert page["metadata"]["resourceVersion"] == str(sim.store.resource_version)
    assert page["metadata"]["remainingItemCount"] == 3
    seen = [i["metadata"]["name"] for i in page["items"]]
    while page["metadata"].get("continue"):
        _, page, _ = await raw.request(
            "GET", CM, params={"limit": "2", "continue": page["metadata"]["continue"]}
        )
        seen += [i["metadata"]["name"] for i in page["items"]]
    assert seen == [f"c{i}" for i in range(5)]
    code, _body, _ = await raw.request("GET", CM, params={"continue": "garbage!"})
    assert code == 400


async def test_delete_status_codes(raw: Raw) -> None:
    await raw.request("POST", CM, configmap("c"))
    code, body, _ = await raw.request("DELETE", CM + "/c")
    assert code == 200 and body["kind"] == "Status" and body["status"] == "Success"
    await raw.request("POST", CM, configmap("f", finalizers=["example.com/keep"]))
    code, body, _ = await raw.request("DELETE", CM + "/f")
    assert code == 200 and body["metadata"]["deletionTimestamp"]
    code, body, _ = await raw.request("DELETE", CM + "/missing")
    assert code == 404


async def test_delete_preconditions(raw: Raw) -> None:
    await raw.request("POST", CM, configmap("c"))
    code, body, _ = await raw.request(
        "DELETE", CM + "/c", {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "other"}}
    )
    assert code == 409 and "Precondition failed: UID in precondition: other" in body["message"]


async def test_deletecollection_with_selector(raw: Raw, sim: Simulator) -> None:
    await raw.request("POST", CM, configmap("a", labels={"app": "x"}))
    await raw.request("POST", CM, configmap("b", labels={"app": "y"}))
    code, body, _ = await raw.request("DELETE", CM, params={"labelSelector": "app=x"})
    assert code == 200 and [i["metadata"]["name"] for i in body["items"]] == ["a"]
    items, _ = sim.store.list(CONFIGMAPS, "default")
    assert [i["metadata"]["name"] for i in items] == ["b"]


async def test_namespaces_cluster_scoped(client: AsyncClient) -> None:
    ns = await client.create(Namespace(metadata=ObjectMeta(name="team-a")))
    assert ns.status.phase == "Active"
    await client.create(ConfigMap(metadata=ObjectMeta(name="c", namespace="team-a")))
    await client.delete(Namespace, "team-a")
    # Terminating until the namespace controller has emptied and finalized it, after the DELETE returned.
    for _ in range(500):
        try:
            await client.get(Namespace, "team-a")
        except LkApiError as e:
            assert e.status.code == 404
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("namespace team-a was never removed")


async def test_crd_rules_hold_without_controllers(sim: Simulator, raw: Raw) -> None:
    """The CRD's defaults, schema and CEL rules are the API server's: a bare simulator applies them;
    Trainer's webhooks (the runtime must exist) come only with its controller."""
    tj = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "no-such-runtime"}},
    }
    code, out, _ = await raw.request("POST", tj, body)
    assert code == 201  # no webhook to look the runtime up
    assert out["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    assert out["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime" and out["spec"]["suspend"] is False
    body["metadata"]["name"] = "1-starts-with-a-digit"
    code, out, _ = await raw.request("POST", tj, body)
    assert code == 422 and "RFC 1035" in out["message"]


async def test_the_annotation_limit_counts_utf8_bytes(raw: Raw) -> None:
    """262,144 bytes of keys and values, as the real server counts: multibyte characters count for more."""
    at_limit = trainjob("ascii")
    at_limit["metadata"]["annotations"] = {"a": "x" * (262_144 - 1)}
    code, _, _ = await raw.request("POST", TJ, at_limit)
    assert code == 201
    wide = trainjob("wide")
    wide["metadata"]["annotations"] = {"a": "é" * 131_072}  # 131,073 characters, 262,145 bytes
    code, body, _ = await raw.request("POST", TJ, wide)
    assert code == 422
    assert "may not be more than 262144 bytes" in body["message"]


async def test_the_request_log_records_the_user_agent(raw: Raw, sim: Simulator) -> None:
    raw.session.headers["User-Agent"] = "audit-me/1.2"
    await raw.request("GET", TJ)
    assert sim.requests.filter(verb="list")[-1].user_agent == "audit-me/1.2"


async def test_an_injected_warning_rides_on_a_successful_write(raw: Raw, sim: Simulator) -> None:
    sim.faults.warn_next('unknown field "spec.bogus"', verb="create", path=r"/trainjobs$")
    code, _, headers = await raw.request("POST", TJ, trainjob("warned"))
    assert code == 201
    assert headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
    code, _, headers = await raw.request("POST", TJ, trainjob("quiet"))
    assert code == 201 and "Warning" not in headers
