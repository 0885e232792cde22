"""Copy a piece while setting bad rows aside (``on_error="reject"``).

COPY stops at the first row it cannot parse or convert and names it (``line N``). Inside the
partition's transaction, under a savepoint: roll back to the savepoint, copy the rows before the
bad one again, record the bad one in the reject table, and go on from the row after it. Each
bad row costs one re-send of the rows since the previous one, so the bytes sent stay below
twice the piece's size. This works on every PostgreSQL version; COPY's own ``ON_ERROR ignore``
(17+) skips only type-conversion errors and reports no raw line, so it is not used.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from typing import Any

from airflow_pg_bulk import sources, splitting, sql
from airflow_pg_bulk.driver import copy_in, execute, is_database_error, server_error
from airflow_pg_bulk.errors import BadDataError, is_data_sqlstate, parse_copy_context
from airflow_pg_bulk.plan import LoadPlan, Piece

log = logging.getLogger(__name__)

SAVEPOINT = "pgbulk_piece"

Wrap = Callable[[Iterable[bytes]], Iterable[bytes]]


@dataclasses.dataclass
class PieceOutcome:
    """Rows loaded, bytes read and rows rejected for one piece."""

    rows: int = 0
    bytes: int = 0
    rejects: int = 0


def copy_rejecting(
    conn: Any,
    plan: LoadPlan,
    piece: Piece,
    statement: sql.Composable,
    rejected_before: int,
    wrap: Wrap,
    end_marker: str | None = None,
) -> PieceOutcome:
    """Load ``piece``, recording each bad row in the plan's reject table.

    ``rejected_before``: rows this partition rejected in earlier pieces (the limit counts them).
    ``wrap`` wraps each byte stream (progress counting); ``end_marker``: see
    :func:`~airflow_pg_bulk.sources.piece_chunks`."""
    assert plan.reject_table is not None
    outcome = PieceOutcome()
    with ExitStack() as stack:
        source = piece
        pos = piece.start
        while True:
            end = source.end if source.end is not None else os.path.getsize(source.path)
            if pos >= end and source.compression is None:
                break
            execute(conn, sql.savepoint(SAVEPOINT))
            part = dataclasses.replace(
                source, start=pos, end=end if source.compression is None else None
            )
            try:
                outcome.rows += copy_in(
                    conn,
                    statement,
                    wrap(sources.piece_chunks(part, plan.copy, refuse_end_marker=end_marker)),
                )
                execute(conn, sql.release(SAVEPOINT))
                break
            except Exception as exc:
                record = _bad_record(exc)
                if record is None:
                    raise
                execute(conn, sql.rollback_to(SAVEPOINT))
                if source.compression:
                    source = _decompressed(stack, source, plan)
                    pos = source.start
                    continue  # the same error again, now with offsets into a plain file
                error = server_error(exc)
                pos = _set_aside(
                    conn, plan, piece, source, pos, end, record, error.message, statement, outcome
                )
                execute(conn, sql.release(SAVEPOINT))
            if rejected_before + outcome.rejects > plan.errors.max_rejects:
                raise BadDataError(
                    f"more than max_rejects={plan.errors.max_rejects} rows of the source were "
                    f"rejected (the last in {piece.path}); nothing of this load reached "
                    f"{plan.target.qualified}. See {'.'.join(plan.reject_table)} for "
                    f"load {plan.load_id}",
                    path=piece.path,
                )
    outcome.bytes = _size(piece)
    return outcome


def _bad_record(exc: Exception) -> int | None:
    """The COPY line number of a row-level data error, or None for any other error."""
    if not is_database_error(exc):
        return None
    err = server_error(exc)
    if not is_data_sqlstate(err.sqlstate):
        return None
    record, _column, _value = parse_copy_context(err.context)
    return record


def _set_aside(
    conn: Any,
    plan: LoadPlan,
    piece: Piece,
    source: Piece,
    pos: int,
    end: int,
    record: int,
    message: str,
    statement: sql.Composable,
    outcome: PieceOutcome,
) -> int:
    """Re-copy the good rows before the bad record, record the bad one; return where to go on."""
    syntax = sources.syntax_of(plan.copy)
    first, content_end, next_start = splitting.record_span(source.path, pos, end, record, syntax)
    if first > pos:
        before = dataclasses.replace(source, start=pos, end=first)
        outcome.rows += copy_in(conn, statement, sources.piece_chunks(before, plan.copy))
    with open(source.path, "rb") as f:
        f.seek(first)
        raw = f.read(content_end - first)
    line, _last = splitting.record_line_numbers(source.path, pos, end, record, syntax)
    schema, table = plan.reject_table or ("", "")
    execute(
        conn,
        sql.insert_reject(
            schema,
            table,
            load_id=plan.load_id,
            target=plan.target.qualified,
            source_file=piece.path,
            line=line,
            raw_line=raw.decode(sources.python_encoding(plan.copy.encoding), "replace").replace(
                "\x00", "\ufffd"
            ),
            error=message,
        ),
    )
    outcome.rejects += 1
    log.info("Rejected %s line %d: %s", piece.path, line, message)
    return next_start


def _decompressed(stack: ExitStack, piece: Piece, plan: LoadPlan) -> Piece:
    """The gzip piece as a plain temporary file (byte offsets are needed to skip rows)."""
    tmp = stack.enter_context(tempfile.NamedTemporaryFile(suffix=".pgbulk"))  # noqa: SIM115
    with gzip.open(piece.path, "rb") as src:
        shutil.copyfileobj(src, tmp)
    tmp.flush()
    start = 0
    if piece.skip_header:
        with open(tmp.name, "rb") as f:
            start = len(splitting.first_record(f, sources.syntax_of(plan.copy)))
    return Piece(tmp.name, start, os.path.getsize(tmp.name), 1)


def _size(piece: Piece) -> int:
    if piece.end is not None:
        return piece.end - piece.start
    return os.path.getsize(piece.path)
