"""Runs that touch the same rows are ordered by their data interval (issue 17, item 1), and
the load history stays small and off the swap's critical path (item 5).

Two runs of one DAG task load the same day (the same partition of a table partitioned by day,
or the same keys): both prepare and COPY, then finalize in either order. The newer run's rows
always win: the older run's finalize, coming second, fails naming the newer load and changes
nothing; ``allow_older_run`` overrides that. The rule is scoped: another DAG loading the same
table, a load into another partition, and the next scheduled run after a manual run are never
refused. Each data interval here is what Airflow 3.3 gives the run: its timetables'
``infer_manual_data_interval`` / ``next_dagrun_info``, and the context its task runner builds
(``airflow/sdk/execution_time/task_runner.py``: a run without a logical date has no
``data_interval_*`` keys, only ``dag_run.run_after``).
"""

from __future__ import annotations

import datetime
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from conftest import Database
from helpers import leftovers, write_csv
from psycopg import sql as psql

from airflow_pg_bulk import naming, sql, steps
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.demo.connection import airflow_connection_json
from airflow_pg_bulk.errors import AlreadyLoadedError, OlderRunError
from airflow_pg_bulk.operators.pg_bulk import run_order
from airflow_pg_bulk.plan import LOAD_HISTORY_TABLE, RunOrder, request_from_options

DAYS = 3  # partitions readings_d0 .. readings_d2, one per day from DAY0
DAY0 = datetime.date(2026, 11, 1)
METERS = 50
SCOPE = "daily.load_day.prepare"


@pytest.fixture
def conn(connect: Any) -> Any:
    c = connect()
    yield c
    c.close()


def _readings(db: Database, partitioned: bool = True) -> None:
    """``readings`` (meter, day, v; PK (meter, day)), partitioned by day into DAYS leaves
    ``readings_d0`` … (or not: ``partitioned=False``)."""
    db.run(
        psql.SQL(
            "CREATE TABLE {} (meter integer NOT NULL, day date NOT NULL, v integer NOT NULL,"
            " PRIMARY KEY (meter, day)){}"
        ).format(db.ident("readings"), psql.SQL(" PARTITION BY RANGE (day)" if partitioned else ""))
    )
    if not partitioned:
        return
    for n in range(DAYS):
        first, after = DAY0 + datetime.timedelta(days=n), DAY0 + datetime.timedelta(days=n + 1)
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"readings_d{n}"),
                db.ident("readings"),
                psql.Literal(first.isoformat()),
                psql.Literal(after.isoformat()),
            )
        )


def _day_file(folder: Path, day: int, value: int, name: str = "") -> Path:
    """Every meter's reading of day ``day`` (0-based), all with the value ``value``."""
    when = DAY0 + datetime.timedelta(days=day)
    rows = [(m, when.isoformat(), value) for m in range(1, METERS + 1)]
    return write_csv(folder / f"{name or f'day{day}-v{value}'}.csv", rows)


def _run(day: int, scope: str = SCOPE, hour: int = 0) -> RunOrder:
    """A scheduled run of a daily DAG (Airflow 3's CronTriggerTimetable: the data interval is
    the instant it was scheduled for)."""
    when = datetime.datetime(2026, 11, 1 + day, hour, tzinfo=datetime.UTC).isoformat()
    return RunOrder(scope, f"scheduled__{when}", when, when)


def _prepare(conn: Any, db: Database, path: Path, mode: str, run: RunOrder | None, **kw: Any):
    request = request_from_options(db.table("readings"), str(path), mode=mode, partitions=2, **kw)
    plan = steps.prepare(conn, request, naming.new_load_id(), run=run)
    for part in plan.partitions:
        steps.copy_partition(conn, plan, part.index)
    return plan


def _finish(conn: Any, db: Database, plan: Any) -> Any:
    try:
        return steps.finalize(conn, plan)
    finally:
        steps.cleanup(conn, db.schema, plan.load_id)


def _load(conn: Any, db: Database, path: Path, mode: str, run: RunOrder | None, **kw: Any):
    return _finish(conn, db, _prepare(conn, db, path, mode, run, **kw))


