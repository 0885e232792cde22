"""Lines: COPY's record numbers mapped back to physical lines of the file, for error messages
(:func:`record_locations` is the one place that does), and a piece's first line.

PostgreSQL's COPY context names a record by ``line N`` of its session; in csv it also counts
the newlines inside quoted fields. These functions read the file again (a gzip file, an object
or a range of one spooled to a temporary file first) to give the file's own line numbers.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO, Literal

from airflow_pg_bulk.plan import CopyOptions, Piece
from airflow_pg_bulk.source import charsets, reading
from airflow_pg_bulk.source.boundaries import detect_newline
from airflow_pg_bulk.source.listing import SourceKind, piece_kind
from airflow_pg_bulk.source.scanner import (
    DEFAULT_CHUNK,
    LOCAL_BLOCK,
    PathLike,
    Reader,
    check_range,
    cursor,
)
from airflow_pg_bulk.source.syntax import RecordSyntax

#: how a record is numbered: as PostgreSQL's COPY context counts (``line N``), or plainly
Numbering = Literal["postgres", "records"]


def iter_range(
    path: PathLike, start: int, end: int | None = None, *, chunk_size: int = 1 << 20
) -> Iterator[bytes]:
    """Yield the bytes of ``[start, end)`` of the file in chunks of at most ``chunk_size``.

    ``end=None`` reads to the end of the file. The file is opened when iteration starts and
    closed when the iterator is exhausted or closed.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        end = check_range(size, start, end)
        f.seek(start)
        remaining = end - start
        while remaining > 0:
            data = f.read(min(chunk_size, remaining))
            if not data:
                break
            remaining -= len(data)
            yield data


def count_newlines(
    path: PathLike,
    start: int,
    end: int | None,
    *,
    newline: bytes = b"\n",
    chunk_size: int = DEFAULT_CHUNK,
) -> int:
    """Number of newline bytes in ``[start, end)`` of the file (``end=None``: to EOF).

    ``newline`` is the file's line ending as :func:`detect_newline` reports it: LF bytes are
    counted for ``b"\\n"`` and ``b"\\r\\n"``, CR bytes for ``b"\\r"``. All of them are counted,
    quoted or not: this counts physical lines.
    """
    if newline not in (b"\n", b"\r\n", b"\r"):
        raise ValueError(f"newline must be b'\\n', b'\\r\\n' or b'\\r', not {newline!r}")
    needle = newline[-1:]
    return sum(chunk.count(needle) for chunk in iter_range(path, start, end, chunk_size=chunk_size))


def record_line_numbers(
    path: PathLike,
    start: int,
    end: int | None,
    record_number: int,
    syntax: RecordSyntax,
    *,
    numbering: Numbering = "postgres",
) -> tuple[int, int]:
    """Physical line numbers ``(first, last)`` of the record an error in a range refers to.

    ``[start, end)`` is the byte range one COPY session loaded (``start`` at a record start;
    ``end=None`` means EOF) and ``record_number`` the 1-based ``line N`` from PostgreSQL's error
    context for that session. The result counts lines in the whole file (1-based, lines before
    ``start`` included), splitting lines at every LF byte, quoted or not (every CR byte for
    CR-only files; the style comes from the file's first record terminator, see
    :func:`detect_newline`); ``last`` is the line holding the record's last byte before its
    terminator.

    ``numbering='records'`` treats ``record_number`` as a plain record count. The default
    ``'postgres'`` reproduces what ``cur_lineno`` actually holds: in csv mode CopyReadLineText
    also adds one for every newline byte *inside quotes* (the LF for LF files, the CR for CR and
    CR LF files, and the CR while the session has not yet seen its first terminator), so after
    a multi-line quoted record PostgreSQL's ``line N`` runs ahead of the record count. A number
    that falls inside a record's span (errors raised while the record was being read) maps to
    that record. For the text format both numberings are the same.

    :raises ValueError: a bad range or numbering, or no such record in the range.
    """
    ((_span, first, last),) = record_locations(
        path, start, end, [record_number], syntax, numbering=numbering
    )
    return first, last


