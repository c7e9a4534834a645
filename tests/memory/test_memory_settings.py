"""Settings of the memory adapter: strict decoding, defaults, schema, factory and registry."""

from __future__ import annotations

import json

import jsonschema
import pytest

import dispatch
from dispatch import AdapterConfig, InvalidError, ReadOnlyError
from dispatch.backend import place
from dispatch.memory import MemoryBackend, MemorySettings, parse_settings, schema


def test_defaults() -> None:
    s = parse_settings(b"{}")
    assert s == MemorySettings()
    assert (s.nodes, s.start_delay, s.cessation_delay, s.image_pull_grace) == (4, 1.0, 2.0, 10.0)
    assert s.default_script == "print started; sleep 5; print done; exit 0"  # kubesim's default too
    assert s.watch_history == 10_000
    assert s.cluster is None
    assert parse_settings(b"") == MemorySettings()


def test_every_key_is_read() -> None:
    raw = {
        "nodes": 8,
        "startDelay": 0.5,
        "cessationDelay": 0,
        "imagePullGrace": 30,
        "defaultScript": "sleep 1; exit 3",
        "watchHistory": 5,
        "cluster": "demo-1",
    }
    s = parse_settings(json.dumps(raw).encode())
    assert s == MemorySettings(8, 0.5, 0.0, 30.0, "sleep 1; exit 3", 5, "demo-1")
    assert parse_settings(json.dumps(s.to_json())) == s


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        (b'{"node": 2}', "node", "unknown memory setting"),
        (b'{"nodes": null}', "nodes", "null"),
        (b'{"nodes": 0}', "nodes", "at least 1"),
        (b'{"nodes": true}', "nodes", "integer"),
        (b'{"nodes": "2"}', "nodes", "integer"),
        (b'{"startDelay": -1}', "startDelay", "at least 0"),
        (b'{"cessationDelay": "2s"}', "cessationDelay", "number"),
        (b'{"imagePullGrace": -0.5}', "imagePullGrace", "at least 0"),
        (b'{"watchHistory": 0}', "watchHistory", "at least 1"),
        (b'{"defaultScript": "dance"}', "defaultScript", "unknown verb"),
        (b'{"cluster": "has space"}', "cluster", "characters"),
        (b'{"nodes": 1, "nodes": 2}', "document", "duplicate"),
        (b'{"nodes": 1} {}', "settings", "trailing"),
        (b"[]", "document", "object"),
    ],
)
def test_refused_naming_the_path(raw: bytes, path: str, words: str) -> None:
    with pytest.raises(InvalidError) as caught:
        parse_settings(raw)
    assert caught.value.path == path
    assert words in str(caught.value)


def test_schema_matches_the_parser() -> None:
    s = schema()
    jsonschema.Draft202012Validator.check_schema(s)
    every = MemorySettings(8, 0.5, 0.0, 30.0, "sleep 1; exit 3", 5, "demo-1")  # no field at its default
    jsonschema.validate(every.to_json(), s)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"nodez": 1}, s)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"nodes": 0}, s)
    assert set(s["properties"]) == set(every.to_json())


async def test_factory_through_the_registry() -> None:
    assert "memory" in dispatch.adapters()
    backend = await dispatch.new_backend("memory", AdapterConfig("memory", b'{"nodes": 2}'))
    assert isinstance(backend, MemoryBackend)
    assert backend.name == "memory"
    assert backend.settings.nodes == 2
    assert (await backend.capabilities()).limits.max_nodes == 2
    with pytest.raises(InvalidError) as caught:
        await dispatch.new_backend("memory", AdapterConfig("memory", b'{"nodes": 2, "x": 1}'))
    assert caught.value.path == "x"


async def test_factory_read_only() -> None:
    from dispatch import Identity, JobSpec

    backend = await dispatch.new_backend(
        "memory", AdapterConfig("memory", b"{}", read_only=True, token="s3cret")
    )
    assert (await backend.capabilities()).read_only
    with pytest.raises(ReadOnlyError):
        await place(backend, JobSpec(("x",)), Identity("a"))
    assert "s3cret" not in repr(backend)


async def test_named_clusters_are_shared_in_process() -> None:
    from dispatch import Identity, JobSpec

    cfg = AdapterConfig("memory", b'{"cluster": "shared-test"}')
    a = await dispatch.new_backend("memory", cfg)
    b = await dispatch.new_backend("memory", cfg)
    assert isinstance(a, MemoryBackend) and isinstance(b, MemoryBackend)
    handle = await place(a, JobSpec(("x",)), Identity("shared-job"))
    assert [o.handle for o in await b.list()] == [handle]
    with pytest.raises(dispatch.ConflictError):
        await dispatch.new_backend(
            "memory", AdapterConfig("memory", b'{"cluster": "shared-test", "nodes": 9}')
        )


async def test_closed_backend_is_unavailable() -> None:
    backend = MemoryBackend()
    await backend.close()
    await backend.close()
    with pytest.raises(dispatch.UnavailableError):
        await backend.list()


def test_cluster_and_settings_are_exclusive() -> None:
    backend = MemoryBackend()
    with pytest.raises(InvalidError) as caught:
        MemoryBackend(MemorySettings(), cluster=backend.cluster)
    assert caught.value.path == "cluster"


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b'{"nodes": 9223372036854775807}', "nodes"),  # would make 2**63 node objects at open
        (b'{"nodes": 100001}', "nodes"),
        (b'{"watchHistory": 10000001}', "watchHistory"),
    ],
)
def test_counts_have_an_upper_bound(raw: bytes, path: str) -> None:
    with pytest.raises(InvalidError) as info:
        parse_settings(raw)
    assert info.value.path == path and "at most" in str(info.value)
    assert parse_settings(b'{"nodes": 100000, "watchHistory": 10000000}').nodes == 100_000


@pytest.mark.parametrize(
    "field", ["nodes", "watch_history", "start_delay", "cessation_delay", "image_pull_grace"]
)
def test_a_huge_int_from_python_is_invalid_not_an_overflow(field: str) -> None:
    with pytest.raises(InvalidError) as info:
        MemorySettings(**{field: 10**5000})
    assert "out of range" in str(info.value)