def _values(db: Database, day: int) -> set[int]:
    when = DAY0 + datetime.timedelta(days=day)
    found = db.run(
        psql.SQL("SELECT DISTINCT v FROM {} WHERE day = %s").format(db.ident("readings")), when
    )
    return {r[0] for r in found}


def _history(db: Database, *columns: str) -> list[tuple[Any, ...]]:
    return db.run(
        psql.SQL("SELECT {} FROM {} ORDER BY finalized_at, load_id").format(
            psql.SQL(", ").join(psql.Identifier(c) for c in columns), db.ident(LOAD_HISTORY_TABLE)
        )
    )


# --- two runs on the same rows, in both orders ---------------------------------------------


@pytest.mark.parametrize(
    ("mode", "kind"),
    [
        ("replace", "plain"),
        ("upsert", "plain"),
        ("replace", "partitioned"),
        ("replace_partitions", "partitioned"),
        ("upsert", "partitioned"),
    ],
)
@pytest.mark.parametrize("order", ["older_first", "newer_first"])
def test_two_runs_on_the_same_rows_the_newer_rows_win(db, conn, tmp_path, mode, kind, order):
    """Runs of day 1 and day 2 of one DAG task both load day 1 (partition d1 of a table
    partitioned by day; a correction of day 1 delivered with day 2's files, say): both past
    COPY before either finalizes."""
    _readings(db, partitioned=kind == "partitioned")
    old_run, new_run = _run(1), _run(2)
    older = _prepare(conn, db, _day_file(tmp_path, 1, value=1), mode, old_run)
    newer = _prepare(conn, db, _day_file(tmp_path, 1, value=2), mode, new_run)

    if order == "older_first":
        _finish(conn, db, older)
        _finish(conn, db, newer)
    else:
        _finish(conn, db, newer)
        with pytest.raises(OlderRunError) as refused:
            _finish(conn, db, older)
        text = str(refused.value)
        assert newer.load_id in text and new_run.run_id in text, text
        assert f"data interval {old_run.interval_start[:10]}" in text, text
        assert "finalized at" in text and "allow_older_run=True" in text, text
        assert "holds rows of a later run" in text, text
        if mode == "replace_partitions":
            assert "table partition readings_d1 of" in text, text

    assert _values(db, 1) == {2}  # the newer run's rows, whatever the order
    assert leftovers(db) == []
    loaded = _history(db, "run_id", "mode", "parts")
    expected_parts = ["readings_d1"] if mode == "replace_partitions" else None
    if order == "older_first":
        assert loaded == [(r.run_id, mode, expected_parts) for r in (old_run, new_run)]
    else:
        assert loaded == [(new_run.run_id, mode, expected_parts)]

    # a deliberate reload of the past: the older run again, with the override
    again = _load(
        conn, db, _day_file(tmp_path, 1, value=1, name="again"), mode, old_run, allow_older_run=True
    )
    assert again.rows == METERS
    assert _values(db, 1) == {1}


def test_an_older_replace_or_upsert_is_refused_before_its_copy(db, conn, tmp_path):
    """Prepared after the newer run finalized: refused by prepare, before any COPY."""
    _readings(db)
    _load(conn, db, _day_file(tmp_path, 1, value=2), "upsert", _run(2))
    request = request_from_options(
        db.table("readings"), str(_day_file(tmp_path, 1, value=1)), mode="upsert"
    )
    load_id = naming.new_load_id()
    with pytest.raises(OlderRunError, match="allow_older_run"):
        steps.prepare(conn, request, load_id, run=_run(1))
    steps.cleanup(conn, db.schema, load_id)
    assert leftovers(db) == []
    assert _values(db, 1) == {2}


# --- the scope: what is never refused --------------------------------------------------------


def test_runs_into_other_partitions_are_not_blocked(db, conn, tmp_path):
    """replace_partitions: an older run loading another day than the newer runs did."""
    _readings(db)
    _load(conn, db, _day_file(tmp_path, 2, value=2), "replace_partitions", _run(2))
    _load(conn, db, _day_file(tmp_path, 0, value=0), "replace_partitions", _run(0))
    assert _values(db, 0) == {0} and _values(db, 2) == {2}
    # but an older run into a partition a newer run replaced, is
    with pytest.raises(OlderRunError, match="readings_d2"):
        _load(conn, db, _day_file(tmp_path, 2, value=1), "replace_partitions", _run(1))
    assert _values(db, 2) == {2}