def record_locations(
    path: PathLike,
    start: int,
    end: int | None,
    record_numbers: Sequence[int],
    syntax: RecordSyntax,
    *,
    numbering: Numbering = "postgres",
) -> list[tuple[tuple[int, int, int], int, int]]:
    """``(span, first, last)`` for each of ``record_numbers`` (COPY's ``line N`` in a session
    that loaded ``[start, end)``): its byte span (:func:`record_span`) and its physical line
    numbers in the whole file (:func:`record_line_numbers`), in one pass over the file.

    The one place that maps COPY's line numbers back to file lines. Returned in the order of
    ``record_numbers``.

    :raises ValueError: a bad range or numbering, or a number beyond the range's records.
    """
    spans = record_spans(path, start, end, record_numbers, syntax, numbering=numbering)
    newline = detect_newline(path, syntax)
    found: dict[int, tuple[tuple[int, int, int], int, int]] = {}
    line, at = 1, 0
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        record_start, content_end, _next = spans[i]
        line += count_newlines(path, at, record_start, newline=newline)
        at = record_start
        last = line + count_newlines(path, record_start, content_end, newline=newline)
        found[i] = (spans[i], line, last)
    return [found[i] for i in range(len(spans))]


def record_span(
    path: PathLike,
    start: int,
    end: int | None,
    record_number: int,
    syntax: RecordSyntax,
    *,
    numbering: Numbering = "postgres",
) -> tuple[int, int, int]:
    """Byte offsets ``(record_start, content_end, next_start)`` of the record that PostgreSQL's
    ``line N`` (``record_number``) names in a COPY session that loaded ``[start, end)``.

    ``content_end`` is where the record's terminator begins and ``next_start`` where the next
    record begins (both equal ``end`` for a last record without terminator). Numbering as in
    :func:`record_line_numbers`.

    :raises ValueError: a bad range or numbering, or no such record in the range.
    """
    return record_spans(path, start, end, [record_number], syntax, numbering=numbering)[0]


def record_spans(
    path: PathLike,
    start: int,
    end: int | None,
    record_numbers: Sequence[int],
    syntax: RecordSyntax,
    *,
    numbering: Numbering = "postgres",
) -> list[tuple[int, int, int]]:
    """:func:`record_span` for several record numbers at once, in one pass over the range.

    Returns the spans in the order of ``record_numbers`` (which may be in any order).

    :raises ValueError: a bad range or numbering, or a number beyond the range's records.
    """
    if numbering not in ("postgres", "records"):
        raise ValueError(f"numbering must be 'postgres' or 'records', not {numbering!r}")
    if any(n < 1 for n in record_numbers):
        raise ValueError(f"record numbers must be >= 1, not {sorted(record_numbers)[0]}")
    wanted = sorted(set(record_numbers))
    spans: dict[int, tuple[int, int, int]] = {}
    count_pg = numbering == "postgres" and syntax.is_csv
    lineno = k = 0
    with open(path, "rb") as f, open(path, "rb") as g:
        size = os.fstat(f.fileno()).st_size
        end = check_range(size, start, end)
        f.seek(start)
        scan = cursor(Reader(f, start, limit=end, chunk_size=LOCAL_BLOCK), syntax)
        counter = _RunningCounter(g, start, end)
        eol = b"\r"  # PostgreSQL's EOL_UNKNOWN: quoted CRs are counted until the first terminator
        record_start = start
        while record_start < end and len(spans) < len(wanted):
            found = scan.next_record()
            content_end, next_start = (end, end) if found is None else found
            k += 1
            if count_pg:
                lineno += 1 + counter.count(eol, record_start, content_end)
                if k == 1 and found is not None:
                    terminator = next_start - content_end
                    eol = b"\n" if terminator == 1 and _byte_at(f, content_end) == b"\n" else b"\r"
            else:
                lineno = k
            while len(spans) < len(wanted) and lineno >= wanted[len(spans)]:
                spans[wanted[len(spans)]] = (record_start, content_end, next_start)
            record_start = next_start
    if len(spans) < len(wanted):
        raise ValueError(
            f"range [{start}, {end}) holds {k} records (PostgreSQL line {lineno}); "
            f"no record {wanted[len(spans)]}"
        )
    return [spans[n] for n in record_numbers]


def _byte_at(f: IO[bytes], pos: int) -> bytes:
    here = f.tell()
    f.seek(pos)
    value = f.read(1)
    f.seek(here)
    return value


