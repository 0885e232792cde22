"""Example: each night, yesterday's rows of an operational (OLTP) PostgreSQL table into a
warehouse table partitioned by day. The run's data interval is the incremental cursor: the
query takes the source rows whose ``updated_at`` falls in ``[data_interval_start,
data_interval_end)`` (the previous day, UTC), streamed with ``COPY (query) TO STDOUT`` straight
into the load (bytes, not rows), in two ranges of ``id`` read in parallel. With
``mode="replace_partitions"`` the day's table partition ends up with exactly those rows, in one
short transaction, and the other days' partitions are not touched: running a night again (a
retry, a backfill, a cleared run) gives the same table.

The warehouse table has the source's columns plus ``day`` (``updated_at``'s date in UTC), and
is partitioned by it, one partition per day::

    CREATE TABLE public.orders_daily (id bigint, customer text, amount numeric(12,2),
        updated_at timestamptz, day date NOT NULL) PARTITION BY RANGE (day);

A row updated twice is loaded on the day of its last update only (the source keeps one row per
id); its earlier day keeps the version loaded then.

Run as is: set the connections ``pg_bulk_example`` (the warehouse, or
``PG_BULK_EXAMPLE_CONN_ID``) and ``pg_bulk_example_oltp`` (the source, or
``PG_BULK_EXAMPLE_SOURCE_CONN_ID``; any ``postgres`` connection), then
``airflow dags test example_pg_bulk_nightly_from_postgres 2026-11-21``: a run started by hand
covers the last whole day before its date, so this one loads the rows updated on 20 November
into that day's partition (a scheduled run, just after midnight, does the same for the day
that just ended).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_pg_bulk import pg_bulk_load


# [START example_nightly_from_postgres]
@dag(
    dag_id="example_pg_bulk_nightly_from_postgres",
    # one run per day, just after midnight UTC, whose data interval is the day before
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "table": Param("public.orders_daily", type="string"),
        "source_table": Param("public.orders", type="string"),
    },
    tags=["airflow-pg-bulk", "example"],
)
def nightly_from_postgres() -> None:
    """The rows the source changed in the data interval replace that day's table partition."""
    pg_bulk_load(
        group_id="load_day",
        postgres_conn_id=os.environ.get("PG_BULK_EXAMPLE_CONN_ID", "pg_bulk_example"),
        table="{{ params.table }}",
        source_conn_id=os.environ.get("PG_BULK_EXAMPLE_SOURCE_CONN_ID", "pg_bulk_example_oltp"),
        query=(
            "SELECT id, customer, amount, updated_at,"
            " (updated_at AT TIME ZONE 'UTC')::date AS day"
            " FROM {{ params.source_table }}"
            " WHERE updated_at >= '{{ data_interval_start }}'"
            " AND updated_at < '{{ data_interval_end }}'"
        ),
        split_by="id",
        partitions=2,
        mode="replace_partitions",
    )


# [END example_nightly_from_postgres]


nightly_from_postgres_dag = nightly_from_postgres()
