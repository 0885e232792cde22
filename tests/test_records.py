"""Row accounting's record counter (airflow_pg_bulk.source.records) against two oracles: a
byte-by-byte transcription of PostgreSQL's CopyReadLineText (the rules of 15 and of 18), fed
in every chunking, and the real server's COPY of the same bytes."""

from __future__ import annotations

import random

import psycopg
import pytest
from psycopg import sql

from airflow_pg_bulk.source.records import MarkerRule, RecordCounter, RecordError, marker_rule
from airflow_pg_bulk.source.syntax import RecordSyntax

CR, LF, BS, DOT = 0x0D, 0x0A, 0x5C, 0x2E
RULES_BY_VERSION = {150000: "pre-18", 180000: "18"}


class CopyError(Exception):
    """What the server would raise: the file does not load at all."""


def reference(data: bytes, syntax: RecordSyntax, version: int) -> tuple[int, int | None, bool]:
    """(records COPY takes, line of the end-of-data marker or None, rows lost after it).

    A literal transcription of CopyReadLineText's loop, one byte at a time, for PostgreSQL 15
    (``version`` < 180000) and 18. Raises CopyError where the server raises."""
    csv_mode = syntax.format == "csv"
    quotec = syntax.quote[0]
    escapec = -1 if syntax.escape == syntax.quote else syntax.escape[0]
    eol = None  # "NL", "CR", "CRNL"
    records = 0
    line = 1
    i, n = 0, len(data)
    while i < n:
        # one call of CopyReadLineText: one record
        in_quote = last_was_esc = False
        first_char = True
        record_start = i
        ended = False
        while i < n:
            prev = i
            c = data[i]
            i += 1
            if csv_mode:
                if in_quote and c == escapec:
                    last_was_esc = not last_was_esc
                if c == quotec and not last_was_esc:
                    in_quote = not in_quote
                if c != escapec:
                    last_was_esc = False
            if c == CR and (not csv_mode or not in_quote):
                if eol in (None, "CRNL"):
                    if i < n and data[i] == LF:
                        i += 1
                        eol = "CRNL"
                    else:
                        if eol == "CRNL":
                            raise CopyError("carriage return in CRLF file")
                        eol = "CR"
                elif eol == "NL":
                    raise CopyError("carriage return in LF file")
                ended = True
                break
            if c == LF and (not csv_mode or not in_quote):
                if eol in ("CR", "CRNL"):
                    raise CopyError("newline in CR(LF) file")
                eol = "NL"
                ended = True
                break
            marker_possible = (not csv_mode or first_char) if version < 180000 else (not csv_mode)
            if c == BS and marker_possible:
                if i >= n:
                    break  # EOF right after a backslash
                if data[i] == DOT:
                    j = i + 1
                    if eol == "CRNL":
                        if j >= n or data[j] != CR:
                            if csv_mode:
                                first_char = False
                                continue
                            raise CopyError("marker corrupt")
                        j += 1
                    c2 = data[j] if j < n else 0
                    j += 1
                    if c2 not in (CR, LF):
                        if csv_mode:
                            first_char = False
                            continue
                        raise CopyError("marker corrupt")
                    if (eol in ("NL", "CRNL") and c2 != LF) or (eol == "CR" and c2 != CR):
                        raise CopyError("marker newline style")
                    data_before = prev > record_start
                    if version >= 180000 and data_before:
                        raise CopyError("marker not alone")
                    if data_before:
                        records += 1  # the line's data before it is still a row
                    # rows follow, unless all that follows is the LF of a first line's CR LF
                    lost = j < n and not (eol is None and c2 == CR and data[j:] == b"\n")
                    # physical lines end as the file's first line does (here: maybe this one)
                    lone_cr = c2 == CR and data[j : j + 1] != b"\n"
                    newline = b"\r" if eol == "CR" or (eol is None and lone_cr) else b"\n"
                    return records, line + data.count(newline, record_start, prev), lost
                if not csv_mode:
                    i += 1  # the byte after a backslash is data
            first_char = False
        records += 1 if (ended or i > record_start) else 0
        line += data.count(b"\n" if eol != "CR" else b"\r", record_start, i)
    return records, None, False


