"""The source's chunks or rows fed to the target's ``COPY ... FROM STDIN``, and a failure named:
the source's (:class:`~airflow_pg_bulk.errors.SourceReadError`), or a value the target
refused, with the range, the row, the column and the split key's value."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from airflow_pg_bulk.db import driver, translate
from airflow_pg_bulk.errors import SourceReadError, is_data_sqlstate, parse_copy_context
from airflow_pg_bulk.loading.database.connections import (
    alchemy_connection,
    postgres_session,
    reason,
)
from airflow_pg_bulk.loading.database.ranges import range_text
from airflow_pg_bulk.loading.database.snapshots import held
from airflow_pg_bulk.loading.database.urls import held_url
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.source import copy_text
from airflow_pg_bulk.sql import source as source_sql

log = logging.getLogger(__name__)


_T = TypeVar("_T")


def copy_from_source(
    plan: LoadPlan,
    copy: Callable[[Iterable[Any]], _T],
    data: Iterable[Any],
    bounds: tuple[Any, Any] = (None, None),
) -> _T:
    """``copy(data)`` (the source's chunks or batches of rows into the target's COPY); a
    failure of the source named as one."""
    source = plan.database
    assert source is not None
    failed: list[BaseException] = []

    def guarded() -> Iterator[Any]:
        try:
            yield from data
        except Exception as exc:
            failed.append(exc)
            raise

    try:
        return copy(guarded())
    except Exception as exc:
        if failed:
            raise SourceReadError(
                f"Load {plan.load_id}: the source {source.name}{range_text(source, bounds)} "
                "failed while it was read: "
                f"{reason(failed[0], held_url(source.name))}. Nothing of this COPY stream was "
                f"committed; {plan.target.qualified} is unchanged"
            ) from None
        if isinstance(exc, driver.RowNotEncoded):  # refused by the driver, not the server
            column = plan.columns[exc.column] if exc.column is not None else None
            shown = None if exc.column is None else copy_text.field(exc.value)
            where = f"source {source.name}{range_text(source, bounds)}"
            where += f", row {exc.row} of its COPY stream"
            where += _rejected_key(plan, bounds, exc.row, column, shown)
            err = driver.ServerError(None, str(exc), None, None, None)
            raise translate.bad_value(
                err, plan, source.name, where, column, shown, exc.row
            ) from None
        if driver.is_database_error(exc):
            err = driver.server_error(exc)
            if is_data_sqlstate(err.sqlstate):  # a value the target's column does not take
                row, column, value = parse_copy_context(err.context)
                where = f"source {source.name}{range_text(source, bounds)}"
                where += f", row {row} of its COPY stream" if row is not None else ""
                where += _rejected_key(plan, bounds, row, column, value)
                raise translate.bad_value(
                    err, plan, source.name, where, column, value, row
                ) from None
        raise


def _rejected_key(
    plan: LoadPlan,
    bounds: tuple[Any, Any],
    row: int | None,
    column: str | None,
    value: str | None,
) -> str:
    """``", id = 2998"``: the split key of the row COPY rejected, re-read from the source (its
    row ``row`` of the range, in the order the source returns it; in the held snapshot for a
    PostgreSQL source read in-process). Said only when the re-read row's value in the
    rejected column is the one COPY rejected (a source whose order changed in between gives
    nothing rather than a wrong key); empty without a split key, or when it cannot be read."""
    source = plan.database
    assert source is not None
    if not source.split_by or source.by_blocks or row is None or value is None:
        return ""
    if column not in plan.columns:
        return ""
    name = source.columns[plan.columns.index(column)] if source.columns else column
    try:
        if source.postgres:
            select = source_sql.key_range(
                source_sql.source_select(source.query, source.table), source.split_by, *bounds
            )
            with postgres_session(source.name, held(source.snapshot)) as src:
                found = driver.execute(
                    src, source_sql.row_at(select, source.split_by, name, row - 1)
                )
            key, text = found[0] if found else (None, None)
        else:
            statement = source_sql.alchemy_row_at(
                source.query, source.table, source.split_by, name, bounds, row - 1
            )
            with alchemy_connection(source.name) as src:
                key, got = src.execute(statement).one()
            text = got if isinstance(got, str) else copy_text.field(got)
    except Exception as exc:
        log.info("Load %s: the rejected row's key could not be re-read: %s", plan.load_id, exc)
        return ""
    shown = value[:-3] if value.endswith("...") else value  # the server truncates long values
    if text is None or not text.startswith(shown) or (shown == value and text != value):
        return ""
    return f", {source.split_by} = {key}"
