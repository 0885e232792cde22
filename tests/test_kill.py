"""A killed or timed-out task stops the server's work; sessions are named; cleanup is bounded.

The statement is made slow on the real server with the traps of ``test_server_faults`` (an
expression index over a plpgsql function that sleeps) or by a lock the test holds; the task is
then killed the way Airflow 3.3 kills it: ``on_kill()`` (the SIGTERM handler calls it, here from
another thread), or an ``execution_timeout`` run through the task runner's own
``_run_execute_callable`` (SIGALRM raises ``AirflowTaskTimeout`` in the main thread while psycopg
waits, then ``on_kill()``). Nothing of the server's behaviour is mocked; Airflow's context is.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from conftest import Database
from helpers import error_chain, leftovers, sqlstate_of
from psycopg import sql
from test_server_faults import (
    Background,
    Target,
    arm,
    build_target,
    caught,
    copy,
    disarm,
    mark_id,
    new_rows,
    prepare,
    request,
    write_source,
)

from airflow_pg_bulk import naming, runner
from airflow_pg_bulk.demo.connection import airflow_connection_json
from airflow_pg_bulk.errors import TransientLoadError
from airflow_pg_bulk.operators.pg_bulk import PgBulkCleanupOperator, PgBulkFinalizeOperator
from airflow_pg_bulk.plan import LoadPlan, Settings

CONN_ID = "pg_bulk_kill"
DAG_ID = "kill_dag"
STOPPED_WITHIN = 3.0  # seconds: less than the sessions' client_connection_check_interval


@pytest.fixture
def airflow_conn(monkeypatch: pytest.MonkeyPatch, db: Database) -> Database:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", airflow_connection_json(db.dsn))
    return db


def _prepare_xcom(plan: LoadPlan | None, key: str) -> Any:
    """What prepare pushed: the shared plan, and the partition numbers as its return value."""
    if plan is None:
        return None
    if key == "plan":
        return plan.shared().to_dict()
    return [p.index for p in plan.partitions]


def context(task_id: str, plan: LoadPlan | None = None, map_index: int = -1) -> dict[str, Any]:
    """What the operators read of Airflow's context (prepare's XCom holds ``plan``)."""
    ti = SimpleNamespace(
        dag_id=DAG_ID,
        task_id=task_id,
        map_index=map_index,
        xcom_pull=lambda key="return_value", **_: _prepare_xcom(plan, key),
    )
    prepare = SimpleNamespace(is_mapped=False, get_closest_mapped_task_group=lambda: None)
    dag = SimpleNamespace(dag_id=DAG_ID, get_task=lambda _task_id: prepare)
    return {"ti": ti, "dag": dag, "run_id": "manual__kill"}


def finalize_operator(plan: LoadPlan, **kwargs: Any) -> PgBulkFinalizeOperator:
    return PgBulkFinalizeOperator(
        task_id="load.finalize", postgres_conn_id=CONN_ID, prepare_task_id="load.prepare", **kwargs
    )


def session_of(plan: LoadPlan) -> str:
    return naming.application_name(plan.load_id, f"{DAG_ID}.load.finalize")


def assert_stopped(db: Database, name: str, since: float) -> None:
    """No statement of the session ``name`` (or of its extra sessions, ``name+<n>``: finalize's
    index builds) is active, within STOPPED_WITHIN s of ``since``."""
    while db.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE (application_name = %s"
        " OR starts_with(application_name, %s || '+')) AND state = 'active'",
        name,
        name,
    ):
        assert time.monotonic() - since < STOPPED_WITHIN, f"{name} still runs a statement"
        time.sleep(0.02)


def loaded_plan(
    db: Database, tmp_path: Any, load_id: str | None = None, **kwargs: Any
) -> tuple[LoadPlan, Target]:
    """The fault tests' target with old rows, and a replace load of new rows copied."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    # as the prepare task does: the pieces stored for the finalize task to read
    plan = prepare(db, request(db, path, "replace", **kwargs), load_id, store_pieces=True)
    copy(db, plan)
    return plan, target


def test_on_kill_during_create_index_cancels_it(airflow_conn, tmp_path):
    db = airflow_conn
    plan, target = loaded_plan(db, tmp_path)
    arm(db, "index", mark_id("replace"))  # the build of the trap index sleeps 60 s
    operator = finalize_operator(plan)
    step = Background(lambda: operator.execute(context("load.finalize", plan)))

    caught(db, "CREATE INDEX", step=step, application=session_of(plan))
    killed = time.monotonic()
    threading.Thread(target=operator.on_kill).start()  # as Airflow's SIGTERM handler would

    assert_stopped(db, session_of(plan), killed)
    error = step.join(STOPPED_WITHIN)
    assert isinstance(error, TransientLoadError), repr(error)
    assert sqlstate_of(error) == "57014"
    assert time.monotonic() - killed < STOPPED_WITHIN
    target.untouched()


