"""ObjectStore semantics (in-process): metadata, CAS, status separation, deletion, watch history."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim.clock import ManualClock, rfc3339
from kubesim.errors import ApiError
from kubesim.resources import CONFIGMAPS, NAMESPACES, PODS, TRAINJOBS
from kubesim.store import ObjectStore, WatchEvent


@pytest.fixture
def store() -> ObjectStore:
    return ObjectStore(ManualClock())


def cm(name: str, ns: str = "default", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, **meta},
        "data": {"k": "v"},
    }


def tj(name: str, ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"runtimeRef": {"name": "torch"}, "suspend": False},
    }


def pod(
    name: str, *, node: str | None = "node-1", owner: dict[str, Any] | None = None, grace: int | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    spec: dict[str, Any] = {"containers": [{"name": "node", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def owner_ref(obj: dict[str, Any], *, block: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": block,
    }


def test_default_namespace_exists_and_create_sets_metadata(store: ObjectStore) -> None:
    assert store.exists(NAMESPACES, None, "default")
    before = store.resource_version
    out = store.create(CONFIGMAPS, cm("a"))
    meta = out["metadata"]
    assert meta["resourceVersion"] == str(before + 1)
    assert "generation" not in meta  # a ConfigMap's registry keeps no generation
    assert store.create(TRAINJOBS, tj("t"))["metadata"]["generation"] == 1
    assert meta["creationTimestamp"] == rfc3339(store.clock.now())
    assert len(meta["uid"]) == 36
    assert store.get(CONFIGMAPS, "default", "a") == out


def test_one_global_counter_across_types(store: ObjectStore) -> None:
    a = store.create(CONFIGMAPS, cm("a"))
    b = store.create(TRAINJOBS, tj("b"))
    assert int(b["metadata"]["resourceVersion"]) == int(a["metadata"]["resourceVersion"]) + 1


def test_already_exists_and_not_found(store: ObjectStore) -> None:
    store.create(CONFIGMAPS, cm("a"))
    with pytest.raises(ApiError) as ei:
        store.create(CONFIGMAPS, cm("a"))
    assert ei.value.code == 409 and ei.value.reason == "AlreadyExists"
    assert ei.value.message == 'configmaps "a" already exists'
    with pytest.raises(ApiError) as ei:
        store.get(TRAINJOBS, "default", "nope")
    assert ei.value.status()["message"] == 'trainjobs.trainer.kubeflow.org "nope" not found'
    assert ei.value.status()["details"] == {
        "name": "nope",
        "group": "trainer.kubeflow.org",
        "kind": "trainjobs",
    }


def test_missing_namespace_is_404(store: ObjectStore) -> None:
    with pytest.raises(ApiError) as ei:
        store.create(CONFIGMAPS, cm("a", ns="ghost"))
    assert ei.value.code == 404 and ei.value.message == 'namespaces "ghost" not found'


def test_generate_name(store: ObjectStore) -> None:
    obj = cm("")
    obj["metadata"] = {"generateName": "job-", "namespace": "default"}
    out = store.create(CONFIGMAPS, obj)
    assert out["metadata"]["name"].startswith("job-") and len(out["metadata"]["name"]) == 9


def test_invalid_labels_are_422(store: ObjectStore) -> None:
    with pytest.raises(ApiError) as ei:
        store.create(CONFIGMAPS, cm("a", labels={"ok": "x" * 64}))
    err = ei.value
    assert err.code == 422 and err.reason == "Invalid"
    assert err.message.startswith('ConfigMap "a" is invalid: metadata.labels: Invalid value: "xxx')
    assert err.details is not None and err.details["causes"][0]["field"] == "metadata.labels"
    with pytest.raises(ApiError):
        store.create(CONFIGMAPS, cm("b", labels={"bad key!": "v"}))
    with pytest.raises(ApiError) as ei:
        store.create(CONFIGMAPS, cm("Bad_Name"))
    assert 'metadata.name: Invalid value: "Bad_Name"' in ei.value.message


def test_dry_run_create_persists_nothing(store: ObjectStore) -> None:
    rv = store.resource_version
    out = store.create(TRAINJOBS, tj("x"), dry_run=True)
    assert out["metadata"]["uid"] and "resourceVersion" not in out["metadata"]
    assert store.resource_version == rv and not store.exists(TRAINJOBS, "default", "x")


def test_stale_resource_version_conflicts(store: ObjectStore) -> None:
    a = store.create(CONFIGMAPS, cm("a"))
    a["data"] = {"k": "2"}
    store.replace(CONFIGMAPS, a)
    a["data"] = {"k": "3"}
    with pytest.raises(ApiError) as ei:
        store.replace(CONFIGMAPS, a)
    assert ei.value.code == 409 and ei.value.reason == "Conflict"
    assert ei.value.message == (
        'Operation cannot be fulfilled on configmaps "a": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


def test_status_subresource_separated_and_generation(store: ObjectStore) -> None:
    t = store.create(TRAINJOBS, tj("t"))
    t["status"] = {"conditions": [{"type": "Complete"}]}
    t["spec"]["suspend"] = True
    out = store.replace(TRAINJOBS, t)
    assert "status" not in out and out["metadata"]["generation"] == 2
    out["status"] = {"conditions": [{"type": "Complete"}]}
    out["spec"]["suspend"] = False
    st = store.replace(TRAINJOBS, out, subresource="status")
    assert st["status"]["conditions"][0]["type"] == "Complete"
    assert st["spec"]["suspend"] is True and st["metadata"]["generation"] == 2
    # metadata-only change does not bump generation
    st["metadata"]["labels"] = {"a": "b"}
    assert store.replace(TRAINJOBS, st)["metadata"]["generation"] == 2


def test_noop_update_keeps_resource_version(store: ObjectStore) -> None:
    events: list[WatchEvent] = []
    store.subscribe(events.append)
    a = store.create(CONFIGMAPS, cm("a"))
    again = store.replace(CONFIGMAPS, a)
    assert again["metadata"]["resourceVersion"] == a["metadata"]["resourceVersion"]
    assert [e.type for e in events] == ["ADDED"]


def test_patch_types(store: ObjectStore) -> None:
    store.create(PODS, pod("p"))
    out = store.patch(
        PODS, "default", "p", {"metadata": {"labels": {"a": "1"}}}, "application/merge-patch+json"
    )
    assert out["metadata"]["labels"] == {"a": "1"}
    out = store.patch(
        PODS,
        "default",
        "p",
        {"spec": {"containers": [{"name": "node", "env": [{"name": "X", "value": "1"}]}]}},
        "application/strategic-merge-patch+json",
    )
    c = out["spec"]["containers"][0]
    assert c["image"] == "busybox" and c["env"] == [{"name": "X", "value": "1"}]
    out = store.patch(
        PODS,
        "default",
        "p",
        [{"op": "replace", "path": "/metadata/labels/a", "value": "2"}],
        "application/json-patch+json",
    )
    assert out["metadata"]["labels"]["a"] == "2"
    with pytest.raises(ApiError) as ei:
        store.patch(TRAINJOBS, "default", "t", {}, "application/strategic-merge-patch+json")
    assert ei.value.code == 415


def test_patch_with_stale_rv_conflicts(store: ObjectStore) -> None:
    a = store.create(CONFIGMAPS, cm("a"))
    store.patch(CONFIGMAPS, "default", "a", {"data": {"k": "2"}}, "application/merge-patch+json")
    with pytest.raises(ApiError) as ei:
        store.patch(
            CONFIGMAPS,
            "default",
            "a",
            {"metadata": {"resourceVersion": a["metadata"]["resourceVersion"]}, "data": {"k": "3"}},
            "application/merge-patch+json",
        )
    assert ei.value.code == 409


def test_server_side_apply_create_then_merge_and_prune(store: ObjectStore) -> None:
    body = cm("a")
    body["data"] = {"one": "1", "two": "2"}
    store.patch(CONFIGMAPS, "default", "a", body, "application/apply-patch+yaml", field_manager="me")
    body["data"] = {"one": "1"}
    out = store.patch(CONFIGMAPS, "default", "a", body, "application/apply-patch+yaml", field_manager="me")
    assert out["data"] == {"one": "1"}
    with pytest.raises(ApiError) as ei:
        store.patch(CONFIGMAPS, "default", "a", body, "application/apply-patch+yaml")
    assert ei.value.code == 422


def test_finalizers_hold_deletion(store: ObjectStore) -> None:
    store.create(CONFIGMAPS, cm("a", finalizers=["example.com/hold"]))
    out = store.delete(CONFIGMAPS, "default", "a")
    assert out["metadata"]["deletionTimestamp"]
    assert store.exists(CONFIGMAPS, "default", "a")
    cur = store.get(CONFIGMAPS, "default", "a")
    cur["metadata"]["finalizers"].append("example.com/other")
    with pytest.raises(ApiError) as ei:
        store.replace(CONFIGMAPS, cur)
    assert ei.value.code == 422
    store.mutate(CONFIGMAPS, "default", "a", lambda o: o["metadata"].pop("finalizers"))
    assert not store.exists(CONFIGMAPS, "default", "a")


def test_pod_graceful_deletion_lingers_until_kubelet(store: ObjectStore) -> None:
    store.create(PODS, pod("p", grace=10))
    out = store.delete(PODS, "default", "p")
    assert out["metadata"]["deletionGracePeriodSeconds"] == 10
    assert out["metadata"]["deletionTimestamp"] == rfc3339(store.clock.now() + 10)
    assert store.exists(PODS, "default", "p")
    store.finalize_pod_deletion("default", "p")
    assert not store.exists(PODS, "default", "p")


def test_unscheduled_pod_and_force_delete_go_at_once(store: ObjectStore) -> None:
    store.create(PODS, pod("p", node=None))
    store.delete(PODS, "default", "p")
    assert not store.exists(PODS, "default", "p")
    store.create(PODS, pod("q"))
    store.delete(PODS, "default", "q", grace_period_seconds=0)
    assert not store.exists(PODS, "default", "q")


def test_a_bare_store_records_deletion_wishes_and_collects_nothing(store: ObjectStore) -> None:
    """As a kube-apiserver without kube-controller-manager: the propagation policy becomes a finalizer,
    dependents stay (tests/kubesim/controllers/test_garbage_collector.py collects them)."""
    owner = store.create(TRAINJOBS, tj("t"))
    store.create(CONFIGMAPS, cm("c", ownerReferences=[owner_ref(owner)]))
    store.delete(TRAINJOBS, "default", "t")
    assert not store.exists(TRAINJOBS, "default", "t")
    assert store.exists(CONFIGMAPS, "default", "c")  # nobody collects it
    o = store.create(TRAINJOBS, tj("o"))
    out = store.delete(TRAINJOBS, "default", "o", propagation="Orphan")
    assert out["metadata"]["finalizers"] == ["orphan"] and out["metadata"]["deletionTimestamp"]
    f = store.create(TRAINJOBS, tj("f"))
    out = store.delete(TRAINJOBS, "default", "f", propagation="Foreground")
    assert out["metadata"]["finalizers"] == ["foregroundDeletion"]
    # A second delete without a policy keeps it; with one, replaces it rather than adding another.
    out = store.delete(TRAINJOBS, "default", "f")
    assert out["metadata"]["finalizers"] == ["foregroundDeletion"]
    out = store.delete(TRAINJOBS, "default", "f", propagation="Orphan")
    assert out["metadata"]["finalizers"] == ["orphan"]
    assert o["metadata"]["uid"] != f["metadata"]["uid"]
    store.create(NAMESPACES, {"metadata": {"name": "team"}})
    store.delete(NAMESPACES, None, "team")
    assert store.get(NAMESPACES, None, "team")["status"]["phase"] == "Terminating"


def test_list_selectors(store: ObjectStore) -> None:
    store.create(CONFIGMAPS, cm("a", labels={"app": "x", "tier": "web"}))
    store.create(CONFIGMAPS, cm("b", labels={"app": "y"}))
    store.create(PODS, pod("p"))
    names = lambda items: [i["metadata"]["name"] for i in items]  # noqa: E731
    assert names(store.list(CONFIGMAPS, "default", label_selector="app in (x,z)")[0]) == ["a"]
    assert names(store.list(CONFIGMAPS, "default", label_selector="!tier")[0]) == ["b"]
    assert names(store.list(CONFIGMAPS, None, field_selector="metadata.name=b")[0]) == ["b"]
    assert names(store.list(PODS, None, field_selector="spec.nodeName=node-1")[0]) == ["p"]
    with pytest.raises(ApiError) as ei:
        store.list(CONFIGMAPS, None, label_selector="app in (")
    assert ei.value.code == 400
    with pytest.raises(ApiError) as ei:
        store.list(CONFIGMAPS, None, field_selector="spec.foo=1")
    assert ei.value.code == 400 and "field label not supported" in ei.value.message


def test_events_since_and_compaction() -> None:
    store = ObjectStore(ManualClock(), history_limit=3)
    rv0 = store.resource_version
    for i in range(2):
        store.create(CONFIGMAPS, cm(f"c{i}"))
    assert [e.type for e in store.events_since(CONFIGMAPS, "default", rv0)] == ["ADDED", "ADDED"]
    for i in range(2, 6):
        store.create(CONFIGMAPS, cm(f"c{i}"))
    with pytest.raises(ApiError) as ei:
        store.events_since(CONFIGMAPS, None, rv0)
    assert ei.value.code == 410 and ei.value.reason == "Expired"
    assert ei.value.message.startswith(f"too old resource version: {rv0} (")
    assert len(store.events_since(CONFIGMAPS, None, store.resource_version - 3)) == 3
    store.compact()
    with pytest.raises(ApiError):
        store.events_since(CONFIGMAPS, None, store.resource_version - 1)
    assert store.events_since(CONFIGMAPS, None, store.resource_version) == []


def test_admission_hooks_run_for_create_update_and_dry_run(store: ObjectStore) -> None:
    seen: list[str] = []

    def mutate(op: str, rt: Any, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        seen.append(op)
        obj.setdefault("metadata", {}).setdefault("labels", {})["defaulted"] = "yes"
        return obj

    def refuse(op: str, rt: Any, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if obj["metadata"]["name"] == "bad":
            raise ApiError(422, "Invalid", "no")

    store.add_admission(CONFIGMAPS, mutate, mutating=True)
    store.add_admission(CONFIGMAPS, refuse)
    assert store.create(CONFIGMAPS, cm("a"), dry_run=True)["metadata"]["labels"] == {"defaulted": "yes"}
    with pytest.raises(ApiError):
        store.create(CONFIGMAPS, cm("bad"))
    assert seen == ["CREATE", "CREATE"]


def test_deleted_event_carries_new_resource_version(store: ObjectStore) -> None:
    events: list[WatchEvent] = []
    store.create(CONFIGMAPS, cm("a"))
    store.subscribe(events.append, rt=CONFIGMAPS)
    store.delete(CONFIGMAPS, "default", "a")
    assert events[-1].type == "DELETED" and events[-1].resource_version == store.resource_version


def test_apply_to_status_merges_list_maps_by_name(store: ObjectStore) -> None:
    from kubesim.resources import WORKLOADS

    wl = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "default"},
        "spec": {"queueName": "q"},
    }
    store.create(WORKLOADS, wl)
    store.mutate(
        WORKLOADS,
        "default",
        "w",
        lambda o: o.update(
            status={
                "admissionChecks": [
                    {"name": "other-check", "state": "Ready"},
                    {"name": "dispatch", "state": "Pending"},
                ]
            }
        ),
        status=True,
    )
    applied = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "w"},
        "status": {"admissionChecks": [{"name": "dispatch", "state": "Ready"}]},
    }
    out = store.patch(
        WORKLOADS,
        "default",
        "w",
        applied,
        "application/apply-patch+yaml",
        subresource="status",
        field_manager="dispatch-admission",
    )
    states = {c["name"]: c["state"] for c in out["status"]["admissionChecks"]}
    assert states == {"other-check": "Ready", "dispatch": "Ready"}
    assert out["spec"] == {"queueName": "q"}


OPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "patch", "delete", "status"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 3),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(OPS)
def test_history_replays_to_the_same_state(ops: list[tuple[str, str, int]]) -> None:
    """Whatever happens, the watch history from the start rebuilds the store's state, with strictly
    increasing resourceVersions, and a no-op never produces an event."""
    store = ObjectStore(ManualClock())
    start = store.resource_version
    for op, name, n in ops:
        try:
            if op == "create":
                store.create(TRAINJOBS, tj(name))
            elif op == "patch":
                store.patch(
                    TRAINJOBS,
                    "default",
                    name,
                    {"spec": {"suspend": n % 2 == 0}},
                    "application/merge-patch+json",
                )
            elif op == "status":
                store.mutate(
                    TRAINJOBS, "default", name, lambda o, n=n: o.update(status={"n": n}), status=True
                )
            else:
                store.delete(TRAINJOBS, "default", name)
        except ApiError as err:
            assert err.code in (404, 409)
    events = store.events_since(TRAINJOBS, "default", start)
    rvs = [e.resource_version for e in events]
    assert rvs == sorted(set(rvs))
    rebuilt: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.type == "DELETED":
            rebuilt.pop(e.obj["metadata"]["name"])
        else:
            rebuilt[e.obj["metadata"]["name"]] = e.obj
        if e.type == "MODIFIED":
            assert e.old is not None and e.old != e.obj
    items, rv = store.list(TRAINJOBS, "default")
    assert {i["metadata"]["name"]: i for i in items} == rebuilt
    assert int(rv) == store.resource_version
