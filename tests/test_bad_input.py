"""A catalogue of bad and odd inputs: every load must end exactly as one plain COPY would.

For each case the truth is established with one plain ``COPY ... FROM STDIN`` of the same bytes
into a scratch table of the same definition. Then the same file is loaded with
``runner.load`` (replace mode, several partitions) into a target that already holds rows, and:

* where plain COPY succeeds, the target must hold exactly what plain COPY loaded (row count and
  order-independent checksum);
* where plain COPY fails, the load must raise ``BadDataError`` (``ConstraintViolationError``
  for a key, foreign key or check found in finalize; ``LoadRefusedError`` for a problem found
  before loading) naming the file, the exact line in the file, the column (where the server
  names one) and the value (truncated), and the target must be untouched with no ``_pgbulk_*``
  tables left behind.

Known server-version differences are documented at the case that meets them (see ``\\.``).
"""

from __future__ import annotations

import gzip
import random
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import leftovers, rows
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_pg_bulk import runner
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.errors import (
    BadDataError,
    ConstraintViolationError,
    LoadRefusedError,
    PgBulkError,
)
from airflow_pg_bulk.plan import CopyOptions
from airflow_pg_bulk.source import cutting, listing
from airflow_pg_bulk.source.header import read_header

# --- the tables ----------------------------------------------------------------------------

ITEMS = (
    "CREATE TABLE {t} (id integer PRIMARY KEY, name text NOT NULL,"
    " amount numeric(12,2) CHECK (amount >= 0), day date, note text)"
)
ITEMS_SEED = (
    "INSERT INTO {t} VALUES (-1, 'old', 1, '2000-01-01', 'before'), (-2, 'older', 2, NULL, NULL)"
)
PAIRS = "CREATE TABLE {t} (id integer, txt text)"
PAIRS_SEED = "INSERT INTO {t} VALUES (-1, 'old'), (-2, NULL)"
ONE = "CREATE TABLE {t} (txt text)"
ONE_SEED = "INSERT INTO {t} VALUES ('old'), (NULL)"

MESSAGE_LIMIT = 2000  # an error message with a truncated value stays readable


@dataclass(frozen=True)
class Case:
    """One input: the file's bytes, the table, the options, and what to check if COPY fails.

    ``line`` is the exact 1-based physical line in the file that the error must name (a
    callable gets the file's bytes); ``column``/``value`` what the message must name;
    ``context_column`` whether COPY's CONTEXT names the column (then ``err.column`` must be it);
    ``expect`` the error class when plain COPY fails; ``message`` more text the error must hold.
    """

    id: str
    data: bytes | Callable[[], bytes]
    ddl: str = ITEMS
    seed: str = ITEMS_SEED
    setup: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    ref_options: str | None = None  # plain COPY's WITH (...) when not derived from options
    ref_columns: tuple[str, ...] | None = None
    expect: type[Exception] | tuple[type[Exception], ...] = BadDataError
    line: int | Callable[[bytes], int] | None = None
    column: str | None = None
    context_column: bool = True
    value: str | None = None
    message: tuple[str, ...] = ()
    partitions: int = 4
    compress: str | None = None  # "gzip", or "gzip-truncated"
    mode: str = "replace"
    dsn_options: str | None = None
    min_pieces: int = 0  # assert the file really is split into at least this many pieces
    check: Callable[[Any, str], None] | None = None  # extra check on the loaded target
    # what plain COPY is given instead of the file's bytes, where the load departs from it
    # on purpose (a UTF-8 byte-order mark is dropped: see the README, "byte-order mark")
    reference: Callable[[bytes], bytes] | None = None


def _lines(*records: str, eol: str = "\n", final: bool = True) -> bytes:
    text = eol.join(records) + (eol if final else "")
    return text.encode()


def _line_of(marker: bytes) -> Callable[[bytes], int]:
    """The physical line on which the record starting with ``marker`` begins."""

    def find(data: bytes) -> int:
        at = data.index(b"\n" + marker) + 1 if not data.startswith(marker) else 0
        return data[:at].count(b"\n") + 1

    return find


def _line_of_cr(marker: bytes) -> Callable[[bytes], int]:
    def find(data: bytes) -> int:
        at = data.index(b"\r" + marker) + 1
        return data[:at].count(b"\r") + 1

    return find


def _csv_field(value: Any) -> str:
    if value is None:
        return ""
    text = str(value)
    if text == "" or any(c in text for c in ',"\r\n') or text.strip() != text or text == "\\.":
        return '"' + text.replace('"', '""') + '"'
    return text


def _items_csv(data: list[tuple[Any, ...]], eol: str = "\n") -> bytes:
    return "".join(",".join(_csv_field(v) for v in row) + eol for row in data).encode()


# --- big generated inputs ------------------------------------------------------------------


