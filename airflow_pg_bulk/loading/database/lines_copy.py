"""The rows path's fast reader for a MariaDB/MySQL source: the source server makes each row of
a range one line of PostgreSQL's COPY text format (:mod:`airflow_pg_bulk.sql.copy_lines`), the
reader fetches one bytes value a row (``lines`` of :mod:`.row_readers`' readers) and the
lines go, joined into chunks, straight into ``COPY ... FROM STDIN`` of staging: no Python value
is made per column. Under a savepoint: when anything fails (the source, a value the target
refuses), the savepoint undoes the rows and the caller reads the range again by the rows path
(:mod:`.rows_copy`), which loads it after all or fails naming the source's error, or the
range, the row, the split key's value and the column of the value refused."""

from __future__ import annotations

import logging
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import driver
from airflow_pg_bulk.loading.database.row_readers import reader_for
from airflow_pg_bulk.loading.database.urls import held_url
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.sql import source as source_sql

log = logging.getLogger(__name__)

_LINES = "pgbulk_lines"


def copy_range(
    conn: Any, plan: LoadPlan, bounds: tuple[Any, Any], statement: Any
) -> tuple[int, int, int] | None:
    """A range of the source read as COPY text lines made by the source server and COPYed by
    ``statement`` (text format) on ``conn``; (rows loaded, rows read, bytes), or None when
    its reader makes no lines of it (not PyMySQL's URL, a column of a type without a line)
    or it failed (nothing of it is left in staging: read it again by the rows path)."""
    source = plan.database
    assert source is not None
    rows = source_sql.alchemy_range_rows(source.query, source.table, source.split_by or "", bounds)
    saved = False
    try:
        with reader_for(source.name).lines(source.name, rows) as lines:
            if lines is None:
                return None
            driver.execute(conn, sql.savepoint(_LINES))
            saved = True
            loaded = driver.copy_in(conn, statement, lines)
    except Exception as exc:
        if saved:
            driver.execute(conn, sql.rollback_to(_LINES))
        log.info(
            "Load %s: the COPY lines made by the source failed (%s); the rows are read again",
            plan.load_id,
            driver.redact(str(exc).strip().split("\n")[0], held_url(source.name)),
        )
        return None
    driver.execute(conn, sql.release(_LINES))
    return loaded, lines.rows, lines.bytes
