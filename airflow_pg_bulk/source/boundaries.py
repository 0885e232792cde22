"""Exact record starts in CSV / PostgreSQL text-format files, as ``COPY`` sees records (the
serial scan), the first record, and a file's line ending.

A large file is cut into byte ranges that separate ``COPY ... FROM STDIN`` sessions load in
parallel. Every range has to begin exactly where PostgreSQL's COPY parser would begin a record,
so this module (with :mod:`.scanner`) mirrors ``CopyReadLineText`` in PostgreSQL's
``copyfromparse.c``:

* **csv**: with quote ``q`` and escape ``e``. When ``e == q`` every ``q`` toggles the in-quote
  state (PostgreSQL sets ``escapec = '\\0'`` in that case). When ``e != q``, inside quotes an
  ``e`` followed by ``q`` or ``e`` is an escape pair whose second byte does not toggle anything;
  outside quotes ``e`` is an ordinary byte. A CR or LF outside quotes ends the record, and CR LF
  is a single terminator.
* **text**: no quoting; a backslash makes the next byte ordinary, so a CR or LF preceded by an
  odd number of consecutive backslashes is data, not a terminator.

Files are read in bounded chunks; no function loads a whole file into memory. Only encodings in
which every byte < 0x80 is an ASCII character can be split this way (see
:func:`.charsets.can_split`).

Not modelled here: the ``\\.`` end-of-data marker and the errors PostgreSQL raises for files that
mix line-ending styles (a CR outside quotes in an LF file and so on); any CR, LF or CR LF
outside quotes is treated as a terminator. :mod:`.records` models both where it
matters: on the bytes each COPY is sent.
"""

from __future__ import annotations

import io
import operator
import os
from collections.abc import Callable, Sequence
from typing import IO

from airflow_pg_bulk.source.scanner import (
    CR,
    DEFAULT_CHUNK,
    LF,
    LOCAL_BLOCK,
    NEWLINE_RE,
    CsvCursor,
    PathLike,
    Reader,
    TextCursor,
    backslashes_before,
    binary,
    cursor,
)
from airflow_pg_bulk.source.syntax import RecordSyntax


def record_starts(
    path: PathLike,
    targets: Sequence[int],
    syntax: RecordSyntax,
    *,
    chunk_size: int = DEFAULT_CHUNK,
) -> list[int]:
    """For each target byte offset, the smallest offset >= it at which a record begins.

    A record begins at offset 0 and right after every record terminator (LF, CR LF or CR outside
    quotes, for csv; an unescaped LF, CR LF or CR, for text). When no record begins at or after a
    target, the answer is the file size. Targets must satisfy ``0 <= t <= size``; they are
    normally sorted ascending, but any order is accepted and the answers come back in the order
    of ``targets``.

    csv: the quote state at an offset depends on everything before it, so this makes one
    streaming pass from the start of the file up to the last answer, ``chunk_size`` bytes at a
    time. When escape == quote the state is the parity of the quote bytes seen, counted with
    ``bytes.count``; when they differ, the work between escape bytes is still done by
    ``bytes.count``/``find`` and only escape bytes cost a Python-level step.

    text: record boundaries are local (only the backslash run before a newline matters), so
    each target is resolved by reading forward from it in small blocks (and backward over any
    backslash run just before it); the rest of the file is not read.

    :raises ValueError: a target outside ``[0, size]``.
    """
    targets = [operator.index(t) for t in targets]
    order = sorted(range(len(targets)), key=lambda n: targets[n])
    answers = [0] * len(targets)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for t in targets:
            if not 0 <= t <= size:
                raise ValueError(f"target {t} outside the file (size {size})")
        if syntax.is_csv:
            resolved = _csv_starts(f, [targets[n] for n in order], syntax, size, chunk_size)
        else:
            resolved = _text_starts(f, [targets[n] for n in order], size, chunk_size)
    for n, value in zip(order, resolved, strict=True):
        answers[n] = value
    return answers


def _starts(targets: list[int], size: int, start_after: Callable[[int], int]) -> list[int]:
    """The record start at or after each ascending target; ``start_after(t)`` finds the first
    record start >= ``t`` for ``0 < t < size`` (called with ascending targets)."""
    out: list[int] = []
    last = 0  # the most recent answer (a record start)
    for t in targets:
        if t == 0:
            out.append(0)
        elif t <= last:
            out.append(last)
        elif last >= size:
            out.append(size)
        else:
            last = start_after(t)
            out.append(last)
    return out


