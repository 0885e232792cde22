"""Test dependencies that are missing: skipped locally, a failure under ``CI=true`` (where a
drift of the test extra must not make the S3, Parquet and Celery tests vanish)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import require

MISSING = "pgbulk_no_such_module_e5c1"
TESTS = str(Path(__file__).resolve().parent)


def test_a_missing_dependency_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=f"cannot import {MISSING}.*CI=true"):
        require(MISSING, "needs something")


def test_a_missing_dependency_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"needs something: cannot import {MISSING}"):
        require(MISSING, "needs something")


def test_a_present_dependency_is_the_module(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require("json", "needs json").dumps([1]) == "[1]"


def test_a_test_module_whose_dependency_is_missing_fails_under_ci(tmp_path):
    """The whole chain as CI runs it: pytest exits non-zero, naming the dependency."""
    (tmp_path / "test_needs_it.py").write_text(
        f"from servers import require\n"
        f"require({MISSING!r}, 'needs the test extra')\n\n"
        "def test_something():\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, *sys.path])}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # (seconds of plugin imports otherwise)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    failed = subprocess.run(
        command, cwd=tmp_path, env={**env, "CI": "true"}, capture_output=True, text=True
    )
    assert failed.returncode not in (0, 5), failed.stdout
    assert "needs the test extra: cannot import" in failed.stdout
    assert "CI=true: failing instead of skipping" in failed.stdout
    env.pop("CI", None)
    skipped = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert skipped.returncode == 5, skipped.stdout  # nothing collected: the module skipped
