"""Events as on a cluster, over real HTTP and with kubectl: the components' Events (Job controller,
JobSet, kubelet, node controller) with client-go's correlation, Events written by a client (POST, then
PATCH for a repeat), field selectors, and the API server's TTL."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubesim import Simulator
from kubesim.events import COMBINED_PREFIX
from kubesim.resources import EVENTS, NODES, PODS, TRAINJOBS

from .conftest import Raw
from .test_kubectl import KUBECTL, kubectl

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")

NS = "default"
EVENTS_PATH = f"/api/v1/namespaces/{NS}/events"


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    # Every controller, TLS for kubectl; a short TTL knob so expiry is seen in a few simulated minutes.
    async with Simulator(tls=True, event_ttl=600) as s:
        yield s


@pytest.fixture
async def raw(sim: Simulator) -> AsyncIterator[Raw]:
    assert sim.cert is not None
    ctx = ssl.create_default_context(cadata=sim.cert.cert_pem.decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        yield Raw(sim, session, sim.token("admin"))


def trainjob(name: str, script: str, runtime: str = "dispatch-torch") -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {
                "numNodes": 1,
                "image": "registry.example.com/train:1",
                "env": [{"name": "KUBESIM_SCRIPT", "value": script}],
            },
        },
    }


async def events(raw: Raw, selector: str) -> list[dict[str, Any]]:
    code, body, _ = await raw.request("GET", EVENTS_PATH, params={"fieldSelector": selector})
    assert code == 200, body
    items: list[dict[str, Any]] = body["items"]
    return items


async def test_job_controller_and_kubelet_events_with_field_selectors(sim: Simulator, raw: Raw) -> None:
    code, body, _ = await raw.request(
        "POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs", trainjob("ok", "exit 0")
    )
    assert code == 201, body
    await sim.settle()
    sim.advance(1)  # the Job syncs its ended pod a batch period later
    job_events = await events(raw, "involvedObject.kind=Job,involvedObject.name=ok-node-0")
    reasons = [(e["type"], e["reason"], e["source"]["component"]) for e in job_events]
    assert ("Normal", "SuccessfulCreate", "job-controller") in reasons
    assert ("Normal", "Completed", "job-controller") in reasons
    (created,) = [e for e in job_events if e["reason"] == "SuccessfulCreate"]
    assert created["message"].startswith("Created pod: ok-node-0-0-")
    assert created["metadata"]["name"].startswith("ok-node-0.")  # <object>.<hex nanoseconds>
    uid = created["involvedObject"]["uid"]
    assert {e["reason"] for e in await events(raw, f"involvedObject.uid={uid},reason=Completed")} == {
        "Completed"
    }
    kubelet = await events(raw, "involvedObject.kind=Pod,type=Normal,reason=Started")
    assert [e["source"]["component"] for e in kubelet] == ["kubelet"]
    assert await events(raw, "involvedObject.kind=Job,type=Warning") == []
    # The node controller registered every node it saw (Events of cluster objects live in default).
    registered = await events(raw, "reason=RegisteredNode")
    assert {e["involvedObject"]["name"] for e in registered} == {
        n["metadata"]["name"] for n in sim.store.list(NODES)[0]
    }


async def test_a_repeated_event_bumps_count_and_last_timestamp(sim: Simulator, raw: Raw) -> None:
    code, body, _ = await raw.request(
        "POST",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs",
        trainjob("cfg", "config-error creds"),
    )
    assert code == 201, body
    await sim.settle()
    sim.advance(30)  # the kubelet retries every 10 s: three more identical Failed events
    (failed,) = await events(raw, "involvedObject.kind=Pod,reason=Failed")
    assert failed["message"] == 'Error: secret "creds" not found'
    assert failed["count"] == 4
    assert failed["lastTimestamp"] > failed["firstTimestamp"]


async def test_client_events_post_patch_and_expire_after_the_ttl(sim: Simulator, raw: Raw) -> None:
    now = "2026-01-01T00:00:00Z"
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "sup.1", "namespace": NS},
        "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "namespace": NS},
        "reason": "Checkpointed",
        "message": "checkpoint 1 written",
        "type": "Normal",
        "source": {"component": "dispatch-supervisor"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    code, body, _ = await raw.request("POST", EVENTS_PATH, event)
    assert code == 201, body
    sim.advance(400)
    bump = {"count": 2, "lastTimestamp": "2026-01-01T00:06:40Z"}
    code, body, _ = await raw.request(
        "PATCH", f"{EVENTS_PATH}/sup.1", bump, content_type="application/strategic-merge-patch+json"
    )
    assert code == 200, body
    assert body["count"] == 2
    sim.advance(300)  # 700 s after the create, 300 s after the patch: the patch renewed the TTL
    assert [e["count"] for e in await events(raw, "reason=Checkpointed")] == [2]
    sim.advance(301)
    assert await events(raw, "reason=Checkpointed") == []
    code, body, _ = await raw.request("GET", f"{EVENTS_PATH}/sup.1")
    assert code == 404


async def test_similar_events_are_combined_and_spam_is_dropped(sim: Simulator) -> None:
    node = sim.store.get(NODES, None, "node-0")
    for i in range(12):
        sim.recorder.record(node, "Warning", "Flapping", f"attempt {i}", component="tester")
    flapping = [e for e in sim.store.list(EVENTS, NS)[0] if e["reason"] == "Flapping"]
    plain = sorted(e["message"] for e in flapping if not e["message"].startswith(COMBINED_PREFIX))
    (combined,) = [e for e in flapping if e["message"].startswith(COMBINED_PREFIX)]
    assert len(plain) == 9  # the 10th distinct message within 10 minutes starts the combined event
    assert (combined["message"], combined["count"]) == (COMBINED_PREFIX + "attempt 11", 3)
    # 25 events per source and object, then one per 5 minutes: the rest are dropped, as client-go does.
    for i in range(30):
        sim.recorder.record(node, "Normal", f"R{i}", "m", component="tester")
    assert sim.recorder.dropped == 30 - (25 - 12)


async def test_kubectl_get_events_and_describe_trainjob(sim: Simulator, raw: Raw, tmp_path: Path) -> None:
    kc = sim.write_kubeconfig(tmp_path / "kc")
    manifest = tmp_path / "tj.yaml"
    manifest.write_text(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: demo}\n"
        "spec:\n  runtimeRef: {name: dispatch-torch}\n  trainer:\n    numNodes: 1\n"
        "    env: [{name: KUBESIM_SCRIPT, value: exit 3}]\n"
    )
    code, out, err = await kubectl(kc, "apply", "-f", str(manifest))
    assert code == 0, err
    await sim.settle()
    sim.advance(1)  # the Job syncs its failed pod a batch period later
    tj = sim.store.get(TRAINJOBS, NS, "demo")
    supervisor = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "demo.supervisor", "namespace": NS},
        "involvedObject": {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "demo",
            "namespace": NS,
            "uid": tj["metadata"]["uid"],
        },
        "reason": "DispatchFailed",
        "message": "node 0 exited with code 3",
        "type": "Warning",
        "source": {"component": "dispatch"},
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "count": 1,
    }
    code, body, _ = await raw.request("POST", EVENTS_PATH, supervisor)
    assert code == 201, body

    code, out, err = await kubectl(kc, "get", "events")
    assert code == 0, err
    for reason in ("SuccessfulCreate", "BackoffLimitExceeded", "Scheduled", "Started", "DispatchFailed"):
        assert reason in out, out
    code, out, err = await kubectl(
        kc, "get", "events", "--field-selector", "involvedObject.kind=Job,type=Warning"
    )
    assert code == 0, err
    assert "BackoffLimitExceeded" in out and "Job has reached the specified backoff limit" in out
    assert "SuccessfulCreate" not in out

    code, out, err = await kubectl(kc, "describe", "trainjob", "demo")
    assert code == 0, err
    events_part = out.split("Events:", 1)[1]
    assert "DispatchFailed" in events_part and "node 0 exited with code 3" in events_part
    assert "dispatch" in events_part  # the From column


V1_PATH = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"


def v1_event(name: str, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NS},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "dispatch.example.com/supervisor",
        "reportingInstance": "supervisor-1",
        "action": "Requeue",
        "reason": "Requeued",
        "regarding": {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "namespace": NS},
        "note": "incarnation 2 requeued",
        "type": "Normal",
    }
    body.update(over)
    return body


async def test_events_k8s_io_v1_is_a_view_of_the_same_storage(sim: Simulator, raw: Raw) -> None:
    code, body, _ = await raw.request("GET", "/apis/events.k8s.io/v1")
    assert code == 200 and [r["name"] for r in body["resources"]] == ["events"]
    # Written through events.k8s.io/v1, read through core/v1 (and back).
    code, body, _ = await raw.request("POST", V1_PATH, v1_event("req.1"))
    assert code == 201, body
    assert (body["apiVersion"], body["note"], body["regarding"]["name"]) == (
        "events.k8s.io/v1",
        "incarnation 2 requeued",
        "x",
    )
    code, core, _ = await raw.request("GET", f"{EVENTS_PATH}/req.1")
    assert code == 200, core
    assert (core["message"], core["involvedObject"]["kind"], core["reportingComponent"], core["action"]) == (
        "incarnation 2 requeued",
        "ConfigMap",
        "dispatch.example.com/supervisor",
        "Requeue",
    )
    assert "count" not in core and "source" not in core
    # The components' core Events read through events.k8s.io/v1: deprecated* fields carry the old ones.
    code, listed, _ = await raw.request("GET", V1_PATH, params={"fieldSelector": "reason=RegisteredNode"})
    assert code == 200 and listed["kind"] == "EventList" and listed["apiVersion"] == "events.k8s.io/v1"
    first = listed["items"][0]
    assert (first["reportingController"], first["deprecatedCount"], first["deprecatedSource"]) == (
        "node-controller",
        1,
        {"component": "node-controller"},
    )
    assert first["note"].startswith("Node node-") and "message" not in first
    # A series update through v1 (the only change v1 allows) is the core series; count stays unset.
    patch = {"series": {"count": 3, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}}
    code, body, _ = await raw.request(
        "PATCH", f"{V1_PATH}/req.1", patch, content_type="application/merge-patch+json"
    )
    assert code == 200, body
    assert body["series"]["count"] == 3
    code, core, _ = await raw.request("GET", f"{EVENTS_PATH}/req.1")
    assert core["series"]["count"] == 3 and "count" not in core
    # Anything but the series is immutable through v1.
    code, body, _ = await raw.request(
        "PATCH", f"{V1_PATH}/req.1", {"note": "changed"}, content_type="application/merge-patch+json"
    )
    assert code == 422 and body["details"]["causes"][0]["field"] == "message", body
    code, body, _ = await raw.request("DELETE", f"{V1_PATH}/req.1")
    assert code == 200, body
    code, body, _ = await raw.request("GET", f"{EVENTS_PATH}/req.1")
    assert code == 404


async def test_events_k8s_io_v1_validates_strictly_and_core_v1_legacy_only(sim: Simulator, raw: Raw) -> None:
    bare = v1_event("bad.1")
    for field in ("eventTime", "reportingController", "reportingInstance", "action"):
        del bare[field]
    code, body, _ = await raw.request("POST", V1_PATH, bare)
    assert code == 422, body
    assert body["message"] == 'Event.events.k8s.io "bad.1" is invalid: eventTime: Required value'
    fields = [(c["field"], c["message"]) for c in body["details"]["causes"]]
    assert ("eventTime", "Required value") in fields
    # Without eventTime the legacy rules are the old ones: no reporting fields are required.
    assert [f for f, _ in fields] == ["eventTime"]
    withtime = v1_event("bad.2", reportingInstance="", deprecatedCount=2, type="Info")
    code, body, _ = await raw.request("POST", V1_PATH, withtime)
    assert code == 422, body
    assert [(c["field"], c["message"]) for c in body["details"]["causes"]] == [
        ("reportingInstance", "Required value"),
        ("type", 'Invalid value: "": has invalid value: Info'),
        ("count", 'Invalid value: "": needs to be unset'),
    ]
    # core/v1: the namespace of the Event must be the involved object's.
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "elsewhere", "namespace": NS},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "kube-system"},
        "reason": "X",
        "message": "m",
    }
    code, body, _ = await raw.request("POST", EVENTS_PATH, event)
    assert code == 422, body
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "kube-system": does not match event.namespace',
            "field": "involvedObject.namespace",
        }
    ]


async def test_kubectl_reads_events_k8s_io(sim: Simulator, raw: Raw, tmp_path: Path) -> None:
    code, body, _ = await raw.request("POST", V1_PATH, v1_event("req.2"))
    assert code == 201, body
    kc = sim.write_kubeconfig(tmp_path / "kc")
    code, out, err = await kubectl(kc, "get", "events.events.k8s.io", "req.2", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["note"] == "incarnation 2 requeued"


async def test_kueue_events_on_the_workload_and_the_trainjob(sim: Simulator, raw: Raw) -> None:
    path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
    queued = {"kueue.x-k8s.io/queue-name": "user-queue"}
    big = trainjob("big", "hang")
    big["metadata"]["labels"] = queued
    big["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"cpu": "100"}}
    code, body, _ = await raw.request("POST", path, big)
    assert code == 201, body
    small = trainjob("small", "hang")
    small["metadata"]["labels"] = queued
    code, body, _ = await raw.request("POST", path, small)
    assert code == 201, body
    await sim.settle()
    pending = await events(raw, "involvedObject.kind=Workload,reason=Pending,type=Warning")
    assert [e["message"] for e in pending] == [
        "couldn't assign flavors to pod set node: insufficient quota for cpu in flavor default, previously "
        "considered podsets requests (0) + current podset request (100) > maximum capacity (64)"
    ]
    started = await events(raw, "involvedObject.kind=TrainJob,involvedObject.name=small")
    assert [e["reason"] for e in started] == ["CreatedWorkload", "Started"]
    # A node failure under the admitted job evicts it: Kueue stops the TrainJob and says why on it.
    pod = sim.store.list(PODS, NS, label_selector="jobset.sigs.k8s.io/jobset-name=small")[0][0]
    sim.actions.lose_node(pod["spec"]["nodeName"])
    await sim.settle()
    (stopped,) = await events(raw, "involvedObject.name=small,reason=Stopped")
    assert stopped["message"].startswith(
        "Workload eviction triggered due to multiple TAS assigned node failures"
    )
