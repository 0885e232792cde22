"""Copy a piece while setting bad rows aside (``on_error="reject"``).

Two ways, both inside the partition's transaction and under a savepoint:

- PostgreSQL 17+: ``COPY ... ON_ERROR ignore, LOG_VERBOSITY verbose`` (and ``REJECT_LIMIT`` on
  18+) skips rows whose values do not convert, in one pass, and names each in a NOTICE
  (line and column). Each skipped record is read back from the file and run alone through a
  plain COPY under a savepoint (then rolled back) to get the server's exact error text.
- Any version, and any row error ``ON_ERROR`` does not cover (too many or too few fields, a bad
  encoding, NULL into NOT NULL): COPY stops at the first bad row and names it (``line N``).
  Roll back to the savepoint, copy the rows before it again, record it, go on after it. Each
  bad row costs one re-send of the rows since the previous one: below twice the piece's bytes.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from typing import Any

from airflow_pg_bulk import accounting, naming, records, sources, splitting, sql
from airflow_pg_bulk.driver import (
    collect_notices,
    copy_in,
    execute,
    is_database_error,
    server_error,
    server_version,
)
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
    rule: records.MarkerRule,
) -> PieceOutcome:
    """Load ``piece``, recording each bad row in the plan's reject table.

    ``rejected_before``: rows this partition rejected in earlier pieces (the limit counts them).
    ``wrap`` wraps each byte stream (progress counting); ``rule``: the server's end-of-data
    marker rule. Every COPY here is row-accounted (:mod:`~airflow_pg_bulk.accounting`)."""
    assert plan.reject_table is not None
    target = plan.target.qualified
    with ExitStack() as stack:
        skipped = _copy_skipping(conn, plan, piece, statement, rejected_before, wrap, rule, stack)
        if skipped is not None:
            return skipped
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
            counter, chunks = accounting.counted_chunks(part, plan.copy, rule, target)
            try:
                loaded = copy_in(conn, statement, wrap(chunks))
                accounting.check_rows(counter, part, plan.copy, target, loaded)
                outcome.rows += loaded
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
                    conn, plan, piece, source, pos, end, record, error.message, statement, outcome,
                    rule,
                )  # fmt: skip
                execute(conn, sql.release(SAVEPOINT))
            if rejected_before + outcome.rejects > plan.errors.max_rejects:
                raise _too_many(plan, piece)
    outcome.bytes = _size(piece)
    return outcome


_SKIPPED = re.compile(r"at line (\d+) for column \"?(.*?)\"?: (?:\"(.*)\"|null input)\s*\Z", re.S)


def _copy_skipping(
    conn: Any,
    plan: LoadPlan,
    piece: Piece,
    statement: sql.Composable,
    rejected_before: int,
    wrap: Wrap,
    rule: records.MarkerRule,
    stack: ExitStack,
) -> PieceOutcome | None:
    """The one-pass way (PostgreSQL 17+); None when it cannot be used or the piece has a row
    error that ``ON_ERROR ignore`` does not skip (then nothing of it was kept)."""
    version = server_version(conn)
    allowance = plan.errors.max_rejects - rejected_before
    if version < 170000 or allowance < 1:
        return None
    t = plan.target
    skipping = sql.copy_from_stdin(
        t.schema,
        plan.staging_table,
        plan.columns,
        plan.copy,
        skip_bad_values=True,
        reject_limit=allowance if version >= 180000 else None,
    )
    execute(conn, sql.savepoint(SAVEPOINT))
    counter, chunks = accounting.counted_chunks(piece, plan.copy, rule, t.qualified)
    with collect_notices(conn) as notices:
        try:
            rows = copy_in(conn, skipping, wrap(chunks))
        except Exception as exc:
            if not is_database_error(exc) or not is_data_sqlstate(server_error(exc).sqlstate):
                raise
            execute(conn, sql.rollback_to(SAVEPOINT))
            execute(conn, sql.release(SAVEPOINT))
            if "REJECT_LIMIT" in server_error(exc).message:
                raise _too_many(plan, piece) from None
            return None
        execute(conn, sql.release(SAVEPOINT))  # (psycopg2 hands over notices only now)
    lines = [int(m.group(1)) for m in map(_SKIPPED.search, notices) if m]
    accounting.check_rows(counter, piece, plan.copy, t.qualified, rows, skipped=len(lines))
    outcome = PieceOutcome(rows=rows, bytes=_size(piece), rejects=len(lines))
    if lines:
        source = _decompressed(stack, piece, plan) if piece.compression else piece
        end = source.end if source.end is not None else os.path.getsize(source.path)
        syntax = sources.syntax_of(plan.copy)
        spans = splitting.record_spans(source.path, source.start, end, lines, syntax)
        newline = splitting.detect_newline(source.path, syntax)
        line, at = 1, 0
        for first, content_end, _next in sorted(spans):
            line += splitting.count_newlines(source.path, at, first, newline=newline)
            at = first
            with open(source.path, "rb") as f:
                f.seek(first)
                raw = f.read(content_end - first)
            _record(conn, plan, piece, line, raw, _exact_error(conn, statement, raw))
    if rejected_before + outcome.rejects > plan.errors.max_rejects:
        raise _too_many(plan, piece)
    return outcome


def _exact_error(conn: Any, statement: sql.Composable, raw: bytes) -> str:
    """The server's own error for one record, from a plain COPY of it alone (rolled back)."""
    execute(conn, sql.savepoint(SAVEPOINT + "_one"))
    try:
        copy_in(conn, statement, [raw + b"\n"])
    except Exception as exc:
        if not is_database_error(exc):
            raise
        return server_error(exc).message
    finally:
        execute(conn, sql.rollback_to(SAVEPOINT + "_one"))
        execute(conn, sql.release(SAVEPOINT + "_one"))
    return "rejected by COPY ON_ERROR ignore"


def _too_many(plan: LoadPlan, piece: Piece) -> BadDataError:
    return BadDataError(
        f"more than max_rejects={plan.errors.max_rejects} rows of the source were "
        f"rejected (the last in {piece.path}); nothing of this load reached "
        f"{plan.target.qualified}. See {'.'.join(plan.reject_table or ())} for "
        f"load {plan.load_id}",
        path=piece.path,
    )


def _record(conn: Any, plan: LoadPlan, piece: Piece, line: int, raw: bytes, error: str) -> None:
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
            error=naming.original_names(plan, error),
        ),
    )
    log.info("Rejected %s line %d: %s", piece.path, line, error)


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
    rule: records.MarkerRule,
) -> int:
    """Re-copy the good rows before the bad record, record the bad one; return where to go on."""
    syntax = sources.syntax_of(plan.copy)
    first, content_end, next_start = splitting.record_span(source.path, pos, end, record, syntax)
    if first > pos:
        before = dataclasses.replace(source, start=pos, end=first)
        target = plan.target.qualified
        counter, chunks = accounting.counted_chunks(before, plan.copy, rule, target)
        loaded = copy_in(conn, statement, chunks)
        accounting.check_rows(counter, before, plan.copy, target, loaded)
        outcome.rows += loaded
    with open(source.path, "rb") as f:
        f.seek(first)
        raw = f.read(content_end - first)
    line, _last = splitting.record_line_numbers(source.path, pos, end, record, syntax)
    _record(conn, plan, piece, line, raw, message)
    outcome.rejects += 1
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
