"""The demo says where a DAG run's time went, from the run's own records, in parts that add up
to the run's wall time; it says where Airflow's logs are; it stops quietly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from airflow_pg_bulk.demo.breakdown import RunTimes, TaskTimes, describe

CLI = os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")
T0 = datetime(2026, 1, 2, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def task(task_id: str, queued: float, start: float, end: float, index: int = -1) -> TaskTimes:
    return TaskTimes(task_id, index, "success", at(queued - 0.1), at(queued), at(start), at(end))


def parts(text: str) -> dict[str, float]:
    """The breakdown's lines, name -> seconds."""
    return {
        name.strip(): float(value)
        for name, value in re.findall(r"^ {8} *(\S.*?)\s+([\d.]+) s \(", text, re.M)
    }


def test_breakdown_adds_up_to_the_run():
    run = RunTimes(
        triggered_at=T0,
        start=at(0.5),
        end=at(20.0),
        tasks=[
            task("g.prepare", 1.0, 1.5, 9.0),
            *(task("g.copy", 9.5, 10.0, 14.0, i) for i in range(2)),
            task("g.finalize", 14.5, 15.0, 17.0),
            task("g.cleanup", 17.5, 18.0, 19.0),
        ],
        figures={
            "started_at": at(8.0).timestamp(),
            "ended_at": at(16.9).timestamp(),
            "seconds": {"prepare": 0.9, "wait_copy": 1.1, "copy": 4.0, "wait_finalize": 1.0},
        },
    )

    text = describe(run, "g")
    got = parts(text)

    assert got["before the load"] == 8.0
    assert got["scheduler: trigger to prepare queued"] == 1.0
    assert got["prepare's process start-up: queued to started"] == 0.5
    assert got["task runner: started to prepare's first step (imports, DAG file)"] == 6.5
    assert got["the load itself (finalize's figures)"] == 8.9
    assert got["of which between tasks: wait_copy + wait_finalize"] == 2.1
    assert got["after the load"] == 3.1
    assert got["before the load"] + got["the load itself (finalize's figures)"] + got[
        "after the load"
    ] == pytest.approx(20.0)
    assert "Where the run's 20.00 s went" in text
    assert "g.copy[1]" in text


def test_breakdown_of_a_run_that_did_not_load():
    run = RunTimes(T0, at(0.5), at(3.0), [task("g.prepare", 1.0, 1.5, 2.0)], None)
    assert "no breakdown" in describe(run, "g")


@pytest.mark.slow
def test_demo_explains_the_dag_runs_time_and_stops_quietly(pg_dsn, tmp_path):
    done = subprocess.run(
        [CLI, "demo", "--conn", pg_dsn, "--meters", "300", "--days", "10"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # the demo itself (this was test_cli's own run of the same command)
    assert "Same 3,000 rows in every table" in out
    assert "Airflow DAG (trigger to success)" in out
    assert "load_readings.copy[3]   success" in out
    wall = float(re.search(r"Where the run's ([\d.]+) s went", out).group(1))
    got = parts(out)
    top = ("before the load", "the load itself (finalize's figures)", "after the load")
    assert sum(got[name] for name in top) == pytest.approx(wall, abs=0.03)
    load = float(re.search(r"DAG: the load \(finalize's figures\)\s+([\d.]+) s", out).group(1))
    assert load == pytest.approx(got["the load itself (finalize's figures)"], abs=0.01)
    assert "Airflow's logs (deleted at exit; --workdir DIR keeps them)" in out
    assert "Airflow stopped in" in out
    for noise in ("Warning", "SIGKILL", "SIGTERM", "Traceback", "could not stop"):
        assert noise not in done.stderr, done.stderr[-3000:]


def test_task_instances_are_listed_in_step_order_whatever_their_times():
    """Celery queues mapped COPY tasks in any order: the listing follows the steps, then the
    map index, so that two runs print alike."""
    tasks = [
        task("g.cleanup", 17.5, 18.0, 19.0),
        task("g.copy", 9.6, 10.0, 14.0, 2),
        task("g.finalize", 14.5, 15.0, 17.0),
        task("g.copy", 9.5, 10.0, 14.0, 10),
        task("g.prepare", 1.0, 1.5, 9.0),
        task("g.copy", 9.4, 10.0, 14.0, 0),
    ]
    listed = [
        re.findall(
            r"g\.\w+(?:\[\d+\])?", describe(RunTimes(T0, at(0.5), at(20.0), order, None), "g")
        )
        for order in (tasks, tasks[::-1])
    ]
    expected = ["g.prepare", "g.copy[0]", "g.copy[2]", "g.copy[10]", "g.finalize", "g.cleanup"]
    assert listed[0] == listed[1] == expected
