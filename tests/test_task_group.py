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
        "         'airflow_pg_bulk.sql', 'airflow_pg_bulk.steps', 'airflow_pg_bulk.plan.figures',\n"
        "         'airflow_pg_bulk.source.boundaries', 'airflow_pg_bulk.hooks.pg_bulk')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


# --- the plan through XCom, load ids of mapped loads, mapped task groups ---------------------


def _context(dag, map_index=-1):
    """The parts of a task's context the operators read to find their load."""
    from types import SimpleNamespace

    return {"dag": dag, "run_id": "manual__1", "ti": SimpleNamespace(map_index=map_index)}


def test_load_id_of_an_unmapped_prepare_is_unchanged_and_mapped_ones_differ():
    from airflow_pg_bulk import naming
    from airflow_pg_bulk.operators.pg_bulk import load_id_from_context

    with DAG("load_ids", schedule=None) as dag:
        pass
    context = _context(dag)
    unmapped = load_id_from_context(context, "g.prepare")
    assert unmapped == naming.load_id_for("load_ids", "manual__1", "g.prepare")
    assert load_id_from_context(context, "g.prepare", -1) == unmapped
    mapped = {load_id_from_context(context, "g.prepare", i) for i in range(3)}
    assert len(mapped) == 3 and unmapped not in mapped


def test_copy_finalize_and_cleanup_find_their_prepare_instance():
    from airflow.sdk import task_group

    from airflow_pg_bulk.operators.pg_bulk import (
        PgBulkCopyOperator,
        PgBulkPrepareOperator,
        prepare_map_index_of,
    )

    with DAG("prepare_instances", schedule=None) as dag:
        pg_bulk_load(group_id="plain", table="s.t", source="/x.csv", mode="append")
        PgBulkPrepareOperator.partial(task_id="mapped", source="/x.csv", mode="append").expand(
            table=["s.a", "s.b"]
        )

        @task_group
        def each(table):
            pg_bulk_load(group_id="load", table=table, source="/x.csv", mode="append")

        each.expand(table=["s.a", "s.b"])
    copy_of_partition_1 = _context(dag, map_index=1)
    assert prepare_map_index_of(copy_of_partition_1, "plain.prepare") is None
    assert prepare_map_index_of(copy_of_partition_1, "mapped") == 1
    assert prepare_map_index_of(copy_of_partition_1, "each.load.prepare") == 1
    assert prepare_map_index_of(copy_of_partition_1, "plain.prepare", 0) == 0
    for name in ("copy", "finalize", "cleanup"):
        task = dag.task_dict[f"plain.{name}"]
        assert "plan" not in task.template_fields, name
        assert _setting(task, "prepare_task_id") == "plain.prepare", name
    assert PgBulkCopyOperator.template_fields_renderers == {"partition": "json"}
    assert PgBulkPrepareOperator.template_fields_renderers["source"] == "json"


@pytest.mark.parametrize(
    ("partition", "stride", "count", "expected"),
    [(2, None, 5, [2]), ([0, 1, 2], None, 3, [0, 1, 2]), (1, 3, 8, [1, 4, 7]), (3, 4, 3, [])],
)
def test_which_partitions_a_copy_task_copies(partition, stride, count, expected):
    from airflow_pg_bulk.operators.pg_bulk import PgBulkCopyOperator

    copy = PgBulkCopyOperator(
        task_id="c", prepare_task_id="p", partition=partition, partition_stride=stride
    )
    assert copy.partition_numbers(count) == expected


@pytest.mark.parametrize(
    ("settings", "tasks"),
    [({}, 4), ({"partitions": 3}, 3), ({"partitions": 8, "max_parallel_copies": 2}, 2)],
)
def test_in_a_mapped_task_group_the_load_has_fixed_copy_tasks(settings, tasks):
    from airflow.sdk import task_group

    with DAG("mapped_group", schedule=None) as dag:
        loads = []

        @task_group
        def each(table):
            loads.append(
                pg_bulk_load(group_id="load", table=table, source="/x", mode="append", **settings)
            )

        each.expand(table=["s.a", "s.b"])
    (load,) = loads
    assert load.in_mapped_task_group
    assert [t.task_id for t in load.copies] == [f"each.load.copy_{i}" for i in range(tasks)]
    for i, copy in enumerate(load.copies):
        assert (copy.partition, copy.partition_stride) == (i, tasks)
        assert copy.upstream_task_ids == {"each.load.prepare"}
        assert copy.downstream_task_ids == {"each.load.finalize"}
    assert not any(task.is_mapped for task in dag.tasks)


def test_the_groups_tasks_are_attributes_inside_a_parent_group():
    from airflow.sdk import TaskGroup

    with DAG("nested", schedule=None), TaskGroup("outer"):
        load = pg_bulk_load(group_id="g", table="s.t", source="/x.csv", mode="append")
    assert not load.in_mapped_task_group
    assert load.prepare.task_id == "outer.g.prepare"
    assert [t.task_id for t in load.copies] == ["outer.g.copy"]
    assert load.finalize.task_id == "outer.g.finalize"
    assert load.cleanup.task_id == "outer.g.cleanup" and load.cleanup.is_teardown


