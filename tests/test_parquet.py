"""Parquet sources (``format="parquet"``) against a real PostgreSQL, from local files, globs and
a real S3 endpoint (moto's server, fixture ``s3_server``): every supported type round-trips
exactly (compared with the same rows inserted by plain SQL: count and checksum), NULL stays
apart from the empty string, many row groups split over partitions, columns match by name in
any order, a value that cannot convert names file, row group, row and column, and a file
changed after prepare fails its partition."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import test_objects
from helpers import leftovers
from psycopg import sql
from servers import require
from test_objects import CONN_ID

from airflow_pg_bulk import runner, steps
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import request_from_options
from airflow_pg_bulk.source.objects import SourceChangedError

pa = require("pyarrow", "needs airflow-pg-bulk[parquet]")
pq = require("pyarrow.parquet", "needs airflow-pg-bulk[parquet]")
s3_conn = test_objects.s3_conn  # the fixture: credentials from an aws connection only

COLUMNS = (
    "id bigint PRIMARY KEY, name text, amount numeric(38,9), seen timestamp, "
    "at timestamptz, day date, ok boolean, ratio float8, blob bytea, small integer, "
    "clock time, note text DEFAULT 'from the default'"
)
TEXTS = ["", None, "a,b", 'say "hi"', "two\nlines", "tab\there", "\\.", "crlf\r\n", "ünï €"]
PARIS = dt.timezone(dt.timedelta(hours=1))


def _rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    """Rows with every type, NULLs in every column but id, and awkward strings."""
    out = []
    for i in range(start, start + count):
        null = i % 7 == 3
        out.append(
            {
                "id": i,
                "name": TEXTS[i % len(TEXTS)],
                "amount": None if null else Decimal(f"{i * 7919 - 50000}.{i:09d}"[:30]),
                "seen": None if null else dt.datetime(2024, 2, 29, 23, 59, 58, i % 1000000),
                "at": None if null else dt.datetime(2021, 3, 28, 1, 30, i % 60, 123456, PARIS),
                "day": None if null else dt.date(1999, 12, 31) + dt.timedelta(days=i),
                "ok": None if null else i % 2 == 0,
                "ratio": None if null else [0.1, 1 / 3, -2.5e-300, float("inf"), 1e300][i % 5],
                "blob": None if null else bytes([i % 256, 0, 255, 10, 44, 34]),
                "small": None if null else (i % 5000) - 2500,
                "clock": None if null else dt.time(i % 24, 59, 59, 999999),
            }
        )
    return out


def _schema() -> Any:
    return pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("amount", pa.decimal128(38, 9)),
            ("seen", pa.timestamp("us")),
            ("at", pa.timestamp("us", tz="Europe/Paris")),
            ("day", pa.date32()),
            ("ok", pa.bool_()),
            ("ratio", pa.float64()),
            ("blob", pa.binary()),
            ("small", pa.int32()),
            ("clock", pa.time64("us")),
        ]
    )


def _write(path: Path, rows: list[dict[str, Any]], row_group_size: int = 40, **kw: Any) -> Path:
    table = pa.Table.from_pylist(rows, schema=kw.pop("schema", _schema()))
    pq.write_table(table, path, row_group_size=row_group_size, **kw)
    return path


def _create(db: Any, name: str) -> None:
    db.run(sql.SQL("CREATE TABLE {} (" + COLUMNS + ")").format(db.ident(name)))


def _reference(db: Any, rows: list[dict[str, Any]], name: str = "reference") -> tuple[int, str]:
    """The same rows inserted by plain SQL (psycopg's parameters): the expected checksum."""
    _create(db, name)
    columns = list(rows[0])
    statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        db.ident(name),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    )
    with db.conn.cursor() as cur:
        cur.executemany(statement, [tuple(r[c] for c in columns) for r in rows])
    return db.checksum(name)


