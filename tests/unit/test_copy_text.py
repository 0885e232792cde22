"""The COPY text encoder of rows from a database source (no server: what each value becomes;
tests/test_db_source.py checks that PostgreSQL reads them back exactly)."""

from __future__ import annotations

import datetime
import decimal
import uuid

import pytest

from airflow_pg_bulk.source.copy_text import batch, field, of_batches, row


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


def test_row() -> None:
    assert row((1, None, "x\ty")) == "1\t\\N\tx\\ty\n"


#: columns each encoded by one path of :func:`batch`: one type, one type with NULLs, mixed
COLUMNS = [
    [1, 2, -3],
    [1, None, 10**30],
    [0.1, float("-inf"), 1e300],
    [None, 2.5, None],
    ["plain", "", "naïve 日本 🚀"],
    ["back\\slash", "tab\there", "cr\rlf\n"],
    [None, "\\N", "\\."],
    [None, "", None],
    [decimal.Decimal("1.50"), None, decimal.Decimal("-1E+2")],
    [datetime.date(2026, 1, 2), None, datetime.date(1, 1, 1)],
    [datetime.datetime(2026, 1, 2, 3, 4, 5, 6), datetime.datetime(2026, 1, 2), None],
    [True, False, None],
    [1, "x\ty", 2.5],  # mixed types: value by value
    [b"\x00\xff", None, bytearray(b"\\")],
    [None, None, None],
]


def test_batch_is_row_by_row() -> None:
    """Column by column, the same text as row by row, whatever each column holds."""
    rows = list(zip(*COLUMNS, strict=True))
    assert batch(rows) == "".join(map(row, rows))
    for column in COLUMNS:
        single = [(value,) for value in column]
        assert batch(single) == "".join(map(row, single)), column


def test_of_batches_one_chunk_per_batch() -> None:
    chunks = list(of_batches([[(1, "a")], [], [(2, None), (3, "c\nd")]]))
    assert chunks == [b"1\ta\n", b"2\t\\N\n3\tc\\nd\n"]
