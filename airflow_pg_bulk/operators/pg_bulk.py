"""The operators of a bulk load. They are thin: render templates, call the hook, return plain
data through XCom, and turn terminal errors into ``AirflowFailException`` (no retries)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

from airflow_pg_bulk import naming
from airflow_pg_bulk.catalog import split_name
from airflow_pg_bulk.errors import (
    BadDataError,
    ConstraintViolationError,
    IncompleteLoadError,
    LoadRefusedError,
)
from airflow_pg_bulk.hooks.pg_bulk import PgBulkHook
from airflow_pg_bulk.plan import LOAD_OPTIONS, LoadPlan, LoadRequest, request_from_options

_TERMINAL = (BadDataError, ConstraintViolationError, LoadRefusedError, IncompleteLoadError)
UI_COLOR = "#d7e9f7"


@contextmanager
def _terminal_errors_fail() -> Iterator[None]:
    """Bad data, refused loads and constraint violations fail at once: a retry cannot help."""
    try:
        yield
    except _TERMINAL as exc:
        raise AirflowFailException(str(exc)) from exc


def load_id_from_context(context: Context, prepare_task_id: str) -> str:
    """The load id of this DAG run's load: the same in every task and on every retry."""
    return naming.load_id_for(context["dag"].dag_id, context["run_id"], prepare_task_id)


