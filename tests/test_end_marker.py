"""The guard against a line holding only ``\\.`` (COPY FROM STDIN's end-of-data marker)."""

from __future__ import annotations

import random

import pytest

from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.plan import Piece
from airflow_pg_bulk.sources import guard_end_marker

PARTS = [b"a", b"\\", b".", b"\\.", b"x\\.", b"\\.y", b"", b"ab\\"]


def first_marker_line(data: bytes) -> int | None:
    """The obviously right answer: the first line that is exactly ``\\.``."""
    for number, line in enumerate(data.split(b"\n"), 1):
        if line == b"\\.":
            return number
    return None


@pytest.mark.parametrize("seed", range(40))
def test_guard_finds_the_first_marker_line_across_any_chunking(tmp_path, seed):
    rnd = random.Random(seed)
    for trial in range(60):
        data = b"\n".join(rnd.choice(PARTS) for _ in range(rnd.randint(1, 12)))
        data += rnd.choice([b"", b"\n"])
        path = tmp_path / f"f{trial}"
        path.write_bytes(data)
        size = rnd.randint(1, 5)
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        expected = first_marker_line(data)
        for piece in (Piece(str(path), 0, len(data), 1), Piece(str(path), 0, None, 1, "gzip")):
            try:
                passed = b"".join(guard_end_marker(chunks, piece, "t"))
            except BadDataError as exc:
                assert exc.line == expected, (data, size)
            else:
                assert expected is None, (data, size)
                assert passed == data
