"""An upsert rebuild's copy split across sessions (airflow_pg_bulk/target/rebuild.py,
``_fill_at_once``): the same rows as the serial copy, and a failure or a kill in one session
stops the others and leaves the target as it was.

The split is forced (its size threshold set to 0); a slow session is a stored generated column
over a function that sleeps at one id, armed by a row in a table once the target is built.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
import test_rebuild
from conftest import Database
from helpers import catalog_snapshot, create_items, leftovers, write_csv
from psycopg import sql
from test_finalize_parallel import extra_sessions_gone, kill_once_busy, no_helper_sessions
from test_kill import (
    STOPPED_WITHIN,
    airflow_conn,  # noqa: F401 (a fixture)
)
from test_upsert import _existing, _files, _reference

from airflow_pg_bulk import naming, runner, steps
from airflow_pg_bulk.db import session
from airflow_pg_bulk.db.driver import execute
from airflow_pg_bulk.errors import TransientLoadError
from airflow_pg_bulk.plan import LoadPlan, LoadRequest
from airflow_pg_bulk.sql import set_config as psql_setting
from airflow_pg_bulk.target import rebuild

SPLIT = "sessions at once"  # what the log says of a split copy


@pytest.fixture
def split(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> Any:
    """Every upsert rebuild splits its copy (2 sessions on the default server); yields a
    check that it did."""
    monkeypatch.setattr(rebuild, "SPLIT_MIN_BYTES", 0)
    caplog.set_level("INFO", logger="airflow_pg_bulk")

    def happened() -> bool:
        return any(SPLIT in r.getMessage() for r in caplog.records)

    return happened


def test_the_split_rule():
    assert rebuild.split_sessions(8, 90, 10**9, 64) == 2  # the server's default pool
    assert rebuild.split_sessions(16, 90, 10**9, 64) == 4
    assert rebuild.split_sessions(8, 90, 10, 64) == 1  # small: serial
    assert rebuild.split_sessions(8, 2, 10**9, 64) == 1  # one connection left: serial
    assert rebuild.split_sessions(3, 90, 10**9, 64) == 1  # a pool of 3: serial


def test_split_upsert_matches_plain_sql(db, connect, tmp_path, split):
    create_items(db)
    _existing(db)
    files = _files(tmp_path)
    updated, inserted = _reference(db, files, ["id"], test_rebuild.ITEM_COLUMNS)

    summary = runner.load(
        connect, db.table("items"), str(tmp_path / "*.csv"), mode="upsert", partitions=2,
        strategy="rebuild",
    )  # fmt: skip

    assert split()
    assert (summary.inserted, summary.updated) == (inserted, updated)
    assert db.checksum("items") == db.checksum("expected")
    assert leftovers(db) == []


def test_split_keeps_identity_serial_and_defaults(db, connect, tmp_path, split):
    """Columns not loaded (the update keeps them, the insert draws them), a composite key
    whose first column is split, from the target's sequence."""
    test_rebuild.test_identity_serial_and_defaults_match_in_place(db, connect, tmp_path, "rebuild")
    assert split()


def test_split_keeps_everything_a_replace_keeps(db, connect, tmp_path, split):
    test_rebuild.test_rebuild_keeps_everything_a_replace_keeps(db, connect, tmp_path, "upsert")
    assert split()


def test_split_on_a_skewed_text_key(db, connect, tmp_path, split):
    """A text key (its bounds compared as text), most rows on one value of the first key
    column: every row lands in exactly one range."""
    db.run(
        sql.SQL(
            "CREATE TABLE {} (region text NOT NULL, n integer NOT NULL, v text,"
            " PRIMARY KEY (region, n))"
        ).format(db.ident("skewed"))
    )
    db.run(
        f"INSERT INTO {db.schema}.skewed SELECT CASE WHEN g % 10 = 0 THEN 'r' || g ELSE 'same'"
        " END, g, 'old' FROM generate_series(1, 4000) g"
    )
    data = [("same" if n % 10 else f"r{n}", n, "new") for n in range(3001, 6001)]
    path = write_csv(tmp_path / "s.csv", data)
    expected = db.scalar(f"SELECT count(*) FROM {db.schema}.skewed WHERE n <= 3000") + len(data)

    summary = runner.load(
        connect, db.table("skewed"), str(path), mode="upsert", partitions=2, strategy="rebuild"
    )

    assert split()
    assert (summary.inserted, summary.updated) == (2000, 1000)
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.skewed") == expected
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.skewed WHERE v = 'new'") == 3000


def test_split_failure_before_the_swap_commits_leaves_the_target(
    db, connect, tmp_path, split, monkeypatch
):
    test_rebuild.test_failure_before_the_swap_commits_leaves_the_target(
        db, connect, tmp_path, "upsert", monkeypatch
    )
    assert split()