PIECES = [
    b"a", b"b", b",", b"\t", b'"', b"'", b"\\", b".", b"\\.", b"\n", b"\r\n", b"\r", b"x\\.",
    b"\\.\n", b"\\.\r\n", b"\\\\", b"\\\n", b"\\\r",
]  # fmt: skip
SYNTAXES = [
    RecordSyntax("csv"),
    RecordSyntax("csv", b'"', b"\\"),
    RecordSyntax("csv", b"'", b"'"),
    RecordSyntax("text"),
]


def soup(rnd: random.Random) -> bytes:
    return b"".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 14)))


def counted(
    data: bytes, syntax: RecordSyntax, version: int, size: int
) -> tuple[int | None, int | None]:
    """(records, None) or (None, line of the refused marker) from the counter."""
    counter = RecordCounter(syntax, marker_rule(syntax.format, version))
    try:
        for k in range(0, len(data), size):
            counter.feed(data[k : k + size])
        return counter.finish(), None
    except RecordError as exc:
        return None, exc.line


@pytest.mark.parametrize("version", [150000, 180000], ids=RULES_BY_VERSION.get)
@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: f"{s.format}-{s.quote}-{s.escape}")
def test_counter_agrees_with_copyreadlinetext_in_every_chunking(syntax, version):
    rnd = random.Random(f"{syntax}{version}")
    checked = 0
    for _ in range(3000):
        data = soup(rnd)
        try:
            expected, marker_line, lost = reference(data, syntax, version)
        except CopyError:
            continue  # the server refuses the file itself: nothing to account for
        checked += 1
        for size in (1, 2, 3, 4, 5, 7, len(data) or 1):
            got, refused_line = counted(data, syntax, version, size)
            if lost:
                assert refused_line == marker_line, (data, size)
            else:
                assert (got, refused_line) == (expected, None), (data, size)
    assert checked > 1000


def test_marker_rules_by_format_and_version():
    assert marker_rule("text", 150020) is MarkerRule.ANYWHERE
    assert marker_rule("text", 180006) is MarkerRule.ALONE
    assert marker_rule("csv", 170000) is MarkerRule.RECORD_START
    assert marker_rule("csv", 180000) is MarkerRule.NONE


@pytest.mark.parametrize(
    ("data", "fmt", "version", "expected"),
    [
        # the repros
        (b"1\ta\tbbb\n2\tc\td\\\r\n3\te\tfff\n", "text", 150000, 3),
        (b"1\ta\tb\\.\n2\tc\td\n3\te\tf\n", "text", 150000, ("line", 1)),
        (b"1,a,b\n2,c,d\n\\.\n", "csv", 150000, 2),
        (b"1,a,b\n2,c,d\n\\.\n", "csv", 180000, 3),  # a record there (COPY then fails)
        (b'1,"x\n\\.\ny",z\n2,b,c\n', "csv", 150000, 2),
        (
            b"".join(b"%d\tx\\.\n" % i if i == 40 else b"%d\tx\n" % i for i in range(1, 101)),
            "text",
            150000,
            ("line", 40),
        ),
        # a final marker after data on its line: the row still loads
        (b"1\ta\n2\tb\\.\n", "text", 150000, 2),
        (b"1\ta\n\\.\n3\tc\n", "text", 180000, ("line", 2)),
    ],
)
def test_known_cases(data, fmt, version, expected):
    got = counted(data, RecordSyntax(fmt), version, 1 << 20)
    assert got == ((None, expected[1]) if isinstance(expected, tuple) else (expected, None))


