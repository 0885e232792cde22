"""The rows path's readers side by side (issue 20, item 3: "measure and choose"): the same
rows from SQLite or MariaDB into an UNLOGGED table on the target, by each reader, each run in
a process of its own (its client CPU during the load from ``getrusage``, imports left out;
its wall time; its peak RSS, imports included).

    python -m benchmarks.db_readers --conn DSN --sqlite FILE --maria URL [--reps 3]

``FILE`` and ``URL`` hold ``readings`` (id, meter_id, reading, date), as
:mod:`benchmarks.db_source` builds them (its ``--workdir``'s ``readings.db`` and
``NAME_maria``). The readers:

- ``rows``: what the rows path does (:mod:`airflow_pg_bulk.loading.database.rows_copy`):
  SQLAlchemy's server-side cursor, the DB-API cursor's ``fetchmany``, psycopg's
  ``write_row`` (:func:`airflow_pg_bulk.db.driver.copy_rows`);
- ``adbc_sqlite`` (ADBC's SQLite driver) and ``connectorx`` (SQLite and MariaDB): Arrow
  record batches of :data:`BATCH_ROWS` rows encoded as COPY CSV by the Parquet path's
  encoder (:func:`airflow_pg_bulk.source.parquet.encode`) and streamed into ``COPY ... FROM
  STDIN``.

Its ``readings`` table in SQLite is plain (not STRICT): ADBC reads it here as it would a
STRICT one, since its every column holds one type.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SELECT = "SELECT id, meter_id, reading, date FROM readings"
TABLE = "bench_readers"
BATCH_ROWS = 65_536  # rows in one Arrow record batch
#: what each reader imports, imported before its load is timed
IMPORTS = {
    "rows": ("sqlalchemy", "sqlalchemy.dialects.sqlite", "sqlalchemy.dialects.mysql", "pymysql"),
    "adbc_sqlite": ("sqlalchemy", "pyarrow", "pyarrow.csv", "adbc_driver_sqlite.dbapi"),
    "connectorx": ("sqlalchemy", "pyarrow", "pyarrow.csv", "connectorx"),
}


def installed(reader: str) -> bool:
    """Whether every module the reader imports (:data:`IMPORTS`) is installed."""
    return all(importlib.util.find_spec(name.split(".")[0]) is not None for name in IMPORTS[reader])


def _rows(source: str) -> Iterator[Any]:
    import sqlalchemy

    from airflow_pg_bulk.db.source_driver import copy_connect_args

    url = sqlalchemy.engine.make_url(source)
    engine = sqlalchemy.create_engine(url, connect_args=copy_connect_args(url.get_driver_name()))
    with engine.connect() as conn:
        result = conn.execution_options(stream_results=True).exec_driver_sql(SELECT)
        yield [tuple(row) for row in result.fetchmany(1)]  # (buffered by SQLAlchemy)
        fetch = result.cursor.fetchmany
        while batch := fetch(10_000):
            yield batch
    engine.dispose()


def _arrow(reader: str, source: str) -> Iterator[bytes]:
    import sqlalchemy

    from airflow_pg_bulk.source import parquet

    url = sqlalchemy.engine.make_url(source)
    with contextlib.ExitStack() as stack:
        if reader == "connectorx":
            import connectorx

            address = (
                f"sqlite://{url.database}"
                if url.get_backend_name() == "sqlite"
                else url.set(drivername="mysql", query={}).render_as_string(hide_password=False)
            )
            batches = connectorx.read_sql(
                address, SELECT, return_type="arrow_stream", batch_size=BATCH_ROWS
            )
        else:
            from adbc_driver_sqlite import dbapi

            conn = stack.enter_context(dbapi.connect(url.database))
            cursor = stack.enter_context(conn.cursor())
            cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            cursor.execute(SELECT)
            batches = cursor.fetch_record_batch()
        for batch in batches:
            names = batch.schema.names
            yield parquet.encode(parquet.text_arrays(batch, names), names)


def one(reader: str, source: str, target: str) -> dict[str, Any]:
    """One load by ``reader`` (in this process)."""
    from psycopg import sql

    from airflow_pg_bulk.db import driver
    from airflow_pg_bulk.source import copy_text

    for module in IMPORTS[reader]:  # imported before the clock starts
        importlib.import_module(module)
    conn = driver.connect(target)
    driver.execute(conn, sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))
    conn.commit()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    if reader == "rows":
        statement = sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(TABLE))
        rows, _ = driver.copy_rows(conn, statement, _rows(source), copy_text.of_batches)
    else:
        statement = sql.SQL("COPY {} FROM STDIN (FORMAT csv)").format(sql.Identifier(TABLE))
        rows = driver.copy_in(conn, statement, _arrow(reader, source))
    conn.commit()
    wall = time.monotonic() - started
    use = resource.getrusage(resource.RUSAGE_SELF)
    conn.close()
    return {
        "reader": reader,
        "rows": rows,
        "wall_s": round(wall, 3),
        "cpu_s": round(use.ru_utime + use.ru_stime - before.ru_utime - before.ru_stime, 3),
        "peak_rss_mb": round(use.ru_maxrss / 1024, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Run each reader ``--reps`` times, interleaved; print each run and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conn", required=True)
    parser.add_argument("--sqlite")
    parser.add_argument("--maria")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.conn)))
        return 0
    import psycopg

    with psycopg.connect(args.conn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL(
                "CREATE UNLOGGED TABLE IF NOT EXISTS {} (id bigint, meter_id bigint,"
                " reading float8, date date)"
            ).format(psycopg.sql.Identifier(TABLE))
        )
    methods = []
    if args.sqlite:
        url = f"sqlite:///{args.sqlite}"
        methods += [("sqlite", r, url) for r in ("rows", "adbc_sqlite", "connectorx")]
    if args.maria:
        methods += [("maria", r, args.maria) for r in ("rows", "connectorx")]
    missing = sorted({r for _s, r, _u in methods if not installed(r)})
    if missing:  # ConnectorX is no dependency of the project; ADBC only of its sqlite extra
        print(f"not installed, left out: {', '.join(missing)}", file=sys.stderr)
        methods = [m for m in methods if m[1] not in missing]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.reps):
        for source, reader, url in methods:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.db_readers", "--conn", args.conn,
                 "--one", reader, url],
                check=True, capture_output=True, text=True, cwd=REPO,
            ).stdout  # fmt: skip
            run = json.loads(out.strip().splitlines()[-1])
            runs.setdefault((source, reader), []).append(run)
            print(source, json.dumps(run), flush=True)
    for (source, reader), got in runs.items():
        med = {k: statistics.median(r[k] for r in got) for k in ("wall_s", "cpu_s", "peak_rss_mb")}
        print(f"{source:6} {reader:18} rows {got[0]['rows']:,}  median {json.dumps(med)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
