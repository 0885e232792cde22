"""The preview (``load --dry-run``, :func:`airflow_pg_bulk.runner.preview`): the files and
bytes, the COPY streams, the strategy and why, the checks, the rows each partition holds now;
nothing created or changed (the catalog and the load history compared before and after)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_pg_bulk import runner
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError

CLI = [os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")]


def _catalog(db: Any) -> Any:
    """Every relation of the test's schema (with its relfilenode: a rewrite shows), the schema,
    the load history's table: what a preview must leave as it found it."""
    relations = db.run(
        "SELECT n.nspname, c.relname, c.relkind, c.relfilenode FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s ORDER BY 1, 2",
        db.schema,
    )
    schemas = db.run("SELECT nspname FROM pg_namespace WHERE nspname = %s", db.schema)
    history = db.run(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = %s::regnamespace"
        " AND c.relname LIKE 'pgbulk%%'",
        db.schema,
    )
    return relations, schemas, history


def _monthly(db: Any) -> None:
    db.run(f"CREATE TABLE {db.schema}.readings (day date, v integer) PARTITION BY RANGE (day)")
    for month in (1, 2):
        db.run(
            f"CREATE TABLE {db.schema}.readings_{month} PARTITION OF {db.schema}.readings"
            f" FOR VALUES FROM ('2024-{month:02d}-01') TO ('2024-{month + 1:02d}-01')"
        )
    db.run(
        f"INSERT INTO {db.schema}.readings SELECT d, g FROM generate_series(1, 100) g,"
        " generate_series('2024-01-01'::date, '2024-01-31', '1 day') d"
    )
    db.run(f"ANALYZE {db.schema}.readings")


def _day(tmp_path: Path) -> str:
    path = tmp_path / "day.csv"
    path.write_text("".join(f"2024-01-15,{i}\n" for i in range(50)))
    return str(path)


def test_replace_partitions_preview_shows_the_month_it_would_cut(db, tmp_path):
    _monthly(db)
    source = _day(tmp_path)
    before = _catalog(db)

    shown = runner.preview(db.dsn, db.table("readings"), source, mode="replace_partitions")

    assert _catalog(db) == before
    assert shown.files == ((source, os.path.getsize(source)),)
    assert shown.source_bytes == os.path.getsize(source)
    assert sum(shown.copy_streams) == shown.source_bytes
    rows = {t.table: t.rows for t in shown.tables}
    assert rows == {f"{db.schema}.readings_1": 3100, f"{db.schema}.readings_2": 0}
    text = shown.describe()
    assert f"{db.schema}.readings_1: about 3,100" in text, text
    assert "a partition of a month loaded with a day's rows ends with that day's rows" in text
    assert "nothing was kept or changed" in text
    assert shown.receiving == (f"{db.schema}.readings_1",)
    assert f"{db.schema}.readings_1: about 3,100  <- receives rows" in text
    assert "the rows go to 1 of the 2 table partitions" in text
    assert "the privileges replace_partitions needs" in text
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.readings") == 3100


def test_cli_dry_run_of_an_append_says_the_strategy_and_changes_nothing(db, tmp_path):
    db.run(f"CREATE TABLE {db.schema}.plain (day date, v integer PRIMARY KEY)")
    db.run(f"INSERT INTO {db.schema}.plain SELECT '2024-01-01', g FROM generate_series(1, 500) g")
    db.run(f"ANALYZE {db.schema}.plain")
    # a real load first: the load history exists, and must keep its rows
    runner.load(db.dsn, db.table("plain"), _day_ids(tmp_path, 1000), mode="append")
    before = _catalog(db), db.run(f"SELECT * FROM {db.schema}.pgbulk_loads ORDER BY 1")
    source = _day_ids(tmp_path, 2000)

    done = subprocess.run(
        [*CLI, "load", "--conn", db.dsn, "--table", db.table("plain"), "--source", source,
         "--mode", "append", "--dry-run", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["strategy"] in ("in_place", "rebuild") and shown["why"]
    # the catalog's estimate: ANALYZE saw 500 rows; the 10 appended since may not be counted
    assert shown["tables"] in ([{"table": f"{db.schema}.plain", "rows": n}] for n in (500, 510))
    assert shown["effect"] == "add the rows"
    assert shown["receiving"] is None  # a plain target: the source is not read
    after = _catalog(db), db.run(f"SELECT * FROM {db.schema}.pgbulk_loads ORDER BY 1")
    assert after == before
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.plain") == 510


def _day_ids(tmp_path: Path, first: int) -> str:
    path = tmp_path / f"ids-{first}.csv"
    path.write_text("".join(f"2024-01-02,{first + i}\n" for i in range(10)))
    return str(path)


def test_preview_refuses_what_prepare_would(db, tmp_path):
    db.run(f"CREATE TABLE {db.schema}.plain (day date, v integer)")
    before = _catalog(db)

    with pytest.raises(LoadRefusedError):
        runner.preview(db.dsn, db.table("plain"), _day_ids(tmp_path, 1), mode="upsert", key=["v"])
    assert _catalog(db) == before


def test_a_bad_row_fails_the_preview_of_a_partitioned_target_as_the_load_would(db, tmp_path):
    _monthly(db)
    path = tmp_path / "bad.csv"
    path.write_text("2024-01-15,1\n2024-01-15,x\n")
    before = _catalog(db)

    with pytest.raises(BadDataError, match="line 2"):
        runner.preview(db.dsn, db.table("readings"), str(path), mode="replace_partitions")
    assert _catalog(db) == before
