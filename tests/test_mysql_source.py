"""MariaDB/MySQL as the source, through SQLAlchemy and PyMySQL (``airflow-pg-bulk[mysql]``):
every mode, split by a column, values round-trip, memory bounded by the server-side cursor, an
Airflow ``mysql`` connection, a source failing midway and a value the target rejects. The
rows are read by mysql-connector-python's C extension where it loads (the reader chosen by
:mod:`airflow_pg_bulk.loading.database.row_readers`), else by PyMySQL: the value tests run
through each reader (forced), the two readers' rows and targets are compared, and the
extension made absent leaves PyMySQL's.

The server: see ``tests/mariadb.py`` (PG_BULK_TEST_MYSQL_URL, 127.0.0.1:3306, or a throwaway
``mariadbd``; skipped with the reason when there is none)."""

from __future__ import annotations

import datetime
import decimal
import logging
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mariadb import database_on
from psycopg import sql
from servers import require

from airflow_pg_bulk.db import mysql_cext, mysql_connector
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError, SourceReadError
from airflow_pg_bulk.loading.database import row_readers
from airflow_pg_bulk.loading.database.columns import source_description
from airflow_pg_bulk.loading.database.urls import hold
from airflow_pg_bulk.plan import DatabaseSource
from airflow_pg_bulk.runner import load

require("pymysql", "the MariaDB source tests read through PyMySQL (airflow-pg-bulk[mysql])")
sqlalchemy = require("sqlalchemy", "database sources go through SQLAlchemy")

AWKWARD = [
    None, "", "tab\there", "line\nbreak", "carriage\rreturn", "back\\slash", "\\N", "\\.",
    "ends with backslash\\", "naïve café 日本語 🚀", "quote \" and ' and ,",
]  # fmt: skip


READERS = [row_readers.AlchemyReader, row_readers.ConnectorReader]


def _run(url: str, *statements: str, rows: list[tuple[Any, ...]] | None = None) -> None:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
            if rows is not None:
                conn.exec_driver_sql("INSERT INTO awkward VALUES (%s, %s, %s)", rows)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def source_maria(mariadb: str) -> Iterator[str]:
    """A database of its own: ``src`` (id, day, v, amount) of 3,000 rows over three days, and
    ``awkward`` (id, v, b) of :data:`AWKWARD` as text and as bytes."""
    with database_on(mariadb) as url:
        _run(
            url,
            "CREATE TABLE src (id int PRIMARY KEY, day date NOT NULL, v varchar(20),"
            " amount decimal(12,4))",
            "INSERT INTO src SELECT seq, date '2026-01-01' + INTERVAL MOD(seq, 3) DAY,"
            " concat('v', seq), seq / 8 FROM seq_1_to_3000",
            "CREATE TABLE awkward (id int PRIMARY KEY, v text, b blob)",
            rows=[(i, v, None if v is None else v.encode()) for i, v in enumerate(AWKWARD, 1)],
        )
        yield url


def _target(db: Any, name: str = "t", partitioned: bool = False) -> str:
    db.run(
        sql.SQL("CREATE TABLE {} (id int{}, day date NOT NULL, v text, amount numeric){}").format(
            db.ident(name),
            sql.SQL("" if partitioned else " PRIMARY KEY"),
            sql.SQL(" PARTITION BY RANGE (day)" if partitioned else ""),
        )
    )
    if partitioned:
        for n in range(1, 4):
            db.run(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                    db.ident(f"{name}{n}"), db.ident(name),
                    sql.Literal(f"2026-01-0{n}"), sql.Literal(f"2026-01-0{n + 1}"),
                )
            )  # fmt: skip
    return db.table(name)


def _count(db: Any, name: str, where: str = "TRUE") -> int:
    return int(db.scalar(sql.SQL("SELECT count(*) FROM {} WHERE " + where).format(db.ident(name))))


