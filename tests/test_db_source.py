"""A database as the source: a PostgreSQL database (a second database on the test server, read
by ``COPY (query) TO STDOUT``) and SQLite through SQLAlchemy (rows encoded as COPY text), into
the target in every mode, with both target drivers; values round-trip exactly; a source that
fails midway, a query that cannot run, a column that matches nothing and a source that cannot
be reached leave the target untouched."""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import psycopg
import pytest
from helpers import load_both_ways
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import make_url

from airflow_pg_bulk import cli
from airflow_pg_bulk.errors import (
    BadDataError,
    LoadRefusedError,
    SourceReadError,
    TransientLoadError,
)
from airflow_pg_bulk.loading.database.columns import source_description
from airflow_pg_bulk.loading.database.urls import hold
from airflow_pg_bulk.plan import DatabaseSource
from airflow_pg_bulk.runner import load
from airflow_pg_bulk.sql import source as source_sql

#: values that must come back exactly: NULL, the COPY text format's own characters, unicode
AWKWARD = [
    None,
    "",
    "tab\there",
    "line\nbreak",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "\\.",
    "ends with backslash\\",
    "naïve café 日本語 🚀",
    "quote \" and ' and ,",
]


def _url(dsn: str, database: str) -> str:
    """``dsn`` (a URI, as the embedded server's ``postgresql://postgres@/postgres?host=/tmp/...``,
    or key=value pairs) naming ``database`` instead, as a URI."""
    if "://" not in dsn:
        params = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "dbname"}
        return f"postgresql:///{database}?{urlencode(params)}"
    return urlsplit(dsn)._replace(path=f"/{database}").geturl()


@pytest.fixture(scope="module")
def source_pg(pg_dsn: str) -> Iterator[str]:
    """A second database on the test server, as a PostgreSQL source: table ``src`` (id, day,
    v, amount) of 3,000 rows over three days, and ``awkward`` (id, v) of :data:`AWKWARD`."""
    name = f"pgbulk_src_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = _url(pg_dsn, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE src (id int PRIMARY KEY, day date NOT NULL, v text, amount numeric)"
            )
            conn.execute(
                "INSERT INTO src SELECT g, date '2026-01-01' + g % 3, 'v' || g, g / 7.0"
                " FROM generate_series(1, 3000) g"
            )
            conn.execute("CREATE TABLE awkward (id int PRIMARY KEY, v text)")
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO awkward VALUES (%s, %s)", list(enumerate(AWKWARD, start=1))
                )
        yield url
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def source_sqlite(tmp_path: Path) -> str:
    """A SQLite file with the same ``src`` and ``awkward`` tables (dates as ISO text)."""
    path = tmp_path / "source.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE src (id integer PRIMARY KEY, day text, v text, amount real)")
        conn.executemany(
            "INSERT INTO src VALUES (?, ?, ?, ?)",
            [(g, f"2026-01-0{1 + g % 3}", f"v{g}", g / 8) for g in range(1, 3001)],
        )
        conn.execute("CREATE TABLE awkward (id integer PRIMARY KEY, v text, b blob)")
        conn.executemany(
            "INSERT INTO awkward VALUES (?, ?, ?)",
            [(i, v, None if v is None else v.encode()) for i, v in enumerate(AWKWARD, start=1)],
        )
    return f"sqlite:///{path}"


def _target(db: Any, name: str = "t") -> str:
    db.run(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, day date NOT NULL, v text, amount numeric)"
        ).format(db.ident(name))
    )
    return db.table(name)


def _rows(db: Any, name: str = "t") -> list[tuple[Any, ...]]:
    return db.run(sql.SQL("SELECT id, day::text, v FROM {} ORDER BY id").format(db.ident(name)))


# --- PostgreSQL source: every mode, both target drivers -----------------------------------------


def test_postgres_source_every_mode(db: Any, connect: Callable[[], Any], source_pg: str) -> None:
    table = _target(db)
    summary = load(connect, table, mode="replace", source_url=source_pg, query="SELECT * FROM src")
    assert summary.rows == 3000
    assert (
        db.scalar(sql.SQL("SELECT sum(amount) FROM {}").format(db.ident("t")))
        == (
            psycopg.connect(source_pg).execute("SELECT sum(amount) FROM src").fetchone()[0]  # type: ignore[index]
        )
    )
    load(
        connect,
        table,
        mode="append",
        source_url=source_pg,
        query="SELECT id + 3000 AS id, day, v, amount FROM src WHERE id <= 10",
    )
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("t"))) == 3010
    summary = load(
        connect,
        table,
        mode="upsert",
        source_url=source_pg,
        query="SELECT id, day, 'new' AS v FROM src WHERE id % 1000 = 0",
    )
    assert summary.rows == 3
    rows = dict((r[0], r[2]) for r in _rows(db))
    assert [rows[1000], rows[2000], rows[3000], rows[999], rows[3001]] == [
        "new",
        "new",
        "new",
        "v999",
        "v1",
    ]
    load(connect, table, mode="replace", source_url=source_pg, source_table="public.src")
    assert len(_rows(db)) == 3000


def test_postgres_source_replace_partitions(
    db: Any, connect: Callable[[], Any], source_pg: str
) -> None:
    db.run(
        sql.SQL(
            "CREATE TABLE {} (id int, day date NOT NULL, v text, amount numeric)"
            " PARTITION BY RANGE (day)"
        ).format(db.ident("p"))
    )
    for n in range(1, 4):
        db.run(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"p{n}"),
                db.ident("p"),
                sql.Literal(f"2026-01-0{n}"),
                sql.Literal(f"2026-01-0{n + 1}"),
            )
        )
    table = db.table("p")
    load(connect, table, mode="replace", source_url=source_pg, query="SELECT * FROM src")
    # one day again, with other values: only its table partition changes
    load(
        connect,
        table,
        mode="replace_partitions",
        source_url=source_pg,
        query="SELECT id, day, 'again' AS v, amount FROM src WHERE day = '2026-01-02' AND id < 100",
    )
    counts = dict(
        db.run(sql.SQL("SELECT day::text, count(*) FROM {} GROUP BY 1").format(db.ident("p")))
    )
    assert counts == {"2026-01-01": 1000, "2026-01-02": 33, "2026-01-03": 1000}
    assert (
        db.scalar(sql.SQL("SELECT count(*) FROM {} WHERE v = 'again'").format(db.ident("p2"))) == 33
    )


def test_postgres_source_values_round_trip(
    db: Any, connect: Callable[[], Any], source_pg: str
) -> None:
    db.run(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(db.ident("a")))
    load(connect, db.table("a"), mode="replace", source_url=source_pg, source_table="awkward")
    got = db.run(sql.SQL("SELECT v FROM {} ORDER BY id").format(db.ident("a")))
    assert [r[0] for r in got] == AWKWARD


# --- SQLite through SQLAlchemy ------------------------------------------------------------------


def test_sqlite_source_every_mode(db: Any, connect: Callable[[], Any], source_sqlite: str) -> None:
    table = _target(db)
    assert (
        load(connect, table, mode="replace", source_url=source_sqlite, source_table="src").rows
        == 3000
    )
    assert _rows(db)[:2] == [(1, "2026-01-02", "v1"), (2, "2026-01-03", "v2")]
    load(
        connect,
        table,
        mode="append",
        source_url=source_sqlite,
        query="SELECT id + 3000 AS id, day, v, amount FROM src WHERE id <= 5",
    )
    load(
        connect,
        table,
        mode="upsert",
        source_url=source_sqlite,
        query="SELECT id, day, 'new' AS v FROM src WHERE id IN (1, 2)",
    )
    rows = _rows(db)
    assert len(rows) == 3005
    assert [r[2] for r in rows[:3]] == ["new", "new", "v3"]
    assert db.scalar(sql.SQL("SELECT amount FROM {} WHERE id = 3").format(db.ident("t"))) == 0.375


