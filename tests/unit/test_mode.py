"""The mode type (``plan.codes.Mode``): its members are the declared modes, and its properties
answer what each mode does (what the string comparisons asked before)."""

from airflow_pg_bulk import options
from airflow_pg_bulk.plan import LoadRequest, Mode


def test_members_are_the_declared_modes_in_order():
    assert tuple(Mode) == options.MODES
    assert tuple(options.MODE_HELP) == options.MODES


def test_properties():
    swaps = {m for m in Mode if m.swaps_table}
    assert swaps == {"replace", "replace_partitions"}
    assert {m for m in Mode if m.takes_strategy} == {"append", "upsert"}
    assert {m for m in Mode if m.keyed} == {"upsert"}
    assert {m for m in Mode if m.ordered_by_run} == {"replace", "replace_partitions", "upsert"}
    assert {m for m in Mode if m.whole_target} == {"replace"}
    assert {m for m in Mode if m.copies_into_new_table("rebuild")} == swaps | {"append"}
    assert {m for m in Mode if m.copies_into_new_table("in_place")} == swaps


def test_a_request_and_a_plan_hold_the_type_and_travel_as_text():
    request = LoadRequest(table="t", source=("/x.csv",), mode="upsert")
    assert request.mode is Mode.UPSERT
    data = request.to_dict()
    assert type(data["mode"]) is str and data["mode"] == "upsert"
    assert LoadRequest.from_dict(data) == request
