"""DAGs whose load arguments are known only at run time: an upstream task's output as
``source``, templated ``mode``, ``partitions`` and ``postgres_conn_id``; loads of several
tables, each its own load: ``pg_bulk_load`` inside a mapped task group (Airflow 3.3 refuses a
mapped task inside one, "operator expansion in an expanded task group is not yet supported",
so the group has fixed COPY tasks there), and the four operators mapped over the tables by
hand (``.partial().expand()``). Loaded by tests/test_dags.py.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task, task_group

from airflow_pg_bulk import (
    PgBulkCleanupOperator,
    PgBulkCopyOperator,
    PgBulkFinalizeOperator,
    PgBulkPrepareOperator,
    pg_bulk_load,
)

START = pendulum.datetime(2026, 1, 1, tz="UTC")


@dag(dag_id="pg_bulk_upstream_source", schedule=None, start_date=START, catchup=False)
def upstream_source() -> None:
    @task
    def list_files(dag_run=None) -> list[str]:
        return sorted(dag_run.conf["files"])

    pg_bulk_load(
        group_id="load",
        postgres_conn_id="{{ dag_run.conf['conn_id'] }}",
        table="{{ dag_run.conf['table'] }}",
        source=list_files(),
        mode="{{ dag_run.conf['mode'] }}",
        partitions="{{ dag_run.conf['partitions'] }}",
        header=True,
    )


@dag(dag_id="pg_bulk_mapped_group", schedule=None, start_date=START, catchup=False)
def mapped_group() -> None:
    """One load per table of ``dag_run.conf["tables"]``: a mapped task group."""

    @task
    def loads(dag_run=None) -> list[dict[str, str]]:
        conf = dag_run.conf
        return [
            {"table": t, "source": f"{conf['dir']}/{t.split('.')[-1]}-*.csv"}
            for t in conf["tables"]
        ]

    @task_group
    def load_table(table: str, source: str) -> None:
        pg_bulk_load(
            group_id="load",
            postgres_conn_id="pg_bulk_example",
            table=table,
            source=source,
            mode="replace",
            header=True,
            partitions=3,
            max_parallel_copies=2,  # copy_0 takes partitions 0 and 2, copy_1 partition 1
        )

    load_table.expand_kwargs(loads())


TABLES = ["items_a", "items_b"]


@dag(dag_id="pg_bulk_mapped_operators", schedule=None, start_date=START, catchup=False)
def mapped_operators() -> None:
    """The four operators mapped over two tables by hand: instance ``k`` of each works on the
    load of table ``k`` (copy through prepare's output, finalize through its
    ``prepare_map_index``, cleanup through its table)."""
    conn = "pg_bulk_example"
    tables = [f"{{{{ dag_run.conf['schema'] }}}}.{t}" for t in TABLES]
    sources = [f"{{{{ dag_run.conf['dir'] }}}}/{t}-*.csv" for t in TABLES]
    prepare = PgBulkPrepareOperator.partial(
        task_id="prepare", postgres_conn_id=conn, mode="append", header=True, partitions=2
    ).expand_kwargs([{"table": t, "source": s} for t, s in zip(tables, sources, strict=True)])
    copies = PgBulkCopyOperator.partial(
        task_id="copy", postgres_conn_id=conn, prepare_task_id="prepare"
    ).expand(partition=prepare.output)
    finalize = PgBulkFinalizeOperator.partial(
        task_id="finalize", postgres_conn_id=conn, prepare_task_id="prepare"
    ).expand(prepare_map_index=list(range(len(TABLES))))
    cleanup = PgBulkCleanupOperator.partial(
        task_id="cleanup", postgres_conn_id=conn, prepare_task_id="prepare"
    ).expand(table=tables)
    copies >> finalize >> cleanup.as_teardown(setups=prepare)


upstream_source()
mapped_group()
mapped_operators()
