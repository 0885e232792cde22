"""Staging partitioned like the target (issue 21): a load that brings enough rows for each of a
few leaves (``planning.choose_staging_layout``) is staged in a staging table partitioned like
the target, so that COPY routes each row once and finalize only detaches the staging
partitions that received rows (no second write). Every guarantee of the one-plain-table way
holds on this way too: each mode gives what plain SQL computes (both drivers), a row of no
partition names its file, line and value, a DEFAULT partition takes such rows, a failure at
each step of finalize leaves the target as it was and a retried finalize goes on, overlapping
runs into disjoint partitions all succeed, an error at COPY names the target, not staging;
cleanup drops everything. The tests of test_partitioned.py run here with the layout forced
(its thresholds set so that any load is staged partitioned); the plain way stays tested
there, with the thresholds as shipped (its tiny loads)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import test_partitioned as tp
from helpers import leftovers, write_csv
from psycopg import sql as psql

from airflow_pg_bulk import runner, sql, steps
from airflow_pg_bulk.db.driver import connect as connect_driver
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import (
    Column,
    ErrorPolicy,
    LoadRequest,
    Partitioning,
    StagingLayout,
    TargetDefinition,
    planning,
)
from airflow_pg_bulk.plan.codes import PartitionStrategy
from airflow_pg_bulk.target import partitioned

LAID_OUT = "partitioned like the target"


@pytest.fixture(autouse=True)
def by_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every load of a partitioned target here is staged partitioned like it."""
    monkeypatch.setattr(planning, "STAGED_BY_PARTITION_BYTES_PER_LEAF", 0)