def test_another_dag_loading_the_same_table_is_not_blocked(db, conn, tmp_path):
    _readings(db)
    _load(conn, db, _day_file(tmp_path, 1, value=2), "replace", _run(2, scope="dag_a.load"))
    # another DAG (or another task of the same DAG), older data interval: its own order
    _load(conn, db, _day_file(tmp_path, 1, value=1), "replace", _run(1, scope="dag_b.load"))
    assert _values(db, 1) == {1}
    # outside Airflow (no run): never ordered
    _load(conn, db, _day_file(tmp_path, 1, value=3), "upsert", None)
    assert _values(db, 1) == {3}
    # the same table loaded again by dag_a, an older run: refused
    with pytest.raises(OlderRunError, match=re.escape("dag_a.load")):
        _load(conn, db, _day_file(tmp_path, 1, value=4), "replace", _run(1, scope="dag_a.load"))
    assert _values(db, 1) == {3}


def _task_context(dag_run: Any, prepare: str = "load_day.prepare") -> dict[str, Any]:
    """The keys of the context Airflow 3.3's task runner builds: ``logical_date`` and the
    ``data_interval_*`` keys only when the run has a logical date."""
    context: dict[str, Any] = {
        "dag": SimpleNamespace(dag_id="daily"),
        "run_id": dag_run.run_id,
        "dag_run": dag_run,
    }
    if dag_run.logical_date is not None:
        context.update(
            logical_date=dag_run.logical_date,
            data_interval_start=dag_run.data_interval_start,
            data_interval_end=dag_run.data_interval_end,
        )
    return context


def _timetables() -> dict[str, Any]:
    from airflow.timetables.interval import DeltaDataIntervalTimetable
    from airflow.timetables.trigger import CronTriggerTimetable, DeltaTriggerTimetable

    day = datetime.timedelta(days=1)
    return {
        "timedelta(days=1)": DeltaTriggerTimetable(day),  # Airflow 3's default for a timedelta
        "timedelta, create_delta_data_intervals": DeltaDataIntervalTimetable(day),
        "@daily": CronTriggerTimetable("0 0 * * *", timezone="UTC"),
    }


@pytest.mark.parametrize("timetable_name", sorted(_timetables()))
@pytest.mark.parametrize("with_logical_date", [True, False], ids=["logical_date", "none"])
def test_a_manual_run_does_not_block_the_next_scheduled_run(
    db, conn, tmp_path, timetable_name, with_logical_date
):
    """A manual run at 10:00, then the next scheduled run of the DAG (logical date 00:00
    with a data-interval timetable): the scheduled run replaces the manual run's rows."""
    from airflow.timetables.base import DataInterval, TimeRestriction

    timetable = _timetables()[timetable_name]
    _readings(db)
    triggered = pendulum.datetime(2026, 11, 2, 10, tz="UTC")
    # the manual run as Airflow 3.3 makes it: the UI sends the logical date (now), the REST
    # API may send none (trigger_dag / TriggerDAGRunPostBody.validate_context)
    interval = timetable.infer_manual_data_interval(run_after=triggered)
    manual = SimpleNamespace(
        run_id=f"manual__{triggered.isoformat()}",
        logical_date=triggered if with_logical_date else None,
        data_interval_start=interval.start if with_logical_date else None,
        data_interval_end=interval.end if with_logical_date else None,
        run_after=triggered,
    )
    # the last scheduled run, at 00:00 that day: the manual run comes after it
    midnight = pendulum.datetime(2026, 11, 2, tz="UTC")
    if "create_delta" in timetable_name:  # its data interval is the day before
        last = DataInterval(midnight - datetime.timedelta(days=1), midnight)
    else:  # a trigger timetable: the instant
        last = DataInterval(midnight, midnight)
    info = timetable.next_dagrun_info(
        last_automated_data_interval=last,
        restriction=TimeRestriction(pendulum.datetime(2026, 1, 1, tz="UTC"), None, True),
    )
    scheduled = SimpleNamespace(
        run_id=f"scheduled__{info.logical_date.isoformat()}",
        logical_date=info.logical_date,
        data_interval_start=info.data_interval.start,
        data_interval_end=info.data_interval.end,
        run_after=info.run_after,
    )
    assert info.run_after > triggered  # it is the next run, after the manual one
    if "create_delta" in timetable_name:  # the case whose logical date is before 10:00
        assert info.logical_date < triggered

    manual_order = run_order(_task_context(manual), "load_day.prepare")
    scheduled_order = run_order(_task_context(scheduled), "load_day.prepare")
    assert manual_order.scope == scheduled_order.scope == "daily.load_day.prepare"
    _load(conn, db, _day_file(tmp_path, 1, value=1), "replace", manual_order)
    _load(conn, db, _day_file(tmp_path, 1, value=2), "replace", scheduled_order)
    assert _values(db, 1) == {2}
    # and the scheduled run before the manual one (a late retry of yesterday's): refused
    yesterday = SimpleNamespace(
        run_id="scheduled__yesterday",
        logical_date=last.start,
        data_interval_start=last.start,
        data_interval_end=last.end,
        run_after=last.end,
    )
    with pytest.raises(OlderRunError, match=re.escape(scheduled.run_id)):
        _load(
            conn,
            db,
            _day_file(tmp_path, 1, value=0),
            "replace",
            run_order(_task_context(yesterday), "load_day.prepare"),
        )


