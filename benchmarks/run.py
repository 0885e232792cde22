"""The benchmark suite: load the same files into the same PostgreSQL server by every method.

    python -m benchmarks.run                      # full run: workloads A (365 days), B, C
    python -m benchmarks.run --quick --skip-airflow --skip-peers --conn DSN   # the test's run

Without ``--conn`` it starts a throwaway PostgreSQL cluster (Debian's binaries, initdb defaults
except shared_buffers) and deletes it at the end, also on an error or Ctrl-C. Every load runs in
a process of its own (peak RSS and CPU time from ``os.wait4``), after a CHECKPOINT, into a
freshly created target of the same definition; its row count is checked after it. The figures
go to stdout and to ``benchmarks/RESULTS.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python benchmarks/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from airflow_pg_bulk.demo.connection import airflow_connection_json
from benchmarks import dag, dag_overhead, peers, report, workloads
from benchmarks.measure import Measured, loadavg, run_measured
from benchmarks.server import find_bindir, postmaster_of, throwaway_cluster
from benchmarks.workloads import Dataset

REPO = Path(__file__).resolve().parent.parent
log = logging.getLogger("benchmarks")


# --- what is measured ------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """One way of loading a workload's files."""

    key: str
    label: str
    kind: str  # the worker's function: copy, insert_row, insert_multi, hook_*, pipeline
    target: str = "indexed"  # or bare_unlogged
    capped: bool = False
    pipeline: dict[str, Any] | None = None
    note: str = ""


def _pipe(key: str, label: str, **opts: Any) -> Method:
    opts.setdefault("mode", "replace")
    opts.setdefault("partitions", 2)
    return Method(key, label, "pipeline", pipeline=opts)


NAIVE = "copy_indexed"
FLOOR = "copy_unlogged"
OURS = "pipeline_replace_p2"

METHODS = [
    Method(
        "insert_row", "row INSERTs, executemany (one statement per row)", "insert_row", capped=True
    ),
    Method("insert_multi", "multi-row INSERT, 1,000 rows per statement", "insert_multi"),
    Method("hook_copy_expert", "PostgresHook.copy_expert, one call per file", "hook_copy_expert"),
    Method(
        "hook_bulk_load",
        "PostgresHook.bulk_load, one tab-delimited file",
        "hook_bulk_load",
        note="CSV converted to TSV beforehand, not timed",
    ),
    Method(NAIVE, "one COPY into the indexed, logged target (naive)", "copy"),
    Method(
        FLOOR,
        "one COPY into an UNLOGGED table, no indexes (floor; not a usable table)",
        "copy",
        target="bare_unlogged",
    ),
    *[
        _pipe(
            f"pipeline_replace_p{n}",
            f"airflow-pg-bulk replace, {n} partition{'s' * (n > 1)}",
            partitions=n,
        )
        for n in (1, 2, 4)
    ],
    *[
        _pipe(
            f"pipeline_append_p{n}",
            f"airflow-pg-bulk append, {n} partition{'s' * (n > 1)}",
            mode="append",
            partitions=n,
        )
        for n in (1, 2, 4)
    ],
]
KEY_METHODS = [NAIVE, FLOOR, OURS]  # repeated --reps times, interleaved

TUNING_REPLACE = [
    _pipe("tune_default", "replace, 2 partitions, defaults (baseline of each repetition)"),
    _pipe(
        "tune_replace_unlogged", "replace, staging UNLOGGED (then SET LOGGED)", staging_logged=False
    ),
    _pipe(
        "tune_mwm_64MB",
        "replace, maintenance_work_mem 64MB",
        settings={"maintenance_work_mem": "64MB"},
    ),
    _pipe(
        "tune_mwm_1GB",
        "replace, maintenance_work_mem 1GB",
        settings={"maintenance_work_mem": "1GB"},
    ),
    _pipe("tune_chunk_64KiB", "replace, COPY chunks of 64 KiB", chunk=64 << 10),
    _pipe("tune_chunk_4MiB", "replace, COPY chunks of 4 MiB", chunk=4 << 20),
    _pipe(
        "tune_sync_on",
        "replace, synchronous_commit on in COPY sessions",
        settings={"synchronous_commit": "on"},
    ),
    _pipe("tune_p8", "replace, 8 partitions (4 COPY connections at once)", partitions=8),
    _pipe("tune_p_auto", "replace, partitions not given (the package's default)", partitions=None),
]
TUNING_APPEND = [
    _pipe(
        "tune_append_default", "append, 2 partitions, defaults (staging unlogged)", mode="append"
    ),
    _pipe("tune_append_logged", "append, staging logged", mode="append", staging_logged=True),
]


