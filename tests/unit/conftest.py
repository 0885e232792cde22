"""The unit layer: pure functions only, no PostgreSQL, no Airflow processes, no files but tmp.

A unit test that asks for a server fixture fails at once instead of starting one."""

from __future__ import annotations

import pytest


def _no_server() -> None:
    pytest.fail("tests/unit must not use a server: move the test to tests/")


@pytest.fixture
def pg_dsn() -> None:
    _no_server()


@pytest.fixture
def own_server() -> None:
    _no_server()
