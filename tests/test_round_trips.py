"""The driver's ways of sending fewer round trips (airflow_pg_bulk/db/driver.py), under both
drivers, against the real server: what each statement does and what the connection's state is
after it, success and failure alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from psycopg import sql

from airflow_pg_bulk.db.driver import (
    execute,
    execute_each,
    execute_outside_transaction,
    execute_then_commit,
    is_database_error,
    rollback_quietly,
    server_error,
)
from tests.conftest import Database


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
        assert db.run(sql.SQL("SELECT to_regclass({})").format(sql.Literal(db.table("t")))) == [
            (None,)
        ]
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
    names = [sql.Literal(db.table(n)) for n in ("t", "u")]
    assert db.run(sql.SQL("SELECT to_regclass({}), to_regclass({})").format(*names)) == [
        (None, None)
    ]


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
    names = [sql.Literal(db.table(n)) for n in ("t", "u")]
    assert db.run(
        sql.SQL("SELECT to_regclass({}) IS NULL, to_regclass({}) IS NOT NULL").format(*names)
    ) == [(True, True)]
