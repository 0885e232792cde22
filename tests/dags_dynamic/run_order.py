"""A daily replace with a data-interval timetable (``schedule=timedelta(days=1)`` with
``create_delta_data_intervals``: a run's logical date is the start of its interval), every
argument from the run's params, ``allow_older_run`` among them. Loaded by
tests/test_run_order.py: runs with and without a logical date under ``dag.test()``, ordered by
their data intervals.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag
from airflow.timetables.interval import DeltaDataIntervalTimetable

from airflow_pg_bulk import pg_bulk_load


@dag(
    dag_id="pg_bulk_run_order",
    schedule=DeltaDataIntervalTimetable(timedelta(days=1)),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},  # refused: no retry
    params={"table": "public.items", "source": "/nowhere/*.csv", "allow_older_run": False},
)
def run_order() -> None:
    pg_bulk_load(
        group_id="load",
        postgres_conn_id="pg_bulk_example",
        table="{{ params.table }}",
        source="{{ params.source }}",
        mode="replace",
        allow_older_run="{{ params.allow_older_run }}",
    )


run_order()