def test_mariadb_source_every_mode(db: Any, connect: Callable[[], Any], source_maria: str) -> None:
    table = _target(db)
    summary = load(connect, table, mode="replace", source_url=source_maria, source_table="src")
    assert summary.rows == 3000
    assert db.run(
        sql.SQL("SELECT id, day::text, v, amount::text FROM {} WHERE id IN (1, 3000) ORDER BY id")
        .format(db.ident("t"))
    ) == [(1, "2026-01-02", "v1", "0.1250"), (3000, "2026-01-01", "v3000", "375.0000")]  # fmt: skip
    load(connect, table, mode="append", source_url=source_maria,
         query="SELECT id + 3000 AS id, day, v, amount FROM src WHERE id <= 10")  # fmt: skip
    assert _count(db, "t") == 3010
    summary = load(connect, table, mode="upsert", source_url=source_maria,
                   query="SELECT id, day, 'new' AS v FROM src WHERE id % 1000 = 0")  # fmt: skip
    assert summary.rows == 3
    assert _count(db, "t", "v = 'new'") == 3 and _count(db, "t") == 3010
    # split by the key, every mode's rows the same as one stream's
    summary = load(connect, table, mode="replace", source_url=source_maria, source_table="src",
                   split_by="id", partitions=4)  # fmt: skip
    assert summary.rows == 3000 and "4 COPY streams" in summary.describe()
    assert db.scalar(sql.SQL("SELECT sum(id) FROM {}").format(db.ident("t"))) == 3000 * 3001 // 2

    parted = _target(db, "p", partitioned=True)
    load(connect, parted, mode="replace", source_url=source_maria, source_table="src",
         split_by="day", partitions=3)  # fmt: skip
    load(connect, parted, mode="replace_partitions", source_url=source_maria,
         query="SELECT id, day, 'again' AS v, amount FROM src WHERE day = '2026-01-02'"
         " AND id < 100", split_by="id", partitions=2)  # fmt: skip
    counts = dict(db.run(sql.SQL("SELECT day::text, count(*) FROM {} GROUP BY 1")
                         .format(db.ident("p"))))  # fmt: skip
    assert counts == {"2026-01-01": 1000, "2026-01-02": 33, "2026-01-03": 1000}
    assert _count(db, "p2", "v = 'again'") == 33


def test_mariadb_values_round_trip(
    db: Any, connect: Callable[[], Any], source_maria: str, reader: type[Any]
) -> None:
    db.run(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, b bytea)").format(db.ident("a")))
    load(connect, db.table("a"), mode="replace", source_url=source_maria, source_table="awkward")
    got = db.run(sql.SQL("SELECT v, b FROM {} ORDER BY id").format(db.ident("a")))
    assert [r[0] for r in got] == AWKWARD
    assert [None if r[1] is None else bytes(r[1]).decode() for r in got] == AWKWARD


def test_mariadb_typed_values_round_trip(
    db: Any, connect: Callable[[], Any], source_maria: str, reader: type[Any]
) -> None:
    """Each MariaDB type as the server's text reaches PostgreSQL with its value: doubles to the
    last bit (the shortest digits MariaDB sends), DECIMAL and unsigned BIGINT exactly, a
    DATETIME's microseconds, a TIME beyond a day (into interval), YEAR, a tinyint(1) into
    boolean, JSON holding a tab, an enum, NULL in every column."""
    _run(
        source_maria,
        "DROP TABLE IF EXISTS typed_values",
        "CREATE TABLE typed_values (id int PRIMARY KEY, d double, f float, n decimal(30,10),"
        " u bigint unsigned, at datetime(6), day date, t time, y year, flag tinyint(1),"
        " j json, e enum('a', 'b\tc'))",
        "INSERT INTO typed_values VALUES (1, CAST(0.1 AS double) + CAST(0.2 AS double), 0.5,"
        " 12345678901234567890.0123456789, 18446744073709551615, '2026-01-02 03:04:05.000006',"
        " '2026-01-02', '-838:59:59', 2026,"
        " 1, '{\"k\": \"a\\\\tb\"}', 'b\tc'),"
        " (2, 1e300, -1.5, -0.0000000001, 0, '1000-01-01 00:00:00', '9999-12-31', '12:34:56',"
        " 1901, 0, '[1, null]', 'a'),"
        " (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    )
    db.run(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, d float8, f float4, n numeric(30,10),"
            " u numeric(20), at timestamp, day date, t interval, y int, flag boolean, j jsonb,"
            " e text)"
        ).format(db.ident("typed"))
    )
    load(connect, db.table("typed"), mode="replace", source_url=source_maria,
         source_table="typed_values")  # fmt: skip
    got = db.run(sql.SQL("SELECT * FROM {} ORDER BY id").format(db.ident("typed")))
    assert got == [
        (1, 0.1 + 0.2, 0.5, decimal.Decimal("12345678901234567890.0123456789"),
         decimal.Decimal(18446744073709551615), datetime.datetime(2026, 1, 2, 3, 4, 5, 6),
         datetime.date(2026, 1, 2), -datetime.timedelta(hours=838, minutes=59, seconds=59),
         2026, True, {"k": "a\tb"}, "b\tc"),
        (2, 1e300, -1.5, decimal.Decimal("-0.0000000001"), decimal.Decimal(0),
         datetime.datetime(1000, 1, 1), datetime.date(9999, 12, 31),
         datetime.timedelta(hours=12, minutes=34, seconds=56), 1901, False, [1, None], "a"),
        (3, *[None] * 11),
    ]  # fmt: skip


