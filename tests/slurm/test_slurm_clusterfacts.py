"""Opening keeps what it read of the cluster in the host's probe cache (``dispatch_slurm.clusterfacts``):
an open that finds it there runs no Slurm command, and an entry is reused only while it is whole, young,
of the same ``slurm.conf`` and good for the settings — anything else reads the cluster again.

Slurm's commands are counted as the benchmark counts them: a shim directory first on ``PATH`` logs each
command's name, then runs the real one (the local 22.05 cluster; the ssh transport runs them remotely).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_fixtures import Site

import dispatch
from dispatch import Config, MemoryProbeCache, MemoryStore, StoreProbeCache
from dispatch.errors import InvalidError, UnavailableError
from dispatch_slurm import clusterfacts, open_backend, parse_settings
from dispatch_slurm.localslurm import LocalSlurm
from dispatch_slurm.transport import LocalTransport

pytestmark = pytest.mark.timeout(300)

SLURM = ("sbatch", "squeue", "sacct", "scontrol", "scancel")

Counted = Callable[[], collections.Counter[str]]


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    """Every Slurm command this process runs from now on, by name (through shims first on PATH)."""
    shims, log = tmp_path / "shims", tmp_path / "commands.log"
    shims.mkdir()
    for name in SLURM:
        real = shutil.which(name)
        assert real is not None, name
        (shims / name).write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec {real} "$@"\n')
        (shims / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    yield lambda: collections.Counter(log.read_text().split()) if log.exists() else collections.Counter()


def settings(slurm: LocalSlurm, **extra: Any) -> dict[str, Any]:
    return {**slurm.settings(), **extra}


async def opened_commands(
    raw: dict[str, Any], cache: Any, counted: Counted
) -> tuple[collections.Counter[str], str, tuple[str, ...]]:
    """The Slurm commands one open runs, the cluster's identity and the notes it opened with."""
    before = counted()
    cluster = await dispatch.open("slurm", Config(adapter=raw, store=MemoryStore(), probe_cache=cache))
    async with cluster:
        ran = counted() - before
        caps = await cluster.backend.capabilities()
        return ran, cluster.backend.cluster_id, caps.notes


async def test_a_second_open_runs_no_slurm_command(slurm: LocalSlurm, counted: Counted) -> None:
    cache = StoreProbeCache(MemoryStore())
    first, identity, notes = await opened_commands(settings(slurm), cache, counted)
    assert first == {"scontrol": 2}, first
    assert not any("refresh" in n for n in notes), notes
    second, again, notes = await opened_commands(settings(slurm), cache, counted)
    assert second == {"scontrol": 1}, second  # scontrol ping: the facts come from the cache
    assert again == identity
    assert any("dispatch check --refresh" in n for n in notes), notes
    # Without a cache (a script that passes none), every open reads the cluster.
    third, _, _ = await opened_commands(settings(slurm), None, counted)
    assert third == {"scontrol": 2}, third
    # refresh=True (`dispatch check --refresh`) reads again, and keeps what it read.
    store = MemoryStore()
    await opened_commands(settings(slurm), StoreProbeCache(store), counted)
    refreshed, _, _ = await opened_commands(settings(slurm), StoreProbeCache(store, refresh=True), counted)
    assert refreshed == {"scontrol": 2}, refreshed


