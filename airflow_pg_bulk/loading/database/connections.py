"""Sessions on a database source: a read-only PostgreSQL session (psycopg, in UTF-8, in an
exported snapshot when given) and a SQLAlchemy connection to any other database; a source
driver's error in words, its password masked."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import driver, source_driver
from airflow_pg_bulk.errors import LoadRefusedError, PgBulkError, TransientLoadError
from airflow_pg_bulk.loading.database.urls import held_url, libpq_url
from airflow_pg_bulk.plan import DatabaseSource
from airflow_pg_bulk.sql import source as source_sql


@contextlib.contextmanager
def postgres_session(
    name: str, snapshot: str | None = None, driver_name: str = "psycopg"
) -> Iterator[Any]:
    """A read-only session on a PostgreSQL source (psycopg 3's, or ``driver_name``'s), in
    UTF-8; its transaction in ``snapshot`` (exported by the session :func:`.snapshots.export` holds)
    when one is given."""
    conn = open_postgres(name, driver_name)
    try:
        if snapshot is not None:
            driver.execute(conn, source_sql.repeatable_read())
            driver.execute(conn, source_sql.set_snapshot(snapshot))
        yield conn
    finally:
        driver.close_cancelling(conn)


def open_postgres(name: str, driver_name: str = "psycopg") -> Any:
    url = held_url(name)
    try:
        conn = driver.connect(
            libpq_url(url), driver_name, application_name="airflow-pg-bulk source"
        )
    except PgBulkError as exc:
        raise type(exc)(f"source {name}: {exc}; nothing was changed") from None
    try:
        driver.execute(conn, sql.set_config("default_transaction_read_only", "on"))
        driver.execute(conn, sql.set_config("client_encoding", "UTF8"))
        conn.commit()  # a snapshot is set only as a transaction's first statement
    except BaseException:
        driver.close_cancelling(conn)
        raise
    return conn


@contextlib.contextmanager
def alchemy_connection(name: str, copy: bool = False) -> Iterator[Any]:
    """A SQLAlchemy connection to another database; for the COPY step's reading (``copy``),
    its driver asked for values as the server's text where that is COPY's text
    (:func:`airflow_pg_bulk.db.source_driver.copy_connect_args`)."""
    import sqlalchemy

    url = held_url(name)
    try:
        driver_name = sqlalchemy.engine.make_url(url).get_driver_name()
        connect_args = source_driver.copy_connect_args(driver_name) if copy else {}
        engine = sqlalchemy.create_engine(url, connect_args=connect_args)
    except Exception as exc:
        raise LoadRefusedError(
            f"source {name}: cannot use the URL ({driver.redact(str(exc), url)}); "
            "nothing was changed"
        ) from None
    try:
        try:
            conn = engine.connect()
        except Exception as exc:
            raise TransientLoadError(
                f"source {name}: cannot connect to the database: {reason(exc, url)}; "
                "nothing was changed"
            ) from None
        with conn:
            yield conn
    finally:
        engine.dispose()


def reason(exc: BaseException, url: str) -> str:
    """A source driver's error in words: its first line, the password masked."""
    cause = getattr(exc, "orig", None) or exc
    text = str(cause).strip().split("\n")[0] or type(cause).__name__
    return driver.redact(text, url)


def query_refused(source: DatabaseSource, reason: str) -> LoadRefusedError:
    what = f"table {source.table}" if source.table else "query"
    return LoadRefusedError(
        f"the source {what} on {source.name} cannot be read: {reason}. Nothing was changed; "
        f"fix the {'source_table' if source.table else 'query'} and run the load again"
    )
