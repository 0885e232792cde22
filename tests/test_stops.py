"""Loads stopped under Airflow (``dag.test()``, DAGs in tests/dags_dynamic/stops.py): an
``execution_timeout`` while finalize builds the partitions of a partitioned target side by
side, and a cleanup that fails.

The slowness and the failure are the server's: an index on the target whose expression calls
a plpgsql function that sleeps at one row of each day's new data, and an event trigger that
raises in cleanup's ``DROP TABLE``. Nothing of the server is mocked.
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Database
from helpers import create_items, leftovers, rows, write_csv
from psycopg import sql
from test_dags import example_conn  # noqa: F401 (a fixture)
from test_server_faults import Background, caught, ddl_trap  # noqa: F401 (a fixture)

from airflow_pg_bulk import naming, runner, steps
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import LoadRequest
from airflow_pg_bulk.target import partitioned

pytestmark = pytest.mark.dag_run

DAYS = [datetime.date(2026, 3, d) for d in range(1, 7)]  # six leaves
SLEEP = 30  # seconds the build of each day's index sleeps: far past the limit
LIMIT = 3.0  # finalize's execution_timeout in tests/dags_dynamic/stops.py
ENDS_WITHIN = 3.0  # the task ends within this many seconds of its limit
MARK = 999  # the id, in every day's new rows, at which the index build sleeps


@pytest.fixture
def stops_dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(Path(__file__).resolve().parent / "dags_dynamic" / "stops.py"))


def build_readings(db: Database) -> None:
    """``readings`` partitioned by day, six leaves with old rows, and an index over
    ``slowly(id)``, which sleeps SLEEP seconds at id MARK (no old row has it)."""
    s = sql.Identifier(db.schema)
    db.run(
        sql.SQL(
            "CREATE FUNCTION {s}.slowly(v integer) RETURNS integer LANGUAGE plpgsql IMMUTABLE"
            " AS $$BEGIN IF v = {mark} THEN PERFORM pg_catalog.pg_sleep({secs}); END IF;"
            " RETURN v; END$$"
        ).format(s=s, mark=sql.Literal(MARK), secs=sql.Literal(SLEEP))
    )
    db.run(
        sql.SQL(
            "CREATE TABLE {s}.readings (id integer, day date, v text, PRIMARY KEY (id, day))"
            " PARTITION BY RANGE (day)"
        ).format(s=s)
    )
    for day in DAYS:
        db.run(
            sql.SQL(
                "CREATE TABLE {s}.{leaf} PARTITION OF {s}.readings FOR VALUES FROM ({a}) TO ({b})"
            ).format(
                s=s,
                leaf=sql.Identifier(f"readings_{day:%Y%m%d}"),
                a=sql.Literal(day),
                b=sql.Literal(day + datetime.timedelta(days=1)),
            )
        )
    db.run(
        sql.SQL(
            "INSERT INTO {s}.readings SELECT n, d::date, 'old' FROM generate_series(1, 20) n,"
            " generate_series({a}::date, {b}::date, interval '1 day') d"
        ).format(s=s, a=sql.Literal(DAYS[0]), b=sql.Literal(DAYS[-1]))
    )
    db.run(sql.SQL("CREATE INDEX readings_slowly ON {s}.readings ({s}.slowly(id))").format(s=s))


def filenodes(db: Database) -> dict[str, int]:
    return {
        day.isoformat(): db.scalar(
            "SELECT pg_relation_filenode(%s::regclass)", f'"{db.schema}"."readings_{day:%Y%m%d}"'
        )
        for day in DAYS
    }


class DdlLog:
    """An event trigger (ddl_command_end) that notes every DDL statement of the test's schema,
    with the server's clock and the session's name, in a table: a row is there once the
    statement's transaction committed."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.name = f"pgbulk_log_{db.schema}"
        s = sql.Identifier(db.schema)
        db.run(sql.SQL("CREATE TABLE {s}.ddl_log (at float8, app text, query text)").format(s=s))
        db.run(
            sql.SQL(
                "CREATE FUNCTION {s}.ddl_log() RETURNS event_trigger LANGUAGE plpgsql AS $$"
                " BEGIN"
                "  IF pg_catalog.strpos(pg_catalog.current_query(), {schema}) > 0 THEN"
                "   INSERT INTO {s}.ddl_log VALUES (extract(epoch FROM clock_timestamp()),"
                "    current_setting('application_name'), pg_catalog.current_query());"
                "  END IF;"
                " END $$"
            ).format(s=s, schema=sql.Literal(db.schema))
        )
        db.run(
            sql.SQL(
                "CREATE EVENT TRIGGER {} ON ddl_command_end EXECUTE FUNCTION {}.ddl_log()"
            ).format(sql.Identifier(self.name), s)
        )

    def rows(self) -> list[tuple[float, str, str]]:
        return self.db.run(sql.SQL("SELECT * FROM {} ORDER BY at").format(self.db.ident("ddl_log")))

    def drop(self) -> None:
        self.db.run(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(self.name)))


