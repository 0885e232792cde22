"""The DAG-overhead benchmark cuts each task instance into phases from its task log and its
times, and the run into scheduler gaps and stages: both add up to what they cut."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from benchmarks.dag_overhead import (
    BEGIN,
    END,
    PHASES,
    critical_path,
    log_marks,
    section_of,
    task_phases,
    with_section,
)

T0 = datetime(2026, 11, 24, 14, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(seconds: float, event: str, **extra: object) -> str:
    stamp = at(seconds).isoformat().replace("+00:00", "Z")
    return json.dumps({"timestamp": stamp, "level": "info", "event": event, **extra})


LOG = [
    record(1.00, "::group::Pre Execute"),
    record(1.30, "DAG bundles loaded: dags-folder"),
    record(1.31, "Filling up the DagBag from /dags/x.py"),
    record(1.36, "Worker startup parse complete", dag_file_parse_ms=50),
    "not json: a plain line",
    record(1.40, "::endgroup::"),
    record(1.45, "Load 0123456789ab: COPY stream 0: 2 pieces"),
    record(1.70, "::group::Post Execute"),
    record(1.72, "Pushing xcom"),
    record(1.75, "::endgroup::"),
]


def test_a_task_is_cut_into_phases_that_add_up_to_queued_to_end():
    marks = log_marks(LOG)
    phases = task_phases("copy[0]", at(0.9), at(0.98), at(1.74), marks)

    got = {name: round(phases.seconds[name], 3) for name, _, _ in PHASES}
    assert got == {
        "queue": 0.08,
        "start": 0.32,
        "parse": 0.06,
        "render": 0.04,
        "execute": 0.3,
        "wrap-up": 0.04,
    }
    assert phases.seconds["parse_file"] == pytest.approx(0.05)
    assert sum(got.values()) == pytest.approx(phases.total)


def test_a_log_without_the_marks_leaves_the_phases_unknown():
    phases = task_phases("cleanup", at(1), at(2), at(3), log_marks([]))
    assert phases.seconds["queue"] == 1.0
    assert phases.seconds["execute"] is None and phases.seconds["parse_file"] is None


def test_the_critical_path_adds_up_to_the_run():
    tasks = [
        task_phases("prepare", at(1.0), at(1.1), at(2.0), {}),
        task_phases("copy[0]", at(2.5), at(2.6), at(3.5), {}),
        task_phases("copy[1]", at(2.5), at(2.9), at(3.9), {}),
        task_phases("finalize", at(4.2), at(4.3), at(5.0), {}),
        task_phases("cleanup", at(5.6), at(5.7), at(6.0), {}),
    ]
    parts = dict(critical_path(T0, at(6.5), tasks))

    assert parts["scheduler: -> prepare queued"] == 1.0
    assert parts["copy (first queued -> last end)"] == pytest.approx(1.4)
    assert parts["scheduler: -> finalize queued"] == pytest.approx(0.3)
    assert parts["scheduler: -> run marked done"] == pytest.approx(0.5)
    assert sum(parts.values()) == pytest.approx(6.5)


def test_a_full_benchmark_run_keeps_the_overhead_section():
    section = f"{BEGIN}\n## Airflow's own overhead\n| a | b |\n{END}"
    results = with_section("# benchmarks\n\nold tables\n", section)
    assert results == f"# benchmarks\n\nold tables\n\n{section}\n"
    assert section_of(results) == section

    rewritten = with_section("# benchmarks\n\nnew tables\n", section_of(results))
    assert "new tables" in rewritten and "old tables" not in rewritten
    assert section_of(rewritten) == section

    newer = section.replace("| a | b |", "| c | d |")
    assert section_of(with_section(rewritten, newer)) == newer
    assert with_section("# nothing kept\n", "") == "# nothing kept\n"
