"""Count the records of a COPY input stream the way the server's ``COPY ... FROM STDIN`` reads
them, while the bytes stream past (row accounting).

Every COPY task counts the records it sends and compares them with the rows the server reports
(plus the rows it set aside): a disagreement of any kind - an end-of-data marker the server
stopped at, a quoting rule read differently - fails the partition before anything commits.

The rules mirror ``CopyReadLineText`` in PostgreSQL's ``copyfromparse.c`` (read for 15 and 18,
and checked against both servers by the tests):

* a record ends at a CR, LF or CR LF outside csv quotes and not escaped by an odd run of
  backslashes (text format); the session's line ending is that of its first record;
* the end-of-data marker ``\\.`` followed by the session's line ending (:class:`MarkerRule`):

  - text format before 18: an unescaped ``\\.`` anywhere on a line ends the input; data before
    it on that line is still loaded as the last row;
  - text format on 18+: only ``\\.`` alone on its line (with data before it the server raises);
  - csv before 18: only ``\\.`` as the first bytes of a record (never inside quotes);
  - csv on 18+: never: ``\\.`` is data.

  A marker with nothing after it in the whole file is harmless: COPY of the file loads every
  row. A marker with anything after it makes COPY skip the rest silently, so the counter
  refuses it, naming the line, before the server has read past it.

Counting costs a few C-level byte searches per chunk (``count``, ``find``, and for quoted csv a
``split`` on the quote byte); only csv with an escape byte other than the quote walks the
escape, quote and newline bytes one by one, and only in chunks that hold an escape byte.
"""

from __future__ import annotations

import codecs
import enum
import functools
import re
from collections.abc import Iterable, Iterator

from airflow_pg_bulk.plan.codes import CopyFormat
from airflow_pg_bulk.source import charsets
from airflow_pg_bulk.source.boundaries import first_terminator
from airflow_pg_bulk.source.syntax import RecordSyntax

_HOLD = 5  # bytes kept back for look-ahead: a CR LF, then "\.\r\n", checked from the CR LF
_FIRST_RECORD_LIMIT = 256 << 20  # bytes held at most while the first line ending is unknown
_MARKER = b"\\."
_NAMES = {b"\n": "LF", b"\r\n": "CRLF", b"\r": "CR"}


@functools.cache
def _all_bytes_but(keep: bytes) -> bytes:
    """Every byte value except those in ``keep`` (to delete with ``bytes.translate``)."""
    return bytes(b for b in range(256) if b not in keep)


class MarkerRule(enum.Enum):
    """Where this server's ``COPY ... FROM STDIN`` takes ``\\.`` + newline for end of data."""

    NONE = "none"
    RECORD_START = "record start"
    ANYWHERE = "anywhere"
    ALONE = "alone on its line"


def marker_rule(fmt: CopyFormat | str, server_version: int) -> MarkerRule:
    """The end-of-data rule for a COPY format (csv or text) on a server version (e.g. 150020)."""
    if CopyFormat(fmt).is_csv:
        return MarkerRule.NONE if server_version >= 180000 else MarkerRule.RECORD_START
    return MarkerRule.ALONE if server_version >= 180000 else MarkerRule.ANYWHERE


