"""The rows path, for any database but PostgreSQL: a range read from a server-side cursor by
the source's reader (:mod:`.row_readers`: SQLAlchemy's, or mysql-connector-python's C
extension for a PyMySQL URL), fetched in batches, and COPYed by the target driver's row writer
(:func:`airflow_pg_bulk.db.driver.copy_rows`), rows counted. For a ``mysql+pymysql``
source, :mod:`.lines_copy` is tried first; this path reads what it does not
(:func:`.piece.ways`)."""

from __future__ import annotations

from typing import Any

from airflow_pg_bulk.db import driver
from airflow_pg_bulk.loading.database.row_readers import reader_for
from airflow_pg_bulk.loading.database.streaming import copy_from_source
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.source import copy_text
from airflow_pg_bulk.sql import source as source_sql


def copy_range(
    conn: Any, plan: LoadPlan, bounds: tuple[Any, Any], statement: Any
) -> tuple[int, int, int]:
    """A range of a source read from a server-side cursor (its reader:
    :func:`.row_readers.reader_for`) and COPYed by ``statement`` on ``conn``; (rows loaded,
    rows read, bytes)."""
    source = plan.database
    assert source is not None
    select = source_sql.alchemy_key_range(
        source.query, source.table, source.split_by or "", *bounds
    )
    with reader_for(source.name).batches(source.name, select) as batches:
        loaded, sent = copy_from_source(
            plan,
            lambda rows: driver.copy_rows(conn, statement, rows, copy_text.of_batches),
            batches,
            bounds,
        )
    return loaded, batches.rows, sent
