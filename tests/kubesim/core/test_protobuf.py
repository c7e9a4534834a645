"""kubesim's protobuf answers (kubesim.protowire), read by independent decoders: kubectl's typed clients
(``describe``, ``logs``, ``auth can-i``: real Go protobuf code, asking ``...protobuf,application/json``), and
a reading of the watch frames by upstream's documented framing, written here from the format alone."""

from __future__ import annotations

import json
import ssl
import struct
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubesim import Simulator
from kubesim.resources import EVENTS, PODS, TRAINJOBS

from .test_kubectl import KUBECTL, kubectl

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")
PB = "application/vnd.kubernetes.protobuf"


def submit(sim: Simulator, script: str) -> None:
    """A one-node TrainJob on the stock runtime, run by the simulated controllers until they rest."""
    trainer = {
        "image": "example.org/train:1",
        "numNodes": 1,
        "env": [{"name": "KUBESIM_SCRIPT", "value": script}],
    }
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "default"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer},
    }
    sim.store.create(TRAINJOBS, body)
    sim.settle_now()


def pods(sim: Simulator) -> list[dict[str, Any]]:
    return sim.store.list(PODS, "default")[0]


async def test_kubectls_typed_clients_read_the_protobuf_answers(tmp_path: Path) -> None:
    async with Simulator(tls=True) as sim:
        submit(sim, "print hello from the pod; hang")
        pod = pods(sim)[0]
        name = pod["metadata"]["name"]
        kc = sim.write_kubeconfig(tmp_path / "kc")
        before = len(list(sim.requests))
        code, out, err = await kubectl(kc, "describe", "pod", name, "-v=8")
        assert code == 0, err
        assert f"Content-Type: {PB}" in err  # it was answered in protobuf, and read it
        assert pod["spec"]["containers"][0]["image"] in out and pod["spec"]["nodeName"] in out
        assert "Running" in out and "Projected" in out  # an inlined VolumeSource, decoded
        assert "Scheduled" in out and "Successfully assigned" in out  # its Events, listed in protobuf
        # (its resource builder reads the pod in JSON first; the describer's typed client in protobuf)
        answered = {(r.resource, r.content_type) for r in list(sim.requests)[before:]}
        assert {("pods", PB), ("events", PB)} <= answered, answered
        code, out, err = await kubectl(kc, "describe", "job")
        assert code == 0 and "Pods Statuses:" in out and "1 Active" in out, (out, err)
        code, out, err = await kubectl(kc, "describe", "node", pod["spec"]["nodeName"])
        assert code == 0 and "Allocatable:" in out and "KubeletReady" in out, (out, err)
        code, out, err = await kubectl(kc, "logs", name)
        assert code == 0 and out.strip() == "hello from the pod", (out, err)
        code, out, err = await kubectl(kc, "auth", "can-i", "create", "pods")
        assert (code, out.strip()) == (0, "yes"), err
        code, out, err = await kubectl(kc, "describe", "pod", "nope")
        assert code == 1 and 'pods "nope" not found' in err  # a Status in protobuf


def _frames(data: bytes) -> list[bytes]:
    """Split a protobuf watch body by its framing: a 4-byte big-endian length, then that many bytes."""
    out = []
    while data:
        assert len(data) >= 4, "a frame cut inside its length"
        (n,) = struct.unpack(">I", data[:4])
        assert len(data) >= 4 + n, "a frame cut inside its body"
        out.append(data[4 : 4 + n])
        data = data[4 + n :]
    return out


def _fields(buf: bytes) -> dict[int, list[Any]]:
    """Proto wire format, read plainly: field number -> values (varints, or bytes)."""
    out: dict[int, list[Any]] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            b = buf[i]
            i += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7

    while i < len(buf):
        key = varint()
        if key & 7 == 0:
            out.setdefault(key >> 3, []).append(varint())
        elif key & 7 == 2:
            n = varint()
            out.setdefault(key >> 3, []).append(buf[i : i + n])
            i += n
        else:
            raise AssertionError(f"wire type {key & 7}")
    return out


async def _get(sim: Simulator, path: str, accept: str, **params: str) -> tuple[int, str, bytes]:
    headers = {"Authorization": f"Bearer {sim.token('admin')}", "Accept": accept}
    ctx = ssl.create_default_context(cadata=sim.cert.cert_pem.decode()) if sim.cert is not None else None
    async with (
        aiohttp.ClientSession() as session,
        session.get(sim.url + path, headers=headers, params=params, ssl=ctx) as resp,
    ):
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def test_a_watch_is_length_prefixed_watch_events_wrapping_unknowns() -> None:
    async with Simulator() as sim:
        submit(sim, "hang")
        path = "/api/v1/namespaces/default/pods"
        status, ctype, body = await _get(
            sim, path, f"{PB}, application/json", watch="1", resourceVersion="0", timeoutSeconds="1",
            allowWatchBookmarks="true",
        )  # fmt: skip
        assert (status, ctype) == (200, f"{PB};stream=watch")
        events = [_fields(f) for f in _frames(body)]
        assert events and {e[1][0] for e in events} <= {b"ADDED", b"MODIFIED", b"BOOKMARK"}
        for event in events:
            raw = _fields(event[2][0])[1][0]  # WatchEvent.object: RawExtension.raw
            assert raw[:4] == b"k8s\x00"  # the object is a whole body: magic, then runtime.Unknown
            unknown = _fields(raw[4:])
            type_meta = _fields(unknown[1][0])
            assert (type_meta[1][0], type_meta[2][0]) == (b"v1", b"Pod")
            assert unknown[3] == [b""] and unknown[4] == [b""]  # contentEncoding, contentType: empty
            meta = _fields(_fields(unknown[2][0])[1][0])  # Pod.metadata
            assert meta[1][0].decode() == pods(sim)[0]["metadata"]["name"] or event[1][0] == b"BOOKMARK"
        # A list is one body; JSON is still the answer to a client that asks for it, and a custom
        # resource asked for in protobuf alone is 406.
        status, ctype, body = await _get(sim, path, PB)
        assert (status, ctype, body[:4]) == (200, PB, b"k8s\x00")
        assert _fields(_fields(body[4:])[1][0])[2] == [b"PodList"]
        status, ctype, body = await _get(sim, path, "application/json")
        assert (status, ctype) == (200, "application/json") and json.loads(body)["kind"] == "PodList"
        status, _, body = await _get(
            sim, "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs", PB
        )
        assert status == 406
        status, ctype, _ = await _get(
            sim, "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs", f"{PB}, application/json"
        )
        assert (status, ctype) == (200, "application/json")
        assert sim.store.list(EVENTS, "default")[0] and sim.store.list(PODS, "default")[0]
