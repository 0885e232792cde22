"""Finalize on several cores: a table's indexes built at once on sessions of their own, and the
old table dropped after the swap commits (see airflow_pg_bulk/target/parallel_builds.py).

Concurrency is shown on the real server: a test session holds ROW EXCLUSIVE on staging, which
every CREATE INDEX (SHARE) waits for, and the builds waiting at the same time are counted in
pg_stat_activity; a slow build is an expression index over a function that sleeps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from conftest import Database
from helpers import catalog_snapshot, leftovers, sqlstate_of, write_csv
from psycopg import sql
from test_kill import (
    STOPPED_WITHIN,
    airflow_conn,  # noqa: F401 (a fixture)
    assert_stopped,
    context,
    finalize_operator,
    session_of,
)
from test_server_faults import Background

from airflow_pg_bulk import naming, runner, steps
from airflow_pg_bulk.db import session
from airflow_pg_bulk.errors import ConstraintViolationError, TransientLoadError
from airflow_pg_bulk.plan import LoadPlan, LoadRequest
from airflow_pg_bulk.target import parallel_builds, swap

ROWS = 3000


def build_wide(db: Database, *, slow: bool = False) -> None:
    """``wide``: PK, a unique index, two plain indexes, a CHECK, a foreign key, old rows;
    with ``slow``, an index (built first) whose expression sleeps 60 s at id 1."""
    s = sql.Identifier(db.schema)
    statements = [
        "CREATE TABLE {s}.groups (gid integer PRIMARY KEY)",
        "INSERT INTO {s}.groups SELECT g FROM generate_series(0, 9) g",
        "CREATE TABLE {s}.wide (id integer CONSTRAINT wide_pkey PRIMARY KEY,"
        " code integer NOT NULL, name text, day date,"
        " gid integer CONSTRAINT wide_gid_fk REFERENCES {s}.groups (gid),"
        " amount numeric(12,2) CONSTRAINT wide_amount_ok CHECK (amount >= 0))",
        "CREATE UNIQUE INDEX b_wide_code ON {s}.wide (code)",
        "CREATE INDEX c_wide_name ON {s}.wide (name)",
        "CREATE INDEX d_wide_day_gid ON {s}.wide (day DESC, gid) INCLUDE (amount)",
        "INSERT INTO {s}.wide SELECT g, -g, 'old', date '2020-01-01' + g, g % 10, g"
        " FROM generate_series(5001, 5050) g",
    ]
    if slow:
        statements[2:2] = [
            "CREATE FUNCTION {s}.slow(v integer) RETURNS integer LANGUAGE plpgsql IMMUTABLE"
            " AS $$BEGIN IF v = 1 THEN PERFORM pg_catalog.pg_sleep(60); END IF; RETURN v;"
            " END$$",
        ]
        statements.append("CREATE INDEX a_wide_slow ON {s}.wide ({s}.slow(id))")
    for statement in statements:
        db.run(sql.SQL(statement).format(s=s))


def new_rows(count: int = ROWS, duplicate_code: bool = False) -> list[tuple[Any, ...]]:
    data = [
        (i, i * 7 % 100_003, f"name {i % 97}", f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}", i % 10,
         f"{i % 1000}.25")
        for i in range(1, count + 1)
    ]  # fmt: skip
    if duplicate_code:
        data[-1] = (*data[-1][:1], data[0][1], *data[-1][2:])
    return data


def prepared(db: Database, connect: Any, path: Any) -> tuple[LoadPlan, Any]:
    """prepare and the COPY of a replace of ``wide`` (2 partitions); returns the plan and an
    open connection for finalize."""
    conn = connect()
    load_id = naming.new_load_id()
    steps.start_session(conn, naming.application_name(load_id, "finalize"))
    request = LoadRequest(db.table("wide"), str(path), mode="replace", partitions=2)
    plan = steps.prepare(conn, request, load_id, store_pieces=True)  # (the operators read them)
    runner.run_plan(connect, plan, 2)
    return plan, conn


def helper_sessions(db: Database, plan: LoadPlan) -> list[tuple[str, str, str]]:
    """(application_name, state, query) of the load's extra sessions (``...finalize+<n>``)."""
    prefix = naming.application_name(plan.load_id, "finalize") + "+"
    return db.run(
        "SELECT application_name, state, query FROM pg_stat_activity"
        " WHERE starts_with(application_name, %s)",
        prefix,
    )


