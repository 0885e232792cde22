"""What a load killed too hard to clean up after itself (SIGKILL) leaves: ``airflow-pg-bulk
cleanup`` lists and removes it, never a running load's tables; the next load's own clean-up
removes it after ``abandoned_after``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from helpers import leftovers

from airflow_pg_bulk import runner

CLI = [os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")]
ROWS = b"".join(b"%d,row %d\n" % (i, i) for i in range(1, 501))


def _start(db: Any, *flags: str) -> subprocess.Popen[bytes]:
    """A CLI load of standard input into ``readings``, standard input kept open."""
    command = [*CLI, "load", "--conn", db.dsn, "--table", db.table("readings")]
    proc = subprocess.Popen(
        [*command, "--source", "-", "--mode", "append", *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(ROWS)
    proc.stdin.flush()
    return proc


def _copying(db: Any, proc: subprocess.Popen[bytes], known: set[str]) -> str:
    """Wait until the load's COPY runs; the load id of its new ledger."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        active = db.run(
            "SELECT application_name FROM pg_stat_activity WHERE state = 'active'"
            " AND application_name LIKE 'pgbulk:%%:copy%%' AND query LIKE %s",
            f"%{db.schema}%",
        )
        ids = {name.split(":")[1] for (name,) in active} - known
        if ids:
            return ids.pop()
        time.sleep(0.05)
    raise AssertionError("no COPY within 60 s")


def _killed_load(db: Any) -> tuple[str, list[str]]:
    """A load killed by SIGKILL during its COPY, its sessions gone: its id and tables."""
    proc = _start(db)
    load_id = _copying(db, proc, set())
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 30
    while db.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
        f"pgbulk:{load_id}:%",
    ):
        assert time.monotonic() < deadline, "the killed load's sessions did not end"
        time.sleep(0.05)
    tables = [  # the tables (their indexes go with them)
        name
        for (name,) in db.run(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace"
            " AND relkind IN ('r', 'p') AND NOT relispartition AND relname LIKE %s"
            " ORDER BY relname",
            db.schema,
            f"\\_pgbulk\\_{load_id}\\_%",
        )
    ]
    assert tables, "SIGKILL left nothing to clean up"
    assert set(tables) <= set(leftovers(db))
    return load_id, tables


def _cleanup(db: Any, *flags: str) -> str:
    done = subprocess.run(
        [*CLI, "cleanup", "--conn", db.dsn, "--table", db.table("readings"), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _readings(db: Any) -> None:
    db.run(f"CREATE TABLE {db.schema}.readings (id integer, v text)")


def test_cleanup_lists_then_removes_a_killed_load_but_not_a_running_one(db):
    _readings(db)
    killed, tables = _killed_load(db)
    running = _start(db)
    running_id = _copying(db, running, {killed})
    try:
        listed = _cleanup(db, "--dry-run")
        assert f"would remove load {killed} (not finalized): {', '.join(tables)}" in listed
        assert f"left load {running_id} (running)" in listed, listed
        assert set(tables) <= set(leftovers(db))

        removed = _cleanup(db)
        assert f"removed load {killed} (not finalized): {', '.join(tables)}" in removed
        assert f"left load {running_id} (running)" in removed, removed
        left = leftovers(db)
        assert not any(f"_pgbulk_{killed}_" in name for name in left)
        assert any(f"_pgbulk_{running_id}_" in name for name in left)
    finally:
        assert running.stdin is not None
        running.stdin.close()
        running.wait(60)
    assert running.returncode == 0, running.stderr.read().decode() if running.stderr else ""
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.readings") == 500
    assert leftovers(db) == []
    assert "no tables of loads into" in _cleanup(db)


def test_cleanup_from_python(db):
    _readings(db)
    killed, tables = _killed_load(db)

    found = runner.remove_leftovers(db.dsn, db.table("readings"), dry_run=True)
    assert [(f.load_id, list(f.tables), f.running) for f in found] == [(killed, tables, False)]
    assert set(tables) <= set(leftovers(db))

    runner.remove_leftovers(db.dsn, db.table("readings"))
    assert leftovers(db) == []


def test_next_load_removes_a_killed_loads_tables(db, tmp_path):
    """The daily operation: the next load into the target drops what a killed load left once
    it has shown no sign of life for ``abandoned_after``."""
    _readings(db)
    _killed_load(db)
    source = tmp_path / "next.csv"
    source.write_bytes(ROWS)
    time.sleep(1.5)

    summary = runner.load(
        db.dsn, db.table("readings"), str(source), mode="append", abandoned_after="1s"
    )

    assert summary.rows == 500
    assert leftovers(db) == []
