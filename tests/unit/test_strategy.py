"""strategy="auto": the cost model is a pure function of plain figures."""

from __future__ import annotations

import pytest

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import planning
from airflow_pg_bulk.plan.planning import BREAK_EVEN, StrategyInputs, choose_strategy

MB = 1 << 20


def _choose(**changes):
    data = dict(
        mode="append", requested="auto", load_bytes=100 * MB, target_bytes=0, indexes=1,
        foreign_keys=1,
    )  # fmt: skip
    data.update(changes)
    return choose_strategy(StrategyInputs(**data))


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_an_empty_target_is_rebuilt(mode):
    assert _choose(mode=mode)[0] == "rebuild"
    assert _choose(mode=mode, indexes=0, foreign_keys=0)[0] == "rebuild"


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_the_break_even_ratio_decides(mode):
    at = int(BREAK_EVEN[mode] * 100 * MB)
    assert _choose(mode=mode, target_bytes=at)[0] == "rebuild"
    assert _choose(mode=mode, target_bytes=at + MB)[0] == "in_place"
    # one day onto five years: in place
    assert _choose(mode=mode, load_bytes=MB, target_bytes=5 * 365 * 2 * MB)[0] == "in_place"


def test_a_bare_target_with_rows_is_appended_in_place():
    assert _choose(target_bytes=MB, indexes=0, foreign_keys=0)[0] == "in_place"


def test_triggers_and_obstacles_keep_auto_in_place_and_say_why():
    assert _choose(triggers=True) == (
        "in_place",
        "the target has triggers, which an in-place load fires per row",
    )
    choice, why = _choose(obstacle="the role must own it")
    assert choice == "in_place" and "not possible (the role must own it)" in why


def test_explicit_choices():
    assert _choose(requested="in_place")[0] == "in_place"
    assert _choose(requested="rebuild", target_bytes=10**12)[0] == "rebuild"
    with pytest.raises(LoadRefusedError, match=r"strategy='rebuild' refused .*must own"):
        _choose(requested="rebuild", obstacle="the role must own it")


def test_the_model_reads_nothing_but_its_inputs():
    inputs = StrategyInputs("upsert", "auto", load_bytes=10, target_bytes=10)
    assert planning.choose_strategy(inputs) == planning.choose_strategy(inputs)
