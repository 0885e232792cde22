"""Run a whole load in one process, without a scheduler: the same steps the DAG runs, with the
partitions on several connections at once. Used by the CLI, the demo, the benchmarks, tests
and ad-hoc loads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Unpack

from airflow_pg_bulk import naming, steps
from airflow_pg_bulk import options as load_options
from airflow_pg_bulk.db.driver import close_cancelling, connect, stop
from airflow_pg_bulk.db.session import Sessions, session_setup
from airflow_pg_bulk.errors import QUERY_CANCELED, BadDataError, TransientLoadError
from airflow_pg_bulk.loading import cleanup as cleaning
from airflow_pg_bulk.loading import ledger, sources
from airflow_pg_bulk.loading import preview as previewing
from airflow_pg_bulk.loading.database import snapshots
from airflow_pg_bulk.loading.preview import Preview
from airflow_pg_bulk.naming import split_name
from airflow_pg_bulk.option_types import LoadOptions
from airflow_pg_bulk.plan import (
    CopyOptions,
    ErrorPolicy,
    LoadPlan,
    LoadRequest,
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


def run_plan(factory: ConnectionFactory, plan: LoadPlan, jobs: int, idle: Any = None) -> None:
    """Run the COPY step of every COPY stream on ``jobs`` connections at once.

    :param idle: a connection of the load's that is idle meanwhile: a plan of one COPY stream
        runs on it, without a connection of its own (opening one was 14-41 ms of a daily
        one-day reload whose whole load takes about 0.2 s)."""
    progress = _Progress(plan.load_id, plan.source_bytes)
    if idle is not None and len(plan.partitions) == 1:
        index = plan.partitions[0].index
        steps.start_session(idle, naming.application_name(plan.load_id, "copy", index))
        steps.copy_partition(idle, plan, index, progress.callback(index))
        return

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


STOP_LOCK_TIMEOUT = "1s"  # the stop's clean-up: the cancelled sessions release their locks
# within milliseconds; a lock held longer is another session's, and the tables are left then


class LoadStopped(TransientLoadError):
    """A statement or session of a load refused after :func:`stop_loads` (SQLSTATE 57014)."""


@dataclass
class StopReport:
    """What :func:`stop_loads` did to one load.

    :param load_id: the load.
    :param table: its target, as given.
    :param phase: the step it was in: ``prepare``, ``COPY``, ``finalize`` or ``cleanup``.
    :param finalized: its rows had been made visible before the stop (the target has them).
    :param dropped: its tables the stop dropped.
    :param error: why some of its tables are left (None: none is).
    """

    load_id: str
    table: str
    phase: str
    finalized: bool = False
    dropped: list[str] = field(default_factory=list)
    error: str | None = None

    def describe(self) -> str:
        """What happened to the target and to the load's tables, in words."""
        if self.finalized:
            target = f"its rows had been committed before: they are in {self.table}"
        else:
            target = "the target is unchanged"
        if self.error is None:
            tables = "the load's tables were dropped"
        else:
            tables = (
                f"the load's tables are left ({self.error}): remove them with "
                f"airflow-pg-bulk cleanup --conn DSN --table {self.table}"
            )
        return f"during {self.phase} of load {self.load_id}; {target}; {tables}"


_running: list[LoadControl] = []
_running_lock = threading.Lock()


class LoadControl:
    """The connections one :func:`load` opened, so that :func:`stop_loads` (a signal
    handler's thread, another thread) cancels every statement of it at once.

    :param load_id: the load.
    :param table: its target, as given.
    :param factory: opens its connections (the stop's clean-up opens one more).
    """

    def __init__(self, load_id: str, table: str, factory: ConnectionFactory) -> None:
        self.load_id = load_id
        self.table = table
        self.phase = "prepare"
        self.stopped = False
        self._factory = factory
        self._open: list[Any] = []
        with _running_lock:
            _running.append(self)

    def factory(self) -> Any:
        """A new connection of the load, refused once stopped."""
        if self.stopped:
            raise self.stopped_error()
        conn = self._factory()
        self._open.append(conn)
        if self.stopped:  # a stop between the check and the append
            stop(conn)
        return conn

    def stopped_error(self) -> LoadStopped:
        """The error a step of a stopped load meets."""
        return LoadStopped(
            f"load {self.load_id} was stopped: its running statements were cancelled",
            sqlstate=QUERY_CANCELED,
        )

    def stop(self) -> StopReport:
        """Cancel every statement of the load, refuse any further one, then drop its tables
        on a connection of its own (waiting :data:`STOP_LOCK_TIMEOUT` at most for a lock)."""
        self.stopped = True
        phase = self.phase
        for conn in list(self._open):
            stop(conn)
        report = StopReport(self.load_id, self.table, phase)
        schema = _schema_of(self.table)
        try:
            conn = self._factory()
        except Exception as exc:
            report.error = str(exc)
            return report
        try:
            steps.start_session(conn, naming.application_name(self.load_id, "stop"))
            cleaning.end_load_sessions(conn, self.load_id)
            report.finalized = cleaning.was_finalized(conn, schema, self.load_id)
            report.dropped = steps.cleanup(
                conn, schema, self.load_id, lock_timeout=STOP_LOCK_TIMEOUT, attempts=1
            )
        except Exception as exc:
            report.error = str(exc).split("\n")[0]
        finally:
            close_cancelling(conn)
        return report

    def finish(self) -> None:
        """The load has ended: no longer among those :func:`stop_loads` stops."""
        with _running_lock:
            if self in _running:
                _running.remove(self)


