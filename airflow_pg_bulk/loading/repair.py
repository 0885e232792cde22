"""Finalize's repair of misaligned partitions: a COPY task found a speculative piece's guessed
bounds wrong (:mod:`airflow_pg_bulk.loading.alignment`); before anything is visible, finalize
loads again, from exact record starts, the pieces of the files concerned (:func:`repair`).
"""

from __future__ import annotations

import dataclasses
import logging

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, rollback_quietly
from airflow_pg_bulk.loading import copy
from airflow_pg_bulk.plan import LoadPlan, Piece
from airflow_pg_bulk.source import reading, window
from airflow_pg_bulk.source.syntax import RecordSyntax

log = logging.getLogger(__name__)


def repaired_plan(plan: LoadPlan, flagged: set[int]) -> tuple[LoadPlan, list[int]]:
    """The plan with exact bounds for every file that has a piece in a ``flagged`` partition,
    and the partitions to load again: the flagged ones and those holding a piece whose bounds
    change. Deterministic in the plan and ``flagged``: a repair cut short is done again the
    same way."""
    syntax = RecordSyntax.of(plan.copy)
    bad = {
        piece
        for part in plan.partitions
        if part.index in flagged
        for piece in part.pieces
        if piece.speculative
    }
    exact: dict[Piece, Piece] = {}
    for path, pieces in window.file_pieces(plan.partitions).items():
        if bad.intersection(pieces):
            with reading.open_source(path, pieces[0].conn_id) as (f, size):
                exact.update(window.exact_pieces(pieces, syntax, f, size))
    moved = {x for x, y in exact.items() if (x.start, x.end) != (y.start, y.end)}
    redo = sorted(flagged | {p.index for p in plan.partitions if moved.intersection(p.pieces)})
    partitions = tuple(
        dataclasses.replace(p, pieces=tuple(exact.get(x, x) for x in p.pieces))
        if p.index in redo
        else p
        for p in plan.partitions
    )
    return dataclasses.replace(plan, partitions=partitions), redo


def repair(conn: DatabaseConnection, plan: LoadPlan) -> list[int]:
    """Load again, from exact record starts, the partitions a COPY task found misaligned and
    those their files' exact bounds change; returns them. Each partition's old rows are
    deleted and its rows loaded in one transaction; the set to redo is marked in the ledger
    first, so that a repair cut short is finished by the next finalize."""
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
        "Load %s: COPY streams %s began or ended inside a record; loading COPY streams %s again "
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
            copy.copy_partition(conn, fixed, index)  # commits the deletes with the rows
    except BaseException:
        rollback_quietly(conn)
        raise
    return redo
