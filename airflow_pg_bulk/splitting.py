"""Split CSV / PostgreSQL text-format files at record boundaries, as ``COPY`` sees records.

A large file is cut into byte ranges that separate ``COPY ... FROM STDIN`` sessions load in
parallel. Every range has to begin exactly where PostgreSQL's COPY parser would begin a record,
so this module mirrors ``CopyReadLineText`` in PostgreSQL's ``copyfromparse.c``:

* **csv**: with quote ``q`` and escape ``e``. When ``e == q`` every ``q`` toggles the in-quote
  state (PostgreSQL sets ``escapec = '\\0'`` in that case). When ``e != q``, inside quotes an
  ``e`` followed by ``q`` or ``e`` is an escape pair whose second byte does not toggle anything;
  outside quotes ``e`` is an ordinary byte. A CR or LF outside quotes ends the record, and CR LF
  is a single terminator.
* **text**: no quoting; a backslash makes the next byte ordinary, so a CR or LF preceded by an
  odd number of consecutive backslashes is data, not a terminator.

Files are read in bounded chunks; no function loads a whole file into memory. Only encodings in
which every byte < 0x80 is an ASCII character can be split this way (see :func:`can_split`).

Not modelled here: the ``\\.`` end-of-data marker and the errors PostgreSQL raises for files that
mix line-ending styles (a CR outside quotes in an LF file and so on); any CR, LF or CR LF
outside quotes is treated as a terminator. :mod:`airflow_pg_bulk.records` models both where it
matters: on the bytes each COPY is sent.
"""

from __future__ import annotations

import contextlib
import io
import operator
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Literal

from airflow_pg_bulk.charsets import can_split, python_codec

#: how a record is numbered: as PostgreSQL's COPY context counts (``line N``), or plainly
Numbering = Literal["postgres", "records"]

__all__ = [
    "RecordSyntax",
    "can_split",
    "count_newlines",
    "detect_newline",
    "first_record",
    "first_terminator",
    "iter_range",
    "parse_header",
    "record_line_numbers",
    "record_locations",
    "record_starts",
]

_CR = 0x0D
_LF = 0x0A
_BACKSLASH = 0x5C
_UTF8_BOM = b"\xef\xbb\xbf"
_NEWLINE_RE = re.compile(b"[\r\n]")
_DEFAULT_CHUNK = 4 << 20
_LOCAL_BLOCK = 64 << 10

PathLike = str | os.PathLike[str]


# --------------------------------------------------------------------------------------------
# Record syntax
# --------------------------------------------------------------------------------------------


def _one_byte(name: str, value: object) -> bytes:
    if isinstance(value, str):
        if len(value) != 1 or not value.isascii():
            raise ValueError(f"{name} must be a single one-byte character, not {value!r}")
        value = value.encode("ascii")
    if not isinstance(value, (bytes, bytearray)) or len(value) != 1:
        raise ValueError(f"{name} must be exactly one byte, not {value!r}")
    value = bytes(value)
    if value in (b"\r", b"\n"):
        raise ValueError(f"{name} cannot be a newline or carriage return ({value!r})")
    if value == b"\0":
        raise ValueError(f"{name} cannot be a NUL byte")
    return value


@dataclass(frozen=True)
class RecordSyntax:
    """How records end: format ``'csv'`` or ``'text'``; quote/escape single bytes (csv only).

    ``quote`` and ``escape`` may also be given as one-character ASCII strings; they are stored as
    bytes. For ``format='text'`` they are validated but ignored.

    :raises ValueError: unknown format, or a quote/escape that is not exactly one byte or that is
        CR, LF or NUL.
    """

    format: str = "csv"
    quote: bytes = b'"'
    escape: bytes = b'"'

    def __post_init__(self) -> None:
        fmt = self.format.lower() if isinstance(self.format, str) else self.format
        if fmt not in ("csv", "text"):
            raise ValueError(f"format must be 'csv' or 'text', not {self.format!r}")
        object.__setattr__(self, "format", fmt)
        object.__setattr__(self, "quote", _one_byte("quote", self.quote))
        object.__setattr__(self, "escape", _one_byte("escape", self.escape))

    @property
    def is_csv(self) -> bool:
        """True for the csv format."""
        return self.format == "csv"