@contextmanager
def _prepared(db: Any, source: str, **options: Any) -> Iterator[tuple[Any, Any]]:
    """``(connection, plan)`` of a prepared Parquet load into ``target``; cleaned up after."""
    request = request_from_options(db.table("target"), source, format="parquet", **options)
    with test_objects._planned(db, request) as planned:
        yield planned


def test_every_type_round_trips_exactly_over_many_row_groups_and_partitions(db, driver, tmp_path):
    rows = _rows(360)
    _write(tmp_path / "a.parquet", rows[:200])
    _write(tmp_path / "b.parquet", rows[200:], row_group_size=25)
    (tmp_path / "notes.txt").write_text("not matched by the glob\n")
    _create(db, "target")
    expected = _reference(db, rows)

    summary = runner.load(
        db.dsn, db.table("target"), str(tmp_path / "*.parquet"), mode="replace",
        format="parquet", partitions=3, driver=driver,
    )  # fmt: skip

    assert summary.rows == 360 and summary.partitions == 3
    assert db.checksum("target") == expected
    # NULL and the empty string stay apart; quotes, delimiters and newlines intact
    got = dict(db.run(sql.SQL("SELECT id, name FROM {}").format(db.ident("target"))))
    assert [got[i] for i in range(len(TEXTS))] == TEXTS
    # the target's column the files lack got its default
    (notes,) = db.run(sql.SQL("SELECT DISTINCT note FROM {}").format(db.ident("target")))
    assert notes == ("from the default",)
    assert leftovers(db) == []


def test_row_groups_are_cut_into_pieces_packed_into_partitions(db, tmp_path):
    _write(tmp_path / "a.parquet", _rows(300), row_group_size=20)  # 15 row groups
    _create(db, "target")
    with _prepared(db, str(tmp_path / "a.parquet"), mode="append", partitions=3) as (conn, plan):
        pieces = [p for part in plan.partitions for p in part.pieces]
        groups = sorted(g for p in pieces for g in p.row_groups)
        assert len(plan.partitions) == 3 and groups == list(range(15))
        for piece in pieces:  # consecutive row groups, the bytes they span
            assert list(piece.row_groups) == list(
                range(piece.row_groups[0], piece.row_groups[-1] + 1)
            )
            assert 4 <= piece.start < piece.end <= piece.source_size
        results = [steps.copy_partition(conn, plan, part.index) for part in plan.partitions]
        assert sum(r.rows for r in results) == 300
        steps.finalize(conn, plan)
    assert db.checksum("target")[0] == 300


def test_columns_match_by_name_in_any_order_and_case(db, tmp_path):
    rows = _rows(50)
    shuffled = pa.schema(
        [_schema().field(n.lower()).with_name(n) for n in ("ok", "ID", "day", "name", "small")]
    )
    renamed = [{("ID" if k == "id" else k): v for k, v in r.items()} for r in rows]
    _write(tmp_path / "a.parquet", renamed, schema=shuffled)
    _create(db, "target")

    runner.load(db.dsn, db.table("target"), str(tmp_path / "a.parquet"), mode="replace",
                format="parquet")  # fmt: skip

    got = db.run(
        sql.SQL("SELECT id, ok, day, name, small, amount FROM {} ORDER BY id").format(
            db.ident("target")
        )
    )
    assert got == [(r["id"], r["ok"], r["day"], r["name"], r["small"], None) for r in rows]


def test_a_column_the_target_lacks_is_refused_naming_it(db, tmp_path):
    schema = _schema().append(pa.field("extra", pa.string()))
    _write(tmp_path / "a.parquet", [{**r, "extra": "x"} for r in _rows(5)], schema=schema)
    _create(db, "target")

    with pytest.raises(LoadRefusedError) as refused:
        runner.load(db.dsn, db.table("target"), str(tmp_path / "a.parquet"), mode="replace",
                    format="parquet")  # fmt: skip

    assert "['extra']" in str(refused.value) and "match no column" in str(refused.value)
    assert leftovers(db) == []