def _big_with_bad_value() -> bytes:
    """20 000 nasty rows (quoted newlines, CRLF inside quotes) with a bad amount deep inside."""
    data = rows(20_000, seed=21)
    data[16_999] = (17_000, "bad one", "12x.50", "2024-01-05", "note")
    return _items_csv(data)


def _big_crlf_with_bad_date() -> bytes:
    data = rows(12_000, seed=5)
    data = [(i, f"multi\r\nline {i}" if i % 3 == 0 else n, a, d, no) for i, n, a, d, no in data]
    data[9_499] = (9_500, "bad date", "1.00", "2024-02-30", None)
    return _items_csv(data, eol="\r\n")


def _big_cr_only_with_bad_int() -> bytes:
    data = [
        (i, f"lf\ninside {i}" if i % 4 == 0 else f"n{i}", "1.00", None, None)
        for i in range(1, 6001)
    ]
    text = _items_csv(data, eol="\r")
    return text.replace(b"\r4500,", b"\r45oo,")


def _big_escape_backslash() -> bytes:
    """escape='\\': escaped quotes and escaped backslashes right before quoted newlines."""
    rnd = random.Random(3)
    out = []
    for i in range(1, 8001):
        name = rnd.choice(
            [
                '"a\\"b"',  # a"b
                '"ends with quote\\"\nnext line"',  # quoted newline after an escaped quote
                '"back\\\\"',  # back\ (escaped escape, then the closing quote)
                '"x\\\\\\"\ny"',  # x\"<LF>y
                '"doubled "" quote"',  # with escape != quote: "doubled " then " quote"
                "unquoted\\backslash",
                '"a\\b"',  # a backslash before an ordinary byte stays
            ]
        )
        out.append(f"{i},{name},1.00,,\n")
    return "".join(out).encode()


def _big_single_quote_semicolon() -> bytes:
    out = []
    for i in range(1, 6001):
        name = ["'semi;colon'", "'it''s'", "'multi\nline \"dq\"'", 'plain "dq"', "''"][i % 5]
        out.append(f"{i};{name};1.00;;'x;\r\ny'\n")
    return "".join(out).encode()


def _text_backslash_newlines() -> bytes:
    """Text format: a backslash before a real newline makes it data (one record, two lines)."""
    out = []
    for i in range(1, 4001):
        txt = "two\\\nlines" if i % 3 == 0 else ("tab\\there\\\\" if i % 5 == 0 else f"r{i}")
        out.append(f"{'2900x' if i == 2900 else i}\t{txt}\n")
    return "".join(out).encode()


def _big_no_final_newline() -> bytes:
    return _items_csv(rows(6000, seed=9)).rstrip(b"\n")


def _huge_field() -> bytes:
    big = ('x"y\n' * 400_000)[:1_500_000]  # 1.5 MB with quotes and newlines in it
    data = rows(3000, seed=2)
    data[1500] = (1501, big, "3.00", "2024-01-01", "after the big one")
    return _items_csv(data)


def _huge_bad_value() -> bytes:
    data = [(i, f"n{i}", "1.00", None, None) for i in range(1, 1001)]
    text = _items_csv(data)
    return text.replace(b"\n700,n700,1.00", b"\n" + b"7" * 1_200_000 + b"x,n700,1.00")


def _dot_line_csv() -> bytes:
    data = [f"row {i}" for i in range(1, 3001)]
    data[1999] = "\\."
    return _lines(*data)


def _dot_line_text() -> bytes:
    data = [f"{i}\trow {i}" for i in range(1, 3001)]
    data[1999] = "\\."
    return _lines(*data)


def _mixed_at_piece_boundary() -> bytes:
    """CRLF records, then LF records, the switch exactly where the file is cut in half."""
    first = "".join(f"{i},crlf {i:05d}\r\n" for i in range(1, 1001)).encode()
    second = "".join(f"{i},lf {i:05d}\n" for i in range(1001, 2001)).encode()
    pad = len(first) - len(second)
    assert pad >= 0
    second = second[:-1] + b"p" * pad + b"\n"
    assert len(first) == len(second)
    return first + second


def _mixed_inside() -> bytes:
    lines = [f"{i},row {i}\r\n" for i in range(1, 2001)]
    lines[1233] = "1234,lf only\n"
    return "".join(lines).encode()


def _invalid_utf8_deep() -> bytes:
    data = [(i, f"n{i}", "1.00", None, "ok") for i in range(1, 4001)]
    text = _items_csv(data)
    return text.replace(b"\n3001,n3001,1.00,,ok", b"\n3001,n3001,1.00,,o\xc3\x28k")


def _nul_byte() -> bytes:
    data = [(i, f"n{i}", "1.00", None, "ok") for i in range(1, 2001)]
    return _items_csv(data).replace(b"\n1500,n1500,", b"\n1500,n\x001500,")


