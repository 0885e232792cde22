"""Example: replace a table with the rows of many CSV files, loaded in parallel COPY tasks.

The target keeps its indexes, constraints, triggers, grants, comments and the views over it;
readers see the old rows until the new ones are complete, then all of them at once.

Run as is: set the connection ``pg_bulk_example`` (or ``PG_BULK_EXAMPLE_CONN_ID``) and pass
the table and the files as params, e.g.
``airflow dags test example_pg_bulk_replace_many_csv -c '{"source": "/data/readings/*.csv"}'``.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag

from airflow_pg_bulk import pg_bulk_load


# [START example_replace_many_csv]
@dag(
    dag_id="example_pg_bulk_replace_many_csv",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "table": Param("public.readings", type="string"),
        "source": Param("/data/readings/*.csv", type="string"),
    },
    tags=["airflow-pg-bulk", "example"],
)
def replace_many_csv() -> None:
    """Files with a header line; columns matched by name; 4 COPY streams of similar size."""
    pg_bulk_load(
        group_id="load_readings",
        postgres_conn_id=os.environ.get("PG_BULK_EXAMPLE_CONN_ID", "pg_bulk_example"),
        table="{{ params.table }}",
        source="{{ params.source }}",
        format="csv",
        header=True,
        mode="replace",
        partitions=4,
        max_parallel_copies=4,
    )


# [END example_replace_many_csv]


replace_many_csv_dag = replace_many_csv()
