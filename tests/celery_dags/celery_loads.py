"""Fixture DAGs for the CeleryExecutor test (tests/test_celery.py): one replace load of four
partitions whose every task takes the pool ``PG_BULK_TEST_POOL``, and the same load sent to the
queue ``bulkq``. The connection id comes from the environment; table and files from params."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag

from airflow_pg_bulk import pg_bulk_load

CONN_ID = os.environ.get("PG_BULK_TEST_CONN_ID", "pg_bulk_test")
POOL = os.environ.get("PG_BULK_TEST_POOL", "pgbulk_copies")


def _load(dag_id: str, **settings: object) -> None:
    @dag(
        dag_id=dag_id,
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        params={"table": Param("public.t", type="string"), "source": Param("", type="string")},
        tags=["airflow_pg_bulk_test"],
    )
    def load() -> None:
        pg_bulk_load(
            group_id="load",
            postgres_conn_id=CONN_ID,
            table="{{ params.table }}",
            source="{{ params.source }}",
            format="csv",
            mode="replace",
            partitions=4,
            **settings,  # type: ignore[arg-type]
        )

    load()


_load("pg_bulk_celery_pool", pool=POOL)
_load("pg_bulk_celery_bulkq", queue="bulkq")