def _bom_header() -> bytes:
    return b"\xef\xbb\xbf" + _lines("id,name,amount,day,note", "1,a,1.00,2024-01-01,x", "2,b,2,,")


def _latin1() -> bytes:
    text = "id,café\n" + "".join(f"{i},Ä ö ü ß é ÿ ñ {i}\n" for i in range(1, 2001))
    return text.encode("latin-1")


def _nfd_nfc() -> bytes:
    nfc = unicodedata.normalize("NFC", "Café Ångström ñ")
    nfd = unicodedata.normalize("NFD", "Café Ångström ñ")
    assert nfc != nfd
    return "".join(f"{i},{nfc if i % 2 else nfd}\n" for i in range(1, 1001)).encode()


def _check_nfd_kept(db: Any, table: str) -> None:
    nfd = unicodedata.normalize("NFD", "Café Ångström ñ")
    count = db.scalar(
        sql.SQL("SELECT count(*) FROM {} WHERE txt = %s").format(db.ident(table)), nfd
    )
    assert count == 500  # not normalised on the way in


def _truncated_gzip_source() -> bytes:
    """Big enough that more than one 1 MiB chunk decompresses (and reaches COPY) before the
    stream breaks off: the rows already sent must not be committed."""
    return _items_csv(rows(60_000, seed=4))


def _gzip_bad_value() -> bytes:
    data = [(i, f"n{i}", "1.00", None, None) for i in range(1, 3001)]
    data[2221] = (2222, None, "1.00", None, None)  # NOT NULL name
    return b"id,name,amount,day,note\n" + _items_csv(data)


