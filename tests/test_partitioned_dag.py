"""The daily replace_partitions example DAG (dags_examples/daily_replace_partitions.py) run
with ``dag.test()`` for one day, then for the same day again with corrected files: each run
replaces its day's partition with exactly its files' rows and leaves the other days' as they
were (same relfilenode)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pendulum
import pytest
from helpers import leftovers, write_csv
from psycopg import sql as psql
from test_dags import dagbag, example_conn  # noqa: F401 (fixtures)

pytestmark = pytest.mark.dag_run

DAYS = [datetime.date(2026, 11, d) for d in (19, 20, 21)]


def _day_files(root: Path, day: datetime.date, version: int) -> None:
    folder = root / day.isoformat()
    folder.mkdir(parents=True, exist_ok=True)
    for part in range(2):
        rows = [(n, day, f"{version}.{part}{n}") for n in range(part * 50, part * 50 + 50)]
        write_csv(folder / f"part-{part}.csv", rows, header=["id", "day", "value"])


def _filenodes(db) -> dict[str, int]:
    return {
        day.isoformat(): db.scalar(
            "SELECT pg_relation_filenode(%s::regclass)", f'"{db.schema}"."readings_{day:%Y%m%d}"'
        )
        for day in DAYS
    }


def _day_rows(db, day: datetime.date) -> list[tuple]:
    return db.run(
        psql.SQL("SELECT id, value FROM {} WHERE day = %s ORDER BY id").format(
            db.ident("readings")
        ),
        day,
    )


def test_daily_replace_partitions_example_replaces_its_day_only(dagbag, example_conn, tmp_path):  # noqa: F811
    db = example_conn
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id integer, day date, value text, PRIMARY KEY (id, day))"
            " PARTITION BY RANGE (day)"
        ).format(db.ident("readings"))
    )
    for day in DAYS:
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"readings_{day:%Y%m%d}"),
                db.ident("readings"),
                psql.Literal(day),
                psql.Literal(day + datetime.timedelta(days=1)),
            )
        )
        db.run(
            psql.SQL("INSERT INTO {} SELECT n, %s, 'old' FROM generate_series(1, 30) n").format(
                db.ident("readings")
            ),
            day,
        )
    dag = dagbag.get_dag("example_pg_bulk_daily_replace_partitions")
    conf = {"table": db.table("readings"), "source_dir": str(tmp_path)}
    before = _filenodes(db)
    day = DAYS[1]
    when = pendulum.datetime(day.year, day.month, day.day, tz="UTC")

    for version in (1, 2):  # the day, then the day again with corrected files
        _day_files(tmp_path, day, version)
        run = dag.test(run_after=when, logical_date=when, run_conf=conf)
        assert run.state == "success"
        assert _day_rows(db, day) == [(n, f"{version}.{n // 50}{n}") for n in range(100)]

    for other in (DAYS[0], DAYS[2]):
        assert _day_rows(db, other) == [(n, "old") for n in range(1, 31)]
    # no day's file rewritten: the day's rows were replaced in place, by its primary key (a
    # DELETE and a MERGE: no TRUNCATE), the other days not touched
    assert _filenodes(db) == before
    assert leftovers(db) == []
