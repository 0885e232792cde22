"""Benchmark of splitting without a scan (issue 8): one big csv file, on disk and as an object
in a local S3 server (moto), cut into 4 ranges, beside a plain COPY; and workload A from the S3
server against the same files on disk.

Run alone::

    .venv/bin/python -m benchmarks.ranges [--dsn URL] [--size-mb 1024] [--workdir DIR]

It prints a Markdown report (and writes it with ``--out``). Figures on a shared machine are
noisy: the load average is printed with them.

Measured:

* prepare's splitting of the big file (``cutting.plan_partitions``: the windows at the split
  points, no scan) against today's exact splitter over the same split points
  (``boundaries.record_starts`` + ``lines.count_newlines``, the serial scan prepare made before);
* the whole prepare step (``steps.prepare``) on the file and on the object;
* the load (replace, 4 partitions, in-process runner, 4 connections) from disk and from S3,
  and one plain ``COPY ... FROM STDIN`` of the same bytes;
* workload A (smart-meter readings, 4 files, header) loaded with 4 partitions from disk and
  from the S3 server.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_pg_bulk import runner, steps
from airflow_pg_bulk.plan import CopyOptions, request_from_options
from airflow_pg_bulk.source import cutting, listing
from airflow_pg_bulk.source.boundaries import record_starts
from airflow_pg_bulk.source.lines import count_newlines
from airflow_pg_bulk.source.syntax import RecordSyntax

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
SCHEMA = "bench_ranges"
PARTITIONS = 4


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn`` took, and what it returned."""
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def write_big_csv(path: Path, size: int) -> int:
    """A csv of about ``size`` bytes: 5 columns, a quoted note spanning two lines with doubled
    quotes in every row (the split points fall inside quoted fields); returns the rows."""
    block_rows = 4096
    rows = 0
    with open(path, "wb") as out:
        while out.tell() < size:
            lines = []
            for i in range(rows + 1, rows + block_rows + 1):
                lines.append(
                    f'{i},"name {i}",{i % 997}.25,2024-01-{1 + i % 28:02d},'
                    f'"note {i}, first line\nsecond ""line"" of {i}"\n'
                )
            out.write("".join(lines).encode())
            rows += block_rows
    return rows


def _items(conn: psycopg.Connection, name: str) -> None:
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(SCHEMA, name)))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint, name text, amount numeric(12,2), day date, note text)"
        ).format(sql.Identifier(SCHEMA, name))
    )


def plain_copy(conn: psycopg.Connection, path: Path, name: str) -> float:
    """Seconds of one ``COPY ... FROM STDIN`` of the file into a fresh table."""
    _items(conn, name)

    def run() -> None:
        with (
            conn.cursor() as cur,
            open(path, "rb") as f,
            cur.copy(
                sql.SQL("COPY {} FROM STDIN (FORMAT csv)").format(sql.Identifier(SCHEMA, name))
            ) as copy,
        ):
            while chunk := f.read(1 << 20):
                copy.write(chunk)

    seconds, _ = timed(run)
    return seconds


def split_seconds(target: str, opts: CopyOptions) -> tuple[float, int]:
    """Seconds of prepare's splitting (no scan), and the pieces made."""
    files = listing.list_sources(target)
    seconds, parts = timed(lambda: cutting.plan_partitions(files, opts, PARTITIONS))
    return seconds, sum(len(p.pieces) for p in parts)