def build_armed(db: Database) -> None:
    """``items`` with a stored generated column over ``slow(id)``: once ``armed`` holds a row,
    it sleeps 60 s at id 1 and fails at id 4000 (``fail``) or sleeps there too (``sleep``), or
    sleeps 0.5 s at both (``nap``)."""
    s = sql.Identifier(db.schema)
    for statement in (
        "CREATE TABLE {s}.armed (mode text)",
        "CREATE FUNCTION {s}.slow(v integer) RETURNS integer LANGUAGE plpgsql IMMUTABLE"
        " AS $$DECLARE m text; BEGIN SELECT mode INTO m FROM {s}.armed;"
        " IF m IS NOT NULL AND v IN (1, 4000) THEN"
        "  IF v = 4000 AND m = 'fail' THEN RAISE EXCEPTION 'injected at id %', v; END IF;"
        "  PERFORM pg_catalog.pg_sleep(CASE m WHEN 'nap' THEN 0.5 ELSE 60 END); END IF;"
        " RETURN v; END$$",
        "CREATE TABLE {s}.items (id integer PRIMARY KEY, name text,"
        " slow integer GENERATED ALWAYS AS ({s}.slow(id)) STORED)",
        "INSERT INTO {s}.items (id, name) SELECT g, 'old' FROM generate_series(1, 4000) g",
    ):
        db.run(sql.SQL(statement).format(s=s))


def prepared_upsert(db: Database, connect: Any, tmp_path: Any) -> tuple[LoadPlan, Any]:
    """prepare and the COPY of an upsert rebuild of ``items`` (ids 2001-6000 loaded)."""
    path = write_csv(tmp_path / "i.csv", [(i, "new") for i in range(2001, 6001)])
    conn = connect()
    load_id = naming.new_load_id()
    steps.start_session(conn, naming.application_name(load_id, "finalize"))
    request = LoadRequest(
        db.table("items"), str(path), mode="upsert", partitions=2, strategy="rebuild",
        columns=("id", "name"),
    )  # fmt: skip
    plan = steps.prepare(conn, request, load_id, store_pieces=True)
    runner.run_plan(connect, plan, 2)
    return plan, conn


def test_a_failing_session_stops_the_others_and_leaves_the_target(db, connect, tmp_path, split):
    build_armed(db)
    before = catalog_snapshot(db, "items"), db.checksum("items")
    plan, conn = prepared_upsert(db, connect, tmp_path)
    db.run(f"INSERT INTO {db.schema}.armed VALUES ('fail')")  # id 1 sleeps, id 4000 fails
    name = naming.application_name(plan.load_id, "finalize")
    started = time.monotonic()
    try:
        with pytest.raises(Exception, match="injected at id 4000"):
            steps.finalize(conn, plan, session.Sessions(connect, name))
        assert split()
        assert time.monotonic() - started < STOPPED_WITHIN + 5  # the sleeper did not run on
        assert no_helper_sessions(db, plan)  # cancelled and closed
        assert (catalog_snapshot(db, "items"), db.checksum("items")) == before
        # a retry: the half-filled new table of the failed attempt is dropped and built again
        db.run(f"DELETE FROM {db.schema}.armed")
        summary = steps.finalize(conn, plan, session.Sessions(connect, name))
        assert (summary.inserted, summary.updated) == (2000, 2000)
        assert db.scalar(f"SELECT count(*) FROM {db.schema}.items WHERE name = 'new'") == 4000
    finally:
        steps.cleanup(conn, db.schema, plan.load_id)
        conn.close()
    assert leftovers(db) == []


def test_finalize_idle_in_its_transaction_outlives_the_server_timeout(db, connect, tmp_path, split):
    """finalize's session waits for the copy sessions idle in its transaction: a server's
    idle_in_transaction_session_timeout (here 100 ms, the copy 0.5 s) must not end it."""
    build_armed(db)
    plan, conn = prepared_upsert(db, connect, tmp_path)
    db.run(f"INSERT INTO {db.schema}.armed VALUES ('nap')")
    try:
        execute(conn, psql_setting("idle_in_transaction_session_timeout", "100ms"))
        conn.commit()
        name = naming.application_name(plan.load_id, "finalize")
        summary = steps.finalize(conn, plan, session.Sessions(connect, name))
        assert split()
        assert (summary.inserted, summary.updated) == (2000, 2000)
    finally:
        steps.cleanup(conn, db.schema, plan.load_id)
        conn.close()


def test_on_kill_cancels_every_copy_session(airflow_conn, tmp_path, split):  # noqa: F811
    db = airflow_conn
    build_armed(db)
    before = db.checksum("items")

    def connect() -> Any:
        return psycopg.connect(db.dsn)

    plan, conn = prepared_upsert(db, connect, tmp_path)
    conn.close()
    db.run(f"INSERT INTO {db.schema}.armed VALUES ('sleep')")  # ids 1 and 4000 both sleep
    error = kill_once_busy(db, plan, "wait_event = 'PgSleep'")
    assert isinstance(error, TransientLoadError), repr(error)
    assert db.checksum("items") == before
    assert extra_sessions_gone(db, plan)
    with psycopg.connect(db.dsn) as admin:
        steps.cleanup(admin, db.schema, plan.load_id)
    assert leftovers(db) == []