def test_a_marker_at_the_end_of_a_piece_in_the_middle_of_the_file_is_refused():
    counter = RecordCounter(RecordSyntax("text"), MarkerRule.ANYWHERE, file_end=False, first_line=7)
    counter.feed(b"1\ta\n\\.\n")
    with pytest.raises(RecordError) as info:
        counter.finish()
    assert info.value.line == 8


@pytest.mark.parametrize(
    ("data", "expected", "message"),
    [
        (b"1,x\n2,y\n", b"\r\n", "unquoted newline"),
        (b"1,x\r\n2,y\r\n", b"\n", "unquoted carriage return"),
        (b'1,"a\r\nb"\n', b"\r\n", "unquoted newline"),  # the quoted CRLF is data
    ],
)
def test_first_line_ending_must_be_the_files(data, expected, message):
    counter = RecordCounter(RecordSyntax("csv"), MarkerRule.NONE, expected_newline=expected)
    with pytest.raises(RecordError, match=message):
        counter.feed(data)
        counter.finish()


def test_escaped_cr_is_data_not_the_line_ending():
    counter = RecordCounter(RecordSyntax("text"), MarkerRule.ANYWHERE, expected_newline=b"\n")
    counter.feed(b"2\tc\td\\\r\n3\te\tfff\n")
    assert counter.finish() == 2


def test_client_only_encoding_counts_on_the_transcoding():
    # SJIS "ソ" is 0x83 0x5C: its trail byte is a backslash in ASCII
    data = "1\tソ\n2\tソ\n".encode("shift_jis")
    assert b"\\\n" in data
    counter = RecordCounter(RecordSyntax("text"), MarkerRule.ANYWHERE, encoding="SJIS")
    counter.feed(data)
    assert counter.finish() == 2


# --- against the server -------------------------------------------------------------------


def copy_rows(conn: psycopg.Connection, data: bytes, syntax: RecordSyntax) -> int | None:
    """Rows one plain COPY of ``data`` loads into a one-column table, or None if it fails."""
    options = [sql.SQL("FORMAT {}").format(sql.SQL(syntax.format))]
    if syntax.is_csv:
        options += [
            sql.SQL("QUOTE {}").format(sql.Literal(syntax.quote.decode())),
            sql.SQL("ESCAPE {}").format(sql.Literal(syntax.escape.decode())),
            sql.SQL("DELIMITER {}").format(sql.Literal("\x01")),
        ]
    else:
        options.append(sql.SQL("DELIMITER {}").format(sql.Literal("\x01")))
    statement = sql.SQL("COPY pg_temp.one FROM STDIN ({})").format(sql.SQL(", ").join(options))
    try:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("CREATE TEMP TABLE one (v text) ON COMMIT DROP")
            with cur.copy(statement) as copy:
                copy.write(data)
            rows = cur.rowcount
            raise _Rollback(rows)
    except _Rollback as done:
        return done.rows
    except psycopg.Error:
        return None


class _Rollback(Exception):
    def __init__(self, rows: int) -> None:
        self.rows = rows


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: f"{s.format}-{s.quote}-{s.escape}")
def test_counter_agrees_with_the_server(pg_dsn, syntax):
    """Whenever the server's COPY succeeds, the counter either counts exactly its rows or
    refuses a marker the server silently stopped at (then the server loaded fewer rows than
    the file holds)."""
    rnd = random.Random(f"server{syntax}")
    with psycopg.connect(pg_dsn) as conn:
        version = conn.info.server_version
        loaded = 0
        for _ in range(400):
            data = soup(rnd)
            rows = copy_rows(conn, data, syntax)
            if rows is None:
                continue
            loaded += 1
            got, refused_line = counted(data, syntax, version, 3)
            if refused_line is None:
                assert got == rows, data
            else:
                naive = RecordCounter(syntax, MarkerRule.NONE)
                naive.feed(data)
                assert rows < naive.finish(), data
        assert loaded > 100