def no_helper_sessions(db: Database, plan: LoadPlan) -> bool:
    """True once the load's extra sessions are gone (a closed session's backend may take a
    moment to exit)."""
    deadline = time.monotonic() + STOPPED_WITHIN
    while helper_sessions(db, plan):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def builds_at_once(db: Database) -> int:
    with psycopg.connect(db.dsn) as conn:
        sizing = parallel_builds.read_limits(conn).sizing(4, None)
    return sizing.builds


def test_parallel_builds_equal_the_serial_ones(db, connect, tmp_path):
    assert builds_at_once(db) >= 2, "the test server must allow 8 parallel workers (default)"
    build_wide(db)
    path = write_csv(tmp_path / "wide.csv", new_rows())

    plan, conn = prepared(db, connect, path)
    try:
        steps.finalize(conn, plan)  # no extra sessions: one build after another
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    serial = catalog_snapshot(db, "wide"), db.checksum("wide")

    summary = runner.load(connect, db.table("wide"), str(path), mode="replace", partitions=2)

    assert summary.rows == ROWS
    assert (catalog_snapshot(db, "wide"), db.checksum("wide")) == serial
    assert db.run(
        "SELECT conname, convalidated FROM pg_constraint WHERE conrelid = %s::regclass"
        " AND contype <> 'n' ORDER BY conname",
        f"{db.schema}.wide",
    ) == [("wide_amount_ok", True), ("wide_gid_fk", True), ("wide_pkey", True)]
    assert leftovers(db) == []


def test_two_index_builds_run_at_once(db, connect, tmp_path):
    assert builds_at_once(db) >= 2
    build_wide(db)
    plan, conn = prepared(db, connect, write_csv(tmp_path / "wide.csv", new_rows()))
    blocker = psycopg.connect(db.dsn)
    try:
        # every CREATE INDEX (SHARE) waits for this lock: the builds in flight pile up here
        blocker.execute(
            sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(db.ident(plan.staging_table))
        )
        name = naming.application_name(plan.load_id, "finalize")
        step = Background(lambda: steps.finalize(conn, plan, session.Sessions(connect, name)))
        deadline = time.monotonic() + 20
        waiting: list[Any] = []
        while len(waiting) < 2 and time.monotonic() < deadline and step.thread.is_alive():
            waiting = [r for r in helper_sessions(db, plan) if "CREATE" in r[2]]
            time.sleep(0.02)
        blocker.rollback()
        assert step.join() is None
    finally:
        blocker.close()
        conn.close()
    assert len(waiting) == 2, waiting  # two builds at once, each on its own session
    assert {r[0] for r in waiting} == {f"{name}+1", f"{name}+2"}
    assert all(r[1] == "active" for r in waiting)
    assert db.checksum("wide")[0] == ROWS
    assert no_helper_sessions(db, plan)  # closed once the builds are done


def test_a_failing_build_stops_the_others_and_leaves_the_target(db, connect, tmp_path):
    assert builds_at_once(db) >= 2
    build_wide(db, slow=True)  # a_wide_slow sleeps 60 s while b_wide_code fails at once
    before = catalog_snapshot(db, "wide"), db.checksum("wide")
    path = write_csv(tmp_path / "wide.csv", new_rows(duplicate_code=True))
    plan, conn = prepared(db, connect, path)
    name = naming.application_name(plan.load_id, "finalize")
    started = time.monotonic()
    try:
        with pytest.raises(ConstraintViolationError, match=r"b_wide_code.*Key \(code\)=\(7\)"):
            steps.finalize(conn, plan, session.Sessions(connect, name))
    finally:
        conn.close()
    assert time.monotonic() - started < STOPPED_WITHIN + 5  # the slow build did not run on
    assert no_helper_sessions(db, plan)  # cancelled and closed
    assert (catalog_snapshot(db, "wide"), db.checksum("wide")) == before