def test_a_nested_column_is_refused_naming_file_and_column(db, tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1], "name": pa.array([[1, 2]], pa.list_(pa.int32()))}), path)
    _create(db, "target")

    with pytest.raises(LoadRefusedError) as refused:
        runner.load(db.dsn, db.table("target"), str(path), mode="replace", format="parquet")

    assert str(path) in str(refused.value) and "'name'" in str(refused.value)
    assert "nested types" in str(refused.value)


def test_a_value_that_cannot_convert_names_file_row_group_row_and_column(db, driver, tmp_path):
    rows = _rows(100)
    rows[57]["small"] = 2**40  # int64 in the file; out of range for the integer column
    schema = _schema().set(9, pa.field("small", pa.int64()))
    path = _write(tmp_path / "a.parquet", rows, row_group_size=20, schema=schema)
    _create(db, "target")
    db.run(sql.SQL("INSERT INTO {} (id) VALUES (-1)").format(db.ident("target")))

    with pytest.raises(BadDataError) as failed:
        runner.load(db.dsn, db.table("target"), str(path), mode="replace", format="parquet",
                    partitions=2, driver=driver)  # fmt: skip

    message = str(failed.value)
    assert f"{path} row group 2, row 17 (row 57 of the file" in message, message
    assert "column small" in message and str(2**40) in message
    assert failed.value.path == str(path) and failed.value.column == "small"
    assert db.checksum("target")[0] == 1 and leftovers(db) == []


def test_upsert_latest_row_in_source_order_wins_across_files_and_row_groups(db, tmp_path):
    first, second = _rows(120), _rows(60, start=90)  # ids 90..119 in both files
    for row in second:
        row["name"] = f"second {row['id']}"
    _write(tmp_path / "a.parquet", first, row_group_size=25)
    _write(tmp_path / "b.parquet", second, row_group_size=25)
    _create(db, "target")
    by_id = {r["id"]: r for r in first} | {r["id"]: r for r in second}
    expected = _reference(db, [by_id[i] for i in sorted(by_id)])

    summary = runner.load(db.dsn, db.table("target"), str(tmp_path / "*.parquet"),
                          mode="upsert", format="parquet", partitions=3)  # fmt: skip

    assert summary.rows == 180 and db.checksum("target") == expected


def test_memory_stays_at_about_a_row_group(db, tmp_path, monkeypatch):
    """Arrow's allocations while a file of 12 row groups loads stay at a few row groups'
    worth of decoded data, the same for the last group as for the first (the whole file
    decoded would be 12)."""
    from airflow_pg_bulk.source import parquet

    text = "x" * 200
    rows = [{"id": i, "name": f"{text}{i}"} for i in range(12 * 4000)]
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    path = _write(tmp_path / "a.parquet", rows, row_group_size=4000, schema=schema)
    group_bytes = pa.Table.from_pylist(rows[:4000], schema=schema).nbytes
    _create(db, "target")
    peaks: list[int] = []
    encode = parquet.encode

    def measured(*args: Any, **kwargs: Any) -> bytes:
        peaks.append(pa.total_allocated_bytes())
        return encode(*args, **kwargs)

    monkeypatch.setattr(parquet, "encode", measured)
    runner.load(db.dsn, db.table("target"), str(path), mode="replace", format="parquet",
                partitions=1)  # fmt: skip

    assert len(peaks) == 12 and db.checksum("target")[0] == 12 * 4000
    # Arrow's readers and buffers hold about two row groups' worth here, whichever group is
    # encoded: nothing grows with the groups read
    assert max(peaks) < 4 * group_bytes, (peaks, group_bytes)
    assert max(peaks) - peaks[0] < group_bytes / 4, (peaks, group_bytes)


