"""The chain check of speculative pieces (:mod:`~airflow_pg_bulk.ranges`): a COPY task finds its
piece misaligned, finalize loads the file's pieces again from exact bounds.

A COPY task marks its partition misaligned, with no rows, when a speculative piece's last
record does not end exactly at the piece's end (the next piece's guessed start was inside a
quoted field), or when its COPY failed on bad data and the exact splitter shows its bounds
were wrong. Finalize, before anything is visible, calls :func:`repair`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from airflow_pg_bulk import ranges, records, sources, sql
from airflow_pg_bulk.driver import execute, rollback_quietly
from airflow_pg_bulk.plan import CopyOptions, LoadPlan, Piece
from airflow_pg_bulk.plan.figures import PartitionResult

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
    return sources.piece_ends_file(piece)


def aligned(piece: Piece, opts: CopyOptions) -> bool:
    """Whether the piece's bounds are record starts, read exactly: its end from its start,
    then its start from the file's start (the serial scan: only on a failure path, and for
    ``on_error='reject'``, which sets rows aside only from proven bounds)."""
    syntax = sources.syntax_of(opts)
    end = piece.end if piece.end is not None else piece.start
    with sources.open_source(piece.path, piece.conn_id) as (f, size):
        if not ranges.ends_cleanly(f, size, piece.start, end, syntax):
            return False
        return bool(piece.first_line) or ranges.is_record_start(f, size, piece.start, syntax)


def record_misaligned(
    conn: Any, plan: LoadPlan, index: int, exc: Misaligned, seconds: float
) -> PartitionResult:
    """Commit the partition with no rows, marked for finalize to load from exact bounds."""
    try:
        execute(conn, sql.record_misaligned(plan.target.schema, plan.ledger_table, index))
        conn.commit()
    except BaseException:
        rollback_quietly(conn)
        raise
    log.warning(
        "Partition %d of load %s: %s; nothing of it was kept, finalize loads it again from "
        "exact record starts",
        index,
        plan.load_id,
        exc,
    )
    return PartitionResult(index, 0, 0, seconds)


def repaired_plan(plan: LoadPlan, flagged: set[int]) -> tuple[LoadPlan, list[int]]:
    """The plan with exact bounds for every file that has a piece in a ``flagged`` partition,
    and the partitions to load again: the flagged ones and those holding a piece whose bounds
    change. Deterministic in the plan and ``flagged``: a repair cut short is done again the
    same way."""
    syntax = sources.syntax_of(plan.copy)
    bad = {
        piece
        for part in plan.partitions
        if part.index in flagged
        for piece in part.pieces
        if piece.speculative
    }
    exact: dict[Piece, Piece] = {}
    for path, pieces in ranges.file_pieces(plan.partitions).items():
        if bad.intersection(pieces):
            with sources.open_source(path, pieces[0].conn_id) as (f, size):
                exact.update(ranges.exact_pieces(pieces, syntax, f, size))
    moved = {x for x, y in exact.items() if (x.start, x.end) != (y.start, y.end)}
    redo = sorted(flagged | {p.index for p in plan.partitions if moved.intersection(p.pieces)})
    partitions = tuple(
        dataclasses.replace(p, pieces=tuple(exact.get(x, x) for x in p.pieces))
        if p.index in redo
        else p
        for p in plan.partitions
    )
    return dataclasses.replace(plan, partitions=partitions), redo


def repair(conn: Any, plan: LoadPlan) -> list[int]:
    """Load again, from exact record starts, the partitions a COPY task found misaligned and
    those their files' exact bounds change; returns them. Each partition's old rows are
    deleted and its rows loaded in one transaction; the set to redo is marked in the ledger
    first, so that a repair cut short is finished by the next finalize."""
    from airflow_pg_bulk import steps  # steps imports finalize, which calls this

    if not any(piece.speculative for part in plan.partitions for piece in part.pieces):
        return []  # no guessed bound: nothing can be misaligned (and no query to make)
    t = plan.target
    flagged = {
        row[0] for row in execute(conn, sql.misaligned_partitions(t.schema, plan.ledger_table))
    }
    conn.commit()
    if not flagged:
        return []
    fixed, redo = repaired_plan(plan, flagged)
    log.warning(
        "Load %s: partitions %s began or ended inside a record; loading partitions %s again "
        "from exact record starts (nothing is visible yet)",
        plan.load_id,
        sorted(flagged),
        redo,
    )
    try:
        execute(conn, sql.mark_misaligned(t.schema, plan.ledger_table, redo))
        conn.commit()
        for index in redo:
            execute(
                conn,
                sql.delete_partition_rows(t.schema, plan.staging_table, plan.ledger_table, index),
            )
            execute(conn, sql.forget_partition(t.schema, plan.ledger_table, index))
            steps.copy_partition(conn, fixed, index)  # commits the deletes with the rows
    except BaseException:
        rollback_quietly(conn)
        raise
    return redo
