"""Headers: a file's first record read and split into names the way COPY reads fields
(``CopyReadAttributesCSV`` / ``CopyReadAttributesText``), and names matched to the table's
columns (a header's, a Parquet file's).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import zlib
from collections.abc import Iterator, Sequence
from typing import IO

from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import CopyOptions
from airflow_pg_bulk.source import charsets, objects, streams
from airflow_pg_bulk.source.boundaries import first_record, first_terminator
from airflow_pg_bulk.source.listing import SourceFile, SourceKind
from airflow_pg_bulk.source.scanner import BACKSLASH, Reader, cursor
from airflow_pg_bulk.source.syntax import UTF8_BOM, RecordSyntax, one_byte

#: delimiters a header split at the wrong one hints at
DELIMITERS = (",", ";", "\t", "|")


def _record_content(record: bytes, syntax: RecordSyntax) -> bytes:
    """The first record in ``record`` without its terminator."""
    reader = Reader(io.BytesIO(record), 0, chunk_size=max(1, len(record)))
    found = cursor(reader, syntax).next_record()
    return record if found is None else record[: found[0]]


def _split_csv(line: bytes, delim: int, quote: int, escape: int) -> list[bytes]:
    """CopyReadAttributesCSV: the fields of one csv line (without terminator)."""
    fields: list[bytes] = []
    n = len(line)
    i = 0
    while True:
        out = bytearray()
        saw_delim = False
        while True:
            # Outside quotes.
            while i < n:
                c = line[i]
                i += 1
                if c == delim:
                    saw_delim = True
                    break
                if c == quote:
                    break
                out.append(c)
            else:
                break  # end of line
            if saw_delim:
                break
            # Inside quotes.
            while True:
                if i >= n:
                    raise ValueError("unterminated CSV quoted field in header")
                c = line[i]
                i += 1
                if c == escape and i < n and line[i] in (escape, quote):
                    out.append(line[i])
                    i += 1
                    continue
                if c == quote:
                    break
                out.append(c)
        fields.append(bytes(out))
        if not saw_delim:
            return fields


_TEXT_ESCAPES = {ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("v"): 11}
_OCTAL = b"01234567"
_HEX = b"0123456789abcdefABCDEF"


def _split_text(line: bytes, delim: int) -> list[bytes]:
    """CopyReadAttributesText: the de-escaped fields of one text-format line."""
    fields: list[bytes] = []
    n = len(line)
    i = 0
    while True:
        start = i
        out = bytearray()
        saw_delim = False
        while i < n:
            c = line[i]
            i += 1
            if c == delim:
                saw_delim = True
                break
            if c == BACKSLASH:
                if i >= n:
                    break
                c = line[i]
                i += 1
                if c in _OCTAL:
                    val = c - 48
                    for _ in range(2):
                        if i < n and line[i] in _OCTAL:
                            val = (val << 3) + line[i] - 48
                            i += 1
                    c = val & 0xFF
                elif c == ord("x") and i < n and line[i] in _HEX:
                    val = int(line[i : i + 1], 16)
                    i += 1
                    if i < n and line[i] in _HEX:
                        val = (val << 4) + int(line[i : i + 1], 16)
                        i += 1
                    c = val
                else:
                    c = _TEXT_ESCAPES.get(c, c)
            out.append(c)
        raw = line[start : i - 1 if saw_delim else i]
        fields.append(b"" if raw == b"\\N" else bytes(out))
        if not saw_delim:
            return fields


def parse_header(
    record: bytes, syntax: RecordSyntax, *, delimiter: bytes | str, encoding: str
) -> list[str]:
    """Split a header record into column names, reading the fields the way COPY does.

    csv: quoted fields, doubled quotes and (when escape != quote) escape pairs, exactly as
    ``CopyReadAttributesCSV``. text: backslash escapes (``\\t``, ``\\n``, ``\\\\``, octal
    ``\\NNN``, hex ``\\xHH``, any other ``\\c`` is ``c``) as ``CopyReadAttributesText``. A
    field that COPY would read as NULL (an unquoted empty csv field, a bare ``\\N`` in text)
    comes back as ``""``. A UTF-8 byte-order mark at the start is dropped, the terminator (and
    anything after the first record) is ignored, and the names are decoded with ``encoding``
    (PostgreSQL or Python spelling).

    :raises ValueError: bad delimiter, unterminated quoted field, or bytes invalid in the
        encoding (``UnicodeDecodeError`` is a ``ValueError``).
    """
    delim = one_byte("delimiter", delimiter)
    if syntax.is_csv and delim in (syntax.quote, syntax.escape):
        raise ValueError("delimiter must differ from the quote and escape characters")
    if not syntax.is_csv and delim in b"\\.abcdefghijklmnopqrstuvwxyz0123456789":
        raise ValueError(f"text-format delimiter cannot be {delim!r} (COPY rejects it)")
    codec = charsets.python_codec(encoding)
    if record.startswith(UTF8_BOM):
        record = record[len(UTF8_BOM) :]
    line = _record_content(record, syntax)
    if syntax.is_csv:
        raw = _split_csv(line, delim[0], syntax.quote[0], syntax.escape[0])
    else:
        raw = _split_text(line, delim[0])
    return [field.decode(codec) for field in raw]


def read_header(file: SourceFile, copy: CopyOptions) -> tuple[list[str], int]:
    """The header's column names and its length in bytes (of the decompressed stream)."""
    return _read_header(file, RecordSyntax.of(copy), copy)


