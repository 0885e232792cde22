"""A split source's ranges: the split key's quantiles (a PostgreSQL table's ANALYZE histogram,
its blocks, or ``ntile`` over the rows; through SQLAlchemy for other databases), and a range
in words for the log and the errors."""

from __future__ import annotations

from typing import Any

from airflow_pg_bulk.db import driver
from airflow_pg_bulk.errors import LoadRefusedError, PgBulkError
from airflow_pg_bulk.loading.database.connections import alchemy_connection, query_refused, reason
from airflow_pg_bulk.loading.database.urls import held_url
from airflow_pg_bulk.plan import BLOCKS, DatabaseSource
from airflow_pg_bulk.sql import source as source_sql


def postgres_quantiles(conn: Any, source: DatabaseSource, count: int) -> tuple[Any, ...]:
    """A PostgreSQL source's split key cut into ``count`` ranges of about equal row counts:
    ``(min, cut, ...)``. For a table whose column ANALYZE gave a histogram covering every
    row, its bounds (no row read: the ranges as even as the statistics are fresh); otherwise
    ``ntile`` over the rows (:func:`airflow_pg_bulk.sql.source.key_quantiles`)."""
    assert source.split_by is not None
    if source.by_blocks:
        assert source.table is not None  # (match refused a query)
        if driver.server_version(conn) < 140000:
            raise LoadRefusedError(
                f"split_by={BLOCKS!r} reads ranges of a table's blocks by TID range scans, "
                f"which need PostgreSQL 14 or later; the source {source.name} is older. Split "
                "by a column instead; nothing was changed"
            )
        blocks = int(driver.scalar(conn, source_sql.block_count(source.table)))
        return (0, *(blocks * i // count for i in range(1, count)))
    if source.table is not None and count > 1:
        found = driver.execute(conn, source_sql.key_histogram(source.table, source.split_by))
        bounds = [_statistic_value(v) for v in found[0][0]] if found else []
        if len(bounds) >= count:
            last = len(bounds) - 1
            return (bounds[0], *(bounds[i * last // count] for i in range(1, count)))
    select = source_sql.source_select(source.query, source.table)
    firsts = driver.execute(conn, source_sql.key_quantiles(select, source.split_by, count))
    return tuple(row[0] for row in firsts) or (None,)


def _statistic_value(text: str) -> Any:
    """A histogram bound (text) as the key's value: an integer, or the date's or timestamp's
    ISO text (:func:`airflow_pg_bulk.plan.planning.quantile_ranges` reads both)."""
    try:
        return int(text)
    except ValueError:
        return text


def key_quantiles(source: DatabaseSource, count: int) -> tuple[Any, ...]:
    """The split key of a source read through SQLAlchemy cut into ``count`` ranges of about
    equal row counts: ``(min, cut, ...)``, the smallest key of each ``ntile`` bucket (a
    PostgreSQL source's are read in its exported snapshot: :func:`.snapshots.export`)."""
    assert source.split_by is not None
    try:
        with alchemy_connection(source.name) as conn:
            statement = source_sql.alchemy_key_quantiles(
                source.query, source.table, source.split_by, count
            )
            firsts = tuple(row[0] for row in conn.execute(statement))
    except PgBulkError:
        raise
    except Exception as exc:
        raise query_refused(source, reason(exc, held_url(source.name))) from None
    return firsts or (None,)


def range_text(source: DatabaseSource, bounds: tuple[Any, Any]) -> str:
    """``, day in [2026-01-01, 2026-01-02)`` for a split source's range (the first:
    ``day < 2026-01-02 or NULL``, the last: ``day >= 2026-01-02``); empty otherwise."""
    key = "blocks" if source.by_blocks else source.split_by
    low, high = bounds
    if not key or (low is None and high is None):
        return ""
    if source.by_blocks:
        return (
            f", blocks {'0' if low is None else low} to {'the last' if high is None else high - 1}"
        )
    if low is None:
        return f", {key} < {high} or NULL"
    if high is None:
        return f", {key} >= {low}"
    return f", {key} in [{low}, {high})"