class _RunningCounter:
    """Counts CR and LF bytes over ascending, non-overlapping ranges in one forward pass."""

    def __init__(self, f: IO[bytes], start: int, end: int) -> None:
        f.seek(start)
        self._reader = Reader(f, start, limit=end, chunk_size=LOCAL_BLOCK)

    def count(self, needle: bytes, a: int, b: int) -> int:
        """Occurrences of ``needle`` (one byte) in ``[a, b)``; ranges must move forward."""
        total = 0
        r = self._reader
        while a < b and r.buf:
            hi = r.base + len(r.buf)
            if a >= hi:
                r.advance()
                continue
            stop = min(b, hi)
            total += r.buf.count(needle, a - r.base, stop - r.base)
            a = stop
        return total


def first_line(piece: Piece, opts: CopyOptions) -> int:
    """The physical line number of the piece's first byte in its file: as planned, or counted
    now for a piece past a guessed split point (prepare does not read the file to count it)."""
    return _first_line(piece, RecordSyntax.of(opts))


def _first_line(piece: Piece, syntax: RecordSyntax) -> int:
    if piece.first_line:
        return piece.first_line
    with reading.open_source(piece.path, piece.conn_id) as (f, _size):
        f.seek(0)
        needle = detect_newline(f, syntax)[-1:]
        f.seek(0)
        lines, left = 1, piece.start
        while left > 0 and (block := f.read(min(reading.READ_CHUNK, left))):
            lines += block.count(needle)
            left -= len(block)
        return lines


def _record_lines_transcoded(
    piece: Piece,
    record_number: int,
    opts: CopyOptions,
    syntax: RecordSyntax,
    numbering: Numbering = "postgres",
) -> tuple[int, int]:
    """:func:`record_lines` for encodings whose multi-byte characters may hold ``\\`` or quote
    bytes (SJIS, BIG5, GBK, ...): scan the piece re-encoded as UTF-8, where they cannot."""
    raw = b"".join(reading.piece_chunks(piece, opts))
    text = raw.decode(charsets.python_encoding(opts.encoding), errors="replace")
    with tempfile.NamedTemporaryFile(suffix=".utf8") as tmp:
        tmp.write(text.encode("utf-8"))
        tmp.flush()
        first, last = record_line_numbers(
            tmp.name, 0, os.path.getsize(tmp.name), record_number, syntax, numbering=numbering
        )
    offset = _first_line(piece, syntax) - 1
    return first + offset, last + offset


def record_lines(
    piece: Piece, record_number: int, opts: CopyOptions, numbering: Numbering = "postgres"
) -> tuple[int, int]:
    """Physical (first, last) line numbers, in the file, of the piece's ``record_number``-th
    record: ``numbering="postgres"`` for the ``line N`` of a COPY error's context (csv: it
    also counts the newlines inside quotes), ``"records"`` for a plain count of records (a
    quoted newline does not start a new one); see :func:`record_line_numbers`."""
    syntax = RecordSyntax.of(opts)
    kind = piece_kind(piece)
    if kind is SourceKind.STREAM:
        raise ValueError(f"{piece.path} is a stream: it cannot be read again to count lines")
    if not charsets.can_split(opts.encoding):
        return _record_lines_transcoded(piece, record_number, opts, syntax, numbering)
    if kind is SourceKind.FILE:
        end = piece.end or os.path.getsize(piece.path)
        return record_line_numbers(
            piece.path, piece.start, end, record_number, syntax, numbering=numbering
        )
    # a gzip file or an object: its content spooled to a temporary file, to count lines in
    with tempfile.NamedTemporaryFile(suffix=".csv") as tmp:
        reading.write_content(piece, tmp)
        tmp.flush()
        size = os.path.getsize(tmp.name)
        if kind is SourceKind.OBJECT and piece.end is not None:  # a range, spooled alone
            start, end = 0, piece.end - piece.start
            first, last = record_line_numbers(
                tmp.name, start, end, record_number, syntax, numbering=numbering
            )
            offset = _first_line(piece, syntax) - 1
            return first + offset, last + offset
        with open(tmp.name, "rb") as f:
            start = reading.content_start(f, piece, opts)
        return record_line_numbers(
            tmp.name, start, size, record_number, syntax, numbering=numbering
        )
