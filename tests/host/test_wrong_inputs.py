"""Wrong types and malformed text through the Python API: each is an ``InvalidError`` naming the
field, never a bare ``TypeError``/``AttributeError``/``RecursionError`` from deep inside."""

from __future__ import annotations

import math
from typing import Any

import pytest

import dispatch
from dispatch import (
    Action,
    AdapterConfig,
    Capabilities,
    Config,
    Evidence,
    InvalidError,
    JobSpec,
    MemoryStore,
    Outcome,
    Policy,
    Rule,
    State,
)
from dispatch.cluster import Cluster

from .helpers import spec


@pytest.mark.parametrize("extensions", [3, "dispatch/Image", None])
def test_jobspec_extensions_of_the_wrong_type(extensions: Any) -> None:
    with pytest.raises(InvalidError) as info:
        JobSpec(command=["x"], extensions=extensions)
    assert info.value.path == "extensions"


@pytest.mark.parametrize("data", [3, None, ["command"]])
@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_loads_refuses_what_is_not_text(fmt: str, data: Any) -> None:
    with pytest.raises(InvalidError, match="expected text"):
        JobSpec.loads(data, format=fmt)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("depth", [150, 5000])
def test_a_document_nested_too_deeply_is_refused(fmt: str, depth: int) -> None:
    text = '{"command": ["x"], "extensions": {"acme/Thing": {"a": ' + "[" * depth + "]" * depth + "}}}"
    with pytest.raises(InvalidError, match="nested too deeply"):
        JobSpec.loads(text, format=fmt)


def test_a_document_nested_within_the_bound_decodes() -> None:
    depth = 90
    text = '{"command": ["x"], "extensions": {"acme/Thing": {"a": ' + "[" * depth + "]" * depth + "}}}"
    spec = JobSpec.loads(text)
    assert spec.extensions.opaque() == ["acme/Thing"]


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({"rules": 3}, "rules"),
        ({"default": "fail"}, "default"),
    ],
)
def test_policy_of_the_wrong_shape(kwargs: dict[str, Any], path: str) -> None:
    with pytest.raises(InvalidError) as info:
        Policy(**kwargs)
    assert info.value.path == path


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({"backoff": "30"}, "backoff"),
        ({"backoff_cap": "1h"}, "backoffCap"),
        ({"backoff_cap": math.inf}, "backoffCap"),
    ],
)
def test_rule_backoffs_are_finite_numbers(kwargs: dict[str, Any], path: str) -> None:
    with pytest.raises(InvalidError) as info:
        Rule(Action.REQUEUE, **kwargs)
    assert info.value.path == path


def test_outcome_evidence_must_be_evidence() -> None:
    with pytest.raises(InvalidError) as info:
        Outcome(State.FAILED, evidence=3)  # type: ignore[arg-type]
    assert info.value.path == "evidence"
    assert Outcome(State.FAILED, evidence=[Evidence("Pod", "p")]).evidence == (Evidence("Pod", "p"),)


def test_config_store_must_be_a_store() -> None:
    with pytest.raises(InvalidError) as info:
        Config(store="jobs.db")  # type: ignore[arg-type]
    assert info.value.path == "store"


async def test_open_with_something_else_than_a_config() -> None:
    with pytest.raises(InvalidError) as info:
        await dispatch.open("memory", {"store": MemoryStore()})  # type: ignore[arg-type]
    assert info.value.path == "config"


async def test_new_backend_with_something_else_than_an_adapter_config() -> None:
    with pytest.raises(InvalidError) as info:
        await dispatch.new_backend("memory", {"backend": "memory"})  # type: ignore[arg-type]
    assert info.value.path == "cfg"
    backend = await dispatch.new_backend("memory", AdapterConfig("memory"))
    assert backend.name == "memory"
    await backend.close()


async def test_list_states_are_checked_not_silently_matching_nothing(cluster: Cluster) -> None:
    await cluster.submit(spec(), job_id="j1")
    # One state alone is a state, not the letters of its name (a State is also a str).
    assert [r.job_id for r in await cluster.list(State.STARTING)] == ["j1"]
    assert [r.job_id for r in await cluster.list(["starting"])] == ["j1"]
    with pytest.raises(InvalidError) as info:
        await cluster.list(["starting", "runing"])
    assert info.value.path == "states[1]"
    assert '"runing"' in str(info.value)
    with pytest.raises(InvalidError) as info:
        await cluster.list(3)  # type: ignore[arg-type]
    assert info.value.path == "states"


def test_a_store_path_under_an_unknown_user_is_invalid() -> None:
    with pytest.raises(InvalidError) as info:
        dispatch.SqliteStore("~no-such-user-dispatch/jobs.db")
    assert info.value.path == "path"
    assert "no such user" in str(info.value)


@pytest.mark.parametrize(
    "make", [lambda: Config(read_only="no"), lambda: AdapterConfig("memory", read_only="no")]
)
def test_read_only_is_a_bool_not_anything_truthy(make: Any) -> None:
    with pytest.raises(InvalidError) as info:
        make()
    assert info.value.path == "read_only"


async def test_submit_held_is_a_bool(cluster: Cluster) -> None:
    with pytest.raises(InvalidError) as info:
        await cluster.submit(spec(), job_id="h", held="no")  # type: ignore[arg-type]
    assert info.value.path == "held"
    assert await cluster.list() == []  # refused before anything was recorded


def test_evidence_output_is_lines_not_the_characters_of_one() -> None:
    with pytest.raises(InvalidError) as info:
        Evidence("Pod", "p", output="Killed")  # type: ignore[arg-type]
    assert info.value.path == "output"
    with pytest.raises(InvalidError):
        Evidence("Pod", "p", output=3)  # type: ignore[arg-type]
    assert Evidence("Pod", "p", output=["a", "b"]).output == ("a", "b")


@pytest.mark.parametrize(
    ("key", "value"), [("extensions", "dispatch/Image"), ("notes", "kueue"), ("notes", 3)]
)
def test_capabilities_collections_are_not_single_strings(key: str, value: Any) -> None:
    with pytest.raises(InvalidError) as info:
        Capabilities(**{key: value})
    assert info.value.path == key
    assert Capabilities(extensions=["dispatch/Image"], notes=("n",)).extensions == frozenset(
        {"dispatch/Image"}
    )


def test_an_object_that_takes_no_fields_says_so() -> None:
    from dispatch.cli.config import parse_config

    with pytest.raises(InvalidError) as info:
        parse_config("adapter: memory\nstore: {memory: {a: 1}}\n", source="c.yaml")
    assert info.value.path == "store.memory.a"
    assert str(info.value).endswith("allowed: none")
