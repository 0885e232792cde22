"""The demo's DAG: replace ``bulk_demo.readings`` with the smart-meter CSV files.

Run by ``airflow-pg-bulk demo`` under a real scheduler; also a plain example of a replace load
of many CSV files. The connection id and the partition count are read from the environment
when the file is parsed (no database is touched then); the files come from the run's params.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag

from airflow_pg_bulk import pg_bulk_load

CONN_ID = os.environ.get("PG_BULK_DEMO_CONN_ID", "pg_bulk_demo")
PARTITIONS = int(os.environ.get("PG_BULK_DEMO_PARTITIONS", "4"))


@dag(
    dag_id="pg_bulk_smart_meter",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "readings": Param(
            "/tmp/pg-bulk-demo/readings-*.csv",
            type="string",
            description="glob of the readings CSV files",
        ),
        "table": Param("bulk_demo.readings", type="string"),
    },
    tags=["airflow-pg-bulk", "demo"],
)
def smart_meter() -> None:
    """Replace the readings table from CSV files with a header, in parallel COPY tasks."""
    pg_bulk_load(
        group_id="load_readings",
        postgres_conn_id=CONN_ID,
        table="{{ params.table }}",
        source="{{ params.readings }}",
        format="csv",
        header=True,
        mode="replace",
        partitions=PARTITIONS,
    )


smart_meter_dag = smart_meter()
