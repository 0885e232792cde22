"""End-to-end test of AirflowStandalone: a real scheduler runs mapped tasks in parallel."""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_pg_bulk.demo.harness import (
    AirflowStandalone,
    DagRunResult,
    TaskRun,
    find_home_processes,
)

FIXTURE_DAGS = Path(__file__).parent / "fixture_dags"


def _processes_mentioning(home: Path) -> list[str]:
    """Live processes whose environ or cmdline mention ``home`` (zombies ignored)."""
    marker = os.fsencode(str(home))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            if stat[stat.rfind(b")") + 2 :].split()[0] in (b"Z", b"X"):
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        if marker in cmdline or marker in environ:
            args = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {args}")
    return found


def test_dag_run_result_timings_and_describe() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    result = DagRunResult(
        dag_id="d",
        run_id="r",
        state="success",
        triggered_at=t0,
        queued_at=at(0.1),
        start=at(0.5),
        end=at(9),
        tasks=[
            TaskRun("make", -1, "success", at(1), at(2), 10),
            TaskRun("probe", 1, "success", at(3), at(6), 12),
            TaskRun("probe", 0, "success", at(2.5), at(5), 11),
            TaskRun("probe", 2, "success", at(6), at(8), 13),  # touches, no overlap
            TaskRun("never", -1, "upstream_failed", None, None, None),
        ],
    )
    assert result.wall_seconds == 9
    assert result.scheduling_latency == 1
    assert result.max_concurrency("probe") == 2
    assert result.max_concurrency() == 2
    assert [t.map_index for t in result.task_runs("probe")] == [0, 1, 2]
    assert result.tasks[1].duration == 3 and result.tasks[4].duration is None
    assert [t.label for t in result.failed_tasks] == ["never"]
    text = result.describe()
    assert "probe[1]" in text and "upstream_failed" in text and "max concurrency 2" in text
    assert "    3.00" in text  # offsets relative to the trigger


@pytest.mark.slow
def test_standalone_runs_mapped_tasks_in_parallel(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="airflow_pg_bulk")
    t0 = time.monotonic()
    with AirflowStandalone(FIXTURE_DAGS, parallelism=8, startup_timeout=180) as af:
        assert af.home is not None and af.home.is_dir()
        home = af.home
        pgid = af.pid
        startup = time.monotonic() - t0
        af.wait_for_dag("runner_probe", timeout=120)
        parsed = time.monotonic() - t0
        result = af.run_dag("runner_probe", timeout=300)
        print(
            f"\nstartup {startup:.1f} s, DAG parsed at {parsed:.1f} s, "
            f"trigger->end {result.wall_seconds:.1f} s, "
            f"latency {result.scheduling_latency:.1f} s\n{result.describe()}"
        )
        assert result.state == "success", result.describe()

        probes = result.task_runs("probe")
        assert [t.map_index for t in probes] == [0, 1, 2, 3], result.describe()
        assert all(t.state == "success" for t in probes), result.describe()
        assert all(t.start is not None and t.end is not None for t in probes)
        assert all((t.duration or 0) >= 3 for t in probes), result.describe()
        # Parallelism: several task processes at once, i.e. overlapping intervals
        # (distinct pids alone would also hold for sequential runs in fresh processes).
        assert result.max_concurrency("probe") >= 2, result.describe()
        assert len({t.pid for t in probes}) == 4, result.describe()
        assert [t.label for t in result.task_runs("make_items")] == ["make_items"]
        assert result.scheduling_latency is not None and result.scheduling_latency >= 0
        t_exit = time.monotonic()

    teardown = time.monotonic() - t_exit
    assert not home.exists(), "temporary AIRFLOW_HOME was not removed"
    leftovers = find_home_processes(home, pgid=pgid)
    assert not leftovers, f"airflow processes still running: {sorted(leftovers)}"
    assert not _processes_mentioning(home), _processes_mentioning(home)
    print(f"teardown {teardown:.1f} s; total {time.monotonic() - t0:.1f} s")
