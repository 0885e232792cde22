"""Run a whole load in one process, without a scheduler: the same steps the DAG runs, with the
partitions on several connections at once. Used by the CLI, the demo, the benchmarks, tests
and ad-hoc loads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Unpack

from airflow_pg_bulk import naming, steps
from airflow_pg_bulk import options as load_options
from airflow_pg_bulk.db.driver import close_cancelling, connect
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.loading import ledger
from airflow_pg_bulk.naming import split_name
from airflow_pg_bulk.option_types import LoadOptions
from airflow_pg_bulk.plan import (
    CopyOptions,
    ErrorPolicy,
    LoadPlan,
    Settings,
    figures,
    request_from_options,
)
from airflow_pg_bulk.plan.figures import LoadSummary

log = logging.getLogger(__name__)

ConnectionFactory = Callable[[], Any]


class LoadArguments(LoadOptions, total=False):
    """The keywords of :func:`load`: every load option, and whole parts of the request."""

    copy: CopyOptions
    settings: Settings
    errors: ErrorPolicy


class _Progress:
    """Thread-safe byte counts of all COPY streams, logged every few seconds."""

    def __init__(self, load_id: str, total: int, every: float = 5.0) -> None:
        self.load_id = load_id
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
                    "Load %s: COPY: %.0f%% (%.1f of %.1f MB), %.1f MB/s",
                    self.load_id,
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
    """Run the COPY step of every COPY stream on ``jobs`` connections at once."""
    progress = _Progress(plan.load_id, plan.source_bytes)

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


@load_options.with_load_options
def load(
    conn: str | ConnectionFactory,
    table: str,
    source: str | Sequence[str] = (),
    *,
    jobs: int | None = None,
    driver: str = "psycopg",
    load_id: str | None = None,
    **objects: Unpack[LoadArguments],
) -> LoadSummary:
    """Load files into a PostgreSQL table, in one process: prepare, parallel COPY, finalize,
    and cleanup (always).

    :param conn: a libpq DSN/URI, or a function returning new DB-API connections.
    :param table: the target, ``schema.table``; it must exist.
    :param source: a path, a glob, an object-storage URL or glob (``s3://bucket/p/*.csv``),
        or a list of them; none with a database source (``source_url`` and ``query`` or
        ``source_table``).
    :load options:
    :param jobs: COPY connections at once; default ``min(partitions, 4)``.
    :param driver: ``psycopg`` (3) or ``psycopg2`` when ``conn`` is a DSN.
    :param load_id: reuse a load id (12 hex characters) to resume a load whose partitions
        were partly committed; default: a new one.
    :param objects: the load options above, and whole ``copy=CopyOptions(...)``,
        ``settings=Settings(...)`` or ``errors=ErrorPolicy(...)``, whose fields the options
        override. See
        :func:`~airflow_pg_bulk.plan.request_from_options`.

    Returns the load's figures. Without ``mode`` it raises ``ValueError`` before it connects.
    """
    factory = connection_factory(conn, driver)
    values = load_options.take(objects)  # type: ignore[arg-type]
    columns = values.pop("columns")
    given = load_options.changed(values)  # whole objects keep the fields not given here
    # what is left: whole copy=/settings=/errors= objects (anything else is refused there)
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
        copies = ledger.copy_span(main, plan)
        name = naming.application_name(load_id, "finalize")
        steps.start_session(main, name)
        summary = steps.finalize(main, plan, Sessions(factory, name))
        summary = figures.whole_load(summary, plan, copies, time.time())
    finally:
        schema = plan.target.schema if plan else _schema_of(table)
        cleanup_started = time.time()
        try:
            steps.start_session(main, naming.application_name(load_id, "cleanup"))
            steps.cleanup(main, schema, load_id, lock_timeout=request.settings.lock_timeout)
        except Exception:
            log.exception(
                "Load %s: cleanup failed; drop its _pgbulk_%s_* tables by hand",
                load_id,
                load_id,
            )
        close_cancelling(main)
    ended_at = time.time()
    assert summary is not None  # finalize returned, or its error is on its way up
    return figures.with_phase(summary, "cleanup", cleanup_started, ended_at)


def _schema_of(table: str) -> str:
    try:
        return split_name(table)[0]
    except ValueError:
        return "public"
