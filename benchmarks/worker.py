"""One timed load, in a process of its own (``python -m benchmarks.worker SPEC.json``).

The parent measures this process's peak RSS and CPU time (``os.wait4``); this process takes a
CHECKPOINT, reads the WAL position, times the load alone (imports, connections for the
CHECKPOINT and the file reading set-up excluded) and writes its figures as JSON.
"""

from __future__ import annotations

import csv
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

INSERT_BATCH = 1000  # rows per multi-row INSERT statement

log = logging.getLogger("benchmarks.worker")


def _target(spec: dict[str, Any]) -> sql.Identifier:
    return sql.Identifier(spec["schema"], spec["table"])


def _columns(spec: dict[str, Any]) -> sql.Composable:
    return sql.SQL(", ").join(map(sql.Identifier, spec["columns"]))


def _csv_rows(files: list[str], cap: int | None) -> Iterator[list[str | None]]:
    """Rows of the CSV files (header skipped) as strings, empty unquoted fields as None."""
    count = 0
    for path in files:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            next(reader, None)
            for row in reader:
                if cap is not None and count >= cap:
                    return
                yield [None if v == "" else v for v in row]
                count += 1


# --- methods ---------------------------------------------------------------------------------


def copy_one_session(spec: dict[str, Any]) -> dict[str, Any]:
    """One COPY per file on one connection, in one transaction, 1 MiB writes (the demo's
    ``naive_copy``, for any table)."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv, HEADER true)").format(
        _target(spec), _columns(spec)
    )
    rows = 0
    with psycopg.connect(spec["dsn"]) as conn:
        started = time.perf_counter()
        with conn.cursor() as cur:
            for path in spec["files"]:
                with cur.copy(statement) as copy, open(path, "rb") as f:
                    while block := f.read(1 << 20):
                        copy.write(block)
                rows += cur.rowcount
        conn.commit()
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "rows": rows}


def _insert_statement(spec: dict[str, Any], nrows: int) -> sql.Composable:
    one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(spec["columns"])))
    overriding = sql.SQL(" OVERRIDING SYSTEM VALUE") if spec.get("identity") else sql.SQL("")
    return sql.SQL("INSERT INTO {} ({}){} VALUES {}").format(
        _target(spec), _columns(spec), overriding, sql.SQL(", ").join([one] * nrows)
    )


def insert_row(spec: dict[str, Any]) -> dict[str, Any]:
    """One INSERT per row through ``cursor.executemany`` (psycopg 3 sends them in pipeline
    mode), one transaction; the CSV is parsed by Python's csv module inside the timing."""
    rows = _csv_rows(spec["files"], spec.get("cap"))
    with psycopg.connect(spec["dsn"]) as conn:
        started = time.perf_counter()
        with conn.cursor() as cur:
            cur.executemany(_insert_statement(spec, 1), rows)
        conn.commit()
        seconds = time.perf_counter() - started
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_target(spec))).fetchone()
    return {"seconds": seconds, "rows": count[0]}


def insert_multi(spec: dict[str, Any]) -> dict[str, Any]:
    """Multi-row INSERTs of 1,000 rows per statement, one transaction."""
    full = _insert_statement(spec, INSERT_BATCH)
    total = 0
    with psycopg.connect(spec["dsn"]) as conn:
        started = time.perf_counter()
        with conn.cursor() as cur:
            batch: list[Any] = []
            n = 0
            for row in _csv_rows(spec["files"], spec.get("cap")):
                batch.extend(row)
                n += 1
                if n == INSERT_BATCH:
                    cur.execute(full, batch)
                    total += n
                    batch, n = [], 0
            if n:
                cur.execute(_insert_statement(spec, n), batch)
                total += n
        conn.commit()
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "rows": total}


def _hook() -> Any:
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    return PostgresHook(postgres_conn_id="bench_pg")


def hook_copy_expert(spec: dict[str, Any]) -> dict[str, Any]:
    """``PostgresHook.copy_expert`` once per file, one after the other (the hook opens a
    connection, COPYs in 8 KiB reads and commits, per call)."""
    hook = _hook()
    with psycopg.connect(spec["dsn"]) as conn:
        statement = (
            sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv, HEADER true)")
            .format(_target(spec), _columns(spec))
            .as_string(conn)
        )
    started = time.perf_counter()
    for path in spec["files"]:
        hook.copy_expert(statement, path)
    return {"seconds": time.perf_counter() - started, "rows": None}


