"""CopyReadLineText's record scanner, over bounded chunks of a binary stream.

A :class:`Reader` holds at most two chunks of a file at a time; a cursor (:func:`cursor`) walks
records from a position where the parser state is known, as PostgreSQL's ``copyfromparse.c``
does (see :mod:`.boundaries` for the rules). Everything that finds record ends, exactly
(:mod:`.boundaries`, :mod:`.lines`, :mod:`.header`) or from a window (:mod:`.window`), scans
with these.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import IO

from airflow_pg_bulk.source.syntax import RecordSyntax

CR = 0x0D
LF = 0x0A
BACKSLASH = 0x5C
#: a CR or LF byte
NEWLINE_RE = re.compile(b"[\r\n]")
#: bytes read at once by a serial scan
DEFAULT_CHUNK = 4 << 20
#: bytes read at once near a known offset (a header, a split point)
LOCAL_BLOCK = 64 << 10

PathLike = str | os.PathLike[str]


class Reader:
    """Bounded sequential chunks of a binary stream, with one chunk of look-ahead.

    ``buf`` holds the bytes at absolute offsets ``[base, base + len(buf))``. At most two chunks
    are held at once. ``limit`` is an absolute offset reading never goes past (None: EOF).
    """

    def __init__(
        self,
        f: IO[bytes],
        base: int,
        *,
        limit: int | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        keep: list[bytes] | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self._f = f
        self._chunk_size = chunk_size
        self._remaining = None if limit is None else max(0, limit - base)
        self._keep = keep
        self._ahead: bytes | None = None
        self.base = base
        self.buf = self._read()

    def _read(self) -> bytes:
        size = self._chunk_size
        if self._remaining is not None:
            size = min(size, self._remaining)
            if size <= 0:
                return b""
        data = self._f.read(size) or b""
        if self._remaining is not None:
            self._remaining -= len(data)
        if self._keep is not None and data:
            self._keep.append(data)
        return data

    def advance(self) -> bool:
        """Move to the next chunk; False at the end (``buf`` is then empty)."""
        self.base += len(self.buf)
        if self._ahead is not None:
            self.buf, self._ahead = self._ahead, None
        else:
            self.buf = self._read()
        return bool(self.buf)

    def byte_after(self) -> int | None:
        """The byte right after ``buf`` (None at the end), without moving."""
        if self._ahead is None:
            self._ahead = self._read()
        return self._ahead[0] if self._ahead else None


class Cursor:
    """Walks records from a position where the parser state is known."""

    def __init__(self, reader: Reader) -> None:
        self.r = reader
        self.i = 0

    @property
    def pos(self) -> int:
        """Absolute offset of the next unread byte."""
        return self.r.base + self.i

    def _next_chunk(self) -> bool:
        self.i = 0
        return self.r.advance()

    def _finish_cr(self, k: int) -> tuple[int, int]:
        """A CR terminator at buffer index ``k``: consume it (and an LF right after it)."""
        buf = self.r.buf
        term = self.r.base + k
        if k + 1 < len(buf):
            if buf[k + 1] == LF:
                self.i = k + 2
                return term, term + 2
            self.i = k + 1
            return term, term + 1
        if self.r.byte_after() == LF:
            self._next_chunk()
            self.i = 1
            return term, term + 2
        self.i = k + 1
        return term, term + 1

    def next_record(self) -> tuple[int, int] | None:  # pragma: no cover - abstract
        """Consume through the next terminator: ``(terminator_start, next_record_start)``."""
        raise NotImplementedError


class CsvCursor(Cursor):
    """CopyReadLineText's csv state machine, skipping ordinary bytes with C-level searches."""

    def __init__(self, reader: Reader, syntax: RecordSyntax) -> None:
        super().__init__(reader)
        self.qb = syntax.quote
        self.eb = syntax.escape
        self.q = syntax.quote[0]
        self.e = syntax.escape[0]
        self.simple = self.q == self.e
        self.in_quote = False
        self.last_was_esc = False
        self._outside = re.compile(b"[" + re.escape(self.qb) + b"\r\n]")
        self._inside = re.compile(b"[" + re.escape(self.qb) + re.escape(self.eb) + b"]")

    def _consume(self, buf: bytes, a: int, b: int) -> None:
        """Update the quote state over ``buf[a:b]`` (no record ends inside, or none matter)."""
        if self.simple:
            if buf.count(self.qb, a, b) & 1:
                self.in_quote = not self.in_quote
            return
        q, e = self.q, self.e
        while a < b:
            if self.last_was_esc:
                # The byte after an escape inside quotes: an escaped quote/escape is skipped.
                self.last_was_esc = False
                if buf[a] in (q, e):
                    a += 1
                continue
            k = buf.find(self.eb, a, b)
            stop = b if k < 0 else k
            # Between escape bytes every quote simply toggles.
            if buf.count(self.qb, a, stop) & 1:
                self.in_quote = not self.in_quote
            if k < 0:
                return
            if self.in_quote:
                self.last_was_esc = True
            a = k + 1

    def advance_to(self, target: int) -> None:
        """Consume bytes up to absolute offset ``target`` (exclusive), tracking quote state."""
        while True:
            buf = self.r.buf
            stop = min(len(buf), target - self.r.base)
            if stop > self.i:
                self._consume(buf, self.i, stop)
                self.i = stop
            if self.r.base + self.i >= target or not buf or not self._next_chunk():
                return

    def next_record(self) -> tuple[int, int] | None:
        """Consume through the next terminator outside quotes; None at the end of input."""
        q = self.q
        while True:
            buf = self.r.buf
            if self.i >= len(buf):
                if not self._next_chunk():
                    return None
                continue
            if self.in_quote:
                if self.last_was_esc:
                    self.last_was_esc = False
                    if buf[self.i] in (q, self.e):
                        self.i += 1
                    continue
                if self.simple:
                    k = buf.find(self.qb, self.i)
                    if k < 0:
                        self.i = len(buf)
                        continue
                    self.in_quote = False
                else:
                    m = self._inside.search(buf, self.i)
                    if m is None:
                        self.i = len(buf)
                        continue
                    k = m.start()
                    if buf[k] == q:
                        self.in_quote = False
                    else:
                        self.last_was_esc = True
                self.i = k + 1
                continue
            m = self._outside.search(buf, self.i)
            if m is None:
                self.i = len(buf)
                continue
            k = m.start()
            c = buf[k]
            if c == q:
                self.in_quote = True
                self.i = k + 1
                continue
            if c == LF:
                self.i = k + 1
                return self.r.base + k, self.r.base + k + 1
            return self._finish_cr(k)


