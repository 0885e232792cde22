"""``pg_bulk_load``: the TaskGroup factory that wires prepare → copy[0..N-1] → finalize, with
cleanup as a teardown that always runs."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import TaskGroup, TriggerRule

from airflow_pg_bulk import options
from airflow_pg_bulk.operators.pg_bulk import (
    PgBulkCleanupOperator,
    PgBulkCopyOperator,
    PgBulkFinalizeOperator,
    PgBulkPrepareOperator,
)
from airflow_pg_bulk.plan import DEFAULT_PARTITION_BYTES, Mode


def pg_bulk_load(
    *,
    group_id: str | None = None,
    table: str,
    source: str | Sequence[str],
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
    postgres_conn_id: str = "postgres_default",
    pool: str | None = None,
    max_parallel_copies: int | None = None,
    copy_retries: int | None = None,
    finalize_retries: int | None = None,
    task_id: str | None = None,
    **operator_kwargs: Any,
) -> PgBulkLoadGroup:
    """A TaskGroup that loads ``source`` into ``table``; its tasks are its attributes
    ``prepare``, ``copies``, ``finalize`` and ``cleanup`` (``load.finalize.output``: the load's
    figures).

    ::

        prepare ──> copy[0..N-1] (mapped) ──> finalize
           └──────────── cleanup (teardown) ───────┘

    Inside a mapped task group each instance of the group is a load of its own (the map index
    is part of its load id), with ``max_parallel_copies`` fixed COPY tasks instead of a mapped
    one.

    :param group_id: the group id; the tasks are ``<group_id>.prepare``, ``.copy``,
        ``.finalize`` and ``.cleanup`` (``.copy_0`` … inside a mapped task group), and
        ``.cleaned``, which makes a failed cleanup fail the DAG run (after a finalize that
        succeeded too: the rows are in, but the load's tables are left; the next load into
        the target drops them, see ``abandoned_after``).
    :param table: the target table, ``schema.table``. (templated)
    :param source: files or globs every worker can read, or object-storage URLs and globs
        (``s3://bucket/prefix/*.csv.gz``, read with ``source_conn_id``). (templated)
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
    :param postgres_conn_id: Airflow connection id of the target database. (templated)
    :param pool: an Airflow pool for every task of the group, to bound the sessions that hit
        the server at once across all DAGs.
    :param max_parallel_copies: at most this many COPY tasks of one run at once. Inside a
        mapped task group (``@task_group`` … ``.expand()``), where Airflow cannot expand a
        task, the number of COPY tasks of each load: ``copy_0`` … ``copy_{N-1}``, task ``i``
        copying partitions ``i``, ``i + N``, …; default there ``partitions`` when it is an
        int, else 4.
    :param copy_retries: retries of a COPY task (safe: a partition loads exactly once); default
        ``retries`` if given (here, or in the ``default_args`` of the DAG or of an enclosing
        TaskGroup), else 2.
    :param finalize_retries: retries of finalize (safe: a retry resumes where the last attempt
        stopped, and does nothing after its commit); default ``retries`` if given (here or in
        a ``default_args``), else 2, with a ``retry_delay`` of 10 seconds unless one is given
        (here or in a ``default_args``).
    :param task_id: deprecated spelling of ``group_id`` (it names the group, not a task).
    :param operator_kwargs: ``BaseOperator`` arguments (``queue``, ``pool_slots``, ``retries``,
        ``retry_delay``, ``execution_timeout``, ``executor_config``, ``priority_weight``,
        ``owner``, ``on_failure_callback``, ...) given to every task of the group: prepare,
        each copy, finalize and cleanup; except ``outlets`` and ``inlets``, given to finalize
        only: an asset event of the group means its rows are visible (finalize succeeded),
        never that a load started or that a failed one was cleaned up.
    """
    group_id = _group_id(group_id, task_id)
    load_options = options.pick(locals())
    settings = dict(operator_kwargs)
    if pool:
        settings["pool"] = pool
    with PgBulkLoadGroup(group_id=group_id) as group:
        defaults = _default_args(group, settings)
        given = {*settings, *defaults}
        # lineage is finalize's alone (also from a default_args): an event means rows visible
        lineage = {
            name: _as_list(settings.pop(name) if name in settings else defaults.get(name))
            for name in ("outlets", "inlets")
        }
        settings.update(outlets=[], inlets=[])
        copy_args = _with_retries(settings, copy_retries, given)
        finalize_args = _with_retries(settings, finalize_retries, given)
        if "retry_delay" not in given:
            finalize_args["retry_delay"] = FINALIZE_RETRY_DELAY
        finalize_args.update(
            outlets=[*lineage["outlets"], _target_alias(group)], inlets=lineage["inlets"]
        )
        prepare = PgBulkPrepareOperator(
            task_id="prepare",
            postgres_conn_id=postgres_conn_id,
            table=table,
            source=source,
            **load_options,
            **settings,
        )
        step = {"postgres_conn_id": postgres_conn_id, "prepare_task_id": prepare.task_id}
        if not group.in_mapped_task_group:
            if max_parallel_copies:
                copy_args["max_active_tis_per_dagrun"] = max_parallel_copies
            copies: Any = PgBulkCopyOperator.partial(task_id="copy", **step, **copy_args).expand(
                partition=prepare.output
            )
        else:  # Airflow cannot expand a task inside a mapped group: N copy tasks share them
            slots = copy_tasks_in_mapped_group(max_parallel_copies, partitions)
            copies = [
                PgBulkCopyOperator(
                    task_id=f"copy_{i}", partition=i, partition_stride=slots, **step, **copy_args
                )
                for i in range(slots)
            ]
        finalize = PgBulkFinalizeOperator(task_id="finalize", **step, **finalize_args)
        cleanup = PgBulkCleanupOperator(
            task_id="cleanup",
            postgres_conn_id=postgres_conn_id,
            table=table,
            prepare_task_id=prepare.task_id,
            lock_timeout=lock_timeout,
            **settings,
        )
        prepare >> copies >> finalize >> cleanup.as_teardown(setups=prepare)
        # A teardown runs only if its setup succeeded; cleanup must also run when prepare
        # failed after its commit (a lost XCom push, a kill): it finds the run's tables by
        # the load id, whatever state prepare reached.
        cleanup.trigger_rule = TriggerRule.ALL_DONE
        cleanup >> _cleaned()  # a failed cleanup fails the run
    return group


def _cleaned() -> Any:
    """``cleaned``: the task that makes a failed cleanup fail the DAG run.

    A teardown's failure leaves the run green. ``on_failure_fail_dagrun=True`` on cleanup
    itself would be worse: Airflow 3.3 then judges the run by the teardown alone (finalize,
    upstream of it, is no longer a leaf, ``DagRun._tis_for_dagrun_state``), so a load whose
    prepare or finalize failed would end green once cleanup succeeded. ``cleaned`` is an
    ``EmptyOperator`` teardown (never run by a worker: the scheduler marks it) downstream of
    cleanup with ``all_success`` and ``on_failure_fail_dagrun``: cleanup failed, it is
    ``upstream_failed``, and the run fails; finalize stays a leaf that decides the run too;
    and being a teardown it is not one of the group's leaves (``load >> report`` still waits
    for finalize only)."""
    from airflow.providers.standard.operators.empty import EmptyOperator

    cleaned = EmptyOperator(task_id="cleaned").as_teardown(on_failure_fail_dagrun=True)
    cleaned.trigger_rule = TriggerRule.ALL_SUCCESS
    return cleaned


def _target_alias(group: TaskGroup) -> Any:
    """Finalize's outlet: an AssetAlias to which it attaches the target's Asset
    (``postgres://host:port/database/schema/table``, known only at run time)."""
    from airflow.sdk import AssetAlias

    from airflow_pg_bulk.lineage import alias_name

    dag = getattr(group, "dag", None)
    return AssetAlias(alias_name(dag.dag_id if dag else None, group.group_id))


class PgBulkLoadGroup(TaskGroup):
    """What ``pg_bulk_load`` returns: a TaskGroup whose tasks are attributes, wherever the
    group sits (``load.finalize``, not ``load.children["<parent>.<group>.finalize"]``)."""

    @property
    def in_mapped_task_group(self) -> bool:
        """Whether the group sits inside a mapped (expanded) task group."""
        return next(self.iter_mapped_task_groups(), None) is not None

    @property
    def prepare(self) -> PgBulkPrepareOperator:
        """The prepare task."""
        return self.children[self.child_id("prepare")]  # type: ignore[return-value]

    @property
    def copies(self) -> list[Any]:
        """The COPY tasks: one mapped task (``copy``), or inside a mapped task group the fixed
        ``copy_0`` … ``copy_{N-1}``."""
        return [
            task
            for label, task in self.children.items()
            if label == self.child_id("copy") or label.startswith(self.child_id("copy_"))
        ]

    @property
    def finalize(self) -> PgBulkFinalizeOperator:
        """The finalize task; its XCom is the load's figures."""
        return self.children[self.child_id("finalize")]  # type: ignore[return-value]

    @property
    def cleanup(self) -> PgBulkCleanupOperator:
        """The cleanup task (a teardown)."""
        return self.children[self.child_id("cleanup")]  # type: ignore[return-value]


FINALIZE_RETRY_DELAY = timedelta(seconds=10)
STEP_RETRIES = 2
MAPPED_GROUP_COPY_TASKS = 4


def copy_tasks_in_mapped_group(max_parallel_copies: int | None, partitions: Any) -> int:
    """How many COPY tasks a load inside a mapped task group gets: ``max_parallel_copies``,
    else ``partitions`` when it is an int, else 4."""
    if max_parallel_copies:
        return int(max_parallel_copies)
    if isinstance(partitions, int) and partitions > 0:
        return partitions
    return MAPPED_GROUP_COPY_TASKS


def _as_list(value: Any) -> list[Any]:
    """``outlets``/``inlets`` as given (one or a list) as a list."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _default_args(group: TaskGroup, settings: dict[str, Any]) -> dict[str, Any]:
    """The ``default_args`` the group's tasks get, merged as Airflow merges them for an
    operator created inside the group: the DAG's, then the enclosing TaskGroups' (the group's
    ``default_args`` holds them), then the ``default_args`` given to ``pg_bulk_load``.
    Airflow applies each to an operator unless the operator is given the setting itself."""
    dag = getattr(group, "dag", None)
    return {
        **(getattr(dag, "default_args", None) or {}),
        **(group.default_args or {}),
        **(settings.get("default_args") or {}),
    }


def _with_retries(
    settings: dict[str, Any], step_retries: int | None, given: set[str]
) -> dict[str, Any]:
    """``settings`` with a step's retries: its own if given; else the user's ``retries``
    (given to the group, or in a ``default_args``: Airflow applies them); else 2."""
    args = dict(settings)
    if step_retries is not None:
        args["retries"] = step_retries
    elif "retries" not in given:
        args["retries"] = STEP_RETRIES
    return args


def _group_id(group_id: str | None, task_id: str | None) -> str:
    """``group_id``, or the deprecated ``task_id`` with a warning."""
    if task_id is not None:
        if group_id is not None:
            raise TypeError("pg_bulk_load: give group_id only (task_id is its deprecated name)")
        warnings.warn(
            "pg_bulk_load(task_id=...) is deprecated: it names the group; use group_id=...",
            DeprecationWarning,
            stacklevel=3,
        )
        return task_id
    if group_id is None:
        raise TypeError("pg_bulk_load() needs group_id=..., the name of the task group")
    return group_id
