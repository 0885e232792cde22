"""The ranges a database source split by a column is read in (pure: no server)."""

from __future__ import annotations

import datetime

import pytest

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan.planning import quantile_ranges


def test_dates_and_timestamps_by_day_and_microsecond() -> None:
    days = quantile_ranges("2026-01-01", ["2026-01-02", "2026-01-03"])
    assert days == [(None, "2026-01-02"), ("2026-01-02", "2026-01-03"), ("2026-01-03", None)]
    utc = datetime.UTC
    stamps = quantile_ranges(
        datetime.datetime(2026, 1, 1, tzinfo=utc), [datetime.datetime(2026, 1, 1, 12, tzinfo=utc)]
    )
    assert stamps == [(None, "2026-01-01T12:00:00+00:00"), ("2026-01-01T12:00:00+00:00", None)]
    naive = quantile_ranges("2026-01-01 00:00:00", ["2026-01-01 00:00:01.5"])
    assert naive == [(None, "2026-01-01T00:00:01.500000"), ("2026-01-01T00:00:01.500000", None)]


@pytest.mark.parametrize("value", [1.5, "abc", True])
def test_other_keys_are_refused(value: object) -> None:
    with pytest.raises(LoadRefusedError, match="not integers, dates or timestamps"):
        quantile_ranges(value, [value])


def test_quantile_ranges_start_at_each_cut_and_drop_repeated_ones() -> None:
    assert quantile_ranges(1, [10, 20, 30]) == [(None, 10), (10, 20), (20, 30), (30, None)]
    # a value holding several quantiles, or the min itself: fewer ranges, none empty
    assert quantile_ranges(1, [1, 5, 5, 9]) == [(None, 5), (5, 9), (9, None)]
    assert quantile_ranges(None, []) == [(None, None)]
    assert quantile_ranges(7, []) == [(None, None)]
    days = quantile_ranges(datetime.date(2026, 1, 1), [datetime.date(2026, 1, 5)])
    assert days == [(None, "2026-01-05"), ("2026-01-05", None)]
    # a histogram's bounds, as text
    stamps = quantile_ranges("2026-01-01 00:00:00+00", ["2026-01-01 06:00:00+00"])
    assert stamps == [(None, "2026-01-01T06:00:00+00:00"), ("2026-01-01T06:00:00+00:00", None)]
    with pytest.raises(LoadRefusedError, match="not integers, dates or timestamps"):
        quantile_ranges("1.5", ["2.5"])