# --------------------------------------------------------------------------------------------
# Chunked reading
# --------------------------------------------------------------------------------------------


class _Reader:
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
        chunk_size: int = _DEFAULT_CHUNK,
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


class _Cursor:
    """Walks records from a position where the parser state is known."""

    def __init__(self, reader: _Reader) -> None:
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
            if buf[k + 1] == _LF:
                self.i = k + 2
                return term, term + 2
            self.i = k + 1
            return term, term + 1
        if self.r.byte_after() == _LF:
            self._next_chunk()
            self.i = 1
            return term, term + 2
        self.i = k + 1
        return term, term + 1

    def next_record(self) -> tuple[int, int] | None:  # pragma: no cover - abstract
        """Consume through the next terminator: ``(terminator_start, next_record_start)``."""
        raise NotImplementedError


class _CsvCursor(_Cursor):
    """CopyReadLineText's csv state machine, skipping ordinary bytes with C-level searches."""

    def __init__(self, reader: _Reader, syntax: RecordSyntax) -> None:
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
            if c == _LF:
                self.i = k + 1
                return self.r.base + k, self.r.base + k + 1
            return self._finish_cr(k)


class _TextCursor(_Cursor):
    """CopyReadLineText's text-format rules: a newline after an odd backslash run is data."""

    def __init__(self, reader: _Reader, backslashes_before: int = 0) -> None:
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
            m = _NEWLINE_RE.search(buf, self.i)
            if m is None:
                if not buf or not self._next_chunk():
                    self.i = len(self.r.buf)
                    return None
                continue
            k = m.start()
            j = k - 1
            while j >= 0 and buf[j] == _BACKSLASH:
                j -= 1
            run = k - 1 - j + (self._carry if j < 0 else 0)
            self.i = k + 1
            if run & 1:
                continue  # escaped: the newline byte is data
            if buf[k] == _LF:
                return self.r.base + k, self.r.base + k + 1
            return self._finish_cr(k)


def _backslashes_before(f: IO[bytes], pos: int) -> int:
    """Length of the run of backslashes that ends right before absolute offset ``pos``."""
    run = 0
    while pos > 0:
        lo = max(0, pos - 4096)
        f.seek(lo)
        block = f.read(pos - lo)
        stripped = len(block.rstrip(b"\\"))
        run += len(block) - stripped
        if stripped or not block:
            break
        pos = lo
    return run


def _cursor(reader: _Reader, syntax: RecordSyntax) -> _CsvCursor | _TextCursor:
    return _CsvCursor(reader, syntax) if syntax.is_csv else _TextCursor(reader)


@contextlib.contextmanager
def _binary(source: PathLike | IO[bytes]) -> Iterator[IO[bytes]]:
    if hasattr(source, "read"):
        yield source  # type: ignore[misc]
    else:
        with open(source, "rb") as f:  # type: ignore[arg-type]
            yield f


