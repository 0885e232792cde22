"""The summary says what a load changed: per table partition touched, the action and the rows
before -> after (the catalog's estimate before, said to be one), and the rows the target
holds after the load, right for partial loads; in the text, ``--json`` and the log."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from airflow_pg_bulk import runner
from airflow_pg_bulk.loading import changes
from airflow_pg_bulk.plan.figures import LoadSummary, TableChange

CLI = [os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")]


def _monthly(db: Any) -> None:
    """``readings`` by month, January to March: 3,100 rows in January, 2,900
    in February (2024: a leap year)."""
    db.run(f"CREATE TABLE {db.schema}.readings (day date, v integer) PARTITION BY RANGE (day)")
    for month in (1, 2, 3):
        db.run(
            f"CREATE TABLE {db.schema}.readings_{month} PARTITION OF {db.schema}.readings"
            f" FOR VALUES FROM ('2024-{month:02d}-01') TO ('2024-{month + 1:02d}-01')"
        )
    db.run(
        f"INSERT INTO {db.schema}.readings SELECT d, g FROM generate_series(1, 100) g,"
        " generate_series('2024-01-01'::date, '2024-02-29', '1 day') d"
    )
    db.run(f"ANALYZE {db.schema}.readings")


def _file(path: Path, days: dict[str, int]) -> str:
    path.write_text("".join(f"{day},{i}\n" for day, n in days.items() for i in range(n)))
    return str(path)


def _changes(summary: Any) -> list[tuple[str, str, Any, Any, bool, bool]]:
    return [
        (c.table, c.action, c.rows_before, c.rows_after, c.before_estimated, c.after_estimated)
        for c in summary.changes
    ]


def test_replace_partitions_of_a_day_says_the_month_was_cut(db, tmp_path, caplog):
    _monthly(db)
    source = _file(tmp_path / "day.csv", {"2024-01-15": 50, "2024-03-02": 20})
    caplog.set_level(logging.INFO, logger="airflow_pg_bulk")

    summary = runner.load(db.dsn, db.table("readings"), source, mode="replace_partitions")

    s = db.schema
    assert _changes(summary) == [
        (f"{s}.readings_1", "replaced", 3100, 50, True, False),
        (f"{s}.readings_3", "replaced", summary.changes[1].rows_before, 20, True, False),
    ]
    assert summary.changes[1].rows_before in (0, None)  # empty: 0, or never analyzed
    actual = db.scalar(f"SELECT count(*) FROM {s}.readings")
    assert actual == 2900 + 50 + 20
    if summary.changes[1].rows_before == 0:
        assert (summary.table_rows, summary.table_rows_estimated) == (actual, True)
        assert f"{s}.readings holds about 2,970 rows now" in summary.describe()
    text = summary.describe()
    assert f"replaced {s}.readings_1: about 3,100 -> 50 rows" in text, text
    assert summary.to_dict()["changes"][0] == {
        "table": f"{s}.readings_1",
        "action": "replaced",
        "rows_before": 3100,
        "rows_after": 50,
        "before_estimated": True,
        "after_estimated": False,
    }
    assert type(summary).from_dict(summary.to_dict()) == summary
    finalized = [r.getMessage() for r in caplog.records if "finalized:" in r.getMessage()]
    assert finalized and f"replaced {s}.readings_1: about 3,100 -> 50 rows" in finalized[0]


def test_one_partition_replaced_counts_from_the_ledger(db, tmp_path):
    _monthly(db)
    source = _file(tmp_path / "day.csv", {"2024-02-03": 70})

    summary = runner.load(db.dsn, db.table("readings"), source, mode="replace_partitions")

    assert _changes(summary) == [
        (f"{db.schema}.readings_2", "replaced", 2900, 70, True, False),
    ]
    assert summary.table_rows == db.scalar(f"SELECT count(*) FROM {db.schema}.readings")


def test_a_load_into_one_of_many_partitions_does_not_sum_the_others(db, tmp_path, monkeypatch):
    """With more partitions than SUMMED_PARTITIONS (3 here, 2 allowed), the untouched ones'
    estimates are not read (one catalog row each): the summary tells the partition replaced,
    and not the target's total; a replace, which empties the others, still reads them."""
    _monthly(db)
    monkeypatch.setattr(changes, "SUMMED_PARTITIONS", 2)
    source = _file(tmp_path / "day.csv", {"2024-02-03": 70})

    summary = runner.load(db.dsn, db.table("readings"), source, mode="replace_partitions")

    assert _changes(summary) == [
        (f"{db.schema}.readings_2", "replaced", 2900, 70, True, False),
    ]
    assert (summary.table_rows, summary.table_rows_estimated) == (None, False)
    assert summary.what_changed() == [f"replaced {db.schema}.readings_2: about 2,900 -> 70 rows"]
    assert type(summary).from_dict(summary.to_dict()) == summary
    replaced = runner.load(db.dsn, db.table("readings"), source, mode="replace")
    assert (replaced.table_rows, replaced.table_rows_estimated) == (70, False)


