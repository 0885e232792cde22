"""Tests for airflow_pg_bulk.source's scanner, boundaries, header and lines (pure Python, no
database)."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_pg_bulk.source.boundaries import detect_newline, first_record, record_starts
from airflow_pg_bulk.source.charsets import can_split
from airflow_pg_bulk.source.header import parse_header
from airflow_pg_bulk.source.lines import count_newlines, iter_range, record_line_numbers
from airflow_pg_bulk.source.syntax import RecordSyntax

CSV = RecordSyntax()
CSV_BACKSLASH = RecordSyntax(escape=b"\\")
CSV_SINGLE = RecordSyntax(quote=b"'", escape=b"'")
TEXT = RecordSyntax(format="text")

CR, LF, BACKSLASH = 0x0D, 0x0A, 0x5C
CHUNK_SIZES = [1, 2, 3, 5, 4 << 20]


# --------------------------------------------------------------------------------------------
# An independent, obviously-correct reference: CopyReadLineText one byte at a time.
# --------------------------------------------------------------------------------------------


def ref_records(data: bytes, syntax: RecordSyntax) -> list[tuple[int, int, int, int]]:
    """Every record as (start, content_end, next_start, pg_lineno_after_reading_it).

    A literal transcription of PostgreSQL's CopyReadLineText loop (minus the ``\\.`` marker and
    the mixed-line-ending errors): one byte at a time, with in_quote / last_was_esc exactly as
    in the C code, including ``escapec = '\\0'`` when escape == quote and the cur_lineno
    increments for newlines inside quotes.
    """
    csv_mode = syntax.format == "csv"
    quotec = syntax.quote[0]
    escapec = 0 if syntax.escape == syntax.quote else syntax.escape[0]
    eol_type = None  # None (unknown), "NL", "CR" or "CRNL"
    lineno = 0
    out = []
    i, n = 0, len(data)
    while i < n:
        start = i
        lineno += 1
        in_quote = last_was_esc = False
        content_end = None
        while i < n:
            c = data[i]
            i += 1
            if csv_mode:
                if in_quote and c == escapec:
                    last_was_esc = not last_was_esc
                if c == quotec and not last_was_esc:
                    in_quote = not in_quote
                if c != escapec:
                    last_was_esc = False
                if in_quote and c == (LF if eol_type == "NL" else CR):
                    lineno += 1
            if c == CR and (not csv_mode or not in_quote):
                content_end = i - 1
                if i < n and data[i] == LF:
                    i += 1
                    eol_type = eol_type or "CRNL"
                else:
                    eol_type = eol_type or "CR"
                break
            if c == LF and (not csv_mode or not in_quote):
                content_end = i - 1
                eol_type = eol_type or "NL"
                break
            if not csv_mode and c == BACKSLASH and i < n:
                i += 1  # the next byte is data, whatever it is
        out.append((start, n if content_end is None else content_end, i, lineno))
    return out


def ref_starts(data: bytes, syntax: RecordSyntax) -> list[int]:
    """Offsets at which a record begins: 0 and right after every terminator."""
    recs = ref_records(data, syntax)
    starts = [0] + [nxt for (_s, ce, nxt, _l) in recs if nxt != ce]
    return sorted(set(starts))


def ref_answer(data: bytes, syntax: RecordSyntax, target: int) -> int:
    return min((s for s in ref_starts(data, syntax) if s >= target), default=len(data))


def write(tmp_path: Path, data: bytes, name: str = "f.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def check_all_targets(path: Path, data: bytes, syntax: RecordSyntax) -> None:
    """Every target 0..size matches the reference: all in one call and each on its own (so no
    answer is inherited from an earlier target), with several chunk sizes."""
    targets = list(range(len(data) + 1))
    want = [ref_answer(data, syntax, t) for t in targets]
    for chunk_size in CHUNK_SIZES:
        assert record_starts(path, targets, syntax, chunk_size=chunk_size) == want, chunk_size
        for t, w in zip(targets, want, strict=True):
            assert record_starts(path, [t], syntax, chunk_size=chunk_size) == [w], (t, chunk_size)


# --------------------------------------------------------------------------------------------
# record_starts: unit cases
# --------------------------------------------------------------------------------------------


def test_quoted_lf(tmp_path: Path) -> None:
    data = b'a,"b\nc"\nd,e\n'
    path = write(tmp_path, data)
    assert record_starts(path, [0, 1, 4, 5, 8, 9, 12], CSV) == [0, 8, 8, 8, 8, 12, 12]
    check_all_targets(path, data, CSV)


def test_quoted_crlf_in_crlf_file(tmp_path: Path) -> None:
    data = b'h1,h2\r\n1,"x\r\ny"\r\n2,z\r\n'
    path = write(tmp_path, data)
    # 12 is between the quoted CR and LF; 16 is between the terminating CR and LF.
    assert record_starts(path, [7, 8, 12, 16, 17, 18], CSV) == [7, 17, 17, 17, 17, 22]
    check_all_targets(path, data, CSV)


def test_quoted_bare_cr_in_lf_file(tmp_path: Path) -> None:
    data = b'1,"a\rb"\n2,"\r"\n'
    path = write(tmp_path, data)
    assert record_starts(path, [1, 5, 8, 9], CSV) == [8, 8, 8, 14]
    check_all_targets(path, data, CSV)


def test_doubled_quotes(tmp_path: Path) -> None:
    data = b'"say ""hi""\nthere",1\n"""",2\n"a""\n""b"\n'
    path = write(tmp_path, data)
    starts = ref_starts(data, CSV)
    assert starts == [0, 21, 28, 38]
    assert record_starts(path, [1, 12, 21, 22, 29], CSV) == [21, 21, 21, 28, 38]
    check_all_targets(path, data, CSV)


