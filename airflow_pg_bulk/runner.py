"""Run a whole load in one process, without a scheduler: the same steps the DAG runs, with the
partitions on several connections at once. Used by the CLI, the demo, the benchmarks, tests
and ad-hoc loads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_pg_bulk import fanout, naming, steps
from airflow_pg_bulk import options as load_options
from airflow_pg_bulk.driver import close_cancelling, connect
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.plan import (
    DEFAULT_PARTITION_BYTES,
    LoadPlan,
    Mode,
    figures,
    request_from_options,
)
from airflow_pg_bulk.plan.figures import LoadSummary

log = logging.getLogger(__name__)

ConnectionFactory = Callable[[], Any]


class _Progress:
    """Thread-safe byte counts of all partitions, logged every few seconds."""

    def __init__(self, total: int, every: float = 5.0) -> None:
        self.total = total
        self.every = every
        self._done: dict[int, int] = {}
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._last = 0.0

    def callback(self, index: int) -> Callable[[int, int], None]:
        def report(done: int, _expected: int) -> None:
            with self._lock:
                self._done[index] = done
                now = time.monotonic()
                if now - self._last < self.every:
                    return
                self._last = now
                copied = sum(self._done.values())
                elapsed = now - self._started
                log.info(
                    "copy: %.0f%% (%.1f of %.1f MB), %.1f MB/s",
                    100 * copied / self.total if self.total else 100,
                    copied / 1e6,
                    self.total / 1e6,
                    copied / 1e6 / elapsed if elapsed else 0,
                )

        return report


def connection_factory(conn: str | ConnectionFactory, driver: str = "psycopg") -> ConnectionFactory:
    """A DSN or URI becomes a factory of new connections; a factory is returned as is."""
    if callable(conn):
        return conn
    dsn = conn
    return lambda: connect(dsn, driver)


def run_plan(factory: ConnectionFactory, plan: LoadPlan, jobs: int) -> None:
    """Run the COPY step of every partition on ``jobs`` connections at once."""
    progress = _Progress(plan.source_bytes)

    def work(index: int) -> None:
        conn = factory()
        try:
            steps.start_session(conn, naming.application_name(plan.load_id, "copy", index))
            steps.copy_partition(conn, plan, index, progress.callback(index))
        finally:
            close_cancelling(conn)

    starts = {
        p.index: min((piece.path, piece.first_line) for piece in p.pieces) for p in plan.partitions
    }
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="pg-bulk-copy") as pool:
        futures = {pool.submit(work, i): i for i in starts}
        errors = []
        for future in futures:
            try:
                future.result()
            except Exception as exc:
                errors.append(exc)
                where = _where(exc)
                for other, index in futures.items():
                    # parts of the files before a bad record still run: the error reported is
                    # the first in the files, as one COPY of them would report, whatever ran first
                    if where is None or starts[index] > where:
                        other.cancel()
        if errors:
            located = [e for e in errors if _where(e) is not None]
            raise min(located, key=_where) if located else errors[0]  # type: ignore[arg-type]


def _where(exc: BaseException) -> tuple[str, int] | None:
    """(file, line) of a bad record, for choosing the error that comes first in the files."""
    if isinstance(exc, BadDataError) and exc.path is not None and exc.line is not None:
        return exc.path, exc.line
    return None


def load(
    conn: str | ConnectionFactory,
    table: str,
    source: str | Sequence[str],
    *,
    mode: Mode | None = None,
    source_conn_id: str | None = None,
    format: str = "csv",
    header: bool = False,
    delimiter: str | None = None,
    null: str | None = None,
    quote: str = '"',
    escape: str | None = None,
    encoding: str = "UTF8",
    partitions: int | None = None,
    partition_size: int = DEFAULT_PARTITION_BYTES,
    columns: Sequence[str] | None = None,
    key: Sequence[str] | None = None,
    on_duplicate_key: str = "last",
    strategy: str = "auto",
    staging_logged: bool | None = None,
    lock_timeout: str = "30s",
    abandoned_after: str = "1d",
    maintenance_work_mem: str = "512MB",
    index_workers: int | None = None,
    synchronous_commit: str = "off",
    analyze: bool = True,
    allow_older_run: bool = False,
    history_keep: int = 1000,
    on_error: str = "fail",
    max_rejects: int = 0,
    reject_table: str | None = None,
    jobs: int | None = None,
    driver: str = "psycopg",
    load_id: str | None = None,
    **objects: Any,
) -> LoadSummary:
    """Load files into a PostgreSQL table, in one process: prepare, parallel COPY, finalize,
    and cleanup (always).

    :param conn: a libpq DSN/URI, or a function returning new DB-API connections.
    :param table: the target, ``schema.table``; it must exist.
    :param source: a path, a glob, an object-storage URL or glob (``s3://bucket/p/*.csv``),
        or a list of them.
    :param mode: ``replace``: the target ends up with exactly the loaded rows; ``append``: the
        loaded rows are added to the target's rows; ``upsert``: a loaded row replaces the loaded
        columns of the target's row with the same ``key``, the others are added;
        ``replace_partitions`` (a partitioned target): each partition that receives rows ends up
        with exactly them, the others are not touched (see Modes and their guarantees,
        Partitioned targets); default none: it must be given. (templated)
    :param source_conn_id: Airflow connection that object-storage URLs in ``source``
        (``s3://bucket/prefix/*.csv.gz``) are read with: an ``aws`` connection for ``s3://``,
        its extra ``endpoint_url`` for an S3-compatible store; every COPY task reads its own
        objects with it; default none: the standard environment (``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, …). (templated)
    :param format: ``csv``, ``text`` (PostgreSQL's text format) or ``parquet`` (columns matched
        to the table's by name, row groups split over partitions; needs
        ``airflow-pg-bulk[parquet]``); default ``csv``. (templated)
    :param header: every file starts with a header line; columns are matched to the table by
        name (exact, then case-insensitive), in any order; all files must have the same header;
        default ``False``. (templated)
    :param delimiter: field delimiter, one byte; default ``,`` (csv), tab (text). (templated)
    :param null: the NULL marker; default unquoted empty (csv), ``\\N`` (text). (templated)
    :param quote: csv quote character; default ``"``. (templated)
    :param escape: csv escape character inside quotes; default the quote. (templated)
    :param encoding: the files' encoding, PostgreSQL's name (``LATIN1``, ``WIN1252``, …);
        splitting one file needs an ASCII-compatible encoding; default ``UTF8``. (templated)
    :param partitions: number of COPY partitions (mapped tasks); default by size: one per
        ``partition_size``, at most 16. (templated)
    :param partition_size: input bytes per partition when ``partitions`` is not given; default
        67108864 (64 MiB). (templated)
    :param columns: target columns the fields fill, in file order, for files without a header;
        default all non-generated. (templated)
    :param key: the columns that identify a row: exactly the columns of the target's primary key
        or of one of its unique constraints or unique indexes (any order); default the primary
        key. (templated)
    :param on_duplicate_key: a key loaded more than once: ``last``: the row latest in source
        order wins (files in the order given, each glob's matches by name; lines in file order);
        ``fail``: the load fails naming the key, the target untouched; default ``last``.
        (templated)
    :param strategy: how the rows reach the target: ``in_place`` (INSERT into it); ``rebuild``
        (a new table = its rows + the loaded rows, indexed, then swapped in as a replace does;
        needs a replace's privileges); ``auto``: the cheaper by the cost model in
        docs/design.md, in place when a rebuild is not possible (said in the log); default
        ``auto``. (templated)
    :param staging_logged: staging persistence: a logged (true) or unlogged (false) staging
        table; see docs/tuning.md for the measurement behind the defaults; default ``True`` for
        replace and replace_partitions, ``False`` for append and upsert. (templated)
    :param lock_timeout: longest wait for any lock a step takes: the target's in finalize, and
        the load's own tables in prepare, finalize and cleanup; default ``30s``. (templated)
    :param abandoned_after: how long a load into the same target may go without a sign of life
        (no session, no COPY committed since) before the next load's prepare drops the tables it
        left: a crashed load's staging; those of a finalized load are dropped at once; a
        PostgreSQL interval (see A failed cleanup, and leftover staging); default ``1d``.
        (templated)
    :param maintenance_work_mem: memory for index builds and constraint validation in finalize;
        default ``512MB``. (templated)
    :param index_workers: parallel maintenance workers of each index build in finalize
        (``max_parallel_maintenance_workers``), never more than the server's
        ``max_parallel_workers``; ``0``: none; default sized from the server (see
        docs/tuning.md, "finalize on several cores"). (templated)
    :param synchronous_commit: ``synchronous_commit`` of the COPY sessions; with ``off`` a crash
        can lose only partitions whose commit was not yet flushed, which the ledger check then
        reports — never a silent partial load; default ``off``. (templated)
    :param analyze: ANALYZE the new rows: a replace, rebuild or partition swap before they
        become visible; an in-place append or upsert after its commit, when it changed at least
        a tenth of the target's rows (smaller batches are left to autovacuum); default ``True``.
        (templated)
    :param allow_older_run: let this run replace rows that a run with a later data interval of
        the same DAG task loaded (a deliberate reload of the past); otherwise such a run fails,
        naming the newer load and changing nothing (see Runs that overlap). Under Airflow only:
        the command line and ``load()`` have no data interval; default ``False``. (templated)
    :param history_keep: loads kept per target in the load history ``pgbulk_loads``; older ones
        are deleted after each finalize into the target (the newest load of each DAG task and
        partition always stays: the ordering of runs needs it); default ``1000``. (templated)
    :param on_error: ``fail``: the first bad row fails the load, naming file, line, column and
        value; ``reject``: rows PostgreSQL cannot parse or convert go to ``reject_table`` and
        the rest load; default ``fail``. (templated)
    :param max_rejects: with ``reject``: the most rejected rows the whole load may have; past it
        the load fails and nothing reaches the target; rejected rows are kept in
        ``reject_table`` either way; default ``0``. (templated)
    :param reject_table: ``schema.table`` for rejected rows, created if missing: ``load_id,
        target, source_file, line, raw_line, error, rejected_at``; kept after the load; default
        ``pgbulk_rejects`` in the target's schema. (templated)
    :param jobs: COPY connections at once; default ``min(partitions, 4)``.
    :param driver: ``psycopg`` (3) or ``psycopg2`` when ``conn`` is a DSN.
    :param load_id: reuse a load id (12 hex characters) to resume a load whose partitions
        were partly committed; default: a new one.
    :param objects: whole ``copy=CopyOptions(...)``, ``settings=Settings(...)`` or
        ``errors=ErrorPolicy(...)``; the options above override their fields. See
        :func:`~airflow_pg_bulk.plan.request_from_options`.

    Returns the load's figures. Without ``mode`` it raises ``ValueError`` before it connects.
    """
    factory = connection_factory(conn, driver)
    given = load_options.changed(locals(), exclude=("columns",))
    request = request_from_options(table, source, columns, **given, **objects)
    load_id = load_id or naming.new_load_id()
    started_at = time.time()
    main = factory()
    plan: LoadPlan | None = None
    summary: LoadSummary | None = None
    try:
        steps.start_session(main, naming.application_name(load_id, "prepare"))
        plan = steps.prepare(main, request, load_id)
        plan = figures.stamp_prepare(plan, started_at, time.time())
        workers = jobs or min(len(plan.partitions), 4)
        run_plan(factory, plan, workers)
        copies = figures.copy_span(main, plan)
        name = naming.application_name(load_id, "finalize")
        steps.start_session(main, name)
        summary = steps.finalize(main, plan, fanout.Sessions(factory, name))
        summary = figures.whole_load(summary, plan, copies, time.time())
    finally:
        schema = plan.target.schema if plan else _schema_of(table)
        cleanup_started = time.time()
        try:
            steps.start_session(main, naming.application_name(load_id, "cleanup"))
            steps.cleanup(main, schema, load_id, lock_timeout=request.settings.lock_timeout)
        except Exception:
            log.exception(
                "cleanup of load %s failed; drop its _pgbulk_%s_* tables by hand",
                load_id,
                load_id,
            )
        close_cancelling(main)
    ended_at = time.time()
    assert summary is not None  # finalize returned, or its error is on its way up
    return figures.with_phase(summary, "cleanup", cleanup_started, ended_at)


def _schema_of(table: str) -> str:
    from airflow_pg_bulk.naming import split_name

    try:
        return split_name(table)[0]
    except ValueError:
        return "public"
