"""When an in-place load ANALYZEs the target (pure rule)."""

from airflow_pg_bulk.target.statistics import IN_PLACE_SHARE, worth_analyzing


def test_a_batch_of_a_tenth_or_more_is_analyzed():
    assert IN_PLACE_SHARE == 0.1
    assert worth_analyzing(100, 1000)
    assert worth_analyzing(5_475_000, 5_475_000)
    assert not worth_analyzing(99, 1000)
    assert not worth_analyzing(15_000, 27_375_000)  # a day onto five years


def test_an_empty_or_never_analyzed_target_is_analyzed_when_rows_came():
    assert worth_analyzing(1, 0)
    assert worth_analyzing(1, -1)  # reltuples -1: never vacuumed or analyzed (PostgreSQL 14+)
    assert not worth_analyzing(0, 0)
