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


@options.with_load_options
def pg_bulk_load(
    *,
    group_id: str | None = None,
    table: str,
    source: str | Sequence[str] = (),
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
        (``s3://bucket/prefix/*.csv.gz``, read with ``source_conn_id``); none when a
        database is the source (``source_conn_id`` with ``query`` or ``source_table``).
        (templated)
    :load options:
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
    load_options = options.take(operator_kwargs)
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
            slots = copy_tasks_in_mapped_group(max_parallel_copies, load_options["partitions"])
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
            lock_timeout=load_options["lock_timeout"],
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
    else ``partitions`` (the number of COPY streams) when it is an int, else 4."""
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