def test_append_stays_exactly_once_per_run_and_is_not_ordered(db, conn, tmp_path):
    """An append adds rows: an older append after a newer one is not refused, and a run's
    append finalized once is never appended again (its load id)."""
    _readings(db)
    _load(conn, db, _day_file(tmp_path, 2, value=2), "append", _run(2))
    plan = _prepare(conn, db, _day_file(tmp_path, 1, value=1), "append", _run(1))
    _finish(conn, db, plan)
    assert _values(db, 1) == {1} and _values(db, 2) == {2}
    with pytest.raises(AlreadyLoadedError):
        steps.prepare(
            conn,
            request_from_options(
                db.table("readings"), str(_day_file(tmp_path, 1, value=1)), mode="append"
            ),
            plan.load_id,
            run=_run(1),
        )
    steps.cleanup(conn, db.schema, plan.load_id)


# --- the load history: kept small, upgraded, read by index ----------------------------------


def test_history_keeps_history_keep_loads_and_the_newest_of_each_partition(db, conn, tmp_path):
    _readings(db)
    # day 2's partition loaded by the newest run first; then six older runs of day 0
    _load(conn, db, _day_file(tmp_path, 2, value=9), "replace_partitions", _run(2, hour=9))
    for hour in range(6):
        _load(
            conn,
            db,
            _day_file(tmp_path, 0, value=hour, name=f"h{hour}"),
            "replace_partitions",
            _run(0, hour=hour),
            history_keep=3,
        )
    kept = _history(db, "run_id", "parts")
    # the last three, and the newest load of readings_d2 (beyond the last three)
    assert kept == [
        (_run(2, hour=9).run_id, ["readings_d2"]),
        *((_run(0, hour=h).run_id, ["readings_d0"]) for h in (3, 4, 5)),
    ]
    # which keeps the rule: an older run of day 2 is still refused
    with pytest.raises(OlderRunError, match="readings_d2"):
        _load(conn, db, _day_file(tmp_path, 2, value=1), "replace_partitions", _run(1))