def test_sqlite_source_values_round_trip(
    db: Any, connect: Callable[[], Any], source_sqlite: str
) -> None:
    db.run(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, b bytea)").format(db.ident("a")))
    load(connect, db.table("a"), mode="replace", source_url=source_sqlite, source_table="awkward")
    got = db.run(sql.SQL("SELECT v, b FROM {} ORDER BY id").format(db.ident("a")))
    assert [r[0] for r in got] == AWKWARD
    assert [None if r[1] is None else bytes(r[1]).decode() for r in got] == AWKWARD


def _sqlite_table(path: Path, create: str, rows: list[tuple[Any, ...]]) -> None:
    """A SQLite file at ``path`` holding one table, made by ``create``, of ``rows``."""
    with sqlite3.connect(path) as lite:
        lite.execute(create)
        table = create.split()[2]
        marks = ", ".join("?" * len(rows[0]))
        lite.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    lite.close()


def test_sqlite_dynamic_types_round_trip(
    db: Any, connect: Callable[[], Any], tmp_path: Path
) -> None:
    """SQLite's values as it stores them, a column of one type or of several (its typing is per
    value), in batches larger than one fetch: doubles to the last bit (infinity too), integers
    past 64 bits' half, text needing every COPY escape beside plain text, NULLs."""
    path = tmp_path / "typed.db"
    floats = [0.1 + 0.2, 1e300, -5e-324, float("inf"), 123456789.123456789]
    rows = [
        (i, floats[i % 5], (2**63 - 1) if i % 7 == 0 else -i, f"v{i}" if i % 3 else "a\\b\tc\r\n",
         [i, i / 4, f"t{i}", None][i % 4])
        for i in range(25_000)
    ]  # fmt: skip
    _sqlite_table(path, "CREATE TABLE typed (id integer, f real, n integer, s text, m)", rows)
    db.run(
        sql.SQL("CREATE TABLE {} (id int, f float8, n bigint, s text, m text)").format(
            db.ident("typed")
        )
    )
    load(connect, db.table("typed"), mode="replace", source_url=f"sqlite:///{path}",
         source_table="typed")  # fmt: skip
    got = db.run(sql.SQL("SELECT id, f, n, s, m FROM {} ORDER BY id").format(db.ident("typed")))
    assert got == [(i, f, n, s, None if m is None else str(m)) for i, f, n, s, m in rows]


# --- split by a column: one COPY stream per range ------------------------------------------------


def test_split_by_a_column_with_null_keys(
    db: Any, connect: Callable[[], Any], source_pg: str, source_sqlite: str
) -> None:
    table = _target(db)
    expected = load(connect, table, mode="replace", source_url=source_pg, source_table="src")
    whole = db.checksum("t")
    whole_ids = db.checksum("t", "id, day, v")
    # an integer key with NULLs (every tenth row): they go to the first range
    nulls = "SELECT id, day, v, CASE WHEN id % 10 = 0 THEN NULL ELSE id END AS amount FROM src"
    summary = load(
        connect, table, mode="replace", source_url=source_pg, query=nulls,
        split_by="amount", partitions=4,
    )  # fmt: skip
    assert summary.rows == expected.rows == 3000
    assert "4 COPY streams" in summary.describe()
    assert (
        db.scalar(sql.SQL("SELECT count(*) FROM {} WHERE amount IS NULL").format(db.ident("t")))
        == 300
    )
    assert db.checksum("t", "id, day, v") == whole_ids
    # a date key of three days: three ranges however many were asked for
    summary = load(
        connect, table, mode="replace", source_url=source_pg, source_table="src",
        split_by="day", partitions=8,
    )  # fmt: skip
    assert "3 COPY streams" in summary.describe() and db.checksum("t") == whole
    # SQLite: dates as ISO text, through SQLAlchemy
    summary = load(
        connect, table, mode="replace", source_url=source_sqlite, source_table="src",
        split_by="day", partitions=2,
    )  # fmt: skip
    assert summary.rows == 3000 and "2 COPY streams" in summary.describe()
    with pytest.raises(LoadRefusedError, match="not integers, dates or timestamps"):
        load(
            connect, table, mode="replace", source_url=source_pg, source_table="src",
            split_by="amount", partitions=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="split_by needs partitions"):
        load(
            connect, table, mode="replace", source_url=source_pg, source_table="src", split_by="id"
        )


# --- failures: the target untouched -----------------------------------------------------------


def _seven_rows(db: Any, connect: Callable[[], Any], source_pg: str) -> tuple[str, Any]:
    """A target holding 7 rows, and its checksum, to compare after a failed load."""
    table = _target(db)
    load(connect, table, mode="replace", source_url=source_pg, query="SELECT * FROM src LIMIT 7")
    return table, db.checksum("t")


def test_source_failing_midway_leaves_target_untouched(
    db: Any, connect: Callable[[], Any], source_pg: str, source_sqlite: str
) -> None:
    table, before = _seven_rows(db, connect, source_pg)
    # an error on row 150,001 of 200,000: some 10 MB went into staging before it
    with pytest.raises(SourceReadError, match="division by zero") as failed:
        load(
            connect,
            table,
            mode="replace",
            source_url=source_pg,
            query="SELECT g AS id, date '2026-01-01' AS day, repeat('x', 50) AS v,"
            " 1 / (g - 150001) AS amount FROM generate_series(1, 200000) g",
        )
    assert "unchanged" in str(failed.value)
    assert db.checksum("t") == before
    with pytest.raises(SourceReadError, match="integer overflow"):
        load(
            connect,
            table,
            mode="append",
            source_url=source_sqlite,
            query="WITH RECURSIVE g(id) AS (SELECT 8 UNION ALL SELECT id + 1 FROM g"
            " WHERE id < 200000) SELECT id, '2026-01-01' AS day, hex(zeroblob(25)) AS v,"
            " CASE WHEN id > 150000 THEN abs((id - 150001) - 9223372036854775807 - 1)"
            " ELSE 1 END AS amount FROM g",
        )
    assert db.checksum("t") == before
    # a value the target's column does not take: the source, the range, the row, the column
    # and the split key's value of that row, re-read from the source
    rejected = (
        r"day in \[2026-01-02, 2026-01-03\), row \d+ of its COPY stream, day = 2026-01-02,"
        r" column amount"
    )
    with pytest.raises(BadDataError, match=rejected):
        load(
            connect, table, mode="replace", source_url=source_pg, split_by="day", partitions=3,
            query="SELECT id, day, v, CASE WHEN id = 2998 THEN 'many' ELSE '1' END AS amount"
            " FROM src",
        )  # fmt: skip
    assert db.checksum("t") == before
    # nothing left behind: no staging, no ledger
    assert not db.run(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND relname LIKE '\\_pgbulk%%'",
        db.schema,
    )