def hook_bulk_load(spec: dict[str, Any]) -> dict[str, Any]:
    """``PostgresHook.bulk_load`` of the tab-delimited file (made beforehand, not timed)."""
    hook = _hook()
    started = time.perf_counter()
    hook.bulk_load(f"{spec['schema']}.{spec['table']}", spec["tsv"])
    return {"seconds": time.perf_counter() - started, "rows": None}


_KINDS = [
    (re.compile(r"^CREATE (UNIQUE )?INDEX", re.I), "create index"),
    (re.compile(r"USING INDEX", re.I), "add PK/unique using index"),
    (re.compile(r"VALIDATE CONSTRAINT", re.I), "validate constraint"),
    (re.compile(r"NOT VALID", re.I), "add constraint NOT VALID"),
    (re.compile(r"SET LOGGED", re.I), "set logged"),
    (re.compile(r"^ANALYZE", re.I), "analyze"),
    (re.compile(r"^INSERT INTO", re.I), "insert from staging"),
    (re.compile(r"^DROP TABLE", re.I), "drop table"),
    (re.compile(r"^LOCK TABLE", re.I), "lock target"),
]


def _kind(text: str) -> str:
    for pattern, name in _KINDS:
        if pattern.search(text):
            return name
    return " ".join(text.split()[:2]).lower()


def _install_statement_timer(timings: list[tuple[str, str, float]]) -> None:
    """Time every statement the steps run (kind, text, seconds)."""
    import sys

    from airflow_pg_bulk.db import driver

    original = driver.execute

    def timed(conn: Any, statement: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(conn, statement)
        finally:
            seconds = time.perf_counter() - started
            try:
                text = statement.as_string(conn)
            except Exception:
                text = str(statement)
            text = " ".join(text.split())
            timings.append((_kind(text), text[:160], seconds))

    for name, module in list(sys.modules.items()):  # every module of the steps that runs SQL
        if name.startswith("airflow_pg_bulk.") and getattr(module, "execute", None) is original:
            module.execute = timed


def pipeline(spec: dict[str, Any]) -> dict[str, Any]:
    """``airflow_pg_bulk.runner.load``: prepare, parallel COPY, finalize, cleanup."""
    from airflow_pg_bulk import runner
    from airflow_pg_bulk.db import driver
    from airflow_pg_bulk.source import reading

    opts = spec["pipeline"]
    chunk = opts.get("chunk")
    if chunk:
        reading.READ_CHUNK = chunk  # read by piece_chunks at each call
        driver.COPY_BUFFER = chunk
    timings: list[tuple[str, str, float]] = []
    _install_statement_timer(timings)
    started = time.perf_counter()
    summary = runner.load(
        spec["dsn"],
        f"{spec['schema']}.{spec['table']}",
        spec["files"],
        header=True,
        mode=opts["mode"],
        partitions=opts.get("partitions"),
        staging_logged=opts.get("staging_logged"),
        **opts.get("settings", {}),  # maintenance_work_mem=, synchronous_commit=
    )
    seconds = time.perf_counter() - started
    kinds: dict[str, float] = {}
    for kind, _text, secs in timings:
        kinds[kind] = kinds.get(kind, 0.0) + secs
    slow = [(k, t, s) for k, t, s in timings if s >= 0.05]
    return {
        "seconds": seconds,
        "rows": summary.rows,
        "phases": summary.seconds,
        "partitions": summary.partitions,
        "statement_kinds": kinds,
        "slow_statements": slow,
    }


METHODS = {
    "copy": copy_one_session,
    "insert_row": insert_row,
    "insert_multi": insert_multi,
    "hook_copy_expert": hook_copy_expert,
    "hook_bulk_load": hook_bulk_load,
    "pipeline": pipeline,
}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """CHECKPOINT, WAL position, the method, WAL position."""
    function = METHODS[spec["kind"]]
    with psycopg.connect(spec["dsn"], autocommit=True) as control:
        if spec.get("checkpoint", True):
            try:
                control.execute("CHECKPOINT")
            except psycopg.Error as exc:
                log.warning("CHECKPOINT failed (%s); timing without it", exc)
        lsn = control.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        result = function(spec)
        wal = control.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (str(lsn),)
        ).fetchone()[0]
    result["wal_bytes"] = int(wal)
    return result


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    spec = json.loads(Path(argv[0]).read_text())
    result = run(spec)
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
