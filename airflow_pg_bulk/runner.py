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

from airflow_pg_bulk import naming, steps
from airflow_pg_bulk.driver import connect
from airflow_pg_bulk.figures import LoadSummary, PhaseClock
from airflow_pg_bulk.plan import LoadPlan, request_from_options

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
            steps.copy_partition(conn, plan, index, progress.callback(index))
        finally:
            conn.close()

    indexes = [p.index for p in plan.partitions]
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="pg-bulk-copy") as pool:
        futures = [pool.submit(work, i) for i in indexes]
        errors = []
        for future in futures:
            try:
                future.result()
            except Exception as exc:
                errors.append(exc)
                for other in futures:
                    other.cancel()
        if errors:
            raise errors[0]


def load(
    conn: str | ConnectionFactory,
    table: str,
    source: str | Sequence[str],
    *,
    columns: Sequence[str] | None = None,
    jobs: int | None = None,
    driver: str = "psycopg",
    load_id: str | None = None,
    **options: Any,
) -> LoadSummary:
    """Load files into a PostgreSQL table, in one process: prepare, parallel COPY, finalize,
    and cleanup (always).

    :param conn: a libpq DSN/URI, or a function returning new DB-API connections.
    :param table: the target, ``schema.table``; it must exist.
    :param source: a path, a glob, or a list of them.
    :param columns: target columns the fields fill, for files without a header.
    :param jobs: COPY connections at once; default ``min(partitions, 4)``.
    :param driver: ``psycopg`` (3) or ``psycopg2`` when ``conn`` is a DSN.
    :param load_id: reuse a load id (12 hex characters) to resume a load whose partitions
        were partly committed; default: a new one.
    :param options: every option of ``PgBulkPrepareOperator``
        (``format``, ``header``, ``delimiter``, ``null``, ``quote``, ``escape``, ``encoding``,
        ``mode``, ``partitions``, ``partition_size``, ``staging_logged``, ``lock_timeout``,
        ``maintenance_work_mem``, ``synchronous_commit``, ``analyze``, ``on_error``,
        ``max_rejects``, ``reject_table``); see :func:`~airflow_pg_bulk.plan.request_from_options`.

    Returns the load's figures.
    """
    factory = connection_factory(conn, driver)
    request = request_from_options(table, source, columns, **options)
    load_id = load_id or naming.new_load_id()
    clock = PhaseClock()
    main = factory()
    plan: LoadPlan | None = None
    try:
        with clock.phase("prepare"):
            plan = steps.prepare(main, request, load_id)
        workers = jobs or min(len(plan.partitions), 4)
        with clock.phase("copy"):
            run_plan(factory, plan, workers)
        summary = steps.finalize(main, plan)
    finally:
        schema = plan.target.schema if plan else _schema_of(table)
        with clock.phase("cleanup"):
            try:
                steps.cleanup(main, schema, load_id)
            except Exception:
                log.exception(
                    "cleanup of load %s failed; drop its _pgbulk_%s_* tables by hand",
                    load_id,
                    load_id,
                )
        main.close()
    return summary.with_seconds(
        {"prepare": clock.seconds["prepare"], "copy": clock.seconds["copy"]}
    )


def _schema_of(table: str) -> str:
    from airflow_pg_bulk.catalog import split_name

    try:
        return split_name(table)[0]
    except ValueError:
        return "public"
