"""Fixture DAG for the AirflowStandalone runner test: 4 mapped tasks that sleep 3 s each."""

from __future__ import annotations

import os
import time

from airflow.sdk import dag, task


@dag(dag_id="runner_probe", schedule=None, catchup=False, tags=["airflow_pg_bulk_test"])
def runner_probe() -> None:
    """Fan out over four items; each mapped task sleeps and returns its pid."""

    @task
    def make_items() -> list[int]:
        return [0, 1, 2, 3]

    @task
    def probe(item: int) -> int:
        time.sleep(3)
        return os.getpid()

    probe.expand(item=make_items())


runner_probe()
