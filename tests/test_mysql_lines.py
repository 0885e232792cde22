"""A MariaDB/MySQL source read as COPY text lines made by the server
(:mod:`airflow_pg_bulk.loading.database.lines_copy`), through each reader (PyMySQL's and
mysql-connector-python's C extension's): each line is, byte for byte, the COPY text of the
rows path's row (PyMySQL's values), the targets the lines and the rows load are equal, a
column of a type without such a line (BIT) or a latin1 connection keeps the rows path, a
value the target refuses is read again by the rows path, whose error names the row, and the
rows counted are the rows loaded.

The server: see ``tests/mariadb.py``; the C extension's reader skipped with the reason where
it does not load."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mariadb import database_on
from psycopg import sql
from servers import require

from airflow_pg_bulk.db import mysql_cext, mysql_connector
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.loading.database import lines_copy, piece, row_readers
from airflow_pg_bulk.loading.database.urls import hold
from airflow_pg_bulk.runner import load
from airflow_pg_bulk.source import copy_text
from airflow_pg_bulk.sql import source as source_sql

require("pymysql", "the MariaDB source tests read through PyMySQL (airflow-pg-bulk[mysql])")
sqlalchemy = require("sqlalchemy", "database sources go through SQLAlchemy")

TEXTS = [
    None, "", "tab\there", "line\nbreak", "carriage\rreturn", "back\\slash", "\\N", "\\.",
    "ends with backslash\\", "naïve café 日本語 🚀", "quote \" and ' and ,", "\\x41", "a\\tb",
]  # fmt: skip
BYTES = [None, b"", b"\x00\xff\n\\", b"\\\x00\t", b"\\N", b"\r\n", bytes(range(256))]

#: every type that has a line (no BIT), each NULL somewhere
AWKWARD_TABLE = (
    "CREATE TABLE awkward (id int PRIMARY KEY, tx text, vc varchar(40) NOT NULL DEFAULT '',"
    " ch char(5), lat varchar(20) CHARACTER SET latin1, bl blob, vb varbinary(300),"
    " bin binary(4), d double, f float, n decimal(30,10), u bigint unsigned, zf int(6) zerofill,"
    " day date, at datetime(6), ts timestamp(3) NULL, t time(6), y year, flag tinyint(1),"
    " j json, e enum('a', 'b\tc'), s set('x', 'y'), uu uuid, ip inet6)"
)
AWKWARD_TARGET = (
    "id int PRIMARY KEY, tx text, vc text, ch text, lat text, bl bytea, vb bytea, bin bytea,"
    " d float8, f float4, n numeric(30,10), u numeric(20), zf text, day date, at timestamp,"
    " ts timestamp(3), t interval, y int, flag boolean, j jsonb, e text, s text, uu uuid,"
    " ip inet"
)
#: typed rows, then one row a text and one a bytes value (the rest NULL or the default)
AWKWARD_ROWS = [
    "(1, 'tab\there', 'a\\\\b', 'x', 'café', x'00ff0a5c', x'5c0009', x'00010203',"
    " CAST(0.1 AS double) + CAST(0.2 AS double), 0.1, 12345678901234567890.0123456789,"
    " 18446744073709551615, 42, '2026-01-02', '2026-01-02 03:04:05.000006',"
    " '2026-01-02 03:04:05.123', '-838:59:59.000001', 2026, 1, '{\"k\": \"a\\\\tb\"}', 'b\tc',"
    " 'x,y', 'a1b2c3d4-0000-4000-8000-000000000001', '::ffff:10.0.0.1')",
    "(2, '', '', '', '', '', '', x'5c4e0000', 1e300, -1.5, -0.0000000001, 0, 0,"
    " '1000-01-01', '1000-01-01 00:00:00', NULL, '12:34:56', 1901, 0, '[1, null]', 'a', '',"
    " NULL, NULL)",
    "(3" + ", NULL, DEFAULT" + ", NULL" * 21 + ")",
]


def _run(url: str, *statements: str, params: list[Any] | None = None) -> None:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement, *([params] if params else []))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def source_lines(mariadb: str) -> Iterator[str]:
    """A database of its own holding ``awkward`` (:data:`AWKWARD_ROWS`, then a row for each
    of :data:`TEXTS` in ``tx`` and ``vc`` and one for each of :data:`BYTES` in ``bl``)."""
    with database_on(mariadb) as url:
        _run(url, AWKWARD_TABLE, *(f"INSERT INTO awkward VALUES {row}" for row in AWKWARD_ROWS))
        texts = [(i, v, v or "") for i, v in enumerate(TEXTS, 10)]
        _run(url, "INSERT INTO awkward (id, tx, vc) VALUES (%s, %s, %s)", params=texts)
        blobs = [(i, v) for i, v in enumerate(BYTES, 100)]
        _run(url, "INSERT INTO awkward (id, bl) VALUES (%s, %s)", params=blobs)
        yield url


def _lines(reader: type[Any], name: str, table: str) -> list[bytes]:
    """The COPY text lines the server makes of ``table``'s rows (ordered by id), read by
    ``reader``."""
    rows = source_sql.alchemy_range_rows(
        f"SELECT * FROM {table} ORDER BY id", None, "", (None, None)
    )
    with reader.for_source(name).lines(name, rows) as lines:
        assert lines is not None
        chunks = list(lines)
    text = b"".join(chunks)
    assert lines.rows == text.count(b"\n") and lines.bytes == len(text)
    assert all(chunk.endswith(b"\n") for chunk in chunks)
    return text.split(b"\n")[:-1]


def test_each_line_is_the_rows_paths_copy_text(source_lines: str, reader: type[Any]) -> None:
    """Every line the server makes is, byte for byte, the COPY text the rows path writes of
    PyMySQL's row (:func:`copy_text.field` of each value, as psycopg's ``write_row``
    escapes it): NULL as ``\\N``; tab, newline, CR and backslash escaped; ``\\N`` as text;
    unicode; bytes as lowercase hex; doubles, floats, decimals, dates and times as the
    server's text protocol sends them."""
    name = hold(source_lines)
    statement = sqlalchemy.text("SELECT * FROM awkward ORDER BY id")
    with row_readers.AlchemyReader().batches(name, statement) as batches:
        rows = [row for batch in batches for row in batch]
    expected = ["\t".join(copy_text.field(value) for value in row).encode() for row in rows]
    assert _lines(reader, name, "awkward") == expected
    assert len(expected) == len(AWKWARD_ROWS) + len(TEXTS) + len(BYTES)
    assert b"\\\\x00ff0a5c" in expected[0] and b"\\N" in expected[2]


