"""The daily example as Airflow 3 runs a backfill (issue 17, item 1): 10 days, 10 runs at once.

``dags_examples/daily_replace_partitions.py`` (``mode="replace_partitions"``, each run loading
its own day into its own partition of a table partitioned by day) under a real scheduler
(``airflow standalone``, LocalExecutor): backfills made through the REST API (what ``airflow
backfill create`` does) with ``max_active_runs=10``, whatever the DAG's ``max_active_runs=1``:
the first day alone (it creates the target's asset in Airflow: see the test), then the nine
others at once. Every run succeeds; every day's partition holds exactly its files' rows
(the rows it held before are gone); the day next to them, which no run loads, is untouched;
the load history holds each run's day.
"""

from __future__ import annotations

import csv
import datetime
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Database
from psycopg import sql

from airflow_pg_bulk.demo.connection import airflow_connection_json
from airflow_pg_bulk.demo.harness import AirflowStandalone
from airflow_pg_bulk.demo.harness.celery import scratch_database, sqlalchemy_url
from airflow_pg_bulk.demo.harness.metadata import parse_ts

EXAMPLE = Path(__file__).parent.parent / "dags_examples" / "daily_replace_partitions.py"
DAG_ID = "example_pg_bulk_daily_replace_partitions"
CONN_ID = "pg_bulk_backfill"
FIRST = datetime.date(2026, 1, 1)  # the example's start_date
DAYS = 10
METERS = 200

# (slow and a DAG run, but issue 17 asks for it green on both of CI's server versions: the
# partitions' swaps it races are the server's side)
pytestmark = [pytest.mark.slow, pytest.mark.dag_run, pytest.mark.both_servers]


def _day(n: int) -> datetime.date:
    return FIRST + datetime.timedelta(days=n)


class _StandaloneOnPostgres(AirflowStandalone):
    """``airflow standalone`` with its metadata in a PostgreSQL database: Airflow refuses to
    create a backfill on SQLite while its scheduler writes ("Backfill creation is not
    supported on SQLite under concurrent access")."""

    def __init__(self, dags: Path, metadata_dsn: str, **kwargs: object) -> None:
        super().__init__(dags, **kwargs)  # type: ignore[arg-type]
        self.metadata_dsn = metadata_dsn

    def _build_env(self) -> dict[str, str]:
        env = super()._build_env()
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = sqlalchemy_url(self.metadata_dsn)
        return env

    def _metadata_source(self) -> Path | str:
        return self.metadata_dsn


@pytest.fixture
def airflow(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStandalone]:
    dags = tmp_path_factory.mktemp("backfill_dags")
    shutil.copy(EXAMPLE, dags / EXAMPLE.name)
    env = {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": airflow_connection_json(pg_dsn),
        "PG_BULK_EXAMPLE_CONN_ID": CONN_ID,
    }
    metadata = f"pgbulk_airflow_{uuid.uuid4().hex[:8]}"
    # 10 runs, each with prepare, 2 COPY tasks, finalize and cleanup
    with (
        scratch_database(pg_dsn, metadata) as metadata_dsn,
        _StandaloneOnPostgres(
            dags, metadata_dsn, env=env, parallelism=24, startup_timeout=300
        ) as af,
    ):
        yield af


def _target(db: Database, folder: Path) -> dict[datetime.date, tuple[int, str]]:
    """``readings`` partitioned by day (DAYS + 1 days, each with rows of an earlier load), the
    files of the DAYS days, and each day's expected checksum."""
    db.run(
        sql.SQL(
            "CREATE TABLE {} (meter_id integer NOT NULL, day date NOT NULL, value numeric,"
            " PRIMARY KEY (meter_id, day)) PARTITION BY RANGE (day)"
        ).format(db.ident("readings"))
    )
    db.run(sql.SQL("CREATE TABLE {} (LIKE {})").format(db.ident("expected"), db.ident("readings")))
    for n in range(DAYS + 1):
        db.run(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"readings_{_day(n):%Y%m%d}"),
                db.ident("readings"),
                sql.Literal(_day(n).isoformat()),
                sql.Literal(_day(n + 1).isoformat()),
            )
        )
        db.run(  # an earlier load of the day: replaced by the backfill (but the last day's)
            sql.SQL("INSERT INTO {} SELECT m, %s, -1 FROM generate_series(1, %s) AS m").format(
                db.ident("readings")
            ),
            _day(n),
            METERS + 50,
        )
    expected = {}
    for n in range(DAYS):
        day = _day(n)
        (folder / day.isoformat()).mkdir(parents=True)
        for part in range(2):  # two files a day
            path = folder / day.isoformat() / f"readings-{part}.csv"
            with path.open("w", newline="") as out:
                writer = csv.writer(out)
                writer.writerow(["meter_id", "day", "value"])
                for m in range(part + 1, METERS + 1, 2):
                    writer.writerow([m, day.isoformat(), f"{(m * 7 + n) / 10:.1f}"])
            copy = sql.SQL("COPY {} FROM STDIN (FORMAT csv, HEADER)").format(db.ident("expected"))
            with db.conn.cursor() as cur, cur.copy(copy) as writer_copy:
                writer_copy.write(path.read_bytes())
        expected[day] = _checksum(db, "expected", day)
    return expected


