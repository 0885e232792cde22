"""Readers are not stalled by a load: by the swap while autovacuum works on the target (a
replace, a rebuild (append and upsert by rebuild) and a partition's swap (replace_partitions)),
and by a daily reload of a table of 1,826 daily partitions (a reader of another day).

After a big load autovacuum works on the new table by itself. A replace's ACCESS EXCLUSIVE
request then waits ``deadlock_timeout`` (1 s) for PostgreSQL to cancel the autovacuum, and
every reader queues behind the waiting request: measured 1,014 ms. The swap now waits for
autovacuum under SHARE UPDATE EXCLUSIVE, which no reader conflicts with, and then takes
ACCESS EXCLUSIVE in short tries (:mod:`airflow_pg_bulk.target.locking`).

The test makes an autovacuum that lasts minutes work on the target (a dedicated server with
autovacuum on and a one-second naptime; the table's cost limit at its minimum), reads the
target by index every 5 ms from another session, and replaces it as a role that is not a
superuser (no right to cancel autovacuum). No read may wait 100 ms (the README's claim); a
read's wait includes the machine's own scheduling, so on a loaded machine the test runs the
load again (up to three times) before it fails: a stall behind the swap's lock recurs every
time, a descheduled reader does not. (So each attempt starts as the first did: a replace of the
partitioned target empties items_b, which the next attempt fills again. Before it did, the
first attempt's 1,006 ms stall on PostgreSQL 15, a TRUNCATE of items_b under the parent's
ACCESS EXCLUSIVE waiting for its autovacuum, went unseen: the second found items_b empty.)
"""

from __future__ import annotations

import datetime
import os
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from conftest import Database
from helpers import create_items, daily_target, plain_copy_checksum, rows, write_csv
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_pg_bulk import runner
from airflow_pg_bulk.target import partitioned

STALL = 0.1  # seconds: the README's claim (deadlock_timeout is 1 s)
ATTEMPTS = 3


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


def _loader_role(db: Database, tables: list[str]) -> str:
    """A login role that owns the schema and the target, and is not a superuser."""
    role = f"loader_{uuid.uuid4().hex[:8]}"
    db.run(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    db.roles.append(role)
    db.run(
        sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(
            sql.Identifier(db.schema), sql.Identifier(role)
        )
    )
    for table in tables:
        db.run(sql.SQL("ALTER TABLE {} OWNER TO {}").format(db.ident(table), sql.Identifier(role)))
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


CRAWL = (  # an autovacuum that starts at once and crawls: minutes for these tables
    "ALTER TABLE {} SET (autovacuum_vacuum_insert_threshold = 1000,"
    " autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_cost_delay = 100,"
    " autovacuum_vacuum_cost_limit = 1)"
)
CASES = {  # name: (mode, strategy, partitioned target)
    "replace": ("replace", "auto", False),
    "append-rebuild": ("append", "rebuild", False),
    "upsert-rebuild": ("upsert", "rebuild", False),
    "replace_partitions": ("replace_partitions", "auto", True),  # swaps items_a
    # swaps items_a, empties items_b (LOCK TABLE on the parent locks its partitions too)
    "replace-partitioned": ("replace", "auto", True),
}


EMPTY_PARTITIONS = 20  # more partitions: more catalog for a swap to read


def _target(db: Database, partitioned: bool) -> tuple[list[str], list[str]]:
    """``items`` with 200,000 rows (partitioned by id: 100,000 in each of its first two
    partitions, :data:`EMPTY_PARTITIONS` more empty ones), autovacuum crawling on the tables
    that hold them. Returns the tables to hand to the loader and those autovacuum works on."""
    if not partitioned:
        create_items(db)
        tables = busy = ["items"]
    else:
        db.run(
            sql.SQL(
                "CREATE TABLE {} (id integer PRIMARY KEY, name text NOT NULL,"
                " amount numeric(12,2) CHECK (amount >= 0), day date, note text)"
                " PARTITION BY RANGE (id)"
            ).format(db.ident("items"))
        )
        for leaf, low, high in (("items_a", 0, 500_000), ("items_b", 500_000, 1_000_000)):
            db.run(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                    db.ident(leaf), db.ident("items"), low, high
                )
            )
        extra = [f"items_{k:02d}" for k in range(EMPTY_PARTITIONS)]
        for k, leaf in enumerate(extra):
            low = 1_000_000 + 10_000 * k
            db.run(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                    db.ident(leaf), db.ident("items"), low, low + 10_000
                )
            )
        tables, busy = ["items", "items_a", "items_b", *extra], ["items_a", "items_b"]
    db.run(
        sql.SQL(
            "INSERT INTO {} (id, name, amount, day) SELECT g, 'old ' || g, 1, date '2024-01-01'"
            " FROM generate_series(1, 200000) g WHERE g <= 100000 OR {}"
        ).format(db.ident("items"), sql.SQL("true" if not partitioned else "g > 100000"))
    )
    if partitioned:
        db.run(
            sql.SQL("UPDATE {} SET id = id + 400000 WHERE id > 100000").format(db.ident("items"))
        )
    for table in busy:
        db.run(sql.SQL(CRAWL).format(db.ident(table)))
    return tables, busy


