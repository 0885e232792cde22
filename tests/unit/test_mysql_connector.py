"""mysql-connector-python's C extension as a source driver, without a server: which URLs map
onto its arguments (anything else keeps PyMySQL), the statement as PyMySQL would send it, and
its raw rows decoded into PyMySQL's."""

from __future__ import annotations

import datetime

import pytest

from airflow_pg_bulk.db.mysql_connector import (
    connector_arguments,
    is_text,
    pymysql_text,
    row_decoder,
)

pytest.importorskip("pymysql", reason="the mysql extra (PyMySQL) is not installed")
pytest.importorskip("sqlalchemy", reason="database sources go through SQLAlchemy")


def test_a_pymysql_url_maps_onto_the_connectors_arguments() -> None:
    assert connector_arguments("mysql+pymysql://u:p%40ss@db.example:3307/sales") == (
        {"user": "u", "password": "p@ss", "database": "sales", "charset": "utf8mb4",
         "host": "db.example", "port": 3307},
        "utf8",
    )  # fmt: skip
    assert connector_arguments(
        "mariadb+pymysql://u@localhost/s?unix_socket=/run/mysqld/mysqld.sock&charset=latin1"
    ) == (
        {"user": "u", "password": "", "database": "s", "charset": "latin1",
         "unix_socket": "/run/mysqld/mysqld.sock"},
        "cp1252",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://u@h/d", "not MariaDB/MySQL"),
        ("mysql+mysqldb://u@h/d", "driver is mysqldb"),
        ("mysql+pymysql://u@h/d?charset=utf8mb4&ssl_ca=/x.pem", "ssl_ca"),
        ("mysql+pymysql://u@h/d?connect_timeout=5", "connect_timeout"),
        ("mysql+pymysql://h/d", "no user"),
        ("mysql+pymysql://u@localhost/d", "localhost"),
        ("mysql+pymysql://u@h/d?charset=utf8", "charset utf8"),
    ],
)
def test_a_url_it_cannot_carry_keeps_pymysql(url: str, why: str) -> None:
    reason = connector_arguments(url)
    assert isinstance(reason, str) and why in reason


def test_rows_decoded_as_pymysql_hands_them() -> None:
    """Text columns decoded by the charset, binary ones kept, NULL kept; a one-column row."""
    decode = row_decoder([True, False, True], "utf-8")
    assert decode([(b"1", b"\x00\\", "é\t".encode()), (None, None, None)]) == [
        ("1", b"\x00\\", "é\t"),
        (None, None, None),
    ]
    assert row_decoder([True], "cp1252")([(b"\xe9",), (None,)]) == [("é",), (None,)]
    from pymysql.constants import FIELD_TYPE

    assert is_text(FIELD_TYPE.LONGLONG, 63) and is_text(FIELD_TYPE.VAR_STRING, 45)
    assert is_text(FIELD_TYPE.JSON, 63) and is_text(FIELD_TYPE.NEWDECIMAL, 63)
    assert not is_text(FIELD_TYPE.BLOB, 63) and not is_text(FIELD_TYPE.BIT, 63)


def test_the_statement_is_the_text_pymysql_sends() -> None:
    """A literal ``%`` of the query stays one, bound values escaped as PyMySQL escapes them."""
    from airflow_pg_bulk.sql import source as source_sql

    url = "mysql+pymysql://u@h/d"
    query = "SELECT id, day FROM t WHERE id % 2 = 0 AND v LIKE 'a%'"
    whole = source_sql.alchemy_key_range(query, None, "id", None, None)
    assert pymysql_text(url, whole, "utf8mb4") == query
    text = pymysql_text(
        url,
        source_sql.alchemy_key_range(
            query, None, "day", datetime.date(2026, 1, 2), datetime.datetime(2026, 1, 3, 4, 5, 6, 7)
        ),
        "utf8mb4",
    )
    assert "id % 2" in text and "'a%'" in text
    assert "day >= '2026-01-02' AND day < '2026-01-03 04:05:06.000007'" in text