def test_escape_differs_from_quote(tmp_path: Path) -> None:
    # \" inside quotes is an escaped quote, so the quoted field goes on past the first LF.
    data = b'1,"a\\"\nb"\n2,"c\\\\"\n3,d\\"\n'
    path = write(tmp_path, data)
    # (in the last line the backslash is outside quotes: ordinary; the quote after it opens)
    assert ref_starts(data, CSV_BACKSLASH) == [0, 10, 18]
    assert record_starts(path, [1, 7, 10, 11, 18, 19], CSV_BACKSLASH) == [10, 10, 10, 18, 18, 24]
    # Read with escape == quote, the same bytes split differently: \ is an ordinary byte.
    assert record_starts(path, [1], CSV) == [7]
    check_all_targets(path, data, CSV_BACKSLASH)
    check_all_targets(path, data, CSV)


def test_escape_outside_quotes_is_ordinary(tmp_path: Path) -> None:
    data = b'a\\"b,c\nd"\n"e\n'
    path = write(tmp_path, data)
    check_all_targets(path, data, CSV_BACKSLASH)
    assert record_starts(path, [1], CSV_BACKSLASH) == [10]  # the quote after the backslash opens


def test_custom_quote_char(tmp_path: Path) -> None:
    data = b"1,'x\ny',\"\n2,'it''s'\n"
    path = write(tmp_path, data)
    assert record_starts(path, [1, 8, 11], CSV_SINGLE) == [10, 10, 20]
    assert record_starts(path, [1], CSV) == [5]
    check_all_targets(path, data, CSV_SINGLE)


def test_crlf_file(tmp_path: Path) -> None:
    data = b"a,b\r\nc,d\r\n\r\ne,f\r\n"
    path = write(tmp_path, data)
    assert record_starts(path, [1, 4, 5, 6, 10, 11, 12], CSV) == [5, 5, 5, 10, 10, 12, 12]
    check_all_targets(path, data, CSV)
    check_all_targets(path, data, TEXT)


