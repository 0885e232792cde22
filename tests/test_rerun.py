"""Running steps of one load again, as clearing tasks in Airflow's UI does, converges.

Clearing a task of the group re-runs it with its setup (prepare) and teardown (cleanup); the
COPY tasks re-run only when they are cleared too. These tests play each such sequence with
the steps themselves against the real server: a prepare run again keeps a ledger made for
the same plan (and the partitions committed in it), finalize loads the partitions a cleared
run lacks, an append finalized before is never appended twice, and a replace never
overwrites the rows of a load of a later run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Database
from helpers import create_items, leftovers, plain_copy_checksum, rows, write_csv
from psycopg import sql

from airflow_pg_bulk import naming, steps
from airflow_pg_bulk.errors import AlreadyLoadedError, LoadRefusedError, OlderRunError
from airflow_pg_bulk.plan import LoadPlan, RunOrder, request_from_options

PARTITIONS = 3


@pytest.fixture
def conn(connect: Any) -> Any:
    c = connect()
    yield c
    c.close()


def _request(db: Database, path: Path, mode: str) -> Any:
    return request_from_options(db.table("items"), str(path), mode=mode, partitions=PARTITIONS)


def _ledger(db: Database, plan: LoadPlan) -> list[int]:
    return [
        r[0]
        for r in db.run(
            sql.SQL("SELECT partition FROM {} ORDER BY 1").format(db.ident(plan.ledger_table))
        )
    ]


def _copy_all(conn: Any, plan: LoadPlan) -> None:
    for part in plan.partitions:
        steps.copy_partition(conn, plan, part.index)


def _whole_run(conn: Any, db: Database, path: Path, mode: str, load_id: str, **kw: Any) -> Any:
    plan = steps.prepare(conn, _request(db, path, mode), load_id, **kw)
    _copy_all(conn, plan)
    summary = steps.complete_and_finalize(conn, plan)
    steps.cleanup(conn, db.schema, load_id)
    return summary


def test_prepare_run_again_keeps_the_committed_partitions(db, conn, tmp_path):
    create_items(db)
    path = write_csv(tmp_path / "items.csv", rows(3000, seed=3))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    load_id = naming.new_load_id()
    plan = steps.prepare(conn, _request(db, path, "replace"), load_id)
    steps.copy_partition(conn, plan, 0)
    staged = db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident(plan.staging_table)))
    assert staged > 0

    again = steps.prepare(conn, _request(db, path, "replace"), load_id)  # prepare cleared

    assert again.partitions == plan.partitions
    assert _ledger(db, again) == [0]  # partition 0's commit survived
    assert (
        db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident(plan.staging_table))) == staged
    )
    assert steps.copy_partition(conn, again, 0).skipped  # exactly once
    for index in (1, 2):
        steps.copy_partition(conn, again, index)
    summary = steps.finalize(conn, again)
    steps.cleanup(conn, db.schema, load_id)
    assert summary.rows == 3000
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_prepare_for_changed_files_starts_over_and_an_old_copy_refuses(db, conn, tmp_path):
    create_items(db)
    path = write_csv(tmp_path / "items.csv", rows(3000, seed=4))
    load_id = naming.new_load_id()
    old = steps.prepare(conn, _request(db, path, "replace"), load_id)
    steps.copy_partition(conn, old, 0)
    path = write_csv(tmp_path / "items.csv", rows(4000, seed=5))  # the file changed
    expected = plain_copy_checksum(db, path, "FORMAT csv")

    new = steps.prepare(conn, _request(db, path, "replace"), load_id)

    assert _ledger(db, new) == []  # the old plan's partition is gone with its ledger
    with pytest.raises(LoadRefusedError, match="made for another plan"):
        steps.copy_partition(conn, old, 1)  # a COPY task still holding the old plan
    _copy_all(conn, new)
    with pytest.raises(LoadRefusedError, match="made for another plan"):
        steps.finalize(conn, old)
    assert steps.finalize(conn, new).rows == 4000
    steps.cleanup(conn, db.schema, load_id)
    assert db.checksum("items") == expected


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_clearing_finalize_of_a_failed_run_converges(db, conn, tmp_path, mode):
    """finalize failed, cleanup dropped staging; the user clears finalize: prepare and
    cleanup run again with it, the COPY tasks do not."""
    create_items(db)
    path = write_csv(tmp_path / "items.csv", rows(3000, seed=6))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    load_id = naming.new_load_id()
    plan = steps.prepare(conn, _request(db, path, mode), load_id)
    _copy_all(conn, plan)
    steps.cleanup(conn, db.schema, load_id)  # (finalize failed; the teardown ran)

    plan = steps.prepare(conn, _request(db, path, mode), load_id)  # cleared: setup again
    summary = steps.complete_and_finalize(conn, plan)
    steps.cleanup(conn, db.schema, load_id)

    assert summary.rows == 3000
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_clearing_a_finished_append_never_appends_twice(db, conn, tmp_path):
    create_items(db)
    path = write_csv(tmp_path / "items.csv", rows(2000, seed=7))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    load_id = naming.new_load_id()
    assert _whole_run(conn, db, path, "append", load_id).rows == 2000

    with pytest.raises(AlreadyLoadedError, match="appending them again would add them twice"):
        steps.prepare(conn, _request(db, path, "append"), load_id)
    steps.cleanup(conn, db.schema, load_id)

    assert db.checksum("items") == expected
    assert leftovers(db) == []
    assert db.run(
        sql.SQL("SELECT load_id, target, mode, rows FROM {}").format(db.ident("pgbulk_loads"))
    ) == [(load_id, db.table("items"), "append", 2000)]


def test_clearing_a_finished_replace_loads_the_files_again(db, conn, tmp_path):
    create_items(db)
    path = write_csv(tmp_path / "items.csv", rows(2000, seed=8))
    load_id = naming.new_load_id()
    _whole_run(conn, db, path, "replace", load_id)
    path = write_csv(tmp_path / "items.csv", rows(2500, seed=9))  # corrected files
    expected = plain_copy_checksum(db, path, "FORMAT csv")

    # the whole group cleared; then only finalize (with its setup and teardown) cleared
    assert _whole_run(conn, db, path, "replace", load_id).rows == 2500
    plan = steps.prepare(conn, _request(db, path, "replace"), load_id)
    assert steps.complete_and_finalize(conn, plan).rows == 2500
    steps.cleanup(conn, db.schema, load_id)

    assert db.checksum("items") == expected
    assert leftovers(db) == []


def _run(day: int) -> RunOrder:
    """A run of one daily DAG task: its data interval is the day."""
    start = f"2026-11-{day:02d}T00:00:00+00:00"
    return RunOrder("dag.load.prepare", f"scheduled__{start}", start, start)


def test_a_replace_never_overwrites_a_later_run(db, conn, tmp_path):
    create_items(db)
    newer = write_csv(tmp_path / "newer.csv", rows(1500, seed=10))
    older = write_csv(tmp_path / "older.csv", rows(1000, seed=11))
    expected = plain_copy_checksum(db, newer, "FORMAT csv")
    old_id, new_id = naming.new_load_id(), naming.new_load_id()
    # the older run prepared and copied first, then the newer run finished before it
    old_plan = steps.prepare(conn, _request(db, older, "replace"), old_id, run=_run(1))
    _copy_all(conn, old_plan)
    _whole_run(conn, db, newer, "replace", new_id, run=_run(2))

    with pytest.raises(OlderRunError, match=f"load {new_id} .*later run|later run.*{new_id}"):
        steps.finalize(conn, old_plan)
    steps.cleanup(conn, db.schema, old_id)

    assert db.checksum("items") == expected
    assert leftovers(db) == []
    # a run with a later data interval, or none (in-process), replaces as ever
    latest = write_csv(tmp_path / "latest.csv", rows(700, seed=12))
    _whole_run(conn, db, latest, "replace", naming.new_load_id(), run=_run(3))
    assert db.checksum("items") == plain_copy_checksum(db, latest, "FORMAT csv", name="ref2")
