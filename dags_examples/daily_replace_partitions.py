"""Example: the daily idempotent reload of a partitioned table. Each run loads the files of its
own day (``{{ ds }}`` in the source) with ``mode="replace_partitions"``: every table partition that
receives a row ends up with exactly the loaded rows, in one short transaction (DETACH the old,
ATTACH the new), and the other partitions are not touched. Running a day again (a retry, a
backfill, a cleared run) gives the same table.

The table is partitioned by day (``PARTITION BY RANGE (day)``, one partition per day), so a
day's files replace exactly that day. With monthly partitions a day's files would replace the
whole month: a partition that receives rows keeps only them.

Run as is: set the connection ``pg_bulk_example`` (or ``PG_BULK_EXAMPLE_CONN_ID``), then
``airflow dags test example_pg_bulk_daily_replace_partitions 2026-11-20 -c
'{"source_dir": "/data/readings"}'`` (reads ``/data/readings/2026-11-20/*.csv``).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag

from airflow_pg_bulk import pg_bulk_load


# [START example_daily_replace_partitions]
@dag(
    dag_id="example_pg_bulk_daily_replace_partitions",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "table": Param("public.readings", type="string"),
        "source_dir": Param("/data/readings", type="string"),
    },
    tags=["airflow-pg-bulk", "example"],
)
def daily_replace_partitions() -> None:
    """The day's files, with a header line; the day's table partition replaced, the others kept."""
    pg_bulk_load(
        group_id="load_day",
        postgres_conn_id=os.environ.get("PG_BULK_EXAMPLE_CONN_ID", "pg_bulk_example"),
        table="{{ params.table }}",
        source="{{ params.source_dir }}/{{ ds }}/*.csv",
        format="csv",
        header=True,
        mode="replace_partitions",
        partitions=2,
    )


# [END example_daily_replace_partitions]


daily_replace_partitions_dag = daily_replace_partitions()
