"""The shared plan (every partition's pieces left out) does not grow with the number of files.

Prepare pushes the shared plan under the XCom key ``plan``, stores each partition's pieces in
the load's pieces table and returns the partition numbers, which the COPY tasks are mapped
over; each COPY task reads the shared plan and its own pieces. What the COPY tasks really pull
under Airflow is measured in tests/test_xcom_sizes.py (``dag.test()``); here, the pure part,
on plans of 1,000 and 10,000 small files in 256 partitions made by the same pure function
prepare uses, and a COPY task given a whole partition by hand (Airflow's context mocked).
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_pg_bulk.operators.pg_bulk import PgBulkCopyOperator
from airflow_pg_bulk.plan import LoadPlan, Partition, Piece, planning

from .factories import LOAD_ID, request, target

PARTITIONS = 256


def _plan(files: int) -> LoadPlan:
    """A plan of ``files`` small files (whole files, as prepare cuts them) in 256 partitions."""
    groups: list[list[Piece]] = [[] for _ in range(PARTITIONS)]
    for n in range(files):
        size = 1000 + n % 7
        groups[n % PARTITIONS].append(Piece(f"/data/day-{n:06d}.csv", 0, size, 1))
    parts = [
        Partition(i, tuple(pieces), sum(p.end for p in pieces)) for i, pieces in enumerate(groups)
    ]
    req = request()
    return planning.build_plan(
        req,
        target(),
        LOAD_ID,
        columns=planning.plan_columns(req, target()),
        partitions=parts,
        source_bytes=sum(p.bytes for p in parts),
    )


def _size(value: Any) -> int:
    return len(json.dumps(value))


@pytest.mark.parametrize("files", [1_000, 10_000])
def test_a_copy_task_given_its_whole_partition_pulls_only_the_shared_plan(files):
    plan = _plan(files)
    shared = plan.shared().to_dict()
    returned = [p.to_dict() for p in plan.partitions]
    pulled: list[tuple[str, int]] = []

    def xcom_pull(key: str = "return_value", **_: Any) -> Any:
        value = shared if key == "plan" else returned
        pulled.append((key, _size(value)))
        return value

    copied: list[Partition] = []
    operator = PgBulkCopyOperator(
        task_id="copy", prepare_task_id="prepare", partition=returned[7]
    )  # the 8th partition, given whole (wired by hand): nothing to read from the database
    operator._copy = lambda plan, index, session: copied.append(plan.partition(index)) or {}
    # no server here: the task's one session (hook.session) opens nothing; _copy is recorded
    operator.__dict__["hook"] = SimpleNamespace(session=lambda name: nullcontext())
    prepare = SimpleNamespace(is_mapped=False, get_closest_mapped_task_group=lambda: None)
    context = {
        "ti": SimpleNamespace(dag_id="d", task_id="copy", map_index=7, xcom_pull=xcom_pull),
        "dag": SimpleNamespace(dag_id="d", get_task=lambda _: prepare),
        "run_id": "r",
    }

    operator.execute(context)

    assert copied == [plan.partitions[7]]  # its pieces, all of them
    assert [key for key, _ in pulled] == ["plan"]
    read = pulled[0][1] + _size(returned[7])
    print(f"{files} files: a COPY task reads {read} bytes (shared {pulled[0][1]})")
    assert pulled[0][1] < 64_000  # 256 partitions' (index, bytes), the target, the options
    assert read < pulled[0][1] + 2 * _size(returned[7])


def test_the_shared_plan_is_the_same_size_whatever_the_number_of_files():
    small, big = _plan(1_000), _plan(10_000)
    assert _size(big.to_dict()) > 5 * _size(small.to_dict())  # the whole plan grows
    assert abs(_size(big.shared().to_dict()) - _size(small.shared().to_dict())) < 2_000


def test_the_shared_plan_and_a_partition_make_the_whole_plan_for_that_partition():
    plan = _plan(1_000)
    part = plan.partitions[3]
    rebuilt = LoadPlan.from_dict(plan.shared().to_dict()).with_partitions([part])
    assert rebuilt.partition(3) == part
    assert rebuilt.digest == plan.digest == planning.plan_digest(plan)
    assert len(rebuilt.partitions) == PARTITIONS


def test_the_pieces_table_statements_quote_the_json_text():
    from airflow_pg_bulk import sql

    part = _plan(3).partitions[0]
    text = json.dumps([p.to_dict() for p in part.pieces] + [{"path": "it's \u00e9"}])
    insert = sql.insert_pieces("s", "_pgbulk_x_pieces", [(0, text)]).as_string(None)
    assert insert.startswith('INSERT INTO "s"."_pgbulk_x_pieces" (partition, pieces) VALUES (0, ')
    assert "it''s \\\\u00e9" in insert  # one Literal: quotes doubled, the escape kept as text
    select = sql.select_pieces("s", "_pgbulk_x_pieces", [3, 1]).as_string(None)
    assert "WHERE partition = ANY('{3,1}'::" in select
    assert select.endswith("::integer[]) ORDER BY partition")