def _read_header(
    file: SourceFile, syntax: RecordSyntax, copy: CopyOptions
) -> tuple[list[str], int]:
    try:
        record = header_record(file, syntax)
    except (OSError, EOFError, zlib.error) as exc:
        raise BadDataError(f"{file.path}: cannot read the header: {exc}", path=file.path) from exc
    if not record:
        return [], 0
    try:
        names = parse_header(
            record,
            syntax,
            delimiter=copy.effective_delimiter.encode(),
            encoding=charsets.python_encoding(copy.encoding),
        )
    except ValueError as exc:  # UnicodeDecodeError is one
        raise BadDataError(
            f"{file.path} line 1: cannot read the header: {exc}", path=file.path, line=1
        ) from None
    return names, len(record)


def header_record(file: SourceFile, syntax: RecordSyntax) -> bytes:
    """The raw first record of the file's (decompressed) content; a stream keeps it."""
    if file.kind is SourceKind.STREAM:
        return streams.held_stream(file.path).header(syntax)
    with _content(file) as stream:
        return first_record(stream, syntax)


@contextlib.contextmanager
def _content(file: SourceFile) -> Iterator[IO[bytes]]:
    """A file's or an object's (decompressed) content opened from its start."""
    if file.kind is SourceKind.OBJECT:
        with objects.open_header(file.path, file.conn_id, file.compression) as stream:
            yield stream
    elif file.kind is SourceKind.GZIP_FILE:
        with gzip.open(file.path, "rb") as stream:
            yield stream
    else:
        with open(file.path, "rb") as stream:
            yield stream


def map_header(
    files: Sequence[SourceFile],
    copy: CopyOptions,
    table_columns: Sequence[str],
    *,
    syntax: RecordSyntax | None = None,
) -> tuple[list[str], dict[str, int]]:
    """Match every file's header to the table's columns by name.

    Returns the column list for COPY and each file's header length. Names match exactly first,
    then case-insensitively; all files must have the same header. ``syntax``: the copy
    options' record syntax, when the caller built it (:class:`.formats.Delimited`)."""
    syntax = syntax or RecordSyntax.of(copy)
    lengths: dict[str, int] = {}
    first: list[str] | None = None
    for file in files:
        names, length = _read_header(file, syntax, copy)
        lengths[file.path] = length
        if not names and length == 0:
            continue  # empty file: nothing to load, nothing to match
        if first is None:
            first = names
        elif names != first:
            raise LoadRefusedError(
                f"{file.path}: header {names} differs from {files[0].path}'s header {first}"
            )
    if first is None:
        return [], lengths
    return match_columns(first, table_columns, copy.effective_delimiter), lengths


def match_columns(
    names: Sequence[str],
    table_columns: Sequence[str],
    delimiter: str | None = None,
    what: str = "header",
) -> list[str]:
    """The table's column for each of ``names`` (a header's, a Parquet file's), in their
    order: the same name, else the one column whose name differs only in case.

    :param delimiter: a csv or text header's delimiter (a name holding another delimiter hints
        at it); None for a source that names its columns itself.
    :param what: what named them, for the message (``header``, ``Parquet``).
    :raises LoadRefusedError: a name matches no column, or two names the same column."""
    by_lower: dict[str, list[str]] = {}
    for col in table_columns:
        by_lower.setdefault(col.lower(), []).append(col)
    mapped, unknown = [], []
    for name in names:
        if name in table_columns:
            mapped.append(name)
        elif len(by_lower.get(name.lower(), [])) == 1:
            mapped.append(by_lower[name.lower()][0])
        else:
            unknown.append(name)
    if unknown:
        hint = _delimiter_hint(unknown, delimiter) if delimiter is not None else ""
        raise LoadRefusedError(
            f"{what} columns {unknown} match no column of the target "
            f"(columns: {list(table_columns)}){hint}"
        )
    duplicates = sorted({c for c in mapped if mapped.count(c) > 1})
    if duplicates:
        raise LoadRefusedError(f"{what} names columns {duplicates} more than once")
    return mapped


def _delimiter_hint(unknown: Sequence[str], used: str) -> str:
    """A hint when the unmatched header names hold another common delimiter (``a;b;c`` read
    as one name): the file seems to use that one."""
    counts = {d: sum(name.count(d) for name in unknown) for d in DELIMITERS if d != used}
    best = max(counts, key=lambda d: counts[d])
    if not counts[best]:
        return ""
    return (
        f"; the header was split at the delimiter {used!r}, but the file seems to use "
        f"{best!r}: give delimiter={best!r} (--delimiter)"
    )


def header_newline(file: SourceFile, syntax: RecordSyntax) -> str | None:
    """The line ending of a compressed file's or a stream's header line, or None."""
    record = header_record(file, syntax)
    found = first_terminator(record, syntax)
    return None if found is None else record[found[0] : found[1]].decode()
