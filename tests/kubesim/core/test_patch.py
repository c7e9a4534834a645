"""The patch algorithms as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim.errors import ApiError
from kubesim.patch import apply_merge, json_patch, merge_patch, strategic_merge_patch


def test_merge_patch_rfc7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    assert merge_patch(target, {"a": "z", "c": {"f": None}}) == {"a": "z", "c": {"d": "e"}}
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}}  # inputs untouched


def test_json_patch_operations() -> None:
    doc: dict[str, Any] = {"a": {"b": [1, 2, 3]}, "x": 1}
    out = json_patch(
        doc,
        [
            {"op": "add", "path": "/a/b/-", "value": 4},
            {"op": "remove", "path": "/a/b/0"},
            {"op": "replace", "path": "/x", "value": 2},
            {"op": "copy", "from": "/x", "path": "/y"},
            {"op": "move", "from": "/y", "path": "/z"},
            {"op": "test", "path": "/z", "value": 2},
            {"op": "add", "path": "/k~1v", "value": "slash"},
        ],
    )
    assert out == {"a": {"b": [2, 3, 4]}, "x": 2, "z": 2, "k/v": "slash"}
    with pytest.raises(ApiError) as ei:
        json_patch(doc, [{"op": "test", "path": "/x", "value": 9}])
    assert ei.value.code == 422
    with pytest.raises(ApiError) as ei:
        json_patch(doc, [{"op": "replace", "path": "/missing", "value": 1}])
    assert ei.value.code == 422
    with pytest.raises(ApiError) as ei:
        json_patch(doc, {"op": "add"})
    assert ei.value.code == 400


def test_strategic_merge_by_key_and_directives() -> None:
    pod = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "image": "i1",
                    "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
                },
                {"name": "b", "image": "i2"},
            ],
            "tolerations": [{"key": "t1"}],
        },
        "metadata": {"finalizers": ["f1"]},
    }
    out = strategic_merge_patch(
        pod,
        {
            "spec": {
                "containers": [
                    {"name": "a", "env": [{"name": "Y", "$patch": "delete"}, {"name": "Z", "value": "3"}]},
                    {"name": "c", "image": "i3"},
                ],
                "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
                "tolerations": [{"key": "t2"}],
            },
            "metadata": {"finalizers": ["f2"]},
        },
    )
    a, b, c = out["spec"]["containers"]
    assert a["image"] == "i1" and a["env"] == [{"name": "X", "value": "1"}, {"name": "Z", "value": "3"}]
    assert b == {"name": "b", "image": "i2"} and c == {"name": "c", "image": "i3"}
    assert out["spec"]["tolerations"] == [{"key": "t2"}]  # no merge key: replaced
    assert out["metadata"]["finalizers"] == ["f1", "f2"]  # merged as a set
    replaced = strategic_merge_patch(pod, {"spec": {"$patch": "replace", "containers": []}})
    assert replaced["spec"] == {"containers": []}
    assert "$setElementOrder/containers" not in str(out)
    trimmed = strategic_merge_patch({"f": ["a", "b"]}, {"$deleteFromPrimitiveList/f": ["a"]})
    assert trimmed == {"f": ["b"]}


def test_apply_prunes_only_what_the_manager_applied_before() -> None:
    live = {"metadata": {"name": "x", "labels": {"mine": "1", "theirs": "1"}}, "data": {"a": "1", "b": "2"}}
    previous = {"metadata": {"name": "x", "labels": {"mine": "1"}}, "data": {"a": "1", "b": "2"}}
    applied = {"metadata": {"name": "x"}, "data": {"a": "9"}}
    out = apply_merge(live, applied, previous)
    assert out["data"] == {"a": "9"}
    assert out["metadata"]["labels"] == {"theirs": "1"}