def test_cr_only_file(tmp_path: Path) -> None:
    data = b'a,"b\rc"\rd\r\re\r'
    path = write(tmp_path, data)
    assert record_starts(path, [1, 4, 7, 8, 9, 10, 11], CSV) == [8, 8, 8, 8, 10, 10, 11]
    check_all_targets(path, data, CSV)


def test_text_format_backslash_newline(tmp_path: Path) -> None:
    # line 1: "a\<LF>b" (escaped LF is data); line 2 ends in \\ (an escaped backslash) + real LF;
    # line 3 has \\\<LF> (escaped backslash, then an escaped LF) so it runs on into line 4.
    data = b"a\\\nb\tc\nd\\\\\ne\\\\\\\nf\n"
    path = write(tmp_path, data)
    assert ref_starts(data, TEXT) == [0, 7, 11, 18]
    assert record_starts(path, [1, 3, 7, 8, 12, 15, 18], TEXT) == [7, 7, 7, 11, 18, 18, 18]
    check_all_targets(path, data, TEXT)


def test_text_format_escaped_cr_and_long_backslash_runs(tmp_path: Path) -> None:
    data = b"x\\\ry\n" + b"\\" * 9 + b"\n" + b"\\" * 10 + b"\nz\r\n"
    path = write(tmp_path, data)
    check_all_targets(path, data, TEXT)


def test_target_edges(tmp_path: Path) -> None:
    data = b'a,b\nc,"d\ne"\nf,g\n'
    path = write(tmp_path, data)
    size = len(data)
    # 0, exactly at record starts, inside a quoted field, and at EOF.
    assert record_starts(path, [0, 4, 8, 12, size], CSV) == [0, 4, 12, 12, size]
    # Unsorted targets are answered in their own order.
    assert record_starts(path, [size, 0, 8], CSV) == [size, 0, 12]
    assert record_starts(path, [], CSV) == []
    with pytest.raises(ValueError):
        record_starts(path, [size + 1], CSV)
    with pytest.raises(ValueError):
        record_starts(path, [-1], CSV)


def test_no_final_newline(tmp_path: Path) -> None:
    data = b'a\nb,"c\nd"'
    path = write(tmp_path, data)
    assert record_starts(path, [1, 2, 3, len(data)], CSV) == [2, 2, len(data), len(data)]
    check_all_targets(path, data, CSV)
    check_all_targets(path, data, TEXT)


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, b"")
    assert record_starts(path, [0], CSV) == [0]
    assert record_starts(path, [0, 0], TEXT) == [0, 0]


def test_targets_beyond_last_record_start(tmp_path: Path) -> None:
    data = b'1,2\n3,"unterminated\nquote\n'
    path = write(tmp_path, data)
    assert record_starts(path, [5, 10, 20], CSV) == [len(data)] * 3
    data2 = b"one long line without newline"
    path2 = write(tmp_path, data2, "g.csv")
    assert record_starts(path2, [1, 5], CSV) == [len(data2)] * 2
    assert record_starts(path2, [1, 5], TEXT) == [len(data2)] * 2


def test_chunk_boundary_in_cr_lf_and_escape_pairs(tmp_path: Path) -> None:
    data = b'a\r\n"b\\\\"\r\n"c\\""\r\nd\r'
    path = write(tmp_path, data)
    for syntax in (CSV, CSV_BACKSLASH, TEXT):
        check_all_targets(path, data, syntax)


# --------------------------------------------------------------------------------------------
# record_starts: property tests
# --------------------------------------------------------------------------------------------

CSV_PIECES = [
    "a",
    "bc",
    "x y",
    "42",
    ",",
    '"',
    '""',
    "\n",
    "\r\n",
    "\r",
    "é",
    "日本語",
    "😀",
    "\u2028",
    " ",
]
csv_fields = st.lists(st.sampled_from(CSV_PIECES), max_size=5).map("".join)
csv_rows = st.lists(st.lists(csv_fields, min_size=1, max_size=4), max_size=12)
TERMINATORS = st.sampled_from(["\n", "\r\n", "\r"])


