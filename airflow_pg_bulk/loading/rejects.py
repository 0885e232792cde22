"""Copy a piece while setting bad rows aside (``on_error="reject"``).

Two ways, both inside the partition's transaction and under a savepoint:

- PostgreSQL 17+: ``COPY ... ON_ERROR ignore, LOG_VERBOSITY verbose`` (and ``REJECT_LIMIT`` on
  18+) skips rows whose values do not convert, in one pass, and names each in a NOTICE
  (line and column). Each skipped record is read back from the file and run alone through a
  plain COPY under a savepoint (then rolled back) to get the server's exact error text.
- Any version, and any row error ``ON_ERROR`` does not cover (too many or too few fields, a bad
  encoding, NULL into NOT NULL), or a piece past the limit: COPY stops at the first bad row and
  names it (``line N``). Roll back to the savepoint, copy the rows before it again, record it,
  go on after it. Each bad row costs one re-send of the rows since the previous one: below
  twice the piece's bytes.

A stream source (standard input, a named pipe) cannot be read twice: its piece is spooled,
decompressed, to a temporary file first, and both ways read that (see
:mod:`~airflow_pg_bulk.source.streams`).

Which reject rows are kept (one policy, for every way a load can fail): **rejected rows are
kept, whether the load succeeds or fails, and each is recorded once.**

- A partition's reject rows commit in the same transaction as its good rows (so a retried COPY
  task never records them twice).
- A partition that rejects more than ``max_rejects`` rows fails; its transaction rolls back
  (staging rows, ledger entry) and the rows it rejected - up to the one past the limit - are
  then recorded in a short transaction of their own, so the error can point at them.
- A load that fails later (more than ``max_rejects`` across partitions, found by finalize; a
  constraint of the target; another partition's error) keeps the reject rows of the partitions
  that committed.

Every reject-limit error says where they are (``See S.T for load X``, :func:`kept_rejects`).
A run that is cleared and run again with the same load id records its rejects again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from typing import Any

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db import translate
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    collect_notices,
    copy_in,
    execute,
    is_database_error,
    server_error,
    server_version,
)
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.loading import accounting
from airflow_pg_bulk.plan import LoadPlan, Piece
from airflow_pg_bulk.source import charsets, listing, reading, records
from airflow_pg_bulk.source.lines import first_line, record_locations
from airflow_pg_bulk.source.listing import SourceKind
from airflow_pg_bulk.source.syntax import RecordSyntax

log = logging.getLogger(__name__)

SAVEPOINT = "pgbulk_piece"
_SPOOL_MEMORY = 8 << 20  # bytes of a failing partition's reject rows held in memory at most

Wrap = Callable[[Iterable[bytes]], Iterable[bytes]]


@dataclasses.dataclass
class PieceOutcome:
    """Rows loaded, bytes read and rows rejected for one piece."""

    rows: int = 0
    bytes: int = 0
    rejects: int = 0


class PartitionRejects:
    """The reject rows one attempt of a partition has recorded, kept aside (spooled to disk past
    a few MiB) to record again after the partition's transaction rolls back. The COPY step
    makes one per attempt of a partition and closes it when the attempt ends."""

    def __init__(self) -> None:
        self._file = tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY)  # noqa: SIM115
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        """Keep one reject row."""
        pickle.dump(row, self._file)
        self.count += 1

    def rows(self) -> Iterator[dict[str, Any]]:
        """The rows kept, in the order they were added."""
        self._file.seek(0)
        for _ in range(self.count):
            yield pickle.load(self._file)

    def close(self) -> None:
        """Drop the rows kept (the spool file)."""
        self._file.close()


@dataclasses.dataclass
class _Job:
    """One piece being copied with rejects: what every step of it needs."""

    conn: DatabaseConnection
    plan: LoadPlan
    piece: Piece  # as planned: its path names the source in reject rows and messages
    statement: sql.Composable
    rejected_before: int
    wrap: Wrap
    rule: records.MarkerRule
    found: PartitionRejects

    @property
    def over_limit(self) -> bool:
        return self.found.count > self.plan.errors.max_rejects


def copy_rejecting(
    conn: DatabaseConnection,
    plan: LoadPlan,
    piece: Piece,
    statement: sql.Composable,
    rejected_before: int,
    wrap: Wrap,
    rule: records.MarkerRule,
    found: PartitionRejects,
) -> PieceOutcome:
    """Load ``piece``, recording each bad row in the plan's reject table.

    ``rejected_before``: rows this partition rejected in earlier pieces (the limit counts them).
    ``wrap`` wraps each byte stream (progress counting); ``rule``: the server's end-of-data
    marker rule; ``found``: the reject rows of the partition's earlier pieces in this attempt.
    Every COPY here is row-accounted (:mod:`~airflow_pg_bulk.loading.accounting`).
    Past the limit, the partition's transaction is rolled back and its reject rows recorded on
    their own (the module's policy); the error raised says so."""
    assert plan.reject_table is not None
    job = _Job(conn, plan, piece, statement, rejected_before, wrap, rule, found)
    with ExitStack() as stack:
        spool = listing.piece_kind(piece).read_whole
        source = _plain_copy(stack, piece, plan) if spool else piece
        outcome = _copy_skipping(job, source, stack)
        if outcome is None:
            outcome = _copy_with_savepoints(job, source, stack)
    return outcome


def _copy_with_savepoints(job: _Job, piece: Piece, stack: ExitStack) -> PieceOutcome:
    """The savepoint way: any server version, any row error."""
    conn, plan, statement = job.conn, job.plan, job.statement
    target = plan.target.qualified
    outcome = PieceOutcome()
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
        counter, chunks = accounting.counted_chunks(part, plan.copy, job.rule, target)
        try:
            loaded = copy_in(conn, statement, job.wrap(chunks))
            accounting.check_rows(counter, part, plan.copy, target, loaded)
            outcome.rows += loaded
            execute(conn, sql.release(SAVEPOINT))
            break
        except Exception as exc:
            record = translate.bad_record(exc)
            if record is None:
                raise
            execute(conn, sql.rollback_to(SAVEPOINT))
            if source.compression:
                source = _plain_copy(stack, source, plan)
                pos = source.start
                continue  # the same error again, now with offsets into a plain file
            error = server_error(exc)
            pos = _set_aside(job, source, pos, end, record, error.message, outcome)
            execute(conn, sql.release(SAVEPOINT))
        if job.over_limit:
            raise _too_many(job)
    outcome.bytes = _size(piece)
    return outcome


_SKIPPED = re.compile(r"at line (\d+) for column \"?(.*?)\"?: (?:\"(.*)\"|null input)\s*\Z", re.S)


def _copy_skipping(job: _Job, piece: Piece, stack: ExitStack) -> PieceOutcome | None:
    """The one-pass way (PostgreSQL 17+); None when it cannot be used, when the piece has a row
    error that ``ON_ERROR ignore`` does not skip, or more bad rows than the limit allows (then
    nothing of it was kept, and the savepoint way finds and records them one by one)."""
    conn, plan = job.conn, job.plan
    version = server_version(conn)
    allowance = plan.errors.max_rejects - job.rejected_before
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
    counter, chunks = accounting.counted_chunks(piece, plan.copy, job.rule, t.qualified)
    with collect_notices(conn) as notices:
        try:
            rows = copy_in(conn, skipping, job.wrap(chunks))
        except Exception as exc:
            if not translate.is_row_error(exc):
                raise
            execute(conn, sql.rollback_to(SAVEPOINT))
            execute(conn, sql.release(SAVEPOINT))
            return None
        execute(conn, sql.release(SAVEPOINT))  # (psycopg2 hands over notices only now)
    lines = [int(m.group(1)) for m in map(_SKIPPED.search, notices) if m]
    accounting.check_rows(counter, piece, plan.copy, t.qualified, rows, skipped=len(lines))
    outcome = PieceOutcome(rows=rows, bytes=_size(piece), rejects=len(lines))
    if lines:
        _record_skipped(job, piece, lines, stack)
    if job.over_limit:
        raise _too_many(job)
    return outcome


def _record_skipped(job: _Job, piece: Piece, lines: list[int], stack: ExitStack) -> None:
    """Record the records ``ON_ERROR ignore`` skipped (COPY line numbers), each with the
    server's exact error."""
    source = _plain_copy(stack, piece, job.plan) if piece.compression else piece
    end = source.end if source.end is not None else os.path.getsize(source.path)
    syntax = RecordSyntax.of(job.plan.copy)
    located = record_locations(source.path, source.start, end, lines, syntax)
    for (first, content_end, _next), line, _last in sorted(located):
        with open(source.path, "rb") as f:
            f.seek(first)
            raw = f.read(content_end - first)
        _record(
            job, line + _line_offset(job, source), raw, _exact_error(job.conn, job.statement, raw)
        )


def _exact_error(conn: DatabaseConnection, statement: sql.Composable, raw: bytes) -> str:
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


def _too_many(job: _Job) -> BadDataError:
    """Roll the partition back, record the rows it rejected on their own (the module's policy),
    and return the error to raise."""
    plan = job.plan
    schema, table = plan.reject_table or ("", "")
    job.conn.rollback()  # nothing of the partition stays: not its rows, not its ledger entry
    for row in job.found.rows():
        execute(job.conn, sql.insert_reject(schema, table, **row))
    job.conn.commit()
    return BadDataError(
        f"more than max_rejects={plan.errors.max_rejects} rows of the source were "
        f"rejected (the last in {job.piece.path}); nothing of this load reached "
        f"{plan.target.qualified}. {kept_rejects(plan)}",
        path=job.piece.path,
    )


def kept_rejects(plan: LoadPlan) -> str:
    """Where a failed load's reject rows are: the same words in every reject-limit error."""
    return f"See {'.'.join(plan.reject_table or ())} for load {plan.load_id}"


def _record(job: _Job, line: int, raw: bytes, error: str) -> None:
    plan = job.plan
    schema, table = plan.reject_table or ("", "")
    row = {
        "load_id": plan.load_id,
        "target": plan.target.qualified,
        "source_file": job.piece.path,
        "line": line,
        "raw_line": raw.decode(charsets.python_encoding(plan.copy.encoding), "replace").replace(
            "\x00", "\ufffd"
        ),
        "error": naming.original_names(plan, error),
    }
    execute(job.conn, sql.insert_reject(schema, table, **row))
    job.found.add(row)
    log.info("Load %s: rejected %s line %d: %s", plan.load_id, job.piece.path, line, error)


def _set_aside(
    job: _Job, source: Piece, pos: int, end: int, record: int, message: str, outcome: PieceOutcome
) -> int:
    """Re-copy the good rows before the bad record, record the bad one; return where to go on."""
    plan = job.plan
    syntax = RecordSyntax.of(plan.copy)
    (((first, content_end, next_start), line, _last),) = record_locations(
        source.path, pos, end, [record], syntax
    )
    if first > pos:
        before = dataclasses.replace(source, start=pos, end=first)
        target = plan.target.qualified
        counter, chunks = accounting.counted_chunks(before, plan.copy, job.rule, target)
        loaded = copy_in(job.conn, job.statement, chunks)
        accounting.check_rows(counter, before, plan.copy, target, loaded)
        outcome.rows += loaded
    with open(source.path, "rb") as f:
        f.seek(first)
        raw = f.read(content_end - first)
    _record(job, line + _line_offset(job, source), raw, message)
    outcome.rejects += 1
    return next_start


def _line_offset(job: _Job, source: Piece) -> int:
    """Lines before a spooled range of an object (its spool's line 1 is the range's first)."""
    return source.first_line - 1 if source.path != job.piece.path else 0


def _plain_copy(stack: ExitStack, piece: Piece, plan: LoadPlan) -> Piece:
    """A gzip piece, a stream or an object as a plain temporary file, header included (byte
    offsets are needed to skip rows, a stream cannot be read twice, and an object is read
    once); deleted when ``stack`` closes."""
    tmp = stack.enter_context(tempfile.NamedTemporaryFile(suffix=".pgbulk"))  # noqa: SIM115
    reading.write_content(piece, tmp)
    tmp.flush()
    if (
        listing.piece_kind(piece) is SourceKind.OBJECT and piece.end is not None
    ):  # a range of an object
        first = first_line(piece, plan.copy)
        return Piece(tmp.name, 0, os.path.getsize(tmp.name), first, newline=piece.newline)
    with open(tmp.name, "rb") as f:
        start = reading.content_start(f, piece, plan.copy)
    return Piece(tmp.name, start, os.path.getsize(tmp.name), 1)


def _size(piece: Piece) -> int:
    if piece.end is not None:
        return piece.end - piece.start
    return os.path.getsize(piece.path)
