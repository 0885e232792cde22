"""airflow_pg_bulk.source: records, boundaries, lines, header and charsets: pure functions on
bytes (no server)."""

from __future__ import annotations

import io

import pytest

from airflow_pg_bulk.source import boundaries, charsets, header, lines, records
from airflow_pg_bulk.source.records import MarkerRule, RecordCounter, RecordError
from airflow_pg_bulk.source.syntax import RecordSyntax

CSV = RecordSyntax("csv")
TEXT = RecordSyntax("text")


def count(data: bytes, syntax: RecordSyntax, rule: MarkerRule, chunk: int = 3, **kw) -> int:
    counter = RecordCounter(syntax, rule, **kw)
    for i in range(0, len(data), chunk):
        counter.feed(data[i : i + chunk])
    return counter.finish()


@pytest.mark.parametrize("chunk", [1, 2, 5, 1 << 20])
def test_quoted_newlines_do_not_end_a_csv_record(chunk: int) -> None:
    data = b'1,"a\nb"\r\n2,"c""\r\nd"\r\n3,e'
    assert count(data, CSV, MarkerRule.NONE, chunk) == 3


def test_an_escaped_newline_does_not_end_a_text_record() -> None:
    assert count(b"a\\\nb\nc\\\\\nd\n", TEXT, MarkerRule.ANYWHERE) == 3


def test_a_marker_with_rows_after_it_is_refused() -> None:
    with pytest.raises(RecordError) as info:
        count(b"1\n\\.\n2\n", TEXT, MarkerRule.ALONE)
    assert info.value.line == 2
    assert count(b"1\n\\.\n", TEXT, MarkerRule.ALONE) == 1  # nothing after it: harmless
    assert count(b'1\n"\\."\n', CSV, MarkerRule.RECORD_START) == 2  # quoted: data


def test_a_later_piece_must_end_its_first_line_like_the_file() -> None:
    with pytest.raises(RecordError):
        count(b"1\n2\n", CSV, MarkerRule.NONE, expected_newline=b"\r\n", first_line=5)


def test_marker_rules_per_format_and_version() -> None:
    assert records.marker_rule("csv", 150000) is MarkerRule.RECORD_START
    assert records.marker_rule("csv", 180000) is MarkerRule.NONE
    assert records.marker_rule("text", 170004) is MarkerRule.ANYWHERE
    assert records.marker_rule("text", 180001) is MarkerRule.ALONE


def test_record_starts_skip_quoted_newlines(tmp_path) -> None:
    path = tmp_path / "f.csv"
    path.write_bytes(b'a,"x\ny"\nb,c\n')
    assert boundaries.record_starts(str(path), [0, 3, 9, 12], CSV) == [0, 8, 12, 12]


def test_record_line_numbers_count_physical_lines(tmp_path) -> None:
    path = tmp_path / "f.csv"
    data = b'h\n1,x\n2,"a\nb"\n3,y\n'
    path.write_bytes(data)
    # COPY of the range after the header counts the quoted LF too: its "line 4" is record 3,
    # on file line 5; its "line 3" is record 2, on lines 3-4
    assert lines.record_line_numbers(str(path), 2, len(data), 4, CSV) == (5, 5)
    assert lines.record_line_numbers(str(path), 2, len(data), 3, CSV) == (3, 4)
    by_count = lines.record_line_numbers(str(path), 2, len(data), 3, CSV, numbering="records")
    assert by_count == (5, 5)


def test_first_record_and_header() -> None:
    reader = io.BytesIO(b'"a,b",c\r\n1,2\r\n')
    record = boundaries.first_record(reader, CSV)
    assert record == b'"a,b",c\r\n'
    assert header.parse_header(record, CSV, delimiter=",", encoding="UTF8") == ["a,b", "c"]
    assert boundaries.detect_newline(io.BytesIO(b'"x\ny"\r\n'), CSV) == b"\r\n"


@pytest.mark.parametrize(
    ("name", "codec", "split"),
    [
        ("UTF8", "utf-8", True),
        ("utf-8", "utf-8", True),
        ("SQL_ASCII", "utf-8", True),
        ("LATIN1", "iso8859-1", True),
        ("latin-9", "iso8859-15", True),
        ("WIN1252", "cp1252", True),
        ("SJIS", "cp932", False),
        ("shift_jis", "cp932", False),
        ("BIG5", "cp950", False),
    ],
)
def test_one_encoding_table(name: str, codec: str, split: bool) -> None:
    assert charsets.python_codec(name) == codec
    assert charsets.can_split(name) is split


def test_an_unknown_encoding() -> None:
    assert not charsets.can_split("klingon")
    with pytest.raises(ValueError, match="no Python codec"):
        charsets.python_codec("klingon")