def csv_encode(rows: list[list[str]], terminator: str, final: bool, rnd: random.Random) -> str:
    lines = []
    for row in rows:
        cells = []
        for field in row:
            special = any(ch in field for ch in ',"\r\n') or (field == "" and len(row) == 1)
            if special or rnd.random() < 0.2:
                field = '"' + field.replace('"', '""') + '"'
            cells.append(field)
        lines.append(",".join(cells))
    return terminator.join(lines) + (terminator if final and lines else "")


def python_csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


@settings(max_examples=200, deadline=None)
@given(
    rows=csv_rows,
    terminator=TERMINATORS,
    final=st.booleans(),
    rnd=st.randoms(use_true_random=False),
    fractions=st.lists(st.floats(0, 1), max_size=6),
    chunk_size=st.sampled_from([1, 3, 16, 4 << 20]),
)
def test_property_csv_default_dialect(
    rows: list[list[str]],
    terminator: str,
    final: bool,
    rnd: random.Random,
    fractions: list[float],
    chunk_size: int,
) -> None:
    data = csv_encode(rows, terminator, final, rnd).encode("utf-8")
    targets = sorted(int(f * len(data)) for f in fractions)
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), data)
        got = record_starts(path, targets, CSV, chunk_size=chunk_size)
    starts = set(ref_starts(data, CSV)) | {len(data)}
    for t, s in zip(targets, got, strict=True):
        assert s >= t
        assert s in starts
        assert s == ref_answer(data, CSV, t)
    # Loading the pieces separately gives exactly the rows of the whole file.
    bounds = sorted({0, len(data), *got})
    pieces_rows = []
    for a, b in itertools.pairwise(bounds):
        pieces_rows.extend(python_csv_rows(data[a:b].decode("utf-8")))
    assert pieces_rows == python_csv_rows(data.decode("utf-8")) == rows


TEXT_PIECES = ["a", "bc", "\\", "\t", "\n", "\r", "\r\n", "é", "日本", "N", ".", " "]
text_fields = st.lists(st.sampled_from(TEXT_PIECES), max_size=5).map("".join)
text_rows = st.lists(st.lists(text_fields, min_size=1, max_size=4), max_size=12)


def text_encode(rows: list[list[str]], terminator: str, final: bool, rnd: random.Random) -> str:
    literal = {"\t": "\\\t", "\n": "\\\n", "\r": "\\\r"}
    mnemonic = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\\": "\\\\"}
    lines = []
    for row in rows:
        cells = []
        for field in row:
            out = []
            for ch in field:
                if ch in literal and rnd.random() < 0.5:
                    out.append(literal[ch])  # backslash + the raw byte: legal, and it is data
                else:
                    out.append(mnemonic.get(ch, ch))
            cells.append("".join(out))
        lines.append("\t".join(cells))
    return terminator.join(lines) + (terminator if final and lines else "")


def text_decode(piece: bytes) -> list[list[str]]:
    """Rows of a text-format piece: reference records, then a minimal CopyReadAttributesText."""
    rows = []
    for start, content_end, _nxt, _l in ref_records(piece, TEXT):
        line = piece[start:content_end].decode("utf-8")
        fields, cur, i = [], [], 0
        while i < len(line):
            ch = line[i]
            if ch == "\\" and i + 1 < len(line):
                nxt = line[i + 1]
                cur.append({"t": "\t", "n": "\n", "r": "\r"}.get(nxt, nxt))
                i += 2
                continue
            if ch == "\t":
                fields.append("".join(cur))
                cur = []
            else:
                cur.append(ch)
            i += 1
        fields.append("".join(cur))
        rows.append(fields)
    return rows


