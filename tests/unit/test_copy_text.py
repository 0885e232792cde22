"""The COPY text encoder of rows from a database source (no server: what each value becomes;
tests/test_db_source.py checks that PostgreSQL reads them back exactly)."""

from __future__ import annotations

import datetime
import decimal
import uuid

import pytest

from airflow_pg_bulk.source.copy_text import TextRows, field, row


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "\\N"),
        ("", ""),
        ("a\tb", "a\\tb"),
        ("a\nb", "a\\nb"),
        ("a\rb", "a\\rb"),
        ("a\\b", "a\\\\b"),
        ("\\N", "\\\\N"),  # the text, not a NULL
        ("\\.", "\\\\."),  # not the end-of-data marker
        ("naïve 日本 🚀", "naïve 日本 🚀"),
        (True, "t"),
        (False, "f"),
        (42, "42"),
        (decimal.Decimal("1.50"), "1.50"),
        (0.1, "0.1"),
        (float("inf"), "inf"),
        (b"\x00\xff", "\\\\x00ff"),
        (datetime.date(2026, 1, 2), "2026-01-02"),
        (datetime.datetime(2026, 1, 2, 3, 4, 5, 6), "2026-01-02T03:04:05.000006"),
        (datetime.timedelta(days=1, seconds=2), "1 days 2 seconds 0 microseconds"),
        ({"k": "a\tb"}, '{"k": "a\\\\tb"}'),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    ],
)
def test_field(value: object, text: str) -> None:
    assert field(value) == text


def test_row_and_chunks_count_rows() -> None:
    assert row((1, None, "x\ty")) == "1\t\\N\tx\\ty\n"
    rows = TextRows(((n, "v") for n in range(1000)), chunk_bytes=100)
    chunks = list(rows)
    assert len(chunks) > 1 and all(isinstance(c, bytes) for c in chunks)
    assert rows.rows == 1000
    assert rows.bytes == sum(map(len, chunks))
    assert b"".join(chunks).count(b"\n") == 1000
    empty = TextRows(iter(()))
    assert list(empty) == [] and empty.rows == 0
