"""Byte ranges of a big file without a serial scan: split points guessed from a bounded window,
verified by the COPY tasks and repaired by finalize (docs/design.md, "Splitting without a scan").

Prepare reads a window of :data:`WINDOW` bytes at each split point (read again 4 and 16 times
as large, up to :data:`MAX_WINDOW`, when it holds no record end: at most about 1.3 MiB):

* text format: record boundaries are local (a newline ends a record unless an odd run of
  backslashes precedes it), so the boundary found is exact;
* csv: whether an offset is inside a quoted field depends on every byte before it, and no
  bounded window can prove it (with quote == escape the two possible states never converge).
  The window is read under both hypotheses (outside, inside a quoted field) and the one under
  which the quotes sit where csv writers put them (opening at a field's start, closing before
  a delimiter or a line end) wins; its first record terminator is the guessed boundary, and the
  pieces on both sides of it are *speculative*.

A speculative piece's COPY task parses its bytes from its start as a record start (it does so
anyway, for row accounting) and checks that its last record ends exactly at the piece's end.
Piece 0 of a file starts at a known record start, so if every piece of the file ends cleanly,
every guessed start was a real one (by induction): that chain is the whole check. A piece
whose end is not clean, or whose COPY failed on bytes that are not aligned (its start proved
wrong by the exact splitter, read on that failure path only), commits no rows and marks its
partition *misaligned* in the ledger. Finalize, before anything is visible, finds the first
misaligned piece of each file (its start is right: every piece before it ended cleanly),
recomputes the boundaries after it exactly from there, deletes the rows of every partition
holding a piece whose bounds changed (staging rows carry their COPY transaction's id as
``xmin``, the same as the partition's ledger row) and loads those partitions again.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from typing import IO, Any

from airflow_pg_bulk.plan import Piece
from airflow_pg_bulk.source.scanner import NEWLINE_RE, Reader, backslashes_before, cursor
from airflow_pg_bulk.source.syntax import RecordSyntax

log = logging.getLogger(__name__)

WINDOW = 64 << 10  # bytes read first at a split point
MAX_WINDOW = 1 << 20  # at most this many: a split point with no boundary within is dropped


@dataclasses.dataclass(frozen=True)
class Boundary:
    """A record start chosen near a split point.

    :param offset: where the record starts.
    :param exact: proven by the bytes read (text format), not guessed (csv).
    """

    offset: int
    exact: bool


def split_points(
    f: IO[bytes],
    start: int,
    size: int,
    count: int,
    syntax: RecordSyntax,
    delimiter: bytes = b",",
) -> tuple[list[Boundary], int]:
    """Record starts cutting ``[start, size)`` of a seekable binary file into about ``count``
    ranges, each found from a window of at most :data:`MAX_WINDOW` bytes at its split point;
    and the bytes read. ``start`` must be a record start. Split points that find no boundary
    in their window, or the same one as an earlier point, are left out."""
    found: list[Boundary] = []
    total = 0
    last = start
    for k in range(1, count):
        t = start + (size - start) * k // count
        if t <= last:
            continue
        boundary, nread = find_boundary(f, t, size, syntax, delimiter)
        total += nread
        if boundary is not None and last < boundary.offset < size:
            found.append(boundary)
            last = boundary.offset
    return found, total


def find_boundary(
    f: IO[bytes], t: int, size: int, syntax: RecordSyntax, delimiter: bytes = b","
) -> tuple[Boundary | None, int]:
    """The first record start at or after offset ``t`` (``0 < t < size``), as a window of at
    most :data:`MAX_WINDOW` bytes from ``t - 1`` tells it, and the bytes read; None when the
    window holds no boundary."""
    window = WINDOW
    nread = 0
    while True:
        lo = t - 1
        carry = 0
        if not syntax.is_csv:
            carry, back = backslashes_before(f, lo, limit=MAX_WINDOW)
            nread += back
            if carry is None:
                return None, nread
        f.seek(lo)
        # one read (a range request for an object): the window and the byte after it, which
        # decides a CR at the window's end (CR LF or CR)
        probe = f.read(min(window + 1, size - lo))
        nread += len(probe)
        n = min(window, len(probe))
        more = lo + n < size
        if syntax.is_csv:
            offset = _csv_guess(probe, n, syntax, delimiter)
        else:
            offset = _text_start(probe, n, carry)
        if offset is not None:
            return Boundary(lo + offset, exact=not syntax.is_csv), nread
        if not more or window >= MAX_WINDOW:
            return None, nread
        window = min(window * 4, MAX_WINDOW)


def _text_start(data: bytes, n: int, carry: int) -> int | None:
    """The end of the first unescaped terminator in ``data[:n]`` (``data[n:]``: look-ahead)."""
    pos = 0
    while True:
        m = NEWLINE_RE.search(data, pos, n)
        if m is None:
            return None
        k = m.start()
        j = k - 1
        while j >= 0 and data[j] == 0x5C:
            j -= 1
        run = k - 1 - j + (carry if j < 0 else 0)
        pos = k + 1
        if run & 1:
            continue
        return _terminator_end(data, k)


def _terminator_end(data: bytes, k: int) -> int:
    """Where a record starts after the line-end byte at ``k``: after an LF, after a CR LF, or
    after a CR that no LF follows (``data`` holds one byte of look-ahead unless at EOF)."""
    if data[k] == 0x0D and k + 1 < len(data) and data[k + 1] == 0x0A:
        return k + 2
    return k + 1


def _csv_guess(data: bytes, n: int, syntax: RecordSyntax, delimiter: bytes) -> int | None:
    """The first record start in ``data[:n]`` under the more plausible quote state at its
    first byte (outside quotes when both are as plausible); None when that state finds none."""
    best: tuple[int, int] | None = None
    for inside in (False, True):
        boundary, odd = _csv_scan(data, n, syntax, delimiter, inside)
        if boundary is not None and (best is None or odd < best[1]):
            best = (boundary, odd)
    return None if best is None else best[0]


def _csv_scan(
    data: bytes, n: int, syntax: RecordSyntax, delimiter: bytes, inside: bool
) -> tuple[int | None, int]:
    """Scan ``data[:n]`` from quote state ``inside``: the first record start, and how many
    quotes sit where a csv writer would not put them (an opening quote inside a field, a
    closing one before anything but a delimiter or a line end)."""
    q, e = syntax.quote[0], syntax.escape[0]
    edges = frozenset(b"\r\n" + delimiter)
    special = re.compile(b"[" + re.escape(bytes([q, e])) + b"\r\n]")
    odd = 0
    first: int | None = None
    i = 0
    while (m := special.search(data, i, n)) is not None:
        k = m.start()
        c = data[k]
        i = k + 1
        if inside:
            if c == e and k + 1 < len(data) and data[k + 1] in (q, e):
                i = k + 2  # an escaped quote (or escape): data
            elif c == q:
                inside = False
                if k + 1 < len(data) and data[k + 1] not in edges:
                    odd += 1
        elif c == q:
            inside = True
            if k > 0 and data[k - 1] not in edges:
                odd += 1
        elif c in (0x0A, 0x0D) and first is None:
            first = _terminator_end(data, k)
            i = max(i, first)
    return first, odd


def exact_starts(
    f: IO[bytes], size: int, begin: int, targets: Sequence[int], syntax: RecordSyntax
) -> list[int]:
    """For each ascending target, the first record start at or after it, read exactly from
    ``begin`` (a known record start) with the exact splitter; ``f`` is a seekable binary file
    of ``size`` bytes."""
    out: list[int] = []
    f.seek(begin)
    scan = cursor(Reader(f, begin, limit=size), syntax)
    at = begin
    for t in targets:
        while at < t:
            found = scan.next_record()
            at = size if found is None else found[1]
        out.append(at)
    return out


def ends_cleanly(f: IO[bytes], size: int, start: int, end: int, syntax: RecordSyntax) -> bool:
    """Whether, read from ``start`` as a record start, a record starts exactly at ``end``."""
    return end == start or exact_starts(f, size, start, [end], syntax) == [end]


def is_record_start(f: IO[bytes], size: int, offset: int, syntax: RecordSyntax) -> bool:
    """Whether a record starts at ``offset``, read exactly from the start of the file (the
    serial scan: only on a failure path)."""
    return offset == 0 or exact_starts(f, size, 0, [offset], syntax) == [offset]


def exact_pieces(
    pieces: Sequence[Piece], syntax: RecordSyntax, f: IO[bytes], size: int
) -> dict[Piece, Piece]:
    """The pieces of one file (``f``, ``size`` bytes), each mapped to its exact version (not
    speculative): piece 0 starts at a known record start, and every guessed start after it is
    moved to the first record start at or after it, read exactly from there (the serial scan,
    for a repair)."""
    order = sorted(pieces, key=lambda p: p.start)
    later = [p.start for p in order[1:]]
    starts = [order[0].start, *exact_starts(f, size, order[0].start, later, syntax)]
    ends = [*starts[1:], order[-1].end]
    return {
        piece: dataclasses.replace(piece, start=begin, end=end, speculative=False)
        for piece, begin, end in zip(order, starts, ends, strict=True)
    }


def file_pieces(partitions: Sequence[Any]) -> dict[str, list[Piece]]:
    """Every file's pieces, for files cut into speculative pieces."""
    files: dict[str, list[Piece]] = {}
    for part in partitions:
        for piece in part.pieces:
            if piece.speculative:
                files.setdefault(piece.path, []).append(piece)
    return files