class TextCursor(Cursor):
    """CopyReadLineText's text-format rules: a newline after an odd backslash run is data."""

    def __init__(self, reader: Reader, backslashes_before: int = 0) -> None:
        super().__init__(reader)
        # Length of the backslash run that ends right before buf[0].
        self._carry = backslashes_before

    def _next_chunk(self) -> bool:
        buf = self.r.buf
        run = len(buf) - len(buf.rstrip(b"\\"))
        self._carry = run + self._carry if run == len(buf) else run
        return super()._next_chunk()

    def next_record(self) -> tuple[int, int] | None:
        """Consume through the next unescaped terminator; None at the end of input."""
        while True:
            buf = self.r.buf
            m = NEWLINE_RE.search(buf, self.i)
            if m is None:
                if not buf or not self._next_chunk():
                    self.i = len(self.r.buf)
                    return None
                continue
            k = m.start()
            j = k - 1
            while j >= 0 and buf[j] == BACKSLASH:
                j -= 1
            run = k - 1 - j + (self._carry if j < 0 else 0)
            self.i = k + 1
            if run & 1:
                continue  # escaped: the newline byte is data
            if buf[k] == LF:
                return self.r.base + k, self.r.base + k + 1
            return self._finish_cr(k)


def backslashes_before(f: IO[bytes], pos: int, limit: int | None = None) -> tuple[int | None, int]:
    """The length of the run of backslashes that ends right before absolute offset ``pos``,
    and the bytes read to find it. With ``limit``, at most that many bytes before ``pos`` are
    read: the run is None when it is longer (it may go on past the limit)."""
    lo = 0 if limit is None else max(0, pos - limit)
    run = 0
    nread = 0
    while pos > lo:
        a = max(lo, pos - 4096)
        f.seek(a)
        block = f.read(pos - a)
        nread += len(block)
        stripped = len(block.rstrip(b"\\"))
        run += len(block) - stripped
        if stripped or not block:
            return run, nread
        pos = a
    return (run if lo == 0 else None), nread


def cursor(reader: Reader, syntax: RecordSyntax, backslashes: int = 0) -> CsvCursor | TextCursor:
    """A cursor over ``reader`` for ``syntax``, at a record start (csv: outside quotes; text:
    after a run of ``backslashes`` backslashes, 0 at a record start)."""
    return CsvCursor(reader, syntax) if syntax.is_csv else TextCursor(reader, backslashes)


@contextlib.contextmanager
def binary(source: PathLike | IO[bytes]) -> Iterator[IO[bytes]]:
    """``source`` as a binary file: a path opened (and closed after), a file object as is."""
    if hasattr(source, "read"):
        yield source  # type: ignore[misc]
    else:
        with open(source, "rb") as f:  # type: ignore[arg-type]
            yield f


def check_range(size: int, start: int, end: int | None) -> int:
    """``end`` (None: ``size``), checked to make ``[start, end)`` a byte range of the file.

    :raises ValueError: not ``0 <= start <= end <= size``."""
    if end is None:
        end = size
    if not 0 <= start <= end <= size:
        raise ValueError(f"invalid byte range [{start}, {end}) for a file of {size} bytes")
    return end