# --- lineage on finalize only; the DAG's default_args respected ------------------------------


def test_outlets_and_inlets_go_to_finalize_only():
    """An asset event of the group means its rows are visible: the user's outlets (and
    inlets) are finalize's, next to the AssetAlias of the target; prepare, the COPY tasks and
    cleanup (a teardown that succeeds after a failed load too) have none."""
    from airflow.sdk import Asset, AssetAlias

    consumer, source = Asset("pg_bulk_consumer"), Asset("pg_bulk_source_files")
    for given in ({"outlets": [consumer], "inlets": [source]}, {"outlets": consumer}):
        tasks = _build(**given)
        finalize = tasks["finalize"]
        assert finalize.outlets[0] == consumer
        assert [type(o) for o in finalize.outlets] == [Asset, AssetAlias]
        assert finalize.inlets == ([source] if "inlets" in given else [])
        for name in ("prepare", "copy", "cleanup"):
            assert not _setting(tasks[name], "outlets"), name
            assert not _setting(tasks[name], "inlets"), name


@pytest.mark.parametrize("where", ["dag", "task_group", "pg_bulk_load"])
def test_outlets_from_default_args_go_to_finalize_only(where):
    from airflow.sdk import Asset

    consumer, source = Asset("pg_bulk_consumer"), Asset("pg_bulk_source_files")
    tasks = _build_with_defaults(where, {"outlets": [consumer], "inlets": [source]})
    assert tasks["finalize"].outlets[0] == consumer
    assert tasks["finalize"].inlets == [source]
    for name in ("prepare", "copy", "cleanup"):
        assert not _setting(tasks[name], "outlets"), name
        assert not _setting(tasks[name], "inlets"), name
    given = _build_with_defaults(where, {"outlets": [source]}, outlets=[consumer])
    assert given["finalize"].outlets[0] == consumer  # given to the group: first, as Airflow's
    assert source not in given["finalize"].outlets


def _build_with_defaults(where: str, defaults: dict, **settings):
    """The group's tasks, with ``defaults`` as the DAG's default_args, an enclosing TaskGroup's
    or the group's own (``default_args=`` given to pg_bulk_load)."""
    from airflow.sdk import TaskGroup

    dag_defaults = defaults if where == "dag" else {}
    group_defaults = defaults if where == "task_group" else {}
    if where == "pg_bulk_load":
        settings["default_args"] = defaults
    with (
        DAG("task_group_defaults", schedule=None, default_args=dag_defaults) as dag,
        TaskGroup("outer", default_args=group_defaults),
    ):
        pg_bulk_load(group_id="g", table="s.t", source="/x.csv", mode="append", **settings)
    return {name: dag.task_dict[f"outer.g.{name}"] for name in TASKS}


@pytest.mark.parametrize("where", ["dag", "task_group", "pg_bulk_load"])
def test_default_args_retries_and_retry_delay_reach_copy_and_finalize(where):
    delay = timedelta(seconds=42)
    tasks = _build_with_defaults(where, {"retries": 7, "retry_delay": delay})
    for name, task in tasks.items():
        assert _setting(task, "retries") == 7, name
        assert _setting(task, "retry_delay") == delay, name


@pytest.mark.parametrize("where", ["dag", "task_group"])
def test_provider_defaults_fill_only_what_default_args_leave_out(where):
    from airflow.sdk import BaseOperator

    airflow_delay = BaseOperator(task_id="plain").retry_delay  # Airflow's own default
    only_retries = _build_with_defaults(where, {"retries": 5})
    assert _setting(only_retries["copy"], "retries") == 5
    assert _setting(only_retries["finalize"], "retries") == 5
    assert only_retries["finalize"].retry_delay == timedelta(seconds=10)  # the provider's
    assert _setting(only_retries["copy"], "retry_delay") == airflow_delay

    only_delay = _build_with_defaults(where, {"retry_delay": timedelta(seconds=3)})
    assert _setting(only_delay["copy"], "retries") == 2  # the provider's
    assert only_delay["finalize"].retries == 2
    assert only_delay["finalize"].retry_delay == timedelta(seconds=3)

    steps = _build_with_defaults(where, {"retries": 5}, copy_retries=1, finalize_retries=0)
    assert _setting(steps["copy"], "retries") == 1
    assert steps["finalize"].retries == 0
    assert steps["prepare"].retries == 5 and steps["cleanup"].retries == 5


def test_without_any_setting_the_provider_defaults_apply():
    from airflow.sdk import BaseOperator

    plain = BaseOperator(task_id="plain")
    tasks = _build()
    assert _setting(tasks["copy"], "retries") == 2
    assert tasks["finalize"].retries == 2
    assert tasks["finalize"].retry_delay == timedelta(seconds=10)
    assert _setting(tasks["copy"], "retry_delay") == plain.retry_delay
    assert tasks["prepare"].retries == plain.retries == tasks["cleanup"].retries
