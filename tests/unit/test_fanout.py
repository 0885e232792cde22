"""The sizing rule of finalize's index builds is a pure function of the server's settings."""

from __future__ import annotations

from airflow_pg_bulk.target import parallel_builds


def test_sizing_rule_stays_within_the_server():
    assert parallel_builds.size_builds(1, 8, 8) == parallel_builds.BuildSizing(builds=1, workers=7)
    assert parallel_builds.size_builds(4, 8, 8) == parallel_builds.BuildSizing(builds=2, workers=3)
    assert parallel_builds.size_builds(4, 16, 16) == parallel_builds.BuildSizing(
        builds=4, workers=3
    )
    assert parallel_builds.size_builds(4, 16, 2) == parallel_builds.BuildSizing(builds=1, workers=1)
    assert parallel_builds.size_builds(0, 8, 8) == parallel_builds.BuildSizing(builds=1, workers=7)
    assert parallel_builds.size_builds(3, 0, 8) == parallel_builds.BuildSizing(builds=1, workers=0)
    # the user's override, never above what the server allows
    assert parallel_builds.size_builds(1, 8, 8, index_workers=2).workers == 2
    assert parallel_builds.size_builds(1, 8, 4, index_workers=64).workers == 4
    assert parallel_builds.size_builds(2, 8, 8, index_workers=0).workers == 0
