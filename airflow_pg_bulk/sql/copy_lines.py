"""A MariaDB/MySQL source's rows as PostgreSQL's COPY text lines, made by the source server:
one binary value a row (its fields joined by tabs), what ``COPY ... FROM STDIN`` in text
format reads, so the client moves bytes and builds no Python value per column
(:mod:`airflow_pg_bulk.loading.database.lines_copy`).

Each field is the text the server's text protocol sends for the value (the rows path's
value, :mod:`airflow_pg_bulk.db.source_driver`), rendered as :class:`Rendered` says; a NULL
is ``\\N``. The statement is composed with SQLAlchemy's expression language (compiled by the
source's dialect); its only literals are ``CHAR(n)`` code points and the word ``binary``,
so none depends on the server's ``NO_BACKSLASH_ESCAPES``. ``CHAR(n)`` is a binary string: every
piece joined with it is taken as its bytes (text first converted to utf8mb4, whose
multi-byte sequences hold no ASCII byte, so replacing single ASCII bytes in them is safe),
and the line is binary, sent as it is whatever the connection's charset.

A value the server cannot make (a line longer than ``max_allowed_packet``: ``REPLACE`` and
``CONCAT`` give NULL, with a warning) makes the whole line NULL (``CONCAT`` of a NULL), never
a short or ``\\N`` field: the reader refuses a NULL line."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: the code points of the characters COPY's text format escapes, and their escapes
_BACKSLASH, _TAB, _NEWLINE, _CR = 92, 9, 10, 13
_ESCAPES = ((_BACKSLASH, (92, 92)), (_TAB, (92, 116)), (_NEWLINE, (92, 110)), (_CR, (92, 114)))
#: ``CHARSET()`` of a binary string
_BINARY = "binary"


class Rendered(enum.Enum):
    """How a column's value becomes a COPY text field."""

    #: numbers, dates and times: the server's text, which holds no character COPY escapes
    AS_IS = "as is"
    #: text: converted to utf8mb4 (what a utf8mb4 connection receives), backslash, tab,
    #: newline and carriage return escaped as COPY's text format reads them
    ESCAPED = "escaped"
    #: bytes: ``bytea``'s hex form (``\\x`` and lowercase hex digits, as psycopg writes a
    #: ``bytes`` value), its backslash escaped
    HEX = "hex"
    #: a string whose charset the driver does not say (PyMySQL's description): as
    #: :attr:`HEX` where the server's ``CHARSET()`` of it is ``binary``, else :attr:`ESCAPED`
    TEXT_OR_HEX = "text or hex"


@dataclass(frozen=True)
class Field:
    """A column of the source's rows as a COPY text field.

    :param name: its name in the source's rows.
    :param rendered: how its value becomes text.
    :param nullable: whether it may hold NULL (a NOT NULL column's field has no test for
        it: a NULL there after all makes the line NULL, which the reader refuses)."""

    name: str
    rendered: Rendered
    nullable: bool = True


def _text(field: Field) -> Any:
    """A column's COPY text field (``\\N`` for NULL where it may be NULL)."""
    import sqlalchemy
    from sqlalchemy.dialects import mysql

    func = sqlalchemy.func
    column = sqlalchemy.column(field.name)
    null = func.char(_BACKSLASH, 78)
    if field.rendered is Rendered.AS_IS:  # (short values: never NULL for their length)
        return func.coalesce(column, null) if field.nullable else column
    hexed = func.concat(func.char(92, 92, 120), func.lower(func.hex(column)))
    escaped = sqlalchemy.cast(column, mysql.CHAR(charset="utf8mb4"))
    for code, escape in _ESCAPES:
        escaped = func.replace(escaped, func.char(code), func.char(*escape))
    if field.rendered is Rendered.HEX:
        value = hexed
    elif field.rendered is Rendered.ESCAPED:
        value = escaped
    else:
        value = sqlalchemy.case((func.charset(column) == _BINARY, hexed), else_=escaped)
    # (not COALESCE: a value too long for max_allowed_packet is NULL, and must stay so)
    return sqlalchemy.case((column.is_(None), null), else_=value) if field.nullable else value


def alchemy_copy_lines(rows: Any, fields: Sequence[Field]) -> Any:
    """``SELECT CAST(CONCAT(field, CHAR(9), field, ...) AS BINARY)`` over ``rows`` (a
    subquery: :func:`airflow_pg_bulk.sql.source.alchemy_range_rows`): each row of it as one
    COPY text line (without its newline), of the ``fields`` in their order."""
    import sqlalchemy

    func = sqlalchemy.func
    texts: list[Any] = []
    for field in fields:
        if texts:
            texts.append(func.char(_TAB))
        texts.append(_text(field))
    line = func.concat(*texts)
    return sqlalchemy.select(sqlalchemy.cast(line, sqlalchemy.LargeBinary)).select_from(rows)
