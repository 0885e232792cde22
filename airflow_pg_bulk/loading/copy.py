"""The COPY step: one partition of the plan into staging, exactly once.

The partition's ledger row is claimed first and committed with its rows
(:mod:`airflow_pg_bulk.loading.ledger`). Each piece goes one of three ways, chosen per partition
by :class:`PartitionCopy` from the source (:func:`airflow_pg_bulk.loading.sources.for_plan`):
a Parquet piece through :func:`airflow_pg_bulk.loading.parquet_copy.copy_piece`, a database
source through :func:`airflow_pg_bulk.loading.database.piece.copy_piece`;
with ``on_error="reject"``, through :func:`airflow_pg_bulk.loading.rejects.copy_rejecting`;
otherwise one row-accounted COPY (:mod:`airflow_pg_bulk.loading.accounting`). A speculative piece
found misaligned commits its partition empty, for finalize to load again
(:mod:`airflow_pg_bulk.loading.alignment`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import translate
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    copy_in,
    execute,
    rollback_quietly,
    server_version,
)
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.loading import accounting, alignment, ledger, rejects, sources
from airflow_pg_bulk.plan import LoadPlan, Partition, Piece
from airflow_pg_bulk.plan.figures import PartitionResult
from airflow_pg_bulk.source import records

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]  # (bytes so far, bytes expected or 0)


class _Counted:
    """Pass chunks through, counting bytes and reporting progress now and then."""

    def __init__(
        self, chunks: Iterable[bytes], progress: ProgressCallback | None, done: int, expected: int
    ) -> None:
        self._chunks = chunks
        self._progress = progress
        self.bytes = 0
        self._done = done
        self._expected = expected

    def __iter__(self) -> Iterator[bytes]:
        last = time.monotonic()
        for chunk in self._chunks:
            self.bytes += len(chunk)
            yield chunk
            now = time.monotonic()
            if self._progress and now - last >= 5:
                last = now
                self._progress(self._done + self.bytes, self._expected)


class PartitionCopy:
    """One attempt at COPYing one partition, in the caller's transaction: the pieces one after
    another (:meth:`copy`), adding up rows, bytes and rejects; :meth:`close` when done."""

    def __init__(
        self,
        conn: DatabaseConnection,
        plan: LoadPlan,
        part: Partition,
        progress: ProgressCallback | None,
    ) -> None:
        self.conn = conn
        self.plan = plan
        self.part = part
        self.progress = progress
        self.rows = self.nbytes = self.rejected = 0
        self._statement: sql.Composable | None = None
        self._rule: records.MarkerRule | None = None
        self._rejects: rejects.PartitionRejects | None = None
        source = sources.for_plan(plan)
        source_format = source.format
        self._sends_bytes = source_format.sends_bytes
        if not self._sends_bytes:  # it makes its own statement
            self._encode = source.encoder
        else:
            t = plan.target
            self._statement = sql.copy_from_stdin(
                t.schema, plan.staging_table, plan.columns, source_format.copy_options
            )
            self._rule = source_format.marker_rule(server_version(conn))
            if plan.errors.rejecting:
                self._rejects = rejects.PartitionRejects()

    def copy(self, piece: Piece) -> None:
        """COPY one piece of the partition."""
        if self.plan.upsert:  # read by staging's source order column (see target/upsert.py)
            execute(self.conn, sql.set_config(sql.PIECE_SETTING, str(piece.ordinal), local=True))
        if not self._sends_bytes:
            self._encoded(piece)
        elif self._rejects is not None:
            self._rejecting(piece, self._rejects)
        else:
            self._counted(piece)

    def close(self) -> None:
        """Drop what the attempt kept aside (the reject rows found)."""
        if self._rejects is not None:
            self._rejects.close()

    def _encoded(self, piece: Piece) -> None:
        loaded, sent = self._encode(
            self.conn, self.plan, piece, self.progress, self.nbytes, self.part.bytes
        )
        self.rows, self.nbytes = self.rows + loaded, self.nbytes + sent

    def _rejecting(self, piece: Piece, found: rejects.PartitionRejects) -> None:
        plan = self.plan
        assert self._statement is not None and self._rule is not None
        # a row set aside must be a real record: check the guessed bounds first
        if piece.speculative and not alignment.aligned(piece, plan.copy):
            raise alignment.Misaligned(piece)
        outcome = rejects.copy_rejecting(
            self.conn,
            plan,
            piece,
            self._statement,
            self.rejected,
            lambda chunks, done=self.nbytes: _Counted(chunks, self.progress, done, self.part.bytes),
            self._rule,
            found,
        )
        self.rows += outcome.rows
        self.nbytes += outcome.bytes
        self.rejected += outcome.rejects

    def _counted(self, piece: Piece) -> None:
        plan = self.plan
        t = plan.target
        counter, chunks = accounting.counted_chunks(piece, plan.copy, self._rule, t.qualified)
        counted = _Counted(chunks, self.progress, self.nbytes, self.part.bytes)
        try:
            try:
                loaded = copy_in(self.conn, self._statement, counted)
            except Exception as exc:
                raise translate.copy_error(exc, plan, piece) from exc
            alignment.check_end(counter, piece)
            accounting.check_rows(counter, piece, plan.copy, t.qualified, loaded)
        except BadDataError as exc:
            # bad data, or bytes cut at a wrongly guessed record start?
            if piece.speculative and not alignment.aligned(piece, plan.copy):
                raise alignment.Misaligned(piece) from exc
            raise
        self.rows += loaded
        self.nbytes += counted.bytes


def copy_partition(
    conn: DatabaseConnection, plan: LoadPlan, index: int, progress: ProgressCallback | None = None
) -> PartitionResult:
    """Load one partition into staging, exactly once.

    The partition's ledger row is inserted first (a concurrent duplicate attempt waits on it)
    and committed in the same transaction as the rows: a retry after a commit is a no-op, a
    retry after a failure starts clean."""
    part = plan.partition(index)
    started = time.perf_counter()
    copier = None
    try:
        setting = sql.set_config("synchronous_commit", plan.settings.synchronous_commit, local=True)
        if not ledger.check_and_claim(conn, plan, index, after=[setting]):
            rows, nbytes, seconds, rejected = ledger.committed(conn, plan, index)
            conn.rollback()
            log.info(
                "Load %s: COPY stream %d was committed before (%d rows): nothing to do",
                plan.load_id,
                index,
                rows,
            )
            return PartitionResult(index, rows, nbytes, seconds, skipped=True, rejects=rejected)
        copier = PartitionCopy(conn, plan, part, progress)
        for piece in part.pieces:
            copier.copy(piece)
        rows, nbytes, rejected = copier.rows, copier.nbytes, copier.rejected
        seconds = time.perf_counter() - started
        ledger.record(conn, plan, index, rows, nbytes, seconds, rejected, commit=True)
    except alignment.Misaligned as exc:
        rollback_quietly(conn)
        return alignment.record_misaligned(conn, plan, index, exc, time.perf_counter() - started)
    except BaseException:
        rollback_quietly(conn)
        raise
    finally:
        if copier is not None:
            copier.close()
    log.info(
        "Load %s: COPY stream %d: %d rows, %.1f MB in %.2f s (%.0f rows/s)",
        plan.load_id,
        index,
        rows,
        nbytes / 1e6,
        seconds,
        rows / seconds if seconds else 0,
    )
    return PartitionResult(index, rows, nbytes, seconds, rejects=rejected)