def serial_split_seconds(path: Path) -> float:
    """Seconds of the exact serial split prepare made before: record starts at the split points
    read from the file's start, and the newlines counted for each piece's first line."""
    size = path.stat().st_size
    syntax = RecordSyntax()

    def run() -> None:
        starts = record_starts(path, [size * k // 4 for k in (1, 2, 3)], syntax)
        bounds = [0, *starts, size]
        for a, b in itertools.pairwise(bounds[:-1]):  # the last piece's lines: not needed
            count_newlines(path, a, b)

    seconds, _ = timed(run)
    return seconds


def prepare_seconds(dsn: str, table: str, source: str, **options: Any) -> float:
    """Seconds of the whole prepare step (its tables dropped afterwards)."""
    request = request_from_options(table, source, mode="replace", partitions=PARTITIONS, **options)
    load_id = uuid.uuid4().hex[:12]
    with psycopg.connect(dsn) as conn:
        try:
            seconds, _ = timed(lambda: steps.prepare(conn, request, load_id))
        finally:
            steps.cleanup(conn, SCHEMA if "." not in table else table.split(".")[0], load_id)
    return seconds


def load_seconds(dsn: str, table: str, source: str, **options: Any) -> tuple[float, int]:
    """Seconds of the whole load (replace, 4 partitions) and its rows."""
    seconds, summary = timed(
        lambda: runner.load(
            dsn, table, source, mode="replace", partitions=PARTITIONS, jobs=PARTITIONS, **options
        )
    )
    return seconds, summary.rows


@contextlib.contextmanager
def counted_reads() -> Iterator[list[int]]:
    """The sizes of the reads made through objects.open_seekable (prepare's windows)."""
    from airflow_pg_bulk.source import objects

    reads: list[int] = []
    real = objects.open_seekable

    def counting(*args: Any, **kwargs: Any) -> Any:
        f = real(*args, **kwargs)
        inner = f.read

        def read(size: int = -1) -> bytes:
            data = inner(size)
            reads.append(len(data))
            return data

        f.read = read
        return f

    objects.open_seekable = counting
    try:
        yield reads
    finally:
        objects.open_seekable = real


class S3:
    """moto's S3 server on loopback, with the credentials in the environment."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        os.environ.update(
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench-secret",
            AWS_ENDPOINT_URL=f"http://{host}:{port}",
            AWS_DEFAULT_REGION="us-east-1",
        )
        import boto3

        self.client = boto3.client("s3")
        self.bucket = f"bench-{uuid.uuid4().hex[:8]}"
        self.client.create_bucket(Bucket=self.bucket)

    def upload(self, path: Path, key: str) -> str:
        self.client.upload_file(str(path), self.bucket, key)
        return f"s3://{self.bucket}/{key}"

    def range_get_seconds(self, key: str) -> float:
        """Seconds of one 64 KiB range GET of the object (the S3 server's own cost: moto's
        grows with the object's size), the median of 5."""
        times = []
        for _ in range(5):
            seconds, _ = timed(
                lambda: self.client.get_object(Bucket=self.bucket, Key=key, Range="bytes=0-65535")[
                    "Body"
                ].read()
            )
            times.append(seconds)
        return sorted(times)[2]

    def stop(self) -> None:
        self.server.stop()


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark and return its report."""
    import logging

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--a-days", type=int, default=120, help="workload A: days of readings")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="pgbulk-ranges-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"# Splitting without a scan: {args.size_mb} MB in {PARTITIONS} ranges", ""]

    def row(what: str, value: str) -> None:
        lines.append(f"| {what} | {value} |")
        print(lines[-1], flush=True)

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        big = work / "big.csv"
        rows = write_big_csv(big, args.size_mb << 20)
        size = big.stat().st_size
        version = conn.execute("SHOW server_version").fetchone()[0]
        lines += [
            f"PostgreSQL {version}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f} at the start (a shared machine: figures are noisy).",
            f"File: {size / 1e6:.0f} MB, {rows:,} rows, every row a quoted two-line field.",
            "",
            "| measure | seconds |",
            "|---|---|",
        ]
        opts = CopyOptions()
        seconds, pieces = split_seconds(str(big), opts)
        row(f"split into {pieces} ranges, windows only (local file)", f"{seconds:.3f}")
        row(
            "split by today's exact serial scan (before this change)",
            f"{serial_split_seconds(big):.2f}",
        )
        _items(conn, "items")
        table = f"{SCHEMA}.items"
        row("prepare step, local file", f"{prepare_seconds(args.dsn, table, str(big)):.3f}")
        row("plain COPY of the file, one stream", f"{plain_copy(conn, big, 'reference'):.1f}")
        seconds, loaded = load_seconds(args.dsn, table, str(big))
        assert loaded == rows, (loaded, rows)
        row("load, local file, 4 ranges (replace)", f"{seconds:.1f}")
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(SCHEMA, "reference")))
        s3 = S3()
        try:
            url = s3.upload(big, "big.csv")
            with counted_reads() as reads:
                seconds, pieces = split_seconds(url, opts)
            row(f"split into {pieces} ranges, windows only (object)", f"{seconds:.3f}")
            row(
                f"... of which: {len(reads)} range reads of the object, {sum(reads):,} bytes",
                f"{len(reads)} x {s3.range_get_seconds('big.csv'):.3f} (one 64 KiB GET)",
            )
            row("prepare step, object", f"{prepare_seconds(args.dsn, table, url):.3f}")
            seconds, loaded = load_seconds(args.dsn, table, url)
            assert loaded == rows, (loaded, rows)
            row("load, object in the S3 server, 4 ranges (replace)", f"{seconds:.1f}")
            big.unlink()
            lines += ["", "Workload A, 4 files with a header, 4 partitions:", ""]
            lines += ["| source | seconds |", "|---|---|"]
            from benchmarks import workloads

            ds = workloads.setup_a(conn, work / "a", meters=15_000, days=args.a_days, files=4)
            a_table = ds.qualified("readings")
            local, _ = load_seconds(args.dsn, a_table, [str(p) for p in ds.files], header=True)
            row(f"A, local files ({ds.bytes / 1e6:.0f} MB, {ds.rows:,} rows)", f"{local:.1f}")
            urls = [s3.upload(p, f"a/{p.name}") for p in ds.files]
            remote, _ = load_seconds(args.dsn, a_table, urls, header=True)
            row("A, the same files in the S3 server", f"{remote:.1f}")
            lines.append(f"\nA from S3 / from disk: {remote / local:.2f}x")
            print(lines[-1])
        finally:
            s3.stop()
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    report = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(report)
    return report


if __name__ == "__main__":
    print(main())