def test_a_damaged_row_group_names_file_and_row_group(db, tmp_path):
    path = _write(tmp_path / "a.parquet", _rows(100), row_group_size=25)
    chunk = pq.ParquetFile(path).metadata.row_group(2).column(1)  # name: a dictionary page
    data = bytearray(path.read_bytes())
    for k in range(chunk.data_page_offset, chunk.data_page_offset + 16):
        data[k] ^= 0xFF  # the page header: same size, same footer
    path.write_bytes(bytes(data))
    _create(db, "target")

    with pytest.raises(BadDataError) as failed:
        runner.load(db.dsn, db.table("target"), str(path), mode="replace", format="parquet")

    assert f"{path} row group 2: cannot read it" in str(failed.value)
    assert db.checksum("target")[0] == 0 and leftovers(db) == []


def test_a_file_changed_after_prepare_fails_its_partition(db, tmp_path):
    path = _write(tmp_path / "a.parquet", _rows(100), row_group_size=30)
    _create(db, "target")
    with _prepared(db, str(path), mode="replace") as (conn, plan):
        _write(path, _rows(100, start=1000), row_group_size=30)  # same shape, other rows
        with pytest.raises(SourceChangedError) as changed:
            steps.copy_partition(conn, plan, 0)
        assert str(path) in str(changed.value)
    assert db.checksum("target")[0] == 0


# --- object storage ----------------------------------------------------------------------------


def test_objects_through_a_connection_equal_plain_sql(db, s3_conn, tmp_path):
    rows = _rows(240)
    bucket = s3_conn.bucket()
    for k in range(3):
        path = _write(tmp_path / f"p{k}.parquet", rows[k * 80 : (k + 1) * 80], row_group_size=16)
        s3_conn.client().put_object(Bucket=bucket, Key=f"in/p{k}.parquet", Body=path.read_bytes())
    s3_conn.client().put_object(Bucket=bucket, Key="in/readme.txt", Body=b"not parquet")
    _create(db, "target")
    expected = _reference(db, rows)

    summary = runner.load(
        db.dsn, db.table("target"), f"s3://{bucket}/in/*.parquet", mode="replace",
        format="parquet", partitions=3, source_conn_id=CONN_ID,
    )  # fmt: skip

    assert summary.rows == 240 and db.checksum("target") == expected
    assert leftovers(db) == []


def test_an_object_replaced_after_prepare_fails_its_partition(db, s3_conn, tmp_path):
    bucket = s3_conn.bucket()
    path = _write(tmp_path / "a.parquet", _rows(60))
    s3_conn.client().put_object(Bucket=bucket, Key="a.parquet", Body=path.read_bytes())
    _create(db, "target")
    url = f"s3://{bucket}/a.parquet"
    with _prepared(db, url, mode="replace", source_conn_id=CONN_ID) as (conn, plan):
        piece = plan.partitions[0].pieces[0]
        assert piece.etag and piece.source_size == path.stat().st_size
        other = _write(tmp_path / "b.parquet", _rows(60, start=500))
        s3_conn.client().put_object(Bucket=bucket, Key="a.parquet", Body=other.read_bytes())
        with pytest.raises(SourceChangedError) as changed:
            steps.copy_partition(conn, plan, 0)
        assert f"s3://{bucket}/a.parquet" in str(changed.value)
    assert db.checksum("target")[0] == 0


def test_an_object_replaced_while_its_row_groups_are_read_fails(db, s3_conn, tmp_path, monkeypatch):
    """Replaced between two row groups (the COPY task's progress callback runs between them):
    the next range request, conditional on the ETag prepare recorded, fails the partition."""
    from airflow_pg_bulk.loading import parquet_copy
    from airflow_pg_bulk.source import objects

    bucket = s3_conn.bucket()
    rows = [{**r, "name": f"{r['name']}{'z' * 300}"} for r in _rows(2000)]
    path = _write(tmp_path / "a.parquet", rows, row_group_size=250, compression="none")
    s3_conn.client().put_object(Bucket=bucket, Key="a.parquet", Body=path.read_bytes())
    _create(db, "target")
    monkeypatch.setattr(objects, "BLOCK_SIZE", 64 << 10)  # a range request per 64 KiB
    monkeypatch.setattr(parquet_copy, "PROGRESS_SECONDS", 0.0)  # a call after every row group
    replaced = []

    def replace(done: int, expected: int) -> None:
        if not replaced:
            body = path.read_bytes().replace(b"zzz", b"yyy")  # same size, another ETag
            s3_conn.client().put_object(Bucket=bucket, Key="a.parquet", Body=body)
            replaced.append(done)

    url = f"s3://{bucket}/a.parquet"
    with _prepared(db, url, mode="replace", source_conn_id=CONN_ID) as (conn, plan):
        with pytest.raises(SourceChangedError) as changed:
            steps.copy_partition(conn, plan, 0, replace)
        assert replaced and url in str(changed.value)
        assert "replaced while it was read" in str(changed.value)
    assert db.checksum("target")[0] == 0


