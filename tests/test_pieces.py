"""The load's pieces table: what each COPY task under Airflow reads its partition's pieces from.

Prepare (``store_pieces=True``, as the prepare task runs it) writes every partition's pieces
into ``_pgbulk_<load id>_pieces`` in the transaction that makes the ledger; a COPY task holding
the plan without pieces (the few KB that travel through XCom) reads its own by partition
number: the same pieces on every retry, another load's never, and none once cleanup ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Database
from helpers import create_items, leftovers, plain_copy_checksum, write_parts

from airflow_pg_bulk import naming, steps
from airflow_pg_bulk.errors import IncompleteLoadError, LoadRefusedError
from airflow_pg_bulk.plan import LoadPlan, request_from_options

PARTITIONS = 3


@pytest.fixture
def conn(connect: Any) -> Any:
    c = connect()
    yield c
    c.close()


def _prepare(conn: Any, db: Database, source: str, load_id: str, **kw: Any) -> LoadPlan:
    request = request_from_options(
        db.table("items"), source, mode="append", partitions=PARTITIONS, **kw
    )
    return steps.prepare(conn, request, load_id, store_pieces=True)


def _shared(plan: LoadPlan) -> LoadPlan:
    """The plan as a COPY task gets it through XCom: without pieces."""
    return LoadPlan.from_dict(plan.shared().to_dict())


def test_each_copy_task_reads_its_own_pieces_and_a_retry_the_same(db, conn, tmp_path):
    create_items(db)
    whole = write_parts(tmp_path, "items", 7, 40)
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    load_id = naming.new_load_id()
    plan = _prepare(conn, db, str(tmp_path / "items-*.csv"), load_id)
    assert all(len(p.pieces) >= 2 for p in plan.partitions)
    shared = _shared(plan)
    assert all(p.pieces == () for p in shared.partitions)

    for part in plan.partitions:
        (mine,) = steps.read_pieces(conn, shared, [part.index])
        assert mine == part
        assert steps.read_pieces(conn, shared, [part.index]) == [mine]  # a retry: the same
        steps.copy_partition(conn, shared.with_partitions([mine]), part.index)
    assert steps.read_pieces(conn, shared, [2, 0]) == [plan.partitions[2], plan.partitions[0]]
    everything = shared.with_partitions(steps.read_pieces(conn, shared, [0, 1, 2]))
    assert everything == plan  # finalize's plan: every piece, as prepare made it
    steps.complete_and_finalize(conn, everything)
    assert db.checksum("items") == expected

    steps.cleanup(conn, db.schema, load_id)
    assert leftovers(db) == []
    with pytest.raises(IncompleteLoadError, match="no pieces table"):
        steps.read_pieces(conn, shared, [0])


def test_prepare_run_again_keeps_the_pieces_and_changed_files_refuse_an_old_plan(
    db, conn, tmp_path
):
    create_items(db)
    write_parts(tmp_path, "items", 4, 30)
    (tmp_path / "items-é ✓.csv").write_text("9999,ünï,1.00,2024-01-01,\n", encoding="utf-8")
    load_id = naming.new_load_id()
    source = str(tmp_path / "items-*.csv")
    first = _prepare(conn, db, source, load_id)
    again = _prepare(conn, db, source, load_id)  # a cleared prepare, the same files
    assert again.digest == first.digest
    assert steps.read_pieces(conn, _shared(first), [0, 1, 2]) == list(first.partitions)
    assert any("é ✓" in p.path for part in first.partitions for p in part.pieces)

    write_parts(tmp_path, "items", 6, 30)  # two files more: another plan
    changed = _prepare(conn, db, source, load_id)
    assert changed.digest != first.digest
    with pytest.raises(LoadRefusedError, match="stored for another plan"):
        steps.read_pieces(conn, _shared(first), [1])
    assert steps.read_pieces(conn, _shared(changed), [0, 1, 2]) == list(changed.partitions)
    steps.cleanup(conn, db.schema, load_id)
    assert leftovers(db) == []


def test_overlapping_loads_into_one_table_keep_their_pieces_apart(db, conn, tmp_path):
    create_items(db)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_parts(tmp_path / name, "items", 3 if name == "a" else 5, 20)
    loads = {}
    for name in ("a", "b"):
        source = str(tmp_path / name / "items-*.csv")
        loads[name] = _prepare(conn, db, source, naming.new_load_id())
    for name, plan in loads.items():
        pieces = steps.read_pieces(conn, _shared(plan), [0, 1, 2])
        paths = {piece.path for part in pieces for piece in part.pieces}
        assert paths and all(Path(p).parent.name == name for p in paths)
    steps.cleanup(conn, db.schema, loads["a"].load_id)
    assert steps.read_pieces(conn, _shared(loads["b"]), [2]) == [loads["b"].partitions[2]]
    steps.cleanup(conn, db.schema, loads["b"].load_id)
    assert leftovers(db) == []


def test_in_one_process_no_pieces_table_is_made(db, conn, tmp_path):
    """The runner and the CLI keep the whole plan in memory."""
    create_items(db)
    write_parts(tmp_path, "items", 2, 10)
    request = request_from_options(db.table("items"), str(tmp_path / "items-*.csv"), mode="append")
    plan = steps.prepare(conn, request, naming.new_load_id())
    assert naming.pieces_table(plan.load_id) not in leftovers(db)
    assert plan.ledger_table in leftovers(db)
    steps.cleanup(conn, db.schema, plan.load_id)