@settings(max_examples=200, deadline=None)
@given(
    rows=text_rows,
    terminator=TERMINATORS,
    final=st.booleans(),
    rnd=st.randoms(use_true_random=False),
    fractions=st.lists(st.floats(0, 1), max_size=6),
    chunk_size=st.sampled_from([1, 3, 16, 4 << 20]),
)
def test_property_text_format(
    rows: list[list[str]],
    terminator: str,
    final: bool,
    rnd: random.Random,
    fractions: list[float],
    chunk_size: int,
) -> None:
    data = text_encode(rows, terminator, final, rnd).encode("utf-8")
    if not final and rows and rows[-1] == [""]:
        rows = rows[:-1]  # an empty last line without a terminator is no record at all
    targets = sorted(int(f * len(data)) for f in fractions)
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), data)
        got = record_starts(path, targets, TEXT, chunk_size=chunk_size)
    starts = set(ref_starts(data, TEXT)) | {len(data)}
    for t, s in zip(targets, got, strict=True):
        assert s >= t
        assert s in starts
        assert s == ref_answer(data, TEXT, t)
    bounds = sorted({0, len(data), *got})
    pieces_rows = []
    for a, b in itertools.pairwise(bounds):
        pieces_rows.extend(text_decode(data[a:b]))
    assert pieces_rows == text_decode(data) == rows


SYNTAXES = [CSV, CSV_BACKSLASH, CSV_SINGLE, RecordSyntax(quote=b"'", escape=b"\\"), TEXT]
byte_soup = st.lists(st.sampled_from(list(b"a,'\"\\\r\n\t")), max_size=80).map(bytes)


@settings(max_examples=200, deadline=None)
@given(
    data=byte_soup,
    syntax=st.sampled_from(SYNTAXES),
    chunk_size=st.sampled_from([1, 2, 5, 4 << 20]),
    pick=st.integers(0, 1000),
)
def test_property_byte_soup_matches_reference(
    data: bytes, syntax: RecordSyntax, chunk_size: int, pick: int
) -> None:
    """Arbitrary (even malformed) bytes: every target agrees with the byte-at-a-time reference."""
    targets = list(range(len(data) + 1))
    want = [ref_answer(data, syntax, t) for t in targets]
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp), data)
        assert record_starts(path, targets, syntax, chunk_size=chunk_size) == want
        lone = pick % len(targets)  # one target alone, so its answer is computed from scratch
        assert record_starts(path, [lone], syntax, chunk_size=chunk_size) == [want[lone]]
        recs = ref_records(data, syntax)
        assert first_record(io.BytesIO(data), syntax) == (data[: recs[0][2]] if recs else b"")
        # record_line_numbers, both numberings, for a range starting at some record start.
        if recs:
            first_terminator = data[recs[0][1] : recs[0][2]]
            newline = b"\r" if first_terminator == b"\r" else b"\n"
            assert detect_newline(path, syntax) == (first_terminator or b"\n")
            first_idx = len(recs) // 2
            start = recs[first_idx][0]
            sub = ref_records(data[start:], syntax)
            for k, (s, ce, _n, pg_line) in enumerate(sub, start=1):
                want = (
                    1 + data[: start + s].count(newline),
                    1 + data[: start + ce].count(newline),
                )
                got_records = record_line_numbers(path, start, None, k, syntax, numbering="records")
                assert got_records == want
                assert record_line_numbers(path, start, None, pg_line, syntax) == want


# --------------------------------------------------------------------------------------------
# record_line_numbers
# --------------------------------------------------------------------------------------------

MULTILINE = (
    b"id,note\n"  # line 1 (header)
    b"1,plain\n"  # line 2
    b'2,"multi\n'  # line 3
    b'line"\n'  # line 4
    b'3,"x\n'  # line 5
    b"y\n"  # line 6
    b'z"\n'  # line 7
    b"4,last\n"  # line 8
)


