"""The adapter reads the built-in kinds it reads in bulk (pods, Jobs, Events, nodes, namespaces) in protobuf,
as client-go's controllers do, decoded into the dicts it reads from JSON; custom resources stay JSON."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeflow_live import Collector, Live, job, live

from dispatch import State
from dispatch.backend import place
from dispatch.errors import NotFoundError
from dispatch_kubeflow import protobuf
from dispatch_kubeflow.kube import KubeClient
from kubesim.protowire import encode_body
from kubesim.resources import PODS


@pytest_asyncio.fixture
async def lv(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path):
        yield x


def _project(value: Any, kind: str) -> Any:
    """``value`` (JSON) as the adapter's decoder yields it: only the fields its table names, no empty
    strings, times as RFC 3339 seconds (``Time``) or microseconds (``MicroTime``)."""
    if kind == "s":
        return str(value)
    if kind in ("i", "b"):
        return value
    if kind == "Q":
        return str(value)
    if kind in ("T", "U"):
        return value  # kubesim writes the forms the decoder writes
    fields = {name: (k, label) for name, k, label in protobuf._TABLE[kind].values()}
    out: dict[str, Any] = {}
    for name, v in value.items():
        if name not in fields or v is None:
            continue
        k, label = fields[name]
        if label == "r":
            if v:
                out[name] = [_project(x, k) for x in v]
        elif label == "m":
            if v:
                out[name] = {key: _project(x, k) for key, x in v.items()}
        elif v != "":
            out[name] = _project(v, k)
    return out


async def test_the_adapter_reads_built_in_kinds_in_protobuf_and_the_same_dicts_as_json(lv: Live) -> None:
    backend = await lv.open()
    handle = await place(backend, job("print hello; print bye; exit 3"), _ident("pb-1"))
    watch = Collector(backend.watch())
    try:
        await lv.until(lambda: watch.last(handle) is State.FAILED, "the job failed")
    finally:
        await watch.close()
    # Every watch and list of a built-in kind was answered in protobuf, every custom resource in JSON.
    seen = {(r.verb, r.resource, r.content_type) for r in lv.sim.requests if r.verb in ("list", "watch")}
    pb = "application/vnd.kubernetes.protobuf"
    assert {("list", "pods", pb), ("watch", "pods", pb), ("list", "jobs", pb), ("watch", "jobs", pb)} <= seen
    assert {("list", "trainjobs", "application/json"), ("watch", "trainjobs", "application/json")} <= seen
    assert not {x for x in seen if x[1] in ("trainjobs", "jobsets", "workloads") and x[2] == pb}
    obs = await backend.observe(handle)
    assert obs.outcome.state is State.FAILED and any(e.exit_code == 3 for e in obs.outcome.evidence)
    assert any("bye" in "\n".join(e.output) for e in obs.outcome.evidence), obs.outcome.evidence

    client = KubeClient.connect(kubeconfig=lv.kc)
    try:
        for path in (
            "/api/v1/namespaces/default/pods",
            "/apis/batch/v1/namespaces/default/jobs",
            "/api/v1/namespaces/default/events",
            "/api/v1/nodes",
            "/api/v1/namespaces/kube-system",
        ):
            client.protobuf = True
            from_pb = await client.request("GET", path, what=path)
            client.protobuf = False
            from_json = await client.request("GET", path, what=path)
            assert from_pb["kind"] == from_json["kind"]
            table = from_json["kind"]
            expected = _project(from_json, table)
            expected.update(apiVersion=from_json["apiVersion"], kind=from_json["kind"])
            for item in expected.get("items", []):
                item.update(apiVersion=from_json["apiVersion"], kind=table[:-4])
            assert from_pb == expected, path
            if path.endswith("pods"):
                assert from_pb["items"] and any(
                    (cs.get("state") or {}).get("terminated", {}).get("exitCode") == 3
                    for p in from_pb["items"]
                    for cs in p["status"].get("containerStatuses", [])
                )
        # An error answer in protobuf is a Status, and maps to dispatch's error as from JSON.
        client.protobuf = True
        with pytest.raises(NotFoundError, match="not found"):
            await client.request("GET", "/api/v1/namespaces/default/pods/nope", what="get pod nope")
        with pytest.raises(NotFoundError):
            await client.request("GET", "/apis/batch/v1/namespaces/default/jobs/nope", what="get job nope")
    finally:
        await client.close()


def _ident(job_id: str) -> Any:
    from kubeflow_fixtures import ident

    return ident(job_id)


def test_the_adapters_field_numbers_are_upstreams() -> None:
    """The decoder's table agrees with the tables kubesim encodes with (both from upstream's
    generated.proto files; kubesim's are generated by tools/kubesim_protos.py)."""
    messages = json.loads((Path(__file__).parents[2] / "src/kubesim/protos.json").read_text())["messages"]
    full = {
        name.rsplit(".", 1)[1]: name
        for name in messages
        if name.startswith(
            ("k8s.io.api.core.v1.", "k8s.io.api.batch.v1.", "k8s.io.apimachinery.pkg.apis.meta.v1.")
        )
    }
    for message, fields in protobuf._TABLE.items():
        upstream = messages[full[message]]
        for number, (name, _kind, label) in fields.items():
            assert name in upstream, f"{message}.{name}"
            up_number, _, up_label = upstream[name]
            assert up_number == number, f"{message}.{name}: {number} != {up_number}"
            assert (label == "r") == (up_label == "r") and (label == "m") == up_label.startswith("m:"), name


