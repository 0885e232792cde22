"""End-to-end loads on a real server, under both drivers: the rows match a plain COPY."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import (
    create_items,
    gzip_file,
    leftovers,
    plain_copy_checksum,
    rows,
    write_csv,
    write_text_format,
)

from airflow_pg_bulk import runner, steps
from airflow_pg_bulk.plan import CopyOptions, LoadRequest
from airflow_pg_bulk.source import reading


def test_csv_with_quoted_newlines_split_in_four_matches_plain_copy(db, connect, tmp_path):
    data = rows(3000)
    path = write_csv(tmp_path / "items.csv", data)
    create_items(db)
    expected = plain_copy_checksum(db, path, "FORMAT csv")

    summary = runner.load(connect, db.table("items"), str(path), mode="replace", partitions=4)

    assert summary.partitions == 4
    assert summary.rows == 3000
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_crlf_csv_with_header_split_in_partitions(db, connect, tmp_path):
    data = rows(2000, seed=3)
    path = write_csv(
        tmp_path / "items.csv",
        data,
        lineterminator="\r\n",
        header=["note", "day", "amount", "name", "id"][::-1],
    )
    create_items(db)
    expected = plain_copy_checksum(db, path, "FORMAT csv, HEADER true")

    summary = runner.load(
        connect, db.table("items"), str(path), mode="replace", header=True, partitions=5
    )

    assert summary.partitions >= 4
    assert db.checksum("items") == expected


def test_header_in_other_order_is_mapped_by_name(db, connect, tmp_path):
    path = tmp_path / "reordered.csv"
    path.write_text('note,ID,name,day,amount\n"x\ny",1,a,2024-01-01,1.50\n,2,b,,2\n')
    create_items(db)

    runner.load(connect, db.table("items"), str(path), mode="replace", header=True)

    assert db.run(
        f"SELECT id, name, amount::text, day::text, note FROM {db.schema}.items ORDER BY id"
    ) == [(1, "a", "1.50", "2024-01-01", "x\ny"), (2, "b", "2.00", None, None)]


def test_gzip_files_match_plain_copy(db, connect, tmp_path):
    create_items(db)
    for n in range(5):
        data = [(r[0] + n * 1000, *r[1:]) for r in rows(600 + 100 * n, seed=n)]
        gzip_file(write_csv(tmp_path / f"part{n}.csv", data))
    whole = tmp_path / "whole.csv"
    whole.write_bytes(b"".join((tmp_path / f"part{n}.csv").read_bytes() for n in range(5)))
    expected = plain_copy_checksum(db, whole, "FORMAT csv")

    summary = runner.load(
        connect, db.table("items"), str(tmp_path / "part*.csv.gz"), mode="replace", partitions=4
    )

    assert summary.partitions == 4
    assert db.checksum("items") == expected


def test_text_format_matches_plain_copy(db, connect, tmp_path):
    path = write_text_format(tmp_path / "items.tsv", rows(2500, seed=11))
    create_items(db)
    expected = plain_copy_checksum(db, path, "FORMAT text")

    summary = runner.load(
        connect, db.table("items"), str(path), mode="replace", format="text", partitions=4
    )

    assert summary.partitions == 4
    assert db.checksum("items") == expected


def test_glob_of_many_files_grouped_into_partitions(db, connect, tmp_path):
    create_items(db)
    chunks = []
    for n in range(12):
        data = [(r[0] + n * 10_000, *r[1:]) for r in rows(100 + 37 * n, seed=n)]
        chunks.append(write_csv(tmp_path / f"day-{n:02d}.csv", data))
    whole = tmp_path / "all.data"
    whole.write_bytes(b"".join(p.read_bytes() for p in chunks))
    expected = plain_copy_checksum(db, whole, "FORMAT csv")

    summary = runner.load(
        connect, db.table("items"), str(tmp_path / "day-*.csv"), mode="replace", partitions=4
    )

    assert summary.partitions == 4
    assert db.checksum("items") == expected


def test_append_adds_rows_and_keeps_existing(db, connect, tmp_path):
    create_items(db)
    db.run(f"INSERT INTO {db.schema}.items VALUES (-1, 'old', 1, NULL, NULL)")
    path = write_csv(tmp_path / "items.csv", rows(500))

    summary = runner.load(connect, db.table("items"), str(path), mode="append", partitions=2)

    assert summary.rows == 500
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 501
    assert db.scalar(f"SELECT name FROM {db.schema}.items WHERE id = -1") == "old"
    assert leftovers(db) == []


def test_copy_task_retried_after_failure_and_after_commit_loads_once(
    db, connect, tmp_path, monkeypatch
):
    path = write_csv(tmp_path / "items.csv", rows(4000))
    create_items(db)
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    request = LoadRequest(
        mode="replace", table=db.table("items"), source=(str(path),), partitions=4
    )
    conn = connect()
    plan = steps.prepare(conn, request, "0123456789ab")

    real_chunks = reading.piece_chunks

    def failing_halfway(piece, opts, chunk_size=1 << 20, **kwargs):
        chunks = real_chunks(piece, opts, chunk_size=256, **kwargs)
        for n, chunk in enumerate(chunks):
            if n == 10:
                raise OSError("network file system went away")
            yield chunk

    monkeypatch.setattr(reading, "piece_chunks", failing_halfway)
    with pytest.raises(OSError, match="went away"):
        steps.copy_partition(connect(), plan, 1)
    monkeypatch.setattr(reading, "piece_chunks", real_chunks)

    results = [steps.copy_partition(connect(), plan, p.index) for p in plan.partitions]
    again = steps.copy_partition(connect(), plan, 1)  # retried after it committed

    assert not any(r.skipped for r in results)
    assert again.skipped and again.rows == results[1].rows
    summary = steps.finalize(conn, plan)
    steps.cleanup(conn, db.schema, plan.load_id)
    assert summary.rows == 4000
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_prepare_is_rerunnable_and_cleanup_idempotent(db, connect, tmp_path):
    path = write_csv(tmp_path / "items.csv", rows(100))
    create_items(db)
    request = LoadRequest(
        mode="replace", table=db.table("items"), source=(str(path),), partitions=2
    )
    conn = connect()
    steps.prepare(conn, request, "aaaaaaaaaaaa")
    plan = steps.prepare(conn, request, "aaaaaaaaaaaa")
    for part in plan.partitions:
        steps.copy_partition(conn, plan, part.index)
    steps.finalize(conn, plan)

    assert steps.cleanup(conn, db.schema, plan.load_id) == [plan.ledger_table]
    assert steps.cleanup(conn, db.schema, plan.load_id) == []
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 100


def test_request_validation_errors_are_clear():
    with pytest.raises(ValueError, match="mode must be one of"):
        LoadRequest(table="t", source=("x",), mode="upsert-ish")
    with pytest.raises(ValueError, match="single one-byte"):
        CopyOptions(delimiter="ab")
    with pytest.raises(ValueError, match="either header=True"):
        LoadRequest(
            mode="replace", table="t", source=("x",), columns=("a",), copy=CopyOptions(header=True)
        )


def test_missing_source_is_refused_before_anything_changes(db, connect, tmp_path):
    create_items(db)
    with pytest.raises(steps.LoadRefusedError, match="matched no files"):
        runner.load(connect, db.table("items"), str(tmp_path / "nothing-*.csv"), mode="replace")
    with pytest.raises(steps.LoadRefusedError, match="does not exist"):
        runner.load(connect, db.table("missing_table"), str(Path(__file__)), mode="replace")
    assert leftovers(db) == []


def test_append_into_generated_always_identity_takes_the_files_ids(db, connect, tmp_path):
    # plain COPY accepts values for a GENERATED ALWAYS identity column; so must append
    db.run(
        f"CREATE TABLE {db.schema}.ev (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " what text)"
    )
    db.run(f"INSERT INTO {db.schema}.ev (what) VALUES ('generated')")
    path = tmp_path / "ev.csv"
    path.write_text("100,a\n101,b\n")

    runner.load(connect, db.table("ev"), str(path), mode="append")

    assert db.run(f"SELECT id, what FROM {db.schema}.ev ORDER BY id") == [
        (1, "generated"),
        (100, "a"),
        (101, "b"),
    ]