def _checksum(db: Database, table: str, day: datetime.date) -> tuple[int, str]:
    return db.run(
        sql.SQL(
            "SELECT count(*), md5(string_agg(t::text, ',' ORDER BY t::text))"
            " FROM (SELECT meter_id, day, value FROM {} WHERE day = %s) t"
        ).format(db.ident(table)),
        day,
    )[0]


def _most_at_once(spans: list[tuple[datetime.datetime, datetime.datetime]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_a_backfill_of_ten_days_ten_runs_at_once(airflow, db, tmp_path):
    expected = _target(db, tmp_path / "readings")
    untouched = _checksum(db, "readings", _day(DAYS))
    conf = {"table": db.table("readings"), "source_dir": str(tmp_path / "readings")}
    airflow.wait_for_dag(DAG_ID, timeout=300)

    def backfill(first: int, last: int) -> int:
        made = airflow.api.request(
            "POST",
            "/api/v2/backfills",
            {
                "dag_id": DAG_ID,
                "from_date": f"{_day(first).isoformat()}T00:00:00Z",
                "to_date": f"{_day(last).isoformat()}T00:00:00Z",
                "max_active_runs": 10,
                "dag_run_conf": conf,
            },
        )
        return int(made["id"])

    def finished(ids: list[int], count: int, deadline: float) -> list[dict]:
        marks = ", ".join("?" for _ in ids)
        while True:
            runs = airflow.metadata.query(
                "SELECT run_id, state, logical_date, start_date, end_date FROM dag_run"
                f" WHERE dag_id = ? AND backfill_id IN ({marks}) ORDER BY logical_date",
                (DAG_ID, *ids),
            )
            if len(runs) == count and all(r["state"] in ("success", "failed") for r in runs):
                return runs
            assert time.monotonic() < deadline, [(r["run_id"], r["state"]) for r in runs]
            time.sleep(2)

    # The first day alone, then the other nine at once. Airflow 3.3 creates the asset that an
    # AssetAlias event names, when it is new, in the succeeding task's own transaction
    # (TaskInstance.register_asset_changes_in_db, "Dynamically creating AssetModel"): the
    # first finalizes of a new target that succeed at the same moment insert the same asset,
    # and all but one fail after their load committed (seen: 1 run of 10, 2 of 3 CI-like
    # runs). The first run creates it; the nine after it overlap as a backfill does.
    started = time.monotonic()
    ids = [backfill(0, 0)]
    # a paused DAG's tasks are not queued. Unpaused, the DAG also gets its latest scheduled
    # run (catchup=False), with the default params (public.readings, which this database does
    # not have): it fails in prepare and touches nothing; only the backfill's runs count here
    airflow.api.request(
        "PATCH", f"/api/v2/dags/{DAG_ID}?update_mask=is_paused", {"is_paused": False}
    )
    first = finished(ids, 1, started + 300)
    assert first[0]["state"] == "success", first
    while not airflow.metadata.query(  # (one backfill of a DAG at a time)
        "SELECT 1 FROM backfill WHERE id = ? AND completed_at IS NOT NULL", (ids[0],)
    ):
        assert time.monotonic() < started + 300, "the first backfill did not complete"
        time.sleep(1)
    ids.append(backfill(1, DAYS - 1))
    runs = finished(ids, DAYS, started + 900)
    wall = time.monotonic() - started
    # the nine at once: the runs, and their finalize tasks (what overlapped on this machine)
    run_spans = [(parse_ts(r["start_date"]), parse_ts(r["end_date"])) for r in runs]
    finalizes = airflow.metadata.query(
        "SELECT ti.start_date, ti.end_date FROM task_instance ti JOIN dag_run r"
        " ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id"
        " WHERE ti.dag_id = ? AND r.backfill_id = ? AND ti.task_id = 'load_day.finalize'",
        (DAG_ID, ids[1]),
    )
    finalize_spans = [(parse_ts(f["start_date"]), parse_ts(f["end_date"])) for f in finalizes]
    print(
        f"\nbackfill of {DAYS} days: {wall:.1f} s; runs at once: {_most_at_once(run_spans)}; "
        f"finalize tasks at once: {_most_at_once(finalize_spans)}"
    )
    failed = [r["run_id"] for r in runs if r["state"] != "success"]
    logs = ""
    if failed:
        snap = airflow.snapshot(DAG_ID, failed[0], parse_ts(runs[0]["start_date"]), with_logs=True)
        logs = snap.describe()
    assert not failed, f"failed runs {failed}\n{logs}"
    assert [parse_ts(r["logical_date"]).date() for r in runs] == [_day(n) for n in range(DAYS)]

    # every day's partition holds exactly its files' rows; the eleventh day is untouched
    for n in range(DAYS):
        assert _checksum(db, "readings", _day(n)) == expected[_day(n)], _day(n)
    assert _checksum(db, "readings", _day(DAYS)) == untouched
    assert not db.scalar(
        sql.SQL("SELECT count(*) FROM {} WHERE value = -1 AND day < %s").format(
            db.ident("readings")
        ),
        _day(DAYS),
    )
    history = db.run(
        sql.SQL(
            "SELECT interval_start::date, parts FROM {} WHERE scope = %s ORDER BY interval_start"
        ).format(db.ident("pgbulk_loads")),
        f"{DAG_ID}.load_day.prepare",
    )
    assert history == [(_day(n), [f"readings_{_day(n):%Y%m%d}"]) for n in range(DAYS)]

    assert _most_at_once(run_spans[1:]) == DAYS - 1
