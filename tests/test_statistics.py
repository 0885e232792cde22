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


def _analyzed(db, table: str) -> int:
    """How many times ANALYZE (not autovacuum's) ran on the table."""
    return db.scalar(
        "SELECT analyze_count FROM pg_stat_all_tables WHERE relid = %s::regclass",
        db.table(table),
    )


def _partitioned_items(db, leaf_rows: int) -> None:
    """``items`` partitioned by id into items_a (ids < 100,000) and items_b, ``leaf_rows``
    in each; each leaf ANALYZEd, the parent not (as autovacuum leaves a partitioned table)."""
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id integer PRIMARY KEY, name text NOT NULL,"
            " amount numeric(12,2) CHECK (amount >= 0), day date, note text)"
            " PARTITION BY RANGE (id)"
        ).format(db.ident("items"))
    )
    for leaf, low, high in (("items_a", 0, 100_000), ("items_b", 100_000, 200_000)):
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(leaf), db.ident("items"), low, high
            )
        )
        db.run(
            psql.SQL(
                "INSERT INTO {} (id, name, amount) SELECT g, 'n' || g, 1"
                " FROM generate_series({}, {}) g"
            ).format(db.ident("items"), low + 1, low + leaf_rows)
        )
        db.run(psql.SQL("ANALYZE {}").format(db.ident(leaf)))


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_small_batch_into_a_partitioned_target_is_not_analyzed(db, connect, tmp_path, mode):
    """The parent's own reltuples stays -1 (autovacuum never ANALYZEs a partitioned table):
    the estimate is its leaves' (20,000 rows), and 50 changed rows are not worth sampling
    every partition again (issue 21: 1.19 of 1.69 s of a 1,600-row upsert)."""
    _partitioned_items(db, 10_000)
    parent = db.scalar("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", db.table("items"))
    assert parent < 0
    path = write_csv(tmp_path / "a.csv", [(r[0] + 20_000, *r[1:]) for r in rows(50, seed=3)])
    summary = runner.load(connect, db.table("items"), str(path), mode=mode, strategy="in_place")
    assert summary.rows == 50
    assert db.scalar(psql.SQL("SELECT count(*) FROM {}").format(db.ident("items"))) == 20_050
    assert "analyze" not in summary.seconds
    assert (_analyzed(db, "items_a"), _analyzed(db, "items_b")) == (1, 1)


def test_large_batch_into_a_partitioned_target_is_analyzed(db, connect, tmp_path):
    _partitioned_items(db, 1_000)
    path = write_csv(tmp_path / "a.csv", [(r[0] + 2_000, *r[1:]) for r in rows(400, seed=4)])
    summary = runner.load(connect, db.table("items"), str(path), mode="upsert", strategy="in_place")
    assert summary.rows == 400
    assert "analyze" in summary.seconds  # 400 of about 2,000
    assert _analyzed(db, "items_a") == 2


def test_a_table_never_analyzed_is_counted_by_its_size(db, connect, tmp_path):
    """reltuples -1 (never vacuumed nor analyzed): its size says it holds many rows, so a
    small batch is left to autovacuum; an empty one is analyzed once rows came."""
    create_items(db)
    db.run(
        psql.SQL(
            "INSERT INTO {} (id, name, amount) SELECT g, 'n' || g, 1"
            " FROM generate_series(1, 20000) g"
        ).format(db.ident("items"))
    )
    assert _reltuples(db) < 0
    path = write_csv(tmp_path / "a.csv", [(r[0] + 30_000, *r[1:]) for r in rows(50, seed=5)])
    summary = runner.load(connect, db.table("items"), str(path), mode="append", strategy="in_place")
    assert "analyze" not in summary.seconds
    assert _analyzed(db, "items") == 0

    create_items(db, "empty")
    path = write_csv(tmp_path / "b.csv", rows(50, seed=6))
    summary = runner.load(connect, db.table("empty"), str(path), mode="append", strategy="in_place")
    assert "analyze" in summary.seconds
    assert _analyzed(db, "empty") == 1


def test_partitions_built_side_by_side_are_analyzed_in_their_build_once(db, connect, tmp_path):
    """A replace_partitions of two partitions of more than IN_PLACE_ROWS rows each: each new
    table is built beside its partition, side by side, and ANALYZEd there; finalize finds it
    analyzed and does not ANALYZE it again (no 'analyze' phase; one ANALYZE per partition)."""
    _partitioned_items(db, 100)
    data = [(i, f"n{i}", "1.00", "2024-01-01", None) for i in range(1, 12_001)]
    data += [(100_000 + i, f"n{i}", "1.00", "2024-01-01", None) for i in range(1, 12_001)]
    path = write_csv(tmp_path / "p.csv", data)
    summary = runner.load(
        connect, db.table("items"), str(path), mode="replace_partitions", partitions=2
    )
    assert summary.rows == 24_000
    assert summary.seconds.get("build_partitions", 0) > 0
    assert "analyze" not in summary.seconds
    for leaf in ("items_a", "items_b"):  # the new tables, swapped in under the old names
        assert _analyzed(db, leaf) == 1
        assert (
            db.scalar("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", db.table(leaf))
            == 12_000
        )
