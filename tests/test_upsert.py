"""mode="upsert" on a real server, under both drivers: the result equals what plain SQL
computes from the same files (one COPY in source order, then latest row per key wins)."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import create_items, leftovers, rows, write_csv
from psycopg import sql as psql

from airflow_pg_bulk import runner, sql, steps
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import LoadRequest


def _files(directory: Path) -> list[Path]:
    """Two files in source order (a.csv, b.csv) with keys repeated within a file, across the
    pieces of a split file and across files; ids 2000-2500 already exist in the target."""
    first = rows(3000, seed=1)  # ids 1..3000
    again = [(r[0] % 50 + 1, *r[1:]) for r in rows(120, seed=2)]  # ids 1..50, some twice
    a = write_csv(directory / "a.csv", first + again)
    b_rows = [(r[0] + 2989, *r[1:]) for r in rows(111, seed=3)] + rows(10, seed=4)
    b = write_csv(directory / "b.csv", b_rows)
    return [a, b]


def _existing(db: Any, name: str = "items") -> None:
    old = [(r[0] + 1999, *r[1:]) for r in rows(501, seed=9)]  # ids 2000..2500
    old += [(r[0] + 4999, *r[1:]) for r in rows(11, seed=10)]  # ids 5000..5010: not loaded
    with (
        db.conn.cursor() as cur,
        cur.copy(psql.SQL("COPY {} FROM STDIN").format(db.ident(name))) as copy,
    ):
        for row in old:
            copy.write_row(row)


def _reference(db: Any, files: list[Path], key: list[str], columns: list[str]) -> tuple:
    """What ``items`` should hold, in table ``expected``, by plain SQL: one COPY of the files
    in source order into a table numbering rows as they arrive, the latest row per key, then
    UPDATE the matching rows and INSERT the others. Returns (rows updated, rows inserted)."""
    cols = psql.SQL(", ").join(map(psql.Identifier, columns))
    db.run(psql.SQL("CREATE TABLE {} AS TABLE {}").format(db.ident("expected"), db.ident("items")))
    db.run(
        psql.SQL("CREATE TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            db.ident("arrived"), cols, db.ident("items")
        )
    )
    db.run(psql.SQL("ALTER TABLE {} ADD COLUMN n bigserial").format(db.ident("arrived")))
    with db.conn.cursor() as cur:
        for path in files:
            statement = psql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                db.ident("arrived"), cols
            )
            with cur.copy(statement) as copy:
                copy.write(path.read_bytes())
    keys = psql.SQL(", ").join(map(psql.Identifier, key))
    parts = dict(
        e=db.ident("expected"),
        c=cols,
        l=psql.SQL("SELECT DISTINCT ON ({k}) {c} FROM {a} ORDER BY {k}, n DESC").format(
            k=keys, c=cols, a=db.ident("arrived")
        ),
        match=psql.SQL(" AND ").join(
            psql.SQL("t.{0} = l.{0}").format(psql.Identifier(k)) for k in key
        ),
        s=psql.SQL(", ").join(psql.SQL("{0} = l.{0}").format(psql.Identifier(c)) for c in columns),
    )
    exists = psql.SQL("EXISTS (SELECT 1 FROM {e} t WHERE {match})").format(**parts)
    updated = db.scalar(
        psql.SQL("SELECT count(*) FROM ({l}) l WHERE {x}").format(x=exists, **parts)
    )
    total = db.scalar(psql.SQL("SELECT count(*) FROM ({l}) l").format(**parts))
    db.run(psql.SQL("UPDATE {e} t SET {s} FROM ({l}) l WHERE {match}").format(**parts))
    db.run(
        psql.SQL("INSERT INTO {e} ({c}) SELECT {c} FROM ({l}) l WHERE NOT {x}").format(
            x=exists, **parts
        )
    )
    return updated, total - updated


@pytest.mark.parametrize("partitions", [1, 3])
def test_upsert_matches_plain_sql_latest_row_wins(db, connect, tmp_path, partitions):
    create_items(db)
    _existing(db)
    files = _files(tmp_path)
    updated, inserted = _reference(db, files, ["id"], ["id", "name", "amount", "day", "note"])

    summary = runner.load(
        connect, db.table("items"), str(tmp_path / "*.csv"), mode="upsert", partitions=partitions
    )

    assert summary.partitions == partitions
    assert summary.rows == 3000 + 120 + 121
    assert (summary.inserted, summary.updated) == (inserted, updated)
    assert db.checksum("items") == db.checksum("expected")
    assert leftovers(db) == []


def test_on_duplicate_key_fail_names_the_key_and_leaves_the_target(db, connect, tmp_path):
    create_items(db)
    _existing(db)
    before = db.checksum("items")
    _files(tmp_path)

    with pytest.raises(BadDataError) as failed:
        runner.load(
            connect, db.table("items"), str(tmp_path / "*.csv"), mode="upsert",
            partitions=3, on_duplicate_key="fail",
        )  # fmt: skip

    message = str(failed.value)
    # id 1: line 1 and twice among a.csv's repeats, and in b.csv; ids 1-50 and 2990-3000 repeat
    assert "the key (id='1') is loaded 4 times (61 keys are loaded more than once)" in message
    # the source read again: the two rows of the first key repeated in source order, by line
    found = re.search(r"key loaded twice is at (\S+) line (\d+) and (\S+) line (\d+)", message)
    assert found, message
    named = [(found[1], int(found[2])), (found[3], int(found[4]))]

    def id_at(path: str, line: int) -> str:  # a record's first field, by its first line
        with open(path, newline="") as f:
            reader, start = csv.reader(f), 1
            for record in reader:
                if start == line:
                    return record[0]
                start = reader.line_num + 1
        raise AssertionError(f"no record starts at {path} line {line}")

    assert [Path(p).name for p, _ in named] == ["a.csv", "a.csv"]
    assert named[0][1] < named[1][1]
    assert id_at(*named[0]) == id_at(*named[1])  # the same key on both lines
    assert db.checksum("items") == before
    assert leftovers(db) == []


def test_on_duplicate_key_fail_loads_when_every_key_is_once(db, connect, tmp_path):
    create_items(db)
    _existing(db)
    path = write_csv(tmp_path / "once.csv", [(r[0] + 2400, *r[1:]) for r in rows(300, seed=5)])
    updated, inserted = _reference(db, [path], ["id"], ["id", "name", "amount", "day", "note"])

    summary = runner.load(
        connect, db.table("items"), str(path), mode="upsert", on_duplicate_key="fail"
    )

    assert (summary.inserted, summary.updated) == (inserted, updated) == (200, 100)
    assert db.checksum("items") == db.checksum("expected")


READINGS = (
    "CREATE TABLE {} (rid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, meter int NOT NULL,"
    " day date NOT NULL, value numeric(10,2), note text NOT NULL DEFAULT 'none',"
    " seen serial, UNIQUE (meter, day))"
)


@pytest.mark.parametrize("key", [["meter", "day"], ["day", "meter"]])
def test_composite_key_identity_serial_and_defaults(db, connect, tmp_path, key):
    db.run(psql.SQL(READINGS).format(db.ident("readings")))
    db.run(
        f"INSERT INTO {db.schema}.readings (meter, day, value, note)"
        " SELECT m, date '2026-01-01' + d, m + d, 'old' FROM generate_series(1, 20) m,"
        " generate_series(0, 9) d"
    )
    lines = [
        f"{m},2026-01-{1 + d:02d},{m * 100 + d}.5" for m in range(15, 31) for d in range(0, 12, 2)
    ]
    lines += ["15,2026-01-01,0.25", "30,2026-01-11,7"]  # repeated keys: the later rows win
    path = tmp_path / "r.csv"
    path.write_text("\n".join(lines) + "\n")
    before = {
        r[0]: r[1:] for r in db.run(f"SELECT rid, meter, day, note FROM {db.schema}.readings")
    }

    summary = runner.load(
        connect, db.table("readings"), str(path), mode="upsert", key=key,
        columns=["meter", "day", "value"], partitions=2,
    )  # fmt: skip

    got = {(m, str(d)): (rid, v, note, seen) for rid, m, d, v, note, seen in db.run(
        f"SELECT rid, meter, day, value::text, note, seen FROM {db.schema}.readings")}  # fmt: skip
    assert len(got) == 200 + 6 * 6 + 6 * 5  # 20x10 old, meters 21-30 new, days 10-11 new
    assert (summary.updated, summary.inserted) == (6 * 5, 66)
    assert got[(15, "2026-01-01")][1:3] == ("0.25", "old")  # updated: note kept
    assert got[(30, "2026-01-11")][1:3] == ("7.00", "none")  # inserted: the default
    assert got[(16, "2026-01-03")][1] == "1602.50"
    assert got[(1, "2026-01-01")][1] == "1.00"  # not loaded: unchanged
    for rid, (meter, day, _note) in before.items():
        assert got[(meter, str(day))][0] == rid  # updated rows keep their identity
    new_ids = [rid for rid, *_ in got.values() if rid not in before]
    assert len(new_ids) == 66 and min(new_ids) > max(before)
    assert len({seen for *_, seen in got.values()}) == len(got)


def test_refusals_name_the_problem(db, connect, tmp_path):
    db.run(f"CREATE TABLE {db.schema}.nokey (a int, b int)")
    db.run(f"CREATE TABLE {db.schema}.keyed (a int PRIMARY KEY, b int, c int UNIQUE)")
    path = tmp_path / "x.csv"
    path.write_text("1,2\n")
    with pytest.raises(LoadRefusedError, match="has no primary key"):
        runner.load(connect, db.table("nokey"), str(path), mode="upsert")
    with pytest.raises(
        LoadRefusedError,
        match=r"key \['b'\] of .* is not unique.*keys: primary key \(a\); unique constraint k",
    ):
        runner.load(
            connect, db.table("keyed"), str(path), mode="upsert", key=["b"], columns=["a", "b"]
        )
    assert leftovers(db) == []


def test_failure_before_the_commit_leaves_the_target_unchanged(db, connect, tmp_path, monkeypatch):
    create_items(db)
    _existing(db)
    before = db.checksum("items")
    _files(tmp_path)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected before the commit")

    monkeypatch.setattr(sql, "mark_finalized", broken)
    with pytest.raises(RuntimeError, match="injected"):
        runner.load(
            connect, db.table("items"), str(tmp_path / "*.csv"), mode="upsert", partitions=3
        )

    assert db.checksum("items") == before
    assert leftovers(db) == []


def test_a_finalize_retried_after_its_commit_does_nothing(db, connect, tmp_path):
    create_items(db)
    _existing(db)
    _files(tmp_path)
    request = LoadRequest(
        table=db.table("items"), source=(str(tmp_path / "*.csv"),), mode="upsert", partitions=2
    )
    conn = connect()
    try:
        plan = steps.prepare(conn, request, "00000000a7e1")
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        first = steps.finalize(conn, plan)
        after = db.checksum("items")
        again = steps.finalize(conn, plan)
        assert db.checksum("items") == after
        assert first.inserted and first.updated and again.inserted is None
        assert again.rows == first.rows
    finally:
        steps.cleanup(conn, db.schema, "00000000a7e1")
        conn.close()
    assert leftovers(db) == []


@pytest.mark.parametrize("order", ["reversed", "in_order"])
def test_latest_row_wins_across_pieces_whatever_order_the_copy_tasks_run_in(
    db, connect, tmp_path, order
):
    """Which COPY task runs first must not decide which row of a repeated key wins: the tasks
    run here one by one, each on a session of its own (as Airflow runs them), the last piece
    in source order first ("reversed") or the first first, so that a source order taken from
    the order rows arrive in (a sequence alone, a commit order) fails every time rather than
    when the threads of a parallel run happen to interleave that way."""
    create_items(db)
    _existing(db)
    files = _files(tmp_path)
    updated, inserted = _reference(db, files, ["id"], ["id", "name", "amount", "day", "note"])
    request = LoadRequest(
        table=db.table("items"), source=(str(tmp_path / "*.csv"),), mode="upsert", partitions=3,
        strategy="in_place",
    )  # fmt: skip
    conn = connect()
    try:
        plan = steps.prepare(conn, request, "0000000c0de5")
        pieces = [(p.ordinal, part.index) for part in plan.partitions for p in part.pieces]
        assert len(pieces) >= 3  # a.csv cut into pieces, and b.csv
        runs = sorted(plan.partitions, key=lambda part: min(p.ordinal for p in part.pieces))
        if order == "reversed":
            runs.reverse()
        for part in runs:
            task = connect()
            try:
                steps.copy_partition(task, plan, part.index)
            finally:
                task.close()
        summary = steps.finalize(conn, plan)
    finally:
        steps.cleanup(conn, db.schema, "0000000c0de5")
        conn.close()
    assert (summary.inserted, summary.updated) == (inserted, updated)
    assert db.checksum("items") == db.checksum("expected")
    assert leftovers(db) == []