def test_append_into_a_partition_and_whole_replace(db, tmp_path):
    _monthly(db)
    source = _file(tmp_path / "day.csv", {"2024-02-03": 30})

    appended = runner.load(db.dsn, db.table("readings"), source, mode="append")

    assert _changes(appended) == [
        (f"{db.schema}.readings_2", "appended to", 2900, 2930, True, True),
    ]
    assert appended.table_rows == 6030 and appended.table_rows_estimated

    replaced = runner.load(db.dsn, db.table("readings"), source, mode="replace")

    assert replaced.changes[0].table == f"{db.schema}.readings_2"
    assert replaced.changes[0].rows_after == 30
    assert replaced.changes[-1].action == "emptied"
    assert (replaced.table_rows, replaced.table_rows_estimated) == (30, False)
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.readings") == 30


def test_plain_table_append_and_replace_in_the_cli(db, tmp_path):
    db.run(f"CREATE TABLE {db.schema}.plain (day date, v integer)")
    db.run(f"INSERT INTO {db.schema}.plain SELECT '2024-01-01', g FROM generate_series(1, 1000) g")
    db.run(f"ANALYZE {db.schema}.plain")
    source = _file(tmp_path / "day.csv", {"2024-01-02": 40})

    def cli(mode: str) -> dict[str, Any]:
        command = [*CLI, "load", "--conn", db.dsn, "--table", db.table("plain")]
        done = subprocess.run(
            [*command, "--source", source, "--mode", mode, "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    appended = cli("append")
    assert appended["changes"] == [
        {
            "table": f"{db.schema}.plain",
            "action": "appended to",
            "rows_before": 1000,
            "rows_after": 1040,
            "before_estimated": True,
            "after_estimated": True,
        }
    ]
    assert (appended["table_rows"], appended["table_rows_estimated"]) == (1040, True)

    replaced = cli("replace")
    assert [(c["action"], c["rows_after"]) for c in replaced["changes"]] == [("replaced", 40)]
    assert (replaced["table_rows"], replaced["table_rows_estimated"]) == (40, False)


def test_upsert_says_rows_before_and_after_with_the_inserted_ones(db, tmp_path):
    db.run(f"CREATE TABLE {db.schema}.keyed (id integer PRIMARY KEY, v text)")
    db.run(f"INSERT INTO {db.schema}.keyed SELECT g, 'old' FROM generate_series(1, 100) g")
    db.run(f"ANALYZE {db.schema}.keyed")
    path = tmp_path / "changes.csv"
    path.write_text("".join(f"{i},new\n" for i in range(91, 111)))  # 10 updated, 10 new

    summary = runner.load(db.dsn, db.table("keyed"), str(path), mode="upsert", key=["id"])

    assert (summary.inserted, summary.updated) == (10, 10)
    assert _changes(summary) == [
        (f"{db.schema}.keyed", "upserted into", 100, 110, True, True),
    ]
    assert "upserted into" in summary.describe() and "about 100 -> about 110 rows" in (
        summary.describe()
    )


def test_the_log_line_names_ten_partitions_at_most():
    changes = tuple(TableChange(f"s.p{i}", "replaced", 100, 1) for i in range(12))
    summary = LoadSummary("s.t", "replace_partitions", 12, 120, 1, {}, changes=changes,
                          table_rows=1012, table_rows_estimated=True)  # fmt: skip

    assert summary.what_changed(most=10)[-2:] == [
        "... and 2 more table partitions",
        "s.t holds about 1,012 rows now",
    ]
    assert len(summary.what_changed()) == 13  # the CLI's text: every one
    assert type(summary).from_dict(summary.to_dict()) == summary
