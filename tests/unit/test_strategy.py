"""strategy="auto": the cost model is a pure function of plain figures."""

from __future__ import annotations

import pytest

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import planning
from airflow_pg_bulk.plan.codes import RowStrategy
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
    assert _choose(mode=mode).strategy == "rebuild"
    assert _choose(mode=mode, indexes=0, foreign_keys=0).strategy == "rebuild"


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_the_break_even_ratio_decides(mode):
    at = int(BREAK_EVEN[mode] * 100 * MB)
    assert _choose(mode=mode, target_bytes=at).strategy == "rebuild"
    assert _choose(mode=mode, target_bytes=at + MB).strategy == "in_place"
    # one day onto five years: in place
    assert _choose(mode=mode, load_bytes=MB, target_bytes=5 * 365 * 2 * MB).strategy == "in_place"


def test_a_bare_target_with_rows_is_appended_in_place():
    assert _choose(target_bytes=MB, indexes=0, foreign_keys=0).strategy == "in_place"


def test_triggers_and_obstacles_keep_auto_in_place_and_say_why():
    assert _choose(triggers=True) == planning.StrategyChoice(
        RowStrategy.IN_PLACE,
        "the target has triggers, which an in-place load fires per row",
    )
    choice = _choose(obstacle="the role must own it")
    assert choice.strategy is RowStrategy.IN_PLACE and choice.rebuild_blocked
    assert "not possible (the role must own it)" in choice.why
    # a forced in-place load is not a blocked rebuild: nothing to warn about
    assert not _choose(requested="in_place", obstacle="the role must own it").rebuild_blocked


def test_explicit_choices():
    assert _choose(requested="in_place").strategy == "in_place"
    assert _choose(requested="rebuild", target_bytes=10**12).strategy == "rebuild"
    with pytest.raises(LoadRefusedError, match=r"strategy='rebuild' refused .*must own"):
        _choose(requested="rebuild", obstacle="the role must own it")


def test_the_model_reads_nothing_but_its_inputs():
    inputs = StrategyInputs("upsert", "auto", load_bytes=10, target_bytes=10)
    assert planning.choose_strategy(inputs) == planning.choose_strategy(inputs)


def test_the_strategy_is_one_value_in_the_request_and_the_plan():
    """The choice is made once, as an object: a request's string becomes the enum member, and a
    plan's survives its plain-data round trip (a member equals its code, so old plans read)."""
    from airflow_pg_bulk.plan.request import LoadRequest

    request = LoadRequest(table="t", source=("/x.csv",), mode="append", strategy="rebuild")
    assert request.strategy is RowStrategy.REBUILD and request.strategy.asked_for
    assert RowStrategy.AUTO.asked_for is False and RowStrategy("in_place").rebuilds is False
    with pytest.raises(ValueError, match="strategy must be one of"):
        LoadRequest(table="t", source=("/x.csv",), mode="append", strategy="fast")
    with pytest.raises(ValueError, match="applies to mode='append' and mode='upsert' only"):
        LoadRequest(table="t", source=("/x.csv",), mode="replace", strategy="in_place")
