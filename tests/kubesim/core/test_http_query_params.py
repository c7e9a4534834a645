"""Query parameters over real HTTP, decoded and validated as a real kube-apiserver does: a number that does
not parse is 400 BadRequest with Go's ``strconv.ParseInt`` message; a ListOptions or PodLogOptions rule
broken is 422 Invalid with field causes; a boolean is false only for ``0``/``false``."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

from kubesim import Simulator
from kubesim.kubeconfig import write_kubeconfig
from kubesim.resources import CONFIGMAPS, PODS, TRAINJOBS

from .conftest import Raw, configmap, running_pod, trainjob

CM = "/api/v1/namespaces/default/configmaps"
LOG = "/api/v1/namespaces/default/pods/{}/log"
TJ = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"


def _causes(body: dict[str, Any]) -> list[dict[str, str]]:
    causes: list[dict[str, str]] = body["details"]["causes"]
    return causes


async def test_unparsable_numbers_are_400_with_the_go_parse_error(sim: Simulator, raw: Raw) -> None:
    for params in (
        {"timeoutSeconds": "abc"},
        {"watch": "1", "timeoutSeconds": "abc"},
        {"limit": "abc"},
        {"limit": "1.5"},
    ):
        code, body, _ = await raw.request("GET", CM, params=params)
        bad = params.get("timeoutSeconds", params.get("limit"))
        assert code == 400, params
        assert body["reason"] == "BadRequest" and body["code"] == 400
        assert body["message"] == f'strconv.ParseInt: parsing "{bad}": invalid syntax'
    code, body, _ = await raw.request("GET", CM, params={"limit": "99999999999999999999"})
    assert code == 400
    assert body["message"] == 'strconv.ParseInt: parsing "99999999999999999999": value out of range'


async def test_a_bogus_resource_version_match_on_a_list_is_422(sim: Simulator, raw: Raw) -> None:
    code, body, _ = await raw.request(
        "GET", CM, params={"resourceVersion": "1", "resourceVersionMatch": "Bogus"}
    )
    assert code == 422 and body["reason"] == "Invalid"
    assert body["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Unsupported value: "Bogus": '
        'supported values: "Exact", "NotOlderThan", ""'
    )
    assert body["details"]["group"] == "meta.k8s.io" and body["details"]["kind"] == "ListOptions"
    assert "name" not in body["details"]
    assert _causes(body) == [
        {
            "reason": "FieldValueNotSupported",
            "message": 'Unsupported value: "Bogus": supported values: "Exact", "NotOlderThan", ""',
            "field": "resourceVersionMatch",
        }
    ]


async def test_every_broken_list_option_rule_is_reported(sim: Simulator, raw: Raw) -> None:
    code, body, _ = await raw.request("GET", CM, params={"resourceVersionMatch": "Bogus"})
    assert code == 422
    assert [c["message"] for c in _causes(body)] == [
        "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        'Unsupported value: "Bogus": supported values: "Exact", "NotOlderThan", ""',
    ]
    assert body["message"].startswith(
        'ListOptions.meta.k8s.io "" is invalid: [resourceVersionMatch: Forbidden'
    )
    code, body, _ = await raw.request(
        "GET", CM, params={"resourceVersion": "0", "resourceVersionMatch": "Exact"}
    )
    assert code == 422
    assert [c["message"] for c in _causes(body)] == [
        'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
    ]
    code, body, _ = await raw.request("GET", CM, params={"sendInitialEvents": "true"})
    assert code == 422
    assert _causes(body)[0]["field"] == "sendInitialEvents"
    assert _causes(body)[0]["message"] == "Forbidden: sendInitialEvents is forbidden for list"
    # the valid forms still list
    rv = str(sim.store.resource_version)
    for match in ("Exact", "NotOlderThan"):
        code, body, _ = await raw.request(
            "GET", CM, params={"resourceVersion": rv, "resourceVersionMatch": match}
        )
        assert code == 200 and body["kind"] == "ConfigMapList", match


async def test_a_resource_version_match_on_a_plain_watch_is_422(sim: Simulator, raw: Raw) -> None:
    code, body, _ = await raw.request("GET", CM, params={"watch": "1", "resourceVersionMatch": "Bogus"})
    assert code == 422 and body["reason"] == "Invalid"
    assert [(c["field"], c["message"]) for c in _causes(body)] == [
        (
            "resourceVersionMatch",
            "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
        ("resourceVersionMatch", 'Unsupported value: "Bogus": supported values: "NotOlderThan"'),
    ]


async def test_deletecollection_validates_its_list_options(sim: Simulator, raw: Raw) -> None:
    sim.store.create(CONFIGMAPS, configmap("keep"))
    code, body, _ = await raw.request("DELETE", CM, params={"resourceVersionMatch": "Bogus"})
    assert code == 422 and body["details"]["kind"] == "ListOptions"
    assert sim.store.exists(CONFIGMAPS, "default", "keep")


async def test_a_negative_limit_lists_everything_as_upstream_does(sim: Simulator, raw: Raw) -> None:
    # upstream pages only when limit > 0: a negative limit is not an error, it means "no limit"
    for n in ("a", "b", "c"):
        sim.store.create(CONFIGMAPS, configmap(n))
    code, body, _ = await raw.request("GET", CM, params={"limit": "-1"})
    assert code == 200
    assert [i["metadata"]["name"] for i in body["items"]] == ["a", "b", "c"]
    assert "continue" not in body["metadata"]


async def test_watch_is_on_for_any_value_but_0_or_false(sim: Simulator, raw: Raw) -> None:
    # the parameter codec reads a bool as true unless it is "0" or "false": watch=maybe watches
    sim.store.create(CONFIGMAPS, configmap("a"))
    for value in ("maybe", "True", ""):
        events = await raw.stream_lines(CM, {"watch": value, "timeoutSeconds": "1"}, limit=1)
        assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "a", value
    for value in ("0", "false", "FALSE"):
        code, body, _ = await raw.request("GET", CM, params={"watch": value})
        assert code == 200 and body["kind"] == "ConfigMapList", value
    assert [r.verb for r in sim.requests.filter(method="GET")] == ["watch"] * 3 + ["list"] * 3


async def test_a_negative_watch_timeout_ends_the_stream_at_once(sim: Simulator, raw: Raw) -> None:
    sim.store.create(CONFIGMAPS, configmap("a"))
    events = await asyncio.wait_for(raw.stream_lines(CM, {"watch": "1", "timeoutSeconds": "-1"}), 10)
    assert [e["type"] for e in events] == ["ADDED"]


async def test_bad_pod_log_options_are_422_with_field_causes(sim: Simulator, raw: Raw) -> None:
    sim.store.create(PODS, running_pod("p"))
    sim.logs.append("default", "p", "node", "hello")
    cases = {
        "tailLines": ("-1", "Invalid value: -1: must be greater than or equal to 0"),
        "limitBytes": ("-1", "Invalid value: -1: must be greater than 0"),
        "sinceSeconds": ("0", "Invalid value: 0: must be greater than 0"),
    }
    for field, (value, message) in cases.items():
        code, body, _ = await raw.request("GET", LOG.format("p"), params={field: value})
        assert code == 422, field
        assert body["reason"] == "Invalid"
        assert body["message"] == f'PodLogOptions "p" is invalid: {field}: {message}'
        assert body["details"] == {
            "name": "p",
            "kind": "PodLogOptions",
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}],
        }
    code, body, _ = await raw.request("GET", LOG.format("p"), params={"limitBytes": "0", "tailLines": "-2"})
    assert code == 422
    assert [c["field"] for c in _causes(body)] == ["tailLines", "limitBytes"]
    code, body, _ = await raw.request(
        "GET", LOG.format("p"), params={"sinceSeconds": "5", "sinceTime": "2026-01-01T00:00:00Z"}
    )
    assert code == 422
    assert _causes(body) == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified",
            "field": "",
        }
    ]
    # options are checked before the pod is looked up; numbers that do not parse are 400
    code, body, _ = await raw.request("GET", LOG.format("ghost"), params={"tailLines": "-1"})
    assert code == 422 and body["details"]["name"] == "ghost"
    code, body, _ = await raw.request("GET", LOG.format("p"), params={"tailLines": "x"})
    assert code == 400 and body["message"] == 'strconv.ParseInt: parsing "x": invalid syntax'
    # the valid edges still serve the log
    code, body, _ = await raw.request("GET", LOG.format("p"), params={"tailLines": "0", "limitBytes": "1"})
    assert code == 200 and body == ""
    code, body, _ = await raw.request("GET", LOG.format("p"), params={"limitBytes": "1"})
    assert code == 200 and body == "h"


async def test_delete_on_a_status_subresource_is_405(sim: Simulator, raw: Raw) -> None:
    sim.store.create(TRAINJOBS, trainjob("job"))
    sim.store.create(PODS, running_pod("p"))
    for path in (f"{TJ}/job/status", "/api/v1/namespaces/default/pods/p/status"):
        code, body, _ = await raw.request("DELETE", path)
        assert code == 405, path
        assert body["reason"] == "MethodNotAllowed" and body["code"] == 405
    assert sim.store.exists(TRAINJOBS, "default", "job") and sim.store.exists(PODS, "default", "p")


def test_kubeconfig_over_a_wider_file_is_0600_before_the_token_is_written(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text("old: content\n")
    path.chmod(0o644)
    write_kubeconfig(path, "https://127.0.0.1:1", "s3cret-token")
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    assert "s3cret-token" in text and "old: content" not in text
    (cluster,) = json.loads(text)["clusters"]  # JSON, which is YAML: kubectl reads it too
    assert cluster["cluster"]["server"] == "https://127.0.0.1:1"


def test_kubeconfig_token_is_never_written_into_a_wider_file(tmp_path: Path) -> None:
    # A FIFO shows the mode while the write is under way: the token is larger than the pipe buffer, so the
    # writer is still blocked writing it when the reader, having read the first bytes, looks at the mode.
    path = tmp_path / "kc"
    os.mkfifo(path, 0o644)
    path.chmod(0o644)
    token = "t" * (1 << 20)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            write_kubeconfig(path, "https://127.0.0.1:1", token)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with open(path, "rb") as reader:
        first = reader.read(4096)
        mode_while_writing = path.stat().st_mode & 0o777
        rest = reader.read()
    writer.join(30)
    assert not errors and not writer.is_alive()
    assert mode_while_writing == 0o600
    assert token.encode() in first + rest