def _staged_by_partition(caplog: pytest.LogCaptureFixture) -> bool:
    return any(LAID_OUT in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("way", ["in_place", "swap"])
@pytest.mark.parametrize("kind", list(tp.KINDS))
@pytest.mark.parametrize("mode", ["replace_partitions", "replace", "append"])
def test_each_mode_matches_plain_sql(db, pg_dsn, tmp_path, monkeypatch, caplog, kind, mode, way):
    with caplog.at_level(logging.INFO, logger="airflow_pg_bulk"):
        tp.test_each_mode_matches_plain_sql(db, pg_dsn, tmp_path, monkeypatch, kind, mode, way)
    assert _staged_by_partition(caplog)


@pytest.mark.usefixtures("swapping")
def test_psycopg2_replace_partitions_reruns_to_the_same_table(db, pg_dsn, tmp_path, caplog):
    tp.test_psycopg2_replace_partitions_reruns_to_the_same_table(db, pg_dsn, tmp_path, caplog)
    assert _staged_by_partition(caplog)


def test_a_row_in_no_partition_names_file_line_and_value(db, pg_dsn, tmp_path, caplog):
    """COPY puts it into staging's DEFAULT partition; route names it as the plain way does
    (with on_error="reject" the load is staged in one plain table: its CHECK sets it aside)."""
    with caplog.at_level(logging.INFO, logger="airflow_pg_bulk"):
        tp.test_a_row_in_no_partition_names_file_line_and_value(db, pg_dsn, tmp_path)
    assert _staged_by_partition(caplog)


def test_a_default_partition_takes_the_rows_no_other_takes(db, pg_dsn, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="airflow_pg_bulk"):
        tp.test_a_default_partition_takes_the_rows_no_other_takes(db, pg_dsn, tmp_path)
    assert _staged_by_partition(caplog)


STEPS = [
    ("replace_partitions", "detach_partition"),  # route: the staging partitions with rows
    ("replace_partitions", "add_constraint"),
    ("replace_partitions", "attach_partition"),
    ("replace_partitions", "mark_finalized"),
    ("replace", "truncate"),
    ("append", "insert_from_staging"),
    ("append", "attach_partition"),
]


@pytest.mark.parametrize(("mode", "step"), STEPS, ids=[f"{m}-{s}" for m, s in STEPS])
@pytest.mark.usefixtures("swapping")
def test_a_failure_at_each_step_leaves_the_target_and_finalize_retried_goes_on(
    db, pg_dsn, tmp_path, monkeypatch, mode, step
):
    tp._fail_then_retry(db, pg_dsn, tmp_path, monkeypatch, mode, step)


def test_a_failure_in_place_and_finalize_retried_goes_on(db, pg_dsn, tmp_path, monkeypatch):
    tp._fail_then_retry(db, pg_dsn, tmp_path, monkeypatch, "replace_partitions", "replace_by_key")


def _prepared_and_copied(db: Any, pg_dsn: str, path: Path, load_id: str) -> tuple[Any, Any]:
    """A replace_partitions of ``path`` into ``readings`` in two COPY streams, prepared and
    copied by the steps on one new connection, not finalized: (connection, plan)."""
    request = LoadRequest(
        mode="replace_partitions", table=db.table("readings"), source=(str(path),), partitions=2
    )
    conn = connect_driver(pg_dsn)
    plan = steps.prepare(conn, request, load_id)
    for part in plan.partitions:
        steps.copy_partition(conn, plan, part.index)
    return conn, plan


def test_a_load_in_place_reads_no_build_settings(db, pg_dsn, tmp_path, monkeypatch):
    """A partition loaded in place builds nothing: finalize neither reads the server's
    parallel limits nor sets maintenance_work_mem (each a round trip)."""
    path, expected = tp._start(db, "replace_partitions", tmp_path)
    conn, plan = _prepared_and_copied(db, pg_dsn, path, "c1b2c3d4e5f6")
    settings: list[str] = []
    real_set_config = sql.set_config

    def set_config(name: str, *args: Any, **kwargs: Any) -> Any:
        settings.append(name)
        return real_set_config(name, *args, **kwargs)

    def parallel_limits() -> Any:
        raise AssertionError("the parallel limits read for a load in place")

    monkeypatch.setattr(sql, "set_config", set_config)
    monkeypatch.setattr(sql, "parallel_limits", parallel_limits)
    steps.finalize(conn, plan)
    steps.cleanup(conn, db.schema, plan.load_id)
    conn.close()
    assert "maintenance_work_mem" not in settings
    assert "lock_timeout" in settings  # the recorder saw finalize's settings
    assert db.checksum("readings", ", ".join(tp.COLUMNS)) == expected


def test_a_copy_retried_after_its_commit_loads_nothing_twice(db, pg_dsn, tmp_path):
    tp.test_a_copy_retried_after_its_commit_loads_nothing_twice(db, pg_dsn, tmp_path)


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("way", ["in_place", "swap"])
def test_overlapping_loads_into_disjoint_partitions_all_succeed(
    db, pg_dsn, tmp_path, monkeypatch, way, order
):
    tp.test_overlapping_loads_into_disjoint_partitions_all_succeed(
        db, pg_dsn, tmp_path, monkeypatch, way, order
    )


def test_an_identity_column_not_loaded_is_numbered_from_the_targets_sequence(db, pg_dsn, tmp_path):
    """(Also: a NOT NULL broken at COPY names the target, not the staging partition.)"""
    tp.test_an_identity_column_not_loaded_is_numbered_from_the_targets_sequence(
        db, pg_dsn, tmp_path
    )


@pytest.mark.usefixtures("swapping")
def test_the_swap_waits_for_a_reader_at_most_lock_timeout(db, pg_dsn, tmp_path):
    tp.test_the_swap_waits_for_a_reader_at_most_lock_timeout(db, pg_dsn, tmp_path)


@pytest.mark.parametrize("way", ["in_place", "swap"])
def test_a_key_loaded_twice_fails_naming_the_partitions_key(
    db, pg_dsn, tmp_path, monkeypatch, caplog, way
):
    tp.test_a_key_loaded_twice_fails_naming_the_partitions_key_and_the_target_is_untouched(
        db, pg_dsn, tmp_path, monkeypatch, caplog, way
    )


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_prepare_makes_a_staging_partition_per_leaf_and_cleanup_drops_them(
    db, pg_dsn, tmp_path, driver
):
    """prepare: one staging partition per leaf and a DEFAULT one, with the layout in the plan
    (plain data, through to_dict and back); finalize detaches the two that received rows;
    cleanup drops the rest in its one transaction."""
    tp.setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", tp.loaded_rows(db, "range", "replace_partitions"))
    expected = tp.reference(db, "range", "replace_partitions", path)
    request = LoadRequest(
        mode="replace_partitions", table=db.table("readings"), source=(str(path),), partitions=2
    )
    conn = connect_driver(pg_dsn, driver)
    plan = steps.prepare(conn, request, "c1b2c3d4e5f6")
    assert plan.staging_layout.by_partition
    assert type(plan).from_dict(plan.to_dict()).staging_layout == plan.staging_layout
    children = psql.SQL(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = {}::regclass ORDER BY 1"
    ).format(psql.Literal(f'"{db.schema}"."{plan.staging_table}"'))
    staged = [row[0] for row in db.run(children)]
    assert staged == sorted(
        [f"_pgbulk_c1b2c3d4e5f6_r{n}" for n in range(4)] + ["_pgbulk_c1b2c3d4e5f6_none"]
    )
    for part in plan.partitions:
        steps.copy_partition(conn, plan, part.index)
    steps.finalize(conn, plan)
    assert db.checksum("readings", ", ".join(tp.COLUMNS)) == expected
    steps.cleanup(conn, db.schema, plan.load_id)
    conn.close()
    assert leftovers(db) == []


@pytest.mark.parametrize("way", ["in_place", "swap"])
def test_a_partition_detached_after_prepare_is_refused(db, pg_dsn, tmp_path, monkeypatch, way):
    """Staging was made with the bounds prepare read: a partition that receives rows and is
    detached (and another attached under its name with another bound) before finalize
    refuses the load, loaded in place or swapped; nothing else changed."""
    if way == "swap":
        monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
    tp.setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", tp.loaded_rows(db, "range", "replace_partitions"))
    conn, plan = _prepared_and_copied(db, pg_dsn, path, "d1b2c3d4e5f6")
    readings, p2 = db.ident("readings"), db.ident("readings_p2")
    db.run(psql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(readings, p2))
    db.run(psql.SQL("ALTER TABLE {} RENAME TO {}").format(p2, psql.Identifier("gone")))
    db.run(
        psql.SQL(
            "CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ('2024-03-01') TO ('2024-03-15')"
        ).format(p2, readings)
    )
    before = db.checksum("readings", ", ".join(tp.COLUMNS))
    with pytest.raises(LoadRefusedError, match=r"readings_p2 .* was detached or changed"):
        steps.finalize(conn, plan)
    assert db.checksum("readings", ", ".join(tp.COLUMNS)) == before
    steps.cleanup(conn, db.schema, plan.load_id)
    conn.close()
    assert leftovers(db) == []


def test_a_hash_target_without_every_remainder_names_the_row_no_partition_takes(
    db, pg_dsn, tmp_path
):
    """A hash-partitioned target has no DEFAULT partition (nor its staging): a row whose
    remainder has no partition fails its COPY, naming the target, the file and the line."""
    t = db.ident("hashed")
    db.run(
        psql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text) PARTITION BY HASH (id)").format(t)
    )
    db.run(
        psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS 2, REMAINDER 0)").format(
            db.ident("hashed_0"), t
        )
    )
    remainders = db.run(
        psql.SQL(
            "SELECT i, satisfies_hash_partition({}::regclass, 2, 0, i)"
            " FROM generate_series(1, 20) i"
        ).format(psql.Literal(f'"{db.schema}"."hashed"'))
    )
    taken = [i for i, ok in remainders if ok]
    stray = next(i for i, ok in remainders if not ok)
    path = write_csv(tmp_path / "load.csv", [*[(i, "x") for i in taken], (stray, "stray")])
    with pytest.raises(BadDataError) as failed:
        runner.load(pg_dsn, db.table("hashed"), str(path), mode="replace_partitions")
    message = str(failed.value)
    assert f"load.csv line {len(taken) + 1}" in message and "hashed" in message, message
    assert "_pgbulk_" not in message, message
    assert db.scalar(psql.SQL("SELECT count(*) FROM {}").format(t)) == 0
    assert leftovers(db) == []


