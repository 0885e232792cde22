"""A load whose every argument is a template of the run's params (table, source, mode,
columns, delimiter, header, partitions, on_error), with the user's ``outlets``/``inlets`` and
the DAG's ``default_args`` retries and retry delay. Loaded by tests/test_task_surface.py: the
asset events of a failed and of a successful run, the rendered values, the retries Airflow
gave each task instance.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Asset, dag

from airflow_pg_bulk import pg_bulk_load

START = pendulum.datetime(2026, 1, 1, tz="UTC")
LOADED = Asset("pg_bulk_task_surface_loaded")  # what a consumer DAG would be scheduled on
FILES = Asset("pg_bulk_task_surface_files")
RETRIES = 3
RETRY_DELAY = timedelta(seconds=1)


@dag(
    dag_id="pg_bulk_task_surface",
    schedule=None,
    start_date=START,
    catchup=False,
    default_args={"retries": RETRIES, "retry_delay": RETRY_DELAY},
    params={
        "schema": "public",
        "table": "items",
        "dir": "/data",
        "mode": "replace",
        "columns": "id,name,amount",
        "delimiter": ";",
        "header": False,
        "partitions": 2,
    },
)
def task_surface() -> None:
    pg_bulk_load(
        group_id="load",
        postgres_conn_id="pg_bulk_example",
        table="{{ params.schema }}.{{ params.table }}",
        source="{{ params.dir }}/{{ params.table }}-*.csv",
        mode="{{ params.mode }}",
        columns="{{ params.columns }}",
        delimiter="{{ params.delimiter }}",
        header="{{ params.header }}",
        partitions="{{ params.partitions }}",
        outlets=[LOADED],
        inlets=[FILES],
    )


task_surface()
