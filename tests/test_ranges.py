"""Big files split at guessed record starts (ranges.py, realign.py) against a real server: the
load equals one plain COPY of the same bytes (count and checksum), whether the guesses were
right or the chain check found one wrong and finalize loaded the affected ranges again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers import create_items, multiline_rows, plain_copy_checksum

from airflow_pg_bulk import runner
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.splitting import RecordSyntax, record_starts

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

    assert "loading partitions" in caplog.text  # the repair ran
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