class _PgBulkOperator(BaseOperator):
    """Shared by the bulk-load operators: the connection id and the hook."""

    ui_color = UI_COLOR

    def __init__(self, *, postgres_conn_id: str = "postgres_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.postgres_conn_id = postgres_conn_id

    @cached_property
    def hook(self) -> PgBulkHook:
        """The hook of ``postgres_conn_id``."""
        return PgBulkHook(postgres_conn_id=self.postgres_conn_id)


class PgBulkPrepareOperator(_PgBulkOperator):
    """Validate the load, capture the target's definition, create staging, split the source.

    Returns the partition numbers (``[0, 1, ...]``) as its XCom, to map the COPY tasks over,
    and pushes the plan (a dict) under the XCom key ``plan``::

        PgBulkCopyOperator.partial(task_id="copy", plan=prepare.output["plan"]).expand(
            partition=prepare.output)

    :param postgres_conn_id: Airflow connection id of the target database (``postgres`` type).
    :param table: the target table, ``schema.table`` or ``table``; it must exist. (templated)
    :param source: a path or glob, or a list of them, of files every worker can read;
        ``.gz`` files are decompressed. (templated)
    :param format: ``csv`` or ``text`` (PostgreSQL's text format).
    :param header: files start with a header line naming the columns (matched by name).
    :param delimiter: field delimiter; default ``,`` (csv) or tab (text).
    :param null: the string meaning NULL; default empty (csv) or ``\\N`` (text).
    :param quote: csv quote character (default ``"``).
    :param escape: csv escape character (default: the quote character).
    :param encoding: the files' encoding as PostgreSQL names it (default ``UTF8``).
    :param mode: ``replace`` or ``append`` (see the README for each mode's guarantee).
    :param partitions: number of COPY partitions; default one per ``partition_size``, max 16.
    :param partition_size: bytes of input per partition when ``partitions`` is not given.
    :param columns: target columns the fields fill, in order, for files without a header.
        (templated)
    :param staging_logged: force a logged (True) or unlogged (False) staging table; default
        logged for replace, unlogged for append.
    :param lock_timeout: how long finalize may wait for the target's lock (e.g. ``"30s"``).
    :param maintenance_work_mem: memory for index builds in finalize (e.g. ``"512MB"``).
    :param synchronous_commit: ``off`` (default) or ``on`` in COPY sessions.
    :param analyze: ANALYZE the new data in finalize (default True).
    :param on_error: ``"fail"`` (default) or ``"reject"``: bad rows go to ``reject_table`` and
        the rest load, unless there are more than ``max_rejects``.
    :param max_rejects: the most rejected rows the whole load may have (with ``"reject"``).
    :param reject_table: ``schema.table`` for rejected rows (default ``pgbulk_rejects`` in the
        target's schema; created if missing; kept after the load).
    """

    template_fields: Sequence[str] = ("table", "source", "columns")

    def __init__(
        self,
        *,
        table: str,
        source: str | Sequence[str],
        columns: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        options = {name: kwargs.pop(name) for name in list(kwargs) if name in LOAD_OPTIONS}
        super().__init__(**kwargs)
        self.table = table
        self.source = source
        self.columns = columns
        self.load_options = options
        request_from_options(table, source, columns, **options)  # bad options fail at parse time

    def build_request(self) -> LoadRequest:
        """The load request from the (rendered) arguments."""
        return request_from_options(self.table, self.source, self.columns, **self.load_options)

    def execute(self, context: Context) -> list[int]:
        request = self.build_request()
        load_id = load_id_from_context(context, self.task_id)
        with _terminal_errors_fail():
            plan = self.hook.prepare(request, load_id)
        context["ti"].xcom_push(key="plan", value=plan.to_dict())
        self.log.info(
            "Load %s: %d partitions of %s, %.1f MB in all",
            load_id,
            len(plan.partitions),
            plan.target.qualified,
            plan.source_bytes / 1e6,
        )
        return [p.index for p in plan.partitions]


class PgBulkCopyOperator(_PgBulkOperator):
    """COPY one partition of the plan into staging, exactly once (map it over the partitions).

    :param postgres_conn_id: Airflow connection id of the target database.
    :param plan: the plan, the prepare task's XCom ``plan`` (``prepare.output["plan"]``).
        (templated)
    :param partition: the partition number; map with ``.expand(partition=prepare.output)``.
        (templated)
    """

    template_fields: Sequence[str] = ("plan", "partition")

    def __init__(self, *, plan: Any, partition: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.partition = partition

    def execute(self, context: Context) -> dict[str, Any]:
        plan = LoadPlan.from_dict(self.plan)
        index = int(self.partition)
        part = plan.partition(index)
        self.log.info(
            "Partition %d: %d pieces, %.1f MB: %s",
            index,
            len(part.pieces),
            part.bytes / 1e6,
            ", ".join(p.path for p in part.pieces[:5]),
        )

        def progress(done: int, expected: int) -> None:
            self.log.info("Partition %d: %.1f of %.1f MB copied", index, done / 1e6, expected / 1e6)

        with _terminal_errors_fail():
            result = self.hook.copy_partition(plan, index, progress)
        return result.to_dict()


class PgBulkFinalizeOperator(_PgBulkOperator):
    """Check every partition committed, then make the load visible atomically: rebuild indexes
    and constraints and swap (replace), or insert from staging (append).

    Returns the load's figures (rows, bytes, seconds per phase) as its XCom.

    :param postgres_conn_id: Airflow connection id of the target database.
    :param plan: the plan, the prepare task's XCom ``plan`` (``prepare.output["plan"]``).
        (templated)
    """

    template_fields: Sequence[str] = ("plan",)

    def __init__(self, *, plan: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan

    def execute(self, context: Context) -> dict[str, Any]:
        plan = LoadPlan.from_dict(self.plan)
        with _terminal_errors_fail():
            summary = self.hook.finalize(plan)
        self.log.info("%s", summary.describe())
        return {**summary.to_dict(), "rows_per_second": summary.rows_per_second}


class PgBulkCleanupOperator(_PgBulkOperator):
    """Drop the staging and ledger tables of this run (use as a teardown: it always runs).
    It never touches the target.

    :param postgres_conn_id: Airflow connection id of the target database.
    :param table: the target table, as given to prepare. (templated)
    :param prepare_task_id: the prepare task's task id (with its group prefix), from which the
        load id is derived, so cleanup works even when prepare failed.
    """

    template_fields: Sequence[str] = ("table",)

    def __init__(self, *, table: str, prepare_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.prepare_task_id = prepare_task_id

    def execute(self, context: Context) -> list[str]:
        schema, _table = split_name(self.table)
        load_id = load_id_from_context(context, self.prepare_task_id)
        dropped = self.hook.cleanup(schema, load_id)
        self.log.info("Load %s: dropped %s", load_id, dropped or "nothing (already clean)")
        return dropped
