"""Readers are not stalled by the swap while autovacuum works on the target.

After a big load autovacuum works on the new table by itself. A replace's ACCESS EXCLUSIVE
request then waits ``deadlock_timeout`` (1 s) for PostgreSQL to cancel the autovacuum, and
every reader queues behind the waiting request: measured 1,014 ms. The swap now waits for
autovacuum under SHARE UPDATE EXCLUSIVE, which no reader conflicts with, and then takes
ACCESS EXCLUSIVE in short tries (:mod:`airflow_pg_bulk.locking`).

The test makes an autovacuum that lasts minutes work on the target (a dedicated server with
autovacuum on and a one-second naptime; the table's cost limit at its minimum), reads the
target by index every 5 ms from another session, and replaces it as a role that is not a
superuser (no right to cancel autovacuum). The 100 ms target is the benchmark's; here the
bound is the stall's own size: no read may wait anywhere near deadlock_timeout.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from conftest import Database
from helpers import create_items, plain_copy_checksum, rows, write_csv
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_pg_bulk import runner

STALL = 0.5  # seconds: half of deadlock_timeout, five times the benchmark's target


@pytest.fixture
def autovacuum_db(own_server) -> Iterator[Database]:
    """A schema on the dedicated server, with autovacuum on and quick to start."""
    admin = psycopg.connect(own_server.uri, autocommit=True)
    admin.execute("ALTER SYSTEM SET autovacuum = on")
    admin.execute("ALTER SYSTEM SET autovacuum_naptime = '1s'")
    admin.execute("SELECT pg_reload_conf()")
    schema = f"t_{uuid.uuid4().hex[:10]}"
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    database = Database(own_server.uri, schema, admin)
    try:
        yield database
    finally:
        database.drop()
        admin.execute("ALTER SYSTEM RESET autovacuum_naptime")
        admin.execute("ALTER SYSTEM SET autovacuum = off")
        admin.execute("SELECT pg_reload_conf()")
        admin.close()


def _loader_role(db: Database) -> str:
    """A login role that owns the schema and the target, and is not a superuser."""
    role = f"loader_{uuid.uuid4().hex[:8]}"
    db.run(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    db.roles.append(role)
    db.run(
        sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(
            sql.Identifier(db.schema), sql.Identifier(role)
        )
    )
    db.run(sql.SQL("ALTER TABLE {} OWNER TO {}").format(db.ident("items"), sql.Identifier(role)))
    return make_conninfo(db.dsn, user=role)


def _autovacuum_on(db: Database, table: str) -> bool:
    return bool(
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            " AND query LIKE %s",
            f"%{table}%",
        )
    )


def _read_until(dsn: str, target: str, stop: threading.Event, waits: list[float]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT name FROM {} WHERE id = %s").format(sql.SQL(target))
        key = 0
        while not stop.is_set():
            key = key % 1000 + 1
            started = time.perf_counter()
            conn.execute(query, (key,))
            waits.append(time.perf_counter() - started)
            time.sleep(0.005)


def test_the_swap_does_not_stall_readers_while_autovacuum_works_on_the_target(
    autovacuum_db, tmp_path
):
    db = autovacuum_db
    create_items(db)
    db.run(
        sql.SQL(
            "INSERT INTO {} (id, name, amount, day) SELECT g, 'old ' || g, 1, date '2024-01-01'"
            " FROM generate_series(1, 200000) g"
        ).format(db.ident("items"))
    )
    # an autovacuum that starts at once and crawls: minutes for this table
    db.run(
        sql.SQL(
            "ALTER TABLE {} SET (autovacuum_vacuum_insert_threshold = 1000,"
            " autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_cost_delay = 100,"
            " autovacuum_vacuum_cost_limit = 1)"
        ).format(db.ident("items"))
    )
    dsn = _loader_role(db)
    path = write_csv(tmp_path / "items.csv", rows(20000, seed=41))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    deadline = time.monotonic() + 60
    while not _autovacuum_on(db, "items"):
        assert time.monotonic() < deadline, "autovacuum did not start on the target"
        time.sleep(0.2)

    stop, waits = threading.Event(), []
    reader = threading.Thread(target=_read_until, args=(db.dsn, db.table("items"), stop, waits))
    reader.start()
    try:
        time.sleep(0.3)
        assert _autovacuum_on(db, "items")  # still working when the load starts
        summary = runner.load(dsn, db.table("items"), str(path), mode="replace", partitions=2)
        time.sleep(0.3)
    finally:
        stop.set()
        reader.join(timeout=30)

    assert summary.rows == 20000
    assert db.checksum("items") == expected
    assert len(waits) > 50
    worst = max(waits)
    print(f"worst reader wait {worst * 1000:.0f} ms over {len(waits)} reads")
    assert worst < STALL, f"a reader waited {worst * 1000:.0f} ms during the load"