def _key(slurm: LocalSlurm, **extra: Any) -> str:
    raw = settings(slurm, **extra)
    parsed = parse_settings(json.dumps(raw))
    return clusterfacts.cache_key(parsed, LocalTransport(parsed.slurm_conf))


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda e: "{not json", id="not-json"),
        pytest.param(lambda e: json.dumps([1, 2]), id="not-an-object"),
        pytest.param(lambda e: json.dumps({**e, "format": 99}), id="another-format"),
        pytest.param(lambda e: json.dumps({**e, "at": e["at"] - clusterfacts.TTL - 1}), id="expired"),
        pytest.param(lambda e: json.dumps({**e, "at": e["at"] + 3600}), id="from-the-future"),
        pytest.param(lambda e: json.dumps({**e, "fingerprint": "0" * 64}), id="another-slurm-conf"),
        pytest.param(
            lambda e: json.dumps({**e, "facts": {k: v for k, v in e["facts"].items() if k != "controller"}}),
            id="partial",
        ),
        pytest.param(
            lambda e: json.dumps({**e, "facts": {**e["facts"], "accounting": "yes"}}), id="a-wrong-type"
        ),
        pytest.param(
            lambda e: json.dumps({**e, "facts": {**e["facts"], "partitions": [{"name": "batch"}]}}),
            id="a-partial-partition",
        ),
    ],
)
async def test_an_entry_that_is_spoiled_old_or_of_another_conf_is_read_again(
    slurm: LocalSlurm, counted: Counted, spoil: Callable[[dict[str, Any]], str]
) -> None:
    store = MemoryStore()
    cache = StoreProbeCache(store)
    await opened_commands(settings(slurm), cache, counted)
    key = "probe/" + _key(slurm)
    kept = await store.get_value(key)
    assert kept is not None
    await store.put_value(key, spoil(json.loads(kept)))
    ran, identity, _ = await opened_commands(settings(slurm), cache, counted)
    assert ran == {"scontrol": 2}, ran
    assert identity.startswith("slurm:")
    rewritten = await store.get_value(key)
    assert rewritten is not None and json.loads(rewritten)["format"] == clusterfacts.FORMAT
    again, _, _ = await opened_commands(settings(slurm), cache, counted)
    assert again == {"scontrol": 1}, again  # the entry read again was kept (and slurmctld pinged)


async def test_each_cluster_and_settings_has_its_own_entry(
    slurm: LocalSlurm, counted: Counted, tmp_path: Path
) -> None:
    """Another slurm.conf, another partition or another workdir is another entry; a partition the entry
    does not list is read from Slurm again (and refused by Slurm's answer of now, never from the cache)."""
    cache = MemoryProbeCache()
    await opened_commands(settings(slurm), cache, counted)
    other, _, _ = await opened_commands(settings(slurm, workdir=str(tmp_path / "w")), cache, counted)
    assert other == {"scontrol": 2}, other
    part, _, _ = await opened_commands(settings(slurm, partition="urgent"), cache, counted)
    assert part == {"scontrol": 2}, part
    assert _key(slurm) != _key(slurm, partition="urgent") != _key(slurm, workdir=str(tmp_path / "w"))
    # The same slurm.conf elsewhere (a copy): another key (the path is part of it).
    assert _key(slurm) != _key(slurm, slurmConf=str(tmp_path / "slurm.conf"))
    before = counted()
    with pytest.raises(InvalidError) as refused:
        await open_backend(parse_settings(json.dumps(settings(slurm, partition="nowhere"))), cache=cache)
    assert refused.value.path == "partition" and "batch" in str(refused.value)
    assert (counted() - before)["scontrol"] == 2


async def test_every_version_reopens_from_the_cache(site: Site) -> None:
    """Over ssh too (24.11, 26.05): the second open keeps the first's identity and says where its facts
    come from."""
    cache = MemoryProbeCache()
    parsed = parse_settings(json.dumps(site.settings()))
    first = await open_backend(parsed, cache=cache)
    await first.close()
    assert first.info.kept_since is None
    started = time.time()
    second = await open_backend(parsed, cache=cache)
    try:
        assert second.info.kept_since is not None and second.info.kept_since <= started
        assert second.cluster_id == first.cluster_id
        assert second.info == dataclasses.replace(first.info, kept_since=second.info.kept_since)
    finally:
        await second.close()


async def test_a_warm_open_with_the_controller_down_fails_as_a_cold_one(slurm: LocalSlurm) -> None:
    """The kept facts do not hide an outage: a warm open asks slurmctld whether it answers (``scontrol
    ping``), and with it down reads the cluster as a cold open would — and fails saying why."""
    cache = MemoryProbeCache()
    parsed = parse_settings(json.dumps(settings(slurm)))
    await (await open_backend(parsed, cache=cache)).close()
    slurm.kill_controller()
    try:
        with pytest.raises(UnavailableError) as down:
            await open_backend(parsed, cache=cache)
        assert "configuration" in str(down.value), down.value
    finally:
        slurm.start_controller()
    await (await open_backend(parsed, cache=cache)).close()  # up again: warm