def test_mariadb_rows_stream_with_bounded_memory(
    db: Any, connect: Callable[[], Any], source_maria: str
) -> None:
    """200,000 rows of about 120 bytes (some 24 MB as PyMySQL's tuples if they were fetched
    at once): the server-side cursor hands them over a batch at a time, so the load's peak
    of Python memory stays a few MB (a buffered cursor's was measured above 60 MB)."""
    query = (
        "SELECT seq AS id, date '2026-01-01' AS day, repeat('x', 100) AS v, seq AS amount"
        " FROM seq_1_to_200000"
    )
    table = _target(db)
    tracemalloc.start()
    try:
        summary = load(connect, table, mode="replace", source_url=source_maria, query=query)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.rows == 200_000 and _count(db, "t") == 200_000
    assert peak < 16e6, f"peak of Python memory {peak / 1e6:.1f} MB"


def test_mariadb_source_failing_midway_leaves_target_untouched(
    db: Any, connect: Callable[[], Any], source_maria: str
) -> None:
    """A stored function raises on row 150,001 of 200,000: rows were streamed into staging
    before it; the load fails naming the source's error, the target keeps its rows."""
    _run(
        source_maria,
        "CREATE OR REPLACE FUNCTION boom(i int) RETURNS int DETERMINISTIC BEGIN"
        " IF i = 150001 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the source broke';"
        " END IF; RETURN i; END",
    )
    table = _target(db)
    load(connect, table, mode="replace", source_url=source_maria,
         query="SELECT * FROM src WHERE id <= 7")  # fmt: skip
    before = db.checksum("t")
    for mode in ("replace", "append"):
        with pytest.raises(SourceReadError, match="the source broke") as failed:
            load(connect, table, mode=mode, source_url=source_maria,
                 query="SELECT boom(seq) + 7 AS id, date '2026-01-01' AS day,"
                 " repeat('x', 50) AS v, 1 AS amount FROM seq_1_to_200000")  # fmt: skip
        assert "unchanged" in str(failed.value)
        assert db.checksum("t") == before


def test_a_rejected_value_names_range_key_and_column(
    db: Any, connect: Callable[[], Any], source_maria: str
) -> None:
    """A value the target's column does not take: the error names the source, the range of
    the split key, the split key's value of that row, the row and the column."""
    table = _target(db)
    with pytest.raises(BadDataError) as failed:
        load(connect, table, mode="replace", source_url=source_maria, split_by="id", partitions=3,
             query="SELECT id, day, v, CASE WHEN id = 2998 THEN 'many' ELSE '1' END AS amount"
             " FROM src")  # fmt: skip
    text = str(failed.value)
    assert "id >= 2001," in text, text
    assert "id = 2998" in text and "amount" in text and "many" in text, text
    assert _count(db, "t") == 0


