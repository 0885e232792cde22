"""The PostgreSQL path: a range read by ``COPY (query) TO STDOUT`` on the source and its bytes
streamed into ``COPY ... FROM STDIN`` on the target, in the binary format where the column
types match exactly (under a savepoint that falls back to text), else in text."""

from __future__ import annotations

import logging
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import driver
from airflow_pg_bulk.db.copy_out import SOURCE_DRIVER, CopyOut
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.loading.database.connections import postgres_session
from airflow_pg_bulk.loading.database.snapshots import held
from airflow_pg_bulk.loading.database.streaming import copy_from_source
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.sql import source as source_sql

log = logging.getLogger(__name__)


def moves_binary(plan: LoadPlan) -> bool:
    """Whether a PostgreSQL source's rows move in the binary format
    (:meth:`DatabaseSource.binary_into` the loaded columns' types): no value is printed as
    text by the source and parsed again by the target (a float's shortest exact text is
    the costliest: 2.2x the time of the whole COPY pair for workload A, see
    benchmarks/RESULTS-db-source.md)."""
    source = plan.database
    assert source is not None
    by_name = {c.name: c.type for c in plan.target.columns}
    return source.binary_into([by_name.get(name, "") for name in plan.columns])


def copy_range(
    conn: Any, plan: LoadPlan, bounds: tuple[Any, Any], statement: Any, binary: bool = False
) -> tuple[int, int | None, int]:
    """A PostgreSQL source's range read by ``COPY ... TO STDOUT`` and its bytes streamed into
    ``statement`` on ``conn``; (rows loaded, rows the source sent, bytes)."""
    source = plan.database
    assert source is not None
    if source.by_blocks:
        assert source.table is not None
        select = source_sql.block_range(source.table, *bounds)
    else:
        select = source_sql.key_range(
            source_sql.source_select(source.query, source.table), source.split_by or "", *bounds
        )
    with (
        postgres_session(source.name, held(source.snapshot), SOURCE_DRIVER) as src,
        CopyOut(src, source_sql.copy_out(select, binary=binary)) as reader,
    ):
        loaded = copy_from_source(
            plan, lambda chunks: driver.copy_in(conn, statement, chunks), reader, bounds
        )
    return loaded, reader.rows, reader.bytes


_BINARY = "pgbulk_binary"


def copy_range_binary(
    conn: Any, plan: LoadPlan, bounds: tuple[Any, Any]
) -> tuple[int, int | None, int] | None:
    """:func:`copy_range` in the binary format, under a savepoint. None when the target
    refused a value (the savepoint undoes the rows): the caller reads the range again as
    text, whose error names the row, the column and the value (binary COPY's names no
    value), or which loads it after all."""
    t = plan.target
    statement = source_sql.copy_binary_in(t.schema, plan.staging_table, plan.columns)
    driver.execute(conn, sql.savepoint(_BINARY))
    try:
        moved = copy_range(conn, plan, bounds, statement, binary=True)
    except BadDataError as exc:
        driver.execute(conn, sql.rollback_to(_BINARY))
        log.info(
            "Load %s: the binary COPY was refused (%s); the rows are read again as text",
            plan.load_id,
            exc,
        )
        return None
    driver.execute(conn, sql.release(_BINARY))
    return moved