def test_a_history_of_an_earlier_version_is_upgraded(db, conn, tmp_path):
    _readings(db)
    db.run(
        psql.SQL(
            "CREATE TABLE {} (load_id text PRIMARY KEY, target text NOT NULL, mode text NOT NULL,"
            " logical_date timestamptz, rows bigint NOT NULL, rejects bigint NOT NULL DEFAULT 0,"
            " finalized_at timestamptz NOT NULL DEFAULT now())"
        ).format(db.ident(LOAD_HISTORY_TABLE))
    )
    db.run(
        psql.SQL("INSERT INTO {} (load_id, target, mode, rows) VALUES ('0123456789ab', 'x', "
                 "'append', 5)").format(db.ident(LOAD_HISTORY_TABLE))
    )  # fmt: skip
    loaded = _prepare(conn, db, _day_file(tmp_path, 1, value=1), "replace_partitions", _run(1))
    _finish(conn, db, loaded)
    assert db.scalar("SELECT to_regclass(%s) IS NOT NULL", f"{db.schema}.pgbulk_loads_order")
    assert db.run(
        psql.SQL("SELECT load_id, scope, parts FROM {} ORDER BY finalized_at").format(
            db.ident(LOAD_HISTORY_TABLE)
        )
    ) == [("0123456789ab", None, None), (loaded.load_id, SCOPE, ["readings_d1"])]


MILLION = 1_000_000


@pytest.mark.slow
def test_a_million_loads_in_the_history_leave_the_swap_unchanged(db, tmp_path):
    """1M loads in ``pgbulk_loads`` (999 other targets, and 1,000 earlier loads of this one):
    the ordering check under the swap's lock is an index range scan that reads a handful of
    pages (EXPLAIN ANALYZE's buffers, not a wall clock), and the load trims the target's
    history to ``history_keep``. The swap's duration with and without them is printed."""
    conn = open_connection(db.dsn, "psycopg")  # one driver: a plan and a figure
    _readings(db)
    path = _day_file(tmp_path, 1, value=1)
    first = _load(conn, db, path, "replace", _run(0, hour=1))  # makes the history
    empty_swap = first.seconds["swap"]
    target = db.table("readings")
    db.run(
        psql.SQL(
            "INSERT INTO {} (load_id, target, mode, rows, finalized_at, scope, run_id,"
            " interval_start, interval_end)"
            " SELECT md5(i::text), CASE WHEN i <= 1000 THEN %s ELSE 'other.t' || mod(i, 999) END,"
            " 'replace', 1, now() - interval '1 second' * (%s - i), %s, 'r' || i,"
            " timestamptz '2020-01-01' + interval '1 minute' * i,"
            " timestamptz '2020-01-01' + interval '1 minute' * i"
            " FROM generate_series(1, %s) AS i"
        ).format(db.ident(LOAD_HISTORY_TABLE)),
        target,
        MILLION,
        SCOPE,
        MILLION,
    )
    db.run(psql.SQL("ANALYZE {}").format(db.ident(LOAD_HISTORY_TABLE)))
    assert (
        db.scalar(psql.SQL("SELECT count(*) FROM {}").format(db.ident(LOAD_HISTORY_TABLE)))
        > MILLION
    )

    run = _run(1)
    check = sql.newer_load(
        db.schema,
        LOAD_HISTORY_TABLE,
        target=target,
        scope=run.scope,
        interval=run.interval,
        load_id="000000000000",
    )
    plan_text = "\n".join(
        r[0] for r in db.run(psql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {}").format(check))
    )
    assert "Index Scan" in plan_text and "pgbulk_loads_order" in plan_text, plan_text
    assert "Seq Scan" not in plan_text, plan_text
    # the execution's buffers: the top node's (cumulative; planning's are apart)
    top = next(line for line in plan_text.splitlines() if "Buffers:" in line)
    buffers = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))
    assert buffers < 20, plan_text  # a few index pages, not the table's ~10,000

    started = time.perf_counter()
    summary = _load(conn, db, path, "replace", run)  # the swap checks and records, then trims
    total = time.perf_counter() - started
    assert summary.rows == METERS
    left = db.scalar(
        psql.SQL("SELECT count(*) FROM {} WHERE target = %s").format(db.ident(LOAD_HISTORY_TABLE)),
        target,
    )
    assert left == 1000  # history_keep: the last 1,000 (this load among them)
    print(
        f"\nswap with an empty history {empty_swap * 1000:.1f} ms; with {MILLION:,} loads "
        f"{summary.seconds['swap'] * 1000:.1f} ms; the check under the lock read {buffers} "
        f"buffers; the whole load (with the trim of 1,001 of this target's loads) {total:.2f} s"
    )
    conn.close()


