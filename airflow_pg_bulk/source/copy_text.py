"""Rows as PostgreSQL's COPY text format: what a database source that is not PostgreSQL sends
to ``COPY ... FROM STDIN`` (:mod:`airflow_pg_bulk.loading.db_source`).

Each value becomes the text PostgreSQL's input function reads for it; a NULL is ``\\N``; a
backslash, tab, newline and carriage return inside a value are escaped (``\\\\``, ``\\t``,
``\\n``, ``\\r``), so no value can end a field, a row or the data. Bytes become ``bytea``'s
hex form; a dict or list, JSON. Nothing here reads a database.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

#: bytes per chunk handed to COPY: big enough that the per-chunk cost vanishes
CHUNK_BYTES = 1 << 20

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _text(value: str) -> str:
    return value.translate(_ESCAPES)


def _bool(value: bool) -> str:
    return "t" if value else "f"


def _null(value: None) -> str:
    return "\\N"


#: the encoder of each common type, looked up by the value's exact type before the chain of
#: ``isinstance`` tests in :func:`field` (one dict lookup for nearly every value)
_BY_TYPE: dict[type, Callable[[Any], str]] = {
    str: _text,
    int: str,
    float: repr,
    bool: _bool,
    type(None): _null,
    decimal.Decimal: str,
    datetime.date: datetime.date.isoformat,
    datetime.datetime: datetime.datetime.isoformat,
}


def field(value: Any) -> str:
    """One value as a COPY text field."""
    encode = _BY_TYPE.get(type(value))
    if encode is not None:
        return encode(value)
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return value.translate(_ESCAPES)
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, (int, decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # inf, -inf and nan are read by float8in as they are
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\\\x" + bytes(value).hex()  # bytea hex, its backslash escaped
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return f"{value.days} days {value.seconds} seconds {value.microseconds} microseconds"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False).translate(_ESCAPES)
    return str(value).translate(_ESCAPES)


def of_batches(batches: Iterable[Iterable[Sequence[Any]]]) -> Iterator[bytes]:
    """Batches of rows as COPY text, in chunks of about :data:`CHUNK_BYTES` (what a psycopg2
    target is sent: :func:`airflow_pg_bulk.db.driver.copy_rows`)."""
    return iter(TextRows(chain.from_iterable(batches)))


def row(values: Sequence[Any]) -> str:
    """One row as a COPY text line, its newline included."""
    return "\t".join(map(field, values)) + "\n"


class TextRows:
    """Rows encoded as COPY text, in chunks of about :data:`CHUNK_BYTES`, counted as they go
    (:attr:`rows` once iterated: the rows read from the source, for the row accounting)."""

    def __init__(self, rows: Iterable[Sequence[Any]], chunk_bytes: int = CHUNK_BYTES) -> None:
        self._rows = rows
        self._chunk_bytes = chunk_bytes
        self.rows = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[bytes]:
        lines: list[str] = []
        size = 0
        for values in self._rows:
            line = row(values)
            lines.append(line)
            size += len(line)
            self.rows += 1
            if size >= self._chunk_bytes:
                yield self._chunk(lines)
                lines, size = [], 0
        if lines:
            yield self._chunk(lines)

    def _chunk(self, lines: list[str]) -> bytes:
        data = "".join(lines).encode()
        self.bytes += len(data)
        return data
