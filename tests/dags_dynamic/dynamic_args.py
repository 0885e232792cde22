"""DAGs whose load arguments are known only at run time: an upstream task's output as
``source``, templated ``mode``, ``partitions`` and ``postgres_conn_id``, and the prepare
operator mapped over tables (``.partial().expand()``). Loaded by tests/test_dags.py.

(``pg_bulk_load`` inside a mapped task group is not here: Airflow 3.3 refuses a mapped task,
our copy, inside a mapped task group: "operator expansion in an expanded task group is not yet
supported".)"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from airflow_pg_bulk import pg_bulk_load
from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

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


@dag(dag_id="pg_bulk_mapped_prepare", schedule=None, start_date=START, catchup=False)
def mapped_prepare() -> None:
    PgBulkPrepareOperator.partial(
        task_id="prepare", postgres_conn_id="pg_bulk_example", mode="append", source="/x.csv"
    ).expand(table=["s.a", "s.b"])


upstream_source()
mapped_prepare()
