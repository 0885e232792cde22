"""SIGINT, SIGTERM and SIGHUP during a CLI load: the running statements cancelled on the server
at once, the load's tables dropped, what happened said, the conventional exit status (128 + the
signal's number) within 3 s; a second signal exits at once. And ``airflow-pg-bulk cleanup``
for what a load killed harder (SIGKILL) leaves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import leftovers

CLI = [os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")]
ROWS = b"".join(b"%d,row %d\n" % (i, i) for i in range(1, 2001))


def _target(db: Any) -> None:
    db.run(f"CREATE TABLE {db.schema}.readings (id integer PRIMARY KEY, v text)")
    db.run(f"INSERT INTO {db.schema}.readings VALUES (0, 'kept')")


def _wait_for(what: str, check: Callable[[], Any], proc: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the load ended before {what}: {proc.stderr.read().decode()}")
        time.sleep(0.05)
    raise AssertionError(f"no {what} within 60 s")


def _sessions(db: Any, step: str, waiting_for_lock: bool = False) -> list[tuple[Any, ...]]:
    """The load's active sessions in ``step`` (of this test's schema: other tests run beside)."""
    lock = " AND wait_event_type = 'Lock'" if waiting_for_lock else ""
    return db.run(
        "SELECT pid, application_name FROM pg_stat_activity WHERE state = 'active'"
        " AND application_name LIKE %s AND query LIKE %s" + lock,
        f"pgbulk:%:{step}%",
        f"%{db.schema}%",
    )


@pytest.fixture
def stdin_load(db: Any) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a CLI load of standard input into ``readings``, its rows written and standard
    input kept open: the COPY runs until the test closes it or signals the load."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*flags: str, data: bytes = ROWS, close: bool = False) -> subprocess.Popen[bytes]:
        command = [*CLI, "load", "--conn", db.dsn, "--table", f"{db.schema}.readings"]
        command += ["--source", "-", "--mode", "replace", *flags]
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        started.append(proc)
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.flush()
        if close:
            proc.stdin.close()
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def _signal_and_wait(proc: subprocess.Popen[bytes], number: int) -> tuple[float, str]:
    sent = time.monotonic()
    proc.send_signal(number)
    proc.wait(30)
    took = time.monotonic() - sent
    assert proc.stderr is not None
    return took, proc.stderr.read().decode()


def _assert_stopped(
    db: Any, proc: subprocess.Popen[bytes], number: int, took: float, err: str, phase: str
) -> None:
    """The load exited with 128 + ``number`` within 3 s, said what happened, left nothing."""
    name = signal.Signals(number).name
    assert proc.returncode == 128 + number, err
    assert took < 3, f"{name} took {took:.1f} s"
    assert f"interrupted by {name} during {phase} of load" in err, err
    assert "the target is unchanged; the load's tables were dropped" in err, err
    assert leftovers(db) == []


@pytest.mark.parametrize(
    ("number", "driver"),
    [
        (signal.SIGINT, "psycopg"),
        (signal.SIGTERM, "psycopg"),
        (signal.SIGHUP, "psycopg"),
        (signal.SIGTERM, "psycopg2"),
    ],
)
def test_signal_during_copy_cancels_drops_and_exits(db, stdin_load, number, driver):
    _target(db)
    before = db.checksum("readings")
    proc = stdin_load("--driver", driver)
    _wait_for("COPY", lambda: _sessions(db, "copy"), proc)
    assert any(name.startswith("_pgbulk_") for name in leftovers(db))

    took, err = _signal_and_wait(proc, number)

    _assert_stopped(db, proc, number, took, err, "COPY")
    assert _sessions(db, "") == []
    assert db.checksum("readings") == before


@pytest.mark.parametrize(
    ("number", "driver"),
    [(signal.SIGTERM, "psycopg2"), (signal.SIGINT, "psycopg"), (signal.SIGHUP, "psycopg")],
)
def test_signal_during_finalize_waiting_for_a_lock(db, stdin_load, number, driver):
    """Finalize waits for another session's lock on the target (lock_timeout 60 s): the signal
    cancels that wait at once, the target keeps its rows."""
    _target(db)
    before = db.checksum("readings")
    import psycopg

    holder = psycopg.connect(db.dsn)
    try:
        holder.execute(f"LOCK TABLE {db.schema}.readings IN ACCESS SHARE MODE")
        proc = stdin_load("--driver", driver, "--lock-timeout", "60s", close=True)
        _wait_for("finalize waiting", lambda: _sessions(db, "finalize", True), proc)

        took, err = _signal_and_wait(proc, number)
    finally:
        holder.rollback()
        holder.close()

    _assert_stopped(db, proc, number, took, err, "finalize")
    assert db.checksum("readings") == before


def test_second_signal_exits_at_once_and_cleanup_removes_the_rest(db, stdin_load):
    """A reader holds a lock on the load's staging, so the first signal's clean-up waits for
    it; a second signal exits at once, naming the cleanup command, which then removes the
    tables."""
    _target(db)

    proc = stdin_load()
    _wait_for("COPY", lambda: _sessions(db, "copy"), proc)
    stage = next(n for n in leftovers(db) if n.endswith("_stage"))
    locker = subprocess.Popen(  # a reader of staging: the drop waits for it
        [sys.executable, "-c", _HOLD, db.dsn, f'{db.schema}."{stage}"'], stdout=subprocess.PIPE
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline() == b"locked\n"
        proc.send_signal(signal.SIGTERM)
        _wait_for("the clean-up's lock wait", lambda: _sessions(db, "stop", True), proc)
        took, err = _signal_and_wait(proc, signal.SIGTERM)
        assert proc.returncode == 143, err
        assert took < 1, f"the second SIGTERM took {took:.1f} s"
        assert "SIGTERM again: exiting at once" in err, err
        assert "airflow-pg-bulk cleanup" in err
        assert stage in leftovers(db)
    finally:
        locker.kill()
        locker.wait(30)

    listed = subprocess.run(
        [*CLI, "cleanup", "--conn", db.dsn, "--table", f"{db.schema}.readings", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert stage in listed.stdout and "would remove" in listed.stdout, listed.stdout
    assert stage in leftovers(db)

    removed = subprocess.run(
        [*CLI, "cleanup", "--conn", db.dsn, "--table", f"{db.schema}.readings"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert removed.returncode == 0, removed.stderr
    assert stage in removed.stdout and "removed" in removed.stdout, removed.stdout
    assert leftovers(db) == []
    assert db.scalar(f"SELECT v FROM {db.schema}.readings WHERE id = 0") == "kept"


_HOLD = """
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1], application_name="holder")
conn.execute("LOCK TABLE " + sys.argv[2] + " IN ACCESS SHARE MODE")
print("locked", flush=True)
time.sleep(60)
"""
