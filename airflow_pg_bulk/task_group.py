"""``pg_bulk_load``: the TaskGroup factory that wires prepare → copy[0..N-1] → finalize, with
cleanup as a teardown that always runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import TaskGroup

from airflow_pg_bulk.operators.pg_bulk import (
    PgBulkCleanupOperator,
    PgBulkCopyOperator,
    PgBulkFinalizeOperator,
    PgBulkPrepareOperator,
)


def pg_bulk_load(
    *,
    task_id: str,
    table: str,
    source: str | Sequence[str],
    postgres_conn_id: str = "postgres_default",
    pool: str | None = None,
    max_parallel_copies: int | None = None,
    copy_retries: int = 2,
    **prepare_kwargs: Any,
) -> TaskGroup:
    """A TaskGroup that loads ``source`` into ``table``.

    ::

        prepare ──> copy[0..N-1] (mapped) ──> finalize
           └──────────── cleanup (teardown) ───────┘

    :param task_id: the group id; the tasks are ``<task_id>.prepare``, ``.copy``, ``.finalize``
        and ``.cleanup``.
    :param table: the target table, ``schema.table``. (templated)
    :param source: files or globs every worker can read. (templated)
    :param postgres_conn_id: Airflow connection id of the target database.
    :param pool: an Airflow pool for the COPY tasks, to bound the streams that hit the server
        at once across all DAGs.
    :param max_parallel_copies: at most this many COPY tasks of one run at once.
    :param copy_retries: retries of a COPY task (safe: a partition loads exactly once).
    :param prepare_kwargs: every other parameter of :class:`PgBulkPrepareOperator`
        (``format``, ``header``, ``mode``, ``partitions``, ...).
    """
    with TaskGroup(group_id=task_id) as group:
        prepare = PgBulkPrepareOperator(
            task_id="prepare",
            postgres_conn_id=postgres_conn_id,
            table=table,
            source=source,
            **prepare_kwargs,
        )
        copy_args: dict[str, Any] = {"retries": copy_retries}
        if pool:
            copy_args["pool"] = pool
        if max_parallel_copies:
            copy_args["max_active_tis_per_dagrun"] = max_parallel_copies
        plan = prepare.output["plan"]
        copies = PgBulkCopyOperator.partial(
            task_id="copy", postgres_conn_id=postgres_conn_id, plan=plan, **copy_args
        ).expand(partition=prepare.output)
        finalize = PgBulkFinalizeOperator(
            task_id="finalize", postgres_conn_id=postgres_conn_id, plan=plan
        )
        cleanup = PgBulkCleanupOperator(
            task_id="cleanup",
            postgres_conn_id=postgres_conn_id,
            table=table,
            prepare_task_id=prepare.task_id,
        )
        prepare >> copies >> finalize >> cleanup.as_teardown(setups=prepare)
    return group
