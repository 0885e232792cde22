"""The COPY step of a database source: one range into staging, by the PostgreSQL path or the
rows path (chosen once per source from its URL), the rows path by its Arrow reader where
prepare chose one (:attr:`DatabaseSource.arrow`), rows read counted against rows loaded."""

from __future__ import annotations

import logging
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.errors import SourceReadError
from airflow_pg_bulk.loading.database import arrow_copy, postgres_copy, rows_copy
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
    if source.postgres:
        try:
            moved = None
            if postgres_copy.moves_binary(plan):
                moved = postgres_copy.copy_range_binary(conn, plan, bounds)
            how = "binary COPY TO STDOUT"
            if moved is None:  # (not binary, or its rows refused: read again as text)
                moved = postgres_copy.copy_range(conn, plan, bounds, statement)
                how = "COPY TO STDOUT"
            loaded, read, sent = moved
        finally:
            range_done(source.snapshot)
    else:
        moved = None
        if source.arrow is not None:
            moved = arrow_copy.copy_range(conn, plan, bounds)
            how = f"Arrow record batches ({source.arrow})"
        if moved is None:  # (no Arrow reader, or it failed: read again from a cursor)
            moved = rows_copy.copy_range(conn, plan, bounds, statement)
            how = "a server-side cursor"
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