def test_a_value_rejected_early_ends_the_source_copy_at_once(
    db: Any, connect: Callable[[], Any], source_pg: str
) -> None:
    """The target rejects row 10 of 1,000,000 (some 50 MB the source would still send, far
    more than the pipe between the two COPYs holds): the load fails at once with the row and
    column, and the source's COPY is ended (cancelled, its pipe closed), not left writing
    into a pipe nobody reads."""
    table, before = _seven_rows(db, connect, source_pg)
    started = time.monotonic()
    with pytest.raises(BadDataError, match=r"row 10 of its COPY stream.*column amount"):
        load(
            connect, table, mode="replace", source_url=source_pg,
            query="SELECT g AS id, date '2026-01-01' AS day, repeat('x', 40) AS v,"
            " CASE WHEN g = 10 THEN 'many' ELSE '1' END AS amount"
            " FROM generate_series(1, 1000000) g",
        )  # fmt: skip
    assert time.monotonic() - started < 30
    assert db.checksum("t") == before
    assert _source_sessions(db, source_pg) == 0  # its session closed


def test_a_string_holding_nul_names_its_row(
    db: Any, connect: Callable[[], Any], source_sqlite: str
) -> None:
    """A SQLite string holding NUL, which no PostgreSQL text takes: refused by the driver
    (psycopg 3's row writer) or by the server (psycopg2's text), either way as bad data that
    names the source's row; the target untouched."""
    table = _target(db)
    with pytest.raises(BadDataError, match=r"row 3 of its COPY stream") as failed:
        load(connect, table, mode="replace", source_url=source_sqlite,
             query="SELECT id, day, CASE WHEN id = 3 THEN 'a' || char(0) || 'b' ELSE v END AS v,"
             " amount FROM src ORDER BY id")  # fmt: skip
    assert "nothing of this load reached" in str(failed.value).lower()
    if "NUL" in str(failed.value):  # refused by psycopg 3: the column and value are known
        assert failed.value.column == "v" and "column v" in str(failed.value)
    assert _rows(db) == []


def test_refused_before_anything_is_touched(
    db: Any, connect: Callable[[], Any], source_pg: str, source_sqlite: str
) -> None:
    table, before = _seven_rows(db, connect, source_pg)
    replace = functools.partial(load, connect, table, mode="replace")
    with pytest.raises(LoadRefusedError, match=r"\['nope'\] match no column.*SELECT x AS y"):
        replace(source_url=source_pg, query="SELECT id, day, v AS nope FROM src")
    with pytest.raises(LoadRefusedError, match=r"cannot be read: .*no_such_table"):
        replace(source_url=source_pg, query="SELECT * FROM no_such_table")
    with pytest.raises(LoadRefusedError, match=r"cannot be read: .*no such table"):
        replace(source_url=source_sqlite, source_table="no_such")
    with pytest.raises(TransientLoadError, match="cannot connect") as unreachable:
        replace(source_url="postgresql://someone:s3cret@127.0.0.1:1/nowhere", query="SELECT 1")
    assert "s3cret" not in str(unreachable.value)
    with pytest.raises(ValueError, match="either source"):
        replace(source="/tmp/x.csv", source_url=source_pg, query="SELECT 1")
    with pytest.raises(ValueError, match="query or source_table"):
        replace(source_url=source_pg)
    assert db.checksum("t") == before


# --- the command line ---------------------------------------------------------------------------


def test_cli_loads_from_a_database(
    db: Any, pg_dsn: str, source_pg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = _target(db)
    status = cli.main(
        [
            "-q",
            "load",
            "--conn",
            pg_dsn,
            "--table",
            table,
            "--mode",
            "replace",
            "--source-url",
            source_pg,
            "--query",
            "SELECT * FROM src WHERE day = '2026-01-01'",
        ]
    )
    assert status == 0, capsys.readouterr().err
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("t"))) == 1000
    status = cli.main(["load", "--conn", pg_dsn, "--table", table, "--mode", "replace"])
    assert status == 2
    assert "source must name at least one file" in capsys.readouterr().err


# --- under Airflow: the connection id travels, the URL is resolved in each task ----------------


DAG_FILE = """
from airflow.sdk import DAG

from airflow_pg_bulk.task_group import pg_bulk_load

with DAG("pg_bulk_db_source_test", schedule=None, params={"day": "2026-01-02"}) as dag:
    pg_bulk_load(
        group_id="load",
        table=%r,
        postgres_conn_id="pg_bulk_target",
        source_conn_id="pg_bulk_source",
        query="SELECT * FROM src WHERE day = '{{ params.day }}'",
        mode="replace",
    )
"""


def test_task_group_loads_from_a_postgres_connection(
    airflow_db: str, db: Any, source_pg: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from airflow_pg_bulk.demo.connection import airflow_connection_json

    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_TARGET", airflow_connection_json(db.dsn))
    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_SOURCE", airflow_connection_json(source_pg))
    table = _target(db)
    (tmp_path / "db_source_dag.py").write_text(DAG_FILE % table)
    dagbag = DagBag(dag_folder=str(tmp_path))
    assert dagbag.import_errors == {}
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(dagbag, "pg-bulk-test-dags", None)  # dag.test() runs serialized DAGs only
    run = dagbag.get_dag("pg_bulk_db_source_test").test()
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "success", states
    assert {day for _, day, _ in _rows(db)} == {"2026-01-02"}
    assert len(_rows(db)) == 1000
    # the plan in XCom names the connection, not its URL
    with create_session() as session:
        plans = [
            str(x.value)
            for x in session.query(XComModel).filter(
                XComModel.run_id == run.run_id, XComModel.key == "plan"
            )
        ]
    assert plans and all("pg_bulk_source" in p and "postgresql://" not in p for p in plans)


@contextlib.contextmanager
def _prepared_from_a_copy_of_src(
    db: Any, connect: Callable[[], Any], source_pg: str, name: str, split_by: str
) -> Iterator[tuple[Any, Any]]:
    """A copy of ``src`` on the source, table ``name``, and a replace of ``t`` from it
    prepared with ``split_by`` in 3 ranges: (plan, the prepare's connection); cleaned up."""
    from airflow_pg_bulk import steps
    from airflow_pg_bulk.naming import new_load_id
    from airflow_pg_bulk.plan import request_from_options

    with psycopg.connect(source_pg, autocommit=True) as src:
        src.execute(sql.SQL("CREATE TABLE {} AS SELECT * FROM src").format(sql.Identifier(name)))
    request = request_from_options(
        _target(db), (), mode="replace", source_url=source_pg, source_table=name,
        split_by=split_by, partitions=3,
    )  # fmt: skip
    load_id = new_load_id()
    conn = connect()
    try:
        yield steps.prepare(conn, request, load_id), conn
    finally:
        steps.cleanup(conn, db.schema, load_id)
        conn.close()
        with psycopg.connect(source_pg, autocommit=True) as src:
            src.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))


def _grow_and_shrink(source_pg: str, name: str) -> None:
    """Rows written and deleted on the source table ``name`` (a copy of ``src``)."""
    with psycopg.connect(source_pg, autocommit=True) as src:
        table = sql.Identifier(name)
        src.execute(
            sql.SQL("INSERT INTO {} SELECT id + 3000, day, v, amount FROM src").format(table)
        )
        src.execute(sql.SQL("DELETE FROM {} WHERE id <= 100").format(table))


