"""The COPY step of a database source: one range into staging, by the first of its ways
(:func:`ways`, chosen from its URL and what prepare found) that moves it, rows read counted
against rows loaded."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.errors import SourceReadError
from airflow_pg_bulk.loading.database import arrow_copy, lines_copy, postgres_copy, rows_copy
from airflow_pg_bulk.loading.database.format import TEXT
from airflow_pg_bulk.loading.database.ranges import range_text
from airflow_pg_bulk.loading.database.snapshots import range_done
from airflow_pg_bulk.plan import LoadPlan, Piece

log = logging.getLogger(__name__)


def copy_piece(
    conn: Any,
    plan: LoadPlan,
    piece: Piece,
    progress: Any = None,
    done: int = 0,
    expected: int = 0,
) -> tuple[int, int]:
    """COPY the source's rows into staging, in the caller's transaction (the signature of
    :func:`airflow_pg_bulk.loading.parquet_copy.copy_piece`). Returns ``(rows, bytes)``.

    :raises SourceReadError: the source failed midway, or its row count is not COPY's.
    :raises BadDataError: a value the target's column does not take."""
    source = plan.database
    assert source is not None
    bounds = (piece.key_range or (None, None))[:2]
    t = plan.target
    statement = sql.copy_from_stdin(t.schema, plan.staging_table, plan.columns, TEXT)
    moved = None
    try:
        for way in ways(plan):
            moved = way.copy(conn, plan, bounds, statement)
            if moved is not None:
                how = way.how
                break
    finally:
        range_done(source.snapshot)  # (a PostgreSQL source's held snapshot: one range less)
    assert moved is not None  # the last way moves the range or raises
    loaded, read, sent = moved
    if read != loaded:
        raise SourceReadError(
            f"Load {plan.load_id}: the source {source.name} gave {read} rows but COPY "
            f"loaded {loaded} into {t.qualified}; nothing of this COPY stream was committed"
        )
    log.info(
        "Load %s: read %d rows (%.1f MB) from %s%s by %s",
        plan.load_id,
        loaded,
        sent / 1e6,
        source.name,
        range_text(source, bounds),
        how,
    )
    return loaded, sent


#: what a way returns: (rows loaded, rows read from the source, bytes), or None: not moved
#: (nothing of it left in staging), try the next way
Moved = tuple[int, int | None, int] | None


@dataclass(frozen=True)
class Way:
    """One way to COPY a range into staging.

    :param how: what the log line says it was read by.
    :param copy: ``copy(conn, plan, bounds, statement)`` (``statement``: the text-format
        ``COPY ... FROM STDIN`` of staging), :data:`Moved`."""

    how: str
    copy: Callable[[Any, LoadPlan, tuple[Any, Any], Any], Moved]


def ways(plan: LoadPlan) -> list[Way]:
    """The ways a range of the plan's source is tried, in turn, the first that moves it
    winning; each that fails leaves staging as it was, the last moves it or fails naming
    why (a value refused, with its row and column; the source's error).

    - PostgreSQL: binary ``COPY TO STDOUT`` where the column types match
      (:func:`.postgres_copy.moves_binary`), then ``COPY TO STDOUT`` in text;
    - another database: Arrow record batches where prepare chose an Arrow reader
      (:attr:`DatabaseSource.arrow`), then COPY text lines made by the source server (a
      ``mysql+pymysql`` source over utf8mb4, every column of a type it renders:
      :mod:`.lines_copy`), then rows from a server-side cursor
      (:mod:`.rows_copy`)."""
    source = plan.database
    assert source is not None
    if source.postgres:
        binary = Way(
            "binary COPY TO STDOUT",
            lambda conn, plan, bounds, _: postgres_copy.copy_range_binary(conn, plan, bounds),
        )
        text = Way("COPY TO STDOUT", postgres_copy.copy_range)
        return [binary, text] if postgres_copy.moves_binary(plan) else [text]
    arrow = Way(
        f"Arrow record batches ({source.arrow})",
        lambda conn, plan, bounds, _: arrow_copy.copy_range(conn, plan, bounds),
    )
    lines = Way("COPY text lines made by the source server", lines_copy.copy_range)
    rows = Way("a server-side cursor", rows_copy.copy_range)
    return [arrow, lines, rows] if source.arrow is not None else [lines, rows]