CASES: list[Case] = [
    # --- quoting, newlines, escapes ------------------------------------------------------
    Case(
        "quoted-newlines-and-crlf-inside-fields",
        _items_csv(rows(4000, seed=1)),
        min_pieces=4,
    ),
    Case(
        "crlf-file-with-quoted-crlf",
        _items_csv(rows(4000, seed=8), eol="\r\n"),
        min_pieces=4,
    ),
    Case(
        "cr-only-file-with-quoted-lf",
        _items_csv([(i, f"a\nb {i}", "1.00", None, "x\ny") for i in range(1, 3001)], eol="\r"),
        min_pieces=4,
    ),
    Case(
        "doubled-quotes",
        _lines('1,"say ""hi""",1,,""""', '2,"""",2,,"a""', '3,"b""', '""c",3,,'),
    ),
    Case(
        "backslash-escaped-quotes-escape-backslash",
        _big_escape_backslash,
        options={"escape": "\\"},
        min_pieces=4,
    ),
    Case(
        "stray-quote-inside-unquoted-field",
        _lines(*[f"{i},n{i},1,," for i in range(1, 200)], '200,say "hi,1,,', "201,n,1,,"),
        line=200,
        message=("unterminated CSV quoted field",),
    ),
    Case(
        "two-stray-quotes-join-two-lines",
        _lines(
            *[f"{i},n{i},1,," for i in range(1, 100)], '100,a"b,1,,', '101,c"d,1,,', "102,e,1,,"
        ),
        line=100,
        message=("extra data after last expected column",),
    ),
    # --- NULL and empty ------------------------------------------------------------------
    Case(
        "null-marker-vs-empty-vs-quoted-null-marker",
        _lines("1,a,1,,NULL", '2,b,2,,"NULL"', "3,c,3,NULL,", '4,d,4,NULL,""'),
        options={"null": "NULL"},
    ),
    Case(
        "default-null-empty-vs-quoted-empty",
        _lines("1,a,1,,", '2,b,2,,""', '3,"",3,,'),
    ),
    Case("backslash-N-in-csv-is-text", _lines("1,\\N,1,,\\N", '2,"\\N",2,,"\\N"')),
    Case(
        "whitespace-around-fields",
        _lines(" 1 , a , 1.50 , 2024-01-02 , b ", '2, "q" ,  2 ,2024-01-03,  "x" '),
    ),
    Case(
        "empty-name-violates-not-null",
        _lines(*[f"{i},n{i},1,," for i in range(1, 300)], "300,,1,,", "301,n,1,,"),
        line=300,
        column="name",
        context_column=False,
        message=("not-null",),
    ),
    Case(
        # COPY's CONTEXT quotes the whole record, newline included, for record-level errors
        "missing-column-in-record-after-quoted-newlines",
        _lines("1,a,1,,x", '2,"multi\nline",1,,', '3,"x\ny",1'),
        line=4,
        column="day",
        context_column=False,
        message=('missing data for column "day"',),
    ),
    Case(
        "domain-not-null-null-input",
        _lines("1,5", "2,", "3,7"),
        setup="CREATE DOMAIN {s}.posint AS integer NOT NULL CHECK (VALUE > 0)",
        ddl="CREATE TABLE {t} (id integer, n {s}.posint)",
        seed="INSERT INTO {t} VALUES (-1, 1)",
        line=2,
        column="n",
        message=("does not allow null values",),
    ),
    # --- shape of the records ------------------------------------------------------------
    Case(
        "trailing-delimiter",
        _lines(*[f"{i},n{i},1,,x" for i in range(1, 50)], "50,n50,1,,x,", "51,n,1,,"),
        line=50,
        message=("extra data after last expected column",),
    ),
    Case(
        "too-few-columns",
        _lines(*[f"{i},n{i},1,," for i in range(1, 400)], "400,n400,1,", "401,n,1,,"),
        line=400,
        column="note",
        context_column=False,
        message=('missing data for column "note"',),
    ),
    Case(
        "too-many-columns",
        _lines(*[f"{i},n{i},1,," for i in range(1, 400)], "400,n,1,,,extra", "401,n,1,,"),
        line=400,
        message=("extra data after last expected column",),
    ),
    Case(
        "blank-line-in-the-middle",
        _lines(*[f"{i},n{i},1,," for i in range(1, 500)], "", "501,n,1,,"),
        line=500,
        column="name",
        context_column=False,
        message=('missing data for column "name"',),
    ),
    Case(
        "blank-line-at-the-end",
        _lines(*[f"{i},n{i},1,," for i in range(1, 500)], ""),
        line=500,
        column="name",
        context_column=False,
    ),
    Case(
        "blank-lines-single-text-column-are-nulls",
        _lines("a", "", "b", "", ""),
        ddl=ONE,
        seed=ONE_SEED,
    ),
    Case(
        # COPY fixes the line ending from the first record and rejects the other style; cut
        # in two exactly at the switch, each half on its own is consistent.
        "mixed-line-endings-switch-at-piece-boundary",
        _mixed_at_piece_boundary,
        ddl=PAIRS,
        seed=PAIRS_SEED,
        line=1001,
        message=("unquoted newline found in data",),
    ),
    Case(
        "mixed-line-endings-one-lf-line-in-crlf-file",
        _mixed_inside,
        ddl=PAIRS,
        seed=PAIRS_SEED,
        line=1234,
        message=("unquoted newline found in data",),
    ),
    Case(
        "no-final-newline",
        _big_no_final_newline,
        min_pieces=4,
    ),
    Case("empty-file", b""),
    Case("empty-file-with-header", b"", options={"header": True}),
    Case("header-only-file", b"id,name,amount,day,note\n", options={"header": True}),
    Case("header-only-no-newline", b"id,name,amount,day,note", options={"header": True}),
    # --- encodings -----------------------------------------------------------------------
    Case(
        "utf8-bom-with-header",
        _bom_header,
        options={"header": True},
    ),
    Case(  # plain COPY fails on the mark (invalid input for integer: "\ufeff1"); we drop it
        "utf8-bom-without-header",
        _lines("\ufeff1,a,1,,", "2,b,2,,"),
        reference=lambda data: data.removeprefix(b"\xef\xbb\xbf"),
    ),
    Case(
        "invalid-utf8-deep-in-file",
        _invalid_utf8_deep,
        line=3001,
        message=('invalid byte sequence for encoding "UTF8": 0xc3 0x28',),
    ),
    Case(
        "invalid-utf8-in-header",
        b"id,n\xffame,amount,day,note\n1,a,1,,\n",
        options={"header": True},
        expect=(BadDataError, LoadRefusedError),
        line=1,
    ),
    Case(
        "latin1-file-with-encoding-latin1-and-header",
        _latin1,
        ddl='CREATE TABLE {t} (id integer, "café" text)',
        seed="INSERT INTO {t} VALUES (-1, 'old')",
        options={"header": True, "encoding": "LATIN1"},
        min_pieces=4,
    ),
    Case(
        "win1252-byte-without-equivalent",
        b"".join(f"{i},café\n".encode("cp1252") for i in range(1, 100)) + b"100,x\x81y\n",
        ddl=PAIRS,
        seed=PAIRS_SEED,
        options={"encoding": "WIN1252"},
        line=100,
        message=("has no equivalent",),
    ),
    Case(
        "nul-byte",
        _nul_byte,
        line=1500,
        message=("0x00",),
    ),
    Case(
        "nfd-and-nfc-unicode-kept-as-sent",
        _nfd_nfc,
        ddl=PAIRS,
        seed=PAIRS_SEED,
        check=_check_nfd_kept,
    ),
    # --- types ---------------------------------------------------------------------------
    Case(
        "varchar-overflow",
        _lines("1,abc", "2,abcdef", "3,x"),
        ddl="CREATE TABLE {t} (id integer, code varchar(5))",
        seed="INSERT INTO {t} VALUES (-1, 'old')",
        line=2,
        column="code",
        value="abcdef",
        message=("character varying(5)",),
    ),
    Case(
        "int4-out-of-range",
        _lines("1,a,1,,", "2147483648,b,1,,"),
        line=2,
        column="id",
        value="2147483648",
    ),
    Case(
        "decimal-text-into-int",
        _lines("1,a,1,,", "2,b,1,,", "12.0,c,1,,"),
        line=3,
        column="id",
        value="12.0",
    ),
    Case(
        "malformed-date",
        _lines("1,a,1,2024-02-28,", "2,b,1,2024-02-30,"),
        line=2,
        column="day",
        value="2024-02-30",
    ),
    Case(
        "datestyle-ambiguous-date-server-default",
        _lines("1,a,1,01/02/2024,", "2,b,1,12/11/10,", "3,c,1,2024-03-04,"),
    ),
    Case(
        "datestyle-ambiguous-date-dmy-from-dsn",
        _lines("1,a,1,01/02/2024,", "2,b,1,12/11/10,", "3,c,1,13/01/2024,"),
        dsn_options="-c DateStyle=ISO,DMY",
    ),
    Case(
        "datestyle-day-13-as-month",
        _lines("1,a,1,01/02/2024,", "2,b,1,13/01/2024,"),
        line=2,
        column="day",
        value="13/01/2024",
    ),
    Case(
        "timestamps-with-offsets",
        _lines(
            "1,2024-03-10 02:30:00+05:30,2024-03-10 02:30:00+05:30",
            "2,2024-03-10T02:30:00Z,2024-03-10T02:30:00Z",
            "3,2024-10-27 01:30:00 Europe/Berlin,2024-10-27 01:30:00 Europe/Berlin",
            "4,2024-01-01 00:00:00-12,2024-01-01 00:00:00-12",
            "5,infinity,-infinity",
        ),
        ddl="CREATE TABLE {t} (id integer, tz timestamptz, naive timestamp)",
        seed="INSERT INTO {t} VALUES (-1, now(), now()::timestamp)",
    ),
    # --- constraints ---------------------------------------------------------------------
    Case(
        "duplicate-keys",
        _lines(*[f"{i},n{i},1,," for i in range(1, 1000)], "5,dup,1,,"),
        expect=ConstraintViolationError,
        message=("items_pkey", "(id)=(5)"),
    ),
    Case(
        "duplicate-key-with-existing-row-append",
        _lines("1,a,1,,", "-1,again,1,,"),
        mode="append",
        expect=ConstraintViolationError,
        message=("items_pkey", "(id)=(-1)"),
    ),
    Case(
        "foreign-key-violation",
        _lines(*[f"{i},{i % 10}" for i in range(1, 500)], "500,42"),
        setup="CREATE TABLE {s}.groups (gid integer PRIMARY KEY);"
        " INSERT INTO {s}.groups SELECT generate_series(0, 9)",
        ddl="CREATE TABLE {t} (id integer PRIMARY KEY, gid integer REFERENCES {s}.groups)",
        seed="INSERT INTO {t} VALUES (-1, 1)",
        expect=ConstraintViolationError,
        message=("items_gid_fkey", "(gid)=(42)"),
    ),
    Case(
        "check-violation",
        _lines(*[f"{i},n{i},1,," for i in range(1, 300)], "300,n,-5,,"),
        expect=ConstraintViolationError,
        message=("items_amount_check",),
    ),
    # --- sizes and markers ---------------------------------------------------------------
    Case("field-over-1mb", _huge_field, min_pieces=2),
    Case(
        "bad-value-over-1mb-is-truncated",
        _huge_bad_value,
        line=700,
        column="id",
        value="7" * 80,
    ),
    # --- headers -------------------------------------------------------------------------
    Case(
        "header-in-other-order-and-case",
        _lines("NOTE,Day,amount,name,ID", "x,2024-01-01,1.5,a,1", ",,2,b,2"),
        options={"header": True},
        ref_columns=("note", "day", "amount", "name", "id"),
    ),
    Case(
        "header-names-that-need-quoting",
        _lines('"quo""te","Na,me","sp ace","Üni",id', "1,2,3,4,5", '"a""b","c,d"," e ",ü,6'),
        ddl='CREATE TABLE {t} (id integer, "Na,me" text, "quo""te" text, "sp ace" text,'
        ' "Üni" text)',
        seed="INSERT INTO {t} VALUES (-1, 'o', 'l', 'd', '!')",
        options={"header": True},
        ref_columns=('quo"te', "Na,me", "sp ace", "Üni", "id"),
    ),
    Case(
        "header-names-with-spaces-match-nothing",
        _lines(" id,name,amount,day,note", "1,a,1,,"),
        options={"header": True},
        ref_options="FORMAT csv, HEADER match",
        expect=LoadRefusedError,
        message=("' id'",),
    ),
    Case(
        "unterminated-quote-in-header",
        _lines('id,"name,amount,day,note', "1,a,1,,", "2,b,2,,"),
        options={"header": True},
        ref_options="FORMAT csv, HEADER match",
        expect=(BadDataError, LoadRefusedError),
        line=1,
        message=("unterminated",),
    ),
    Case(
        "header-names-a-column-twice",
        _lines("id,ID,name,amount,day", "1,2,a,1,"),
        options={"header": True},
        ref_options="FORMAT csv, HEADER match",
        ref_columns=("id", "id", "name", "amount", "day"),
        expect=LoadRefusedError,
        message=("more than once",),
    ),
    Case(
        "header-names-an-unknown-column",
        _lines("id,name,amount,day,colour", "1,a,1,,red"),
        options={"header": True},
        ref_options="FORMAT csv, HEADER match",
        ref_columns=("id", "name", "amount", "day", "colour"),
        expect=LoadRefusedError,
        message=("colour",),
    ),
    # --- other syntaxes --------------------------------------------------------------------
    Case(
        "single-quote-quoting-and-semicolon-delimiter",
        _big_single_quote_semicolon,
        options={"quote": "'", "delimiter": ";"},
        min_pieces=4,
    ),
    Case(
        "text-format-backslash-newline-data-then-bad-value",
        _text_backslash_newlines,
        ddl=PAIRS,
        seed=PAIRS_SEED,
        options={"format": "text"},
        line=_line_of(b"2900x\t"),
        column="id",
        value="2900x",
        min_pieces=4,
    ),
    Case(
        # SJIS is split into no pieces (its second bytes can be 0x5c), but the line of a bad
        # value must still be found the way COPY reads SJIS: "表" is 0x95 0x5c, and the 0x5c
        # before the newline is part of the character, not an escape.
        "sjis-text-trail-byte-0x5c-before-newline-then-bad-value",
        "".join(f"{i}\t{'表' if i in (3, 5) else 'x'}\n" for i in range(1, 7)).encode("cp932")
        + b"7x\tbad\n8\tz\n",
        ddl=PAIRS,
        seed=PAIRS_SEED,
        options={"format": "text", "encoding": "SJIS"},
        line=7,
        column="id",
        value="7x",
    ),
    Case(
        "not-null-violation-append",
        _lines("1,a,1,,", "2,,1,,", "3,c,1,,"),
        mode="append",
        expect=ConstraintViolationError,
        message=('"name"', "not-null"),
    ),
    # --- deep in big files -----------------------------------------------------------------
    Case(
        "bad-amount-deep-in-big-file-4-partitions",
        _big_with_bad_value,
        line=_line_of(b"17000,"),
        column="amount",
        value="12x.50",
        min_pieces=4,
    ),
    Case(
        "bad-date-deep-in-big-crlf-file-with-quoted-crlf",
        _big_crlf_with_bad_date,
        line=_line_of(b"9500,"),
        column="day",
        value="2024-02-30",
        partitions=5,
        min_pieces=4,
    ),
    Case(
        "bad-int-deep-in-big-cr-only-file",
        _big_cr_only_with_bad_int,
        line=_line_of_cr(b"45oo,"),
        column="id",
        value="45oo",
        min_pieces=4,
    ),
    # --- compressed ------------------------------------------------------------------------
    Case(
        "gzip-with-header",
        _gzip_bad_value().replace(b"2222,,", b"2222,x,"),
        options={"header": True},
        compress="gzip",
    ),
    Case(
        "gzip-not-null-violation-with-header",
        _gzip_bad_value,
        options={"header": True},
        compress="gzip",
        line=2223,
        column="name",
        context_column=False,
    ),
    # A gzip file cut short: plain COPY cannot even be given these bytes (the stream does not
    # decompress to its end), so the truth is "fails"; the load must say which file.
    Case("truncated-gzip", _truncated_gzip_source, compress="gzip-truncated"),
]


