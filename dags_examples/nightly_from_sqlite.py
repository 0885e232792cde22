"""Example: each night, the readings a SQLite database recorded the day before (an edge
device's or an application's local store), merged into a warehouse table by ``id``. The run's
data interval is the incremental cursor: the query takes the rows whose ``recorded_at`` (ISO
text in UTC, as SQLite keeps timestamps) falls on the previous day, read through the
connection's DB-API hook and SQLAlchemy with a server-side cursor, encoded as COPY text, in two
ranges of ``id`` cut at its quantiles. With ``mode="upsert"`` a reading sent again (a device
that re-sent its buffer) replaces the one loaded before; running a night again gives the same
table.

The warehouse table::

    CREATE TABLE public.readings (id bigint PRIMARY KEY, sensor text NOT NULL,
        reading double precision, recorded_at timestamp);

Run as is: set the connections ``pg_bulk_example`` (the warehouse, or
``PG_BULK_EXAMPLE_CONN_ID``) and ``pg_bulk_example_sqlite`` (a ``sqlite`` connection whose
host is the database file, or ``PG_BULK_EXAMPLE_SQLITE_CONN_ID``; it needs
``apache-airflow-providers-sqlite``), then
``airflow dags test example_pg_bulk_nightly_from_sqlite 2026-11-21``: a run started by hand
covers the last whole day before its date, so this one loads the readings of 20 November.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_pg_bulk import pg_bulk_load


# [START example_nightly_from_sqlite]
@dag(
    dag_id="example_pg_bulk_nightly_from_sqlite",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "table": Param("public.readings", type="string"),
        "source_table": Param("readings", type="string"),
    },
    tags=["airflow-pg-bulk", "example"],
)
def nightly_from_sqlite() -> None:
    """The readings recorded in the data interval, merged into the warehouse by id."""
    pg_bulk_load(
        group_id="merge_day",
        postgres_conn_id=os.environ.get("PG_BULK_EXAMPLE_CONN_ID", "pg_bulk_example"),
        table="{{ params.table }}",
        source_conn_id=os.environ.get("PG_BULK_EXAMPLE_SQLITE_CONN_ID", "pg_bulk_example_sqlite"),
        # ISO texts compare as the instants they name: 'YYYY-MM-DD' bounds the whole day
        query=(
            "SELECT id, sensor, reading, recorded_at FROM {{ params.source_table }}"
            " WHERE recorded_at >= '{{ data_interval_start | ds }}'"
            " AND recorded_at < '{{ data_interval_end | ds }}'"
        ),
        split_by="id",
        partitions=2,
        mode="upsert",
    )


# [END example_nightly_from_sqlite]


nightly_from_sqlite_dag = nightly_from_sqlite()
