"""The driver's ways of sending fewer round trips (airflow_pg_bulk/db/driver.py), under both
drivers, against the real server: what each statement does and what the connection's state is
after it, success and failure alike."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Database
from helpers import daily_target
from psycopg import sql

from airflow_pg_bulk.db.driver import (
    execute,
    execute_count,
    execute_each,
    execute_each_outside_transaction,
    execute_outside_transaction,
    execute_then_commit,
    is_database_error,
    read_each,
    read_prepared,
    rollback_quietly,
    server_error,
)

#: the in-process daily reload's round trips (see the last test), session set-ups included:
#: its day loaded in place, or built beside the target and swapped in
ROUND_TRIPS_OF_A_DAILY_RELOAD = {
    "in_place": {"prepare": 6, "copy": 5, "finalize": 16, "cleanup": 4},
    "swap": {"prepare": 6, "copy": 5, "finalize": 24, "cleanup": 4},
}


def _exists(db: Database, name: str) -> bool:
    """Whether the test schema has a table ``name`` (as committed)."""
    return db.scalar(
        sql.SQL("SELECT to_regclass({}) IS NOT NULL").format(sql.Literal(db.table(name)))
    )


def _in_transaction(conn: Any) -> bool:
    status = conn.get_transaction_status() if hasattr(conn, "get_transaction_status") else None
    if status is not None:  # psycopg2: 0 idle, 2 in transaction, 3 failed
        return status != 0
    return conn.info.transaction_status != 0


def test_execute_each_returns_every_statements_rows_in_order(
    db: Database, connect: Callable[[], Any]
) -> None:
    conn = connect()
    try:
        got = execute_each(
            conn,
            [
                sql.SQL("SELECT 1, 'a'"),
                sql.SQL("SELECT 2 WHERE false"),
                sql.SQL("CREATE TABLE {} (a int)").format(db.ident("t")),
                sql.SQL("SELECT set_config('lock_timeout', '7s', true)"),
                sql.SQL("SELECT current_setting('lock_timeout')"),
            ],
        )
        assert got == [[(1, "a")], [], [], [("7s",)], [("7s",)]]
        assert _in_transaction(conn)  # in the current transaction, not committed
        conn.rollback()
        assert not _exists(db, "t")
    finally:
        conn.close()


def test_execute_each_stops_at_the_first_failure(db: Database, connect: Callable[[], Any]) -> None:
    conn = connect()
    try:
        with pytest.raises(Exception) as caught:
            execute_each(
                conn,
                [
                    sql.SQL("CREATE TABLE {} (a int)").format(db.ident("t")),
                    sql.SQL("SELECT 1/0"),
                    sql.SQL("CREATE TABLE {} (a int)").format(db.ident("u")),
                ],
            )
        assert is_database_error(caught.value)
        assert server_error(caught.value).sqlstate == "22012"
        rollback_quietly(conn)
        assert execute(conn, sql.SQL("SELECT 1")) == [(1,)]  # usable after the rollback
    finally:
        conn.close()
    assert (_exists(db, "t"), _exists(db, "u")) == (False, False)


def test_execute_then_commit_commits_and_returns_the_rows(
    db: Database, connect: Callable[[], Any]
) -> None:
    db.run(sql.SQL("CREATE TABLE {} (a int)").format(db.ident("t")))
    conn = connect()
    try:
        execute(conn, sql.SQL("INSERT INTO {} VALUES (1)").format(db.ident("t")))
        rows = execute_then_commit(
            conn, sql.SQL("INSERT INTO {} VALUES (2) RETURNING a * 10").format(db.ident("t"))
        )
        assert rows == [(20,)]
        assert not _in_transaction(conn)
        # the next statement opens a new transaction, which the driver can commit as usual
        execute(conn, sql.SQL("INSERT INTO {} VALUES (3)").format(db.ident("t")))
        conn.commit()
    finally:
        conn.close()
    assert db.run(sql.SQL("SELECT array_agg(a ORDER BY a) FROM {}").format(db.ident("t"))) == [
        ([1, 2, 3],)
    ]


def test_execute_then_commit_that_fails_commits_nothing(
    db: Database, connect: Callable[[], Any]
) -> None:
    db.run(sql.SQL("CREATE TABLE {} (a int PRIMARY KEY)").format(db.ident("t")))
    db.run(sql.SQL("INSERT INTO {} VALUES (1)").format(db.ident("t")))
    conn = connect()
    try:
        execute(conn, sql.SQL("INSERT INTO {} VALUES (2)").format(db.ident("t")))
        with pytest.raises(Exception) as caught:
            execute_then_commit(conn, sql.SQL("INSERT INTO {} VALUES (1)").format(db.ident("t")))
        assert server_error(caught.value).sqlstate == "23505"
        rollback_quietly(conn)
    finally:
        conn.close()
    assert db.run(sql.SQL("SELECT array_agg(a) FROM {}").format(db.ident("t"))) == [([1],)]


def test_execute_outside_transaction_keeps_a_session_setting_and_autocommit_off(
    db: Database, connect: Callable[[], Any]
) -> None:
    conn = connect()
    try:
        rows = execute_outside_transaction(
            conn, sql.SQL("SELECT set_config('application_name', 'pgbulk-rt', false)")
        )
        assert rows == [("pgbulk-rt",)]
        assert not conn.autocommit
        assert not _in_transaction(conn)
        execute(conn, sql.SQL("CREATE TABLE {} (a int)").format(db.ident("t")))
        conn.rollback()  # still transactional: the CREATE is undone
        assert execute(conn, sql.SQL("SELECT current_setting('application_name')")) == [
            ("pgbulk-rt",)
        ]
        conn.rollback()
        # inside a transaction it runs there and commits it
        execute(conn, sql.SQL("CREATE TABLE {} (a int)").format(db.ident("u")))
        execute_outside_transaction(conn, sql.SQL("SELECT 1"))
        assert not _in_transaction(conn)
    finally:
        conn.close()
    assert (_exists(db, "t"), _exists(db, "u")) == (False, True)


def test_read_each_reads_in_autocommit_when_idle_and_in_the_open_transaction_otherwise(
    db: Database, connect: Callable[[], Any]
) -> None:
    """Idle: the reads run in autocommit and leave the connection idle and transactional (no
    BEGIN or COMMIT sent); in a transaction: they run in it, and it stays open with what it
    did before (a row its reads see, not committed)."""
    conn = connect()
    table = db.ident("t")
    try:
        execute(conn, sql.SQL("CREATE TABLE {} (a int)").format(table))
        conn.commit()
        got = read_each(
            conn,
            [sql.SQL("SELECT count(*) FROM {}").format(table), sql.SQL("SELECT 2 WHERE false")],
        )
        assert got == [[(0,)], []]
        assert not conn.autocommit and not _in_transaction(conn)
        execute(conn, sql.SQL("INSERT INTO {} VALUES (1)").format(table))
        (((seen,),),) = read_each(conn, [sql.SQL("SELECT count(*) FROM {}").format(table)])
        assert seen == 1 and _in_transaction(conn)
        conn.rollback()
        assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(table)) == 0
    finally:
        conn.close()


def test_read_prepared_plans_once_per_session_and_survives_a_session_that_lost_it(
    db: Database, connect: Callable[[], Any]
) -> None:
    """The statement is prepared the first time (its plan kept: pg_prepared_statements has
    it), then executed; ``before`` runs first and its rows come back. A session that lost it
    (DEALLOCATE ALL) or had it before this connection knew (another prepared it under the
    name) still gets the rows, in the same open transaction, which keeps what it did."""
    conn = connect()
    table = db.ident("t")
    query = sql.SQL("SELECT count(*), current_setting('pgbulk.test') FROM {}").format(table)
    name = "pgbulk_test_count"
    prepared = sql.SQL("SELECT count(*) FROM pg_prepared_statements WHERE name = {}").format(
        sql.Literal(name)
    )
    choose = [sql.SQL("SELECT set_config('pgbulk.test', 'x', true)")]
    try:
        execute(conn, sql.SQL("CREATE TABLE {} (a int)").format(table))
        conn.commit()
        execute(conn, sql.SQL("INSERT INTO {} VALUES (1)").format(table))
        assert read_prepared(conn, name, query, before=choose) == [[("x",)], [(1, "x")]]
        assert execute(conn, prepared) == [(1,)]
        execute(conn, sql.SQL("INSERT INTO {} VALUES (2)").format(table))
        assert read_prepared(conn, name, query, before=choose)[-1] == [(2, "x")]
        execute(conn, sql.SQL("DEALLOCATE ALL"))  # lost: prepared again
        assert read_prepared(conn, name, query, before=choose)[-1] == [(2, "x")]
        assert execute(conn, prepared) == [(1,)] and _in_transaction(conn)
        conn.rollback()
        other = connect()  # a session that has the name this connection does not know
        try:
            execute(other, sql.SQL("PREPARE {} AS {}").format(sql.Identifier(name), query))
            assert read_prepared(other, name, query, before=choose)[-1] == [(0, "x")]
            other.rollback()
        finally:
            other.close()
    finally:
        conn.close()
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(table)) == 0


def test_execute_each_outside_transaction_returns_each_result_and_a_failure_stops_the_rest(
    db: Database, connect: Callable[[], Any]
) -> None:
    """Each statement's rows in autocommit, the connection left idle and transactional; a
    failing statement stops the ones after it (the release of a lock sent after a trim)."""
    conn = connect()
    table = db.ident("t")
    try:
        execute(conn, sql.SQL("CREATE TABLE {} (a int)").format(table))
        conn.commit()
        first, second = execute_each_outside_transaction(
            conn,
            [
                sql.SQL("SELECT set_config('application_name', 'pgbulk-each', false)"),
                sql.SQL("INSERT INTO {} VALUES (1), (2) RETURNING a").format(table),
            ],
        )
        assert (first, second) == ([("pgbulk-each",)], [(1,), (2,)])
        assert not conn.autocommit
        assert not _in_transaction(conn)
        with pytest.raises(Exception) as info:
            execute_each_outside_transaction(
                conn,
                [
                    sql.SQL("SELECT 1/0"),
                    sql.SQL("INSERT INTO {} VALUES (3)").format(table),
                ],
            )
        assert is_database_error(info.value)
        rollback_quietly(conn)
        assert not conn.autocommit
        count = execute(conn, sql.SQL("SELECT count(*) FROM {}").format(table))
        assert count == [(2,)]  # the INSERT after the failure did not run
        conn.rollback()
    finally:
        conn.close()


@pytest.mark.parametrize("way", ["in_place", "swap"])
def test_a_daily_reload_makes_its_round_trips_only(
    db: Database, pg_dsn: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """Issue 17: a daily reload (one day's rows into a table partitioned by day, loaded in
    place, or built beside the target and swapped in as a month's is) costs what its
    statements cost, and each round trip is ~0.3 ms of client and server time on loopback.
    Counted on the wire (libpq's protocol trace: one ReadyForQuery per round trip) for the
    in-process load, the load history already made by a first load: the server's statement
    log counted 92 before they were cut (prepare 27, COPY 13, finalize 42, cleanup 10); the
    swap's finalize made 53 on the wire before its checks, reads and DDL were sent together
    (27 since; 24 since the ledger's reads go in one round trip with staging's and the
    partition key is the one prepare captured; 25 since each swapped partition is read
    again under the lock by a prepared statement of its own; 24, and the day loaded in
    place 16, since a load into one of the newest partitions finds it without the EXPLAIN;
    prepare 7 -> 6 with the ledger sent with its COMMIT, COPY 6 -> 5 with the ledger's
    check and claim in one round trip)."""
    import csv

    import psycopg

    from airflow_pg_bulk import runner
    from airflow_pg_bulk.target import partitioned

    if way == "swap":
        monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)

    daily_target(db, 5, "2024-01-01")
    source = tmp_path / "day.csv"
    with source.open("w", newline="") as f:
        csv.writer(f).writerows([m, "2024-01-03", m * 10] for m in range(1, 301))
    traces: list[tuple[int, Path]] = []

    def traced() -> psycopg.Connection:
        conn = psycopg.connect(pg_dsn)
        path = tmp_path / f"trace{len(traces)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(
            psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        )
        traces.append((fd, path))
        return conn

    def load(factory: Any) -> Any:
        return runner.load(factory, db.table("readings"), [str(source)], mode="replace_partitions")

    load(lambda: psycopg.connect(pg_dsn))  # the first: makes the load history
    try:
        summary = load(traced)
    finally:
        for fd, _trace in traces:
            os.close(fd)
    steps: dict[str, int] = {}
    step = "connect"
    for _fd, trace in traces:
        for line in trace.read_text().splitlines():
            found = re.search(r"'pgbulk:[0-9a-f]+:(\w+)", line)
            if line.startswith("F") and "application_name" in line and found:
                step = found.group(1)
            if line.split("\t")[:3:2] == ["B", "ReadyForQuery"]:
                steps[step] = steps.get(step, 0) + 1
    assert summary.rows == 300
    day = sql.SQL("SELECT count(*), sum(reading) FROM {}").format(db.ident("readings_20240103"))
    assert db.run(day) == [(300, sum(m * 10 for m in range(1, 301)))]
    assert len(traces) == 1  # one session: prepare, COPY, finalize and cleanup in turn
    # each step's, its session's set-up included, as counted when this test was written:
    # more means a statement gained a round trip
    assert steps == ROUND_TRIPS_OF_A_DAILY_RELOAD[way]


def test_execute_count_after_other_statements_counts_the_last(
    db: Database, connect: Callable[[], Any]
) -> None:
    db.run(sql.SQL("CREATE TABLE {} (a int)").format(db.ident("t")))
    db.run(sql.SQL("INSERT INTO {} SELECT generate_series(1, 5)").format(db.ident("t")))
    conn = connect()
    try:
        count = execute_count(
            conn,
            sql.SQL("INSERT INTO {} SELECT generate_series(1, 3)").format(db.ident("t")),
            after=[sql.SQL("TRUNCATE {}").format(db.ident("t"))],
        )
        assert count == 3
        assert execute_count(conn, sql.SQL("DELETE FROM {}").format(db.ident("t"))) == 3
        conn.rollback()
    finally:
        conn.close()
    assert db.run(sql.SQL("SELECT count(*) FROM {}").format(db.ident("t"))) == [(5,)]