def test_on_kill_during_the_swap_lock_wait_cancels_it(airflow_conn, tmp_path):
    db = airflow_conn
    plan, target = loaded_plan(db, tmp_path, settings=Settings(lock_timeout="2min"))
    blocker = psycopg.connect(db.dsn)  # a report reading the target in a long transaction
    try:
        blocker.execute(sql.SQL("SELECT count(*) FROM {}").format(db.ident("items")))
        operator = finalize_operator(plan)
        step = Background(lambda: operator.execute(context("load.finalize", plan)))
        caught(db, "LOCK TABLE", waiting="relation", step=step, application=session_of(plan))
        killed = time.monotonic()
        threading.Thread(target=operator.on_kill).start()

        assert_stopped(db, session_of(plan), killed)
        error = step.join(STOPPED_WITHIN)
        assert isinstance(error, TransientLoadError), repr(error)
        assert sqlstate_of(error) == "57014"
    finally:
        blocker.close()
    target.untouched()


def test_execution_timeout_cancels_the_running_statement(airflow_conn, tmp_path):
    """The task runner's own timeout path: SIGALRM raises in this (main) thread while psycopg
    waits for the CREATE INDEX; psycopg does not cancel for it; the step does."""
    from airflow.sdk.exceptions import AirflowTaskTimeout
    from airflow.sdk.execution_time.task_runner import _run_execute_callable

    db = airflow_conn
    plan, target = loaded_plan(db, tmp_path)
    arm(db, "index", mark_id("replace"))
    operator = finalize_operator(plan, execution_timeout=timedelta(seconds=3))
    seen: list[int] = []
    watcher = threading.Thread(
        target=lambda: seen.append(caught(db, "CREATE INDEX", application=session_of(plan))),
        daemon=True,
    )
    watcher.start()

    with pytest.raises(AirflowTaskTimeout):
        _run_execute_callable(context("load.finalize", plan), operator.execute, operator)
    timed_out = time.monotonic()

    watcher.join(5)
    assert seen, "the CREATE INDEX was not seen running under the session's name"
    assert_stopped(db, session_of(plan), timed_out)
    target.untouched()
    assert operator.hook._in_use is None  # the step's connection is closed


def test_in_process_runner_names_each_step(db, tmp_path):
    build_target(db)
    path = write_source(tmp_path, new_rows("replace"))
    arm(db, "index", mark_id("replace"), secs=1.5)  # time to see finalize's session
    load_id = naming.new_load_id()
    step = Background(
        lambda: runner.load(
            db.dsn,
            db.table("items"),
            str(path),
            mode="replace",
            columns=["id", "name", "amount", "gid", "day", "note"],
            load_id=load_id,
        )
    )
    assert caught(db, "CREATE INDEX", step=step, application=f"pgbulk:{load_id}:finalize")
    assert step.join(60) is None
    assert leftovers(db) == []


def test_cleanup_blocked_by_a_lock_fails_within_its_bound_naming_what_is_left(
    airflow_conn, tmp_path
):
    db = airflow_conn
    load_id = naming.load_id_for(DAG_ID, "manual__kill", "load.prepare")  # the task's load
    plan, _target = loaded_plan(db, tmp_path, load_id)
    blocker = psycopg.connect(db.dsn)  # e.g. a killed finalize's backend that has not ended
    try:
        blocker.execute(sql.SQL("SELECT count(*) FROM {}").format(db.ident(plan.staging_table)))
        operator = PgBulkCleanupOperator(
            task_id="load.cleanup",
            postgres_conn_id=CONN_ID,
            table=db.table("items"),
            prepare_task_id="load.prepare",
            lock_timeout="200ms",
        )
        started = time.monotonic()
        with pytest.raises(TransientLoadError) as info:
            operator.execute(context("load.cleanup"))
        # 3 tries of 200 ms, 1 s and 2 s apart
        assert time.monotonic() - started < 8
        assert plan.staging_table in str(info.value)
        # the ledger is kept while staging is left: it says whose staging is, for the next
        # load into the target (cleanup.drop_abandoned)
        assert plan.ledger_table in str(info.value)
        left = leftovers(db)
        assert plan.staging_table in left
        assert plan.ledger_table in left
    finally:
        blocker.close()
    dropped = operator.execute(context("load.cleanup"))
    assert sorted(dropped) == sorted([plan.staging_table, plan.ledger_table])
    assert leftovers(db) == []


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_kill_between_statements_refuses_the_next_one(db, driver):
    """A cancel that reaches the server between two statements is ignored by it: the kill
    must still keep the step from starting its next statement."""
    from airflow_pg_bulk.db import driver as adapter

    conn = adapter.connect(db.dsn, driver)
    try:
        assert adapter.stop(conn) is False  # nothing was running
        with pytest.raises(TransientLoadError, match="killed"):
            adapter.execute(conn, sql.SQL("SELECT 1"))
    finally:
        adapter.close_cancelling(conn)
    assert conn not in adapter._stopped


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_statement_that_raced_the_kill_is_cancelled_too(db, driver):
    """A statement sent just after the kill (its thread had passed the check before the kill
    came, or the server was still reading it and ignored the cancel) is cancelled as soon as
    it runs, not left to run to its end (seen in CI: a side-by-side index build started as a
    failing one stopped the others, and ran its 60 s)."""
    from airflow_pg_bulk.db import driver as adapter

    conn = adapter.connect(db.dsn, driver)
    try:
        assert adapter.stop(conn) is False  # nothing was running yet
        started = time.monotonic()
        # the driver's own cursor: past the check
        with pytest.raises(Exception) as raised, conn.cursor() as cur:
            cur.execute("SELECT pg_sleep(30)")
        assert time.monotonic() - started < 5
        assert sqlstate_of(raised.value) == "57014"
    finally:
        adapter.close_cancelling(conn)