def stop_loads() -> list[StopReport]:
    """Stop every :func:`load` running in this process (see :meth:`LoadControl.stop`): their
    statements cancelled at once, their tables dropped; what became of each. Safe from any
    thread but those of the loads; used by the CLI on SIGINT, SIGTERM and SIGHUP."""
    with _running_lock:
        controls = list(_running)
    return [control.stop() for control in controls]


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
    control = LoadControl(load_id, request.table, factory)
    factory = control.factory
    try:
        main = factory()
    except BaseException:
        control.finish()
        raise
    plan: LoadPlan | None = None
    summary: LoadSummary | None = None
    try:
        steps.start_session(main, naming.application_name(load_id, "prepare"))
        with snapshots.snapshots_released(unless_prepared=True):
            plan = steps.prepare(main, request, load_id)
        plan = figures.stamp_prepare(plan, started_at, time.time())
        workers = jobs or min(len(plan.partitions), 4)
        control.phase = "COPY"
        run_plan(factory, plan, workers, idle=main)
        name = naming.application_name(load_id, "finalize")
        # the COPY span read with finalize's session setup (one round trip)
        copies = ledger.copy_span(main, plan, after=[session_setup(main, name)])
        control.phase = "finalize"
        summary = steps.finalize(main, plan, Sessions(factory, name))
        summary = figures.whole_load(summary, plan, copies, time.time())
    finally:
        control.phase = "cleanup"
        schema = plan.target.schema if plan else _schema_of(table)
        cleanup_started = time.time()
        if not control.stopped:  # else stop_loads drops the tables, on a connection of its own
            try:
                if getattr(main, "closed", False):  # its COPY stream lost it: a new one
                    close_cancelling(main)
                    main = factory()
                name = naming.application_name(load_id, "cleanup")
                steps.cleanup(  # (the session's setup in cleanup's first round trip)
                    main,
                    schema,
                    load_id,
                    lock_timeout=request.settings.lock_timeout,
                    first=[session_setup(main, name)],
                )
            except Exception:
                if not control.stopped:
                    log.exception(
                        "Load %s: cleanup failed; drop its _pgbulk_%s_* tables by hand",
                        load_id,
                        load_id,
                    )
        close_cancelling(main)
        control.finish()
        if plan is not None:  # (a range never read leaves its source's snapshot held)
            sources.for_plan(plan).release()
    ended_at = time.time()
    assert summary is not None  # finalize returned, or its error is on its way up
    return figures.with_phase(summary, "cleanup", cleanup_started, ended_at)


def _request(table: str, source: str | Sequence[str], objects: dict[str, Any]) -> LoadRequest:
    """The request of :func:`preview`'s arguments, as :func:`load` makes its own."""
    values = load_options.take(objects)  # type: ignore[arg-type]
    columns = values.pop("columns")
    return request_from_options(table, source, columns, **load_options.changed(values), **objects)


@load_options.with_load_options
def preview(
    conn: str | ConnectionFactory,
    table: str,
    source: str | Sequence[str] = (),
    *,
    driver: str = "psycopg",
    **objects: Unpack[LoadArguments],
) -> Preview:
    """What :func:`load` with the same arguments would do, nothing kept or changed: the
    files and bytes, the COPY streams, the strategy and why, the checks passed, and the target
    or each of its table partitions with the rows it holds now (the catalog's estimate) and the
    partitions the rows go to. Raises
    what the load's prepare would refuse. See :mod:`airflow_pg_bulk.loading.preview`.

    :param conn: a libpq DSN/URI, or a function returning new DB-API connections.
    :param table: the target, ``schema.table``; it must exist.
    :param source: as :func:`load`'s.
    :load options:
    :param driver: ``psycopg`` (3) or ``psycopg2`` when ``conn`` is a DSN.
    :param objects: the load options, as :func:`load` takes them."""
    request = _request(table, source, objects)
    session = connection_factory(conn, driver)()
    try:
        steps.start_session(session, "airflow-pg-bulk preview")
        with snapshots.snapshots_released(unless_prepared=False):
            return previewing.preview(session, request)
    finally:
        close_cancelling(session)


def _schema_of(table: str) -> str:
    try:
        return split_name(table)[0]
    except ValueError:
        return "public"


def remove_leftovers(
    conn: str | ConnectionFactory, table: str, *, dry_run: bool = False, driver: str = "psycopg"
) -> list[cleaning.Leftover]:
    """List, and unless ``dry_run`` drop, the tables of loads into ``table`` that are not
    running (a load killed by SIGKILL, a crash), finalized or not; a running load's are left.
    See :func:`airflow_pg_bulk.loading.cleanup.remove_leftovers`.

    :param conn: a libpq DSN/URI, or a function returning new DB-API connections.
    :param table: the target, ``schema.table``.
    :param dry_run: only list them.
    :param driver: ``psycopg`` (3) or ``psycopg2`` when ``conn`` is a DSN.

    Returns each load found, with its tables and whether it is running."""
    schema, name = split_name(table)
    session = connection_factory(conn, driver)()
    try:
        return cleaning.remove_leftovers(session, schema, name, dry_run=dry_run)
    finally:
        close_cancelling(session)