def test_split_ranges_in_process_read_one_snapshot(
    db: Any, connect: Callable[[], Any], source_pg: str
) -> None:
    """Prepare exports a snapshot of the PostgreSQL source and holds it; every range read in
    the same process imports it: rows written and deleted on the source after prepare are
    not seen by any range (the last range, open-ended, would otherwise take the new ones)."""
    from airflow_pg_bulk.runner import run_plan

    with _prepared_from_a_copy_of_src(db, connect, source_pg, "growing", "id") as (plan, _):
        assert plan.database is not None and plan.database.snapshot
        _grow_and_shrink(source_pg, "growing")
        run_plan(connect, plan, 3)
        staged = db.run(
            sql.SQL("SELECT count(*), min(id), max(id) FROM {}").format(
                db.ident(plan.staging_table)
            )
        )
        assert staged == [(3000, 1, 3000)]


def test_preview_of_a_database_source_names_the_query_and_the_partition_it_replaces(
    db: Any, connect: Callable[[], Any], source_pg: str
) -> None:
    """The preview reads the source through the same source object as prepare: the query's
    rows routed to the one table partition they would replace; nothing created or changed."""
    from airflow_pg_bulk.runner import preview

    db.run(
        sql.SQL("CREATE TABLE {} (id int, day date NOT NULL, v text, amount numeric)"
                " PARTITION BY RANGE (day)").format(db.ident("p"))
    )  # fmt: skip
    for n in range(1, 4):
        db.run(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"p{n}"), db.ident("p"),
                sql.Literal(f"2026-01-0{n}"), sql.Literal(f"2026-01-0{n + 1}"),
            )
        )  # fmt: skip
    load(connect, db.table("p"), mode="replace", source_url=source_pg, source_table="src")
    catalog = "SELECT relname, relfilenode FROM pg_class WHERE relnamespace = %s::regnamespace"
    before = sorted(db.run(catalog, db.schema))

    shown = preview(
        connect, db.table("p"), mode="replace_partitions", source_url=source_pg,
        query="SELECT * FROM src WHERE day = '2026-01-02'",
    )  # fmt: skip

    assert shown.receiving == (f"{db.schema}.p2",)
    text = shown.describe()
    assert "the query \"SELECT * FROM src WHERE day = '2026-01-02'\"" in text
    assert "0 files" not in text and f"{db.schema}.p2" in text
    assert sorted(db.run(catalog, db.schema)) == before
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("p"))) == 3000


# --- the example DAG: each night, yesterday's rows into that day's table partition -------------

NIGHTS = ["2026-11-19", "2026-11-20", "2026-11-21", "2026-11-22"]


def _orders_of_day(conn: Any, table: sql.Composable, day: str) -> list[tuple[Any, ...]]:
    """The rows of ``table`` whose ``updated_at`` falls on ``day`` (UTC), in id order."""
    return conn.execute(
        sql.SQL(
            "SELECT id, customer, amount, updated_at FROM {} WHERE updated_at >= %s::timestamptz"
            " AND updated_at < %s::timestamptz + interval '1 day' ORDER BY id"
        ).format(table),
        (f"{day} 00:00+00", f"{day} 00:00+00"),
    ).fetchall()


@pytest.mark.dag_run
def test_nightly_example_loads_each_day_into_its_partition_only(
    airflow_db: str, db: Any, source_pg: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dags_examples/nightly_from_postgres.py run on the nights of 21 and 22 November (the
    data intervals of 20 and 21 November): each run's
    partition holds exactly the source rows updated that day (UTC; the bounds included and
    excluded as the data interval says, a row written in another time zone on its UTC day),
    and the other days' partitions keep their rows and their files."""
    import pendulum
    from airflow.dag_processing.dagbag import DagBag

    from airflow_pg_bulk.demo.connection import airflow_connection_json

    examples = Path(__file__).resolve().parent.parent / "dags_examples"
    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_EXAMPLE", airflow_connection_json(db.dsn))
    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_EXAMPLE_OLTP", airflow_connection_json(source_pg))
    source = sql.Identifier("public", "orders")
    with psycopg.connect(source_pg, autocommit=True) as src:
        src.execute("DROP TABLE IF EXISTS orders")
        src.execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
            " amount numeric(12,2), updated_at timestamptz NOT NULL)"
        )
        # one row every 7 minutes from 19 November 00:00 UTC to 22 November 21:59
        src.execute(
            "INSERT INTO orders SELECT g, 'customer ' || g % 17, g * 1.25,"
            " timestamptz '2026-11-19 00:00+00' + g * interval '7 minutes'"
            " FROM generate_series(1, 700) g"
        )
        src.execute(
            "INSERT INTO orders VALUES"
            " (1001, 'first instant', 1, '2026-11-20 00:00:00+00'),"
            " (1002, 'last instant', 2, '2026-11-20 23:59:59.999999+00'),"
            " (1003, 'next day', 3, '2026-11-21 00:00:00+00'),"
            " (1004, 'written in Paris', 4, '2026-11-21 00:30:00+01')"
        )
    warehouse = db.ident("orders_daily")
    db.run(
        sql.SQL(
            "CREATE TABLE {} (id bigint, customer text, amount numeric(12,2),"
            " updated_at timestamptz, day date NOT NULL) PARTITION BY RANGE (day)"
        ).format(warehouse)
    )
    for day in NIGHTS:
        part = db.ident(f"orders_{day.replace('-', '')}")
        db.run(
            sql.SQL(
                "CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({}::date + 1)"
            ).format(part, warehouse, sql.Literal(day), sql.Literal(day))
        )
        db.run(
            sql.SQL(
                "INSERT INTO {} SELECT -n, 'old', 0, %s::timestamptz, %s"
                " FROM generate_series(1, 5) n"
            ).format(warehouse),
            f"{day} 12:00+00",
            day,
        )
    old = {day: _orders_of_day(db.conn, warehouse, day) for day in NIGHTS}
    filenodes = {
        day: db.scalar(
            "SELECT pg_relation_filenode(%s::regclass)",
            f'"{db.schema}".orders_{day.replace("-", "")}',
        )
        for day in NIGHTS
    }

    dag = DagBag(dag_folder=str(examples)).get_dag("example_pg_bulk_nightly_from_postgres")
    conf = {"table": db.table("orders_daily"), "source_table": "public.orders"}
    for day in ("2026-11-20", "2026-11-21"):
        # a run triggered by hand (as `airflow dags test <dag> <date>` does) covers the last
        # whole day before its date: the night of the 21st loads the 20th
        night = pendulum.parse(f"{day}T00:00:00Z").add(days=1)
        run = dag.test(run_after=night, logical_date=night, run_conf=conf)
        states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
        assert run.state == "success", states
        assert run.data_interval_start == pendulum.parse(f"{day}T00:00:00Z")
        assert sum(1 for task, _ in states if task == "load_day.copy") == 2  # split by id

    with psycopg.connect(source_pg) as src:
        expected = {day: _orders_of_day(src, source, day) for day in NIGHTS}
    assert [r[0] for r in expected["2026-11-20"] if r[0] > 1000] == [1001, 1002, 1004]
    assert [r[0] for r in expected["2026-11-21"] if r[0] > 1000] == [1003]
    for day in ("2026-11-20", "2026-11-21"):
        loaded = _orders_of_day(db.conn, warehouse, day)
        assert loaded == expected[day] and len(loaded) > 200
        days = db.run(
            sql.SQL("SELECT DISTINCT day::text FROM {}").format(
                db.ident(f"orders_{day.replace('-', '')}")
            )
        )
        assert days == [(day,)]
    for day in ("2026-11-19", "2026-11-22"):
        assert _orders_of_day(db.conn, warehouse, day) == old[day]
        assert (
            db.scalar(
                "SELECT pg_relation_filenode(%s::regclass)",
                f'"{db.schema}".orders_{day.replace("-", "")}',
            )
            == filenodes[day]
        )


