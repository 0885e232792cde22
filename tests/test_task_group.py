"""``pg_bulk_load`` gives the ``BaseOperator`` settings it is given to every task of the group,
with per-step retries for copy and finalize. Built DAGs only: nothing runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from airflow.sdk import DAG

from airflow_pg_bulk.task_group import pg_bulk_load

TASKS = ("prepare", "copy", "finalize", "cleanup")


def _failed(context):  # a callback, to check that it is passed on
    return None


def _build(**settings):
    with DAG("task_group_settings", schedule=None) as dag:
        pg_bulk_load(group_id="g", table="s.t", source="/x.csv", mode="append", **settings)
    return {name: dag.task_dict[f"g.{name}"] for name in TASKS}


def _setting(task, name):
    """A setting of a task; for the mapped copy task, as given to ``.partial()``."""
    partial = getattr(task, "partial_kwargs", None)
    if partial is not None and name in partial:
        return partial[name]
    return getattr(task, name)


def test_operator_settings_reach_every_task_of_the_group():
    timeout = timedelta(minutes=7)
    config = {"KubernetesExecutor": {"request_memory": "2Gi"}}
    tasks = _build(
        queue="bulk",
        retries=5,
        retry_delay=timedelta(seconds=3),
        execution_timeout=timeout,
        executor_config=config,
        priority_weight=9,
        owner="loader",
        pool="pg",
        pool_slots=2,
        on_failure_callback=_failed,
    )
    assert type(tasks["copy"]).__name__ == "MappedOperator"
    for name, task in tasks.items():
        assert _setting(task, "queue") == "bulk", name
        assert _setting(task, "retries") == 5, name
        assert _setting(task, "retry_delay") == timedelta(seconds=3), name
        assert _setting(task, "execution_timeout") == timeout, name
        assert _setting(task, "executor_config") == config, name
        assert _setting(task, "priority_weight") == 9, name
        assert _setting(task, "owner") == "loader", name
        assert _setting(task, "pool") == "pg", name
        assert _setting(task, "pool_slots") == 2, name
        callbacks = _setting(task, "on_failure_callback")
        assert callbacks == _failed or _failed in callbacks, name


def test_copy_and_finalize_retries_override_retries():
    tasks = _build(retries=4, copy_retries=1, finalize_retries=6)
    assert _setting(tasks["prepare"], "retries") == 4
    assert _setting(tasks["copy"], "retries") == 1
    assert _setting(tasks["finalize"], "retries") == 6
    assert _setting(tasks["cleanup"], "retries") == 4


def test_finalize_retries_by_default_soon():
    tasks = _build()
    finalize = tasks["finalize"]
    assert finalize.retries >= 2
    assert finalize.retry_delay <= timedelta(seconds=30)
    assert _setting(tasks["copy"], "retries") == 2


def test_run_time_arguments_are_accepted_at_parse_time_and_checked_in_execute():
    from airflow.sdk import task

    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

    with DAG("task_group_run_time_arguments", schedule=None) as dag:

        @task
        def list_files() -> list[str]:
            return ["/x.csv"]

        pg_bulk_load(
            group_id="g",
            table="{{ params.table }}",
            source=list_files(),
            mode="{{ params.mode }}",
            partitions="{{ params.partitions }}",
            postgres_conn_id="{{ params.conn_id }}",
        )
    prepare = dag.task_dict["g.prepare"]
    assert {"table", "source", "mode", "partitions", "columns", "postgres_conn_id"} <= set(
        prepare.template_fields
    )
    for name in ("copy", "finalize", "cleanup"):
        assert "postgres_conn_id" in dag.task_dict[f"g.{name}"].template_fields, name

    rendered = PgBulkPrepareOperator(
        task_id="p", table="s.t", source=["/a.csv"], mode="append", partitions="3"
    )
    assert rendered.build_request().partitions == 3
    bad = PgBulkPrepareOperator(task_id="q", table="s.t", source="/a.csv", mode="sideways")
    with pytest.raises(ValueError):
        bad.build_request()


def test_parsing_a_dag_imports_no_driver_sql_or_steps():
    """DAG-parse time imports the operators and the group only: psycopg, the provider's hook,
    the SQL and the steps are imported when a task runs."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from airflow.sdk import DAG\n"
        "from airflow_pg_bulk import pg_bulk_load\n"
        "with DAG('d', schedule=None):\n"
        "    pg_bulk_load(group_id='g', table='s.t', source='/x.csv', mode='append')\n"
        "heavy = ('psycopg', 'psycopg2', 'airflow.providers.postgres.hooks.postgres',\n"
        "         'airflow_pg_bulk.sql', 'airflow_pg_bulk.steps', 'airflow_pg_bulk.figures',\n"
        "         'airflow_pg_bulk.splitting', 'airflow_pg_bulk.hooks.pg_bulk')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"
