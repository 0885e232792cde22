"""COPY of a Parquet piece: its row groups encoded as COPY CSV by Arrow
(:mod:`airflow_pg_bulk.source.parquet`), sent in batches, and a value PostgreSQL cannot convert
named by file, row group, row and column.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import translate
from airflow_pg_bulk.db.driver import copy_in, is_database_error, server_error
from airflow_pg_bulk.errors import BadDataError, is_data_sqlstate, parse_copy_context
from airflow_pg_bulk.plan import LoadPlan, Piece
from airflow_pg_bulk.source import parquet
from airflow_pg_bulk.source.parquet import (
    COPY_CSV,
    batches,
    damage_named,
    file_columns,
    groups_text,
    newline_counts,
    newlines,
    open_piece,
    row_group,
    text_arrays,
)

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 5.0

ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class _Sent:
    """One batch sent to COPY: batch ``batch`` of row group ``group``, whose first row is row
    ``row`` of the group and ``file_row`` of the file; it holds ``rows`` rows on COPY's lines
    ``line`` (1-based, in this COPY) to ``line + lines - 1`` (COPY counts the line breaks
    inside quoted strings too)."""

    group: int
    batch: int
    row: int
    file_row: int
    rows: int
    line: int
    lines: int


def copy_piece(
    conn: Any,
    plan: LoadPlan,
    piece: Piece,
    progress: ProgressCallback | None = None,
    done: int = 0,
    expected: int = 0,
) -> tuple[int, int]:
    """COPY a Parquet piece's row groups into staging, in the caller's transaction.

    Returns ``(rows, bytes)``: the rows loaded and the piece's compressed bytes.

    :param progress: called with ``(done + bytes read, expected)`` at most every few seconds.
    :raises BadDataError: a value PostgreSQL cannot convert (naming file, row group, row and
        column), or rows lost between the file and the server.
    :raises SourceChangedError: the file is not what prepare read."""
    t = plan.target
    statement = sql.copy_from_stdin(t.schema, plan.staging_table, plan.columns, COPY_CSV)
    sent: list[_Sent] = []
    with open_piece(piece) as parquet_file:
        names = file_columns(parquet_file.schema_arrow.names, plan.columns)
        log.info(
            "Load %s: reading %s row groups %s (%.1f MB)",
            plan.load_id,
            piece.path,
            groups_text(piece.row_groups),
            (piece.size or 0) / 1e6,
        )
        chunks = _encoded(parquet_file, piece, names, sent, progress, done, expected)
        try:
            loaded = copy_in(conn, statement, chunks)
        except Exception as exc:
            raise _copy_error(exc, plan, piece, sent, parquet_file, names) from exc
    rows = sum(s.rows for s in sent)
    if loaded != rows:
        raise BadDataError(
            f"{piece.path} row groups {groups_text(piece.row_groups)}: COPY reported {loaded} "
            f"rows where {rows} were sent. Nothing of this load reached {t.qualified}.",
            path=piece.path,
        )
    return loaded, piece.size or 0


def _encoded(
    parquet_file: Any,
    piece: Piece,
    names: Sequence[str],
    sent: list[_Sent],
    progress: ProgressCallback | None,
    done: int,
    expected: int,
) -> Iterator[bytes]:
    """The piece's rows as CSV, a batch at a time; ``sent`` grows as they go."""
    metadata = parquet_file.metadata
    before = [0]
    for i in range(metadata.num_row_groups):
        before.append(before[-1] + metadata.row_group(i).num_rows)
    line = 1
    read = 0
    last = time.monotonic()
    for group in piece.row_groups:
        row = 0
        for n, batch in enumerate(damage_named(batches(parquet_file, group, names), piece, group)):
            arrays = text_arrays(batch, names)
            lines = batch.num_rows + newlines(arrays)
            sent.append(_Sent(group, n, row, before[group] + row, batch.num_rows, line, lines))
            yield parquet.encode(arrays, names, piece.path, group, row)
            row += batch.num_rows
            line += lines
        read += row_group(metadata, group).end - row_group(metadata, group).start
        now = time.monotonic()
        if progress and now - last >= PROGRESS_SECONDS:
            last = now
            progress(done + read, expected)


def _copy_error(
    exc: Exception,
    plan: LoadPlan,
    piece: Piece,
    sent: Sequence[_Sent],
    parquet_file: Any,
    names: Sequence[str],
) -> Exception:
    """A data error named by file, row group, row and column; anything else as any COPY's."""
    if not is_database_error(exc):
        return exc
    err = server_error(exc)
    if not is_data_sqlstate(err.sqlstate):
        return translate.copy_error(exc, plan, piece)
    line, column, quoted = parse_copy_context(err.context)
    where = piece.path
    batch = next((s for s in sent if line and s.line <= line < s.line + s.lines), None)
    if batch is not None:
        offset = _row_at(parquet_file, names, batch, line)
        where += (
            f" row group {batch.group}, row {batch.row + offset} "
            f"(row {batch.file_row + offset} of the file; both counted from 0)"
        )
    return translate.bad_value(err, plan, piece.path, where, column, quoted)


def _row_at(parquet_file: Any, names: Sequence[str], sent: _Sent, line: int) -> int:
    """Which row of a batch sent is on COPY's ``line``: the batch is read again and its
    strings' line breaks counted (none: the row is the line's offset)."""
    if sent.lines == sent.rows:
        return line - sent.line
    batch = next(itertools.islice(batches(parquet_file, sent.group, names), sent.batch, None))
    ends = itertools.accumulate(1 + n for n in newline_counts(text_arrays(batch, names)))
    return next(k for k, end in enumerate(ends) if sent.line + end > line)