@pytest.mark.dag_run
def test_nightly_sqlite_example_merges_each_days_readings(
    airflow_db: str, db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dags_examples/nightly_from_sqlite.py through a ``sqlite`` Airflow connection (its DB-API
    hook's URL), run on the nights of 21 and 22 November: each run upserts exactly the
    readings recorded on the day before (the day's first instant in, the next day's out); a
    night run again takes a reading re-sent with a new value in place of the old one; two
    COPY tasks each night (split by id)."""
    import json

    import pendulum
    from airflow.dag_processing.dagbag import DagBag

    from airflow_pg_bulk.demo.connection import airflow_connection_json

    path = tmp_path / "device.db"
    readings = [  # one every 10 minutes from 19 November 00:00 to 22 November 23:50, UTC
        (n, f"sensor {n % 5}", n / 4, f"2026-11-{19 + n // 144} {n % 144 // 6:02d}:{n % 6}0:00")
        for n in range(4 * 144)
    ]
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE readings (id integer PRIMARY KEY, sensor text NOT NULL,"
                     " reading real, recorded_at text NOT NULL)")  # fmt: skip
        conn.executemany("INSERT INTO readings VALUES (?, ?, ?, ?)", readings)
    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_EXAMPLE", airflow_connection_json(db.dsn))
    monkeypatch.setenv(
        "AIRFLOW_CONN_PG_BULK_EXAMPLE_SQLITE",
        json.dumps({"conn_type": "sqlite", "host": str(path)}),
    )
    db.run(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, sensor text NOT NULL,"
                   " reading double precision, recorded_at timestamp)")
           .format(db.ident("readings")))  # fmt: skip
    examples = Path(__file__).resolve().parent.parent / "dags_examples"
    dag = DagBag(dag_folder=str(examples)).get_dag("example_pg_bulk_nightly_from_sqlite")
    conf = {"table": db.table("readings"), "source_table": "readings"}

    def night(day: str) -> None:
        at = pendulum.parse(f"{day}T00:00:00Z").add(days=1)
        run = dag.test(run_after=at, logical_date=at, run_conf=conf)
        states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
        assert run.state == "success", states
        assert sum(1 for task, _ in states if task == "merge_day.copy") == 2

    def loaded() -> list[tuple[Any, ...]]:
        return db.run(sql.SQL("SELECT id, sensor, reading, recorded_at::text FROM {}"
                              " ORDER BY id").format(db.ident("readings")))  # fmt: skip

    night("2026-11-20")
    assert loaded() == [r for r in readings if r[3].startswith("2026-11-20")]
    assert len(loaded()) == 144
    with sqlite3.connect(path) as conn:  # the device re-sends one reading of the 20th
        conn.execute("UPDATE readings SET reading = -1 WHERE id = 150")
    night("2026-11-20")  # the night run again (a retry, a cleared run)
    night("2026-11-21")
    expected = [
        (i, s, -1.0 if i == 150 else v, t)
        for i, s, v, t in readings
        if t.startswith(("2026-11-20", "2026-11-21"))
    ]
    assert loaded() == expected and len(expected) == 288


def test_prepare_log_line_names_what_a_database_source_reads(
    db: Any, connect: Callable[[], Any], source_pg: str, caplog: pytest.LogCaptureFixture
) -> None:
    """prepare's line says the query (or table) and where, the password masked, in place of
    "0 files, 0.0 MB"; the preview describes it in the same words."""
    from airflow_pg_bulk.runner import preview

    table = _target(db)
    # the test server trusts the connection, so the password is never checked: only shown
    parts = urlsplit(source_pg)
    where = parts.netloc.rsplit("@", 1)[-1]
    with_password = parts._replace(netloc=f"{parts.username}:s3cret@{where}").geturl()
    assert with_password != source_pg
    with caplog.at_level("INFO", logger="airflow_pg_bulk"):
        load(connect, table, mode="replace", source_url=with_password, source_table="src",
             split_by="id", partitions=2)  # fmt: skip
        load(connect, table, mode="append", source_url=with_password,
             query="SELECT * FROM src WHERE id < 0")  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if ": prepared into " in r.getMessage()]
    assert len(lines) == 2
    assert all("s3cret" not in m and "files" not in m and " MB" not in m for m in lines)
    # the URL as SQLAlchemy renders it, password masked (a socket directory in the query
    # string comes percent-encoded)
    masked = make_url(with_password).render_as_string(hide_password=True)
    assert f"{parts.username}:***@" in masked
    assert f"reading the table src on {masked}, split by id in 2 COPY streams" in lines[0]
    assert f"reading the query 'SELECT * FROM src WHERE id < 0' on {masked} in" in lines[1]
    shown = preview(connect, table, mode="replace", source_url=with_password, source_table="src")
    assert f"the table src on {masked}" in shown.describe()
    assert "s3cret" not in shown.describe()


# --- create_target: a missing target made from a PostgreSQL source's exact types ----------------


def test_create_target_from_a_postgres_source_takes_its_exact_types(
    db: Any, connect: Callable[[], Any], source_pg: str
) -> None:
    """numeric(12,3), text[], jsonb, timestamptz as the source has them; an enum as text (its
    type is not on the target); NOT NULL and the primary key for source_table only; rows
    loaded; an existing target not altered (the option does nothing then)."""
    with psycopg.connect(source_pg, autocommit=True) as src:
        src.execute("DROP TABLE IF EXISTS typed; DROP TYPE IF EXISTS mood")
        src.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        src.execute(
            "CREATE TABLE typed (a int, b text, amount numeric(12,3) NOT NULL, tags text[],"
            " doc jsonb, at timestamptz, feeling mood, moods mood[], note varchar(20) DEFAULT 'x',"
            " PRIMARY KEY (b, a))"
        )
        src.execute(
            "INSERT INTO typed VALUES (1, 'one', 12.5, '{x,\"y z\"}', '{\"k\": [1, 2]}',"
            " '2026-11-20 10:00+02', 'happy', '{sad,ok}', 'n'),"
            " (2, 'two', 0.001, NULL, NULL, NULL, NULL, NULL, NULL)"
        )
    columns = (
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    )
    primary_key = (
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype = 'p'"
    )
    types = [
        ("a", "integer"), ("b", "text"), ("amount", "numeric(12,3)"), ("tags", "text[]"),
        ("doc", "jsonb"), ("at", "timestamp with time zone"), ("feeling", "text"),
        ("moods", "text[]"), ("note", "character varying(20)"),
    ]  # fmt: skip
    try:
        # source_table: the types, NOT NULL and the primary key (in key order); no default
        table = db.table("from_table")
        summary = load(connect, table, mode="replace", source_url=source_pg,
                       source_table="typed", create_target=True)  # fmt: skip
        assert summary.rows == 2
        got = db.run(columns, table)
        assert [(n, t) for n, t, _ in got] == types
        assert [n for n, _, nn in got if nn] == ["a", "b", "amount"]  # the key's, and NOT NULL
        assert db.run(primary_key, table) == [("PRIMARY KEY (b, a)",)]
        assert db.scalar("SELECT count(*) FROM pg_attrdef WHERE adrelid = %s::regclass", table) == 0
        assert db.run(
            sql.SQL("SELECT amount::text, tags, doc::text, at, feeling, moods FROM {} WHERE a = 1")
            .format(db.ident("from_table"))
        ) == [
            ("12.500", ["x", "y z"], '{"k": [1, 2]}',
             db.scalar("SELECT timestamptz '2026-11-20 08:00+00'"), "happy", ["sad", "ok"]),
        ]  # fmt: skip
        # a query: the result columns' types only (nothing of the table's constraints)
        query_table = db.table("from_query")
        load(connect, query_table, mode="append", source_url=source_pg, create_target=True,
             query="SELECT amount * 2 AS doubled, amount, at FROM typed")  # fmt: skip
        assert db.run(columns, query_table) == [
            ("doubled", "numeric", False), ("amount", "numeric(12,3)", False),
            ("at", "timestamp with time zone", False),
        ]  # fmt: skip
        assert db.run(primary_key, query_table) == []
        # an existing target is not altered: the same load appends to it, as without the option
        before = db.run(columns, query_table)
        load(connect, query_table, mode="append", source_url=source_pg, create_target=True,
             query="SELECT amount FROM typed")  # fmt: skip
        assert db.run(columns, query_table) == before
        assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("from_query"))) == 4
    finally:
        with psycopg.connect(source_pg, autocommit=True) as src:
            src.execute("DROP TABLE IF EXISTS typed; DROP TYPE IF EXISTS mood")


def test_create_target_refused_for_files_and_for_a_query_not_on_postgres(
    db: Any, connect: Callable[[], Any], source_sqlite: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="create_target applies to a database source"):
        load(connect, db.table("x"), str(tmp_path / "a.csv"), mode="replace", create_target=True)
    with pytest.raises(LoadRefusedError, match="from a PostgreSQL source only"):
        load(connect, db.table("x"), mode="replace", source_url=source_sqlite,
             query="SELECT * FROM src", create_target=True)  # fmt: skip
    assert db.scalar("SELECT to_regclass(%s)", db.table("x")) is None


def test_create_target_from_a_sqlite_table_maps_its_types_through_sqlalchemy(
    db: Any, connect: Callable[[], Any], tmp_path: Path
) -> None:
    """SQLite's declared types, made generic and rendered for PostgreSQL by SQLAlchemy; its
    NOT NULL and primary key carried over; rows loaded into the created table."""
    path = tmp_path / "typed.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE typed (id integer PRIMARY KEY, name text NOT NULL, price numeric(10,2),"
            " ratio real, code varchar(20), data blob, at datetime, day date, ok boolean)"
        )
        conn.execute(
            "INSERT INTO typed VALUES (1, 'one', 12.5, 0.25, 'A1', x'00ff', '2026-11-20 10:00:00',"
            " '2026-11-20', 1)"
        )
    table = db.table("from_sqlite")
    summary = load(connect, table, mode="replace", source_url=f"sqlite:///{path}",
                   source_table="typed", create_target=True)  # fmt: skip
    assert summary.rows == 1
    got = db.run(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
        table,
    )
    assert got == [
        ("id", "integer", True), ("name", "text", True), ("price", "numeric(10,2)", False),
        ("ratio", "double precision", False), ("code", "character varying(20)", False),
        ("data", "bytea", False), ("at", "timestamp without time zone", False),
        ("day", "date", False), ("ok", "boolean", False),
    ]  # fmt: skip
    assert (
        db.scalar(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'p'",
            table,
        )
        == "PRIMARY KEY (id)"
    )
    assert db.run(
        sql.SQL("SELECT name, price::text, data, at::text, ok FROM {}").format(
            db.ident("from_sqlite")
        )
    ) == [("one", "12.50", b"\x00\xff", "2026-11-20 10:00:00", True)]


# --- a skewed split key: ranges cut at its quantiles -----------------------------------------

SKEWED_ROWS = 10_000


@contextlib.contextmanager
def _skewed_source(kind: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, dict]]:
    """A source (its URL) with table ``skewed`` (id, k): 9,000 keys 1..9,000, then 1,000
    spread from 10,000 to 1,009,000 (by min and max, one range of four would hold 9,000+
    rows); ``source_table`` or a ``query`` over it."""
    import sqlalchemy
    from mariadb import database_on

    if kind == "mariadb":
        context: Any = database_on(request.getfixturevalue("mariadb"))
    else:
        context = contextlib.nullcontext(
            request.getfixturevalue("source_pg" if kind.startswith("postgres") else "source_sqlite")
        )
    with context as url:
        engine = sqlalchemy.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP TABLE IF EXISTS skewed")
                conn.exec_driver_sql("CREATE TABLE skewed (id int PRIMARY KEY, k int)")
                conn.execute(
                    sqlalchemy.text("INSERT INTO skewed VALUES (:id, :k)"),
                    [{"id": i, "k": i if i <= 9000 else 10_000 + (i - 9000) * 1000}
                     for i in range(1, SKEWED_ROWS + 1)],
                )  # fmt: skip
                if kind == "postgres analyzed table":
                    conn.exec_driver_sql("ANALYZE skewed")
                    # the histogram covers every row: the ranges are cut at its bounds
                    assert conn.exec_driver_sql(
                        "SELECT most_common_vals IS NULL FROM pg_stats WHERE tablename ="
                        " 'skewed' AND attname = 'k' AND histogram_bounds IS NOT NULL"
                    ).all() == [(True,)]
            if kind in ("postgres analyzed table", "sqlite"):
                yield url, {"source_table": "skewed"}
            else:
                yield url, {"query": "SELECT id, k FROM skewed"}
        finally:
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP TABLE skewed")
            engine.dispose()


@pytest.mark.parametrize("kind", ["postgres query", "postgres analyzed table", "sqlite", "mariadb"])
def test_a_skewed_split_key_gives_ranges_of_even_row_counts(
    kind: str,
    request: pytest.FixtureRequest,
    db: Any,
    connect: Callable[[], Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ranges cut at the key's quantiles (a PostgreSQL table: its ANALYZE histogram; else
    ntile): four ranges of 2,500 rows give or take a fifth, where
    ranges of equal width from min to max would put 9,242 rows in the first and 250 or so in
    each other; every row arrives exactly once."""
    db.run(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, k int)").format(
        db.ident("s")))  # fmt: skip
    with (
        _skewed_source(kind, request) as (url, what),
        caplog.at_level("INFO", logger="airflow_pg_bulk"),
    ):
        summary = load(connect, db.table("s"), mode="replace", source_url=url,
                       split_by="k", partitions=4, **what)  # fmt: skip
    counts = [
        int(m.group(1))
        for r in caplog.records
        if (m := re.search(r": read (\d+) rows .*, k (in \[|< |>= )", r.getMessage()))
    ]
    assert summary.rows == SKEWED_ROWS and sum(counts) == SKEWED_ROWS
    assert len(counts) == 4 and max(counts) <= 1.2 * min(counts), counts
    assert db.run(
        sql.SQL("SELECT count(*), count(DISTINCT id), sum(id) FROM {}").format(db.ident("s"))
    ) == [(SKEWED_ROWS, SKEWED_ROWS, SKEWED_ROWS * (SKEWED_ROWS + 1) // 2)]


# --- PostgreSQL source: bytes in the binary format where the types match ------------------------

#: a column of each kind whose binary form differs from its text the most: floats (their
#: shortest exact text), numerics, times, arrays, JSON, bytes; and NULLs in each
_TYPED = (
    "(1, 0.1::float8, 'NaN'::float8, '-0'::float8, 1e308::float8, 3.4e38::float4,"
    " 123456789012345678901234567890.123456789::numeric, 'NaN'::numeric,"
    " timestamptz '2026-03-29 01:30:00+01', timestamp '1999-12-31 23:59:59.999999',"
    " date 'infinity', interval '1 year 2 mons -3 days 04:05:06.7', true,"
    " '{1,NULL,3}'::int[], '{\"a\": [1, 2.5, null]}'::jsonb, '{\"b\": 1}'::json,"
    " '\\x00ff'::bytea, 'a1a2a3a4-b1b2-c1c2-d1d2-d3d4d5d6d7d8'::uuid, 'x\ty'::text),"
    " (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, NULL)"
)
_TYPED_COLUMNS = (
    "id int, f float8, fnan float8, fzero float8, fbig float8, r float4, n numeric,"
    " nnan numeric, tz timestamptz, ts timestamp, d date, i interval, b boolean, a int[],"
    " jb jsonb, j json, by bytea, u uuid, t text"
)


def test_postgres_source_moves_binary_when_every_type_matches(
    db: Any, connect: Callable[[], Any], source_pg: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Columns of exactly the target's types move in the binary format (the COPY step's line
    says so) and every value comes back as the source holds it, to the last bit of a float;
    a column whose type differs (int into bigint) sends the range as text instead."""
    db.run(sql.SQL(f"CREATE TABLE {{}} ({_TYPED_COLUMNS})").format(db.ident("typed")))
    names = ", ".join(c.split()[0] for c in _TYPED_COLUMNS.split(", "))
    query = f"SELECT * FROM (VALUES {_TYPED}) AS v ({names})"
    with caplog.at_level("INFO", logger="airflow_pg_bulk"):
        load(connect, db.table("typed"), mode="replace", source_url=source_pg, query=query)
    read = [r.getMessage() for r in caplog.records if " rows (" in r.getMessage()]
    assert read and all("by binary COPY TO STDOUT" in m for m in read), read
    as_text = sql.SQL("SELECT v::text FROM (SELECT * FROM {} ORDER BY id) AS v").format(
        db.ident("typed")
    )
    with psycopg.connect(source_pg) as src:
        expected = [r[0] for r in src.execute(f"SELECT v::text FROM ({query}) AS v ORDER BY 1")]
    assert [r[0] for r in db.run(as_text)] == expected
    # int into bigint: not the same type, so text (and the same values)
    db.run(sql.SQL("CREATE TABLE {} (id bigint, v text)").format(db.ident("wider")))
    caplog.clear()
    with caplog.at_level("INFO", logger="airflow_pg_bulk"):
        load(connect, db.table("wider"), mode="replace", source_url=source_pg,
             query="SELECT id, v FROM src")  # fmt: skip
    read = [r.getMessage() for r in caplog.records if " rows (" in r.getMessage()]
    assert read and all("binary" not in m and "by COPY TO STDOUT" in m for m in read), read
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("wider"))) == 3000


def test_a_value_refused_in_binary_is_named_as_in_text(
    db: Any, connect: Callable[[], Any], source_pg: str
) -> None:
    """A NULL for a NOT NULL column of the same type: the binary COPY fails, its rows are
    undone, and the range is read again as text, whose error names the row and the column;
    the target is untouched."""
    table = _target(db)
    before = db.checksum("t")
    refused = r"row 5 of its COPY stream.*column \"day\".*value .5\\t"  # (text's line)
    with pytest.raises(BadDataError, match=refused):
        load(connect, table, mode="replace", source_url=source_pg,
             query="SELECT id, CASE WHEN id = 5 THEN NULL ELSE day END AS day, v, amount"
             " FROM src ORDER BY id")  # fmt: skip
    assert db.checksum("t") == before


# --- a PostgreSQL table split by ranges of its blocks (split_by="ctid") ---------------------------


def test_a_table_split_by_blocks_reads_every_row_once_in_one_snapshot(
    db: Any, connect: Callable[[], Any], source_pg: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``split_by="ctid"``: the table's blocks cut into ranges of equal block counts, each
    read by a TID range scan; every row loaded once, in one exported snapshot in-process
    (rows written and deleted after prepare seen by no range, though the new ones lie in
    blocks past the last cut); the ranges logged by block."""
    from airflow_pg_bulk.runner import run_plan

    with _prepared_from_a_copy_of_src(db, connect, source_pg, "blocky", "ctid") as (plan, _):
        with psycopg.connect(source_pg) as src:
            blocks = src.execute(
                "SELECT pg_relation_size('blocky') / current_setting('block_size')::int"
            ).fetchone()[0]
            third, two_thirds = blocks // 3, 2 * blocks // 3
            shown = src.execute(  # each range reads its blocks alone
                sql.SQL("EXPLAIN {}").format(source_sql.block_range("blocky", third, two_thirds))
            ).fetchall()
        assert third >= 1 and "Tid Range Scan" in shown[0][0], shown
        assert plan.database is not None and plan.database.by_blocks
        ranges = [p.pieces[0].key_range[:2] for p in plan.partitions]
        assert ranges == [(None, third), (third, two_thirds), (two_thirds, None)]
        _grow_and_shrink(source_pg, "blocky")
        with caplog.at_level("INFO", logger="airflow_pg_bulk"):
            run_plan(connect, plan, 3)
        staged = db.run(
            sql.SQL("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {}").format(
                db.ident(plan.staging_table)
            )
        )
        assert staged == [(3000, 3000, 1, 3000)]
        read = sorted(r.getMessage() for r in caplog.records if " rows (" in r.getMessage())
        assert len(read) == 3 and all(", blocks " in m for m in read), read
    # the whole load, and its rows
    load(connect, db.table("t"), mode="replace", source_url=source_pg, source_table="src",
         split_by="ctid", partitions=2)  # fmt: skip
    assert db.run(sql.SQL("SELECT count(*), sum(id) FROM {}").format(db.ident("t"))) == [
        (3000, 3000 * 3001 // 2)
    ]


def test_split_by_blocks_is_refused_for_a_query_and_for_another_database(
    db: Any, connect: Callable[[], Any], source_pg: str, source_sqlite: str
) -> None:
    table = _target(db)
    before = db.checksum("t")
    with pytest.raises(LoadRefusedError, match=r"split_by='ctid'.*needs source_table"):
        load(connect, table, mode="replace", source_url=source_pg, query="SELECT * FROM src",
             split_by="ctid", partitions=2)  # fmt: skip
    with pytest.raises(LoadRefusedError, match=r"split_by='ctid'.*PostgreSQL source"):
        load(connect, table, mode="replace", source_url=source_sqlite, source_table="src",
             split_by="ctid", partitions=2)  # fmt: skip
    assert db.checksum("t") == before


def test_a_split_load_refused_after_prepare_read_the_source_releases_its_snapshot(
    db: Any, connect: Callable[[], Any], source_pg: str
) -> None:
    """prepare exports the source's snapshot for the ranges, then refuses the load (an upsert
    key that is not unique): the session holding the snapshot ends with the load, not with
    the process (a held snapshot keeps vacuum from cleaning behind it on the source); so
    does the one of a load whose ranges were all read, and the one of a preview."""
    from airflow_pg_bulk.runner import preview

    table = _target(db)
    with pytest.raises(LoadRefusedError, match=r"upsert key \['v'\] .* is not unique"):
        load(connect, table, mode="upsert", key=["v"], source_url=source_pg,
             source_table="src", split_by="id", partitions=3)  # fmt: skip
    assert _source_sessions(db, source_pg) == 0
    load(connect, table, mode="replace", source_url=source_pg, source_table="src",
         split_by="id", partitions=3)  # fmt: skip
    assert _source_sessions(db, source_pg) == 0
    preview(connect, table, mode="replace", source_url=source_pg, source_table="src",
            split_by="id", partitions=3)  # fmt: skip
    assert _source_sessions(db, source_pg) == 0


def _source_sessions(db: Any, source_pg: str) -> int:
    """The load's sessions on the source database, once those just closed have left."""
    holding = 0
    for _ in range(50):  # (a backend leaves pg_stat_activity a moment after its client)
        holding = db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
            " 'airflow-pg-bulk source' AND datname = %s",
            urlsplit(source_pg).path.lstrip("/"),
        )
        if not holding:
            break
        time.sleep(0.1)
    return holding


# --- the rows path's Arrow reader (ADBC) for a STRICT SQLite table -------------------------------


def test_a_strict_sqlite_table_is_read_by_adbc_with_the_rows_paths_values(
    db: Any,
    connect: Callable[[], Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A STRICT table (each column of one type) read by ADBC and encoded by Arrow loads bit for
    bit the rows the DB-API path loads: doubles to the last bit (infinity, the smallest
    subnormal), 64-bit integers, text needing every escape, bytes, NULLs, in more rows than
    one record batch."""
    pytest.importorskip("adbc_driver_sqlite")
    path = tmp_path / "strict.db"
    floats = [0.1 + 0.2, 1e300, -5e-324, float("-inf"), 123456789.123456789, -0.0]
    texts = [v for v in AWKWARD if v is not None]
    rows = [
        (i, floats[i % 6], (2**63 - 1) if i % 7 == 0 else -(2**63) if i % 11 == 0 else -i,
         texts[i % len(texts)] if i % 5 else None,
         texts[i % len(texts)].encode() if i % 3 else None)
        for i in range(70_000)
    ]  # fmt: skip
    _sqlite_table(
        path, "CREATE TABLE typed (id integer, f real, n int, s text, b blob) STRICT", rows
    )
    by_arrow, by_rows = load_both_ways(
        db, connect, monkeypatch, caplog, "adbc_sqlite",
        "CREATE TABLE {} (id int PRIMARY KEY, f float8, n bigint, s text, b bytea)",
        source_url=f"sqlite:///{path}", source_table="typed",
    )  # fmt: skip
    assert len(by_arrow) == 70_000 and by_arrow == by_rows
    got = db.run(sql.SQL("SELECT f, n, s, b FROM {} WHERE id < 12 ORDER BY id")
                 .format(db.ident("by_arrow")))  # fmt: skip
    assert [(f, n, s, None if b is None else bytes(b)) for f, n, s, b in got] == [
        r[1:] for r in rows[:12]
    ]


def test_a_strict_column_adbc_reads_as_another_type_falls_back_to_the_rows_path(
    db: Any,
    connect: Callable[[], Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ADBC types a column by its first rows: a TEXT column NULL in more rows than one batch
    is read as integers, and its first string fails the Arrow read midway; the rows it had
    sent are undone and the range is read again from a cursor, every row loaded once."""
    pytest.importorskip("adbc_driver_sqlite")
    path = tmp_path / "late.db"
    with sqlite3.connect(path) as lite:
        lite.execute("CREATE TABLE late (id integer PRIMARY KEY, s text) STRICT")
        lite.executemany(
            "INSERT INTO late VALUES (?, ?)",
            [(i, None if i < 100_000 else f"s{i}") for i in range(100_010)],
        )
    lite.close()
    db.run(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, s text)").format(db.ident("late")))
    with caplog.at_level(logging.INFO):
        summary = load(connect, db.table("late"), mode="replace",
                       source_url=f"sqlite:///{path}", source_table="late")  # fmt: skip
    assert "the Arrow reader adbc_sqlite failed" in caplog.text, caplog.text
    assert "by a server-side cursor" in caplog.text
    assert summary.rows == 100_010
    assert db.run(sql.SQL("SELECT count(*), count(s), min(s) FROM {}")
                  .format(db.ident("late"))) == [(100_010, 10, "s100000")]  # fmt: skip


def test_sqlite_sources_adbc_cannot_read_exactly_keep_the_rows_path(tmp_path: Path) -> None:
    """ADBC only for a STRICT table of INTEGER/REAL/TEXT/BLOB columns: a table that is not
    STRICT (any type in any column: ADBC would turn a REAL in a column it typed as text
    into ``1.250000e+00``), a STRICT table with an ANY column, a query, a view and an
    in-memory database are read from a cursor."""
    pytest.importorskip("adbc_driver_sqlite")
    path = tmp_path / "kinds.db"
    with sqlite3.connect(path) as lite:
        lite.execute("CREATE TABLE strict_t (id integer, f real, s text, b blob) STRICT")
        lite.execute("CREATE TABLE loose (id integer, f real)")
        lite.execute("CREATE TABLE any_t (id integer, m any) STRICT")
        lite.execute("CREATE VIEW strict_v AS SELECT * FROM strict_t")
    lite.close()
    url = hold(f"sqlite:///{path}")

    def chosen(**what: Any) -> str | None:
        return source_description(DatabaseSource(url, False, **what))[2]

    assert chosen(table="strict_t") == "adbc_sqlite"
    assert chosen(table="main.strict_t") == "adbc_sqlite"
    assert chosen(table="loose") is None
    assert chosen(table="any_t") is None
    assert chosen(table="strict_v") is None
    assert chosen(query="SELECT * FROM strict_t") is None
    memory = DatabaseSource(hold("sqlite://"), False, query="SELECT 1 AS a")
    assert source_description(memory)[2] is None


def test_a_strict_sqlite_table_read_by_adbc_streams_with_bounded_memory(
    db: Any, tmp_path: Path
) -> None:
    """ADBC's record batches are read as COPY takes them: a load of 1,500,000 rows of about
    110 bytes (some 165 MB) peaks at about the resident memory of one of 150,000 (each in a
    process of its own, its peak RSS from the kernel: Arrow's memory is not Python's, which
    tracemalloc sees)."""
    pytest.importorskip("adbc_driver_sqlite")
    db.run(sql.SQL("CREATE TABLE {} (id int, v text)").format(db.ident("big")))
    peaks = []
    for rows in (150_000, 1_500_000):
        path = tmp_path / f"big{rows}.db"
        with sqlite3.connect(path) as lite:
            lite.execute("CREATE TABLE big (id integer, v text) STRICT")
            lite.execute(
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?)"
                " INSERT INTO big SELECT i, printf('%.100c', 'x') FROM s",
                (rows,),
            )
        lite.close()
        url = f"sqlite:///{path}"
        assert source_description(DatabaseSource(hold(url), False, table="big"))[2] == "adbc_sqlite"
        script = (
            "import resource, sys\n"
            "from airflow_pg_bulk.db.driver import connect\n"
            "from airflow_pg_bulk.runner import load\n"
            "summary = load(lambda: connect(sys.argv[1]), sys.argv[2], mode='replace',"
            " source_url=sys.argv[3], source_table='big')\n"
            "print(summary.rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, db.dsn, db.table("big"), url],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        loaded, peak_kb = done.stdout.split()[-2:]
        assert int(loaded) == rows
        peaks.append(int(peak_kb) / 1024)
    assert peaks[1] - peaks[0] < 30, f"peak RSS {peaks[0]:.0f} MB, then {peaks[1]:.0f} MB"
