"""Big files split at guessed record starts (source/window.py, realign.py) against a real
server: the load equals one plain COPY of the same bytes (count and checksum), whether the
guesses were right or the chain check found one wrong and finalize loaded the affected ranges
again."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import create_items, multiline_rows, plain_copy_checksum, repaired_partitions
from psycopg import sql

from airflow_pg_bulk import runner, steps
from airflow_pg_bulk.db.driver import connect
from airflow_pg_bulk.errors import BadDataError, TransientLoadError
from airflow_pg_bulk.loading import copy as copy_step
from airflow_pg_bulk.plan import request_from_options
from airflow_pg_bulk.source.boundaries import record_starts
from airflow_pg_bulk.source.syntax import RecordSyntax

CSV = RecordSyntax()


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_split_points_inside_quoted_multiline_fields(db, tmp_path: Path, newline: bytes) -> None:
    create_items(db)
    path = tmp_path / "big.csv"
    data = multiline_rows(8_000, newline)
    path.write_bytes(data)
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    # the nominal split points fall inside quoted fields: the next line is no record start
    points = [len(data) * k // 4 for k in (1, 2, 3)]
    inside = [t for t in points if data.index(b"\n", t) + 1 not in record_starts(path, [t], CSV)]
    assert inside

    summary = runner.load(db.dsn, db.table("items"), str(path), mode="replace", partitions=4)

    assert summary.rows == expected[0] == 8_000
    assert db.checksum("items") == expected


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_a_wrong_guess_is_found_by_the_chain_and_repaired(
    db, tmp_path: Path, newline: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Long quoted fields of quote-free lines: the guessed starts fall inside them, the COPY
    tasks before them do not end cleanly, and finalize loads the affected ranges again."""
    create_items(db)
    path = tmp_path / "tricky.csv"
    path.write_bytes(multiline_rows(300, newline, long_note_every=60))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    caplog.set_level(logging.WARNING, logger="airflow_pg_bulk")

    summary = runner.load(db.dsn, db.table("items"), str(path), mode="append", partitions=4)

    assert repaired_partitions(caplog)  # the repair ran
    assert summary.rows == expected[0] == 300
    assert db.checksum("items") == expected


def test_bad_data_past_a_guessed_start_names_its_line(db, tmp_path: Path) -> None:
    """A real error in a speculative piece is still bad data, named by its line in the file."""
    create_items(db)
    data = bytearray(multiline_rows(8_000, b"\n"))
    at = data.index(b"\n6000,")
    data[at + 1 : at + 6] = b"oops!"
    path = tmp_path / "bad.csv"
    path.write_bytes(bytes(data))
    line = 1 + bytes(data[: at + 1]).count(b"\n")

    with pytest.raises(BadDataError) as info:
        runner.load(db.dsn, db.table("items"), str(path), mode="replace", partitions=4)

    assert f"lines {line}-{line + 2}" in str(info.value)  # the record spans three lines
    assert db.scalar("SELECT count(*) FROM {}".format(db.table("items"))) == 0


def _notes_file(path: Path) -> bytes:
    """One text column: short rows, then two long quoted fields of quote-free lines (each
    line reads as a row if the field's start is missed), split into 3 ranges whose guessed
    starts both fall inside them: the middle range reads as rows without an error."""
    short = b"".join(b"row %d\n" % i for i in range(12_000))  # ~100 KB
    long_a = b'"' + b"".join(b"a line %d\n" % i for i in range(30_000)) + b'"\n'  # ~300 KB
    long_b = b'"' + b"".join(b"b line %d\n" % i for i in range(30_000)) + b'"\n'
    data = short + long_a + short + long_b + short
    path.write_bytes(data)
    return data


@contextlib.contextmanager
def _notes_prepared(db, tmp_path: Path) -> Iterator[tuple[Any, Any, tuple]]:
    """A connection, the plan of an append of :func:`_notes_file` into notes(t text) in 3
    ranges, and the checksum of one plain COPY of it; cleanup afterwards."""
    db.run(sql.SQL("CREATE TABLE {} (t text)").format(db.ident("notes")))
    path = tmp_path / "notes.csv"
    _notes_file(path)
    expected = plain_copy_checksum(db, path, "FORMAT csv", like="notes")
    request = request_from_options(db.table("notes"), str(path), mode="append", partitions=3)
    conn = connect(db.dsn, "psycopg")
    load_id = uuid.uuid4().hex[:12]
    try:
        yield conn, steps.prepare(conn, request, load_id), expected
    finally:
        steps.cleanup(conn, db.schema, load_id)
        conn.close()


def test_a_range_that_loaded_misread_rows_is_deleted_and_loaded_again(db, tmp_path: Path):
    """Both bounds of the middle range were guessed wrong the same way, so its COPY loaded
    rows (misread) and committed; the ranges beside it did not end cleanly, and finalize
    deletes the middle range's rows (by the transaction that wrote them) and loads all three
    again: the table equals one plain COPY."""
    with _notes_prepared(db, tmp_path) as (conn, plan, expected):
        in_order = sorted(plan.partitions, key=lambda p: p.pieces[0].start)
        results = [steps.copy_partition(conn, plan, p.index) for p in in_order]
        assert [r.rows > 0 for r in results] == [False, True, False]  # the middle one misread
        summary = steps.finalize(conn, plan)
    assert summary.rows == expected[0]
    assert db.checksum("notes") == expected


def test_a_repair_cut_short_is_finished_by_the_next_finalize(db, tmp_path, monkeypatch):
    real = steps.copy_partition
    calls = []

    def dies_on_the_second(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:
            raise TransientLoadError("the worker died mid-repair")
        return real(*args, **kwargs)

    with _notes_prepared(db, tmp_path) as (conn, plan, expected):
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        monkeypatch.setattr(copy_step, "copy_partition", dies_on_the_second)
        with pytest.raises(TransientLoadError):
            steps.finalize(conn, plan)
        assert db.checksum("notes")[0] == 0  # nothing visible
        monkeypatch.setattr(copy_step, "copy_partition", real)
        summary = steps.finalize(conn, plan)
    assert summary.rows == expected[0]
    assert db.checksum("notes") == expected