def test_record_line_numbers_hand_computed(tmp_path: Path) -> None:
    path = write(tmp_path, MULTILINE)
    start = len(b"id,note\n")  # the range after the header
    records = [(2, 2), (3, 4), (5, 7), (8, 8)]
    for k, want in enumerate(records, start=1):
        assert record_line_numbers(path, start, None, k, CSV, numbering="records") == want
    # PostgreSQL's "line N" also counts LFs inside quotes once the session knows it reads an LF
    # file: the records end at lines 1, 3, 6 and 7 of the session.
    pg = {1: (2, 2), 2: (3, 4), 3: (3, 4), 4: (5, 7), 5: (5, 7), 6: (5, 7), 7: (8, 8)}
    for n, want in pg.items():
        assert record_line_numbers(path, start, len(MULTILINE), n, CSV) == want
    with pytest.raises(ValueError):
        record_line_numbers(path, start, None, 8, CSV)
    with pytest.raises(ValueError):
        record_line_numbers(path, start, None, 5, CSV, numbering="records")
    with pytest.raises(ValueError):
        record_line_numbers(path, start, None, 0, CSV)


def test_record_line_numbers_range_in_the_middle(tmp_path: Path) -> None:
    path = write(tmp_path, MULTILINE)
    start = MULTILINE.index(b'3,"x')
    end = MULTILINE.index(b"4,last")
    assert record_line_numbers(path, start, end, 1, CSV, numbering="records") == (5, 7)
    # While the session's line ending is still unknown, PostgreSQL counts quoted CRs, not LFs,
    # so the first record of a session is "line 1" however many lines it spans.
    assert record_line_numbers(path, start, None, 1, CSV) == (5, 7)
    assert record_line_numbers(path, start, None, 2, CSV) == (8, 8)
    with pytest.raises(ValueError):
        record_line_numbers(path, start, end, 2, CSV)


def test_record_line_numbers_quoted_cr_in_lf_file(tmp_path: Path) -> None:
    data = b'"a\rb",c\n1,2\n"x\ny",3\n'
    path = write(tmp_path, data)
    assert record_line_numbers(path, 0, None, 2, CSV, numbering="records") == (2, 2)
    assert record_line_numbers(path, 0, None, 3, CSV, numbering="records") == (3, 4)
    # PostgreSQL: the quoted CR of record 1 counts (line ending still unknown), the quoted LF
    # of record 3 counts too: records end at session lines 2, 3 and 5.
    assert record_line_numbers(path, 0, None, 2, CSV) == (1, 1)
    assert record_line_numbers(path, 0, None, 3, CSV) == (2, 2)
    assert record_line_numbers(path, 0, None, 5, CSV) == (3, 4)


def test_record_line_numbers_text_and_crlf(tmp_path: Path) -> None:
    text = b"a\tb\nc\\\nd\te\nf\tg\n"  # record 2 spans lines 2-3 through an escaped LF
    path = write(tmp_path, text, "t.txt")
    assert record_line_numbers(path, 4, None, 1, TEXT) == (2, 3)
    assert record_line_numbers(path, 4, None, 2, TEXT) == (4, 4)
    crlf = b'h\r\n1,"a\r\nb"\r\n2,c\r\n'
    path = write(tmp_path, crlf, "c.csv")
    # PostgreSQL counts the quoted CR, so record 1 is "line 2" and record 2 is "line 3".
    assert record_line_numbers(path, 3, None, 1, CSV) == (2, 3)
    assert record_line_numbers(path, 3, None, 2, CSV) == (2, 3)
    assert record_line_numbers(path, 3, None, 3, CSV) == (4, 4)
    assert record_line_numbers(path, 3, None, 2, CSV, numbering="records") == (4, 4)
    cr = b'h\r1,"a\rb"\r2,c\r'
    path = write(tmp_path, cr, "r.csv")
    assert record_line_numbers(path, 2, None, 2, CSV) == (2, 3)
    assert record_line_numbers(path, 2, None, 1, CSV, numbering="records") == (2, 3)
    assert record_line_numbers(path, 2, None, 2, CSV, numbering="records") == (4, 4)


