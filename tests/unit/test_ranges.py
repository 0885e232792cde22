"""Splitting without a scan (airflow_pg_bulk.source.window, realign): bounded reads in prepare,
and the chain check + repair giving exactly the record starts of today's exact splitter (the oracle,
boundaries.record_starts), over random files and split points."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_pg_bulk.plan import CopyOptions, Partition, Piece
from airflow_pg_bulk.source import boundaries, cutting, lines, listing, window
from airflow_pg_bulk.source.boundaries import record_starts
from airflow_pg_bulk.source.syntax import RecordSyntax

SYNTAXES = {
    "csv": RecordSyntax(),
    "csv-backslash": RecordSyntax(escape=b"\\"),
    "csv-single": RecordSyntax(quote=b"'", escape=b"'"),
    "text": RecordSyntax(format="text"),
}


class CountingFile(io.BytesIO):
    """A file object that counts the bytes read through it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.read_bytes = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.read_bytes += len(data)
        return data


def _field(draw: st.DrawFn, syntax: RecordSyntax) -> bytes:
    """A field: plain, or (csv) quoted with newlines, CRLF, doubled quotes or escapes inside."""
    alphabet = b"ab,;\t\r\n\\" + syntax.quote + syntax.escape
    raw = bytes(draw(st.lists(st.sampled_from(list(alphabet)), max_size=12)))
    if not syntax.is_csv:
        return raw.replace(b"\r", b"").replace(b"\n", b"").replace(b"\\", b"\\\\") or b"x"
    if draw(st.booleans()):
        plain = bytes(c for c in raw if c not in b"\r\n,\t;" + syntax.quote + syntax.escape)
        return plain
    q, e = syntax.quote, syntax.escape
    body = raw.replace(e, e + e) if e != q else raw
    body = body.replace(q, e + q)
    return q + body + q


@st.composite
def files(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(SYNTAXES)))
    syntax = SYNTAXES[name]
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    records = []
    for _ in range(draw(st.integers(1, 40))):
        fields = [_field(draw, syntax) for _ in range(draw(st.integers(1, 4)))]
        delimiter = b"," if syntax.is_csv else b"\t"
        records.append(delimiter.join(fields))
    data = newline.join(records) + (newline if draw(st.booleans()) else b"")
    return name, data


def _chain(path: Path, data: bytes, syntax: RecordSyntax, count: int, start: int) -> list[int]:
    """What prepare, the COPY tasks' end checks and finalize's repair make of a file: the
    record starts the pieces end up with."""
    with open(path, "rb") as f:
        found, _ = window.split_points(f, start, len(data), count, syntax)
    bounds = [start, *(b.offset for b in found), len(data)]
    pieces = [
        Piece(str(path), a, b, 1 if a == start else 0, speculative=True)
        for a, b in itertools.pairwise(bounds)
    ]
    # a COPY task marks its piece misaligned when its last record does not end at its end
    with open(path, "rb") as f:
        size = len(data)
        misaligned = [p for p in pieces if not window.ends_cleanly(f, size, p.start, p.end, syntax)]
        if misaligned:
            exact = window.exact_pieces(pieces, syntax, f, size)
            pieces = [exact[p] for p in pieces]
    return [p.start for p in pieces] + [len(data)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=files(), count=st.integers(2, 9), header=st.booleans())
def test_the_chain_gives_the_exact_splitters_record_starts(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, bytes], count: int, header: bool
) -> None:
    name, data = case
    syntax = SYNTAXES[name]
    path = tmp_path_factory.mktemp("r") / "f"
    path.write_bytes(data)
    start = 0
    if header:
        start = record_starts(path, [1], syntax)[0] if len(data) > 1 else 0
    if start >= len(data):
        return
    bounds = _chain(path, data, syntax, count, start)
    assert bounds == sorted(bounds)
    # every bound is a record start, as the exact splitter (the oracle) sees it
    for b in bounds:
        assert record_starts(path, [b], syntax) == [b], (b, bounds)


def test_prepare_reads_a_bounded_number_of_bytes_per_split_point() -> None:
    row = b'1,"a quoted\nfield, with a newline",plain text here\r\n'
    data = row * 200_000  # 10 MB
    f = CountingFile(data)
    found, nread = window.split_points(f, 0, len(data), 4, RecordSyntax())
    assert len(found) == 3
    assert f.read_bytes == nread <= 3 * (window.WINDOW + 1)
    # the guesses are right for such a file: each is a row start
    assert all(b.offset % len(row) == 0 and not b.exact for b in found)


def test_text_format_boundaries_are_exact() -> None:
    data = b"a\\\nb\tc\n" * 50_000
    f = CountingFile(data)
    found, _ = window.split_points(f, 0, len(data), 4, RecordSyntax("text"))
    assert [b.exact for b in found] == [True] * 3
    assert all(b.offset % 7 == 0 for b in found)
    assert f.read_bytes <= 3 * (window.WINDOW + 4097)


def test_a_wrong_guess_is_repaired_by_the_chain(tmp_path: Path) -> None:
    """A quoted field of many quote-free lines: the window cannot tell, the guess is a line
    inside it, the piece before it does not end cleanly, and the repair moves the bound."""
    data = b"1,x\n" + b'2,"' + b"y\n" * 100_000 + b'"\n3,z\n'
    f = CountingFile(data)
    found, nread = window.split_points(f, 0, len(data), 2, RecordSyntax())
    assert nread <= window.WINDOW + 1
    assert [b.offset for b in found] != [len(data) - 4]  # wrong: inside the quoted field
    path = tmp_path / "f.csv"
    path.write_bytes(data)
    assert _chain(path, data, RecordSyntax(), 2, 0) == [0, len(data) - 4, len(data)]


def test_plan_partitions_reads_no_whole_file(tmp_path: Path, monkeypatch) -> None:
    """Prepare's planning of a big file: the pieces are cut without a scan of the file."""
    row = b'7,"two\nlines",x\n'
    path = tmp_path / "big.csv"
    path.write_bytes(row * 100_000)
    calls: list[str] = []
    for module, name in ((boundaries, "record_starts"), (lines, "count_newlines")):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            if _name == "count_newlines" and args[1:3] == (0, 0):
                return _real(*args, **kwargs)  # no header: nothing to count
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    files = listing.list_sources(str(path))
    parts = cutting.plan_partitions(files, CopyOptions(), 4)
    assert calls == []
    pieces = sorted((p for part in parts for p in part.pieces), key=lambda p: p.start)
    assert len(pieces) == 4 and all(p.speculative for p in pieces)
    assert [p.first_line for p in pieces] == [1, 0, 0, 0]
    assert all(p.start % len(row) == 0 for p in pieces)
    assert isinstance(parts[0], Partition)