@dataclass
class Record:
    """The outcome of one load."""

    workload: str
    key: str
    label: str
    group: str  # methods, tuning, memory, peers, airflow
    rep: int
    expected: int
    source_bytes: int
    rows: int = 0
    seconds: float | None = None
    extrapolated_seconds: float | None = None  # capped methods: seconds x all rows / rows
    wal_bytes: int | None = None
    peak_rss_kb: int | None = None
    client_cpu: float | None = None
    server_cpu: float | None = None
    other_cpu: float | None = None
    load: float | None = None
    table_bytes: int | None = None
    index_bytes: int | None = None
    phases: dict[str, float] = field(default_factory=dict)
    statement_kinds: dict[str, float] = field(default_factory=dict)
    slow_statements: list[Any] = field(default_factory=list)
    note: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Loaded without error, with the expected row count."""
        return self.error is None and self.rows == self.expected


# --- the run ---------------------------------------------------------------------------------


class Bench:
    """Holds the connection, the work directory and the records of one run."""

    def __init__(self, args: argparse.Namespace, dsn: str, workdir: Path, own_server: bool):
        self.args = args
        self.dsn = dsn
        self.workdir = workdir
        self.own_server = own_server
        self.conn = psycopg.connect(dsn, autocommit=True)
        backend = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        self.postmaster = postmaster_of(backend)
        self.records: list[Record] = []
        self.datasets: dict[str, Dataset] = {}
        self.airflow: dict[str, Any] = {}
        self.peer_status: dict[str, str] = {}
        self.profile: dict[str, Any] | None = None
        self.append_broken: dict[str, str] = {}
        self.append_tuning: str | None = None
        self.skipped: list[tuple[str, str, str]] = []
        self.notes: list[str] = []
        self.cluster: Any = None
        self.settings: dict[str, str] = {}
        self.elapsed = 0.0
        self._lsn: Any = None
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        (workdir / "specs").mkdir(exist_ok=True)
        self.env = self._child_env()
        self.started = datetime.now(UTC)
        self.load_start = loadavg()

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["AIRFLOW_HOME"] = str(self.workdir / "airflow-hooks")
        env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        env["AIRFLOW_CONN_BENCH_PG"] = airflow_connection_json(self.dsn)
        return env

    def say(self, text: str) -> None:
        print(text, flush=True)

    def selected(self, key: str) -> bool:
        patterns = self.args.methods
        return not patterns or any(fnmatch.fnmatch(key, p) for p in patterns)

    # --- one load ----------------------------------------------------------------------------

    def load(
        self,
        ds: Dataset,
        method: Method,
        *,
        group: str,
        rep: int = 1,
        files: list[Path] | None = None,
        rows: int | None = None,
        keep: bool = False,
    ) -> Record:
        """Create a fresh target, run the method in a subprocess, check the rows."""
        files = files or ds.files
        total = rows if rows is not None else ds.rows
        cap = self.args.insert_cap if method.capped else None
        expected = min(cap, total) if cap else total
        name = f"t_{method.key}"
        rec = Record(
            ds.key,
            method.key,
            method.label,
            group,
            rep,
            expected,
            sum(f.stat().st_size for f in files),
            note=method.note,
        )
        workloads.create_target(self.conn, ds, name, method.target)
        spec_path = self.workdir / "specs" / f"{ds.key}-{method.key}-{group}-{rep}.json"
        result_path = spec_path.with_suffix(".result.json")
        result_path.unlink(missing_ok=True)
        spec = {
            "kind": method.kind,
            "dsn": self.dsn,
            "schema": ds.schema,
            "table": name,
            "columns": ds.columns,
            "identity": ds.extra.get("identity", False),
            "files": [str(f) for f in files],
            "tsv": str(ds.tsv) if ds.tsv else None,
            "cap": cap,
            "pipeline": method.pipeline,
            "result": str(result_path),
        }
        spec_path.write_text(json.dumps(spec))
        log_path = self.logs / f"{ds.key}-{method.key}-{group}-{rep}.log"
        measured = run_measured(
            [sys.executable, "-m", "benchmarks.worker", str(spec_path)],
            log_path=log_path,
            postmaster=self.postmaster,
            env=self.env,
            cwd=REPO,
        )
        self._fill(rec, measured)
        if measured.returncode != 0 or not result_path.exists():
            rec.error = f"exit {measured.returncode}: {_tail(log_path)}"
        else:
            result = json.loads(result_path.read_text())
            rec.seconds = result["seconds"]
            rec.wal_bytes = result.get("wal_bytes")
            rec.phases = result.get("phases") or {}
            rec.statement_kinds = result.get("statement_kinds") or {}
            rec.slow_statements = result.get("slow_statements") or []
            rec.extra["partitions"] = result.get("partitions")
        self._verify(ds, name, rec)
        if cap and rec.seconds and rec.rows and ds.rows > rec.rows:
            rec.extrapolated_seconds = rec.seconds * ds.rows / rec.rows
        if not keep:
            workloads.drop_table(self.conn, ds, name)
        self.records.append(rec)
        self._print(rec)
        return rec

    def _fill(self, rec: Record, m: Measured) -> None:
        rec.peak_rss_kb = m.peak_rss_kb
        rec.client_cpu = m.client_cpu
        rec.server_cpu = m.server_cpu
        rec.other_cpu = m.other_cpu
        rec.load = m.load_before

    def _verify(self, ds: Dataset, name: str, rec: Record) -> None:
        try:
            rec.rows, rec.table_bytes, rec.index_bytes = workloads.sizes(self.conn, ds, name)
        except psycopg.Error as exc:
            rec.error = rec.error or f"verify: {exc}"
            return
        if rec.error is None and rec.rows != rec.expected:
            rec.error = f"row count {rec.rows:,} != expected {rec.expected:,}"

    def _print(self, rec: Record) -> None:
        if rec.error:
            self.say(f"  {rec.workload} {rec.key:<28} rep {rec.rep}: FAILED {rec.error[:300]}")
            return
        rate = rec.rows / rec.seconds if rec.seconds else 0
        extra = (
            f" (extrapolated {rec.extrapolated_seconds:.1f} s)" if rec.extrapolated_seconds else ""
        )
        self.say(
            f"  {rec.workload} {rec.key:<28} rep {rec.rep}: {rec.seconds:8.2f} s "
            f"{rate:>12,.0f} rows/s  rss {report.rss(rec.peak_rss_kb):>6} MB{extra}"
        )

    # --- workloads ---------------------------------------------------------------------------

    def make_datasets(self) -> None:
        a = self.args
        data = self.workdir / "data"
        for key in a.workloads:
            started = time.perf_counter()
            if key == "A":
                ds = workloads.setup_a(self.conn, data / "a", meters=a.meters, days=a.days)
                ds.extra["identity"] = True
            elif key == "B":
                ds = workloads.setup_b(self.conn, data / "b", rows=a.b_rows)
            else:
                ds = workloads.setup_c(self.conn, data / "c", rows=a.c_rows)
            if self.selected("hook_bulk_load"):
                workloads.make_tsv(self.conn, ds, data / f"{key.lower()}.tsv")
            self.datasets[key] = ds
            self.say(
                f"{ds.title}: {ds.rows:,} rows, {ds.bytes / 1e6:,.1f} MB in {len(ds.files)} "
                f"files, made in {time.perf_counter() - started:.1f} s"
            )

    def run_workload(self, ds: Dataset) -> None:
        a = self.args
        self.say(f"\n== {ds.title}")
        reps = a.reps if ds.key == "A" else a.other_reps
        by_key = {m.key: m for m in METHODS}
        for rep in range(1, reps + 1):
            for key in KEY_METHODS:
                if self.selected(key):
                    self.load(ds, by_key[key], group="methods", rep=rep, keep=False)
        appends = [m for m in METHODS if m.pipeline and m.pipeline["mode"] == "append"]
        appends.sort(key=lambda m: m.pipeline["partitions"] != 2)  # 2 partitions first
        for method in METHODS:
            if method.key in KEY_METHODS or method in appends or not self.selected(method.key):
                continue
            self.load(ds, method, group="methods")
        for method in appends:
            if not self.selected(method.key):
                continue
            if ds.key in self.append_broken:
                self.skipped.append((ds.key, method.key, self.append_broken[ds.key]))
                continue
            rec = self.load(ds, method, group="methods")
            if rec.error:  # the first append failed: say why once, skip the others
                rec.group = "failed"
                self.append_broken[ds.key] = rec.error
                self.notes.append(
                    f"- **Append into workload {ds.key} failed** (`{method.key}`), so its other "
                    f"append loads were skipped: `{_short_error(rec.error)}`"
                )
        if not a.skip_tuning:
            if ds.key in a.tuning_workloads:
                self.run_tuning(ds, TUNING_REPLACE)
            wanted = a.append_tuning_workload
            if wanted not in a.workloads or wanted in self.append_broken:
                wanted = ds.key  # then the first workload whose append works
            if (
                self.append_tuning is None
                and ds.key == wanted
                and ds.key not in self.append_broken
                and any(self.selected(m.key) for m in TUNING_APPEND)
            ):
                self.append_tuning = ds.key
                self.run_tuning(ds, TUNING_APPEND)
        if ds.key == "A" and not a.skip_tuning and self.selected(OURS):
            self.run_memory(ds)
        if ds.key == "A" and not a.skip_tuning and not a.quick and self.selected(OURS):
            self.run_profile(ds)
        if not a.skip_peers:
            self.run_peers(ds)
        if ds.key == "A" and not a.skip_airflow:
            self.run_airflow(ds)
        workloads.drop_table(self.conn, ds, f"t_{NAIVE}")
        self.say(report.console_table(self, ds))

    def run_tuning(self, ds: Dataset, variants: list[Method]) -> None:
        self.say(f"-- {ds.key}: tuning experiments ({self.args.tuning_reps} repetitions)")
        for rep in range(1, self.args.tuning_reps + 1):
            for method in variants:
                if self.selected(method.key):
                    self.load(ds, method, group="tuning", rep=rep)

    def run_memory(self, ds: Dataset) -> None:
        """Workload A at another size, same load (replace, 2 partitions): client peak RSS."""
        a = self.args
        days = a.small_days
        files = workloads.write_more_readings(
            self.conn, self.workdir / "data" / "a-small", meters=a.meters, days=days
        )
        method = Method(
            "memory_small",
            f"replace, 2 partitions, {a.meters * days:,} rows",
            "pipeline",
            pipeline={"mode": "replace", "partitions": 2},
        )
        self.say(f"-- {ds.key}: memory at {a.meters * days:,} rows")
        self.load(ds, method, group="memory", files=files, rows=a.meters * days)

    def run_profile(self, ds: Dataset) -> None:
        """One more replace (2 partitions) under py-spy: where the client's CPU goes."""
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(pyspy).exists():
            self.profile = {"error": "py-spy not installed (pip install py-spy)"}
            return
        self.say(f"-- {ds.key}: client profile (py-spy)")
        method = next(m for m in METHODS if m.key == OURS)
        name = f"t_{method.key}"
        workloads.create_target(self.conn, ds, name, "indexed")
        spec_path = self.workdir / "specs" / f"{ds.key}-profile.json"
        result_path = spec_path.with_suffix(".result.json")
        spec = {
            "kind": "pipeline",
            "dsn": self.dsn,
            "schema": ds.schema,
            "table": name,
            "columns": ds.columns,
            "files": [str(f) for f in ds.files],
            "pipeline": method.pipeline,
            "result": str(result_path),
        }
        spec_path.write_text(json.dumps(spec))
        raw = self.workdir / "profile.txt"
        rate = 100
        cmd = [
            pyspy,
            "record",
            "-o",
            str(raw),
            "-f",
            "raw",
            "-r",
            str(rate),
            "--threads",
            "--nonblocking",
            "--",
            sys.executable,
            "-m",
            "benchmarks.worker",
            str(spec_path),
        ]
        log_path = self.logs / f"{ds.key}-profile.log"
        measured = run_measured(
            cmd, log_path=log_path, postmaster=self.postmaster, env=self.env, cwd=REPO
        )
        workloads.drop_table(self.conn, ds, name)
        if measured.returncode != 0 or not raw.exists() or not result_path.exists():
            self.profile = {"error": _tail(log_path)}
            return
        wall = json.loads(result_path.read_text())["seconds"]
        own: dict[str, int] = {}
        samples = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            frames = stack.split(";")
            leaf = frames[-1] if frames else "?"
            leaf = leaf.split(" (")[0] + " (" + leaf.split(" (")[-1].split(":")[0].split("/")[-1]
            own[leaf + ")"] = own.get(leaf + ")", 0) + int(count)
            samples += int(count)
        top = sorted(own.items(), key=lambda kv: -kv[1])[:12]
        self.profile = {
            "rate": rate,
            "wall": wall,
            "samples": samples,
            "active_seconds": samples / rate,
            "top": top,
        }

    def run_peers(self, ds: Dataset) -> None:
        self.say(f"-- {ds.key}: peers")
        configs = peers.PGLOADER_CONFIGS if ds.key == "A" else peers.PGLOADER_CONFIGS[:2]
        if not peers.available("pgloader"):
            self.peer_status["pgloader"] = "not installed (apt-get install -y pgloader)"
        else:
            for config in configs:
                if self.selected(config.key):
                    self.run_pgloader(ds, config)
        if not peers.available("pgcopydb"):
            self.peer_status["pgcopydb"] = "not installed (apt-get install -y pgcopydb)"
        elif self.selected("pgcopydb"):
            self.run_pgcopydb(ds)

    def _external(
        self,
        ds: Dataset,
        key: str,
        label: str,
        cmd: list[str],
        *,
        env: dict[str, str] | None = None,
        note: str = "",
        new_session: bool = False,
    ) -> tuple[Record, Measured]:
        rec = Record(ds.key, key, label, "peers", 1, ds.rows, ds.bytes, note=note)
        rec.extra["command"] = shlex.join(cmd)
        self.checkpoint()
        lsn = self.conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        log_path = self.logs / f"{ds.key}-{key}.log"
        measured = run_measured(
            cmd,
            log_path=log_path,
            postmaster=self.postmaster,
            env=env,
            cwd=self.workdir,
            timeout=self.args.peer_timeout,
            new_session=new_session,
        )
        rec.wal_bytes = int(
            self.conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (str(lsn),)
            ).fetchone()[0]
        )
        self._fill(rec, measured)
        rec.seconds = measured.wall
        if measured.returncode != 0:
            rec.error = f"exit {measured.returncode}: {_tail(log_path)}"
        return rec, measured

    def run_pgloader(self, ds: Dataset, config: peers.PgloaderConfig) -> None:
        name = f"t_{config.key}"
        workloads.create_target(self.conn, ds, name, "indexed")
        cmd, load_file = peers.pgloader_command(ds, name, config, self.dsn, self.workdir)
        rec, _ = self._external(
            ds, config.key, config.label, cmd, note=config.note, new_session=True
        )
        rec.extra["load_file"] = load_file.read_text()
        self._verify(ds, name, rec)
        if rec.error:
            self.peer_status[config.key] = rec.error
        workloads.drop_table(self.conn, ds, name)
        self.records.append(rec)
        self._print(rec)

    def run_pgcopydb(self, ds: Dataset) -> None:
        job = peers.pgcopydb_job(
            ds,
            self.dsn,
            self.workdir,
            jobs=self.args.pgcopydb_jobs,
            split=self.args.pgcopydb_split,
        )
        for db in (job.source_db, job.target_db):
            self.conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db))
            )
            self.conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        env = dict(os.environ)
        bindir = find_bindir(self._server_major())
        if bindir:
            env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
        label = (
            f"pgcopydb clone DB->DB of the loaded tables, table-jobs {self.args.pgcopydb_jobs},"
            f" index-jobs {self.args.pgcopydb_jobs}, split tables > {self.args.pgcopydb_split}"
        )
        try:
            source_dsn = peers.with_dbname(self.dsn, job.source_db)
            with psycopg.connect(source_dsn, autocommit=True) as source:
                workloads.create_tables(source, ds)
            from airflow_pg_bulk import runner

            runner.load(
                source_dsn,
                ds.qualified(ds.template),
                [str(f) for f in ds.files],
                mode="replace",
                header=True,
                partitions=2,
            )
            rec, _ = self._external(
                ds,
                "pgcopydb",
                label,
                job.command,
                env=env,
                new_session=True,
                note="source: a database with the loaded tables, not the CSV files",
            )
            try:
                with psycopg.connect(
                    peers.with_dbname(self.dsn, job.target_db), autocommit=True
                ) as target:
                    ident = ds.ident(ds.template)
                    rec.rows = target.execute(
                        sql.SQL("SELECT count(*) FROM {}").format(ident)
                    ).fetchone()[0]
                    rec.table_bytes, rec.index_bytes = target.execute(
                        "SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)",
                        (f'"{ds.schema}"."{ds.template}"',) * 2,
                    ).fetchone()
            except psycopg.Error as exc:
                rec.error = rec.error or f"verify: {exc}"
            if rec.error is None and rec.rows != rec.expected:
                rec.error = f"row count {rec.rows:,} != expected {rec.expected:,}"
            if rec.error:
                self.peer_status["pgcopydb"] = rec.error
            self.records.append(rec)
            self._print(rec)
        except Exception as exc:  # recorded, not hidden
            log.exception("pgcopydb set-up failed")
            self.peer_status["pgcopydb"] = f"{type(exc).__name__}: {exc}"
        finally:
            for db in (job.source_db, job.target_db):
                with contextlib.suppress(psycopg.Error):
                    self.conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(db)
                        )
                    )
            shutil.rmtree(job.directory, ignore_errors=True)

    def run_airflow(self, ds: Dataset) -> None:
        a = self.args
        for partitions in a.dag_partitions:
            key = f"airflow_dag_p{partitions}"
            if not self.selected(key):
                continue
            self.say(f"-- {ds.key}: Airflow DAG, {partitions} partitions, {a.dag_runs} runs")
            name = f"t_{key}"
            glob = str(ds.files[0].parent / f"*{ds.files[0].suffix}")

            def before(name: str = name) -> None:
                workloads.create_target(self.conn, ds, name, "indexed")
                self.checkpoint()
                self._lsn = self.conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]

            def after(
                info: dict[str, Any], key: str = key, name: str = name, partitions: int = partitions
            ) -> None:
                rec = Record(
                    ds.key,
                    key,
                    f"airflow-pg-bulk as an Airflow DAG, {partitions} "
                    "partitions (trigger -> success)",
                    "airflow",
                    info["run"],
                    ds.rows,
                    ds.bytes,
                )
                rec.seconds = info.get("wall")
                rec.wal_bytes = int(
                    self.conn.execute(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)",
                        (str(self._lsn),),
                    ).fetchone()[0]
                )
                rec.extra = info
                if info.get("state") != "success":
                    rec.error = f"DAG run {info.get('state')}: {str(info.get('error'))[-1500:]}"
                self._verify(ds, name, rec)
                self.records.append(rec)
                self._print(rec)

            try:
                out = dag.run_dag_loads(
                    self.dsn,
                    glob=glob,
                    table=ds.qualified(name),
                    partitions=partitions,
                    runs=a.dag_runs,
                    before_run=before,
                    after_run=after,
                    home=self.workdir / f"airflow-{partitions}",
                )
                self.airflow[key] = out
            except Exception as exc:  # recorded, not hidden: the rest of the run goes on
                log.exception("Airflow run failed")
                self.airflow[key] = {"error": f"{type(exc).__name__}: {exc}"[-3000:]}
                rec = Record(
                    ds.key,
                    key,
                    "airflow-pg-bulk as an Airflow DAG",
                    "airflow",
                    0,
                    ds.rows,
                    ds.bytes,
                    error=self.airflow[key]["error"],
                )
                self.records.append(rec)
            finally:
                workloads.drop_table(self.conn, ds, name)

    # --- server ------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.conn.execute("CHECKPOINT")

    def _server_major(self) -> int:
        return int(self.conn.info.server_version) // 10000

    def server_settings(self) -> dict[str, str]:
        names = [
            "server_version",
            "shared_buffers",
            "max_wal_size",
            "wal_level",
            "maintenance_work_mem",
            "synchronous_commit",
            "fsync",
            "full_page_writes",
            "checkpoint_timeout",
            "work_mem",
            "max_parallel_maintenance_workers",
            "wal_compression",
            "max_connections",
        ]
        out = {}
        for name in names:
            with contextlib.suppress(psycopg.Error):
                out[name] = self.conn.execute(
                    sql.SQL("SHOW {}").format(sql.Identifier(name))
                ).fetchone()[0]
        return out

    def cleanup(self) -> None:
        for ds in self.datasets.values():
            with contextlib.suppress(psycopg.Error):
                workloads.demo_workload.drop_schema(self.conn, ds.schema)
        self.conn.close()


