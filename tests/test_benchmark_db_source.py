"""benchmarks/db_source.py at a tiny size: every method (the psql pipe, pgcopydb when it is
installed, GenericTransfer, this project from PostgreSQL and from SQLite) loads the same rows
as the source holds. No timing is asserted (this machine is shared and noisy)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

NAME = "test_dbsrc"


def _expected_methods() -> set[str]:
    from benchmarks import db_source

    # the _before methods need --baseline, the maria_ ones --maria
    methods = {m.key for m in db_source.METHODS if not m.baseline and not m.maria}
    if shutil.which("pgcopydb") is None:
        methods.discard("pgcopydb")  # the benchmark leaves it out and says so
    try:
        sqlite_provider = importlib.util.find_spec("airflow.providers.sqlite")
    except ModuleNotFoundError:
        sqlite_provider = None
    if sqlite_provider is None:
        methods.discard("sqlite_generic_transfer")  # Airflow's sqlite connection needs it
    return methods


def _drop(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(NAME)))
        for db in (f"{NAME}_source", f"{NAME}_pgcopydb"):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db))
            )


def test_every_method_loads_the_sources_rows(pg_dsn: str, tmp_path: Path) -> None:
    from benchmarks import db_source

    out, data = tmp_path / "db_source.md", tmp_path / "db_source.json"
    argv = ["--conn", pg_dsn, "--name", NAME, "--meters", "30", "--days", "7", "--subset", "50"]
    try:
        files = ["--workdir", str(tmp_path), "--json", str(data), "--out", str(out)]
        code = db_source.main([*argv, "--reps", "1", *files])
    finally:
        _drop(pg_dsn)
    result = json.loads(data.read_text())
    runs = {r["method"]: r for r in result["runs"]}
    assert code == 0, [r["error"] for r in runs.values() if not r["ok"]]
    assert set(runs) == _expected_methods()
    assert all(r["ok"] for r in runs.values())
    loaded: dict[bool, set[tuple[int, int]]] = {True: set(), False: set()}
    for r in runs.values():
        loaded[db_source.BY_KEY[r["method"]].subset].add((r["rows"], r["checksum"]))
    whole, subset = loaded[False], loaded[True]
    assert len(whole) == 1 and whole.pop()[0] == 30 * 7  # every full load: the same rows
    assert len(subset) == 1 and subset.pop()[0] == 50  # every subset load: the same 50 rows
    if "pgcopydb" in runs:  # end to end: its copy, its index step, the foreign key
        assert set(runs["pgcopydb"]["steps"]) == {"table-data", "indexes", "constraints",
                                                   "foreign key"}  # fmt: skip
    text = out.read_text()
    assert all(f"| `{key}` | 1 |" in text for key in runs)
    assert {t["target"].split(" ")[0] for t in result["targets"]} >= {"project", "project_subset"}


def test_maria_methods_load_the_sources_rows(pg_dsn: str, mariadb: str, tmp_path: Path) -> None:
    """``--maria URL`` adds the MariaDB methods: the server makes the source's rows itself, and
    the project (and GenericTransfer, where Airflow's mysql provider is importable) loads the
    same subset as the PostgreSQL source holds."""
    import sqlalchemy

    from benchmarks import db_source

    data = tmp_path / "db_source.json"
    argv = ["--conn", pg_dsn, "--name", NAME, "--meters", "30", "--days", "7", "--subset", "50"]
    methods = "maria_project_subset,maria_generic_transfer"
    try:
        code = db_source.main(
            [*argv, "--reps", "1", "--maria", mariadb, "--methods", methods,
             "--workdir", str(tmp_path), "--json", str(data)]
        )  # fmt: skip
    finally:
        _drop(pg_dsn)
        engine = sqlalchemy.create_engine(mariadb)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {NAME}_maria")
        engine.dispose()
    runs = json.loads(data.read_text())["runs"]
    assert code == 0, [r["error"] for r in runs if not r["ok"]]
    assert "maria_project_subset" in {r["method"] for r in runs}
    assert {(r["rows"], r["ok"]) for r in runs} == {(50, True)}


def test_baseline_methods_run_the_project_from_another_tree(pg_dsn: str, tmp_path: Path) -> None:
    """``--baseline DIR`` runs the ``_before`` methods from DIR, in the same run, and the report
    compares each with its method; here DIR is a copy of this tree whose CLI leaves a mark,
    so the run shows which code it ran."""
    from benchmarks import db_source

    repo = Path(db_source.__file__).resolve().parent.parent
    tree = tmp_path / "before"
    shutil.copytree(repo / "airflow_pg_bulk", tree / "airflow_pg_bulk")
    mark = tmp_path / "ran-from-baseline"
    cli = tree / "airflow_pg_bulk" / "cli.py"
    future = "from __future__ import annotations\n"
    marked = f"{future}open({str(mark)!r}, 'a').write('x')\n"
    cli.write_text(cli.read_text().replace(future, marked, 1))
    data = tmp_path / "db_source.json"
    argv = ["--conn", pg_dsn, "--name", NAME, "--meters", "30", "--days", "7", "--reps", "1"]
    methods = "project_1,project_1_before,sqlite_project_before"
    try:
        code = db_source.main(
            [*argv, "--methods", methods, "--baseline", str(tree), "--workdir", str(tmp_path),
             "--json", str(data)]
        )  # fmt: skip
    finally:
        _drop(pg_dsn)
    result = json.loads(data.read_text())
    assert code == 0, [r["error"] for r in result["runs"] if not r["ok"]]
    assert [r["method"] for r in result["runs"]] == methods.split(",")
    assert all(r["rows"] == 30 * 7 for r in result["runs"])
    assert mark.read_text() == "xx"  # the two _before runs, not project_1
    assert [c["method"] for c in result["changes"]] == ["project_1"]


def test_readers_benchmark_loads_every_row_by_each_reader(
    pg_dsn: str, tmp_path: Path, capsys: Any
) -> None:
    """benchmarks/db_readers.py at a tiny size: the rows path and the Arrow readers that are
    installed (ADBC with the sqlite extra, which the tests have; ConnectorX, no dependency of
    the project, where installed) each load every row of a SQLite file's ``readings``."""
    import sqlite3

    from benchmarks import db_readers

    path = tmp_path / "readings.db"
    with sqlite3.connect(path) as lite:
        lite.execute(
            "CREATE TABLE readings (id integer, meter_id integer, reading real, date text)"
        )
        lite.executemany(
            "INSERT INTO readings VALUES (?, ?, ?, ?)",
            [(i, i % 7, i / 3, "2026-01-02") for i in range(1, 1001)],
        )
    lite.close()
    try:
        assert db_readers.main(["--conn", pg_dsn, "--sqlite", str(path), "--reps", "1"]) == 0
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(db_readers.TABLE))
            )
    runs = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("sqlite {")]  # fmt: skip
    expected = ["adbc_sqlite", "connectorx", "rows"]
    assert sorted(r["reader"] for r in runs) == [r for r in expected if db_readers.installed(r)]
    assert db_readers.installed("adbc_sqlite")  # the test extra installs the sqlite extra
    assert all(r["rows"] == 1000 for r in runs), runs
