"""The operators of a bulk load. They are thin: render templates, call the hook, return plain
data through XCom, and turn terminal errors into ``AirflowFailException`` (no retries)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_pg_bulk import naming, options
from airflow_pg_bulk.errors import (
    AlreadyLoadedError,
    BadDataError,
    ConstraintViolationError,
    IncompleteLoadError,
    LoadRefusedError,
)
from airflow_pg_bulk.plan import (
    LoadPlan,
    LoadRequest,
    Partition,
    RunOrder,
    request_from_options,
)

if TYPE_CHECKING:  # the hook, figures and catalog pull in psycopg and the SQL: imported in execute
    from airflow_pg_bulk.hooks.pg_bulk import PgBulkHook

_TERMINAL = (BadDataError, ConstraintViolationError, LoadRefusedError, IncompleteLoadError)
UI_COLOR = "#d7e9f7"


@contextmanager
def _terminal_errors_fail() -> Iterator[None]:
    """Bad data, refused loads and constraint violations fail at once: a retry cannot help."""
    try:
        yield
    except _TERMINAL as exc:
        raise AirflowFailException(str(exc)) from exc


def load_id_from_context(
    context: Context, prepare_task_id: str, prepare_map_index: int | None = None
) -> str:
    """The load id of this DAG run's load: the same in every task and on every retry.

    A mapped prepare (``.expand()``, or inside a mapped task group) runs one load per map
    index, so its map index is part of the id; an unmapped one keeps the id it always had."""
    parts = [context["dag"].dag_id, context["run_id"], prepare_task_id]
    if prepare_map_index is not None and prepare_map_index >= 0:
        parts.append(str(prepare_map_index))
    return naming.load_id_for(*parts)


def prepare_map_index_of(
    context: Context, prepare_task_id: str, given: int | None = None
) -> int | None:
    """The map index of the prepare task instance whose load this task works on: ``given`` if
    not None; else this task's own map index when prepare is mapped (expanded itself, or inside
    a mapped task group: the instances of one group, or tasks expanded over the same list,
    share their map index); else None (prepare is not mapped)."""
    if given is not None:
        return int(given)
    prepare = context["dag"].get_task(prepare_task_id)
    if prepare.is_mapped or prepare.get_closest_mapped_task_group() is not None:
        return context["ti"].map_index
    return None


def plan_from_xcom(
    context: Context, prepare_task_id: str, prepare_map_index: int | None
) -> LoadPlan:
    """The plan the prepare task pushed under the XCom key ``plan``: fetched when the task
    runs, so it is not a rendered template field of every COPY task."""
    plan = context["ti"].xcom_pull(
        task_ids=prepare_task_id,
        key="plan",
        map_indexes=-1 if prepare_map_index is None else prepare_map_index,
    )
    if not plan:
        raise AirflowFailException(
            f"no plan in the XCom of {prepare_task_id!r} (map index {prepare_map_index}):"
            " did prepare run, and is prepare_task_id right?"
        )
    return LoadPlan.from_dict(plan)


def logical_date(context: Context) -> str | None:
    """The DAG run's logical date (else its ``run_after``) in ISO 8601, or None."""
    when = context.get("logical_date")
    if when is None:
        dag_run = context.get("dag_run")
        when = getattr(dag_run, "run_after", None)
    return when.isoformat() if when is not None else None


def run_order(context: Context, prepare_task_id: str) -> RunOrder | None:
    """The run's place in the ordering rule: the scope ``<dag_id>.<prepare task id>``, the run
    id and its data interval. A run without a data interval (Airflow 3 gives none to a manual
    run triggered without a logical date) is the instant it was triggered (its ``run_after``):
    loads are then ordered by when they were asked for. None when neither is known."""
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        when = context.get("logical_date") or getattr(context.get("dag_run"), "run_after", None)
        if when is None:
            return None
        start = end = when
    return RunOrder(
        scope=f"{context['dag'].dag_id}.{prepare_task_id}",
        run_id=str(context["run_id"]),
        interval_start=start.isoformat(),
        interval_end=end.isoformat(),
    )