def test_the_modules_lines_are_the_packages(
    source_lines: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The C extension's reader reads the lines through its module ``_mysql_connector``
    directly; with that module made not to import (the library's availability, not the
    server, is what is simulated) it reads them through the ``mysql.connector`` package,
    said in an INFO line, and the lines are the same, byte for byte."""
    if (why := mysql_connector.connector_extension()) is not None:
        pytest.skip(f"mysql-connector-python: {why}")
    name = hold(source_lines)
    caplog.set_level(logging.INFO, logger=row_readers.__name__)
    direct = _lines(row_readers.ConnectorReader, name, "awkward")
    assert not any("directly" in r.getMessage() for r in caplog.records)
    monkeypatch.setitem(sys.modules, "_mysql_connector", None)
    mysql_cext.extension.cache_clear()
    try:
        by_package = _lines(row_readers.ConnectorReader, name, "awkward")
    finally:
        mysql_cext.extension.cache_clear()
    assert by_package == direct
    assert len(direct) == len(AWKWARD_ROWS) + len(TEXTS) + len(BYTES)
    messages = [r.getMessage() for r in caplog.records]
    assert any("not read by" in m and "directly" in m and "does not load" in m
               for m in messages), messages  # fmt: skip


def _load_into(db: Any, connect: Callable[[], Any], url: str, target: str) -> Any:
    db.run(sql.SQL("CREATE TABLE {} (" + AWKWARD_TARGET + ")").format(db.ident(target)))
    return load(connect, db.table(target), mode="replace", source_url=url, source_table="awkward")


def test_lines_load_the_rows_paths_target(
    db: Any,
    connect: Callable[[], Any],
    source_lines: str,
    reader: type[Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same awkward rows loaded by the lines and by the same reader's rows (the lines'
    way made to decline) give equal targets, typed (bytea, float4/8, numeric, interval,
    jsonb, uuid, inet...), every row counted."""
    caplog.set_level(logging.INFO)
    by_lines = _load_into(db, connect, source_lines, "by_lines")
    messages = [r.getMessage() for r in caplog.records]
    assert any("by COPY text lines made by the source server" in m for m in messages)
    caplog.clear()
    monkeypatch.setattr(lines_copy, "copy_range", lambda *args: None)
    by_rows = _load_into(db, connect, source_lines, "by_rows")
    messages = [r.getMessage() for r in caplog.records]
    assert any("by a server-side cursor" in m for m in messages), messages
    assert by_lines.rows == by_rows.rows == len(AWKWARD_ROWS) + len(TEXTS) + len(BYTES)
    select = "SELECT * FROM {} ORDER BY id"
    got = db.run(sql.SQL(select).format(db.ident("by_lines")))
    assert got == db.run(sql.SQL(select).format(db.ident("by_rows")))
    assert db.checksum("by_lines") == db.checksum("by_rows")
    by_id = {row[0]: row for row in got}
    assert [by_id[i][1] for i in range(10, 10 + len(TEXTS))] == TEXTS
    assert [by_id[i][5] and bytes(by_id[i][5]) for i in range(100, 100 + len(BYTES))] == BYTES
    assert by_id[1][8] == 0.1 + 0.2 and str(by_id[1][10]) == "12345678901234567890.0123456789"


def test_a_type_without_a_line_keeps_the_rows_path(
    db: Any,
    connect: Callable[[], Any],
    source_lines: str,
    reader: type[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A BIT column (PyMySQL hands its bytes, the server's text of it is a number) and a
    latin1 connection (whose text is the rows path's) are read by the rows path, said in
    the log, and load."""
    _run(source_lines, "CREATE OR REPLACE TABLE bits (id int PRIMARY KEY, b bit(10))",
         "INSERT INTO bits VALUES (1, b'1000000001'), (2, NULL)")  # fmt: skip
    db.run(sql.SQL("CREATE TABLE {} (id int, b bytea)").format(db.ident("bits")))
    caplog.set_level(logging.INFO)
    summary = load(connect, db.table("bits"), mode="replace", source_url=source_lines,
                   source_table="bits")  # fmt: skip
    assert summary.rows == 2
    assert db.run(sql.SQL("SELECT b FROM {} ORDER BY id").format(db.ident("bits"))) == [
        (b"\x02\x01",),
        (None,),
    ]
    messages = [r.getMessage() for r in caplog.records]
    assert any("no text of the type of b" in m for m in messages), messages
    assert any("by a server-side cursor" in m for m in messages), messages

    caplog.clear()
    latin1 = source_lines.replace("charset=utf8mb4", "charset=latin1")
    db.run(sql.SQL("CREATE TABLE {} (id int, tx text)").format(db.ident("lat")))
    summary = load(connect, db.table("lat"), mode="replace", source_url=latin1,
                   query="SELECT id, tx FROM awkward WHERE id < 10")  # fmt: skip
    assert summary.rows == 3
    messages = [r.getMessage() for r in caplog.records]
    assert any("its charset is latin1, not utf8mb4" in m for m in messages), messages


@pytest.mark.parametrize(
    ("value", "column", "shown"),
    [("'many'", "n", "many"), ("convert(concat('a', char(0), 'b') USING utf8mb4)", "tx", None)],
    ids=["not a number", "NUL in text"],
)
def test_a_refused_value_is_read_again_and_named(
    db: Any,
    connect: Callable[[], Any],
    source_lines: str,
    reader: type[Any],
    caplog: pytest.LogCaptureFixture,
    value: str,
    column: str,
    shown: str | None,
) -> None:
    """A value the target refuses in a line (text for a numeric column; a NUL, which no
    PostgreSQL text holds): the lines' COPY is undone (its savepoint), the range read again
    by the rows path, whose error names the row and the column; the target is untouched."""
    db.run(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, tx text, n numeric)")
           .format(db.ident("refused")))  # fmt: skip
    caplog.set_level(logging.INFO)
    query = (
        f"SELECT seq AS id, CASE WHEN seq = 1234 THEN {value} ELSE 'ok' END AS tx,"
        f" CASE WHEN seq = 1234 THEN {value} ELSE seq END AS n FROM seq_1_to_3000"
    )
    if column == "tx":
        query = query.replace(f"THEN {value} ELSE seq END", "THEN 1 ELSE seq END")
    else:
        query = query.replace(f"THEN {value} ELSE 'ok' END", "THEN 'ok' ELSE 'ok' END")
    with pytest.raises(BadDataError) as failed:
        load(connect, db.table("refused"), mode="replace", source_url=source_lines,
             query=query)  # fmt: skip
    text = str(failed.value)
    assert "row 1234" in text, text
    if shown is not None:  # (a NUL's error names the row only, psycopg2's rows path's too)
        assert column in text and shown in text, text
    messages = [r.getMessage() for r in caplog.records]
    assert any("COPY lines made by the source failed" in m for m in messages), messages
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("refused"))) == 0


def test_the_ways_are_tried_in_turn(source_lines: str) -> None:
    """Another database's range: Arrow where prepare chose it, then the lines, then the
    cursor's rows, which always moves it (or fails naming why)."""
    from airflow_pg_bulk.loading.database import rows_copy
    from airflow_pg_bulk.plan import DatabaseSource

    source = DatabaseSource(hold(source_lines), False, table="awkward")
    plan = type("Plan", (), {"database": source})
    assert [w.copy for w in piece.ways(plan)] == [lines_copy.copy_range, rows_copy.copy_range]
    plan.database = DatabaseSource(hold(source_lines), False, table="awkward", arrow="x")
    ways = piece.ways(plan)
    assert [w.copy for w in ways[1:]] == [lines_copy.copy_range, rows_copy.copy_range]
    assert ways[0].how == "Arrow record batches (x)"


def test_which_types_have_a_line() -> None:
    """Numbers, dates and times as the server prints them; FLOAT and DOUBLE on MariaDB only
    (their text in a string expression was compared with the text protocol's there, not on
    MySQL); strings escaped, or as hex in the binary charset; BIT, GEOMETRY and MySQL's JSON
    type none."""
    from pymysql.constants import FIELD_TYPE as F

    from airflow_pg_bulk.sql.copy_lines import Rendered

    def rendered(field_type: int, charset: int = 63, mariadb: bool = True) -> Any:
        return mysql_connector.rendered(field_type, charset, mariadb)

    for as_is in (F.LONGLONG, F.NEWDECIMAL, F.DATE, F.DATETIME, F.TIMESTAMP, F.TIME, F.YEAR):
        assert rendered(as_is) is rendered(as_is, mariadb=False) is Rendered.AS_IS
    assert rendered(F.DOUBLE) is rendered(F.FLOAT) is Rendered.AS_IS
    assert rendered(F.DOUBLE, mariadb=False) is rendered(F.FLOAT, mariadb=False) is None
    assert rendered(F.VAR_STRING, 45) is rendered(F.BLOB, 224) is Rendered.ESCAPED
    assert rendered(F.VAR_STRING) is rendered(F.BLOB) is rendered(F.STRING) is Rendered.HEX
    assert rendered(F.VAR_STRING, None) is rendered(F.BLOB, None) is Rendered.TEXT_OR_HEX
    assert rendered(F.BIT) is rendered(F.GEOMETRY) is rendered(F.JSON, 45) is None