class RecordError(ValueError):
    """The stream cannot be loaded as one COPY of the whole file would load it.

    :param line: physical line number in the file.
    :param message: what is wrong, in the server's words where it has them.
    """

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class RecordCounter:
    """Counts the records of one COPY session's input, fed in chunks of any size.

    :param syntax: the format's quoting rules.
    :param rule: the server's end-of-data marker rule (:func:`marker_rule`).
    :param first_line: physical line number, in the file, of the stream's first byte.
    :param file_end: the stream ends where the file ends (a piece in the middle of a file is
        followed by the rest of it, so a marker at its end would still lose rows).
    :param expected_newline: the line ending of the file's first line, when this stream is not
        the start of the file (a later piece, or the data after a header line): one COPY of the
        whole file rejects a line that ends otherwise, so the stream's first record must end so.
    :param encoding: the bytes' encoding; client-only encodings (SJIS, BIG5, ...) are counted
        on their UTF-8 transcoding, where no trail byte can pass for a quote or backslash.
    """

    def __init__(
        self,
        syntax: RecordSyntax,
        rule: MarkerRule,
        *,
        first_line: int = 1,
        file_end: bool = True,
        expected_newline: bytes | None = None,
        encoding: str = "UTF8",
    ) -> None:
        self._syntax = syntax
        self._rule = rule
        self._first_line = first_line
        self._file_end = file_end
        self._expected = expected_newline
        self._decoder = None
        if not charsets.can_split(encoding):
            codec = charsets.python_codec(encoding)
            self._decoder = codecs.getincrementaldecoder(codec)(errors="replace")
        self._q = syntax.quote if syntax.is_csv else b""
        self._e = syntax.escape if syntax.is_csv else b""
        self._held = b""  # stream bytes not processed yet
        self._eol: bytes | None = None  # the session's line ending, once its first record ended
        self._eolb = b"\n"
        self._terminators = 0
        self._lines = 0  # eol bytes processed (physical lines before the held bytes)
        self._at_start = True  # the next byte to process starts a record
        self._in_quote = False
        self._last_was_esc = False
        self._backslashes = 0  # backslash run ending right before the held bytes (text)
        self._marker_line: int | None = None  # a harmless final marker was seen on this line
        self._adjust = 0
        self._records: int | None = None
        self._newlines: int | None = None  # the region's line-ending bytes, when counted
        self._scanned = 0
        if syntax.is_csv and syntax.quote != syntax.escape:
            self._special = re.compile(
                b"[" + re.escape(syntax.quote) + re.escape(syntax.escape) + b"\r\n]"
            )

    # --- public ------------------------------------------------------------------------------

    @property
    def records(self) -> int:
        """Records in the stream (valid after :meth:`finish`)."""
        if self._records is None:
            raise RuntimeError("finish() was not called")
        return self._records

    @property
    def ends_at_record_start(self) -> bool:
        """Whether the stream's last byte ended a record (outside quotes, not escaped), or the
        stream is empty (valid after :meth:`finish`): a piece that ends where its next piece's
        guessed start is ends cleanly exactly when this holds."""
        return self._at_start

    def feed(self, data: bytes) -> None:
        """Account for the next bytes of the stream.

        :raises RecordError: an end-of-data marker with data after it, or a first line ending
            that differs from the file's."""
        if not data:
            return
        if self._decoder is not None:
            data = self._decoder.decode(data).encode("utf-8")
        if self._marker_line is not None:
            raise self._marker_error(self._marker_line)
        buf = self._held + data
        if self._eol is None:
            if len(buf) < 2 * self._scanned:
                self._held = buf  # rescan only when the bytes held have doubled: linear time
                return
            self._scanned = len(buf)
            if not self._find_eol(buf, final=False):
                if len(buf) > _FIRST_RECORD_LIMIT:
                    raise RecordError(
                        self._first_line,
                        f"no line ending within the first {_FIRST_RECORD_LIMIT >> 20} MiB "
                        "of this part of the file (an unterminated quoted field?)",
                    )
                self._held = buf
                return
        n = len(buf) - _HOLD
        if n > 0:
            self._process(buf, n)
            buf = buf[n:]
        self._held = buf

    def finish(self) -> int:
        """The number of records, once the stream has ended."""
        if self._records is not None:
            return self._records
        buf = self._held
        if self._decoder is not None:
            buf += self._decoder.decode(b"", final=True).encode("utf-8")
        if self._eol is None:
            self._find_eol(buf, final=True)
        if buf:
            self._process(buf, len(buf))
            self._held = b""
        if self._marker_line is not None and not self._file_end:
            raise self._marker_error(self._marker_line)
        self._records = self._terminators + (0 if self._at_start else 1) + self._adjust
        return self._records

    def wrap(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """Pass ``chunks`` through, counting them; the count is final once they are exhausted."""
        for chunk in chunks:
            self.feed(chunk)
            yield chunk
        self.finish()

    # --- the session's line ending -----------------------------------------------------------

    def _find_eol(self, buf: bytes, *, final: bool) -> bool:
        """Take the line ending from the first record's terminator; False: not known yet."""
        found = first_terminator(buf, self._syntax)
        if found is None:
            if final:
                self._eol = b"\n"  # one unterminated record: no line ending to agree on
                self._eolb = b"\n"
            return final
        start, end = found
        if end - start == 2:
            eol = b"\r\n"
        elif buf[start] == 0x0A:
            eol = b"\n"
        elif end == len(buf) and not final:
            return False  # a CR at the end of what we have: an LF may follow
        else:
            eol = b"\r"
        self._eol, self._eolb = eol, eol[-1:]
        if self._expected is not None and eol != self._expected:
            line = self._first_line + buf.count(self._expected[-1:], 0, start)
            raise RecordError(line, self._ending_message(eol))
        return True

    def _ending_message(self, eol: bytes) -> str:
        expected = self._expected or b"\n"
        stray = "newline" if expected == b"\r" or eol == b"\n" else "carriage return"
        kind = "unquoted" if self._syntax.is_csv else "literal"
        return (
            f"{kind} {stray} found in data (this line ends with {_NAMES[eol]} but the file's "
            f"first line with {_NAMES.get(expected, repr(expected))}: COPY rejects a file "
            "whose line endings change)"
        )

    # --- counting ----------------------------------------------------------------------------

    def _process(self, buf: bytes, n: int) -> None:
        """Account for ``buf[:n]``; ``buf[n:]`` (look-ahead) is processed later."""
        self._newlines = None
        if not self._syntax.is_csv:
            self._process_text(buf, n)
        elif self._q == self._e or (not self._last_was_esc and buf.find(self._e, 0, n) < 0):
            self._process_csv(buf, n)
        else:
            self._process_csv_escaped(buf, n)
        # the line-ending bytes of the region, counted once (a pass over it: 0.8 ms a MB)
        newlines = self._newlines
        self._lines += buf.count(self._eolb, 0, n) if newlines is None else newlines

    def _run(self, buf: bytes, k: int) -> int:
        """Length of the backslash run ending at ``buf[k]`` (0 if it is no backslash)."""
        j = k
        while j >= 0 and buf[j] == 0x5C:
            j -= 1
        return k - j + (self._backslashes if j < 0 else 0)

    def _process_text(self, buf: bytes, n: int) -> None:
        eolb = self._eolb
        terminators = self._newlines = buf.count(eolb, 0, n)
        if n and buf[0] == eolb[0] and self._backslashes & 1:
            terminators -= 1  # escaped by the run that ended the last region
        if buf.find(b"\\", 0, min(len(buf), n + 1)) < 0:  # no backslash: nothing escaped
            self._terminators += terminators
            if n:
                self._at_start = self._text_terminator(buf, n - 1)
                self._backslashes = 0
            return
        escaped = b"\\" + eolb
        k = buf.find(escaped, 0, n)
        while k >= 0:
            if self._run(buf, k) & 1:
                terminators -= 1
            k = buf.find(escaped, k + 1, n)
        if self._rule in (MarkerRule.ANYWHERE, MarkerRule.ALONE):
            stop = min(len(buf), n + 1)  # a marker starting in the region may end past it
            k = buf.find(_MARKER, 0, stop)
            while k >= 0:
                if self._run(buf, k) & 1 and buf.startswith(self._eol or b"\n", k + 2):
                    at_start = self._at_start if k == 0 else self._text_terminator(buf, k - 1)
                    if at_start or self._rule is MarkerRule.ANYWHERE:
                        self._on_marker(buf, k, data_before=not at_start)
                k = buf.find(_MARKER, k + 1, stop)
        self._terminators += terminators
        if n:
            self._at_start = self._text_terminator(buf, n - 1)
            run = self._run(buf, n - 1)
            self._backslashes = run
        # (n == 0: nothing changes)

    def _text_terminator(self, buf: bytes, k: int) -> bool:
        """Whether ``buf[k]`` is an unescaped line-ending byte of the session."""
        return (
            buf[k] == self._eolb[0]
            and not (k > 0 and self._run(buf, k - 1) & 1)
            and not (k == 0 and self._backslashes & 1)
        )

    def _process_csv(self, buf: bytes, n: int) -> None:
        """csv where every quote byte toggles (escape == quote, or no escape byte here)."""
        q, eolb = self._q, self._eolb
        if self._rule is MarkerRule.RECORD_START:
            self._csv_markers(buf, n)
        if not self._in_quote and buf.find(q, 0, n) < 0:
            self._newlines = buf.count(eolb, 0, n)
            self._terminators += self._newlines
        else:
            # Only the quote and newline bytes matter: keep those (one C pass), then drop
            # adjacent quote pairs (an empty or newline-free quoted field, a doubled quote),
            # which changes no other byte's quote parity. What is left is usually newlines
            # alone; split on the quotes only if some remain.
            skeleton = buf[:n].translate(None, _all_bytes_but(q + eolb)).replace(q + q, b"")
            if q not in skeleton:  # only newlines left, all inside or all outside quotes
                self._terminators += 0 if self._in_quote else len(skeleton)
            else:
                parts = skeleton.split(q)
                outside = parts[1::2] if self._in_quote else parts[0::2]
                self._terminators += b"".join(outside).count(eolb)
                if len(parts) % 2 == 0:
                    self._in_quote = not self._in_quote
        if n:
            self._at_start = buf[n - 1] == eolb[0] and not self._in_quote
            self._last_was_esc = False

    def _csv_markers(self, buf: bytes, n: int) -> None:
        """Markers at record starts in ``buf[:n]`` (quote state from the region's start)."""
        eol = self._eol or b"\n"
        if buf.find(b"\\", 0, min(len(buf), n + 1)) < 0:
            return  # no backslash, no marker
        if self._at_start and buf.startswith(_MARKER + eol):
            self._on_marker(buf, 0, data_before=False)
        # newline + marker with the marker starting inside the region (one starting at n is
        # found from the next region's start)
        stop = min(len(buf), n + 1)
        k = buf.find(self._eolb + _MARKER, 0, stop)
        in_quote, counted_to = self._in_quote, 0
        while k >= 0:
            if buf.count(self._q, counted_to, k) & 1:
                in_quote = not in_quote
            counted_to = k
            if not in_quote and buf.startswith(eol, k + 3):
                self._on_marker(buf, k + 1, data_before=False)
            k = buf.find(self._eolb + _MARKER, k + 1, stop)

    def _process_csv_escaped(self, buf: bytes, n: int) -> None:
        """csv with an escape byte other than the quote: CopyReadLineText's state machine."""
        q, e, eolb = self._q[0], self._e[0], self._eolb[0]
        eol = self._eol or b"\n"
        markers = self._rule is MarkerRule.RECORD_START
        if markers and self._at_start and buf.startswith(_MARKER + eol):
            self._on_marker(buf, 0, data_before=False)
        in_quote, last_was_esc, at_start = self._in_quote, self._last_was_esc, self._at_start
        i = 0
        for m in self._special.finditer(buf, 0, n):
            k = m.start()
            c = buf[k]
            if k > i:  # ordinary bytes in between reset the escape
                last_was_esc = False
                at_start = False
            if in_quote and c == e:
                last_was_esc = not last_was_esc
            if c == q and not last_was_esc:
                in_quote = not in_quote
            if c != e:
                last_was_esc = False
            at_start = False
            if c == eolb and not in_quote:
                self._terminators += 1
                at_start = True
                if markers and k + 1 < n and buf.startswith(_MARKER + eol, k + 1):
                    self._on_marker(buf, k + 1, data_before=False)
            i = k + 1
        if n > i:
            last_was_esc = False
            at_start = False
        self._in_quote, self._last_was_esc, self._at_start = in_quote, last_was_esc, at_start

    # --- end-of-data markers -----------------------------------------------------------------

    def _on_marker(self, buf: bytes, k: int, *, data_before: bool) -> None:
        line = self._first_line + self._lines + buf.count(self._eolb, 0, k)
        if self._marker_line is not None:
            raise self._marker_error(self._marker_line)
        end = k + 2 + len(self._eol or b"\n")
        if end < len(buf) or not self._file_end:
            raise self._marker_error(line)
        self._marker_line = line
        if not data_before:
            self._adjust -= 1  # "\." and its newline were counted as a record: COPY loads none

    def _marker_error(self, line: int) -> RecordError:
        return RecordError(
            line,
            "\\. followed by a newline here ends COPY's input (the end-of-data marker), and "
            "PostgreSQL would silently skip every row after it. Quote or escape it, or remove "
            "the line",
        )