@pytest.mark.parametrize(
    ("given", "expected"), [(True, True), ("True", True), ("false", False), ("", False)]
)
def test_allow_older_run_may_be_a_rendered_template(given, expected):
    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

    operator = PgBulkPrepareOperator(
        task_id="prepare", table="s.t", source="/x.csv", mode="replace", allow_older_run=given
    )
    assert operator.build_request().settings.allow_older_run is expected


def test_allow_older_run_that_is_no_boolean_is_refused():
    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

    operator = PgBulkPrepareOperator(
        task_id="prepare", table="s.t", source="/x.csv", mode="replace", allow_older_run="maybe"
    )
    with pytest.raises(TypeError, match="allow_older_run must be true or false"):
        operator.build_request()


# --- under Airflow: dag.test() ---------------------------------------------------------------


@pytest.mark.dag_run
def test_runs_under_airflow_are_ordered_by_their_data_interval(
    airflow_db, monkeypatch, db, tmp_path
):
    """``tests/dags_dynamic/run_order.py`` (a data-interval timetable, one day) under
    ``dag.test()``: a run triggered at 10:00 without a logical date (Airflow 3 gives it no data
    interval: it counts as the instant 10:00); a run with logical date 00:00 of the same day
    (``dag.test`` infers its data interval as a manual run's: the day before, ending at
    00:00) is older and refused, terminally, in prepare; the run whose interval is the day of
    the manual run (logical date the next day) replaces; an older run with
    ``allow_older_run`` from its params replaces too. (The scheduler's own intervals, where a
    run's logical date 00:00 starts its interval, are in
    test_a_manual_run_does_not_block_the_next_scheduled_run.)"""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_EXAMPLE", airflow_connection_json(db.dsn))
    bag = DagBag(dag_folder=str(Path(__file__).resolve().parent / "dags_dynamic"))
    dag = bag.get_dag("pg_bulk_run_order")
    db.run(psql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int)").format(db.ident("items")))

    def run(name: str, value: int, logical_date: Any, run_after: Any, **params: Any) -> Any:
        path = write_csv(tmp_path / f"{name}.csv", [(i, value) for i in range(1, 21)])
        conf = {"table": db.table("items"), "source": str(path), **params}
        result = dag.test(logical_date=logical_date, run_after=run_after, run_conf=conf)
        states = {ti.task_id: ti.state for ti in result.get_task_instances()}
        tries = {ti.task_id: ti.try_number for ti in result.get_task_instances()}
        return result.state, states, tries

    def values() -> set[int]:
        return {
            r[0] for r in db.run(psql.SQL("SELECT DISTINCT v FROM {}").format(db.ident("items")))
        }

    ten = pendulum.datetime(2026, 11, 2, 10, tz="UTC")
    assert run("manual", 1, None, ten)[0] == "success"
    assert values() == {1}
    midnight = pendulum.datetime(2026, 11, 2, tz="UTC")
    state, states, tries = run("same_day", 2, midnight, midnight)
    assert state == "failed" and states["load.prepare"] == "failed", states
    assert tries["load.prepare"] == 1, tries  # terminal: its 2 retries were not used
    assert states["load.cleanup"] == "success", states
    assert values() == {1}
    nextday = pendulum.datetime(2026, 11, 3, tz="UTC")
    assert run("next", 3, nextday, nextday)[0] == "success"  # its interval: 11-02 to 11-03
    assert values() == {3}
    old = pendulum.datetime(2026, 10, 1, tz="UTC")
    assert run("past", 4, old, old, allow_older_run=True)[0] == "success"
    assert values() == {4}
    recorded = db.run(
        psql.SQL("SELECT scope, interval_start, interval_end FROM {} ORDER BY finalized_at").format(
            db.ident(LOAD_HISTORY_TABLE)
        )
    )
    day = datetime.timedelta(days=1)
    assert recorded == [
        ("pg_bulk_run_order.load.prepare", ten, ten),
        ("pg_bulk_run_order.load.prepare", midnight, midnight + day),
        ("pg_bulk_run_order.load.prepare", old - day, old),
    ]
