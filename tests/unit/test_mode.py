"""The choice types of ``plan.codes`` (the mode, ``Mode``, and the others made types the same
way): their members are the declared choices, and their properties answer what each choice
does (what the string comparisons asked before); no module compares a choice with a string
again."""

import ast
import enum
from pathlib import Path

import pytest

import airflow_pg_bulk
from airflow_pg_bulk import options
from airflow_pg_bulk.plan import CopyOptions, ErrorPolicy, LoadRequest, Mode
from airflow_pg_bulk.plan.codes import (
    CopyFormat,
    OnDuplicateKey,
    OnError,
    RowStrategy,
    SequenceKind,
)
from airflow_pg_bulk.plan.definition import OwnedSequence
from airflow_pg_bulk.plan.load_plan import UpsertSpec
from airflow_pg_bulk.plan.plain import PlainData

ROOT = Path(airflow_pg_bulk.__file__).parent
#: where the choices are spelled as text: their types and the option declarations
SPELLED = {ROOT / "plan" / "codes.py", ROOT / "options.py"}


def test_members_are_the_declared_modes_in_order():
    assert tuple(Mode) == options.MODES
    assert tuple(options.MODE_HELP) == options.MODES
    assert tuple(RowStrategy) == options.STRATEGIES
    assert tuple(CopyFormat) == options.FORMATS == options.BY_NAME["format"].choices
    assert tuple(OnError) == options.ON_ERROR == options.BY_NAME["on_error"].choices
    assert tuple(OnDuplicateKey) == options.ON_DUPLICATE_KEY


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


def _holds_and_travels_as_text(obj: PlainData, field: str, member: enum.StrEnum) -> None:
    """``obj`` holds ``member`` in ``field``; its dict (what XCom carries) holds the plain
    text, and reads back as ``obj``."""
    assert getattr(obj, field) is member
    data = obj.to_dict()
    assert type(data[field]) is str and data[field] == member.value
    assert type(obj).from_dict(data) == obj


def test_a_request_and_a_plan_hold_the_type_and_travel_as_text():
    request = LoadRequest(table="t", source=("/x.csv",), mode="upsert")
    _holds_and_travels_as_text(request, "mode", Mode.UPSERT)


def test_a_captured_sequence_holds_its_kind_and_travels_as_text():
    seq = OwnedSequence("public", "t_id_seq", "id", "identity")
    _holds_and_travels_as_text(seq, "kind", SequenceKind.IDENTITY)
    assert seq.kind.of_identity_column and not seq.kind.owned_by_column
    assert SequenceKind.SERIAL.owned_by_column and not SequenceKind.SERIAL.of_identity_column
    with pytest.raises(ValueError, match="'other' is not a valid SequenceKind"):
        OwnedSequence("public", "t_id_seq", "id", "other")


def test_copy_options_hold_the_format_and_travel_as_text():
    assert {f for f in CopyFormat if f.delimited} == {"csv", "text"}
    assert {f for f in CopyFormat if f.is_csv} == {"csv"}
    assert {f for f in CopyFormat if f.names_types} == {"parquet"}
    copy = CopyOptions(format="text")
    _holds_and_travels_as_text(copy, "format", CopyFormat.TEXT)
    assert copy.effective_delimiter == "\t"
    with pytest.raises(ValueError, match=r"format must be one of \('csv', 'text', 'parquet'\)"):
        CopyOptions(format="json")
    with pytest.raises(ValueError, match="quote and escape apply to format='csv' only"):
        CopyOptions(format="text", quote="'")
    with pytest.raises(ValueError, match="apply to csv and text"):
        CopyOptions(format="parquet", quote="'")


def test_an_error_policy_holds_on_error_and_travels_as_text():
    assert {e for e in OnError if e.rejects} == {"reject"}
    policy = ErrorPolicy(on_error="reject", max_rejects=3)
    _holds_and_travels_as_text(policy, "on_error", OnError.REJECT)
    assert policy.rejecting
    assert not ErrorPolicy().rejecting and ErrorPolicy().on_error is OnError.FAIL
    with pytest.raises(ValueError, match=r"on_error must be one of \('fail', 'reject'\)"):
        ErrorPolicy(on_error="skip")
    with pytest.raises(ValueError, match="max_rejects needs on_error='reject'"):
        ErrorPolicy(max_rejects=1)


def test_an_upsert_holds_on_duplicate_key_and_travels_as_text():
    assert {d for d in OnDuplicateKey if d.latest_wins} == {"last"}
    assert {d for d in OnDuplicateKey if d.refuses_duplicates} == {"fail"}
    request = LoadRequest(table="t", source=("/x.csv",), mode="upsert", on_duplicate_key="fail")
    _holds_and_travels_as_text(request, "on_duplicate_key", OnDuplicateKey.FAIL)
    _holds_and_travels_as_text(
        UpsertSpec(("id",), "t_pkey", "fail"), "on_duplicate_key", OnDuplicateKey.FAIL
    )
    assert UpsertSpec(("id",), "t_pkey").on_duplicate_key is OnDuplicateKey.LAST
    with pytest.raises(ValueError, match=r"on_duplicate_key must be one of \('last', 'fail'\)"):
        LoadRequest(table="t", source=("/x.csv",), mode="upsert", on_duplicate_key="first")
    with pytest.raises(ValueError, match="key and on_duplicate_key apply to mode='upsert' only"):
        LoadRequest(table="t", source=("/x.csv",), mode="append", on_duplicate_key="fail")


def _literals(node: ast.expr, names: tuple[str, ...]) -> list[str]:
    """The names of ``names`` written as string literals in ``node``, alone or in a tuple, list
    or set (``mode == "append"``, ``mode in ("replace", "upsert")``)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [
        i.value
        for i in items
        if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in names
    ]


@pytest.mark.parametrize(
    ("what", "names"),
    [
        ("mode", options.MODES),
        ("strategy", options.STRATEGIES),
        ("sequence kind", tuple(SequenceKind)),
        ("format", options.FORMATS),
        ("on_error", options.ON_ERROR),
        ("on_duplicate_key", options.ON_DUPLICATE_KEY),
    ],
)
def test_no_module_compares_a_choice_with_a_string(what, names):
    """A comparison (or ``match`` case) with a choice's name literal (a mode, a strategy, a
    captured sequence's kind, a COPY format, on_error, on_duplicate_key) outside plan/codes.py
    and options.py asks a question that a property of its type (:class:`Mode`,
    :class:`RowStrategy`, :class:`SequenceKind`, :class:`CopyFormat`, :class:`OnError`,
    :class:`OnDuplicateKey`), or its member, should answer: add the property there."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path in SPELLED:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                said = [
                    n for side in (node.left, *node.comparators) for n in _literals(side, names)
                ]
            elif isinstance(node, ast.MatchValue):
                said = _literals(node.value, names)
            else:
                continue
            if said:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {', '.join(said)}")
    assert not found, f"{what} compared with a string (use its type's property):\n" + "\n".join(
        found
    )
