"""``create_target``: a missing target table created from its source's schema, before prepare
captures the target. The schema comes from the source the request names, chosen once by
:meth:`airflow_pg_bulk.loading.sources.Source.target_schema`: a database source's columns (a
PostgreSQL source's exact types; another database's types mapped through SQLAlchemy) or a
Parquet file's (its Arrow types mapped to PostgreSQL's). Each column's type and NOT NULL,
and the primary key where the source has one; nothing else (no default, index or other
constraint). An existing target is never altered."""

from __future__ import annotations

import logging
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import driver
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.loading import sources
from airflow_pg_bulk.plan import LoadRequest
from airflow_pg_bulk.sql import source as source_sql

log = logging.getLogger(__name__)


def create_target_if_missing(
    conn: Any, request: LoadRequest, load_id: str, schema: str, table: str
) -> bool:
    """When ``schema.table`` does not exist, create it (committed) from the source's schema;
    a type the target database does not have (an extension's) is refused, nothing made.
    An existing target is left exactly as it is, and the transaction that found it (one read,
    no lock) left open for prepare's capture of it. Returns whether it was created."""
    if driver.scalar(conn, sql.relation_exists(schema, table)):
        return False
    conn.rollback()
    (columns, key), what = sources.for_request(request).target_schema(request)
    types = [t for _, t, _ in columns]
    unknown = [t for t, known in driver.execute(conn, source_sql.known_types(types)) if not known]
    if unknown:
        conn.rollback()
        raise LoadRefusedError(
            f"create_target: the target database has no type {', '.join(unknown)} (a type of "
            f"the source's columns); nothing was changed. Create {schema}.{table} first"
        )
    try:
        driver.execute(conn, source_sql.create_target(schema, table, columns, key))
        conn.commit()
    except BaseException:
        driver.rollback_quietly(conn)
        raise
    log.info(
        "Load %s: created the target %s.%s (create_target) from %s: %s%s",
        load_id,
        schema,
        table,
        what,
        ", ".join(f"{n} {t}{' NOT NULL' if nn else ''}" for n, t, nn in columns),
        f"; primary key ({', '.join(key)})" if key else "",
    )
    return True