class Watch:
    """Notes, every 10 ms, each statement that finalize's extra sessions (``…finalize+<n>``)
    run in this schema: when first and last seen active."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.seen: dict[tuple[str, str], list[float]] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.db.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT application_name, query FROM pg_stat_activity WHERE state = 'active'"
                    " AND application_name LIKE 'pgbulk:%%finalize+%%' AND strpos(query, %s) > 0",
                    (self.db.schema,),
                ).fetchall()
                now = time.time()
                for app, query in rows:
                    self.seen.setdefault((app, query), [now, now])[1] = now
                time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


def leaves(queries: Any) -> set[str]:
    """The staging partitions (``_pgbulk_<id>_p<n>``) the statements name."""
    return {m for q in queries for m in re.findall(r"_pgbulk_[0-9a-f]{12}_p[0-9]+", q)}


def test_execution_timeout_stops_the_side_by_side_partition_builds(
    stops_dagbag,
    example_conn,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """limit 3 s; six leaves, each build sleeping 30 s, two at once: the two running builds
    are cancelled at the limit, none of the four queued starts, the task ends within 3 s of
    its limit, the target is as it was and cleanup leaves nothing."""
    db = example_conn
    # every day swapped, built beside the target (a day this small is loaded in place by
    # default; dag.test runs the tasks in this process)
    monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
    build_readings(db)
    new = [(n, day, f"new {n}") for day in DAYS for n in range(MARK - 49, MARK + 1)]
    path = write_csv(tmp_path / "readings.csv", new)
    before = db.checksum("readings"), filenodes(db)
    log = DdlLog(db)
    watch = Watch(db)
    try:
        dag = stops_dagbag.get_dag("pg_bulk_finalize_timeout")
        run = dag.test(
            run_conf={
                "conn_id": "pg_bulk_example",
                "table": db.table("readings"),
                "source": str(path),
            }
        )
        time.sleep(0.5)  # for the watch: anything still running after the task would show
    finally:
        watch.stop()
        log.drop()
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    finalize = tis["load.finalize"]
    assert run.state == "failed"
    assert finalize.state == "failed"
    assert tis["load.cleanup"].state == "success"
    started, ended = finalize.start_date.timestamp(), finalize.end_date.timestamp()
    limit = started + LIMIT  # (the timer starts a little after start_date: this is earlier)
    print(f"finalize ran {ended - started:.2f} s (limit {LIMIT} s)")
    assert ended - started < LIMIT + ENDS_WITHIN, ended - started

    builds = {k: v for k, v in watch.seen.items() if "CREATE INDEX" in k[1]}
    assert builds, f"no partition build was seen running: {watch.seen}"
    assert len(leaves(q for _app, q in builds)) <= 2, builds  # two at once; no queued one
    assert all(first < limit + 0.5 for first, _last in builds.values()), (limit, builds)
    # cancelled: nothing of the builds' sessions runs after the task ended
    assert all(last < ended + 0.2 for _first, last in watch.seen.values()), (ended, watch.seen)
    # (a build's first DDL is the sleeping index build, cancelled: nothing of a build may
    # commit after the limit, and none of a queued build at all)
    committed = [(at, app, q) for at, app, q in log.rows() if "finalize+" in app]
    assert all(at < limit + 0.5 for at, _app, _q in committed), (limit, committed)
    assert len(leaves(q for _at, _app, q in committed)) <= 2, committed

    assert (db.checksum("readings"), filenodes(db)) == before
    assert leftovers(db) == []
    assert not db.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgbulk:%%'"
        " AND strpos(query, %s) > 0 AND state <> 'idle'",
        db.schema,
    )


# --- a failed cleanup, and what a crashed load leaves ------------------------------------------


def test_a_failed_cleanup_fails_the_run_and_the_next_load_drops_what_it_left(
    stops_dagbag,
    example_conn,  # noqa: F811
    ddl_trap,  # noqa: F811
    tmp_path,
):
    """An in-place append: its staging outlives finalize, for cleanup to drop. The server
    refuses cleanup's DROP TABLE (an event trigger raises): the run fails, though finalize
    succeeded (the rows are in), and the load's tables are left. The next run's prepare drops
    them (that load was finalized: whatever its age)."""
    db = example_conn
    create_items(db)
    db.run(sql.SQL("INSERT INTO {} VALUES (0, 'old', 1, NULL, NULL)").format(db.ident("items")))
    dag = stops_dagbag.get_dag("pg_bulk_append_in_place")
    first = write_csv(tmp_path / "first.csv", rows(300))
    second = write_csv(
        tmp_path / "second.csv", [(n + 1000, *r[1:]) for n, r in enumerate(rows(200))]
    )
    conf = {"conn_id": "pg_bulk_example", "table": db.table("items")}

    ddl_trap.arm("DROP TABLE", "raise")
    run = dag.test(run_conf={**conf, "source": str(first)})
    states = {ti.task_id: ti.state for ti in run.get_task_instances() if ti.map_index < 1}
    assert states["load.finalize"] == "success", states
    assert states["load.cleanup"] == "failed", states
    assert run.state == "failed", states
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("items"))) == 301
    left = leftovers(db)
    assert any(name.endswith("_stage") for name in left) and any(
        name.endswith("_ledger") for name in left
    ), left

    ddl_trap.disarm()
    again = dag.test(run_conf={**conf, "source": str(second)})
    assert again.state == "success"
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("items"))) == 501
    assert leftovers(db) == []  # the first run's tables too


ITEMS = ["id", "name", "amount", "day", "note"]


def _plan(db: Database, connect: Any, path: Path, mode: str = "append") -> Any:
    """prepare (a load of its own, on a connection closed after it)."""
    conn = connect()
    try:
        req = LoadRequest(table=db.table("items"), source=(str(path),), mode=mode,
                          partitions=2, columns=tuple(ITEMS), strategy="in_place")  # fmt: skip
        return steps.prepare(conn, req, naming.new_load_id())
    finally:
        conn.close()


def _copy(connect: Any, plan: Any, index: int) -> None:
    conn = connect()
    try:
        steps.start_session(conn, naming.application_name(plan.load_id, "copy", index))
        steps.copy_partition(conn, plan, index)
    finally:
        conn.close()


def _age(db: Database, plan: Any, seconds: int) -> None:
    """Make the load look ``seconds`` older than it is: what the server shows of a load that
    crashed that long ago (its prepare's time in the ledger's comment, its COPYs' times)."""
    ledger = db.ident(plan.ledger_table)
    prepared = db.scalar("SELECT extract(epoch FROM now())::float8") - seconds
    comment = steps.ledger_comment(plan.digest, plan.target.qualified, prepared)
    db.run(sql.SQL("COMMENT ON TABLE {} IS {}").format(ledger, sql.Literal(comment)))
    db.run(sql.SQL("UPDATE {} SET loaded_at = loaded_at - %s * interval '1 second'").format(ledger),
           seconds)  # fmt: skip


def load(db: Database, source: Path, driver: str, **options: Any) -> None:
    """A whole load in one process (its prepare drops what abandoned loads left)."""
    runner.load(db.dsn, db.table("items"), str(source), mode="upsert", strategy="in_place",
                columns=ITEMS, driver=driver, **options)  # fmt: skip


def tables_of(db: Database, plan: Any) -> list[str]:
    return sorted(n for n in leftovers(db) if n.startswith(f"_pgbulk_{plan.load_id}_"))


def test_the_next_load_drops_what_crashed_loads_left_never_a_running_one(
    db, connect, driver, tmp_path
):
    """Four earlier loads into ``items``, none cleaned up: ``crashed`` (prepared and copied two
    hours ago, then nothing), ``finalized`` (finalized, its cleanup never ran), ``idle`` (prepared
    and copied a moment ago: its next task may be waiting for a worker) and ``copying`` (two
    hours old, its COPY running now, waiting for a lock a report holds). A load with the default
    ``abandoned_after`` (1d) drops only the finalized one's tables; one with ``1h`` drops the
    crashed one's too; the idle and the copying loads keep theirs, and both go on to the end."""
    create_items(db)
    data = rows(400)
    source = write_csv(tmp_path / "items.csv", [(n + 1000, *r) for n, *r in data])
    parts = [write_csv(tmp_path / f"p{n}.csv", data[n * 100 : n * 100 + 100]) for n in range(4)]
    crashed, finalized, idle, copying = (_plan(db, connect, p) for p in parts)
    for plan in (crashed, finalized, idle):
        for index in (0, 1):
            _copy(connect, plan, index)
    conn = connect()
    try:
        steps.finalize(conn, finalized)  # and then no cleanup
    finally:
        conn.close()
    _copy(connect, copying, 0)
    _age(db, crashed, 7200)
    _age(db, copying, 7200)
    report = psycopg.connect(db.dsn)  # a report reading staging: the COPY waits for it
    report.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(db.ident(copying.staging_table)))
    running = Background(lambda: _copy(connect, copying, 1))
    try:
        caught(db, "COPY", waiting="relation", step=running,
               application=naming.application_name(copying.load_id, "copy", 1))  # fmt: skip
        before = {p.load_id: tables_of(db, p) for p in (crashed, finalized, idle, copying)}
        assert all(before.values()), before

        load(db, source, driver)
        after = {p.load_id: tables_of(db, p) for p in (crashed, finalized, idle, copying)}
        assert after == {**before, finalized.load_id: []}

        load(db, source, driver, abandoned_after="1h")
        after = {p.load_id: tables_of(db, p) for p in (crashed, finalized, idle, copying)}
        assert after == {**before, finalized.load_id: [], crashed.load_id: []}
    finally:
        report.close()
    assert running.join() is None  # the running COPY went on, into its staging
    for plan in (idle, copying):  # each goes on to the end
        conn = connect()
        try:
            summary = steps.finalize(conn, plan)
            steps.cleanup(conn, db.schema, plan.load_id)
        finally:
            conn.close()
        assert summary.rows == 100
    assert leftovers(db) == []


def test_an_abandoned_after_that_is_no_interval_is_refused_before_anything(db, tmp_path):
    create_items(db)
    source = write_csv(tmp_path / "items.csv", rows(10))
    with pytest.raises(LoadRefusedError, match="abandoned_after='soon' is not a PostgreSQL"):
        load(db, source, "psycopg", abandoned_after="soon")
    assert leftovers(db) == []
    assert db.checksum("items")[0] == 0
