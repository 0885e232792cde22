"""Example: merge a day's changes into a table (upsert on its primary key), every day.

Each day's change files (a header line; columns matched by name) are in a folder named after
the day: ``{{ params.changes }}/2026-03-05/*.csv`` for the run of 5 March. A loaded row replaces
the target's row with the same key, the other loaded rows are added; a key changed twice that
day keeps its latest row (files in name order, then line order). The rows the changes do not
name are left as they are. All of it becomes visible at once, in one transaction, or not at
all: a bad value, or a row breaking a constraint, fails the load naming the file and line, the
table left as it was.

Run as is: set the connection ``pg_bulk_example`` (or ``PG_BULK_EXAMPLE_CONN_ID``), then
``airflow dags test example_pg_bulk_upsert_daily 2026-03-05 -c '{"changes": "/data/changes"}'``.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag, task

from airflow_pg_bulk import pg_bulk_load


# [START example_upsert_daily]
@dag(
    dag_id="example_pg_bulk_upsert_daily",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "table": Param("public.customers", type="string"),
        "changes": Param("/data/changes", type="string"),
    },
    tags=["airflow-pg-bulk", "example"],
)
def upsert_daily() -> None:
    """The day's files, chosen by the run's logical date (``ds``), merged on the key ``id``."""
    merge = pg_bulk_load(
        group_id="merge_changes",
        postgres_conn_id=os.environ.get("PG_BULK_EXAMPLE_CONN_ID", "pg_bulk_example"),
        table="{{ params.table }}",
        source="{{ params.changes }}/{{ ds }}/*.csv",
        format="csv",
        header=True,
        mode="upsert",
        key=["id"],
        partitions=2,
    )

    @task
    def report(figures: dict) -> str:
        """The load's figures: rows inserted and rows updated."""
        return f"{figures['inserted']} rows inserted, {figures['updated']} updated"

    report(merge.finalize.output)


# [END example_upsert_daily]


upsert_daily_dag = upsert_daily()