# --- a kill never outlives its connection -----------------------------------------------------


def test_a_killed_connection_leaves_no_mark_once_gone(db, driver):
    """The kill is held by the connection itself: once a killed connection is gone (closed by
    whoever holds it, not by ``close_cancelling``, and collected), nothing of its kill is kept,
    so no connection opened later, at the same address or not, can inherit it."""
    import gc

    from airflow_pg_bulk.db import driver as adapter

    killed = adapter.connect(db.dsn, driver)
    adapter.stop(killed)
    assert killed in adapter._stopped
    address = id(killed)
    killed.close()  # e.g. by a pool, or a finalizer
    del killed
    gc.collect()
    # (the set used to hold id()s: the dead connection's address stayed in it for good)
    assert not any(entry == address or id(entry) == address for entry in adapter._stopped)


def test_a_kill_while_a_session_opens_closes_it(db, driver):
    """A kill landing while one of finalize's extra sessions opens (after its connection is
    made, before it is listed) refuses the session and closes its connection."""
    from airflow_pg_bulk.db import driver as adapter
    from airflow_pg_bulk.db import session

    opened: list[Any] = []

    def factory() -> Any:
        conn = adapter.connect(db.dsn, driver)
        opened.append(conn)
        sessions.stop()  # the kill arrives now
        return conn

    sessions = session.Sessions(factory, naming.application_name("0123456789ab", "finalize"))
    with pytest.raises(TransientLoadError, match="killed"):
        sessions.open()
    assert opened[0].closed
    assert opened[0] not in adapter._stopped


MIN_LOADS_AFTER_A_KILL = 20
MAX_LOADS_AFTER_A_KILL = 60


def test_loads_after_a_killed_load_are_never_refused(db, driver, tmp_path, caplog):
    """A load killed while an index build of its finalize sleeps (every connection it holds
    stopped, as ``PgBulkHook.cancel`` does), then more loads in the same process (at least 20,
    and until a connection of theirs gets a killed connection's id, which usually takes a
    few): none is refused as killed."""
    import gc
    import logging
    import traceback

    from airflow_pg_bulk.db import driver as adapter

    build_target(db)
    path = write_source(tmp_path, new_rows("replace"))
    columns = ["id", "name", "amount", "gid", "day", "note"]
    opened: list[Any] = []

    def factory() -> Any:
        conn = adapter.connect(db.dsn, driver)
        opened.append(conn)
        return conn

    arm(db, "index", mark_id("replace"))
    # the killed load logs its failed cleanup with its traceback, whose frames would hold
    # its connections for as long as the test's log capture keeps the record
    caplog.set_level(logging.CRITICAL, logger="airflow_pg_bulk")
    load_id = naming.new_load_id()
    step = Background(
        lambda: runner.load(
            factory, db.table("items"), str(path), mode="replace", columns=columns, load_id=load_id
        )
    )
    caught(db, "CREATE INDEX", step=step, application=f"pgbulk:{load_id}:finalize")
    for conn in list(opened):
        adapter.stop(conn)
    error = step.join(STOPPED_WITHIN + 5)
    assert sqlstate_of(error) == "57014", repr(error)
    killed = {id(conn) for conn in opened}
    # the killed load's connections are gone once nothing holds them: its error's frames
    # (kept by the log records of the test's capture, too) held some
    for exc in error_chain(error):
        traceback.clear_frames(exc.__traceback__)
    opened.clear()
    step.error = error = None
    gc.collect()
    disarm(db)

    later: set[int] = set()
    loads = 0
    while loads < MIN_LOADS_AFTER_A_KILL or (not killed & later and loads < MAX_LOADS_AFTER_A_KILL):
        runner.load(factory, db.table("items"), str(path), mode="replace", columns=columns)
        later.update(id(conn) for conn in opened)
        opened.clear()
        loads += 1
    # (whether a later connection got a killed one's id depends on the allocator: seen
    # within a few loads on one build of the code, not within 150 on another; the old
    # bookkeeping by id() refused a load exactly then. That the mark dies with its
    # connection is asserted deterministically by test_a_killed_connection_leaves_no_mark_once_gone)
    print(f"{loads} loads after the kill; a killed connection's id reused: {bool(killed & later)}")
