"""Differential test: a load must give exactly what ONE plain ``COPY ... FROM STDIN`` of the
whole file gives, at every partition count ("Nothing lost, verified", item 3).

Thousands of small hostile files (csv and text format, every quote/escape/NULL/delimiter
setting, LF/CRLF/CR line endings inside and outside quotes, occasionally mixed, backslashes
everywhere, the ``\\.`` end-of-data marker anywhere, headers whose line ending may differ,
fields longer than the splitter's read block, empty files, no final newline, wrong field
counts) are generated from a fixed seed. For each file:

* the oracle is one ``COPY target FROM STDIN (...)`` of the whole file's bytes through psycopg 3,
  its options written here by hand from the case's parameters (not through the package);
* the load is ``airflow_pg_bulk.load(..., mode="append", partitions=N)`` into an empty table of
  the same shape, for N in :data:`PARTITIONS`.

The rule: where COPY succeeds the load gives the same rows (as a multiset); where COPY fails
the load fails with one of the package's errors. One exception: where COPY "succeeds" only
because it stopped at an end-of-data marker with bytes after it (rows silently skipped), the
load must fail with a ``BadDataError`` naming the marker's line. Where and when COPY takes
``\\.`` for the end of data is modelled independently here (:func:`marker_stop`, a transcription
of ``CopyReadLineText`` for 15 and 18); a final marker with nothing after it is harmless.

The incremental modes are checked the same way against plain SQL
(:func:`test_incremental_modes_match_plain_sql`): append, replace, replace_partitions and
upsert (in place and by rebuild) into plain and partitioned targets with an identity column
and columns with defaults, at every partition count, against the same statements in plain SQL
on a twin table: rows, the partition of each row, identity values, untouched partitions and
the catalog compared (54 loads, about a minute on 2 cores; not scaled by the knobs below, and
run in both of CI's passes).

Re-run: ``.venv/bin/python -m pytest -q tests/test_differential.py -x`` (the default server is
a throwaway PostgreSQL 18; ``PG_BULK_TEST_DSN`` names another). ``PG_BULK_DIFF_FILES`` sets how
many generated files (default 1000: about 2 minutes per server on 2 cores), ``PG_BULK_DIFF_SEED``
the seed, ``PG_BULK_DIFF_WORKERS`` how many files are checked at once (default 2),
``PG_BULK_DIFF_OBJECT_FILES`` how many more are loaded as objects from an S3 server (moto's;
default 16: a big one is cut into byte ranges). A batch's
failure prints, per kind, up to 3 cases with the server version, partition count, COPY options,
COPY's outcome and the load's, and each
case as a ``Case(...)`` literal (or its ``generate(seed)`` call): paste it into :data:`KNOWN`.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import catalog_snapshot, leftovers
from psycopg import sql

from airflow_pg_bulk import errors as pgbulk_errors
from airflow_pg_bulk import load

SEED = int(os.environ.get("PG_BULK_DIFF_SEED", "20261123"))
FILES = int(os.environ.get("PG_BULK_DIFF_FILES", "1000"))
BATCH = 100
PARTITIONS = (1, 3, 7)
COLUMNS = "abcd"  # the target tables t1..t4 have the first 1..4 of these, all text
LONG = 70_000  # longer than the splitter's 64 KiB read block


@dataclass(frozen=True)
class Case:
    """One file and the COPY options it is read with (None: COPY's default)."""

    fmt: str
    data: bytes
    ncols: int
    header: bool = False
    delimiter: str | None = None
    null: str | None = None
    quote: str | None = None
    escape: str | None = None
    label: str = ""

    def options(self) -> dict[str, Any]:
        """The same options for airflow_pg_bulk.load()."""
        opts: dict[str, Any] = {"format": self.fmt, "header": self.header}
        for name in ("delimiter", "null", "quote", "escape"):
            if getattr(self, name) is not None:
                opts[name] = getattr(self, name)
        return opts


@dataclass
class Outcome:
    """What one COPY or one load gave: rows (sorted), or an error."""

    rows: list[tuple[Any, ...]] | None = None
    error: BaseException | None = None
    message: str = field(default="")  # something wrong whatever the oracle says

    def describe(self) -> str:
        if self.error is None:
            assert self.rows is not None
            shown = [tuple(_short(v) for v in r) for r in self.rows[:6]]
            more = f" +{len(self.rows) - 6} more" if len(self.rows) > 6 else ""
            return f"{len(self.rows)} rows {shown}{more}"
        return f"{type(self.error).__name__}: {_short(str(self.error), 300)}"


def _short(value: Any, limit: int = 40) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"...({len(value)} chars)"
    return value


# --------------------------------------------------------------------------------------------
# The oracle: one plain COPY of the whole file, options written by hand.
# --------------------------------------------------------------------------------------------


def copy_options_sql(case: Case) -> sql.Composed:
    """``(FORMAT ..., HEADER ..., ...)`` for COPY, from the case's parameters."""
    parts: list[sql.Composable] = [sql.SQL("FORMAT {}").format(sql.SQL(case.fmt))]
    if case.header:
        parts.append(sql.SQL("HEADER true"))
    for keyword in ("delimiter", "null", "quote", "escape"):
        value = getattr(case, keyword)
        if value is not None:
            parts.append(sql.SQL(keyword.upper() + " {}").format(sql.Literal(value)))
    return sql.SQL("({})").format(sql.SQL(", ").join(parts))


def sorted_rows(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=lambda r: tuple((v is None, v or "") for v in r))


@dataclass
class Worker:
    """One of the batch's parallel checkers: its own connection, tables and file."""

    dsn: str
    schema: str
    conn: psycopg.Connection
    prefix: str
    directory: Path

    def table(self, kind: str, ncols: int) -> str:
        return f"{self.prefix}{kind}{ncols}"


def oracle(worker: Worker, case: Case) -> Outcome:
    """One COPY of the whole file into r<ncols>, rolled back after reading the rows."""
    conn = worker.conn
    table = sql.Identifier(worker.schema, worker.table("r", case.ncols))
    statement = sql.SQL("COPY {} FROM STDIN {}").format(table, copy_options_sql(case))
    try:
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            with cur.copy(statement) as copy:
                copy.write(case.data)
            cur.execute(sql.SQL("SELECT * FROM {}").format(table))
            return Outcome(rows=sorted_rows(cur.fetchall()))
    except psycopg.Error as exc:
        return Outcome(error=exc)


def run_load(worker: Worker, path: Path | str, case: Case, partitions: int) -> Outcome:
    """The package's in-process load into the empty t<ncols>, then its rows (and emptied)."""
    conn = worker.conn
    name = worker.table("t", case.ncols)
    table = f"{worker.schema}.{name}"
    ident = sql.Identifier(worker.schema, name)
    try:
        summary = load(
            worker.dsn,
            table,
            str(path),
            mode="append",
            partitions=partitions,
            analyze=False,
            **case.options(),
        )
    except Exception as exc:
        outcome = Outcome(error=exc)
    else:
        outcome = Outcome(rows=[])
    rows = sorted_rows(conn.execute(sql.SQL("SELECT * FROM {}").format(ident)).fetchall())
    if outcome.error is None:
        outcome.rows = rows
        if summary.rows != len(rows):
            outcome.message = "load's summary counts other rows than the target got"
    elif rows:  # a failed load must leave the target untouched
        outcome.message = "failed load left rows in the target"
    conn.execute(sql.SQL("TRUNCATE {}").format(ident))
    return outcome


# --------------------------------------------------------------------------------------------
# Where COPY takes "\." for the end of its input: CopyReadLineText, one byte at a time.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarkerStop:
    """COPY stopped at an end-of-data marker on ``line``; ``after`` bytes of the file followed."""

    line: int
    after: int


def marker_stop(case: Case, server_version: int) -> MarkerStop | None:
    """The end-of-data marker COPY stops at, for a file COPY read without an error.

    Before 18: text format stops at an unescaped ``\\.`` + newline anywhere on a line (data
    before it on the line is the last row); csv at ``\\.`` + newline as the first bytes of a
    record. 18: text format only at ``\\.`` alone on its line; csv never. Lines are physical
    lines of the file (counted by the last byte of the file's line ending)."""
    data, csv = case.data, case.fmt == "csv"
    v18 = server_version >= 180000
    if csv and v18:
        return None
    quote = (case.quote or '"').encode()[0]
    escape = (case.escape or case.quote or '"').encode()[0]
    escapec = -1 if escape == quote else escape
    eol: bytes | None = None
    in_quote = last_was_esc = False
    first_in_record = True
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        start = i
        i += 1
        record_start, first_in_record = first_in_record, False
        if csv:
            if in_quote and c == escapec:
                last_was_esc = not last_was_esc
            if c == quote and not last_was_esc:
                in_quote = not in_quote
            if c != escapec:
                last_was_esc = False
        if c == 0x0D and not (csv and in_quote):
            if i < n and data[i] == 0x0A and eol in (None, b"\r\n"):
                i += 1
                eol = b"\r\n"
            else:
                eol = eol or b"\r"
            first_in_record = True
            continue
        if c == 0x0A and not (csv and in_quote):
            eol = eol or b"\n"
            first_in_record = True
            continue
        if c != 0x5C or (csv and not record_start):
            continue
        if i < n and data[i] == 0x2E and not (v18 and not record_start):
            j = i + 1
            ending = eol or (b"\r\n" if data.startswith(b"\r\n", j) else data[j : j + 1])
            if ending in (b"\n", b"\r", b"\r\n") and data.startswith(ending, j):
                line = 1 + data.count((eol or ending)[-1:], 0, start)
                return MarkerStop(line, n - (j + len(ending)))
            if not csv:
                return None  # an error in COPY: "end-of-copy marker corrupt"
        elif not csv:
            i += 1  # a backslash makes the next byte ordinary
    return None


# --------------------------------------------------------------------------------------------
# The generator of hostile files.
# --------------------------------------------------------------------------------------------

EOLS = (b"\n", b"\r\n", b"\r")
PLAIN = b"abcxyz019 "


def _plain(rnd: random.Random, lo: int = 0, hi: int = 5) -> bytes:
    return bytes(rnd.choice(PLAIN) for _ in range(rnd.randint(lo, hi)))


def _csv_field(rnd: random.Random, case: dict[str, Any], eol: bytes) -> bytes:
    q = case["quote"].encode()
    e = (case["escape"] or case["quote"]).encode()
    d = case["delimiter"].encode()
    null = (case["null"] or "").encode()
    kind = rnd.choices(
        ["plain", "quoted", "backslash", "null", "qnull", "uni", "stray", "unterminated"],
        [50, 22, 10, 5, 3, 2, 2, 0.3],
    )[0]
    if kind == "plain":
        return _plain(rnd)
    if kind == "quoted":
        pieces = []
        for _ in range(rnd.randint(0, 4)):
            pieces.append(
                rnd.choice(
                    [
                        _plain(rnd, 1),
                        d,
                        e + q,
                        e + e,
                        b"\n",
                        b"\r",
                        b"\r\n",
                        eol,
                        b"\\",
                        b"\\.",
                        eol + b"\\." + eol,
                        b"\n\\.\n",
                        null,
                        b"\\N",
                    ]
                )
            )
        return q + b"".join(pieces) + q
    if kind == "backslash":
        return rnd.choice([b"\\", b"x\\", b"\\\\", b"\\N", b"\\.", b"a\\.", b"\\.b", b"\\\\."])
    if kind == "null":
        return null
    if kind == "qnull":
        return q + null + q
    if kind == "uni":
        return "é✓".encode()
    if kind == "stray":
        return b"a" + q + b"b"
    return q + _plain(rnd)  # unterminated: COPY fails at the end of the file


def _text_field(rnd: random.Random, case: dict[str, Any], eol: bytes) -> bytes:
    d = (case["delimiter"] or "\t").encode()
    null = (case["null"] if case["null"] is not None else "\\N").encode()
    kind = rnd.choices(
        ["plain", "escapes", "trailing", "marker", "null", "uni"], [50, 22, 5, 4, 5, 2]
    )[0]
    if kind == "plain":
        return _plain(rnd)
    if kind == "escapes":
        pieces = []
        for _ in range(rnd.randint(1, 4)):
            pieces.append(
                rnd.choice(
                    [
                        _plain(rnd, 1),
                        b"\\\\",
                        b"\\t",
                        b"\\n",
                        b"\\r",
                        b"\\N",
                        b"\\" + d,
                        b"\\\n",
                        b"\\\r",
                        b"\\\r\\\n",
                        b"\\" + eol[:1],
                        b"\\101",
                        b"\\x41",
                        b"\\\\.",
                        b"\\\\\\\\",
                    ]
                )
            )
        return b"".join(pieces)
    if kind == "trailing":
        return _plain(rnd) + b"\\"
    if kind == "marker":
        return rnd.choice([b"\\.", b"x\\.", b"\\.x", b"\\\\.", b"a\\\\\\."])
    if kind == "null":
        return null
    return "é✓".encode()


def _long_field(rnd: random.Random, case: dict[str, Any], eol: bytes) -> bytes:
    body = bytes(rnd.choice(PLAIN) for _ in range(64)) * (LONG // 64)
    if case["fmt"] == "csv" and rnd.random() < 0.5:
        q = case["quote"].encode()
        cut = rnd.randrange(len(body))
        return q + body[:cut] + eol + body[cut:] + q  # a quoted newline deep inside
    if case["fmt"] == "text" and rnd.random() < 0.5:
        cut = rnd.randrange(len(body))
        return body[:cut] + b"\\" + eol[:1] + body[cut:]  # an escaped newline deep inside
    return body


def generate(seed: str) -> Case:
    """One random hostile case, fully determined by ``seed``."""
    rnd = random.Random(seed)
    fmt = rnd.choice(["csv", "text"])
    ncols = rnd.randint(1, 4)
    delimiter = rnd.choice([",", "|", "\t", ";"])
    case: dict[str, Any] = {"fmt": fmt, "delimiter": delimiter, "quote": '"', "escape": None}
    if fmt == "csv":
        case["quote"] = rnd.choice(['"', '"', "'"])
        case["escape"] = rnd.choice([None, None, case["quote"], "\\"])
        nulls = ["NULL", "\\N", "nil", "-", ""]
    else:
        nulls = ["NULL", "\\N", "", "nil", "-"]
    case["null"] = rnd.choice([None, None, None, *nulls])
    if case["null"] is not None and delimiter in case["null"]:
        case["null"] = None
    eol = rnd.choice(EOLS)
    header = rnd.random() < 0.25
    size = rnd.choice([0, 1, 2, 3, 4, 5, 6, 8, 12]) if rnd.random() > 0.03 else 0
    field_of = _csv_field if fmt == "csv" else _text_field
    wrong_count = rnd.random() < 0.08
    long_field = rnd.random() < 0.03
    records: list[bytes] = []
    for _ in range(size):
        width = ncols
        if wrong_count and rnd.random() < 0.3:
            width = max(1, ncols + rnd.choice([-1, 1]))
        fields = [field_of(rnd, case, eol) for _ in range(width)]
        if long_field and rnd.random() < 0.3:
            fields[rnd.randrange(width)] = _long_field(rnd, case, eol)
        records.append(delimiter.encode().join(fields))
    # end-of-data markers, empty lines, records ending in "\."
    for _ in range(rnd.choices([0, 1, 2], [70, 25, 5])[0]):
        special = rnd.choice([b"\\.", b"\\.", b"", b"x\\."])
        if special == b"x\\." and records:
            k = rnd.randrange(len(records))
            records[k] += b"\\."
        else:
            records.insert(rnd.randint(0, len(records)), special)
    endings = [eol] * len(records)
    if records and rnd.random() < 0.05:  # mixed line endings: COPY errors
        endings[rnd.randrange(len(records))] = rnd.choice([x for x in EOLS if x != eol])
    data = b"".join(r + t for r, t in zip(records, endings, strict=True))
    if records and rnd.random() < 0.2:
        data = data[: -len(endings[-1])]  # no final newline
    if rnd.random() < 0.06:  # a final marker, with or without a newline after it
        data += b"\\." + rnd.choice([eol, b""])
    if header:
        names = [c.encode() for c in COLUMNS[:ncols]]
        if fmt == "csv" and rnd.random() < 0.3:
            q = case["quote"].encode()
            names = [q + name + q for name in names]
        header_eol = eol if rnd.random() < 0.8 else rnd.choice(EOLS)
        data = delimiter.encode().join(names) + header_eol + data
    return Case(
        fmt=fmt,
        data=data,
        ncols=ncols,
        header=header,
        delimiter=None
        if rnd.random() < 0.3 and delimiter == _default_delimiter(fmt)
        else delimiter,
        null=case["null"],
        quote=case["quote"]
        if fmt == "csv" and (case["quote"] != '"' or rnd.random() < 0.3)
        else None,
        escape=case["escape"],
        label=seed,
    )


def _default_delimiter(fmt: str) -> str:
    return "," if fmt == "csv" else "\t"


# --------------------------------------------------------------------------------------------
# Known repros (text unless marked).
# --------------------------------------------------------------------------------------------

HUNDRED = b"".join((b"40\tx\\.\n" if n == 40 else b"%d\tx\n" % n) for n in range(1, 101))

KNOWN: list[Case] = [
    Case("text", b"1\ta\tbbb\n2\tc\td\\\r\n3\te\tfff\n", 3, label="escaped CR in an LF file"),
    Case("csv", b"a,b,c\r\n1,x,y\n2,z,w\n", 3, header=True, label="header CRLF, data LF"),
    Case("csv", b"1,a,b\n2,c,d\n\\.\n", 3, label="csv final marker"),
    Case("text", b"1\ta\tb\\.\n2\tc\td\n3\te\tf\n", 3, label="text x\\. on line 1"),
    Case("csv", b'1,"x\n\\.\ny",z\n2,b,c\n', 3, label="csv marker inside quotes"),
    Case("text", HUNDRED, 2, label="text 100 lines, x\\. on line 40"),
    # found by this test: the marker's part is not the only one to fail
    Case("text", b"1\tx\n\\.\n2\n3\n4\n5\n6\n", 2, label="marker, then bad rows"),
    Case("text", b"zb\r\n\\.\r\n\\.\r\nz", 1, label="two markers"),
]

# What the brief says of the known repros, to check the oracle and marker model here:
# (COPY rows or "error", the line of a marker COPY stops at with rows after it) per major.
KNOWN_EXPECTED: dict[str, dict[int, tuple[int | str, int | None]]] = {
    "escaped CR in an LF file": {15: (3, None), 18: (3, None)},
    "header CRLF, data LF": {15: ("error", None), 18: ("error", None)},
    "csv final marker": {15: (2, None), 18: ("error", None)},
    "text x\\. on line 1": {15: (1, 1), 18: ("error", None)},
    "csv marker inside quotes": {15: (2, None), 18: (2, None)},
    "text 100 lines, x\\. on line 40": {15: (40, 40), 18: ("error", None)},
    "marker, then bad rows": {15: (1, 2), 18: (1, 2)},
    "two markers": {15: (1, 2), 18: (1, 2)},
}


# --------------------------------------------------------------------------------------------
# The check.
# --------------------------------------------------------------------------------------------


@dataclass
class Mismatch:
    case: Case
    partitions: int
    kind: str
    expected: str
    got: str

    def report(self, version: int) -> str:
        return (
            f"[{self.kind}] server {version // 10000}, partitions={self.partitions}, "
            f"seed {self.case.label!r}\n"
            f"  COPY options: {copy_options_sql(self.case).as_string(None)}\n"
            f"  expected: {self.expected}\n"
            f"  load:     {self.got}\n"
            f"  repro:    {_case_literal(self.case)}"
        )


def _case_literal(case: Case) -> str:
    """The case as a Python expression (long data: the generator call that rebuilds it)."""
    again = f"generate({case.label!r})" if case.label.count(":") == 2 else None
    if len(case.data) > 4000 and again:
        return f"{again}  # {len(case.data)} bytes, starting {case.data[:300]!r}"
    return repr(case) + (f"  # = {again}" if again else "")


def expectation(oracle_outcome: Outcome, stop: MarkerStop | None) -> tuple[str, Any]:
    """("rows", rows) | ("fail", None) | ("marker", line)."""
    if oracle_outcome.error is not None:
        return "fail", None
    if stop is not None and stop.after > 0:
        return "marker", stop.line
    return "rows", oracle_outcome.rows


def check_case(
    worker: Worker, case: Case, version: int, upload: Callable[[Path], str] | None = None
) -> tuple[list[Mismatch], Outcome, MarkerStop | None]:
    """``upload``: load the file from where it puts it (an object's URL) instead."""
    path: Path | str = worker.directory / ("case.csv" if case.fmt == "csv" else "case.txt")
    path.write_bytes(case.data)
    if upload is not None:
        path = upload(path)
    reference = oracle(worker, case)
    stop = marker_stop(case, version) if reference.error is None else None
    want, detail = expectation(reference, stop)
    mismatches = []
    for partitions in PARTITIONS:
        got = run_load(worker, path, case, partitions)
        kind = None
        if want == "rows":
            expected = f"COPY's {reference.describe()}"
            if got.error is not None:
                kind = "COPY succeeds, load fails"
            elif got.rows != detail:
                kind = "COPY succeeds, load gives other rows"
        elif want == "fail":
            expected = f"a package error, as COPY failed: {reference.describe()}"
            if got.error is None:
                kind = "COPY fails, load succeeds"
            elif not isinstance(got.error, pgbulk_errors.PgBulkError):
                kind = "COPY fails, load fails with a non-package error"
        else:
            expected = (
                f"BadDataError naming line {detail} (COPY stops at the marker there and "
                f"skips {stop.after if stop else 0} bytes; COPY gave {reference.describe()})"
            )
            if got.error is None:
                kind = "marker drops rows, load succeeds"
            elif not isinstance(got.error, pgbulk_errors.BadDataError):
                kind = "marker drops rows, load fails without BadDataError"
            elif got.error.line != detail:
                kind = "marker drops rows, BadDataError names another line"
        kind = kind or got.message or None
        if kind:
            mismatches.append(Mismatch(case, partitions, kind, expected, got.describe()))
    return mismatches, reference, stop


WORKERS = max(1, int(os.environ.get("PG_BULK_DIFF_WORKERS", "2")))


@pytest.fixture
def workers(db: Any, tmp_path: Path) -> Iterator[list[Worker]]:
    """WORKERS checkers, each with its own connection, file and tables in the test's schema:
    targets w<k>_t1..t4 and oracle tables w<k>_r1..r4 of 1 to 4 text columns a, b, c, d."""
    made = []
    try:
        for k in range(WORKERS):
            directory = tmp_path / f"w{k}"
            directory.mkdir()
            conn = psycopg.connect(db.dsn, autocommit=True)
            made.append(Worker(db.dsn, db.schema, conn, f"w{k}_", directory))
            for n in range(1, len(COLUMNS) + 1):
                columns = sql.SQL(", ").join(
                    sql.SQL("{} text").format(sql.Identifier(c)) for c in COLUMNS[:n]
                )
                for kind in ("t", "r"):
                    name = made[-1].table(kind, n)
                    db.run(sql.SQL("CREATE TABLE {} ({})").format(db.ident(name), columns))
        yield made
    finally:
        for worker in made:
            worker.conn.close()


def _version(worker: Worker) -> int:
    return int(worker.conn.info.server_version)


def _fail_with(mismatches: list[Mismatch], version: int, checked: int) -> None:
    kinds = Counter(m.kind for m in mismatches)
    shown: list[str] = []
    seen: Counter[str] = Counter()
    for m in mismatches:
        seen[m.kind] += 1
        if seen[m.kind] <= 3:
            shown.append(m.report(version))
    summary = ", ".join(f"{k}: {v}" for k, v in kinds.most_common())
    pytest.fail(
        f"{len(mismatches)} mismatches in {checked} files ({summary}); up to 3 of each kind:\n\n"
        + "\n\n".join(shown),
        pytrace=False,
    )


@pytest.mark.parametrize("case", KNOWN, ids=[c.label for c in KNOWN])
def test_known_repros(workers: list[Worker], case: Case) -> None:
    version = _version(workers[0])
    mismatches, reference, stop = check_case(workers[0], case, version)
    # the oracle and the marker model agree with the brief, on every server: COPY's rules for
    # "\." changed in 18 only (text: only alone on its line; csv: never the end), so 13 to 17
    # read these files as 15 does
    major = version // 10000
    assert major >= 13, f"PostgreSQL {major}: older than the 13 the README supports"
    rows, line = KNOWN_EXPECTED[case.label][18 if major >= 18 else 15]
    got_rows = "error" if reference.error is not None else len(reference.rows or [])
    got_line = stop.line if stop is not None and stop.after > 0 else None
    assert (got_rows, got_line) == (rows, line), f"PostgreSQL {major}: {reference.describe()}"
    if mismatches:
        _fail_with(mismatches, version, 1)


BATCHES = max(1, -(-FILES // BATCH))


@pytest.mark.parametrize("batch", range(BATCHES), ids=[f"batch{b:03d}" for b in range(BATCHES)])
def test_random_files(workers: list[Worker], batch: int) -> None:
    """BATCH generated files (seeds "<SEED>:<batch>:<i>"), shared out among the workers."""
    version = _version(workers[0])
    count = min(BATCH, FILES - batch * BATCH)
    cases = [generate(f"{SEED}:{batch}:{i}") for i in range(count)]

    def check(k: int) -> list[Mismatch]:
        found: list[Mismatch] = []
        for case in cases[k :: len(workers)]:
            found += check_case(workers[k], case, version)[0]
        return found

    with ThreadPoolExecutor(len(workers), thread_name_prefix="diff") as pool:
        results = list(pool.map(check, range(len(workers))))
    order = {case.label: i for i, case in enumerate(cases)}
    mismatches = sorted(
        (m for found in results for m in found), key=lambda m: (order[m.case.label], m.partitions)
    )
    if mismatches:
        _fail_with(mismatches, version, count)


OBJECT_FILES = int(os.environ.get("PG_BULK_DIFF_OBJECT_FILES", "16"))  # ~7 s on 2 cores


def test_random_objects(
    workers: list[Worker], s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OBJECT_FILES generated files loaded as objects from an S3 server (moto's), at the same
    partition counts: a big one is cut into byte ranges read by range requests, and must give
    what one COPY of its bytes gives, as a file must."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_server.region)
    bucket = s3_server.bucket()
    client = s3_server.client()
    version = _version(workers[0])
    cases = [generate(f"{SEED}:objects:{i}") for i in range(OBJECT_FILES)]
    mismatches = []
    for i, case in enumerate(cases):

        def upload(path: Path, key: str = f"case-{i}") -> str:
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            return f"s3://{bucket}/{key}"

        if case.data:  # an empty object is skipped, not loaded: nothing to compare
            mismatches += check_case(workers[0], case, version, upload)[0]
    if mismatches:
        _fail_with(mismatches, version, len(cases))


# --------------------------------------------------------------------------------------------
# The incremental modes against plain SQL: append, replace, replace_partitions and upsert into
# plain and partitioned targets with an identity column and columns with defaults, none of
# them loaded, at every partition count.
# --------------------------------------------------------------------------------------------

TARGET, REFERENCE = "difftarget", "diffreference"  # names told apart in catalog text
LEAF_BOUNDS = ((0, 100), (100, 200), (200, 300), (300, 400))  # n; the last leaf starts empty
LOADED = ("id", "n", "qty", "g")  # rid (identity), note and made (defaults): not loaded
MODE_CASES = [  # (partitioned, mode, strategy)
    (False, "append", "in_place"),
    (False, "append", "rebuild"),
    (False, "replace", "auto"),
    (False, "upsert", "in_place"),
    (False, "upsert", "rebuild"),
    (True, "append", "auto"),
    (True, "replace", "auto"),
    (True, "replace_partitions", "auto"),
    (True, "upsert", "auto"),
]
TOUCHED_BY_REPLACE_PARTITIONS = (0, 3)  # the leaves its batch has rows for


def _create_incremental(db: Any, name: str, partitioned: bool, identity: str) -> list[str]:
    """``name`` (and its leaves): composite key, CHECK, FK, an index, an identity with options
    of its own, two columns with defaults. Returns the names of its leaves."""
    t = db.ident(name)
    db.run(
        sql.SQL(
            "CREATE TABLE {t} (id int NOT NULL, n int NOT NULL,"
            " qty int NOT NULL DEFAULT 0 CHECK (qty >= 0), g int REFERENCES {groups} (g),"
            " note text DEFAULT 'none',"
            " rid bigint GENERATED {identity} AS IDENTITY (START WITH 100 INCREMENT BY 3),"
            " made date NOT NULL DEFAULT date '2026-01-01', PRIMARY KEY (id, n)){part}"
        ).format(
            t=t,
            groups=db.ident("diffgroups"),
            identity=sql.SQL(identity),
            part=sql.SQL(" PARTITION BY RANGE (n)" if partitioned else ""),
        )
    )
    db.run(sql.SQL("CREATE INDEX ON {} (g, qty)").format(t))
    leaves = [f"{name}_p{k}" for k in range(len(LEAF_BOUNDS))] if partitioned else []
    for leaf, (low, high) in zip(leaves, LEAF_BOUNDS, strict=False):
        db.run(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(leaf), t, low, high
            )
        )
    return leaves


def _insert_rows(db: Any, name: str, rows: list[tuple[int, ...]]) -> None:
    values = sql.SQL(", ").join(
        sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Literal, r))) for r in rows
    )
    columns = sql.SQL(", ").join(map(sql.Identifier, LOADED))
    db.run(sql.SQL("INSERT INTO {} ({}) VALUES {}").format(db.ident(name), columns, values))


def incremental_batch(mode: str) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The target's rows before, and the rows of the file (id, n, qty, g), from the seed:
    the same for every partition count and target shape of a mode. An append's keys are new;
    a replace's may repeat the old ones; a replace_partitions' fall in leaves 0 and 3 only; an
    upsert's are half old, half new, and 60 of them come twice or more (the last one wins)."""
    rnd = random.Random(f"{SEED}:incremental:{mode}")
    old = rnd.sample([(i, n) for i in range(1, 41) for n in range(0, 300, 5)], 150)
    before = [(i, n, rnd.randint(0, 99), rnd.randint(0, 9)) for i, n in old]
    taken = set(old)
    every = [(i, n) for i in range(1, 61) for n in range(0, 400, 3)]
    if mode == "append":
        keys = rnd.sample([k for k in every if k not in taken], 200)
    elif mode == "replace":
        keys = rnd.sample(every, 200)
    elif mode == "replace_partitions":
        keys = rnd.sample([k for k in every if k[1] // 100 in TOUCHED_BY_REPLACE_PARTITIONS], 200)
    else:
        keys = rnd.sample(old, 75) + rnd.sample([k for k in every if k not in taken], 75)
        keys += [rnd.choice(keys) for _ in range(60)]
        rnd.shuffle(keys)
    rows = [(i, n, rnd.randint(0, 99), rnd.randint(0, 9)) for i, n in keys]
    return before, rows


def _reference_load(db: Any, mode: str, leaves: list[str], data: bytes, rows: list) -> None:
    """What the load must do, in plain SQL on the reference table."""
    columns = sql.SQL(", ").join(map(sql.Identifier, LOADED))
    ref = db.ident(REFERENCE)
    into = ref
    if mode == "replace":
        db.run(sql.SQL("TRUNCATE {}").format(ref))
    elif mode == "replace_partitions":
        for k in sorted({n // 100 for _, n, *_ in rows}):
            db.run(sql.SQL("TRUNCATE {}").format(db.ident(leaves[k])))
    elif mode == "upsert":  # arrival order numbered, the last row per key wins
        into = db.ident("diffarrived")
        db.run(
            sql.SQL("CREATE TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(into, columns, ref)
        )
        db.run(sql.SQL("ALTER TABLE {} ADD COLUMN arrival bigserial").format(into))
    with db.conn.cursor() as cur:
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(into, columns)
        with cur.copy(statement) as copy:
            copy.write(data)
    if mode == "upsert":
        db.run(
            sql.SQL(
                "INSERT INTO {ref} ({c}) SELECT DISTINCT ON (id, n) {c} FROM {a}"
                " ORDER BY id, n, arrival DESC"
                " ON CONFLICT (id, n) DO UPDATE SET qty = EXCLUDED.qty, g = EXCLUDED.g"
            ).format(ref=ref, c=columns, a=into)
        )
        db.run(sql.SQL("DROP TABLE {}").format(into))


def _table_rows(db: Any, name: str) -> list[tuple[Any, ...]]:
    """(partition, id, n, qty, g, note, made, rid) in key order; the reference's names read as
    the target's."""
    rows = db.run(
        sql.SQL(
            "SELECT c.relname::text, id, n, qty, g, note, made::text, rid FROM {} t"
            " JOIN pg_class c ON c.oid = t.tableoid ORDER BY id, n"
        ).format(db.ident(name))
    )
    return [(r[0].replace(REFERENCE, TARGET), *r[1:]) for r in rows]


def _structure(db: Any, name: str, leaves: list[str]) -> dict[str, Any]:
    """The catalog a load must leave as it was (the table, each leaf, the partition bounds and
    the identity's sequence with its options), as text with the reference's names read as the
    target's."""
    qualified = f'"{db.schema}"."{name}"'
    found: dict[str, Any] = {leaf: catalog_snapshot(db, leaf) for leaf in [name, *leaves]}
    found["bounds"] = db.run(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass ORDER BY 1",
        qualified,
    )
    found["sequence"] = db.run(
        "SELECT s.relname, q.seqstart, q.seqincrement, q.seqmin, q.seqmax, q.seqcache,"
        " q.seqcycle, format_type(q.seqtypid, NULL) FROM pg_class s"
        " JOIN pg_sequence q ON q.seqrelid = s.oid"
        " WHERE s.oid = pg_get_serial_sequence(%s, 'rid')::regclass",
        qualified,
    )
    return _as_target(found)


def _as_target(value: Any) -> Any:
    """``value`` with the reference's name read as the target's in every string in it."""
    if isinstance(value, str):
        return value.replace(REFERENCE, TARGET)
    if isinstance(value, dict):
        return {_as_target(k): _as_target(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_as_target(v) for v in value)
    return value


def _physical(db: Any, leaf: str) -> tuple[Any, ...]:
    """A leaf's table and row versions as stored: rewriting it (even with the same rows)
    changes them."""
    return db.run(
        sql.SQL(
            "SELECT {leaf}::regclass::oid, pg_relation_filenode({leaf}),"
            " (SELECT md5(string_agg(ctid::text || ':' || xmin::text, ',' ORDER BY ctid))"
            "  FROM {t})"
        ).format(leaf=sql.Literal(f'"{db.schema}"."{leaf}"'), t=db.ident(leaf))
    )[0]


@pytest.mark.parametrize("partitions", PARTITIONS)
@pytest.mark.parametrize("identity", ["ALWAYS", "BY DEFAULT"], ids=["always", "by_default"])
@pytest.mark.parametrize(
    ("partitioned", "mode", "strategy"),
    MODE_CASES,
    ids=[f"{'partitioned' if p else 'plain'}-{m}-{s}" for p, m, s in MODE_CASES],
)
def test_incremental_modes_match_plain_sql(
    db: Any, tmp_path: Path, partitioned: bool, mode: str, strategy: str, identity: str,
    partitions: int,
) -> None:  # fmt: skip
    """Rows, partition of each row, identity values and catalog against the same statements
    in plain SQL on a twin table: the rows equal (in the same partitions); a row kept or
    updated keeps its identity value and every new row draws a value the sequence never
    handed out (a replace too: TRUNCATE does not restart it); the catalog of the table and of
    each leaf is what it was and what the twin's is; the sequence numbers on after the load."""
    db.run(sql.SQL("CREATE TABLE {} (g int PRIMARY KEY)").format(db.ident("diffgroups")))
    db.run(sql.SQL("INSERT INTO {} SELECT generate_series(0, 9)").format(db.ident("diffgroups")))
    before, rows = incremental_batch(mode)
    leaves = {}
    for name in (TARGET, REFERENCE):
        leaves[name] = _create_incremental(db, name, partitioned, identity)
        _insert_rows(db, name, before)
        _insert_rows(db, name, [(1000, 1, 1, 1)])  # a value handed out, then deleted:
        db.run(sql.SQL("DELETE FROM {} WHERE id = 1000").format(db.ident(name)))  # never reused
    data = b"".join(b"%d,%d,%d,%d\n" % r for r in rows)
    path = tmp_path / "batch.csv"
    path.write_bytes(data)
    catalog_before = _structure(db, TARGET, leaves[TARGET])
    # the leaves the batch has no row for: a replace empties them, any other mode leaves them
    # as they are, not rewritten
    untouched = [
        leaf
        for k, leaf in enumerate(leaves[TARGET])
        if mode != "replace" and not any(n // 100 == k for _, n, *_ in rows)
    ]
    if mode == "replace_partitions":
        assert len(untouched) == 2
    stored = {leaf: _physical(db, leaf) for leaf in untouched}
    assert catalog_before == _structure(db, REFERENCE, leaves[REFERENCE])
    rid_before = {(r[1], r[2]): r[7] for r in _table_rows(db, TARGET)}
    handed_out = db.scalar(
        "SELECT last_value FROM pg_sequences WHERE schemaname = %s AND sequencename = %s",
        db.schema,
        f"{TARGET}_rid_seq",
    )

    summary = load(
        db.dsn, db.table(TARGET), str(path), mode=mode, strategy=strategy, columns=list(LOADED),
        key=["id", "n"] if mode == "upsert" else None, partitions=partitions, format="csv",
    )  # fmt: skip
    _reference_load(db, mode, leaves[REFERENCE], data, rows)

    assert summary.rows == len(rows)
    got, want = _table_rows(db, TARGET), _table_rows(db, REFERENCE)
    assert [r[:7] for r in got] == [r[:7] for r in want]
    if mode in ("append", "upsert"):
        kept = set(rid_before)
    elif mode == "replace_partitions":
        kept = {k for k in rid_before if k[1] // 100 not in TOUCHED_BY_REPLACE_PARTITIONS}
    else:
        kept = set()
    rids = {(r[1], r[2]): r[7] for r in got}
    assert {k: rids[k] for k in kept} == {k: rid_before[k] for k in kept}  # kept their values
    drawn = [rid for k, rid in rids.items() if k not in kept]
    assert len(set(rids.values())) == len(rids)  # no value twice
    assert not [rid for rid in drawn if rid <= handed_out], (
        f"new rows got identity values the sequence had handed out before (<= {handed_out})"
    )
    assert {leaf: _physical(db, leaf) for leaf in untouched} == stored
    assert _structure(db, TARGET, leaves[TARGET]) == catalog_before
    assert _structure(db, REFERENCE, leaves[REFERENCE]) == catalog_before
    # the sequence is past every value in the table: an INSERT numbers on
    after = db.scalar(
        sql.SQL("INSERT INTO {} (id, n, qty) VALUES (5000, 1, 0) RETURNING rid").format(
            db.ident(TARGET)
        )
    )
    assert after > max(rids.values(), default=handed_out)
    assert leftovers(db) == []


def test_generator_covers_the_ground() -> None:
    """The generated files hit every setting the test is meant to cover (cheap, no server)."""
    cases = [generate(f"{SEED}:{b}:{i}") for b in range(BATCHES) for i in range(BATCH)][:FILES]
    seen = Counter()
    for c in cases:
        seen[c.fmt] += 1
        seen["header"] += c.header
        seen["empty"] += not c.data
        seen["crlf"] += b"\r\n" in c.data
        seen["cr"] += b"\r" in c.data.replace(b"\r\n", b"")
        seen["marker"] += b"\\." in c.data
        seen["long"] += len(c.data) > LONG
        seen["escape"] += c.escape == "\\"
        seen["quote'"] += c.quote == "'"
        seen["null"] += c.null is not None
        seen["no final newline"] += bool(c.data) and not c.data.endswith((b"\n", b"\r"))
    missing = [
        k
        for k in (
            "csv",
            "text",
            "header",
            "crlf",
            "cr",
            "marker",
            "escape",
            "quote'",
            "null",
            "no final newline",
        )
        if not seen[k]
    ]
    if FILES >= 1000:
        missing += [k for k in ("empty", "long") if not seen[k]]
    assert not missing, (missing, seen)


def test_marker_model_hand_cases() -> None:
    """The independent marker model on hand-made files (no server)."""

    def stop(fmt: str, data: bytes, v: int, **kw: Any) -> MarkerStop | None:
        return marker_stop(Case(fmt, data, 2, **kw), v)

    assert stop("text", b"1\tx\n\\.\n2\ty\n", 150000) == MarkerStop(2, 4)
    assert stop("text", b"1\tx\n\\.\n2\ty\n", 180000) == MarkerStop(2, 4)
    assert stop("text", b"1\tx\\.\n2\ty\n", 150000) == MarkerStop(1, 4)
    assert stop("text", b"1\tx\\\\.\n2\ty\n", 150000) is None  # an escaped backslash, then "."
    assert stop("text", b"1\tx\r\n\\.\r\n", 150000) == MarkerStop(2, 0)
    assert stop("text", b"\\.\r\n1\tx\r\n", 150000) == MarkerStop(1, 5)
    assert stop("csv", b"1,x\n\\.\n2,y\n", 150000) == MarkerStop(2, 4)
    assert stop("csv", b"1,x\n\\.\n2,y\n", 180000) is None
    assert stop("csv", b'1,"x\n\\.\n",y\n', 150000) is None  # inside quotes
    assert stop("csv", b"1,x\\.\n2,y\n", 150000) is None  # not at a record start
    assert stop("csv", b"1,x\r\n\\.\n2,y\r\n", 150000) is None  # LF after a CRLF file: data
    assert stop("csv", b"1,'x\n\\.\n',y\n", 150000, quote="'") is None
    assert stop("csv", b'1,"x\\"\n\\.\n2\n', 150000, escape="\\") is None  # \" inside quotes
