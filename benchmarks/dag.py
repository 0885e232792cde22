"""The pipeline as an Airflow DAG under a real scheduler: the package's demo DAG run by
``AirflowStandalone`` (LocalExecutor, SQLite metadata database), and where the time goes."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import airflow_pg_bulk.demo
from airflow_pg_bulk.demo.connection import airflow_connection_json
from airflow_pg_bulk.plan.figures import finalize_seconds

log = logging.getLogger(__name__)

DAG_ID = "pg_bulk_smart_meter"
CONN_ID = "pg_bulk_bench"
GROUP = "load_readings"
DAGS_FOLDER = Path(airflow_pg_bulk.demo.__file__).resolve().parent / "dags"


def _xcoms(db_path: Path, run_id: str) -> dict[tuple[str, int, str], Any]:
    """Every XCom of the run, decoded: {(task_id, map_index, key): value}."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute(
            "SELECT task_id, map_index, key, value FROM xcom WHERE dag_id = ? AND run_id = ?",
            (DAG_ID, run_id),
        ).fetchall()
    finally:
        conn.close()
    out: dict[tuple[str, int, str], Any] = {}
    for task_id, map_index, key, value in rows:
        raw = value.decode() if isinstance(value, bytes) else value
        size = len(raw) if isinstance(raw, str) else 0
        try:
            decoded = json.loads(raw) if isinstance(raw, str) else raw
            if isinstance(decoded, str):
                decoded = json.loads(decoded)
        except (TypeError, ValueError):
            decoded = raw
        out[(task_id, int(map_index), key)] = {"value": decoded, "bytes": size}
    return out


def _seconds(a: Any, b: Any) -> float | None:
    if a is None or b is None:
        return None
    return (b - a).total_seconds()


def breakdown(result: Any, xcoms: dict[tuple[str, int, str], Any]) -> dict[str, Any]:
    """Where the trigger-to-success time went, from the task instances' start/end times and the
    figures the tasks returned through XCom (the partitions' COPY seconds, finalize's phases).
    """
    prepare = result.task_runs(f"{GROUP}.prepare")
    copies = result.task_runs(f"{GROUP}.copy")
    finalize = result.task_runs(f"{GROUP}.finalize")
    cleanup = result.task_runs(f"{GROUP}.cleanup")
    if not (prepare and copies and finalize):
        return {"error": "missing task instances", "tasks": result.describe()}
    prep, fin = prepare[0], finalize[0]
    clean = cleanup[0] if cleanup else None
    copy_start = min(c.start for c in copies if c.start)
    copy_end = max(c.end for c in copies if c.end)
    copy_work = [
        float(
            xcoms.get((f"{GROUP}.copy", c.map_index, "return_value"), {})
            .get("value", {})
            .get("seconds", 0.0)
        )
        for c in copies
    ]
    fin_x = xcoms.get((f"{GROUP}.finalize", -1, "return_value"), {}).get("value") or {}
    # finalize's XCom covers the whole load: its own phases are what finalize's task did
    fin_work = finalize_seconds(fin_x.get("seconds") or {}) if isinstance(fin_x, dict) else 0.0
    plan_bytes = xcoms.get((f"{GROUP}.prepare", -1, "plan"), {}).get("bytes", 0)
    parts: list[tuple[str, float | None]] = [
        (
            "trigger -> prepare task starts (scheduling latency)",
            _seconds(result.triggered_at, prep.start),
        ),
        ("prepare task", prep.duration),
        (
            "prepare ends -> first COPY task starts (mapping + scheduling)",
            _seconds(prep.end, copy_start),
        ),
        ("COPY tasks, first start -> last end", _seconds(copy_start, copy_end)),
        ("last COPY ends -> finalize starts", _seconds(copy_end, fin.start)),
        ("finalize task", fin.duration),
    ]
    if clean is not None:
        parts += [
            ("finalize ends -> cleanup (teardown) starts", _seconds(fin.end, clean.start)),
            ("cleanup task", clean.duration),
            ("cleanup ends -> run marked success", _seconds(clean.end, result.end)),
        ]
    else:
        parts.append(("finalize ends -> run marked success", _seconds(fin.end, result.end)))
    copy_durations = [c.duration or 0.0 for c in copies]
    return {
        "wall": result.wall_seconds,
        "visible": _seconds(result.triggered_at, fin.end),
        "parts": parts,
        "copy_task_durations": copy_durations,
        "copy_work": copy_work,
        "copy_task_overhead_mean": (
            sum(d - w for d, w in zip(copy_durations, copy_work, strict=True)) / len(copies)
        ),
        "copy_concurrency": result.max_concurrency(f"{GROUP}.copy"),
        "finalize_work": fin_work,
        "finalize_overhead": (fin.duration or 0.0) - fin_work,
        "plan_xcom_bytes": plan_bytes,
        "tasks": result.describe(),
    }


def compile_package() -> int:
    """Write the provider's bytecode (``__pycache__``, ignored by git), as ``pip install`` does;
    returns the number of modules compiled.

    Run from a checkout where ``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it), every
    task process compiled the provider's modules from source: 25 ms of CPU of the DAG file's
    parse instead of 16 ms, and 49 ms of its step modules instead of 13 ms, per task (median
    CPU times of 8 interpreters each): an installed provider does not pay that."""
    import compileall

    package = Path(airflow_pg_bulk.__file__).resolve().parent
    modules = sum(1 for _ in package.rglob("*.py"))
    if not compileall.compile_dir(str(package), quiet=1):
        log.warning("could not compile every module of %s", package)
    return modules


def run_dag_loads(
    dsn: str,
    *,
    glob: str,
    table: str,
    partitions: int,
    runs: int,
    before_run: Callable[[], None],
    after_run: Callable[[dict[str, Any]], None],
    home: Path,
    airflow_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start Airflow, run the demo DAG ``runs`` times into ``table``; stop Airflow.

    ``airflow_env`` is added to the Airflow processes' environment (``AIRFLOW__*`` settings)."""
    from airflow_pg_bulk.demo.harness import AirflowStandalone
    from airflow_pg_bulk.demo.harness.standalone import parallelism_for

    env = {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": airflow_connection_json(dsn),
        "PG_BULK_DEMO_CONN_ID": CONN_ID,
        "PG_BULK_DEMO_PARTITIONS": str(partitions),
        **(airflow_env or {}),
    }
    started = time.perf_counter()
    out: dict[str, Any] = {"partitions": partitions, "runs": [], "compiled": compile_package()}
    with AirflowStandalone(
        DAGS_FOLDER, env=env, home=home, parallelism=parallelism_for(partitions)
    ) as airflow:
        out["ready_seconds"] = airflow.ready_seconds
        out["execution_api_warmup_seconds"] = airflow.execution_api_warmup_seconds
        airflow.wait_for_dag(DAG_ID, timeout=300)
        out["dag_listed_seconds"] = time.perf_counter() - started
        assert airflow.db_path is not None
        for n in range(runs):
            before_run()
            result = airflow.run_dag(DAG_ID, conf={"readings": glob, "table": table}, timeout=1800)
            info: dict[str, Any] = {
                "run": n + 1,
                "state": result.state,
                "wall": result.wall_seconds,
                "run_id": result.run_id,
                "triggered_at": result.triggered_at.isoformat(),
            }
            if result.succeeded:
                info.update(breakdown(result, _xcoms(airflow.db_path, result.run_id)))
            else:
                info["error"] = result.describe()
            after_run(info)
            out["runs"].append(info)
    out["total_seconds"] = time.perf_counter() - started
    return out
