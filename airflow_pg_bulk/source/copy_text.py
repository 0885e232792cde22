"""Rows as PostgreSQL's COPY text format: what a database source that is not PostgreSQL sends
to ``COPY ... FROM STDIN`` (:mod:`airflow_pg_bulk.loading.database`).

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
from typing import Any

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


def of_batches(batches: Iterable[Sequence[Sequence[Any]]]) -> Iterator[bytes]:
    """Batches of rows as COPY text, one chunk per batch (what a psycopg2 target is sent:
    :func:`airflow_pg_bulk.db.driver.copy_rows`), each encoded column by column
    (:func:`batch`)."""
    for rows in batches:
        if rows:
            yield batch(rows).encode()


_SPECIAL = ("\\", "\t", "\n", "\r")


def _strings(values: Sequence[Any], nulls: bool) -> list[str] | Sequence[str]:
    """A column of strings (and NULLs) as fields: escaped only when one of them holds a
    backslash, tab, newline or carriage return (one search of them all joined, in C)."""
    joined = "".join(filter(None, values)) if nulls else "".join(values)
    escape = any(char in joined for char in _SPECIAL)
    if not nulls:
        return [v.translate(_ESCAPES) for v in values] if escape else values
    if escape:
        return ["\\N" if v is None else v.translate(_ESCAPES) for v in values]
    return ["\\N" if v is None else v for v in values]


#: the encoder of a column whose values (NULLs aside) all have one of these exact types,
#: mapped over the column in C; a column of any other type, or of mixed types, goes value by
#: value through :func:`field`. Each gives the text :func:`field` gives.
_COLUMN: dict[type, Callable[[Any], str]] = {
    int: int.__repr__,
    float: float.__repr__,
    decimal.Decimal: str,
    datetime.date: datetime.date.isoformat,
    datetime.datetime: datetime.datetime.isoformat,
}


def _column(values: Sequence[Any]) -> list[str] | Sequence[str]:
    """One column of a batch as COPY text fields."""
    types = set(map(type, values))
    nulls = type(None) in types
    types.discard(type(None))
    if len(types) == 1:
        (kind,) = types
        if kind is str:
            return _strings(values, nulls)
        encode = _COLUMN.get(kind)
        if encode is not None:
            if nulls:
                return ["\\N" if v is None else encode(v) for v in values]
            return list(map(encode, values))
    return list(map(field, values))


def batch(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as COPY text lines, each with its newline: the same text as :func:`row` of each,
    made column by column (a column of one type is encoded by one C call mapped over it, not
    a Python call per value: 0.7 against 1.2 µs per row of four columns,
    benchmarks/RESULTS-db-source.md)."""
    columns = [_column(values) for values in zip(*rows, strict=True)]
    return "\n".join(map("\t".join, zip(*columns, strict=True))) + "\n"


def row(values: Sequence[Any]) -> str:
    """One row as a COPY text line, its newline included."""
    return "\t".join(map(field, values)) + "\n"