def _refill(db: Database, leaf: str) -> None:
    """items_b's rows again (a replace emptied it), autovacuum crawling on them."""
    db.run(
        sql.SQL(
            "INSERT INTO {} (id, name, amount, day) SELECT g, 'old ' || g, 1, date '2024-01-01'"
            " FROM generate_series(500001, 600000) g"
        ).format(db.ident(leaf))
    )
    db.run(sql.SQL(CRAWL).format(db.ident(leaf)))


def _count(db: Database, table: str) -> int:
    return db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident(table)))


@pytest.mark.parametrize("case", list(CASES))
def test_the_swap_does_not_stall_readers_while_autovacuum_works_on_the_target(
    autovacuum_db, tmp_path, case
):
    mode, strategy, partitioned = CASES[case]
    db = autovacuum_db
    tables, busy = _target(db, partitioned)
    dsn = _loader_role(db, tables)
    new = rows(20000, seed=41)
    path = write_csv(tmp_path / "items.csv", new)
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    worst_of = []
    for attempt in range(ATTEMPTS):
        if mode == "append":  # keys after the old ones (and the last attempt's)
            shifted = [(r[0] + 300_000 + 20_000 * attempt, *r[1:]) for r in new]
            path = write_csv(tmp_path / "items.csv", shifted)
        if attempt and mode == "replace" and partitioned:
            _refill(db, "items_b")  # emptied by the last attempt: as the first one found it
        deadline = time.monotonic() + 60
        working = [table for table in busy if _count(db, table)]  # (emptied by a replace)
        while not all(_autovacuum_on(db, table) for table in working):
            assert time.monotonic() < deadline, f"autovacuum did not start on {working}"
            time.sleep(0.2)
        before = _count(db, "items")
        replaced = _count(db, "items_a") if mode == "replace_partitions" else 0
        stop, waits = threading.Event(), []
        reader = threading.Thread(target=_read_until, args=(db.dsn, db.table("items"), stop, waits))
        reader.start()
        try:
            time.sleep(0.3)
            assert all(_autovacuum_on(db, table) for table in working)  # still working
            summary = runner.load(
                dsn, db.table("items"), str(path), mode=mode, strategy=strategy, partitions=2
            )
            time.sleep(0.3)
        finally:
            stop.set()
            reader.join(timeout=30)
        assert summary.rows == 20000
        expected_count = {
            "append": before + 20000,
            "upsert": before,
            "replace_partitions": before - replaced + 20000,
        }.get(mode, 20000)
        assert _count(db, "items") == expected_count
        if mode == "replace":
            assert db.checksum("items") == expected
        assert len(waits) > 50
        worst_of.append(max(waits))
        slow = sum(w >= STALL for w in waits)
        print(
            f"{case}, attempt {attempt + 1}: worst reader wait {worst_of[-1] * 1000:.0f} ms over"
            f" {len(waits)} reads ({slow} of {STALL * 1000:.0f} ms or more); the swap took"
            f" {summary.seconds.get('swap', 0) * 1000:.0f} ms; load average"
            f" {os.getloadavg()[0]:.1f}"
        )
        if worst_of[-1] < STALL:
            break
        for table in busy:  # (a swapped-in table has them already)
            db.run(sql.SQL(CRAWL).format(db.ident(table)))
    assert min(worst_of) < STALL, (
        f"a reader waited {', '.join(f'{w * 1000:.0f}' for w in worst_of)} ms in {ATTEMPTS} "
        f"loads ({case})"
    )


