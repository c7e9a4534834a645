"""Opening clusters: the registry (by import and by entry point), the default store, the sync facade,
a light ``import dispatch``, and tokens that never show."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dispatch
from dispatch import AdapterConfig, Config, InvalidError, NotFoundError, State
from dispatch.cluster import Cluster
from dispatch.cluster import open as open_cluster
from dispatch.records import MemoryStore
from dispatch.sync import SyncCluster
from dispatch.sync import open as open_sync

from .helpers import spec

SECRET = "s3cr3t-bearer-token-value"


@pytest.fixture(autouse=True)
def registry_restored() -> Iterator[None]:
    """The adapters these tests register (``tiny``, ``bare-test``) are process-wide: take them away again,
    so that a later test in the same process sees only the installed ones."""
    from dispatch import registry

    before = dict(registry._adapters)
    yield
    registry._adapters.clear()
    registry._adapters.update(before)


async def test_open_by_registered_name() -> None:
    import dispatch.memory

    assert "memory" in dispatch.adapters()
    async with await open_cluster("memory", Config(store=MemoryStore())) as cluster:
        assert isinstance(cluster, Cluster)
        assert cluster.backend.name == "memory"
        rec = await cluster.submit(spec(), job_id="via-open")
        assert rec.state is not State.PENDING


async def test_open_passes_the_adapter_settings_strictly() -> None:
    with pytest.raises(InvalidError) as info:
        await open_cluster("memory", Config(adapter={"nodez": 3}, store=MemoryStore()))
    assert info.value.path == "nodez"


async def test_open_an_unknown_adapter_names_the_available_ones() -> None:
    with pytest.raises(NotFoundError, match="memory"):
        await open_cluster("no-such-adapter", Config(store=MemoryStore()))


async def test_open_without_a_store_uses_sqlite_under_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path))
    async with await open_cluster("memory") as cluster:
        await cluster.submit(spec(), job_id="kept")
    assert (tmp_path / "jobs.db").exists()
    async with await open_cluster("memory") as cluster:
        assert [r.job_id for r in await cluster.list()] == ["kept"]


PLUGIN = '''
"""A tiny adapter installed only through an entry point (it does not register itself)."""
from dispatch import Adapter, Capabilities, Mode

class TinyBackend:
    name = "tiny"
    cluster_id = "tiny:one"
    def __init__(self, cfg):
        self.cfg = cfg
    async def capabilities(self, spec=None):
        return Capabilities(mode=Mode.READ_ONLY, notes=("tiny",))
    async def prepare(self, spec, identity, *, held=False):
        raise NotImplementedError
    async def start(self, prepared):
        raise NotImplementedError
    async def observe(self, handle):
        raise NotImplementedError
    async def stop(self, handle):
        raise NotImplementedError
    async def list(self):
        return []
    async def close(self):
        pass

async def factory(cfg):
    return TinyBackend(cfg)

def schema():
    return {"type": "object", "additionalProperties": False, "properties": {}}

ADAPTER = Adapter("tiny", factory, schema=schema, extensions={"dispatch/Image"}, summary="tiny")
'''


@pytest.fixture
def tiny_plugin(tmp_path: Path) -> Iterator[Path]:
    """Install ``tiny_dispatch_adapter`` as an entry point of group ``dispatch.adapters``."""
    (tmp_path / "tiny_dispatch_adapter.py").write_text(PLUGIN)
    info = tmp_path / "tiny_dispatch_adapter-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-dispatch-adapter\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[dispatch.adapters]\ntiny = tiny_dispatch_adapter:ADAPTER\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("tiny_dispatch_adapter", None)


async def test_open_an_adapter_found_only_by_entry_point(tiny_plugin: Path) -> None:
    assert "tiny_dispatch_adapter" not in sys.modules
    assert "tiny" in dispatch.adapters()
    async with await open_cluster("tiny", Config(store=MemoryStore(), read_only=True)) as cluster:
        caps = await cluster.capabilities()
        assert caps.notes == ("tiny",)
        assert cluster.backend.cfg.read_only  # type: ignore[attr-defined]
    # The descriptor the entry point names is what the host reads: schema and extensions, declared once.
    tiny = dispatch.describe("tiny")
    assert tiny.settings_schema()["additionalProperties"] is False
    assert tiny.extensions == {"dispatch/Image"}


async def test_a_bare_factory_registers_an_adapter_without_a_schema() -> None:
    async def factory(cfg: dispatch.AdapterConfig) -> dispatch.Backend:
        raise AssertionError("not opened")

    described = dispatch.register("bare-test", factory)
    assert dispatch.describe("bare-test") is described and described.factory is factory
    with pytest.raises(dispatch.UnsupportedError, match="no settings schema"):
        described.settings_schema()
    with pytest.raises(dispatch.InvalidError) as info:
        dispatch.register("bad name!", factory)
    assert info.value.path == "name"


@pytest.mark.parametrize(
    "statement",
    ["import dispatch", "import dispatch, dispatch.cluster, dispatch.fold, dispatch.sync, dispatch.cli"],
)
def test_import_dispatch_stays_light(statement: str) -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    heavy = {"yaml", "sqlite3", "_sqlite3", "aiohttp", "click", "rich", "lightkube"} & imported
    assert heavy == set()
    assert "dispatch" in imported


def test_tokens_never_show_in_reprs_or_strings() -> None:
    cfg = Config(adapter={"namespace": "a"}, store=MemoryStore(), token=SECRET)
    acfg = cfg.adapter_config("memory")
    assert acfg.token == SECRET
    for text in (repr(cfg), str(cfg), repr(acfg), str(acfg), repr(AdapterConfig("x", token=SECRET))):
        assert SECRET not in text
        assert "***" in text


async def test_tokens_never_show_in_errors_of_open() -> None:
    cfg = Config(adapter={"nodez": 1}, store=MemoryStore(), token=SECRET)
    with pytest.raises(InvalidError) as bad:
        await open_cluster("memory", cfg)
    with pytest.raises(NotFoundError) as missing:
        await open_cluster("no-such-adapter", cfg)
    for exc in (bad.value, missing.value):
        assert SECRET not in str(exc) and SECRET not in repr(exc)


def test_the_sync_facade_runs_the_same_methods() -> None:
    with open_sync("memory", Config(store=MemoryStore())) as cluster:
        assert isinstance(cluster, SyncCluster)
        rec = cluster.submit(spec("hang"), job_id="s1")
        assert cluster.get("s1").job_id == rec.job_id
        assert [r.job_id for r in cluster.list()] == ["s1"]
        stopping = cluster.cancel("s1")
        assert stopping.state is State.STOPPING  # its compute goes within the cessation delay
        watched = list(cluster.watch("s1"))
        assert watched[-1].state is State.CANCELLED
        assert cluster.history("s1")[0].what == "submitted"
        assert cluster.capabilities().holds


async def test_the_sync_facade_works_inside_a_running_loop() -> None:
    # A notebook cell runs inside the kernel's loop: the facade must not need (or block on) it.
    asyncio.get_running_loop()
    cluster = open_sync("memory", Config(store=MemoryStore()))
    try:
        assert cluster.submit(spec(), job_id="nb").job_id == "nb"
    finally:
        cluster.close()
    cluster.close()  # idempotent