def test_an_airflow_mysql_connection_without_its_provider(
    db: Any, connect: Callable[[], Any], source_maria: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``mysql`` connection (the MySQL provider is not installed: its hook needs
    ``mysqlclient``, a C extension) is read through PyMySQL, its password never in the plan."""
    import json

    from airflow_pg_bulk.operators.pg_bulk import hold_source_database

    url = sqlalchemy.engine.make_url(source_maria)
    monkeypatch.setenv(
        "AIRFLOW_CONN_PG_BULK_MARIA",
        json.dumps({"conn_type": "mysql", "host": url.host, "port": url.port,
                    "login": url.username, "password": url.password, "schema": url.database}),
    )  # fmt: skip
    hold_source_database("pg_bulk_maria")
    table = _target(db)
    summary = load(connect, table, mode="replace", source_conn_id="pg_bulk_maria",
                   query="SELECT * FROM src WHERE day = '2026-01-03'")  # fmt: skip
    assert summary.rows == 1000 == _count(db, "t", "day = '2026-01-03'")


def test_create_target_from_a_mariadb_table(
    db: Any, connect: Callable[[], Any], source_maria: str
) -> None:
    """MariaDB's declared types mapped through SQLAlchemy's reflection to PostgreSQL's (an
    unsigned integer one size wider, an enum as text, JSON's collation dropped); NOT NULL and
    the primary key (in key order) carried; no default; rows loaded; an existing target not
    altered; a query's types are not taken from a database other than PostgreSQL."""
    _run(
        source_maria,
        "DROP TABLE IF EXISTS typed",
        "CREATE TABLE typed (id bigint NOT NULL, name varchar(40) NOT NULL, price decimal(10,2),"
        " ratio double, data blob, note text, at datetime(6), day date, small smallint,"
        " u int unsigned, big bigint unsigned, mood enum('sad', 'happy'), doc json,"
        " label varchar(10) DEFAULT 'x', PRIMARY KEY (name, id))",
        "INSERT INTO typed VALUES (1, 'one', 12.5, 0.25, x'00ff', 'naïve', '2026-11-20 10:00:00.5',"
        " '2026-11-20', -3, 4294967295, 18446744073709551615, 'happy', '{\"k\": [1, 2]}', 'l')",
    )
    table = db.table("from_maria")
    summary = load(connect, table, mode="replace", source_url=source_maria,
                   source_table="typed", create_target=True)  # fmt: skip
    assert summary.rows == 1
    catalog = (
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    )
    assert db.run(catalog, table) == [
        ("id", "bigint", True), ("name", "character varying(40)", True),
        ("price", "numeric(10,2)", False), ("ratio", "double precision", False),
        ("data", "bytea", False), ("note", "text", False),
        ("at", "timestamp without time zone", False), ("day", "date", False),
        ("small", "smallint", False), ("u", "bigint", False), ("big", "numeric(20,0)", False),
        ("mood", "text", False), ("doc", "character varying", False),
        ("label", "character varying(10)", False),
    ]  # fmt: skip
    assert db.run(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype = 'p'",
        table,
    ) == [("PRIMARY KEY (name, id)",)]
    assert db.scalar("SELECT count(*) FROM pg_attrdef WHERE adrelid = %s::regclass", table) == 0
    assert db.run(
        sql.SQL("SELECT price::text, data, note, at::text, u, big::text, mood, doc::jsonb"
                " FROM {}").format(db.ident("from_maria"))
    ) == [("12.50", b"\x00\xff", "naïve", "2026-11-20 10:00:00.5", 4294967295,
           "18446744073709551615", "happy", {"k": [1, 2]})]  # fmt: skip
    before = db.run(catalog, table)
    load(connect, table, mode="append", source_url=source_maria, create_target=True,
         query="SELECT id + 1 AS id, 'two' AS name FROM typed")  # fmt: skip
    assert db.run(catalog, table) == before and _count(db, "from_maria") == 2
    with pytest.raises(LoadRefusedError, match="from a PostgreSQL source only"):
        load(connect, db.table("never"), mode="replace", source_url=source_maria,
             query="SELECT * FROM typed", create_target=True)  # fmt: skip
    assert db.scalar("SELECT to_regclass(%s)", db.table("never")) is None


def test_a_mariadb_source_keeps_the_rows_path(source_maria: str) -> None:
    """No Arrow reader for MariaDB/MySQL, ConnectorX installed or not: its stream reads ahead
    without bound (see :mod:`airflow_pg_bulk.loading.database.arrow_readers`), so the rows
    are read from PyMySQL's server-side cursor, in bounded memory."""
    _run(source_maria, "DROP TABLE IF EXISTS plain", "CREATE TABLE plain (id int, d double)")
    for what in ({"table": "plain"}, {"query": "SELECT id, d FROM plain"}):
        source = DatabaseSource(hold(source_maria), False, **what)
        assert source_description(source)[2] is None


def test_the_source_columns_by_either_reader(
    source_maria: str, reader: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The columns prepare reads are the same names by either reader (the C extension's
    module reads them where it is the reader; SQLAlchemy otherwise); a query that cannot
    run is refused in SQLAlchemy's (PyMySQL's) words by both, the module's error unsaid."""
    query = "SELECT id, v AS `naïve ü`, id + 1, amount AS `A b` FROM src"
    source = DatabaseSource(hold(source_maria), False, query=query)
    names = source_description(source)[0]
    assert names == ("id", "naïve ü", "id + 1", "A b")
    monkeypatch.setattr(row_readers, "forced", row_readers.AlchemyReader)
    assert source_description(source)[0] == names
    monkeypatch.setattr(row_readers, "forced", reader)
    by_module = row_readers.column_names(source.name, sqlalchemy.text(query + " LIMIT 0"))
    assert by_module == (names if reader is row_readers.ConnectorReader else None)
    bad = DatabaseSource(hold(source_maria), False, query="SELECT nope FROM src")
    with pytest.raises(LoadRefusedError) as refused:
        source_description(bad)
    assert "(1054, \"Unknown column 'nope' in 'SELECT'\")" in str(refused.value)


EVERY_TYPE = (
    "CREATE TABLE every_type (id int PRIMARY KEY, d double, f float, n decimal(30,10),"
    " u bigint unsigned, at datetime(6), ts timestamp(3) NULL, day date, t time(6), y year,"
    " flag tinyint(1), j json, e enum('a', 'b\tc'), s set('x', 'y'), bits bit(10),"
    " bin binary(4), vb varbinary(10), bl blob, tb tinyblob, tx text, vc varchar(40),"
    " ch char(5), lat varchar(10) CHARACTER SET latin1)"
)
EVERY_TYPE_NAMES = [
    "id", "d", "f", "n", "u", "at", "ts", "day", "t", "y", "flag", "j", "e", "s", "bits", "bin",
    "vb", "bl", "tb", "tx", "vc", "ch", "lat",
]  # fmt: skip
EVERY_TYPE_BYTES = ("bits", "bin", "vb", "bl", "tb")


@pytest.fixture
def fresh_choice() -> Iterator[None]:
    """The readers chosen in this process forgotten before and after the test."""
    row_readers.chosen.cache_clear()
    mysql_cext.extension.cache_clear()
    yield
    row_readers.chosen.cache_clear()
    mysql_cext.extension.cache_clear()


def test_both_readers_hand_the_same_rows_and_load_the_same_target(
    db: Any, connect: Callable[[], Any], source_maria: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every MariaDB type, NULL in each, awkward text and bytes: the C extension's rows are
    PyMySQL's, value for value and type for type (bytes where PyMySQL hands bytes: BIT,
    BINARY, VARBINARY, BLOB), and the two targets they load are equal bit for bit."""
    if (why := mysql_connector.connector_extension()) is not None:
        pytest.skip(f"mysql-connector-python: {why}")
    awkward = [v for v in AWKWARD if v is not None]
    rows = [
        "(1, CAST(0.1 AS double) + CAST(0.2 AS double), 0.1, 12345678901234567890.0123456789,"
        " 18446744073709551615, '2026-01-02 03:04:05.000006', '2026-01-02 03:04:05.123',"
        " '2026-01-02', '-838:59:59.000001', 2026, 1, '{\"k\": \"a\\\\tb\"}', 'b\tc', 'x,y',"
        " b'1000000001', x'00ff0a5c', x'5c0009', x'00', '', 'tab\there', 'naïve 日本語 🚀',"
        " 'a\\\\b', 'café')",
        "(2, 1e300, -1.5, -0.0000000001, 0, '1000-01-01 00:00:00', NULL, '9999-12-31',"
        " '12:34:56', 1901, 0, '[1, null]', 'a', '', b'0', '', '', '', x'5c4e', '',"
        " '\\\\N', '', '')",
        "(3" + ", NULL" * 22 + ")",
    ]
    rows += [
        f"({i}, {i}.5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
        f" NULL, NULL, NULL, %s, NULL, %s, NULL, NULL, NULL)"
        for i in range(4, 4 + len(awkward))
    ]
    _run(source_maria, "DROP TABLE IF EXISTS every_type", EVERY_TYPE)
    engine = sqlalchemy.create_engine(source_maria)
    try:
        with engine.begin() as conn:
            for row in rows[:3]:
                conn.exec_driver_sql(f"INSERT INTO every_type VALUES {row}")
            for row, text in zip(rows[3:], awkward, strict=True):
                conn.exec_driver_sql(f"INSERT INTO every_type VALUES {row}", (text.encode(), text))
    finally:
        engine.dispose()

    from airflow_pg_bulk.sql import source as source_sql

    name = hold(source_maria)
    read = {}
    for reader in READERS:
        with reader.for_source(name).batches(
            name, source_sql.alchemy_key_range(None, "every_type", "id", None, None)
        ) as batches:
            read[reader] = [row for batch in batches for row in batch]
        assert batches.rows == len(rows)
    pymysql_rows, connector_rows = read.values()
    assert connector_rows == pymysql_rows
    assert [[type(v) for v in r] for r in connector_rows] == [
        [type(v) for v in r] for r in pymysql_rows
    ]
    assert {type(v) for v in pymysql_rows[0]} == {str, bytes}  # the server's text, or bytes

    names = EVERY_TYPE_NAMES
    kinds = {"id": "int PRIMARY KEY", **dict.fromkeys(EVERY_TYPE_BYTES, "bytea")}
    for reader, target in zip(READERS, ("by_pymysql", "by_connector"), strict=True):
        db.run(
            sql.SQL("CREATE TABLE {} ({})").format(
                db.ident(target),
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(kinds.get(n, "text")))
                    for n in names
                ),
            )
        )
        monkeypatch.setattr(row_readers, "forced", reader)
        summary = load(connect, db.table(target), mode="replace", source_url=source_maria,
                       source_table="every_type")  # fmt: skip
        assert summary.rows == len(rows)
    select = "SELECT * FROM {} ORDER BY id"
    by_pymysql = db.run(sql.SQL(select).format(db.ident("by_pymysql")))
    assert db.run(sql.SQL(select).format(db.ident("by_connector"))) == by_pymysql
    assert db.checksum("by_connector") == db.checksum("by_pymysql")
    assert by_pymysql[0][-4:] == ("tab\there", "naïve 日本語 🚀", "a\\b", "café")
    assert by_pymysql[0][14:17] == (b"\x02\x01", b"\x00\xff\n\\", b"\\\x00\t")


def test_the_reader_is_chosen_once_by_capability(
    source_maria: str, fresh_choice: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The C extension where it loads and the URL maps onto it, said in one INFO line; a URL
    option it cannot carry keeps PyMySQL, said why."""
    caplog.set_level(logging.INFO, logger=row_readers.__name__)
    name = hold(source_maria)
    expected = (
        row_readers.ConnectorReader
        if mysql_connector.connector_extension() is None
        else row_readers.AlchemyReader
    )
    assert type(row_readers.chosen(name)) is expected
    assert row_readers.chosen(name) is row_readers.chosen(name)  # once
    other = hold(source_maria + "&connect_timeout=5")
    assert type(row_readers.chosen(other)) is row_readers.AlchemyReader
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert expected.name in lines[0]
    assert "connect_timeout" in lines[1] and row_readers.AlchemyReader.name in lines[1]


def test_without_the_extension_pymysql_reads(
    db: Any,
    connect: Callable[[], Any],
    source_maria: str,
    fresh_choice: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """mysql-connector-python's C extension absent (its import made to fail: the library's
    availability, not the server, is what is simulated): PyMySQL reads, the load is whole."""
    monkeypatch.setitem(sys.modules, "_mysql_connector", None)
    caplog.set_level(logging.INFO, logger=row_readers.__name__)
    name = hold(source_maria)
    assert type(row_readers.chosen(name)) is row_readers.AlchemyReader
    assert "does not load" in caplog.records[-1].getMessage()
    summary = load(connect, _target(db), mode="replace", source_url=source_maria,
                   source_table="src")  # fmt: skip
    assert summary.rows == 3000 == _count(db, "t")