def test_create_target_from_a_parquet_files_schema(db, connect, tmp_path):
    """A missing target made from the first file's Arrow types: each the PostgreSQL type that
    holds its values exactly (unsigned integers one size wider), NOT NULL where the file
    declares a column non-nullable, no key (Parquet has none); the rows load as into a table
    made by hand; an existing target is not altered; a type with no exact PostgreSQL
    equivalent is refused before anything is made."""
    schema = _schema().set(0, pa.field("id", pa.int64(), nullable=False))
    schema = schema.append(pa.field("counter", pa.uint32())).append(
        pa.field("label", pa.dictionary(pa.int8(), pa.string()))
    )
    rows = [dict(r, counter=2**32 - 1 - r["id"], label="x" if r["id"] % 2 else None)
            for r in _rows(50)]  # fmt: skip
    source = str(_write(tmp_path / "typed.parquet", rows, schema=schema))
    table = db.table("created")
    summary = runner.load(connect, table, source, format="parquet", mode="replace",
                          create_target=True)  # fmt: skip
    assert summary.rows == 50
    catalog = (
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    )
    assert db.run(catalog, table) == [
        ("id", "bigint", True), ("name", "text", False), ("amount", "numeric(38,9)", False),
        ("seen", "timestamp without time zone", False),
        ("at", "timestamp with time zone", False), ("day", "date", False),
        ("ok", "boolean", False), ("ratio", "double precision", False),
        ("blob", "bytea", False), ("small", "integer", False),
        ("clock", "time without time zone", False), ("counter", "bigint", False),
        ("label", "text", False),
    ]  # fmt: skip
    keys = "SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype <> 'n'"
    assert db.scalar(keys, table) == 0  # PostgreSQL 18 lists NOT NULL as constraints too
    # the same values as plain SQL inserts them into the columns made by hand
    by_hand = [{k: v for k, v in r.items() if k not in ("counter", "label")} for r in rows]
    expected = _reference(db, by_hand)
    db.run(sql.SQL("ALTER TABLE {} DROP COLUMN counter, DROP COLUMN label, ADD COLUMN note text"
                   " DEFAULT 'from the default'").format(db.ident("created")))  # fmt: skip
    assert db.checksum("created") == expected
    # an existing target is left as it is (the load appends into it, the columns unchanged)
    before = db.run(catalog, table)
    plain = str(_write(tmp_path / "plain.parquet", _rows(5, start=100)))
    runner.load(connect, table, plain, format="parquet", mode="append", create_target=True)
    assert db.run(catalog, table) == before
    # a column of nulls only has no type to take
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"id": [1], "nothing": pa.nulls(1)}), nulls)
    with pytest.raises(LoadRefusedError, match=r"'nothing' of .* is null, which has no exact"):
        runner.load(connect, db.table("never"), str(nulls), format="parquet", mode="replace",
                    create_target=True)  # fmt: skip
    assert db.scalar("SELECT to_regclass(%s)", db.table("never")) is None
    # csv: no schema to take types from
    with pytest.raises(ValueError, match="create the table first for csv files"):
        runner.load(connect, db.table("never"), plain, mode="replace", create_target=True)