def session_name(context: Context, load_id: str) -> str:
    """The ``application_name`` of the task's session: ``pgbulk:<load_id>:<dag_id>.<task_id>``
    with ``[<map index>]`` for a mapped task (63 bytes at most, keeping the load id)."""
    ti = context["ti"]
    return naming.application_name(
        load_id, f"{ti.dag_id}.{ti.task_id}", getattr(ti, "map_index", None)
    )


class _PgBulkOperator(BaseOperator):
    """Shared by the bulk-load operators: the connection id and the hook."""

    ui_color = UI_COLOR

    def __init__(self, *, postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.postgres_conn_id = postgres_conn_id

    @cached_property
    def hook(self) -> PgBulkHook:
        """The hook of ``postgres_conn_id``."""
        from airflow_pg_bulk.hooks.pg_bulk import PgBulkHook

        return PgBulkHook(postgres_conn_id=self.postgres_conn_id)

    def on_kill(self) -> None:
        """Cancel the statement the server runs for this task. Airflow calls this from its
        SIGTERM handler (the task was marked failed or cleared, the worker is shutting down)
        and after an ``execution_timeout``; a statement interrupted by the timeout itself is
        cancelled as its exception leaves the step."""
        if "hook" in self.__dict__ and self.hook.cancel():  # (no hook: nothing ran)
            self.log.warning("Killed: cancelled the statement running for %s", self.task_id)


class PgBulkPrepareOperator(_PgBulkOperator):
    """Validate the load, capture the target's definition, create staging, split the source.

    Stores each COPY stream's pieces (the byte ranges it copies) in the load's pieces table in
    the target database, which each COPY task reads by its COPY stream number. Returns the
    COPY stream numbers (``[0, 1, …]``) as its XCom, to map the COPY tasks over, and pushes what
    every task shares (the plan without the pieces) under the XCom key ``plan``, which copy and
    finalize fetch themselves (their ``prepare_task_id``): both a few KB whatever the number
    of files::

        PgBulkCopyOperator.partial(task_id="copy", prepare_task_id="prepare").expand(
            partition=prepare.output)

    Mapped (``.partial(...).expand(table=[...])``, or inside a mapped task group), each
    instance runs a load of its own: its map index is part of the load id.

    Every argument below is templated (the load options as declared in
    :mod:`airflow_pg_bulk.options`) and checked when the task runs: a value of the wrong type
    fails the task at once naming the argument and what it was (``header='yes'``). A template
    renders text: a boolean may be ``true``/``false`` (any case), a number its digits, a list
    of columns comma-separated (``"id, v"``) or as a list renders (``"['id', 'v']"``); an empty
    text for a boolean, a number or a list of columns means not given (the default).

    :param postgres_conn_id: Airflow connection id of the target database (``postgres`` type).
        (templated)
    :param table: the target table, ``schema.table`` or ``table``; it must exist. (templated)
    :param source: a path or glob, or a list of them, of files every worker can read, or
        object-storage URLs and globs (``s3://bucket/prefix/*.csv.gz``, read with
        ``source_conn_id``); gzip content is decompressed. (templated)
    :load options:
    """

    __doc__ = options.documented(__doc__, "PgBulkPrepareOperator")

    # every load option declared templated in airflow_pg_bulk.options, checked in execute
    template_fields: Sequence[str] = (
        "table",
        "source",
        "postgres_conn_id",
        *options.templated_names(),
    )
    template_fields_renderers = {"source": "json", "columns": "json", "key": "json"}

    @options.with_load_options
    def __init__(self, *, table: str, source: str | Sequence[str] = (), **kwargs: Any) -> None:
        given = options.take(kwargs)  # one attribute per load option; the rest: BaseOperator's
        super().__init__(**kwargs)
        if given["mode"] is None:  # no destructive default: refused at parse time, as it can
            request_from_options("", "", mode=None)  # never render
        self.table = table
        self.source = source
        for name, value in given.items():
            setattr(self, name, value)

    @property
    def load_options(self) -> dict[str, Any]:
        """The load options as given (or as rendered, once Airflow rendered them)."""
        return {name: getattr(self, name) for name in options.NAMES}

    def build_request(self) -> LoadRequest:
        """The load request from the (rendered) arguments: type-checked and validated here,
        at run time, so that any of them may be a template or an upstream task's output. A
        value of the wrong type (``header="yes"``, ``partitions="many"``) is a ``TypeError``
        or ``ValueError`` naming the argument and what it was."""
        given = {name: options.checked(name, value) for name, value in self.load_options.items()}
        columns = given.pop("columns")
        given["source_conn_id"] = given["source_conn_id"] or None
        if given["source_url"]:
            raise ValueError(
                "source_url is for the command line and load(): under Airflow name the source "
                "database by its connection, source_conn_id, so that no password travels "
                "through XCom"
            )
        return request_from_options(
            _checked_table(self.table), _checked_source(self.source), columns, **given
        )

    def execute(self, context: Context) -> list[int]:
        from airflow_pg_bulk.loading import sources
        from airflow_pg_bulk.plan import figures

        started_at = time.time()
        try:
            request = self.build_request()
        except (TypeError, ValueError) as exc:  # bad (rendered) options: a retry cannot help
            raise AirflowFailException(f"{self.task_id}: {exc}") from exc
        load_id = load_id_from_context(context, self.task_id, context["ti"].map_index)
        hold_source_database(sources.for_request(request).connection_id)
        try:
            with _terminal_errors_fail():
                plan = self.hook.prepare(
                    request,
                    load_id,
                    logical_date=logical_date(context),
                    run=run_order(context, self.task_id),
                    application_name=session_name(context, load_id),
                )
        except AirflowFailException as exc:
            if isinstance(exc.__cause__, AlreadyLoadedError):  # a finished append, cleared
                raise AirflowSkipException(str(exc)) from exc
            raise
        plan = figures.stamp_prepare(plan, started_at, time.time())
        # every task reads the shared plan (a few KB whatever the number of files); each COPY
        # task is mapped over the partition numbers returned (Airflow hands every mapped task
        # the whole list) and reads its own pieces from the pieces table
        context["ti"].xcom_push(key="plan", value=plan.shared().to_dict())
        self.log.info(
            "Load %s: %d COPY streams into %s, %.1f MB in all",
            load_id,
            len(plan.partitions),
            plan.target.qualified,
            plan.source_bytes / 1e6,
        )
        return [p.index for p in plan.partitions]


def hold_source_database(conn_id: str | None) -> None:
    """Resolve a database source's Airflow connection in this task and hold its URL in this
    process for the load (:func:`airflow_pg_bulk.loading.database.urls.hold_connection`): only the
    connection id travels through XCom. Its hook's SQLAlchemy URL where it has one (a
    ``postgres`` connection's), else its ``get_uri()`` (``sqlite``, ...); a ``mysql``
    connection without the MySQL provider as a PyMySQL URL (:func:`_mysql_url`)."""
    from airflow.sdk import BaseHook

    from airflow_pg_bulk.loading.database import urls

    if not conn_id:
        return
    connection = BaseHook.get_connection(conn_id)
    if connection.conn_type == "postgres" and (connection.host or "").startswith("/"):
        # a Unix socket directory, not a host name (a sqlite connection's host is its file)
        urls.hold_connection(conn_id, _socket_url(connection))
        return
    if connection.conn_type in MYSQL_CONN_TYPES and not _has_hook(connection.conn_type):
        urls.hold_connection(conn_id, _mysql_url(connection))
        return
    hook = connection.get_hook()
    try:
        url = hook.sqlalchemy_url.render_as_string(hide_password=False)
    except (AttributeError, NotImplementedError):
        url = hook.get_uri()
    urls.hold_connection(conn_id, url)


#: connection types read with PyMySQL (``airflow-pg-bulk[mysql]``) when the MySQL provider,
#: whose hook needs ``mysqlclient`` (a C extension built against the MySQL client library),
#: is not installed
MYSQL_CONN_TYPES = ("mysql", "mariadb")


def _has_hook(conn_type: str) -> bool:
    """An installed provider gives ``conn_type`` a hook."""
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    return conn_type in ProvidersManagerTaskRuntime().hooks


def _mysql_url(connection: Any) -> str:
    """A ``mysql`` connection as a SQLAlchemy URL read by PyMySQL (``mysql+pymysql://``); its
    ``charset`` extra kept (default ``utf8mb4``: every character MySQL stores)."""
    charset = (connection.extra_dejson or {}).get("charset", "utf8mb4")
    return _url_of(
        connection,
        "mysql+pymysql",
        host=connection.host or None,
        port=connection.port or None,
        query={"charset": charset},
    )


def _socket_url(connection: Any) -> str:
    """A PostgreSQL connection whose host is a Unix socket directory, as a URL libpq reads
    (``postgresql://user@/db?host=/run/postgresql&port=5432``): the hook's SQLAlchemy URL
    would put the directory where a host name goes, and the database name after it."""
    query = {"host": connection.host}
    if connection.port:
        query["port"] = str(connection.port)
    return _url_of(connection, "postgresql", query=query)


def _url_of(
    connection: Any,
    drivername: str,
    *,
    query: dict[str, str],
    host: str | None = None,
    port: int | None = None,
) -> str:
    """An Airflow connection's login, password and schema (its database) as a SQLAlchemy
    URL of ``drivername`` with ``host``, ``port`` and ``query``; the password kept."""
    import sqlalchemy.engine

    url = sqlalchemy.engine.URL.create(
        drivername,
        username=connection.login or None,
        password=connection.password or None,
        host=host,
        port=port,
        database=connection.schema or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def _checked_table(value: Any) -> str:
    """The (rendered) ``table``: a non-empty text."""
    table = options.as_text("table", value)
    if not table.strip():
        raise ValueError("table must name the target table, not an empty text")
    return table


def _checked_source(value: Any) -> str | list[str]:
    """The (rendered) ``source``: a text, or a list of texts (paths may be ``os.PathLike``)."""
    import os

    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(v, (str, os.PathLike)) for v in value):
        return [os.fspath(v) for v in value]
    raise TypeError(
        f"source must be a path, glob or URL, or a list of them, not {value!r}"
        f" ({type(value).__name__})"
    )


class PgBulkCopyOperator(_PgBulkOperator):
    """COPY streams of the plan into staging, each exactly once (map it over the COPY streams;
    a COPY stream is a slice of the input, not a partition of the target table).

    The plan is not an argument: the task fetches it from the XCom ``plan`` of
    ``prepare_task_id`` when it runs (the plan without pieces, a few KB), so it is not stored
    as a rendered field of every COPY task, and reads its COPY streams' pieces from the load's
    pieces table, which prepare wrote. Wired by hand::

        PgBulkCopyOperator.partial(task_id="copy", prepare_task_id="prepare").expand(
            partition=prepare.output)

    Put ``prepare >> copy`` in the DAG (expanding over ``prepare.output`` does that).

    :param postgres_conn_id: Airflow connection id of the target database. (templated)
    :param prepare_task_id: the prepare task's task id, with its group prefix
        (``prepare.task_id``).
    :param partition: the COPY stream's number, as prepare returns them (not a table
        partition), or a list of numbers
        (copied one after another, each in its own transaction); map with
        ``.expand(partition=prepare.output)``: over a mapped prepare's output, each COPY task
        gets one prepare instance's list. A whole COPY stream (a dict with its ``pieces``) is
        copied as given. (templated)
    :param partition_stride: with an int ``partition`` ``i``: copy COPY streams ``i``,
        ``i + partition_stride``, ``i + 2 * partition_stride``, … (those the plan has; none is
        not an error), for a fixed number of unmapped COPY tasks; default none: only
        ``partition``.
    :param prepare_map_index: the map index of the prepare instance whose plan to copy; default
        this task's own map index when prepare is mapped (or in a mapped task group), else
        prepare's only instance.
    """

    template_fields: Sequence[str] = ("partition", "postgres_conn_id")
    template_fields_renderers = {"partition": "json"}

    def __init__(
        self,
        *,
        prepare_task_id: str,
        partition: Any,
        partition_stride: int | None = None,
        prepare_map_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.prepare_task_id = prepare_task_id
        self.partition = partition
        self.partition_stride = partition_stride
        self.prepare_map_index = prepare_map_index

    def partition_numbers(self, count: int) -> list[int]:
        """The (rendered) COPY stream numbers this task copies, of a plan of ``count``."""
        if self.partition_stride:
            return list(range(int(self.partition), count, int(self.partition_stride)))
        items = self.partition if isinstance(self.partition, (list, tuple)) else [self.partition]
        return [int(p["index"]) if isinstance(p, dict) else int(p) for p in items]

    def partitions(self, plan: LoadPlan, session: str) -> list[Partition]:
        """The COPY streams (with their pieces) this task copies: given whole (dicts with their
        pieces), as they are; else, given numbers, with the pieces read from the load's pieces
        table."""
        items = self.partition if isinstance(self.partition, (list, tuple)) else [self.partition]
        if not self.partition_stride and all(isinstance(p, dict) and "pieces" in p for p in items):
            return [Partition.from_dict(p) for p in items]
        numbers = self.partition_numbers(len(plan.partitions))
        if not numbers:
            return []
        with _terminal_errors_fail():
            return self.hook.read_pieces(plan, numbers, application_name=session)

    def execute(self, context: Context) -> dict[str, Any] | list[dict[str, Any]]:
        from airflow_pg_bulk.loading import sources

        map_index = prepare_map_index_of(context, self.prepare_task_id, self.prepare_map_index)
        plan = plan_from_xcom(context, self.prepare_task_id, map_index)
        hold_source_database(sources.for_plan(plan).connection_id)
        name = session_name(context, plan.load_id)
        with self.hook.session(name):  # its pieces and its COPYs: one session, never two
            mine = self.partitions(plan, name)
            plan = plan.with_partitions(mine)
            numbers = [p.index for p in mine]
            results = [self._copy(plan, index, name) for index in numbers]
        if not numbers:
            self.log.info(
                "Load %s: none of the %d COPY streams is this task's",
                plan.load_id,
                len(plan.partitions),
            )
        single = not self.partition_stride and not isinstance(self.partition, (list, tuple))
        return results[0] if single else results

    def _copy(self, plan: LoadPlan, index: int, session: str) -> dict[str, Any]:
        part = plan.partition(index)
        self.log.info(
            "Load %s: COPY stream %d: %d pieces, %.1f MB: %s",
            plan.load_id,
            index,
            len(part.pieces),
            part.bytes / 1e6,
            ", ".join(p.path for p in part.pieces[:5]),
        )

        def progress(done: int, expected: int) -> None:
            self.log.info(
                "Load %s: COPY stream %d: %.1f of %.1f MB copied",
                plan.load_id,
                index,
                done / 1e6,
                expected / 1e6,
            )

        with _terminal_errors_fail():
            result = self.hook.copy_partition(plan, index, progress, application_name=session)
        return result.to_dict()


class PgBulkFinalizeOperator(_PgBulkOperator):
    """Check every partition committed, then make the load visible atomically: rebuild indexes
    and constraints and swap (replace), or insert from staging (append).

    Returns the load's figures (rows, bytes, seconds per phase) as its XCom. Fetches the plan
    from the XCom ``plan`` of ``prepare_task_id`` when it runs; put it downstream of the COPY
    tasks (``copies >> finalize``).

    :param postgres_conn_id: Airflow connection id of the target database. (templated)
    :param prepare_task_id: the prepare task's task id, with its group prefix
        (``prepare.task_id``).
    :param prepare_map_index: the map index of the prepare instance whose load to finalize;
        default this task's own map index when prepare is mapped (or in a mapped task group),
        else prepare's only instance. Mapped over tables by hand:
        ``.expand(prepare_map_index=range(len(tables)))``.
    """

    template_fields: Sequence[str] = ("postgres_conn_id",)

    def __init__(
        self, *, prepare_task_id: str, prepare_map_index: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.prepare_task_id = prepare_task_id
        self.prepare_map_index = prepare_map_index

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pg_bulk.plan import figures

        map_index = prepare_map_index_of(context, self.prepare_task_id, self.prepare_map_index)
        plan = plan_from_xcom(context, self.prepare_task_id, map_index)
        name = session_name(context, plan.load_id)
        # one session for the pieces, the COPY span and finalize (a session's start is a new
        # server backend: 14-41 ms of a daily reload measured in process)
        with self.hook.session(name):
            # the pieces too, from the pieces table: to load a partition a partial clear left
            # out or whose guessed bounds were wrong, and for lineage
            with _terminal_errors_fail():
                whole = self.hook.read_pieces(
                    plan, [p.index for p in plan.partitions], application_name=name
                )
            plan = plan.with_partitions(whole)
            copies = None
            try:  # the COPY tasks' span, for the whole load's figures (prepare's start: the plan)
                copies = self.hook.copy_span(plan, application_name=name)
            except Exception:  # finalize says what is wrong with the ledger
                self.log.warning(
                    "Load %s: could not read the COPY times from the ledger",
                    plan.load_id,
                    exc_info=True,
                )
            with _terminal_errors_fail():
                summary = self.hook.finalize(plan, application_name=name)
        summary = figures.whole_load(summary, plan, copies, time.time())
        self.log.info("Load %s: %s", plan.load_id, summary.describe())
        self._announce(context, plan, summary)
        return summary.to_dict()

    def _announce(self, context: Context, plan: LoadPlan, summary: Any) -> None:
        """Attach the target's Asset to this task's AssetAlias outlets (the event DAGs
        scheduled on the target wait for), and keep what OpenLineage asks for."""
        from airflow.sdk import Asset, AssetAlias

        from airflow_pg_bulk import lineage

        connection = self.hook.get_connection(self.postgres_conn_id)
        uri = lineage.asset_uri(connection, plan.target.schema, plan.target.table)
        self._lineage = (plan, summary, uri)
        for outlet in self.outlets:
            if isinstance(outlet, AssetAlias):
                context["outlet_events"][outlet].add(
                    Asset(uri), extra=lineage.asset_extra(plan, summary)
                )
        self.log.info("Load %s: asset %s", plan.load_id, uri)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the source files in; the target out, with its schema, rows and bytes
        (and lifecycle OVERWRITE for a replace). Called by the openlineage provider, when
        installed, after a successful run."""
        from airflow_pg_bulk import lineage

        if getattr(self, "_lineage", None) is None:
            return None
        return lineage.operator_lineage(*self._lineage)


class PgBulkCleanupOperator(_PgBulkOperator):
    """Drop the staging and ledger tables of this run (use as a teardown: it always runs).
    It never touches the target.

    :param postgres_conn_id: Airflow connection id of the target database. (templated)
    :param table: the target table, as given to prepare. (templated)
    :param prepare_task_id: the prepare task's task id (with its group prefix), from which the
        load id is derived, so cleanup works even when prepare failed.
    :param prepare_map_index: the map index of the prepare instance whose load to clean up;
        default this task's own map index when prepare is mapped (or in a mapped task group),
        else prepare's only instance.
    :param lock_timeout: the load's ``lock_timeout``: the longest wait for the lock on one of
        the run's tables, tried a few times before cleanup fails naming what is left; default
        ``30s``. (templated)
    """

    template_fields: Sequence[str] = ("table", "postgres_conn_id", "lock_timeout")

    def __init__(
        self,
        *,
        table: str,
        prepare_task_id: str,
        prepare_map_index: int | None = None,
        lock_timeout: str = options.default("lock_timeout"),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.prepare_task_id = prepare_task_id
        self.prepare_map_index = prepare_map_index
        self.lock_timeout = lock_timeout

    def execute(self, context: Context) -> list[str]:
        from airflow_pg_bulk.naming import split_name

        schema, _table = split_name(_checked_table(self.table))
        map_index = prepare_map_index_of(context, self.prepare_task_id, self.prepare_map_index)
        load_id = load_id_from_context(context, self.prepare_task_id, map_index)
        lock_timeout = options.BY_NAME["lock_timeout"].default
        try:
            lock_timeout = options.checked("lock_timeout", self.lock_timeout) or lock_timeout
        except (TypeError, ValueError) as exc:  # prepare refused it: clean up all the same
            self.log.warning("%s; cleanup waits at most %s for a lock", exc, lock_timeout)
        dropped = self.hook.cleanup(
            schema,
            load_id,
            lock_timeout=lock_timeout,
            application_name=session_name(context, load_id),
        )
        self.log.info("Load %s: dropped %s", load_id, dropped or "nothing (already clean)")
        return dropped
