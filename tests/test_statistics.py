"""An in-place append or upsert ANALYZEs the target only for a batch of a tenth of its rows
or more (the catalog's reltuples shows whether ANALYZE ran); a replace always does."""

from __future__ import annotations

import logging

import pytest
from helpers import create_items, rows, write_csv
from psycopg import sql as psql

from airflow_pg_bulk import runner


def _reltuples(db) -> float:
    return db.scalar("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", db.table("items"))


@pytest.fixture
def analyzed_items(db):
    create_items(db)
    db.run(
        psql.SQL(
            "INSERT INTO {} (id, name, amount, day, note) SELECT g, 'n' || g, g,"
            " DATE '2024-01-01', NULL FROM generate_series(1, 2000) g"
        ).format(db.ident("items"))
    )
    db.run(psql.SQL("ANALYZE {}").format(db.ident("items")))
    assert _reltuples(db) == 2000
    return db


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_small_in_place_batch_leaves_statistics_to_autovacuum(
    analyzed_items, connect, tmp_path, mode, caplog
):
    db = analyzed_items
    path = write_csv(tmp_path / "a.csv", [(r[0] + 10_000, *r[1:]) for r in rows(50, seed=1)])
    with caplog.at_level(logging.INFO, logger="airflow_pg_bulk.target.statistics"):
        summary = runner.load(connect, db.table("items"), str(path), mode=mode, strategy="in_place")
    assert summary.rows == 50
    assert db.scalar(psql.SQL("SELECT count(*) FROM {}").format(db.ident("items"))) == 2050
    assert _reltuples(db) == 2000  # not analyzed
    assert "analyze" not in summary.seconds
    assert any("left to autovacuum" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_large_in_place_batch_is_analyzed(analyzed_items, connect, tmp_path, mode):
    db = analyzed_items
    path = write_csv(tmp_path / "a.csv", [(r[0] + 10_000, *r[1:]) for r in rows(400, seed=2)])
    summary = runner.load(connect, db.table("items"), str(path), mode=mode, strategy="in_place")
    assert summary.rows == 400
    assert _reltuples(db) == 2400  # analyzed after the commit
    assert "analyze" in summary.seconds


def test_analyze_false_never_analyzes(analyzed_items, connect, tmp_path):
    db = analyzed_items
    path = write_csv(tmp_path / "a.csv", [(r[0] + 10_000, *r[1:]) for r in rows(400, seed=2)])
    runner.load(
        connect, db.table("items"), str(path), mode="append", strategy="in_place", analyze=False
    )
    assert _reltuples(db) == 2000
