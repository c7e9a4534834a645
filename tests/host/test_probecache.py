"""What every adapter's probe-cache entry shares (``dispatch.probecache.lookup``/``keep``): an entry is
returned only when it is a JSON object of the expected format kept less than a TTL ago, and a cache that
fails is a miss on the way in and a log line, never an error, on the way out.

Over real caches: a store's key-value table (memory and SQLite), written as :func:`keep` writes it or
spoiled through the store itself."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatch import MemoryProbeCache, StoreProbeCache
from dispatch.probecache import PROBE_PREFIX, keep, lookup
from dispatch.records import MemoryStore, SqliteStore
from dispatch.records.store import KeyValues

KEY = "adapter-facts/0123"
NOW = 1_700_000_000.0
TTL = 600.0
FORMAT = 3


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore | SqliteStore]:
    made = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "jobs.db")
    yield made
    await made.close()


async def test_a_fresh_entry_of_the_format_is_returned_with_its_stamp(store: KeyValues) -> None:
    cache = StoreProbeCache(store)
    await keep(cache, KEY, {"fingerprint": "abc", "facts": {"n": 2}}, format=FORMAT, now=NOW)
    kept = await store.get_value(PROBE_PREFIX + KEY)
    assert kept is not None
    assert json.loads(kept) == {"fingerprint": "abc", "facts": {"n": 2}, "format": FORMAT, "at": NOW}
    for later in (NOW, NOW + TTL - 1):
        entry = await lookup(cache, KEY, format=FORMAT, ttl=TTL, now=later)
        assert entry == {"fingerprint": "abc", "facts": {"n": 2}, "format": FORMAT, "at": NOW}, later


async def test_the_stamp_is_the_cache_s_not_the_fields(store: KeyValues) -> None:
    cache = StoreProbeCache(store)
    await keep(cache, KEY, {"format": 99, "at": 0, "x": 1}, format=FORMAT, now=NOW)
    assert await lookup(cache, KEY, format=FORMAT, ttl=TTL, now=NOW) == {"format": FORMAT, "at": NOW, "x": 1}


@pytest.mark.parametrize(
    "now", [NOW + TTL, NOW + 10 * TTL, NOW - 1], ids=["at-the-ttl", "long-past", "from-the-future"]
)
async def test_an_entry_not_younger_than_the_ttl_is_a_miss(store: KeyValues, now: float) -> None:
    cache = StoreProbeCache(store)
    await keep(cache, KEY, {"x": 1}, format=FORMAT, now=NOW)
    assert await lookup(cache, KEY, format=FORMAT, ttl=TTL, now=now) is None


async def test_an_entry_of_another_format_is_a_miss(store: KeyValues) -> None:
    cache = StoreProbeCache(store)
    await keep(cache, KEY, {"x": 1}, format=FORMAT - 1, now=NOW)
    assert await lookup(cache, KEY, format=FORMAT, ttl=TTL, now=NOW) is None
    assert await lookup(cache, KEY, format=FORMAT - 1, ttl=TTL, now=NOW) is not None


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps([1, 2]),
        json.dumps("an entry"),
        json.dumps({"x": 1, "at": NOW}),  # no format
        json.dumps({"x": 1, "format": FORMAT}),  # no time
        json.dumps({"x": 1, "format": FORMAT, "at": str(NOW)}),
        '{"x": 1, "format": 3, "at": NaN}',
    ],
    ids=["not-json", "a-list", "a-string", "no-format", "no-time", "time-as-text", "time-nan"],
)
async def test_a_corrupt_entry_is_a_miss(store: KeyValues, text: str) -> None:
    await store.put_value(PROBE_PREFIX + KEY, text)
    assert await lookup(StoreProbeCache(store), KEY, format=FORMAT, ttl=TTL, now=NOW) is None


async def test_a_time_that_is_a_bool_is_a_miss(store: KeyValues) -> None:
    """JSON's ``true`` is no time, though Python counts it as the number 1."""
    await store.put_value(PROBE_PREFIX + KEY, json.dumps({"x": 1, "format": FORMAT, "at": True}))
    assert await lookup(StoreProbeCache(store), KEY, format=FORMAT, ttl=TTL, now=1.5) is None


async def test_a_cache_on_refresh_misses_and_still_keeps(store: KeyValues) -> None:
    await keep(StoreProbeCache(store, refresh=True), KEY, {"x": 1}, format=FORMAT, now=NOW)
    assert await lookup(StoreProbeCache(store, refresh=True), KEY, format=FORMAT, ttl=TTL, now=NOW) is None
    assert await lookup(StoreProbeCache(store), KEY, format=FORMAT, ttl=TTL, now=NOW) is not None


async def test_a_cache_that_fails_is_a_miss_and_a_log_line_never_an_error(
    store: MemoryStore | SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    cache = StoreProbeCache(store)
    await keep(cache, KEY, {"x": 1}, format=FORMAT, now=NOW)
    await store.close()  # its key-value table now raises UnavailableError on every read and write
    caplog.set_level(logging.INFO, logger="dispatch.probecache")
    assert await lookup(cache, KEY, format=FORMAT, ttl=TTL, now=NOW) is None
    await keep(cache, KEY, {"x": 2}, format=FORMAT, now=NOW)
    said = [r.getMessage() for r in caplog.records if r.name == "dispatch.probecache"]
    assert len(said) == 2 and all(KEY in s for s in said), said
    assert "could not read" in said[0] and "could not keep" in said[1], said


async def test_a_value_the_store_refuses_is_logged_not_raised(
    store: KeyValues, caplog: pytest.LogCaptureFixture
) -> None:
    cache = StoreProbeCache(store)
    caplog.set_level(logging.INFO, logger="dispatch.probecache")
    await keep(cache, KEY, {"x": "y" * (1 << 20)}, format=FORMAT, now=NOW)  # past the table's MAX_VALUE
    assert await lookup(cache, KEY, format=FORMAT, ttl=TTL, now=NOW) is None
    assert any("could not keep" in r.getMessage() for r in caplog.records), caplog.text


async def test_the_memory_cache_keeps_entries_the_same_way() -> None:
    cache = MemoryProbeCache()
    await keep(cache, KEY, {"x": 1}, format=FORMAT, now=NOW)
    assert await lookup(cache, KEY, format=FORMAT, ttl=TTL, now=NOW + 1) == {
        "x": 1,
        "format": FORMAT,
        "at": NOW,
    }
    assert await lookup(cache, KEY, format=FORMAT, ttl=TTL, now=NOW + TTL) is None
    assert await lookup(cache, "another key", format=FORMAT, ttl=TTL, now=NOW) is None
