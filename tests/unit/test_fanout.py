"""The sizing rule of finalize's index builds is a pure function of the server's settings."""

from __future__ import annotations

from airflow_pg_bulk.target import parallel_builds, rebuild
from airflow_pg_bulk.target.parallel_builds import (
    BuildSizing,
    ParallelLimits,
    builds_at_once,
    size_builds,
)


def test_each_build_gets_the_servers_max_parallel_maintenance_workers():
    # the server's defaults (8, 8, 2): two builds at once, 2 workers each (3 processes each)
    assert size_builds(4, 8, 8, 2) == BuildSizing(builds=2, workers=2)
    assert size_builds(1, 8, 8, 2) == BuildSizing(builds=1, workers=2)
    assert size_builds(0, 8, 8, 2) == BuildSizing(builds=1, workers=2)
    # a server configured for 16 cores
    assert size_builds(4, 16, 16, 4) == BuildSizing(builds=4, workers=3)
    assert size_builds(1, 16, 16, 8) == BuildSizing(builds=1, workers=8)
    # a DBA who turned parallel builds off
    assert size_builds(3, 8, 8, 0) == BuildSizing(builds=2, workers=0)


def test_never_more_processes_at_once_than_the_pool():
    # the leaders count: builds * (workers + 1) <= pool
    assert size_builds(4, 16, 2, 2) == BuildSizing(builds=1, workers=1)
    assert size_builds(3, 0, 8, 2) == BuildSizing(builds=1, workers=0)
    assert size_builds(1, 8, 8, 8) == BuildSizing(builds=1, workers=7)
    for pool in (0, 1, 2, 4, 8, 16, 64):
        for indexes in (0, 1, 3, 8):
            for alongside in (1, 2, 3, 8, 16):
                for index_workers in (None, 0, 2, 64):
                    s = size_builds(indexes, pool, pool, 8, index_workers, alongside)
                    assert s.builds >= 1 and s.workers >= 0
                    if pool >= s.builds * alongside:
                        assert s.builds * alongside * (s.workers + 1) <= pool


def test_partitions_built_side_by_side_share_the_pool():
    # 2 partitions built at once on the defaults: one index build each, 2 workers each
    assert size_builds(1, 8, 8, 2, alongside=2) == BuildSizing(builds=1, workers=2)
    # 4 at once: 8 // 4 - 1 = 1 worker each; 8 at once: none
    assert size_builds(1, 8, 8, 2, alongside=4) == BuildSizing(builds=1, workers=1)
    assert size_builds(2, 8, 8, 2, alongside=8) == BuildSizing(builds=1, workers=0)
    # two tables at once with two indexes each, on 16: one build at a time per table
    assert size_builds(2, 16, 16, 4, alongside=2) == BuildSizing(builds=2, workers=3)


def test_the_users_choice_raises_or_lowers_the_servers_within_the_pool():
    assert size_builds(1, 8, 8, 2, index_workers=4).workers == 4
    assert size_builds(1, 8, 8, 2, index_workers=0).workers == 0
    assert size_builds(1, 8, 4, 2, index_workers=64).workers == 3
    assert size_builds(2, 8, 8, 2, index_workers=0).workers == 0
    assert size_builds(1, 8, 8, 2, index_workers=6, alongside=2).workers == 3


def test_the_reason_names_the_setting_and_the_cut():
    plain = size_builds(1, 8, 8, 2, alongside=2)
    assert "max_parallel_maintenance_workers 2" in plain.why
    assert "pool of 8" in plain.why
    cut = size_builds(1, 8, 8, 2, index_workers=6, alongside=2)
    assert "index_workers 6" in cut.why and "cut to 3" in cut.why
    assert parallel_builds.BuildSizing(1, 2, why="a") == parallel_builds.BuildSizing(1, 2, why="b")


def test_one_pool_rule_sizes_the_index_builds_and_the_split_rebuild():
    """The index builds at once and the sessions of an upsert rebuild's split copy follow one
    rule: one per 4 of the pool, shared by the tables built at once, at least 1."""
    assert [builds_at_once(pool) for pool in (0, 3, 4, 8, 16, 17)] == [1, 1, 1, 2, 4, 4]
    assert builds_at_once(16, alongside=2) == 2 and builds_at_once(16, alongside=8) == 1
    for pool in range(40):
        assert size_builds(99, pool, pool, 2).builds == builds_at_once(pool)
        assert rebuild.split_sessions(pool, 1000, 1, 0) == builds_at_once(pool)
        limits = ParallelLimits(pool, pool + 1, 2)
        assert limits.pool == pool and limits.sizing(99, None) == size_builds(99, pool, pool, 2)
