"""Fixtures: every contract test runs against each store implementation.

The PostgreSQL store runs against a real server this session starts (``pgserver.py``), one fresh
database per test. Without PostgreSQL's binaries (or psycopg) those tests skip, saying why; with
``CI`` set they fail instead, so CI cannot pass without running them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pgserver import PgServer, find_bin

from dispatch import ManualClock, Store
from dispatch.records import MemoryStore, SqliteStore

STORES = ["memory", "sqlite", "postgres"]


def _missing_postgres() -> str | None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "psycopg 3 / psycopg_pool are not installed (pip install -e '.[dev]')"
    bindir = find_bin()
    if bindir is None or not (bindir / "initdb").exists() or not (bindir / "pg_ctl").exists():
        return (
            "PostgreSQL's initdb/pg_ctl were not found (apt-get install postgresql, "
            "or set DISPATCH_PG_BIN to their directory)"
        )
    return None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server for the whole session (per xdist worker), stopped at the end."""
    missing = _missing_postgres()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL store tests, but {missing}")
        pytest.skip(f"PostgreSQL store tests skipped: {missing}")
    bindir = find_bin()
    assert bindir is not None
    server = PgServer.start(bindir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """The URL (password included) of a fresh, empty database, dropped after the test."""
    name = pg_server.new_database()
    yield pg_server.dsn(name)
    pg_server.drop_database(name)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def open_store(kind: str, request: pytest.FixtureRequest, clock: ManualClock | None, tmp_path: Path) -> Store:
    """A new store of ``kind``; for postgres, on the test's database (``pg_dsn``)."""
    if kind == "memory":
        return MemoryStore(clock=clock)
    if kind == "sqlite":
        return SqliteStore(tmp_path / "state" / "jobs.db", clock=clock)
    from dispatch.records import PostgresStore

    return PostgresStore(request.getfixturevalue("pg_dsn"), clock=clock)


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path) -> AsyncIterator[Store]:
    s = open_store(request.param, request, clock, tmp_path)
    yield s
    await s.close()
