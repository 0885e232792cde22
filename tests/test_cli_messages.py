"""The CLI's messages: a warning only where the user can act on it (quiet under ``-q``); reject
mode without ``--max-rejects`` refused, naming the reject table; the reject table named in the
summary; an unreachable S3 endpoint named with the source and ``AWS_ENDPOINT_URL``; a wrong
``--key`` exits 2 with a "did you mean"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import leftovers

CLI = [os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=300, env=env or os.environ.copy()
    )


def _csv(tmp_path: Path, text: str) -> str:
    path = tmp_path / "data.csv"
    path.write_text(text)
    return str(path)


def test_partitioned_append_warns_of_nothing_and_is_quiet_under_q(db, tmp_path):
    db.run(f"CREATE TABLE {db.schema}.t (day date, v integer) PARTITION BY RANGE (day)")
    db.run(
        f"CREATE TABLE {db.schema}.t_1 PARTITION OF {db.schema}.t"
        " FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')"
    )
    source = _csv(tmp_path, "2024-01-02,1\n")

    done = _cli("-q", "load", "--conn", db.dsn, "--table", db.table("t"), "--source", source,
                "--mode", "append")  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_reject_without_max_rejects_is_refused_naming_the_reject_table(db, tmp_path):
    db.run(f"CREATE TABLE {db.schema}.t (v integer)")
    source = _csv(tmp_path, "1\nx\n")

    done = _cli("load", "--conn", db.dsn, "--table", db.table("t"), "--source", source,
                "--mode", "append", "--on-error", "reject")  # fmt: skip

    assert done.returncode == 2
    assert "--on-error reject needs --max-rejects N" in done.stderr
    assert f"the reject table {db.schema}.pgbulk_rejects" in done.stderr
    assert leftovers(db) == []

    loaded = _cli("load", "--conn", db.dsn, "--table", db.table("t"), "--source", source,
                  "--mode", "append", "--on-error", "reject", "--max-rejects", "1")  # fmt: skip

    assert loaded.returncode == 0, loaded.stderr
    assert f"1 rejected (see the reject table {db.schema}.pgbulk_rejects)" in loaded.stdout


def test_a_wrong_key_exits_2_with_did_you_mean(db, tmp_path):
    db.run(f"CREATE TABLE {db.schema}.t (meter_id integer PRIMARY KEY, v integer)")
    source = _csv(tmp_path, "1,2\n")

    done = _cli("load", "--conn", db.dsn, "--table", db.table("t"), "--source", source,
                "--mode", "upsert", "--key", "meterid")  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert "did you mean 'meter_id'?" in done.stderr
    assert leftovers(db) == []


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_s3_endpoint_is_named_with_the_variable_to_set(db: Any):
    pytest.importorskip("s3fs")
    db.run(f"CREATE TABLE {db.schema}.t (v integer)")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",  # botocore's retries: fail fast
        "AWS_RETRY_MODE": "standard",
    }
    started = time.monotonic()

    done = _cli("load", "--conn", db.dsn, "--table", db.table("t"), "--source",
                "s3://bucket/day.csv", "--mode", "append", env=env)  # fmt: skip

    assert done.returncode == 1
    err = done.stderr
    assert f"source s3://bucket/day.csv: cannot reach the object store at {endpoint}" in err, err
    assert "AWS_ENDPOINT_URL" in err
    assert "Traceback" not in err
    assert time.monotonic() - started < 120
    assert leftovers(db) == []
