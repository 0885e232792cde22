"""Errors that find the row: a constraint of the target broken by loaded rows names the
source file and line of an offending row (both lines of a key loaded twice), in every mode
and strategy, and the target is left as it was; a UTF-8 byte-order mark loads with or without
a header."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
from helpers import leftovers
from psycopg import sql as psql

from airflow_pg_bulk import runner
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.errors import BadDataError, ConstraintViolationError

TABLE = (
    "CREATE TABLE {items} (id int PRIMARY KEY, code int NOT NULL UNIQUE,"
    " parent int REFERENCES {parents}, qty int NOT NULL CONSTRAINT qty_positive CHECK (qty >= 0),"
    " span int4range, CONSTRAINT no_overlap EXCLUDE USING gist (span WITH &&))"
)
FILES = ("a", "b", "c")
ROWS = 60  # per file: 3 files in 6 partitions, each file split in two pieces
BAD_LINE = 45  # in b.csv: in its second piece
TWIN_LINE = 7  # in a.csv: the row b.csv's line 45 repeats

MODES = [
    ("replace", "in_place"),
    ("append", "in_place"),
    ("append", "rebuild"),
    ("upsert", "in_place"),
    ("upsert", "rebuild"),
]


def _row(file: int, line: int) -> list[Any]:
    n = file * 1000 + line
    return [n, n, 1 + line % 5, line, f"[{n * 10},{n * 10 + 5})"]


def _write(directory: Path, change: dict[int, Any] | None = None) -> None:
    """a.csv, b.csv, c.csv; ``change`` sets columns of b.csv's line 45 (by column index)."""
    for k, name in enumerate(FILES):
        lines = []
        for line in range(1, ROWS + 1):
            row = _row(k, line)
            if k == 1 and line == BAD_LINE:
                for column, value in (change or {}).items():
                    row[column] = value
            lines.append(",".join("" if v is None else f'"{v}"' for v in row))
        (directory / f"{name}.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture
def items(db: Any) -> Any:
    db.run(psql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(db.ident("parents")))
    db.run(f"INSERT INTO {db.schema}.parents SELECT generate_series(1, 5)")
    db.run(psql.SQL(TABLE).format(items=db.ident("items"), parents=db.ident("parents")))
    # rows already there: ids and codes 90001..90010, far-away spans
    db.run(
        f"INSERT INTO {db.schema}.items SELECT n, n, 1, 1, int4range(n * 10, n * 10 + 5)"
        " FROM generate_series(90001, 90010) n"
    )
    return db


def _load(db: Any, directory: Path, mode: str, strategy: str, driver: str = "psycopg") -> Any:
    return runner.load(
        lambda: open_connection(db.dsn, driver),
        db.table("items"),
        str(directory / "*.csv"),
        mode=mode,
        strategy=strategy if mode != "replace" else "auto",
        key=["id"] if mode == "upsert" else None,
        partitions=6,
    )


def _fails(db: Any, tmp_path: Path, mode: str, strategy: str, driver: str = "psycopg") -> str:
    before = db.checksum("items")
    with pytest.raises((ConstraintViolationError, BadDataError)) as failed:
        _load(db, tmp_path, mode, strategy, driver)
    assert db.checksum("items") == before
    assert leftovers(db) == []
    return str(failed.value)


B_LINE = "b.csv line 45"


@pytest.mark.parametrize(("mode", "strategy"), MODES)
def test_duplicate_key_within_the_load_names_both_lines(items, tmp_path, mode, strategy):
    _write(tmp_path, {1: _row(0, TWIN_LINE)[1]})  # b.csv line 45 repeats a.csv line 7's code

    message = _fails(items, tmp_path, mode, strategy)

    assert "code" in message and f"{tmp_path}/a.csv line 7 and {tmp_path}/{B_LINE}" in message


@pytest.mark.parametrize(("mode", "strategy"), [m for m in MODES if m[0] != "replace"])
def test_duplicate_of_a_row_already_in_the_target(items, tmp_path, mode, strategy):
    _write(tmp_path, {1: 90003})

    message = _fails(items, tmp_path, mode, strategy)

    assert f"{tmp_path}/{B_LINE}, whose key is already in the target" in message
    assert "(code)=(90003)" in message


@pytest.mark.parametrize(("mode", "strategy"), [m for m in MODES if m[0] != "replace"])
def test_the_lines_named_hold_the_key_the_server_names(items, tmp_path, mode, strategy):
    """Line 2's code is already in the target, line 3 repeats line 1's: whichever of the two
    keys the server reports (in place, in file order: the one in the target), the lines
    named hold that key (they named lines 1 and 3 under the target's key)."""
    rows = [_row(0, 1), _row(0, 2), _row(0, 3)]
    rows[1][1], rows[2][1] = 90003, rows[0][1]
    path = tmp_path / "a.csv"
    path.write_text("".join(",".join(f'"{v}"' for v in row) + "\n" for row in rows))
    before = items.checksum("items")
    with pytest.raises(ConstraintViolationError) as failed:
        runner.load(
            items.dsn,
            items.table("items"),
            str(path),
            mode=mode,
            strategy=strategy,
            key=["id"] if mode == "upsert" else None,
            partitions=1,
        )
    message = str(failed.value)

    if mode == "append" and strategy == "in_place":
        assert "(code)=(90003) already exists" in message, message
    if "(code)=(90003)" in message:
        assert f"found at {path} line 2, whose key is already in the target" in message
    else:
        assert f"(code)=({rows[0][1]})" in message, message
        assert f"found at {path} line 1 and {path} line 3." in message
    assert items.checksum("items") == before


@pytest.mark.parametrize(("mode", "strategy"), MODES)
def test_foreign_key(items, tmp_path, mode, strategy):
    _write(tmp_path, {2: 77})

    message = _fails(items, tmp_path, mode, strategy)

    assert "items_parent_fkey" in message and f"{tmp_path}/{B_LINE}" in message


@pytest.mark.parametrize(("mode", "strategy"), MODES)
def test_not_null(items, tmp_path, mode, strategy):
    _write(tmp_path, {3: None})

    message = _fails(items, tmp_path, mode, strategy)

    assert "qty" in message and f"{tmp_path}/{B_LINE}" in message


@pytest.mark.parametrize(("mode", "strategy"), MODES)
def test_check(items, tmp_path, mode, strategy):
    _write(tmp_path, {3: -1})

    message = _fails(items, tmp_path, mode, strategy)

    assert "qty_positive" in message and f"{tmp_path}/{B_LINE}" in message


@pytest.mark.parametrize(("mode", "strategy"), MODES)
def test_exclusion(items, tmp_path, mode, strategy):
    _write(tmp_path, {4: f"[{TWIN_LINE * 10 + 2},{TWIN_LINE * 10 + 8})"})  # overlaps a.csv line 7

    message = _fails(items, tmp_path, mode, strategy)

    assert "no_overlap" in message
    assert f"{tmp_path}/a.csv line 7 and {tmp_path}/{B_LINE}" in message


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_both_drivers_name_the_line(items, tmp_path, driver):
    _write(tmp_path, {1: _row(0, TWIN_LINE)[1]})

    message = _fails(items, tmp_path, "append", "in_place", driver)

    assert f"{tmp_path}/a.csv line 7 and {tmp_path}/{B_LINE}" in message


def test_error_carries_the_rows(items, tmp_path):
    _write(tmp_path, {1: 90004})

    with pytest.raises(ConstraintViolationError) as failed:
        _load(items, tmp_path, "append", "in_place")

    assert failed.value.rows == ((str(tmp_path / "b.csv"), BAD_LINE),)
    assert failed.value.in_target and failed.value.sqlstate == "23505"
    assert (failed.value.path, failed.value.line) == (str(tmp_path / "b.csv"), BAD_LINE)


def test_the_line_counts_quoted_newlines_and_gzip(items, tmp_path):
    """A gzip file is one piece; a quoted newline makes a record two lines."""
    body = "".join(f'{n},{n},1,1,"[{n * 10},{n * 10 + 1})"\n' for n in range(1, 11))
    body += '11,11,9,1,"[110,\n111)"\n'  # lines 11-12: a bad parent, the range across 2 lines
    (tmp_path / "z.csv.gz").write_bytes(gzip.compress(body.encode()))

    before = items.checksum("items")
    with pytest.raises(ConstraintViolationError) as failed:
        runner.load(
            lambda: open_connection(items.dsn, "psycopg"), items.table("items"),
            str(tmp_path / "z.csv.gz"), mode="append", strategy="in_place",
        )  # fmt: skip

    assert f"{tmp_path}/z.csv.gz line 11" in str(failed.value)
    assert items.checksum("items") == before


# --- a UTF-8 byte-order mark ---------------------------------------------------------------

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("fmt", ["csv", "text"])
@pytest.mark.parametrize("header", [False, True])
@pytest.mark.parametrize("compressed", [False, True])
def test_byte_order_mark_loads(db, tmp_path, fmt, header, compressed):
    db.run(psql.SQL("CREATE TABLE {} (id int, name text)").format(db.ident("bom")))
    sep = "," if fmt == "csv" else "\t"
    lines = (["id" + sep + "name"] if header else []) + [f"{n}{sep}n{n}" for n in range(1, 401)]
    data = BOM + ("\n".join(lines) + "\n").encode()
    path = tmp_path / ("bom.csv.gz" if compressed else "bom.csv")
    path.write_bytes(gzip.compress(data) if compressed else data)

    summary = runner.load(
        lambda: open_connection(db.dsn, "psycopg"), db.table("bom"), str(path),
        mode="replace", format=fmt, header=header, partitions=1 if compressed else 3,
    )  # fmt: skip

    assert summary.rows == 400
    assert db.run(f"SELECT min(id), max(id), min(name) FROM {db.schema}.bom") == [(1, 400, "n1")]


def test_where_no_row_can_be_told_the_files_are_named(items, tmp_path):
    """With on_error="reject", rows COPY set aside stop the second reading: the files are
    named instead of a line."""
    _write(tmp_path, {2: 77})  # b.csv line 45: a parent that does not exist
    a = (tmp_path / "a.csv").read_text().replace('"3","3","4","3"', '"3","3","4","x"', 1)
    (tmp_path / "a.csv").write_text(a)  # a.csv line 3: qty is not a number, set aside
    before = items.checksum("items")

    with pytest.raises(ConstraintViolationError) as failed:
        runner.load(
            lambda: open_connection(items.dsn, "psycopg"), items.table("items"),
            str(tmp_path / "*.csv"), mode="append", strategy="in_place", partitions=6,
            on_error="reject", max_rejects=5,
        )  # fmt: skip

    message = str(failed.value)
    assert "items_parent_fkey" in message and "the offending rows came from" in message
    assert all(f"{tmp_path}/{name}.csv" in message for name in FILES)
    assert failed.value.rows == ()
    assert items.checksum("items") == before


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_foreign_key_of_the_table_to_itself(db, tmp_path, mode):
    """A row may reference a row of the target or another loaded row; the one referencing
    neither is named."""
    db.run(
        psql.SQL("CREATE TABLE {0} (id int PRIMARY KEY, up int REFERENCES {0})").format(
            db.ident("nodes")
        )
    )
    db.run(f"INSERT INTO {db.schema}.nodes VALUES (1, NULL), (2, 1)")
    before = db.checksum("nodes")
    (tmp_path / "n.csv").write_text("10,1\n11,12\n12,10\n13,99\n14,\n")

    with pytest.raises(ConstraintViolationError) as failed:
        runner.load(
            lambda: open_connection(db.dsn, "psycopg"), db.table("nodes"),
            str(tmp_path / "n.csv"), mode=mode, strategy="in_place",
        )  # fmt: skip

    assert f"{tmp_path}/n.csv line 4" in str(failed.value)
    assert db.checksum("nodes") == before


@pytest.mark.parametrize("fmt", ["csv", "text"])
def test_the_line_counts_the_header_in_both_formats(items, tmp_path, fmt):
    sep = "," if fmt == "csv" else "\t"
    for k, name in enumerate(("a", "b")):
        lines = [sep.join(("id", "code", "qty"))]
        lines += [sep.join(str(k * 1000 + n) for _ in range(2)) + f"{sep}1" for n in range(1, 81)]
        if k == 1:
            lines[70] = sep.join(("1070", "12", "1"))  # line 71 of b: a.csv line 13's code
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    before = items.checksum("items")

    with pytest.raises(ConstraintViolationError) as failed:
        runner.load(
            lambda: open_connection(items.dsn, "psycopg"), items.table("items"),
            str(tmp_path / "*.txt"), mode="append", strategy="in_place", format=fmt,
            header=True, partitions=4,
        )  # fmt: skip

    assert f"{tmp_path}/a.txt line 13 and {tmp_path}/b.txt line 71" in str(failed.value)
    assert items.checksum("items") == before
