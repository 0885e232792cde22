"""The chain check of speculative pieces (:mod:`~airflow_pg_bulk.source.window`): a COPY task
finds its piece misaligned, finalize loads the file's pieces again from exact bounds
(:mod:`airflow_pg_bulk.loading.repair`).

A COPY task marks its partition misaligned, with no rows, when a speculative piece's last
record does not end exactly at the piece's end (the next piece's guessed start was inside a
quoted field), or when its COPY failed on bad data and the exact splitter shows its bounds
were wrong. Finalize, before anything is visible, calls
:func:`airflow_pg_bulk.loading.repair.repair`.
"""

from __future__ import annotations

import logging

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, rollback_quietly
from airflow_pg_bulk.plan import CopyOptions, LoadPlan, Piece
from airflow_pg_bulk.plan.figures import PartitionResult
from airflow_pg_bulk.source import reading, records, window
from airflow_pg_bulk.source.syntax import RecordSyntax

log = logging.getLogger(__name__)


class Misaligned(Exception):
    """A speculative piece's bytes do not begin or end at record starts."""

    def __init__(self, piece: Piece) -> None:
        super().__init__(
            f"{piece.path} bytes {piece.start}-{piece.end}: a guessed record start was wrong"
        )
        self.piece = piece


def check_end(counter: records.RecordCounter, piece: Piece) -> None:
    """After a speculative piece's COPY: its last record must end exactly at its end."""
    if piece.speculative and not counter.ends_at_record_start and not _ends_file(piece):
        raise Misaligned(piece)


def _ends_file(piece: Piece) -> bool:
    return reading.piece_ends_file(piece)


def aligned(piece: Piece, opts: CopyOptions) -> bool:
    """Whether the piece's bounds are record starts, read exactly: its end from its start,
    then its start from the file's start (the serial scan: only on a failure path, and for
    ``on_error='reject'``, which sets rows aside only from proven bounds)."""
    syntax = RecordSyntax.of(opts)
    end = piece.end if piece.end is not None else piece.start
    with reading.open_source(piece.path, piece.conn_id) as (f, size):
        if not window.ends_cleanly(f, size, piece.start, end, syntax):
            return False
        return bool(piece.first_line) or window.is_record_start(f, size, piece.start, syntax)


def record_misaligned(
    conn: DatabaseConnection, plan: LoadPlan, index: int, exc: Misaligned, seconds: float
) -> PartitionResult:
    """Commit the partition with no rows, marked for finalize to load from exact bounds."""
    try:
        execute(conn, sql.record_misaligned(plan.target.schema, plan.ledger_table, index))
        conn.commit()
    except BaseException:
        rollback_quietly(conn)
        raise
    log.warning(
        "Load %s: COPY stream %d: %s; nothing of it was kept, finalize loads it again from "
        "exact record starts",
        plan.load_id,
        index,
        exc,
    )
    return PartitionResult(index, 0, 0, seconds)
