"""Example: load one big CSV object from S3 (or any S3-compatible store) into a table, the
object cut into byte ranges that parallel COPY tasks read with range requests, straight into
COPY: no task downloads the object, and prepare reads only a small window at each split point.

The credentials come from an Airflow ``aws`` connection (``source_conn_id``); its extra
``endpoint_url`` points at an S3-compatible store (MinIO, Ceph, moto). The table is replaced
in one short transaction at the end, or left as it was if anything fails.

Run as is: set the connections ``pg_bulk_example`` (PostgreSQL) and ``pg_bulk_s3`` (aws), or
``PG_BULK_EXAMPLE_CONN_ID`` / ``PG_BULK_EXAMPLE_S3_CONN_ID``, then
``airflow dags test example_pg_bulk_load_from_s3 -c '{"source": "s3://landing/events.csv"}'``.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag, task

from airflow_pg_bulk import pg_bulk_load


# [START example_load_from_s3]
@dag(
    dag_id="example_pg_bulk_load_from_s3",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "table": Param("public.events", type="string"),
        "source": Param("s3://landing/events.csv", type="string"),
    },
    tags=["airflow-pg-bulk", "example"],
)
def load_from_s3() -> None:
    """A header names the columns; the object is cut into 4 ranges, one COPY task each."""
    load = pg_bulk_load(
        group_id="load_events",
        postgres_conn_id=os.environ.get("PG_BULK_EXAMPLE_CONN_ID", "pg_bulk_example"),
        table="{{ params.table }}",
        source="{{ params.source }}",
        source_conn_id=os.environ.get("PG_BULK_EXAMPLE_S3_CONN_ID", "pg_bulk_s3"),
        format="csv",
        header=True,
        mode="replace",
        partitions=4,
    )

    @task
    def report(figures: dict) -> str:
        """Downstream tasks get the load's figures through XCom."""
        return f"{figures['rows']} rows loaded from object storage"

    report(load.finalize.output)


# [END example_load_from_s3]


load_from_s3_dag = load_from_s3()