# --- the reference: one plain COPY -----------------------------------------------------------


@dataclass
class Reference:
    """What one plain COPY of the bytes did: its checksum, or its error."""

    checksum: tuple[int, str | None] | None
    error: Exception | None


# The options of the reference COPY are written here by hand from the case's own parameters,
# never from the package's CopyOptions or sql module, so a wrong default there cannot sit on
# both sides. What a case does not set is left to plain COPY's own defaults, which are the
# README's (delimiter "," for csv and tab for text, NULL as unquoted empty for csv and \N for
# text, quote '"', escape = the quote); the one README default that is not COPY's is the
# encoding (UTF8, where COPY would take the client's), so it is always spelled out.
_REFERENCE_OPTIONS = {
    "delimiter": "DELIMITER",
    "null": "NULL",
    "quote": "QUOTE",
    "escape": "ESCAPE",
}


def _copy_options(case: Case) -> sql.Composable:
    if case.ref_options:
        return sql.SQL(case.ref_options)
    given = dict(case.options)
    unknown = set(given) - {"format", "header", "encoding", *_REFERENCE_OPTIONS}
    assert not unknown, f"case {case.id}: no reference COPY option written for {unknown}"
    fmt = given.get("format", "csv")
    assert fmt in ("csv", "text"), fmt
    parts = [sql.SQL("FORMAT " + fmt)]
    if given.get("header"):
        parts.append(sql.SQL("HEADER true"))
    for key, keyword in _REFERENCE_OPTIONS.items():
        if given.get(key) is not None:
            parts.append(sql.SQL(keyword + " {}").format(sql.Literal(given[key])))
    parts.append(sql.SQL("ENCODING {}").format(sql.Literal(given.get("encoding", "UTF8"))))
    return sql.SQL(", ").join(parts)


