"""``create_target``'s schema from a database source: a PostgreSQL source's exact types, another
database's table as SQLAlchemy reflects it, mapped to PostgreSQL's types; NOT NULL and the
primary key where the source has them."""

from __future__ import annotations

from typing import Any

from airflow_pg_bulk.db import driver
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.loading.database.connections import (
    alchemy_connection,
    postgres_session,
    query_refused,
    reason,
)
from airflow_pg_bulk.loading.database.urls import held_url
from airflow_pg_bulk.plan import DatabaseSource
from airflow_pg_bulk.sql import source as source_sql

#: a source's schema as create_target takes it: ``(name, PostgreSQL type text, NOT NULL)`` per
#: column, and the primary key's columns in key order (may be empty)
Schema = tuple[list[tuple[str, str, bool]], list[str]]


def source_schema(source: DatabaseSource, table: str) -> tuple[Schema, str]:
    """``create_target``'s columns and key from a database source, for the missing target
    ``table``, and the source in words: a PostgreSQL source's exact types (``format_type`` of
    each result column's type and modifier: numeric precision, arrays, json, timestamptz), an
    enum as ``text`` (its type is not on the target); another database's ``source_table`` as
    SQLAlchemy reflects it (:func:`_alchemy_schema`); for ``source_table`` also its NOT NULL
    columns and primary key."""
    if not source.postgres and source.table is None:
        raise LoadRefusedError(
            f"target table {table} does not exist, and create_target takes the types "
            f"of a query's columns from a PostgreSQL source only (the source {source.name} is "
            "not PostgreSQL); nothing was changed. Give source_table (its declared types are "
            "mapped through SQLAlchemy), or create the table first"
        )
    schema = _postgres_schema(source) if source.postgres else _alchemy_schema(source)
    return schema, source.describe()


def _postgres_schema(source: DatabaseSource) -> Schema:
    """The source's result columns (name, type text, NOT NULL) and primary key columns."""
    select = source_sql.source_select(source.query, source.table)
    with postgres_session(source.name) as conn:
        try:
            with driver.plain_cursor(conn) as cur:
                cur.execute(source_sql.no_rows(select))
                result = cur.pgresult
                names = [d.name for d in cur.description]
                oids = [result.ftype(i) for i in range(len(names))]
                mods = [result.fmod(i) for i in range(len(names))]
            rendered = driver.execute(conn, source_sql.column_types(oids, mods))
            keys = driver.execute(conn, source_sql.table_keys(source.table)) if source.table else []
        except Exception as exc:
            raise query_refused(source, reason(exc, held_url(source.name))) from None
    not_null = {name for name, nn, _ in keys if nn}
    key = [name for name, _, _ in sorted((k for k in keys if k[2] is not None), key=lambda k: k[2])]
    columns = [
        (
            name,
            ("text[]" if enum_array else "text") if enum or enum_array else text,
            name in not_null,
        )
        for name, (text, enum, enum_array) in zip(names, rendered, strict=True)
    ]
    return columns, key


def _postgres_type(declared: Any) -> Any:
    """A reflected column type as the generic SQLAlchemy type PostgreSQL's dialect renders:
    its ``as_generic()``, except where that would lose values or not be PostgreSQL: an
    unsigned integer (MySQL) one size wider (``int unsigned`` -> ``bigint``, ``bigint
    unsigned`` -> ``numeric(20)``), an enum as ``text`` (its type is not on the target, as for
    a PostgreSQL source), a string without the source's collation (``utf8mb4_bin``)."""
    import sqlalchemy

    generic = declared.as_generic()
    if isinstance(generic, sqlalchemy.Enum):
        return sqlalchemy.Text()
    if getattr(declared, "unsigned", False) and isinstance(generic, sqlalchemy.Integer):
        if isinstance(generic, sqlalchemy.BigInteger):
            return sqlalchemy.Numeric(20, 0)
        if isinstance(generic, sqlalchemy.SmallInteger):
            return sqlalchemy.Integer()
        return sqlalchemy.BigInteger()
    if getattr(generic, "collation", None):
        generic.collation = None
    return generic


def _alchemy_schema(source: DatabaseSource) -> Schema:
    """Another database's table, as SQLAlchemy reflects it: each column's declared type made
    generic (``BLOB`` -> ``LargeBinary``: :func:`_postgres_type`) and rendered by
    SQLAlchemy's PostgreSQL dialect (``bytea``, ``NUMERIC(10, 2)``, ``VARCHAR(20)``,
    ``TIMESTAMP WITHOUT TIME ZONE``); a column with no type SQLAlchemy knows is refused, not
    guessed. NOT NULL and the primary key from the reflection."""
    import sqlalchemy
    from sqlalchemy.dialects import postgresql

    assert source.table is not None
    schema, _, name = source.table.rpartition(".")
    with alchemy_connection(source.name) as conn:
        try:
            found = sqlalchemy.inspect(conn)
            reflected = found.get_columns(name, schema=schema or None)
            key = list(found.get_pk_constraint(name, schema=schema or None)["constrained_columns"])
        except Exception as exc:
            raise query_refused(source, reason(exc, held_url(source.name))) from None
    dialect = postgresql.dialect()
    columns = []
    for column in reflected:
        try:
            rendered = _postgres_type(column["type"]).compile(dialect=dialect)
        except Exception:
            raise LoadRefusedError(
                f"create_target: the source column {column['name']} of {source.table} has a "
                f"type ({column['type']!r}) with no PostgreSQL equivalent SQLAlchemy knows; "
                "nothing was changed. Create the target table first"
            ) from None
        columns.append((column["name"], rendered, not column["nullable"] or column["name"] in key))
    return columns, key
