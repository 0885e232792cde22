"""When an in-place load ANALYZEs the target (pure rule)."""

from airflow_pg_bulk.target.statistics import IN_PLACE_SHARE, UNKNOWN_ROW_BYTES, worth_analyzing


def test_a_batch_of_a_tenth_or_more_is_analyzed():
    assert IN_PLACE_SHARE == 0.1
    assert worth_analyzing(100, 1000)
    assert worth_analyzing(5_475_000, 5_475_000)
    assert not worth_analyzing(99, 1000)
    assert not worth_analyzing(15_000, 27_375_000)  # a day onto five years
    assert not worth_analyzing(1_600, 5_475_000)  # issue 21's small upsert


def test_an_empty_target_is_analyzed_when_rows_came():
    assert worth_analyzing(1, 0)
    assert not worth_analyzing(0, 0)


def test_a_table_never_counted_is_estimated_by_narrow_rows():
    # 1 GB of heap never analyzed counts as about 16.8 M rows: a day's batch is not worth it
    assert UNKNOWN_ROW_BYTES == 64
    assert not worth_analyzing(15_000, (1 << 30) // UNKNOWN_ROW_BYTES)