# --------------------------------------------------------------------------------------------
# Helpers: first_record, detect_newline, count_newlines, iter_range, parse_header, can_split
# --------------------------------------------------------------------------------------------


def test_first_record(tmp_path: Path) -> None:
    data = b'"a\nb",c\r\nrest\r\n'
    path = write(tmp_path, data)
    assert first_record(path, CSV) == b'"a\nb",c\r\n'
    stream = io.BytesIO(data)
    assert first_record(stream, CSV) == b'"a\nb",c\r\n'
    assert stream.read() == b"rest\r\n"  # a seekable stream is left right after the record
    assert first_record(io.BytesIO(b"x\\\ny\nz\n"), TEXT) == b"x\\\ny\n"
    assert first_record(io.BytesIO(b"no terminator"), CSV) == b"no terminator"
    assert first_record(io.BytesIO(b""), CSV) == b""
    assert first_record(io.BytesIO(b"a\r"), CSV) == b"a\r"
    with pytest.raises(ValueError):
        first_record(io.BytesIO(b"x" * 100 + b"\n"), CSV, limit=50)
    assert first_record(io.BytesIO(b"x" * 49 + b"\n"), CSV, limit=50) == b"x" * 49 + b"\n"
    with pytest.raises(ValueError):
        first_record(io.BytesIO(b"x" * 49 + b"\r\n"), CSV, limit=50)


def test_first_record_gzip(tmp_path: Path) -> None:
    gz = tmp_path / "f.csv.gz"
    with gzip.open(gz, "wb") as f:
        f.write(b'"col\n1",col2\n' + b"1,2\n" * 100_000)
    with gzip.open(gz, "rb") as f:
        assert first_record(f, CSV) == b'"col\n1",col2\n'
        assert f.read(4) == b"1,2\n"


def test_detect_newline(tmp_path: Path) -> None:
    assert detect_newline(write(tmp_path, b"a\r\nb\r\n")) == b"\r\n"
    assert detect_newline(write(tmp_path, b"a\rb\r")) == b"\r"
    assert detect_newline(write(tmp_path, b"a\nb\r\n")) == b"\n"
    assert detect_newline(write(tmp_path, b"abc")) == b"\n"
    assert detect_newline(write(tmp_path, b"")) == b"\n"
    assert detect_newline(write(tmp_path, b"x" * 70_000 + b"\r")) == b"\r"
    assert detect_newline(write(tmp_path, b"x" * 65_535 + b"\r\n")) == b"\r\n"
    # Quote-aware: the quoted CR is data, the first terminator is an LF.
    quoted_cr = write(tmp_path, b'"a\rb",c\nd\n')
    assert detect_newline(quoted_cr) == b"\r"
    assert detect_newline(quoted_cr, CSV) == b"\n"
    assert detect_newline(write(tmp_path, b"a\\\rb\r\n"), TEXT) == b"\r\n"
    assert detect_newline(write(tmp_path, b'"x' + b"y" * 70_000 + b'"\r'), CSV) == b"\r"
    assert detect_newline(write(tmp_path, b"abc"), CSV) == b"\n"
    stream = io.BytesIO(b"ab\r\ncd")
    stream.seek(1)
    assert detect_newline(stream) == b"\r\n"
    assert stream.tell() == 1


def test_count_newlines_and_iter_range(tmp_path: Path) -> None:
    data = b"a\nb\r\nc\rd\n"
    path = write(tmp_path, data)
    assert count_newlines(path, 0, None) == 3
    assert count_newlines(path, 2, 5) == 1
    assert count_newlines(path, 0, len(data), newline=b"\r") == 2
    assert count_newlines(path, 0, len(data), newline=b"\r\n", chunk_size=1) == 3
    with pytest.raises(ValueError):
        count_newlines(path, 0, None, newline=b"x")
    with pytest.raises(ValueError):
        count_newlines(path, 3, 2)
    assert b"".join(iter_range(path, 2, 7, chunk_size=2)) == data[2:7]
    assert list(iter_range(path, 2, 7, chunk_size=2)) == [data[2:4], data[4:6], data[6:7]]
    assert b"".join(iter_range(path, 3, None)) == data[3:]
    assert list(iter_range(path, 4, 4)) == []
    with pytest.raises(ValueError):
        list(iter_range(path, 0, len(data) + 1))