def _csv_starts(
    f: IO[bytes], targets: list[int], syntax: RecordSyntax, size: int, chunk_size: int
) -> list[int]:
    scan: CsvCursor | None = None

    def start_after(t: int) -> int:
        nonlocal scan
        if scan is None:
            f.seek(0)
            scan = CsvCursor(Reader(f, 0, limit=size, chunk_size=chunk_size), syntax)
        # A record starts at t exactly when the terminator's last byte is at t - 1.
        scan.advance_to(t - 1)
        found = scan.next_record()
        return size if found is None else found[1]

    return _starts(targets, size, start_after)


def _text_starts(f: IO[bytes], targets: list[int], size: int, chunk_size: int) -> list[int]:
    block = min(chunk_size, LOCAL_BLOCK)

    def start_after(t: int) -> int:
        probe = t - 1
        carry = backslashes_before(f, probe)[0] or 0
        f.seek(probe)
        found = TextCursor(Reader(f, probe, limit=size, chunk_size=block), carry).next_record()
        return size if found is None else found[1]

    return _starts(targets, size, start_after)


def detect_newline(path: PathLike | IO[bytes], syntax: RecordSyntax | None = None) -> bytes:
    """The line ending used by a file: ``b"\\n"``, ``b"\\r\\n"`` or ``b"\\r"``.

    Without ``syntax``: taken from the first CR or LF byte in the file, quoted or not. With a
    ``syntax``: from the terminator of the first record (so a CR inside a quoted csv field of an
    LF file is not mistaken for the line ending) - this is what PostgreSQL itself does. ``b"\\n"``
    when there is none. ``path`` may also be a binary file object; a seekable one is put back
    where it was.
    """
    with binary(path) as f:
        origin = f.tell() if f.seekable() else None
        try:
            reader = Reader(f, 0, chunk_size=LOCAL_BLOCK)
            if syntax is not None:
                found = cursor(reader, syntax).next_record()
                if found is None:
                    return b"\n"
                if found[1] - found[0] == 2:
                    return b"\r\n"
                # A one-byte terminator is always inside the current chunk.
                return b"\r" if reader.buf[found[0] - reader.base] == CR else b"\n"
            while reader.buf:
                m = NEWLINE_RE.search(reader.buf)
                if m is not None:
                    k = m.start()
                    if reader.buf[k] == LF:
                        return b"\n"
                    if k + 1 < len(reader.buf):
                        nxt: int | None = reader.buf[k + 1]
                    else:
                        nxt = reader.byte_after()
                    return b"\r\n" if nxt == LF else b"\r"
                reader.advance()
            return b"\n"
        finally:
            if origin is not None:
                f.seek(origin)


def first_terminator(data: bytes, syntax: RecordSyntax) -> tuple[int, int] | None:
    """Offsets ``(start, end)`` of the first record terminator in ``data`` as COPY finds it
    (outside quotes, not escaped), or None when ``data`` holds none. A CR at the very end of
    ``data`` is reported as a one-byte terminator: the caller decides whether an LF may follow.
    """
    reader = Reader(io.BytesIO(data), 0, chunk_size=max(1, len(data)))
    return cursor(reader, syntax).next_record()


def first_record(
    path_or_bytes_reader: PathLike | IO[bytes], syntax: RecordSyntax, *, limit: int = 16 << 20
) -> bytes:
    """The raw bytes of the first record, including its terminator (for header lines).

    ``path_or_bytes_reader`` is a path or a readable binary file object (``gzip.open`` works), read
    from its current position. When the file object is seekable it is left positioned right
    after the record; otherwise it has been read somewhat further.

    If the input ends before any terminator, the whole content is returned (``b""`` for empty
    input).

    :raises ValueError: the record (with its terminator) is longer than ``limit`` bytes.
    """
    with binary(path_or_bytes_reader) as f:
        origin = f.tell() if f.seekable() else None
        kept: list[bytes] = []
        reader = Reader(f, 0, limit=limit + 1, chunk_size=min(limit + 1, LOCAL_BLOCK), keep=kept)
        found = cursor(reader, syntax).next_record()
        data = b"".join(kept)
        if found is None:
            if len(data) > limit:
                raise ValueError(f"no record terminator within the first {limit} bytes")
            record = data
        else:
            if found[1] > limit:
                raise ValueError(f"no record terminator within the first {limit} bytes")
            record = data[: found[1]]
        if origin is not None:
            f.seek(origin + len(record))
        return record
