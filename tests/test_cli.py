"""The command line: ``airflow-pg-bulk load`` and ``airflow-pg-bulk demo``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import create_items, leftovers, plain_copy_checksum, write_parts

CLI = [os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def test_load_command_loads_and_prints_summary(db, tmp_path):
    create_items(db)
    whole = write_parts(tmp_path, "part", 3, 200, header=["id", "name", "amount", "day", "note"])
    expected = plain_copy_checksum(db, whole, "FORMAT csv")

    done = run_cli(
        "load",
        "--conn",
        db.dsn,
        "--table",
        db.table("items"),
        "--source",
        str(tmp_path / "part-0.csv"),
        "--source",
        str(tmp_path / "part-[12].csv"),
        "--header",
        "--mode",
        "replace",
        "--partitions",
        "3",
        "--json",
    )

    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["rows"] == 600 and figures["partitions"] == 3
    assert set(figures["seconds"]) >= {"prepare", "copy", "indexes", "swap"}
    assert db.checksum("items") == expected


def test_load_command_json_has_the_upserts_counts(db, tmp_path):
    """``--json`` of an upsert: rows inserted, updated, and superseded by a later row with
    the same key (the summary's log line had the last one only)."""
    create_items(db)
    db.run(f"INSERT INTO {db.schema}.items VALUES (1, 'old', 1, NULL, NULL)")
    path = tmp_path / "changes.csv"
    path.write_text("1,a,1.0,,\n2,b,2.0,,\n2,c,3.0,,\n3,d,4.0,,\n2,e,5.0,,\n")

    done = run_cli(
        "load", "--conn", db.dsn, "--table", db.table("items"), "--source", str(path),
        "--mode", "upsert", "--key", "id", "--json",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["rows"], figures["inserted"], figures["updated"]) == (5, 2, 1)
    assert figures["superseded"] == 2
    assert dict(db.run(f"SELECT id, name FROM {db.schema}.items")) == {1: "a", 2: "e", 3: "d"}


def test_load_command_fails_with_error_on_stderr(db, tmp_path):
    create_items(db)
    db.run(
        f"INSERT INTO {db.schema}.items VALUES (-1, 'kept', 1, '2020-01-01', NULL),"
        " (-2, 'also kept', 2.5, NULL, 'note')"
    )
    before = db.checksum("items")
    path = tmp_path / "bad.csv"
    path.write_text("1,a,1.0,2024-01-01,\n2,b,oops,2024-01-01,\n")

    done = run_cli(
        "load", "--conn", db.dsn, "--table", db.table("items"), "--source", str(path), "--mode",
        "replace",
    )  # fmt: skip

    assert done.returncode == 1
    assert f"{path} line 2, column amount" in done.stderr
    assert "oops" in done.stderr
    assert done.stdout == ""
    assert db.checksum("items") == before
    assert leftovers(db) == []


def test_load_command_rejects_bad_arguments():
    done = run_cli("load", "--table", "t")
    assert done.returncode == 2
    assert "--conn" in done.stderr


def test_demo_without_airflow(pg_dsn):
    done = run_cli("demo", "--conn", pg_dsn, "--meters", "300", "--days", "10", "--no-airflow")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Same 3,000 rows in every table" in done.stdout
    assert "airflow-pg-bulk, in-process" in done.stdout
