"""What is particular to PostgresStore (the shared contract is in test_store_contract.py): the database's
clock, history guarded by the database itself, the schema version, lost connections, and the password
never shown. All against the real server of the ``pg_server`` fixture."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from pgserver import PASSWORD, PgServer
from records_samples import counter_of, note, simple_record, with_counter
from test_store_contract import seen_until

from dispatch import ConflictError, InvalidError, Lease, PermissionDeniedError, UnavailableError
from dispatch.cli.config import parse_config
from dispatch.model._base import encode_text
from dispatch.records import PostgresStore, SqliteStore, Store


def raw(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(dsn, autocommit=True)


async def server_now(dsn: str) -> float:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")).fetchone()
        assert row is not None
        return float(row[0])


async def test_times_come_from_the_database_clock_not_the_hosts(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(pg_dsn)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86_400.0)  # this host's clock is a day fast
    before = await server_now(pg_dsn)
    rec = await store.create(simple_record("job"), note("created"))
    leased = await store.acquire_lease("job", "sup", 30)
    after = await server_now(pg_dsn)
    assert before <= rec.updated_at <= after
    assert leased.lease is not None and before + 30 <= leased.lease.expires_at <= after + 30
    await store.close()


async def test_a_lease_expires_by_the_database_clock_and_is_taken_over(pg_dsn: str) -> None:
    a, b = PostgresStore(pg_dsn), PostgresStore(pg_dsn)
    await a.create(simple_record("job"), note("created"))
    await a.acquire_lease("job", "sup-a", 0.3)
    with pytest.raises(ConflictError, match="sup-a"):
        await b.acquire_lease("job", "sup-b", 10)
    await asyncio.sleep(0.35)
    taken = await b.acquire_lease("job", "sup-b", 10)
    assert taken.lease is not None and taken.lease.holder == "sup-b"
    with pytest.raises(ConflictError, match="sup-b"):
        await a.acquire_lease("job", "sup-a", 10)
    await a.close()
    await b.close()


async def test_history_is_append_only_in_the_database_itself(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)
    await store.create(simple_record("job", state=simple_record("x").outcome.state), note("created"))
    with raw(pg_dsn) as conn:
        for sql in (
            "UPDATE dispatch_history SET body = '{}'",
            "DELETE FROM dispatch_history",
            "TRUNCATE dispatch_history",
        ):
            with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="dispatch history"):
                conn.execute(sql.encode())
        # Deleting history is allowed once its record is gone (what purge does).
        with conn.transaction():
            conn.execute("DELETE FROM dispatch_records WHERE job_id = 'job'")
            assert conn.execute("DELETE FROM dispatch_history WHERE job_id = 'job'").rowcount == 1
    await store.close()


async def test_the_schema_is_versioned_and_a_newer_one_refused(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)
    await store.list()
    with raw(pg_dsn) as conn:
        assert conn.execute("SELECT version FROM dispatch_schema").fetchall() == [(1,), (2,), (3,), (4,)]
        conn.execute("INSERT INTO dispatch_schema (version) VALUES (7)")
    newer = PostgresStore(pg_dsn)
    with pytest.raises(InvalidError, match="newer dispatch") as info:
        await newer.list()
    assert PASSWORD not in str(info.value)
    await newer.close()
    await store.close()


async def test_a_lease_change_writes_the_lease_columns_not_the_document(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)
    await store.create(simple_record("a"), note("created"))
    await store.create(simple_record("b"), note("created"))
    with raw(pg_dsn) as conn:
        doc_of = {r[0]: r[1] for r in conn.execute("SELECT job_id, doc FROM dispatch_records").fetchall()}
    a = await store.acquire_lease("a", "sup", 30)
    await store.acquire_lease("b", "sup", 30)
    renewed = await store.renew_leases("sup", 60, ["a", "b"])
    released = await store.release_lease("b", "sup")
    with raw(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT job_id, doc, revision, lease_holder FROM dispatch_records ORDER BY job_id"
        ).fetchall()
    assert [(j, d == doc_of[j], r, h) for j, d, r, h in rows] == [("a", True, 3, "sup"), ("b", True, 4, None)]
    # Every reader sees the columns: revision, updated_at and lease as the lease writes left them.
    assert [r.revision for r in renewed] == [3, 3]
    assert (
        renewed[0].lease is not None
        and a.lease is not None
        and renewed[0].lease.expires_at > a.lease.expires_at
    )
    assert await store.get("a") == renewed[0]
    assert await store.get("b") == released and released.lease is None
    other = PostgresStore(pg_dsn)  # another process: nothing cached
    assert await other.list() == [renewed[0], released]
    # A record write after them starts from the columns and writes the whole row again.
    written = await other.update(with_counter(released, 5), expected_revision=4)
    assert written.revision == 5 and written.lease is None and counter_of(await store.get("b")) == 5
    await other.close()
    await store.close()


async def test_a_version_3_database_is_migrated_and_a_reader_of_its_old_column_fails(pg_dsn: str) -> None:
    from dispatch.records.postgres import _MIGRATIONS

    with raw(pg_dsn) as conn, conn.transaction():
        conn.execute("CREATE TABLE dispatch_schema (version integer PRIMARY KEY, applied_at timestamptz)")
        for version in (0, 1, 2):
            for statement in _MIGRATIONS[version]:
                conn.execute(statement.encode())
            conn.execute("INSERT INTO dispatch_schema (version) VALUES (%s)", (version + 1,))
    old = PostgresStore(pg_dsn)
    # What a version 3 dispatch wrote: the whole record in ``body``, its lease included.
    held = simple_record("job").replace(revision=2, lease=Lease("sup", 1e12))
    with raw(pg_dsn) as conn:
        conn.execute(
            """INSERT INTO dispatch_records (job_id, state, terminal, created_at, updated_at, revision,
                   lease_holder, lease_expires_at, body) VALUES (%s, 'pending', false, %s, %s, 2, 'sup', 1e12, %s)""",
            ("job", held.created_at, held.updated_at, encode_text(held).decode()),
        )
    assert await old.get("job") == held
    with raw(pg_dsn) as conn:
        assert conn.execute("SELECT max(version) FROM dispatch_schema").fetchone() == (4,)
        with pytest.raises(psycopg.errors.UndefinedColumn):  # what a dispatch before v4 would read
            conn.execute("SELECT body FROM dispatch_records")
    await old.close()


async def test_a_lease_holder_without_an_expiry_is_an_unreadable_record(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn)
    await store.create(simple_record("bad"), note("created"))
    await store.create(simple_record("good"), note("created"))
    with raw(pg_dsn) as conn:
        conn.execute("UPDATE dispatch_records SET lease_holder = 'sup' WHERE job_id = 'bad'")
    listing = await store.list()
    assert [r.job_id for r in listing] == ["good"]
    assert [u.job_id for u in listing.unreadable] == ["bad"] and "expiry" in listing.unreadable[0].reason
    with pytest.raises(InvalidError, match="bad"):
        await store.get("bad")
    await store.close()


async def test_a_foreign_table_of_our_name_is_refused(pg_dsn: str) -> None:
    with raw(pg_dsn) as conn:
        conn.execute("CREATE TABLE dispatch_records (x int)")
    store = PostgresStore(pg_dsn)
    with pytest.raises(InvalidError, match="not a dispatch store"):
        await store.list()
    await store.close()


async def test_pooled_connections_the_server_ended_are_replaced_without_an_error(
    pg_server: PgServer, pg_dsn: str
) -> None:
    """The server ends idle pooled connections (a restart, an idle timeout, an administrator): the next
    read and the next writes each take a live connection. Writes included: a record update runs as
    one autocommit statement, and a connection the server already ended is found before it is sent; a
    lease change, one statement with the same effect when run again, is run again."""
    store = PostgresStore(pg_dsn)
    rec = await store.create(simple_record("job"), note("created"))
    await store.get("job")
    dbname = pg_dsn.rsplit("/", 1)[1]
    # With a timeout, pg_terminate_backend returns once the backend has exited: its goodbye is sent.
    pg_server.admin(
        f"SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = '{dbname}' "
        "AND pid <> pg_backend_pid()"
    )
    assert (await store.get("job")).revision == rec.revision
    for _ in range(3):
        rec = await store.update(with_counter(rec, counter_of(rec) + 1), expected_revision=rec.revision)
    pg_server.admin(
        f"SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = '{dbname}' "
        "AND pid <> pg_backend_pid()"
    )
    rec = await store.update(with_counter(rec, counter_of(rec) + 1), expected_revision=rec.revision)
    got = await store.get("job")
    assert got.revision == rec.revision and counter_of(got) == 4
    # Lease changes too (each one statement, run again on another connection when the first is gone).
    pg_server.admin(
        f"SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = '{dbname}' "
        "AND pid <> pg_backend_pid()"
    )
    leased = await store.acquire_lease("job", "sup-a", 30)
    assert leased.lease is not None and leased.lease.holder == "sup-a"
    assert leased.revision == got.revision + 1
    pg_server.admin(
        f"SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = '{dbname}' "
        "AND pid <> pg_backend_pid()"
    )
    released = await store.release_lease("job", "sup-a")
    assert released.lease is None and released.revision == leased.revision + 1
    await store.close()


async def test_an_unreachable_server_is_unavailable_quickly(pg_server: PgServer) -> None:
    dead = pg_server.dsn("nothing").replace(f":{pg_server.port}/", ":1/")
    store = PostgresStore(dead, timeout=3)
    with pytest.raises(UnavailableError, match=r"postgresql://dispatch@127\.0\.0\.1:1/nothing") as info:
        await store.get("job")
    assert PASSWORD not in str(info.value) and PASSWORD not in repr(info.value)
    await store.close()


# ---- the password is never shown --------------------------------------------------------------------


async def test_a_wrong_password_is_permission_denied_without_showing_it(
    pg_server: PgServer, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "Wr0ng-" + PASSWORD
    bad = pg_dsn.replace(PASSWORD, wrong)
    store = PostgresStore(bad)
    for text in (repr(store), str(store), store.where):
        assert wrong not in text and PASSWORD not in text
    with pytest.raises(PermissionDeniedError, match="password authentication failed") as info:
        await store.list()
    assert wrong not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert wrong not in caplog.text
    await store.close()


async def test_the_password_comes_from_pgpassfile_or_the_environment(
    pg_server: PgServer, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dbname = pg_dsn.rsplit("/", 1)[1]
    bare = pg_server.dsn(dbname, password=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{pg_server.port}:{dbname}:dispatch:{PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    store = PostgresStore(bare)
    await store.create(simple_record("job"), note("created"))
    await store.close()

    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    store = PostgresStore(bare)
    assert [r.job_id for r in await store.list()] == ["job"]
    await store.close()

    monkeypatch.delenv("PGPASSWORD")
    store = PostgresStore(bare)
    with pytest.raises(PermissionDeniedError):
        await store.list()
    await store.close()


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://dispatch:{PASSWORD}@127.0.0.1:notaport/db",
        f"host=127.0.0.1 password='{PASSWORD} port=1",
    ],
)
def test_a_malformed_dsn_is_invalid_without_echoing_it(dsn: str) -> None:
    with pytest.raises(InvalidError, match="dsn") as info:
        PostgresStore(dsn)
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize("bad", [None, "", "   ", 5])
def test_a_dsn_must_be_a_non_empty_string(bad: object) -> None:
    with pytest.raises(InvalidError, match="dsn"):
        PostgresStore(bad)  # type: ignore[arg-type]


def test_the_config_selects_postgres_by_url_and_never_shows_the_password() -> None:
    cf = parse_config(f"adapter: memory\nstore: postgresql://dispatch:{PASSWORD}@db.example:5432/jobs\n")
    assert str(cf.store) == "postgresql://dispatch@db.example:5432/jobs"
    assert PASSWORD not in repr(cf.store) and PASSWORD not in repr(cf)
    store = cf.store.open()
    assert isinstance(store, PostgresStore) and PASSWORD not in repr(store)
    for bad in ("mysql://x/y", "jobs.db", f"postgresql://u:{PASSWORD}@h:99999999/db"):
        with pytest.raises(InvalidError) as info:
            parse_config(f"adapter: memory\nstore: '{bad}'\n")
        assert info.value.path == "store"
        assert PASSWORD not in str(info.value)


def test_the_cli_check_json_names_the_store_without_its_password(
    pg_server: PgServer, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatch.cli.commands import cli

    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    config = tmp_path / "cluster.yaml"
    config.write_text(f"adapter: memory\nstore: {pg_dsn}\n")
    for args in (["check", "--json"], ["check"], ["list", "--json"]):
        result = CliRunner().invoke(cli, [*args, "--config", str(config)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert PASSWORD not in result.output
    result = CliRunner().invoke(cli, ["check", "--json", "--config", str(config)], catch_exceptions=False)
    assert json.loads(result.output)["store"] == pg_dsn.replace(f":{PASSWORD}", "")
    # A wrong password: the error names the store, not the password.
    wrong = "Wr0ng-" + PASSWORD
    config.write_text(f"adapter: memory\nstore: {pg_dsn.replace(PASSWORD, wrong)}\n")
    result = CliRunner().invoke(cli, ["list", "--json", "--config", str(config)], catch_exceptions=False)
    assert result.exit_code != 0
    assert wrong not in result.output and "password authentication failed" in result.output


# ---- change notification across instances (what other processes and hosts see) ---------------------


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_changes_by_another_store_instance_are_reported(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    def make() -> Store:
        if kind == "sqlite":
            return SqliteStore(tmp_path / "jobs.db")
        return PostgresStore(request.getfixturevalue("pg_dsn"))

    listener, writer = make(), make()
    await writer.create(simple_record("job"), note("created"))
    assert isinstance(listener, PostgresStore | SqliteStore)
    async with listener.changes() as feed:
        rec = await writer.get("job")
        await writer.update(with_counter(rec, 1), expected_revision=rec.revision)
        await writer.create(simple_record("other"), note("created"))
        assert set(await seen_until(feed, {"job", "other"})) == {"job", "other"}
    await listener.close()
    await writer.close()
