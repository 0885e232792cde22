"""Which reject rows a load keeps (rejects.py's policy): every row it rejected, once, whether the
load succeeds or fails; and every reject-limit error points at rows that are there."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import create_items, leftovers, write_csv

from airflow_pg_bulk import runner
from airflow_pg_bulk.errors import BadDataError, ConstraintViolationError


def _file(path: Path, ids: range, bad: set[int]) -> list[tuple[str, int]]:
    """A csv of items with a bad amount in the rows ``bad``; returns (file, line) of each."""
    data = [(i, f"item {i}", "12x" if i in bad else "1.00", "2024-01-01", None) for i in ids]
    write_csv(path, data)
    return [(str(path), n + 1) for n, i in enumerate(ids) if i in bad]


def _kept(db, load_id: str) -> list[tuple[str, int]]:
    return db.run(
        f"SELECT source_file, line FROM {db.schema}.pgbulk_rejects WHERE load_id = %s"
        " ORDER BY source_file, line",
        load_id,
    )


@pytest.mark.parametrize("where", ["partition", "finalize"])
def test_a_reject_limit_error_points_at_rows_that_are_kept(db, connect, tmp_path, where):
    create_items(db)
    if where == "partition":  # one partition alone goes past the limit
        expected = _file(tmp_path / "a.csv", range(1, 501), {10, 20, 30})
        expected += _file(tmp_path / "b.csv", range(501, 1001), set())
    else:  # each partition is within it, all of them together are not
        expected = _file(tmp_path / "a.csv", range(1, 501), {10, 20})
        expected += _file(tmp_path / "b.csv", range(501, 1001), {600})
    load_id = "aa11aa11aa11" if where == "partition" else "bb22bb22bb22"

    with pytest.raises(BadDataError) as info:
        runner.load(
            connect,
            db.table("items"),
            str(tmp_path / "*.csv"),
            mode="replace",
            partitions=2,
            on_error="reject",
            max_rejects=2,
            load_id=load_id,
        )

    assert str(info.value).endswith(f"See {db.schema}.pgbulk_rejects for load {load_id}")
    assert _kept(db, load_id) == expected  # every rejected row, once
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 0
    assert leftovers(db) == []


def test_a_load_failing_in_finalize_for_another_reason_keeps_its_rejects(db, connect, tmp_path):
    create_items(db)
    expected = _file(tmp_path / "a.csv", range(1, 501), {10})
    expected += _file(tmp_path / "b.csv", range(500, 1001), {700})  # id 500 twice

    with pytest.raises(ConstraintViolationError):
        runner.load(
            connect,
            db.table("items"),
            str(tmp_path / "*.csv"),
            mode="replace",
            partitions=2,
            on_error="reject",
            max_rejects=5,
            load_id="cc33cc33cc33",
        )

    assert _kept(db, "cc33cc33cc33") == expected
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 0
    assert leftovers(db) == []


def test_a_successful_load_keeps_its_rejects_once(db, connect, tmp_path):
    create_items(db)
    expected = _file(tmp_path / "a.csv", range(1, 501), {10, 20})
    expected += _file(tmp_path / "b.csv", range(501, 1001), {700})

    summary = runner.load(
        connect,
        db.table("items"),
        str(tmp_path / "*.csv"),
        mode="replace",
        partitions=2,
        on_error="reject",
        max_rejects=3,
        load_id="dd44dd44dd44",
    )

    assert (summary.rows, summary.rejects) == (997, 3)
    assert _kept(db, "dd44dd44dd44") == expected