def test_on_kill_cancels_every_index_build(airflow_conn, tmp_path):  # noqa: F811
    db = airflow_conn
    assert builds_at_once(db) >= 2
    build_wide(db)
    before = db.checksum("wide")

    def connect() -> Any:
        return psycopg.connect(db.dsn)

    plan, conn = prepared(db, connect, write_csv(tmp_path / "wide.csv", new_rows()))
    conn.close()
    blocker = psycopg.connect(db.dsn)
    try:
        blocker.execute(
            sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(db.ident(plan.staging_table))
        )
        error = kill_once_busy(db, plan, "state = 'active' AND strpos(query, 'CREATE') > 0")
    finally:
        blocker.close()
    assert isinstance(error, TransientLoadError), repr(error)
    assert sqlstate_of(error) == "57014"
    assert db.checksum("wide") == before
    assert extra_sessions_gone(db, plan)


def kill_once_busy(db: Database, plan: LoadPlan, busy: str, count: int = 2) -> Any:
    """Run finalize's operator in the background; once ``count`` of its extra sessions match
    ``busy`` (a condition on pg_stat_activity), kill it as Airflow's SIGTERM handler would,
    check that every session of the step stopped, and return the step's exception."""
    operator = finalize_operator(plan)
    step = Background(lambda: operator.execute(context("load.finalize", plan)))
    name = session_of(plan)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        waiting = db.scalar(
            sql.SQL(
                "SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, %s)"
                " AND {}"
            ).format(sql.SQL(busy)),
            name + "+",
        )
        if waiting == count or not step.thread.is_alive():
            break
        time.sleep(0.02)
    assert waiting == count
    killed = time.monotonic()
    threading.Thread(target=operator.on_kill).start()  # as Airflow's SIGTERM handler would
    assert_stopped(db, name, killed)  # the step's session and all its extra ones
    return step.join(STOPPED_WITHIN)


def extra_sessions_gone(db: Database, plan: LoadPlan) -> bool:
    """True once the extra sessions of finalize's operator are closed (within STOPPED_WITHIN)."""
    deadline = time.monotonic() + STOPPED_WITHIN
    while db.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, %s)",
        session_of(plan) + "+",
    ):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_old_table_is_dropped_after_the_swap_commits(db, connect, tmp_path, monkeypatch):
    build_wide(db)
    plan, conn = prepared(db, connect, write_csv(tmp_path / "wide.csv", new_rows()))
    retired = naming.retired_table(plan.load_id)
    seen: list[Any] = []
    drop = swap.drop_retired

    def observed(conn: Any, plan: LoadPlan) -> bool:
        # what another session sees between the swap's commit and the drop
        seen.append((db.scalar("SELECT to_regclass(%s) IS NOT NULL", f"{db.schema}.{retired}"),
                     db.checksum("wide")[0]))  # fmt: skip
        return drop(conn, plan)

    monkeypatch.setattr(swap, "drop_retired", observed)
    try:
        summary = steps.finalize(conn, plan)
    finally:
        conn.close()
    assert seen == [(True, ROWS)]  # swapped and committed, the old table still there
    assert "drop_old" in summary.seconds
    assert not db.scalar("SELECT to_regclass(%s) IS NOT NULL", f"{db.schema}.{retired}")
    # the old table's names went with it: the new table's indexes have the originals
    assert [r[0] for r in db.run(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass"
        " ORDER BY 1", f"{db.schema}.wide")] == [
        f"{db.schema}.{n}" for n in ("b_wide_code", "c_wide_name", "d_wide_day_gid", "wide_pkey")
    ]  # fmt: skip


def test_a_crash_between_the_commit_and_the_drop_leaves_what_cleanup_drops(
    db, connect, tmp_path, monkeypatch
):
    build_wide(db)
    plan, conn = prepared(db, connect, write_csv(tmp_path / "wide.csv", new_rows()))
    retired = naming.retired_table(plan.load_id)
    loaded = db.checksum("wide")
    monkeypatch.setattr(swap, "drop_retired", lambda conn, plan: False)  # died before it
    try:
        steps.finalize(conn, plan)
        after = db.checksum("wide")
        assert after[0] == ROWS and after != loaded
        assert db.scalar("SELECT to_regclass(%s) IS NOT NULL", f"{db.schema}.{retired}")
        monkeypatch.undo()
        again = steps.finalize(conn, plan)  # a retry: finalized before, nothing to do
        assert again.rows == ROWS and db.checksum("wide") == after
        dropped = steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert retired in dropped
    assert leftovers(db) == []
    assert db.checksum("wide") == after
