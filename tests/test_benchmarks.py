"""The benchmark suite's quick run, end to end, against the test server: every method loads
every row it should. No timing is asserted (this machine is shared and noisy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from benchmarks.run import METHODS

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a minute: the benchmark's smoke test, once per CI run (pass 1)
def test_quick_run_loads_every_row_by_every_method(pg_dsn: str, tmp_path: Path) -> None:
    out, data = tmp_path / "RESULTS.md", tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--quick",
            "--skip-airflow",
            "--skip-peers",
            "--skip-tuning",
            "--conn",
            pg_dsn,
            "--out",
            str(out),
            "--json",
            str(data),
            "--workdir",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(data.read_text())
    records = result["records"]
    text = out.read_text()
    for workload in ("A", "B", "C"):
        for method in METHODS:
            mine = [r for r in records if r["workload"] == workload and r["key"] == method.key]
            assert mine, f"{workload} {method.key} did not run"
            for r in mine:
                assert r["ok"], (workload, method.key, r["error"])
                assert r["rows"] > 0
                assert r["rows"] == r["expected"]
                assert r["seconds"] > 0
                assert f"`{method.key}`" in text
                assert method.key in proc.stdout
    for workload in ("A", "B", "C"):
        assert f"## {workload}: " in text


def test_partitioned_benchmark_loads_the_same_rows_every_way(pg_dsn: str, tmp_path: Path) -> None:
    """The partitioned benchmark at a tiny size (2 s): each method loads the same year."""
    from benchmarks import partitioned

    out = tmp_path / "partitioned.json"
    code = partitioned.main(
        ["--conn", pg_dsn, "--meters", "20", "--workdir", str(tmp_path), "--json", str(out)]
    )
    results = json.loads(out.read_text())["results"]
    assert code == 0  # every method gave the same rows, a year of them
    assert set(results) == set(partitioned.METHODS)
    assert {r["rows"] for r in results.values()} == {20 * 365}
    assert set(results["project"]["phases"]) >= {"prepare", "copy", "swap"}


def test_incremental_benchmark_gives_the_same_rows_both_ways(pg_dsn: str, tmp_path: Path) -> None:
    """benchmarks/incremental.py at a tiny size: every scenario, the project and the
    hand-written way end with the same rows (it exits 1 otherwise), as many as expected."""
    from benchmarks import incremental

    out = tmp_path / "incremental.json"
    code = incremental.main(
        ["--conn", pg_dsn, "--meters", "10", "--workdir", str(tmp_path), "--json", str(out)]
    )
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert code == 0
    assert set(results) == {s.name for s in incremental.SCENARIOS}
    assert all(r["same_result"] for r in results.values())
    assert results["append_6_on_6"]["rows_after"] == 10 * (182 + 182)
    assert results["upsert_12_on_12"]["rows_after"] == 10 * (182 + 365)  # 6 months overlap
    assert results["upsert_day_on_5y"]["rows_after"] == 10 * 5 * 365  # a day re-sent


def test_partitioned_benchmark_one_month_replaces_that_month(pg_dsn: str, tmp_path: Path) -> None:
    """The one_month scenario at a tiny size: 5 years of 20 meters, the last month re-sent;
    the project and the hand-written way leave the same target, whose month is the file's."""
    from benchmarks import partitioned

    out = tmp_path / "one_month.json"
    argv = ["--conn", pg_dsn, "--scenario", "one_month", "--meters", "20"]
    code = partitioned.main([*argv, "--workdir", str(tmp_path), "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert code == 0  # same target both ways, the month's partition holds the floor's rows
    assert set(results) == {"floor", "project", "by_hand", "delete_copy"}
    month = [20 * 31, results["floor"]["checksum"]]  # 2024-01, as sent
    assert results["project"]["month"] == results["by_hand"]["month"] == month
    assert results["delete_copy"]["month"] == month
    five_years = {(r["rows"], r["checksum"]) for n, r in results.items() if n != "floor"}
    assert len(five_years) == 1 and five_years.pop()[0] == 20 * 1826
    assert {"prepare", "copy", "route", "swap"} <= set(results["project"]["phases"])
    assert all(results[n]["reads"] > 0 for n in ("project", "by_hand", "delete_copy"))


def test_partitioned_benchmark_one_day_replaces_that_day(pg_dsn: str, tmp_path: Path) -> None:
    """The one_day scenario at a tiny size: 40 daily partitions of 20 meters, the last day
    re-sent; every way (the split_floor yardstick too) leaves the same target, whose day is
    the file's, while a reader of another day is timed."""
    from benchmarks import partitioned

    out = tmp_path / "one_day.json"
    argv = ["--conn", pg_dsn, "--scenario", "one_day", "--days", "40", "--meters", "20"]
    code = partitioned.main([*argv, "--workdir", str(tmp_path), "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert code == 0
    day = [20, results["floor"]["checksum"]]
    ways = ("project", "by_hand", "delete_copy", "split_floor")
    assert set(results) == {"floor", *ways}
    assert all(results[n]["month"] == day for n in ways)
    assert {r["rows"] for n, r in results.items() if n != "floor"} == {20 * 40}
    assert all(results[n]["reader_worst_ms"] >= 0 for n in ways)
    # each way's CPU: its thread's, and its backends' (when the server runs on this machine,
    # as the tests' servers do unless PG_BULK_TEST_DSN names another)
    with psycopg.connect(pg_dsn) as conn:
        local = partitioned.backend_cpu(conn.info.backend_pid) is not None
    for n in ways:
        cpu = results[n].get("cpu_ms")
        assert (cpu is not None and cpu["client"] > 0 and cpu["server"] > 0) == local, (n, cpu)


@pytest.mark.slow  # starts its own S3 server and loads four times: CI pass 1 only
def test_ranges_benchmark_runs_small(pg_dsn: str, tmp_path: Path) -> None:
    """benchmarks/ranges.py, 4 MB: every load loads every row (it asserts so) and the report
    names each measure."""
    from benchmarks import ranges

    report = ranges.main(
        ["--dsn", pg_dsn, "--size-mb", "4", "--a-days", "3", "--workdir", str(tmp_path)]
    )
    for measure in ("windows only (local file)", "exact serial scan", "plain COPY",
                    "load, object in the S3 server", "A from S3 / from disk"):  # fmt: skip
        assert measure in report, measure
