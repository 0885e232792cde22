"""The load's figures cover the whole load, prepare's start to the swap: measured from outside
(around ``load()``; the DAG run's task instances) they agree within 5 %, and the phases they
list add up to their wall time."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from helpers import returned_xcom

from airflow_pg_bulk import load
from airflow_pg_bulk.demo import workload
from airflow_pg_bulk.demo.connection import airflow_connection_json
from airflow_pg_bulk.plan.figures import LoadSummary, whole_load

EXAMPLES = Path(__file__).resolve().parent.parent / "dags_examples"
FINALIZE_PHASES = {"check", "indexes", "constraints", "analyze", "swap", "drop_old"}


def _within(part: float, whole: float, share: float = 0.05) -> bool:
    return abs(part - whole) <= share * whole


def _readings(db, directory: Path, meters: int) -> str:
    """The demo's workload (meters PK, readings PK + FK, 60 days) as 4 CSV files."""
    conn = psycopg.connect(db.dsn, autocommit=True)
    workload.create_schema(conn, db.schema, readings_tables=("readings",))
    workload.fill_meters(conn, db.schema, meters)
    workload.write_readings(conn, workload.Workload(meters=meters, days=60, files=4), directory)
    conn.close()
    return str(directory / "readings-*.csv")


@pytest.fixture
def readings(db, tmp_path):
    """60,000 readings."""
    return _readings(db, tmp_path, 1000)


def test_in_process_figures_span_the_whole_call(db, readings):
    started = time.perf_counter()
    summary = load(db.dsn, db.table("readings"), readings, header=True, mode="replace")
    measured = time.perf_counter() - started

    print(
        f"load() measured {measured:.3f} s; figures {summary.wall_seconds:.3f} s, phases sum"
        f" {sum(summary.seconds.values()):.3f} s"
    )
    assert summary.rows == 60_000 and summary.whole
    phases = list(summary.seconds)
    assert phases[:4] == ["prepare", "wait_copy", "copy", "wait_finalize"]
    assert set(phases[4:-1]) == FINALIZE_PHASES and phases[-1] == "cleanup"
    assert all(s >= 0 for s in summary.seconds.values())
    assert _within(summary.wall_seconds, measured), (summary.wall_seconds, measured)
    assert _within(sum(summary.seconds.values()), summary.wall_seconds), summary.describe()
    assert summary.rows_per_second == pytest.approx(summary.rows / summary.wall_seconds)
    text = summary.describe()
    assert f"in {summary.wall_seconds:.2f} s:" in text and "wait_copy" in text


def test_copy_phase_is_the_ledgers_span(db, readings):
    summary = load(
        db.dsn, db.table("readings"), readings, header=True, mode="append", jobs=1,
        strategy="in_place",
    )  # fmt: skip
    # one connection: the 4 COPYs run one after another; their span holds all of them
    assert summary.seconds["copy"] > 0
    assert set(summary.seconds) >= {"insert", "prepare", "copy", "cleanup"}
    assert _within(sum(summary.seconds.values()), summary.wall_seconds)


@pytest.mark.dag_run
def test_dag_figures_match_the_task_instances(airflow_db, db, tmp_path, monkeypatch):
    """dag.test() runs the demo's DAG: finalize's XCom spans prepare's start to finalize's
    end, as the metadata database records them, within 5 % or 0.5 s (the tasks' start-up and
    wrap-up outside the load)."""
    readings = _readings(db, tmp_path, 16000)
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_DEMO", airflow_connection_json(db.dsn))
    dag = DagBag(dag_folder=str(EXAMPLES)).get_dag("pg_bulk_smart_meter")
    conf = {"table": db.table("readings"), "readings": readings}
    # the first dag.test() of a process spends seconds starting its execution API inside the
    # first task instance (its start_date is taken before that): measure the second run
    assert dag.test(run_conf=conf).state == "success"
    run = dag.test(run_conf=conf)
    assert run.state == "success"
    tis = {ti.task_id: ti for ti in run.get_task_instances() if ti.map_index < 0}
    figures = returned_xcom(run, "load_readings.finalize")
    summary = LoadSummary.from_dict(figures)
    prepare, finalize = tis["load_readings.prepare"], tis["load_readings.finalize"]
    tasks_span = (finalize.end_date - prepare.start_date).total_seconds()

    print(
        f"prepare start to finalize end {tasks_span:.3f} s; figures {summary.wall_seconds:.3f} s,"
        f" phases sum {sum(summary.seconds.values()):.3f} s\n{summary.describe()}"
    )
    assert summary.rows == 960_000 and summary.whole
    assert figures["wall_seconds"] == pytest.approx(summary.ended_at - summary.started_at)
    assert list(summary.seconds)[:4] == ["prepare", "wait_copy", "copy", "wait_finalize"]
    assert set(list(summary.seconds)[4:]) == FINALIZE_PHASES
    assert _within(sum(summary.seconds.values()), summary.wall_seconds)
    # the load lies inside the tasks' span, and fills it but for task start-up and wrap-up
    assert prepare.start_date.timestamp() <= summary.started_at
    assert summary.ended_at <= finalize.end_date.timestamp()
    times = sorted(
        (
            ti.start_date.timestamp() - summary.started_at,
            ti.end_date.timestamp() - summary.started_at,
            ti.task_id,
            ti.map_index,
        )
        for ti in run.get_task_instances()
    )
    # outside the load: prepare's start-up, and finalize's wrap-up, which now includes the
    # target's Asset event, registered with the task's end (0.1 to 0.4 s on 2 busy cores)
    outside = tasks_span - summary.wall_seconds
    assert 0 <= outside <= max(0.05 * tasks_span, 0.5), (summary.describe(), tasks_span, times)


def test_figures_of_finalize_alone_say_so():
    finalized = LoadSummary("s.t", "append", 10, 1000, 2, {"check": 0.5, "insert": 1.5})
    assert not finalized.whole and finalized.wall_seconds == 2.0
    assert "finalize alone" in finalized.describe()
    assert LoadSummary.from_dict(finalized.to_dict()) == finalized


def test_whole_load_adds_the_gaps_between_steps():
    from airflow_pg_bulk.plan import LoadPlan

    plan = LoadPlan.__new__(LoadPlan)  # only the times matter here
    object.__setattr__(plan, "started_at", 100.0)
    object.__setattr__(plan, "prepared_at", 101.0)
    finalized = LoadSummary("s.t", "replace", 10, 2_000_000, 2, {"check": 0.5, "swap": 1.5})

    summary = whole_load(finalized, plan, (103.0, 110.0), 115.0)

    assert summary.seconds == {
        "prepare": 1.0,
        "wait_copy": 2.0,
        "copy": 7.0,
        "wait_finalize": 3.0,
        "check": 0.5,
        "swap": 1.5,
    }
    assert summary.wall_seconds == 15.0 == sum(summary.seconds.values())
    assert summary.megabytes_per_second == pytest.approx(2 / 15)
    assert LoadSummary.from_dict(summary.to_dict()) == summary
