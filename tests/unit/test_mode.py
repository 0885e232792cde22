"""The mode type (``plan.codes.Mode``): its members are the declared modes, and its properties
answer what each mode does (what the string comparisons asked before); no module compares a
mode with a string again."""

import ast
from pathlib import Path

import airflow_pg_bulk
from airflow_pg_bulk import options
from airflow_pg_bulk.plan import LoadRequest, Mode

ROOT = Path(airflow_pg_bulk.__file__).parent
#: where the modes are spelled as text: the Mode type and the option declarations
SPELLED = {ROOT / "plan" / "codes.py", ROOT / "options.py"}


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
    assert {m for m in Mode if m.replaces_rows} == {"replace", "replace_partitions", "upsert"}
    assert {m for m in Mode if m.replaces_loaded_partitions} == {"replace_partitions"}
    assert {m for m in Mode if m.ordered_over_whole_target} == {"replace", "upsert"}
    assert {m for m in Mode if m.copies_into_new_table("rebuild")} == swaps | {"append"}
    assert {m for m in Mode if m.copies_into_new_table("in_place")} == swaps


def test_a_request_and_a_plan_hold_the_type_and_travel_as_text():
    request = LoadRequest(table="t", source=("/x.csv",), mode="upsert")
    assert request.mode is Mode.UPSERT
    data = request.to_dict()
    assert type(data["mode"]) is str and data["mode"] == "upsert"
    assert LoadRequest.from_dict(data) == request


def _mode_literals(node: ast.expr) -> list[str]:
    """The mode names written as string literals in ``node``, alone or in a tuple, list or set
    (``mode == "append"``, ``mode in ("replace", "upsert")``)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [
        i.value
        for i in items
        if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in options.MODES
    ]


def test_no_module_compares_a_mode_with_a_string():
    """A comparison (or ``match`` case) with a mode name literal outside plan/codes.py and
    options.py asks the mode a question that a :class:`Mode` property (or its member) should
    answer: add the property there."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path in SPELLED:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                names = [n for side in (node.left, *node.comparators) for n in _mode_literals(side)]
            elif isinstance(node, ast.MatchValue):
                names = _mode_literals(node.value)
            else:
                continue
            if names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {', '.join(names)}")
    assert not found, "mode compared with a string (use a Mode property):\n" + "\n".join(found)