def plain_copy(conn: psycopg.Connection, db: Any, case: Case, data: bytes | None) -> Reference:
    """One ``COPY reference FROM STDIN`` of ``data`` (None: the bytes cannot even be read)."""
    if data is None:
        return Reference(None, EOFError("the compressed stream is truncated"))
    columns = sql.SQL("")
    if case.ref_columns:
        columns = sql.SQL(" ({})").format(sql.SQL(", ").join(map(sql.Identifier, case.ref_columns)))
    statement = sql.SQL("COPY {}{} FROM STDIN WITH ({})").format(
        db.ident("reference"), columns, _copy_options(case)
    )
    try:
        with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
            for start in range(0, len(data), 1 << 16):
                copy.write(data[start : start + (1 << 16)])
    except psycopg.Error as exc:
        return Reference(None, exc)
    return Reference(db.checksum("reference"), None)


# --- the test ---------------------------------------------------------------------------------


def _ddl(db: Any, template: str, name: str) -> sql.Composable:
    return sql.SQL(template).format(t=db.ident(name), s=sql.Identifier(db.schema))


def _write_source(tmp_path: Path, case: Case, data: bytes) -> tuple[Path, bytes | None]:
    """The file to load and the bytes plain COPY gets (None: they cannot be decompressed)."""
    if case.compress is None:
        path = tmp_path / "data.csv"
        path.write_bytes(data)
        return path, data
    packed = gzip.compress(data, compresslevel=1, mtime=0)
    if case.compress == "gzip-truncated":
        packed = packed[: len(packed) * 2 // 3]
    path = tmp_path / "data.csv.gz"
    path.write_bytes(packed)
    try:
        return path, gzip.decompress(packed)
    except (EOFError, gzip.BadGzipFile):
        return path, None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_matches_plain_copy(db, driver, pg_dsn, tmp_path, case):
    data = case.data() if callable(case.data) else case.data
    if case.setup:
        for statement in case.setup.split(";"):
            db.run(_ddl(db, statement, "unused"))
    db.run(_ddl(db, case.ddl, "items"))
    db.run(_ddl(db, case.seed, "items"))
    db.run(_ddl(db, case.ddl, "reference"))
    if case.mode == "append":
        db.run(_ddl(db, case.seed, "reference"))
    before = db.checksum("items")
    path, copy_bytes = _write_source(tmp_path, case, data)
    dsn = make_conninfo(pg_dsn, options=case.dsn_options) if case.dsn_options else pg_dsn

    with psycopg.connect(dsn, autocommit=True) as ref_conn:
        truth = plain_copy(
            ref_conn, db, case, case.reference(copy_bytes) if case.reference else copy_bytes
        )

    if case.min_pieces:
        opts = CopyOptions(**case.options)
        files = listing.list_sources(str(path))
        header = {str(path): read_header(files[0], opts)[1]} if opts.header else {}
        pieces = [
            p
            for part in cutting.plan_partitions(files, opts, case.partitions, header)
            for p in part.pieces
        ]
        assert len(pieces) >= case.min_pieces

    load_error: Exception | None = None
    try:
        summary = runner.load(
            lambda: open_connection(dsn, driver),
            db.table("items"),
            str(path),
            mode=case.mode,
            partitions=case.partitions,
            **case.options,
        )
    except Exception as exc:
        load_error = exc

    assert leftovers(db) == []
    if truth.error is None:
        # Plain COPY loaded these bytes: the target holds exactly the same rows.
        assert load_error is None, f"plain COPY loaded the file, the load failed: {load_error!r}"
        assert db.checksum("items") == truth.checksum
        assert summary.rows == truth.checksum[0] - (2 if case.mode == "append" else 0)
        if case.check:
            case.check(db, "items")
        return

    # Plain COPY rejected these bytes: the load fails the same way, and says where.
    assert load_error is not None, (
        f"plain COPY failed ({truth.error!r}) but the load succeeded; target now holds "
        f"{db.checksum('items')[0]} rows"
    )
    assert db.checksum("items") == before, "the target was changed by a failed load"
    assert isinstance(load_error, case.expect), (
        f"expected {case.expect}, got {type(load_error).__name__}: {load_error}"
    )
    message = str(load_error)
    assert len(message) <= MESSAGE_LIMIT, f"error message is {len(message)} characters long"
    for text in case.message:
        assert text in message
    if isinstance(load_error, BadDataError):
        assert load_error.path == str(path)
        assert str(path) in message
        if case.line is not None:
            line = case.line(data) if callable(case.line) else case.line
            assert load_error.line == line
            assert re.search(rf"\blines? {line}\b", message), message
        if case.column is not None:
            assert case.column in message
            if case.context_column:
                assert load_error.column == case.column
                assert f"column {case.column}" in message
        if case.value is not None:
            assert case.value in message
    elif case.line is not None:
        # found before loading: still name the file and the line
        assert isinstance(load_error, PgBulkError)
        assert str(path) in message
        assert re.search(rf"\blines? {case.line}\b", message), message


def test_bad_value_in_one_of_many_files_names_that_file_and_its_line(db, connect, tmp_path):
    db.run(_ddl(db, ITEMS, "items"))
    db.run(_ddl(db, ITEMS_SEED, "items"))
    db.run(_ddl(db, ITEMS, "reference"))
    before = db.checksum("items")
    paths = []
    for n in range(5):
        data = [
            (n * 1000 + i, f"two\nlines {i}" if i % 4 == 0 else f"n{i}", "1.00", None, None)
            for i in range(1, 301)
        ]
        if n == 2:
            data[99] = (2100, "bad", "1.00", "2024-13-01", None)
        path = tmp_path / f"day-{n}.csv"
        path.write_bytes(_items_csv(data))
        paths.append(path)
    whole = b"".join(p.read_bytes() for p in paths)
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        truth = plain_copy(conn, db, Case("all", whole), whole)
    assert truth.error is not None

    with pytest.raises(BadDataError) as info:
        runner.load(
            connect, db.table("items"), str(tmp_path / "day-*.csv"), mode="replace", partitions=3
        )

    expected_line = 100 + 24  # 24 two-line records before record 100
    assert info.value.path == str(paths[2])
    assert info.value.line == expected_line
    assert info.value.column == "day"
    assert f"day-2.csv line {expected_line}, column day" in str(info.value)
    assert "2024-13-01" in str(info.value)
    assert db.checksum("items") == before
    assert leftovers(db) == []


@pytest.mark.parametrize("fmt", ["csv", "text"])
def test_end_of_data_marker_line_is_refused_where_copy_would_drop_rows(db, connect, tmp_path, fmt):
    """A record that is exactly ``\\.``: COPY FROM STDIN takes it for the end of its input in
    text format (every version) and in csv before PostgreSQL 18, and silently drops the rest
    of the file (plain COPY loads 1999 of 3000 rows here). The load refuses instead, naming
    the line. PostgreSQL 18 reads it as data in csv: there the load equals plain COPY."""
    data = _dot_line_csv() if fmt == "csv" else _dot_line_text()
    ddl, seed = (ONE, ONE_SEED) if fmt == "csv" else (PAIRS, PAIRS_SEED)
    for name in ("items", "reference"):
        db.run(_ddl(db, ddl, name))
    db.run(_ddl(db, seed, "items"))
    before = db.checksum("items")
    path = tmp_path / "data.txt"
    path.write_bytes(data)
    with (
        db.conn.cursor() as cur,
        cur.copy(
            sql.SQL("COPY {} FROM STDIN WITH (FORMAT {})").format(
                db.ident("reference"), sql.SQL(fmt)
            )
        ) as copy,
    ):
        copy.write(data)
    copied = db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("reference")))
    version = db.scalar("SELECT current_setting('server_version_num')::int")

    if fmt == "csv" and version >= 180000:
        runner.load(connect, db.table("items"), str(path), mode="replace", format=fmt, partitions=4)
        assert copied == 3000
        assert db.checksum("items") == db.checksum("reference")
        return
    assert copied == 1999  # what plain COPY silently does
    with pytest.raises(BadDataError) as info:
        runner.load(connect, db.table("items"), str(path), mode="replace", format=fmt, partitions=4)
    assert info.value.line == 2000
    assert f"{path} line 2000" in str(info.value)
    assert db.checksum("items") == before
    assert leftovers(db) == []