def _short_error(error: str) -> str:
    """The driver's message of an error tail (the last 'psycopg.errors...' part)."""
    parts = [p for p in error.split(" | ") if "Error" in p or "error" in p]
    tail = error.split(" | ")
    found = next((i for i, p in enumerate(tail) if p.startswith("psycopg.errors")), None)
    if found is not None:
        return " ".join(tail[found : found + 3])[:400]
    return (parts[-1] if parts else error)[:400]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())[-2500:]


# --- command line ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Load the same files into one PostgreSQL server by every method; "
        "print the figures and write them to RESULTS.md.",
    )
    p.add_argument("--workloads", default="A,B,C", help="comma-separated subset of A,B,C")
    p.add_argument("--days", type=int, default=None, help="workload A: days (default 365)")
    p.add_argument("--meters", type=int, default=None, help="workload A: meters (default 15000)")
    p.add_argument("--b-rows", type=int, default=None, help="workload B rows (default 1M)")
    p.add_argument("--c-rows", type=int, default=None, help="workload C rows (default 2M)")
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes and one repetition (for the test suite)"
    )
    p.add_argument("--conn", help="libpq DSN of the server to use (else a throwaway cluster)")
    p.add_argument(
        "--methods",
        default="",
        help="comma-separated fnmatch patterns of method keys to run "
        "(e.g. 'copy_*,pipeline_replace_p2'); default all",
    )
    p.add_argument("--skip-airflow", action="store_true", help="no Airflow DAG run")
    p.add_argument("--skip-peers", action="store_true", help="no pgloader / pgcopydb")
    p.add_argument("--skip-tuning", action="store_true", help="no tuning or memory runs")
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions of the key comparison (naive, floor, replace 2 partitions)"
        " on workload A (default 3)",
    )
    p.add_argument("--other-reps", type=int, default=1, help="the same for workloads B and C")
    p.add_argument("--tuning-reps", type=int, default=None, help="default 2")
    p.add_argument("--tuning-workloads", default="A")
    p.add_argument(
        "--append-tuning-workload",
        default="C",
        help="workload of the append staging experiment (default C: indexed, no identity)",
    )
    p.add_argument(
        "--insert-cap",
        type=int,
        default=None,
        help="rows for the executemany method (default 200,000; extrapolated)",
    )
    p.add_argument(
        "--small-days",
        type=int,
        default=None,
        help="workload A days of the memory comparison (default 34: 510,000 rows)",
    )
    p.add_argument("--dag-partitions", default="4", help="comma-separated partition counts")
    p.add_argument("--dag-runs", type=int, default=2)
    p.add_argument("--pgcopydb-jobs", type=int, default=2)
    p.add_argument("--pgcopydb-split", default="50MB")
    p.add_argument("--peer-timeout", type=float, default=900)
    p.add_argument("--shared-buffers", default=None, help="throwaway cluster (default 2GB)")
    p.add_argument("--port", type=int, default=None, help="throwaway cluster port (55433)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS.md"))
    p.add_argument("--json", default=None, help="also write every record as JSON here")
    p.add_argument("--workdir", default=None, help="keep data and logs here (default: temp)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    quick = args.quick
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    bad = set(args.workloads) - {"A", "B", "C"}
    if bad:
        p.error(f"unknown workloads {sorted(bad)}")
    args.tuning_workloads = [w.strip().upper() for w in args.tuning_workloads.split(",")]
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.dag_partitions = [int(n) for n in args.dag_partitions.split(",") if n.strip()]
    defaults = {
        "days": (10, 365),
        "meters": (200, 15_000),
        "b_rows": (5_000, 1_000_000),
        "c_rows": (3_000, 2_000_000),
        "reps": (1, 3),
        "tuning_reps": (1, 2),
        "insert_cap": (1_000, 200_000),
        "small_days": (2, 34),
    }
    for name, (small, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    if quick:
        args.dag_runs = min(args.dag_runs, 1)
    return args


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, bool, Any]]:
    if args.conn:
        yield args.conn, False, None
        return
    with throwaway_cluster(port=args.port, shared_buffers=args.shared_buffers) as cluster:
        yield cluster.dsn, True, cluster


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    signal.signal(signal.SIGTERM, _on_sigterm)
    command = (
        "python -m benchmarks.run"
        + ("" if argv == [] else " ")
        + shlex.join(sys.argv[1:] if argv is None else argv)
    )
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pgbulk-bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)
    started = time.perf_counter()
    bench: Bench | None = None
    try:
        with _server(args) as (dsn, own, cluster):
            bench = Bench(args, dsn, workdir, own)
            bench.cluster = cluster
            bench.say(
                f"PostgreSQL {bench.conn.info.server_version} "
                f"({'throwaway cluster' if own else 'given server'}); workdir {workdir}"
            )
            try:
                bench.make_datasets()
                for key in args.workloads:
                    bench.run_workload(bench.datasets[key])
                bench.settings = bench.server_settings()
                bench.elapsed = time.perf_counter() - started
                text = report.render(bench, command)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                results = Path(args.out)  # keeps the section benchmarks.dag_overhead wrote
                kept = dag_overhead.section_of(results.read_text()) if results.exists() else ""
                results.write_text(dag_overhead.with_section(text, kept))
                bench.say(f"\nwrote {args.out} ({bench.elapsed / 60:.1f} min in all)")
                if args.json:
                    Path(args.json).write_text(
                        json.dumps(
                            {
                                "records": [asdict(r) | {"ok": r.ok} for r in bench.records],
                                "airflow": bench.airflow,
                                "peers": bench.peer_status,
                                "skipped": bench.skipped,
                                "notes": bench.notes,
                                "profile": bench.profile,
                            },
                            indent=1,
                            default=str,
                        )
                    )
            finally:
                bench.cleanup()
    except KeyboardInterrupt:
        print("interrupted; the throwaway server was stopped and deleted", file=sys.stderr)
        return 130
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    failed = [
        r
        for r in (bench.records if bench else [])
        if not r.ok and r.group not in ("peers", "airflow", "failed")
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
