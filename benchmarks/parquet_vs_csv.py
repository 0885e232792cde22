"""Parquet against CSV of the same rows: workload A (smart-meter readings, PK + FK) written as
CSV files by the server, the same files converted to Parquet by Arrow (columns typed int64,
double, date32; snappy; ``--row-group-rows`` rows per row group), each loaded with
``airflow-pg-bulk load --mode replace`` in a process of its own, measured (wall seconds, the
loader's peak RSS and CPU seconds, the server's CPU seconds), and the two loads' tables
compared (count and checksum).

Run alone::

    python -m benchmarks.parquet_vs_csv --conn postgresql://postgres@127.0.0.1:5432/postgres \\
        --meters 2000 --days 100 --partitions 2 --reps 2

It prints a Markdown table (and writes it to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg

from airflow_pg_bulk.demo import workload as demo_workload
from benchmarks import workloads
from benchmarks.measure import Measured, run_measured
from benchmarks.server import postmaster_of


@dataclass
class Run:
    """One measured load."""

    fmt: str
    rep: int
    measured: Measured
    checksum: tuple[int, str]


def to_parquet(csv_files: list[Path], directory: Path, row_group_rows: int) -> list[Path]:
    """The CSV files (with a header) as Parquet files, typed by Arrow's CSV reader."""
    import pyarrow.csv
    import pyarrow.parquet

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for path in csv_files:
        target = directory / path.with_suffix(".parquet").name
        table = pyarrow.csv.read_csv(path)
        pyarrow.parquet.write_table(table, target, row_group_size=row_group_rows)
        out.append(target)
    return out


def measure(
    dsn: str, fmt: str, source: str, partitions: int, log: Path, postmaster: int | None
) -> Measured:
    """One ``airflow-pg-bulk load --mode replace`` of ``source`` in a process of its own."""
    cmd = [
        sys.executable, "-m", "airflow_pg_bulk.cli", "-q", "load", "--conn", dsn,
        "--table", "bench_a.readings", "--source", source, "--mode", "replace",
        "--format", fmt, "--partitions", str(partitions),
    ]  # fmt: skip
    if fmt == "csv":
        cmd.append("--header")
    measured = run_measured(cmd, log_path=log, postmaster=postmaster)
    if measured.returncode != 0:
        raise RuntimeError(f"the {fmt} load failed; see {log}")
    return measured


def main(argv: list[str] | None = None) -> list[Run]:
    """Set up, load each format ``--reps`` times (alternating), print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conn", required=True, help="libpq DSN of the server to load into")
    p.add_argument("--meters", type=int, default=2000)
    p.add_argument("--days", type=int, default=100)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--row-group-rows", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--workdir", default=None, help="keep the files here (default: temp)")
    p.add_argument("--out", default=None, help="also write the table here")
    args = p.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="pgbulk-parquet-bench-"))
    with psycopg.connect(args.conn) as conn:
        data = workloads.setup_a(
            conn, work / "csv", meters=args.meters, days=args.days, files=args.files
        )
        postmaster = postmaster_of(conn.info.backend_pid)
    parquet_files = to_parquet(data.files, work / "parquet", args.row_group_rows)
    sources = {"csv": str(work / "csv" / "*.csv"), "parquet": str(work / "parquet" / "*.parquet")}
    sizes = {"csv": data.bytes, "parquet": sum(f.stat().st_size for f in parquet_files)}

    runs = []
    for rep in range(args.reps):
        for fmt in ("csv", "parquet") if rep % 2 == 0 else ("parquet", "csv"):
            log = work / f"{fmt}-{rep}.log"
            measured = measure(args.conn, fmt, sources[fmt], args.partitions, log, postmaster)
            with psycopg.connect(args.conn) as conn:
                total = demo_workload.checksum(conn, "bench_a", "readings")
            runs.append(Run(fmt, rep, measured, total))

    table = report(runs, data.rows, sizes, args)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if len({r.checksum for r in runs}) != 1 or runs[0].checksum[0] != data.rows:
        raise SystemExit(f"the loads differ: {sorted({r.checksum for r in runs})}")
    return runs


def report(runs: list[Run], rows: int, sizes: dict[str, int], args: argparse.Namespace) -> str:
    """The Markdown table: median of the reps per format."""
    lines = [
        f"Workload A, {rows:,} rows ({args.meters:,} meters x {args.days} days, {args.files} "
        f"files), partitions={args.partitions}, {args.reps} reps (median); Parquet row groups "
        f"of {args.row_group_rows:,} rows, snappy. Both loads give the same table: "
        f"{runs[0].checksum[0]:,} rows, checksum {runs[0].checksum[1]}.",
        "",
        "| source | MB | wall s | rows/s | loader peak RSS MB | loader CPU s | server CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for fmt in ("csv", "parquet"):
        mine = [r.measured for r in runs if r.fmt == fmt]
        wall = statistics.median(m.wall for m in mine)
        server = [m.server_cpu for m in mine if m.server_cpu is not None]
        lines.append(
            f"| {fmt} | {sizes[fmt] / 1e6:.1f} | {wall:.2f} | {rows / wall:,.0f} | "
            f"{statistics.median(m.peak_rss_kb for m in mine) / 1024:.0f} | "
            f"{statistics.median(m.client_cpu for m in mine):.2f} | "
            + (f"{statistics.median(server):.2f} |" if server else "n/a |")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
