"""Loads of many small files in 16 partitions, in both shapes ``pg_bulk_load`` builds: a mapped
COPY task, and the fixed COPY tasks of a load inside a mapped task group. Run by
tests/test_xcom_sizes.py, which records what each COPY task pulls through XCom."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag, task, task_group

from airflow_pg_bulk import pg_bulk_load

START = pendulum.datetime(2026, 1, 1, tz="UTC")
PARTITIONS = 16
COPY_TASKS_IN_GROUP = 4  # copy_0 … copy_3 of the group, each copying 4 of the 16 partitions


@dag(dag_id="pg_bulk_many_files", schedule=None, start_date=START, catchup=False)
def many_files() -> None:
    pg_bulk_load(
        group_id="load",
        postgres_conn_id="pg_bulk_example",
        table="{{ dag_run.conf['table'] }}",
        source="{{ dag_run.conf['source'] }}",
        mode="append",
        partitions=PARTITIONS,
        retry_delay=timedelta(0),  # a COPY task failed on purpose is retried at once
    )


@dag(dag_id="pg_bulk_many_files_mapped_group", schedule=None, start_date=START, catchup=False)
def many_files_mapped_group() -> None:
    @task
    def loads(dag_run=None) -> list[dict[str, str]]:
        return [{"table": dag_run.conf["table"], "source": dag_run.conf["source"]}]

    @task_group
    def load_table(table: str, source: str) -> None:
        pg_bulk_load(
            group_id="load",
            postgres_conn_id="pg_bulk_example",
            table=table,
            source=source,
            mode="append",
            partitions=PARTITIONS,
            max_parallel_copies=COPY_TASKS_IN_GROUP,
        )

    load_table.expand_kwargs(loads())


many_files()
many_files_mapped_group()
