"""A database source's columns: its names (and a PostgreSQL source's exact types) read by
running its query without rows, and matched to the target's columns by name."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_pg_bulk.db import driver
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.loading.database import arrow_readers, row_readers
from airflow_pg_bulk.loading.database.connections import (
    alchemy_connection,
    postgres_session,
    query_refused,
    reason,
)
from airflow_pg_bulk.loading.database.urls import held_url
from airflow_pg_bulk.plan import DatabaseSource
from airflow_pg_bulk.source import header
from airflow_pg_bulk.sql import source as source_sql


def source_columns(source: DatabaseSource) -> tuple[str, ...]:
    """The source's column names, in its order; its query is run without rows first, so one
    that cannot run fails before anything is made."""
    return source_description(source)[0]


def source_description(
    source: DatabaseSource,
) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """The source's column names, in its order; for a PostgreSQL source their exact types
    (:attr:`DatabaseSource.types`; another database's: empty); for another database the
    Arrow reader that reads its rows exactly, if one is installed
    (:func:`.arrow_readers.choose`; None: the rows path). Its query is run without rows
    first, so one that cannot run fails before anything is made; through the C extension's
    module where that reads the source (:func:`.row_readers.column_names`), else SQLAlchemy,
    whose error is the one said."""
    if source.postgres:
        with postgres_session(source.name) as conn:  # (psycopg 3: its result's type modifiers)
            statement = source_sql.no_rows(source_sql.source_select(source.query, source.table))
            try:
                with driver.plain_cursor(conn) as cur:
                    cur.execute(statement)
                    names = tuple(d.name for d in cur.description)
                    result = cur.pgresult
                    oids = [result.ftype(i) for i in range(len(names))]
                    modifiers = [result.fmod(i) for i in range(len(names))]
                types = driver.scalar(conn, source_sql.exact_types(oids, modifiers))
                return names, tuple(types), None
            except Exception as exc:
                raise query_refused(source, reason(exc, held_url(source.name))) from None
    no_rows = source_sql.alchemy_no_rows(source.query, source.table)
    names = row_readers.column_names(source.name, no_rows)
    if names is not None:  # (MariaDB/MySQL: no Arrow reader reads it, READERS read SQLite)
        return names, (), None
    with alchemy_connection(source.name) as conn:
        try:
            result = conn.execute(no_rows)
            try:
                names = tuple(result.keys())
            finally:
                result.close()
        except Exception as exc:
            raise query_refused(source, reason(exc, held_url(source.name))) from None
        return names, (), arrow_readers.choose(source, conn.engine.url, conn)


def match_names(names: Sequence[str], loadable: Sequence[str], where: str) -> list[str]:
    """Each source column's target column, by name (:func:`.header.match_columns`: exactly,
    else case-insensitively when that names one column); refused in the query's words."""
    try:
        return header.match_columns(names, loadable, what=f"the source {where}:")
    except LoadRefusedError as exc:
        raise LoadRefusedError(
            f"{exc}. Nothing was changed; rename the source's columns in the query "
            "(SELECT x AS y) or leave them out"
        ) from None