# --- the choice, made once in the plan (pure) -------------------------------------------------

PARENT = TargetDefinition(
    "s",
    "t",
    1,
    "o",
    "p",
    (Column("day", "date", True),),
    partitioning=Partitioning("RANGE (day)", PartitionStrategy.RANGE),
)


def _choice(leaves: int, source_bytes: int, target: TargetDefinition = PARENT, **options: Any):
    request = LoadRequest(table="s.t", source=("f.csv",), **options)
    return planning.choose_staging_layout(request, target, leaves, source_bytes)


def test_the_layout_follows_the_leaves_and_the_bytes_per_leaf(monkeypatch):
    """A year into 12 monthly leaves (63 MB): partitioned like the target; a day's reload of a
    table of 1,826 daily leaves, or a few MB into 60 monthly leaves: one plain table; an
    upsert, a rejecting load, a plain target: never."""
    monkeypatch.setattr(planning, "STAGED_BY_PARTITION_BYTES_PER_LEAF", 1 << 20)
    year = _choice(12, 63_000_000, mode="replace_partitions")
    assert year.by_partition and "12 table partitions" in year.why
    assert not _choice(1826, 10**10, mode="replace_partitions").by_partition
    assert not _choice(60, 3_000_000, mode="replace_partitions").by_partition
    assert _choice(60, 200_000_000, mode="append").by_partition
    assert not _choice(12, 10**9, mode="upsert", key=("day",)).by_partition
    rejecting = ErrorPolicy(on_error="reject")
    assert not _choice(12, 10**9, mode="replace", errors=rejecting).by_partition
    plain = dataclasses.replace(PARENT, partitioning=None)
    assert _choice(0, 10**9, plain, mode="replace") == StagingLayout()


@pytest.fixture
def swapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
