"""Errors that find the row on a partitioned target (issue 18): a constraint broken by loaded
rows names the file and line of an offending row (both lines of a key loaded twice) for every
kind of constraint (primary key, UNIQUE, CHECK, foreign key, NOT NULL; the parent's, or one
partition's alone), whether one partition or several receive rows, in append (in place into
partitions with rows, swapped into empty ones), replace, replace_partitions and upsert; the
target is left as it was. The server names the partition's constraint (``pq_p0_pkey``), which
the locator maps to the rows of that partition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import leftovers
from psycopg import sql as psql

from airflow_pg_bulk import runner
from airflow_pg_bulk.errors import BadDataError, ConstraintViolationError

LEAVES = 4  # pq_p0 .. pq_p3: n in [100 k, 100 k + 100); rows already in pq_p0 and pq_p1
EXISTING = [(1, 5, 10, 1, 1), (2, 150, 20, 1, 2)]  # (id, n, qty, ref, code)
MODES = ["append", "replace", "replace_partitions", "upsert"]
KINDS = ["pk-pair", "unique-pair", "pk-target", "unique-target", "check", "fk", "not-null"]
BAD = 4  # the offending row is b.csv's line 4
TWIN = 2  # a.csv's line 2 holds the other row of a pair


def _target(db: Any) -> None:
    db.run(psql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(db.ident("refs")))
    db.run(psql.SQL("INSERT INTO {} VALUES (1), (2)").format(db.ident("refs")))
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id int, n int, qty int NOT NULL CONSTRAINT pq_qty_check"
            " CHECK (qty >= 0), ref int REFERENCES {}, code int, PRIMARY KEY (id, n),"
            " UNIQUE (code, n)) PARTITION BY RANGE (n)"
        ).format(db.ident("pq"), db.ident("refs"))
    )
    for k in range(LEAVES):
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"pq_p{k}"), db.ident("pq"), 100 * k, 100 * k + 100
            )
        )
    for row in EXISTING:
        db.run(psql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s)").format(db.ident("pq")), *row)


def _write(directory: Path, kind: str, leaf: int, spread: bool) -> None:
    """a.csv and b.csv, 4 rows each, in partition ``leaf`` (``spread``: one in each
    partition, a.csv's line 2 and b.csv's line 4 in ``leaf``), b.csv's line 4 breaking a
    constraint as ``kind`` says."""
    files: dict[str, list[list[Any]]] = {}
    for f, name in enumerate("ab"):
        files[name] = []
        for line in range(1, 5):
            at = leaf if not spread or (name, line) in (("a", TWIN), ("b", BAD)) else line - 1
            ident = 100 + 10 * f + line
            files[name].append([ident, 100 * at + 10 * f + line, line, 1, ident])
    twin, bad = files["a"][TWIN - 1], files["b"][BAD - 1]
    if kind == "pk-pair":
        bad[:2] = twin[:2]
    elif kind == "unique-pair":
        bad[1], bad[4] = twin[1], twin[4]
    elif kind == "pk-target":
        bad[:2] = EXISTING[leaf][:2]
    elif kind == "unique-target":
        bad[1], bad[4] = EXISTING[leaf][1], EXISTING[leaf][4]
    elif kind == "check":
        bad[2] = -1
    elif kind == "fk":
        bad[3] = 999
    else:
        bad[2] = None
    for name, rows in files.items():
        text = "".join(",".join("" if v is None else str(v) for v in row) + "\n" for row in rows)
        (directory / f"{name}.csv").write_text(text)


def _expect(directory: Path, kind: str) -> str:
    if kind.endswith("-pair"):
        return f"found at {directory}/a.csv line {TWIN} and {directory}/b.csv line {BAD}."
    if kind.endswith("-target"):
        return f"found at {directory}/b.csv line {BAD}, whose key is already in the target."
    if kind == "not-null":  # staging has the NOT NULL: the COPY names the line
        return f"{directory}/b.csv line {BAD}"
    return f"found at {directory}/b.csv line {BAD}."


def _fails(db: Any, connect: Any, directory: Path, mode: str) -> str:
    before = {name: db.checksum(name) for name in ["pq", *(f"pq_p{k}" for k in range(LEAVES))]}
    with pytest.raises((ConstraintViolationError, BadDataError)) as failed:
        runner.load(
            connect,
            db.table("pq"),
            str(directory / "*.csv"),
            mode=mode,
            key=["id", "n"] if mode == "upsert" else None,
            partitions=3,
        )
    assert {name: db.checksum(name) for name in before} == before
    assert leftovers(db) == []
    return str(failed.value)


def _cases() -> list[Any]:
    cases = []
    for mode in MODES:
        for kind in KINDS:
            if mode == "upsert" and kind.startswith("pk-"):
                continue  # the upsert's own key: a repeated key is an update
            for leaf, spread in ((0, False), (3, False), (0, True), (3, True)):
                if kind.endswith("-target") and (mode.startswith("replace") or leaf != 0):
                    continue  # replaced rows are not there to collide with; pq_p3 is empty
                cases.append(pytest.param(mode, kind, leaf, spread, id=f"{mode}-{kind}-p{leaf}"
                                          + ("-all" if spread else "")))  # fmt: skip
    return cases


@pytest.mark.parametrize(("mode", "kind", "leaf", "spread"), _cases())
def test_the_error_names_file_and_line(db, tmp_path, pg_dsn, mode, kind, leaf, spread):
    """pq_p0 has rows (an append goes in place), pq_p3 is empty (an append swaps it in);
    ``-all``: every partition receives rows (built side by side)."""
    _target(db)
    _write(tmp_path, kind, leaf, spread)

    message = _fails(db, pg_dsn, tmp_path, mode)

    assert _expect(tmp_path, kind) in message, message
    assert "_pgbulk_" not in message, message


@pytest.mark.parametrize("mode", ["append", "replace_partitions"])
def test_a_constraint_of_one_partition_alone(db, connect, tmp_path, mode):
    """A UNIQUE and a CHECK that only pq_p3 has hold for its rows only: the same code in
    another partition and a negative qty elsewhere are no offence."""
    _target(db)
    p3 = db.ident("pq_p3")
    db.run(psql.SQL("ALTER TABLE {} ADD CONSTRAINT p3_only_code UNIQUE (code)").format(p3))
    db.run(psql.SQL("ALTER TABLE {} ADD CONSTRAINT p3_small CHECK (qty < 50)").format(p3))
    (tmp_path / "a.csv").write_text("10,10,60,1,7\n11,310,1,1,7\n12,320,1,1,8\n")
    (tmp_path / "b.csv").write_text("13,20,1,1,8\n14,330,1,1,8\n")
    assert f"found at {tmp_path}/a.csv line 3 and {tmp_path}/b.csv line 2." in _fails(
        db, connect, tmp_path, mode
    )
    (tmp_path / "b.csv").write_text("13,20,1,1,9\n14,330,70,1,9\n")
    assert f"found at {tmp_path}/b.csv line 2." in _fails(db, connect, tmp_path, mode)


def test_the_issues_reproductions(db, connect, tmp_path):
    """Issue 18, as filed (both drivers): a key already in the partition, appended in
    place; a CHECK broken when two partitions receive rows (replace_partitions)."""
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id int, n int, qty int NOT NULL CHECK (qty >= 0),"
            " PRIMARY KEY (id, n)) PARTITION BY RANGE (n)"
        ).format(db.ident("pq"))
    )
    for k in range(2):
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"pq_p{k}"), db.ident("pq"), 100 * k, 100 * k + 100
            )
        )
    db.run(psql.SQL("INSERT INTO {} VALUES (1, 5, 10), (2, 150, 20)").format(db.ident("pq")))
    path = tmp_path / "load.csv"
    path.write_text("3,6,1\n1,5,11\n")
    before = db.checksum("pq")
    with pytest.raises(ConstraintViolationError) as failed:
        runner.load(connect, db.table("pq"), str(path), mode="append", strategy="in_place")
    assert "Key (id, n)=(1, 5) already exists" in str(failed.value)
    assert f"found at {path} line 2, whose key is already in the target" in str(failed.value)
    assert failed.value.rows == ((str(path), 2),) and failed.value.in_target

    path.write_text("1,5,-1\n2,150,3\n")
    with pytest.raises(ConstraintViolationError) as failed:
        runner.load(connect, db.table("pq"), str(path), mode="replace_partitions")
    assert "pq_qty_check" in str(failed.value)
    assert failed.value.rows == ((str(path), 1),), str(failed.value)
    assert db.checksum("pq") == before
    assert leftovers(db) == []
