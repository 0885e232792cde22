"""Example: append one big CSV file to a table, the file split into COPY streams at record
boundaries (quoted newlines are respected) and loaded by parallel COPY tasks.

The new rows appear all at once, in one transaction, or not at all; a bad value fails the load
with the file's line number and column, and the table is left as it was.

Run as is: set the connection ``pg_bulk_example`` (or ``PG_BULK_EXAMPLE_CONN_ID``), then
``airflow dags test example_pg_bulk_append_one_big_file -c '{"source": "/data/events.csv.gz"}'``.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag, task

from airflow_pg_bulk import pg_bulk_load


# [START example_append_one_big_file]
@dag(
    dag_id="example_pg_bulk_append_one_big_file",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "table": Param("public.events", type="string"),
        "source": Param("/data/events.csv", type="string"),
    },
    tags=["airflow-pg-bulk", "example"],
)
def append_one_big_file() -> None:
    """No header: the fields fill the table's columns in order; 64 MB of file per COPY stream."""
    load = pg_bulk_load(
        group_id="load_events",
        postgres_conn_id=os.environ.get("PG_BULK_EXAMPLE_CONN_ID", "pg_bulk_example"),
        table="{{ params.table }}",
        source="{{ params.source }}",
        format="csv",
        mode="append",
        partition_size=64 << 20,
    )

    @task
    def report(figures: dict) -> str:
        """Downstream tasks get the load's figures through XCom (prepare to the insert)."""
        return f"{figures['rows']} rows appended in {figures['wall_seconds']:.1f} s"

    report(load.finalize.output)


# [END example_append_one_big_file]


append_one_big_file_dag = append_one_big_file()