def test_zero_values_a_go_server_writes_are_dropped_as_json_omits_them() -> None:
    """A real API server writes non-pointer fields at their zero value (an empty string); kubesim writes
    what it holds. The decoder drops empty strings (JSON's omitempty) and keeps numbers and booleans."""

    def field(number: int, data: bytes) -> bytes:
        return bytes([number << 3 | 2, len(data)]) + data

    meta = field(1, b"p") + field(2, b"") + field(3, b"") + bytes([7 << 3, 0])
    terminated = bytes([1 << 3, 0]) + field(3, b"") + field(6, b"")  # exitCode 0, no reason, zero time
    status = field(1, b"") + field(8, field(1, b"node") + field(2, field(3, terminated)) + bytes([4 << 3, 0]))
    pod = field(1, meta) + field(3, status)
    body = b"k8s\x00" + field(1, field(1, b"v1") + field(2, b"Pod")) + field(2, pod) + b"\x1a\x00\x22\x00"
    assert protobuf.decode_body(body) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "generation": 0},
        "status": {
            "containerStatuses": [{"name": "node", "state": {"terminated": {"exitCode": 0}}, "ready": False}]
        },
    }


def test_kubesims_encoding_of_a_full_pod_decodes_to_its_json() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p-0",
            "namespace": "default",
            "uid": "u-1",
            "resourceVersion": "42",
            "generation": 1,
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "deletionTimestamp": "2026-12-01T10:05:00Z",
            "labels": {"b": "2", "a": "1"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-2", "controller": True}
            ],
            "finalizers": ["x/y"],
        },
        "spec": {
            "containers": [
                {"name": "node", "image": "img", "resources": {"limits": {"cpu": 2, "memory": "1Gi"}}}
            ],
            "nodeName": "node-0",
            "volumes": [{"name": "v", "emptyDir": {}}],
            "restartPolicy": "Never",
        },
        "status": {
            "phase": "Failed",
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "lastTransitionTime": "2026-12-01T10:04:00Z",
                }
            ],
            "containerStatuses": [
                {
                    "name": "node",
                    "ready": False,
                    "restartCount": 2,
                    "state": {
                        "terminated": {
                            "exitCode": -1,
                            "reason": "OOMKilled",
                            "finishedAt": "2026-12-01T10:04:59Z",
                        }
                    },
                    "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}},
                }
            ],
        },
    }
    got = protobuf.decode_body(encode_body(PODS, pod))
    assert got == {**_project(pod, "Pod"), "apiVersion": "v1", "kind": "Pod"}
    assert got["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == -1


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), magic=st.booleans())
def test_any_bytes_decode_or_raise_decode_error(data: bytes, magic: bool) -> None:
    body = (b"k8s\x00" if magic else b"") + data
    try:
        protobuf.decode_body(body)
    except protobuf.DecodeError:
        pass
    try:
        protobuf.decode_frame(data)
    except protobuf.DecodeError:
        pass
    frames = protobuf.frames()
    try:
        frames.feed(struct.pack(">I", len(data)) + data + data[:3])
    except protobuf.DecodeError:
        pass
