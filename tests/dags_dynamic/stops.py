"""DAGs whose loads are stopped or left half done, run with ``dag.test()`` by tests/test_kill.py:
a ``replace_partitions`` whose finalize has a 3 s ``execution_timeout`` (its partitions are
built side by side), and an in-place append (its staging outlives finalize, for cleanup to
drop). Each reads ``table``, ``source`` and ``conn_id`` from the run's conf.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag

from airflow_pg_bulk import pg_bulk_load

START = pendulum.datetime(2026, 1, 1, tz="UTC")
FINALIZE_TIMEOUT = timedelta(seconds=3)


def _load(**options: Any) -> Any:
    """A load of the run's conf, without retries (a failure shows at once)."""
    return pg_bulk_load(
        group_id="load",
        postgres_conn_id="{{ dag_run.conf['conn_id'] }}",
        table="{{ dag_run.conf['table'] }}",
        source="{{ dag_run.conf['source'] }}",
        partitions=2,
        copy_retries=0,
        finalize_retries=0,
        **options,
    )


@dag(dag_id="pg_bulk_finalize_timeout", schedule=None, start_date=START, catchup=False)
def finalize_timeout() -> None:
    load = _load(mode="replace_partitions")
    load.finalize.execution_timeout = FINALIZE_TIMEOUT


@dag(dag_id="pg_bulk_append_in_place", schedule=None, start_date=START, catchup=False)
def append_in_place() -> None:
    _load(mode="append", strategy="in_place")


finalize_timeout()
append_in_place()