def _check_range(size: int, start: int, end: int | None) -> int:
    if end is None:
        end = size
    if not 0 <= start <= end <= size:
        raise ValueError(f"invalid byte range [{start}, {end}) for a file of {size} bytes")
    return end


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def record_starts(
    path: PathLike,
    targets: Sequence[int],
    syntax: RecordSyntax,
    *,
    chunk_size: int = _DEFAULT_CHUNK,
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
    cursor: _CsvCursor | None = None

    def start_after(t: int) -> int:
        nonlocal cursor
        if cursor is None:
            f.seek(0)
            cursor = _CsvCursor(_Reader(f, 0, limit=size, chunk_size=chunk_size), syntax)
        # A record starts at t exactly when the terminator's last byte is at t - 1.
        cursor.advance_to(t - 1)
        found = cursor.next_record()
        return size if found is None else found[1]

    return _starts(targets, size, start_after)


def _text_starts(f: IO[bytes], targets: list[int], size: int, chunk_size: int) -> list[int]:
    block = min(chunk_size, _LOCAL_BLOCK)

    def start_after(t: int) -> int:
        probe = t - 1
        carry = _backslashes_before(f, probe)
        f.seek(probe)
        cursor = _TextCursor(_Reader(f, probe, limit=size, chunk_size=block), carry)
        found = cursor.next_record()
        return size if found is None else found[1]

    return _starts(targets, size, start_after)


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
        end = _check_range(size, start, end)
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
    chunk_size: int = _DEFAULT_CHUNK,
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


def detect_newline(path: PathLike | IO[bytes], syntax: RecordSyntax | None = None) -> bytes:
    """The line ending used by a file: ``b"\\n"``, ``b"\\r\\n"`` or ``b"\\r"``.

    Without ``syntax``: taken from the first CR or LF byte in the file, quoted or not. With a
    ``syntax``: from the terminator of the first record (so a CR inside a quoted csv field of an
    LF file is not mistaken for the line ending) - this is what PostgreSQL itself does. ``b"\\n"``
    when there is none. ``path`` may also be a binary file object; a seekable one is put back
    where it was.
    """
    with _binary(path) as f:
        origin = f.tell() if f.seekable() else None
        try:
            reader = _Reader(f, 0, chunk_size=_LOCAL_BLOCK)
            if syntax is not None:
                found = _cursor(reader, syntax).next_record()
                if found is None:
                    return b"\n"
                if found[1] - found[0] == 2:
                    return b"\r\n"
                # A one-byte terminator is always inside the current chunk.
                return b"\r" if reader.buf[found[0] - reader.base] == _CR else b"\n"
            while reader.buf:
                m = _NEWLINE_RE.search(reader.buf)
                if m is not None:
                    k = m.start()
                    if reader.buf[k] == _LF:
                        return b"\n"
                    if k + 1 < len(reader.buf):
                        nxt: int | None = reader.buf[k + 1]
                    else:
                        nxt = reader.byte_after()
                    return b"\r\n" if nxt == _LF else b"\r"
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
    reader = _Reader(io.BytesIO(data), 0, chunk_size=max(1, len(data)))
    return _cursor(reader, syntax).next_record()


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
    with _binary(path_or_bytes_reader) as f:
        origin = f.tell() if f.seekable() else None
        kept: list[bytes] = []
        reader = _Reader(f, 0, limit=limit + 1, chunk_size=min(limit + 1, _LOCAL_BLOCK), keep=kept)
        found = _cursor(reader, syntax).next_record()
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


def _record_content(record: bytes, syntax: RecordSyntax) -> bytes:
    """The first record in ``record`` without its terminator."""
    reader = _Reader(io.BytesIO(record), 0, chunk_size=max(1, len(record)))
    found = _cursor(reader, syntax).next_record()
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
            if c == _BACKSLASH:
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
    delim = _one_byte("delimiter", delimiter)
    if syntax.is_csv and delim in (syntax.quote, syntax.escape):
        raise ValueError("delimiter must differ from the quote and escape characters")
    if not syntax.is_csv and delim in b"\\.abcdefghijklmnopqrstuvwxyz0123456789":
        raise ValueError(f"text-format delimiter cannot be {delim!r} (COPY rejects it)")
    codec = python_codec(encoding)
    if record.startswith(_UTF8_BOM):
        record = record[len(_UTF8_BOM) :]
    line = _record_content(record, syntax)
    if syntax.is_csv:
        raw = _split_csv(line, delim[0], syntax.quote[0], syntax.escape[0])
    else:
        raw = _split_text(line, delim[0])
    return [field.decode(codec) for field in raw]


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
        end = _check_range(size, start, end)
        f.seek(start)
        cursor = _cursor(_Reader(f, start, limit=end, chunk_size=_LOCAL_BLOCK), syntax)
        counter = _RunningCounter(g, start, end)
        eol = b"\r"  # PostgreSQL's EOL_UNKNOWN: quoted CRs are counted until the first terminator
        record_start = start
        while record_start < end and len(spans) < len(wanted):
            found = cursor.next_record()
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
        self._reader = _Reader(f, start, limit=end, chunk_size=_LOCAL_BLOCK)

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
