"""airflow_pg_bulk.plan.planning and the plan's round trip through plain data (no server)."""

from __future__ import annotations

import json

import pytest

from airflow_pg_bulk import naming
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import CopyOptions, ErrorPolicy, LoadPlan, TargetDefinition, planning
from airflow_pg_bulk.plan.codes import ConstraintKind, Persistence, TriggerState

from .factories import LOAD_ID, partitions, plan, request, target


def test_the_plan_round_trips_through_json() -> None:
    p = plan()
    data = json.loads(json.dumps(p.to_dict()))
    again = LoadPlan.from_dict(data)
    assert again == p
    assert again.target.constraints[0].kind == ConstraintKind.PRIMARY_KEY
    assert again.target.triggers[0].enabled == TriggerState.REPLICA
    assert TargetDefinition.from_dict(p.target.to_dict()).fingerprint() == p.target.fingerprint()


@pytest.mark.parametrize("change", ["missing", "unknown"])
def test_a_plan_of_another_version_is_refused_saying_how_to_plan_again(change) -> None:
    """A plan in XCom made before an upgrade (a field it lacks, or one this version dropped):
    the error names the fields and tells the user to clear prepare, not a bare TypeError."""
    data = json.loads(json.dumps(plan().to_dict()))
    if change == "missing":  # e.g. Partitioning.strategy, new in this version
        del data["load_id"]
        del data["target"]["oid"]
    else:
        data["shape_of_the_future"] = 1
    with pytest.raises(ValueError) as raised:
        LoadPlan.from_dict(data)
    said = str(raised.value)
    assert "another version of airflow-pg-bulk" in said and "Clear the load's prepare" in said
    if change == "missing":
        assert "missing fields ['load_id']" in said
    else:
        assert "unknown fields ['shape_of_the_future']" in said


def test_the_plan_names_its_tables_from_the_load_id() -> None:
    p = plan()
    assert (p.staging_table, p.ledger_table) == (
        naming.staging_table(LOAD_ID),
        naming.ledger_table(LOAD_ID),
    )
    assert p.columns == ("id", "meter", "value")  # the generated column is not loadable
    assert p.staging_logged and p.reject_table is None
    assert [part.index for part in p.partitions] == [0, 1]


def test_a_bad_load_id_is_refused() -> None:
    req, t = request(), target()
    with pytest.raises(ValueError, match="load id"):
        planning.build_plan(req, t, "nope", columns=(), partitions=(), source_bytes=0)


def test_an_unlogged_target_is_replaced_by_an_unlogged_table() -> None:
    t = target(persistence=Persistence.UNLOGGED)
    assert not planning.staging_logged(request(), t)
    assert not planning.staging_logged(request(mode="append"), target())
    assert planning.staging_logged(request(mode="append", staging_logged=True), t)


def test_columns_without_a_header() -> None:
    t = target()
    assert planning.plan_columns(request(columns=("meter", "id")), t) == ("meter", "id")
    with pytest.raises(LoadRefusedError, match=r"\['total'\] are not loadable columns"):
        planning.plan_columns(request(columns=("id", "total")), t)


def test_columns_from_a_header() -> None:
    req = request(copy=CopyOptions(header=True))
    assert planning.plan_columns(req, target(), ["value", "id"]) == ("value", "id")
    assert planning.plan_columns(req, target(), []) == ("id", "meter", "value")


def test_the_reject_table() -> None:
    rejecting = ErrorPolicy(on_error="reject", max_rejects=5)
    assert planning.reject_table(request(errors=rejecting), "s") == ("s", "pgbulk_rejects")
    named = ErrorPolicy(on_error="reject", reject_table='"a.b".rej')
    assert planning.reject_table(request(errors=named), "s") == ("a.b", "rej")
    built = planning.build_plan(
        request(errors=rejecting), target(), LOAD_ID, columns=("id",),
        partitions=partitions(), source_bytes=1,
    )  # fmt: skip
    assert LoadPlan.from_dict(built.to_dict()).reject_table == ("public", "pgbulk_rejects")


def test_temporary_names_map_back_to_the_originals() -> None:
    p = plan()
    indexes, constraints = naming.temp_names(p)
    text = f"{indexes['readings_meter_idx']} on {p.staging_table} ({constraints['readings_pkey']})"
    assert naming.original_names(p, text) == "readings_meter_idx on readings (readings_pkey)"


@pytest.mark.parametrize(
    ("what", "index", "expected"),
    [
        ("copy", 2, f"pgbulk:{LOAD_ID}:copy[2]"),
        ("dag.load.finalize", -1, f"pgbulk:{LOAD_ID}:dag.load.finalize"),
        ("dag.t", None, f"pgbulk:{LOAD_ID}:dag.t"),
        ("dägé\n", 0, f"pgbulk:{LOAD_ID}:d?g??[0]"),
    ],
)
def test_application_name(what, index, expected):
    assert naming.application_name(LOAD_ID, what, index) == expected


def test_a_long_application_name_loses_its_middle_not_the_load_id_or_index():
    name = naming.application_name(LOAD_ID, "d" * 50 + "." + "t" * 50, 12)
    assert len(name.encode()) == 63
    assert name.startswith(f"pgbulk:{LOAD_ID}:ddd") and name.endswith("ttt[12]")
    assert ".." in name