def test_parse_header_csv() -> None:
    record = '\ufeffid,"first ""name""","multi\nline",,plain\r\n'.encode()
    assert parse_header(record, CSV, delimiter=b",", encoding="UTF8") == [
        "id",
        'first "name"',
        "multi\nline",
        "",
        "plain",
    ]
    record = b'"a\\"b";"c\\\\";d\\e\n'
    assert parse_header(record, CSV_BACKSLASH, delimiter=b";", encoding="utf-8") == [
        'a"b',
        "c\\",
        "d\\e",
    ]
    assert parse_header("caf\xe9|x\n".encode("latin-1"), CSV, delimiter="|", encoding="LATIN1") == [
        "café",
        "x",
    ]
    assert parse_header(b"a,b", CSV, delimiter=b",", encoding="UTF8") == ["a", "b"]
    assert parse_header(b"a,b\nc,d\n", CSV, delimiter=b",", encoding="UTF8") == ["a", "b"]
    with pytest.raises(ValueError):
        parse_header(b'"a\n', CSV, delimiter=b",", encoding="UTF8")
    with pytest.raises(ValueError):
        parse_header(b"a\n", CSV, delimiter=b",,", encoding="UTF8")
    with pytest.raises(ValueError):
        parse_header(b"a\n", CSV, delimiter=b'"', encoding="UTF8")


def test_parse_header_text() -> None:
    record = b"a\\tb\tc\\\\d\te\\nf\t\\101\\x42\\q\t\\N\tg\\\th\n"
    assert parse_header(record, TEXT, delimiter=b"\t", encoding="UTF8") == [
        "a\tb",
        "c\\d",
        "e\nf",
        "ABq",
        "",
        "g\th",
    ]
    assert parse_header(b"x\\\ny|z\r\n", TEXT, delimiter=b"|", encoding="UTF8") == ["x\ny", "z"]
    assert parse_header(b"\\xZ\\", TEXT, delimiter=b",", encoding="UTF8") == ["xZ"]
    with pytest.raises(ValueError):
        parse_header(b"a\n", TEXT, delimiter=b"\\", encoding="UTF8")


@pytest.mark.parametrize(
    "name",
    ["UTF8", "utf-8", "Unicode", "LATIN1", "latin-1", "iso-8859-15", "WIN1252", "cp1252",
     "windows-1251", "SQL_ASCII", "ascii", "EUC_JP", "euc-kr", "KOI8R", "MULE_INTERNAL", "u8"],
)  # fmt: skip
def test_can_split_true(name: str) -> None:
    assert can_split(name)


@pytest.mark.parametrize(
    "name",
    ["SJIS", "sjis", "shift_jis", "Shift-JIS", "cp932", "BIG5", "big5", "GBK", "cp936",
     "GB18030", "UHC", "cp949", "JOHAB", "SHIFT_JIS_2004", "WIN950", "no-such-encoding"],
)  # fmt: skip
def test_can_split_false(name: str) -> None:
    assert not can_split(name)


def test_record_syntax_validation() -> None:
    assert RecordSyntax(format="CSV").format == "csv"
    assert RecordSyntax(quote="'", escape="\\") == RecordSyntax(quote=b"'", escape=b"\\")
    for kwargs in (
        {"format": "binary"},
        {"quote": b""},
        {"quote": b'""'},
        {"escape": b"\n"},
        {"quote": b"\r"},
        {"quote": b"\0"},
        {"quote": "é"},
        {"escape": 5},
    ):
        with pytest.raises(ValueError):
            RecordSyntax(**kwargs)  # type: ignore[arg-type]