DAYS = 1826  # five years of daily partitions
DAY0 = "2019-01-01"
READER_BOUND = 0.1  # seconds a reader of another partition may wait during the whole load


def _drop_in_chunks(db: Database) -> None:
    """Drop the partitions a few hundred at a time (dropping the schema at once would need
    a lock per partition and index: more than the server's lock table holds)."""
    names = [
        row[0]
        for row in db.run(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass",
            db.table("readings"),
        )
    ]
    for start in range(0, len(names), 300):
        db.run(
            sql.SQL("DROP TABLE {}").format(
                sql.SQL(", ").join(db.ident(name) for name in names[start : start + 300])
            )
        )


def _read_other_day(dsn: str, target: str, stop: threading.Event, waits: list[float]) -> None:
    """Read one row of a day in the middle every 5 ms; each wait as the server saw it (from
    the statement's arrival to its row: its locks included, the client's own delays not;
    the simple query protocol, so that the statement's start is its arrival)."""
    with psycopg.connect(dsn, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        query = sql.SQL(
            "SELECT extract(epoch FROM clock_timestamp() - statement_timestamp()), reading"
            " FROM {} WHERE meter_id = 5 AND day = date {} + {}"
        ).format(sql.SQL(target), sql.Literal(DAY0), sql.Literal(DAYS // 2))
        conn.execute(query)  # (the session's first read of the table builds its caches)
        while not stop.is_set():
            waits.append(float(conn.execute(query).fetchone()[0]))
            time.sleep(0.005)


@pytest.mark.parametrize("way", ["in_place", "swap"])
def test_a_daily_reload_of_1826_partitions_keeps_readers_of_other_days_waiting_under_100ms(
    db, pg_dsn, tmp_path, monkeypatch, way
):
    """replace_partitions of the last day's 2,000 rows into a table of 1,826 daily partitions
    while another session reads another day every 5 ms: the day holds exactly the loaded
    rows, and ``in_place`` (the daily reload's way: few rows go in place, no lock on the
    parent that a reader waits for) no read waits 100 ms or more. ``swap`` (the way of a
    partition of more than IN_PLACE_ROWS rows, forced here: the day built beside it and
    swapped in, ACCESS EXCLUSIVE on the parent from DETACH to COMMIT only): no read waits
    1 s (measured: 110 ms on a busy 2-core machine; 26 s before the swap stopped capturing
    every partition under that lock)."""
    if way == "swap":
        monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
    daily_target(db, DAYS, DAY0)
    last = (datetime.date.fromisoformat(DAY0) + datetime.timedelta(days=DAYS - 1)).isoformat()
    path = write_csv(tmp_path / "day.csv", [(m, last, m / 2) for m in range(1, 2001)])

    stop, waits = threading.Event(), []
    reader = threading.Thread(
        target=_read_other_day, args=(pg_dsn, db.table("readings"), stop, waits)
    )
    reader.start()
    try:
        time.sleep(0.3)
        summary = runner.load(pg_dsn, db.table("readings"), str(path), mode="replace_partitions")
        time.sleep(0.1)
        day = db.ident("readings_" + last.replace("-", ""))
        loaded = db.run(sql.SQL("SELECT count(*), sum(reading) FROM {}").format(day))
    finally:
        stop.set()
        reader.join(timeout=30)
        _drop_in_chunks(db)

    assert summary.rows == 2000
    assert loaded == [(2000, sum(m / 2 for m in range(1, 2001)))]
    assert len(waits) > 20
    worst = max(waits)
    print(f"{way}: worst reader wait {worst * 1000:.1f} ms over {len(waits)} reads")
    # a swap holds the parent from DETACH to COMMIT: DETACH and ATTACH of a partition of a
    # 1,826-partition table take tens of ms each (as by hand), so the bound is the daily
    # reload's way (in place); a swap must stay within a few of them, not grow with the load
    bound = READER_BOUND if way == "in_place" else 10 * READER_BOUND
    assert worst < bound, f"a reader of another day waited {worst * 1000:.0f} ms"
