"""mysql-connector-python's C extension as a source driver (``airflow-pg-bulk[mysql]``): whether
it loads in this process, its arguments from a ``mysql+pymysql://`` URL, a SQLAlchemy statement
as the text PyMySQL would send, and its raw rows (the server's text as bytes) decoded into the
rows PyMySQL hands with its decoders off (:mod:`.source_driver`). Used by the rows path's
reader (:mod:`airflow_pg_bulk.loading.database.row_readers`); knows drivers, not plans.

Decoding, as PyMySQL's ``MySQLResult._get_descriptions`` does: a string type
(``pymysql.connections.TEXT_TYPES``: CHAR, VARCHAR, BLOB/TEXT, BIT...) of the binary charset
stays bytes (BLOB, BINARY, VARBINARY, BIT); every other column is text, decoded by the
connection's charset (PyMySQL decodes numbers and dates as ASCII: the server's text of them
is ASCII, which the connection's charset, an ASCII superset, decodes the same); JSON always
by the connection's charset.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from airflow_pg_bulk.db import mysql_cext
from airflow_pg_bulk.sql.copy_lines import Rendered

#: the connection charsets the C extension's reader takes (PyMySQL's default and latin1)
CHARSETS = frozenset({"utf8mb4", "latin1"})

#: MySQL's field types FLOAT and DOUBLE (``pymysql.constants.FIELD_TYPE``)
FLOAT, DOUBLE = 4, 5

#: MySQL's charset number of ``binary``: a string type in it is bytes (BLOB, BINARY, BIT);
#: numbers and dates carry it too, and are text
BINARY_CHARSET = 63


def is_text(field_type: int, charset_number: int) -> bool:
    """Whether PyMySQL hands a column of ``field_type`` and ``charset_number`` (a cursor
    description's second and ninth items) as text: every type but a string type
    (``pymysql.connections.TEXT_TYPES``: CHAR, VARCHAR, BLOB/TEXT, BIT...) of the binary
    charset; JSON always (``MySQLResult._get_descriptions``)."""
    from pymysql.connections import TEXT_TYPES

    return field_type not in TEXT_TYPES or charset_number != BINARY_CHARSET


def is_mariadb(server_info: str) -> bool:
    """Whether a server's version text (``10.11.19-MariaDB-0+deb12u1``) is MariaDB's."""
    return "mariadb" in server_info.lower()


def rendered(field_type: int, charset_number: int | None, mariadb: bool) -> Rendered | None:
    """How a column of ``field_type`` and ``charset_number`` (a cursor description's second
    and ninth items; None where the driver's description has no charset, PyMySQL's) becomes
    a COPY text field made by the server
    (:func:`airflow_pg_bulk.sql.copy_lines.alchemy_copy_lines`) with the text the rows path
    loads for it, or None for a type that keeps the rows path. Numbers, dates and times as
    they are; FLOAT and DOUBLE on MariaDB only (``mariadb``: the server's version says so),
    where their text in a string expression was measured to be the text protocol's (20,000
    random values each, MariaDB 10.11), which MySQL's was not checked to be; a string type
    as text, or in the binary charset as bytes (hex), either by the server's ``CHARSET()``
    of it where the charset is not known here; BIT (bytes of its number), GEOMETRY
    and MySQL's JSON type: None."""
    as_is, strings = _field_types()
    if field_type in (FLOAT, DOUBLE):
        return Rendered.AS_IS if mariadb else None
    if field_type in as_is:
        return Rendered.AS_IS
    if field_type not in strings:
        return None
    if charset_number is None:
        return Rendered.TEXT_OR_HEX
    return Rendered.HEX if charset_number == BINARY_CHARSET else Rendered.ESCAPED


@functools.cache
def _field_types() -> tuple[frozenset[int], frozenset[int]]:
    """The types whose server text is a COPY field as it is, and the string types (text, or
    bytes in the binary charset): :func:`rendered`."""
    from pymysql.constants import FIELD_TYPE as F

    as_is = frozenset({F.DECIMAL, F.NEWDECIMAL, F.TINY, F.SHORT, F.INT24, F.LONG, F.LONGLONG,
                       F.NULL, F.DATE, F.NEWDATE, F.TIME, F.DATETIME, F.TIMESTAMP,
                       F.YEAR})  # fmt: skip
    strings = frozenset({F.VARCHAR, F.VAR_STRING, F.STRING, F.ENUM, F.SET, F.TINY_BLOB,
                         F.MEDIUM_BLOB, F.BLOB, F.LONG_BLOB})  # fmt: skip
    return as_is, strings


def row_decoder(text: Sequence[bool], encoding: str) -> Callable[[list[Any]], list[Any]]:
    """A function of a batch of raw rows (bytes, None for NULL) to the same rows with the
    columns that are ``text`` decoded by ``encoding``, the others kept as bytes.

    Made for the columns at hand, as ``collections.namedtuple`` makes its class: one list
    comprehension that unpacks each row into names and decodes each text column in line
    (``c0 if c0 is None else c0.decode()``). For 1,000,000 rows of four columns it took 0.35 s
    of CPU, against 0.69 s column by column (``map(bytes.decode, ...)`` between two
    transpositions) and 1.05 s with a generator expression over each row's values."""
    arguments = "" if encoding == "utf-8" else "encoding"
    names = [f"c{i}" for i in range(len(text))]
    values = [
        f"{name} if {name} is None else {name}.decode({arguments})" if is_text else name
        for name, is_text in zip(names, text, strict=True)
    ]
    source = f"lambda rows: [({', '.join(values)},) for {', '.join(names)}, in rows]"
    return eval(source, {"encoding": encoding})  # its text is made here, of c0, c1...


def pymysql_text(url: str, statement: Any, charset: str) -> str:
    """``statement`` as SQLAlchemy's PyMySQL dialect sends it: compiled by the URL's dialect
    (``%s`` placeholders, in the order of ``positiontup``; a literal ``%`` doubled), the bound
    values escaped by PyMySQL (``escape_item``) and put in by ``%``, as PyMySQL's
    ``Cursor.mogrify`` does (which undoubles ``%%`` with no value too)."""
    import sqlalchemy
    from pymysql.converters import escape_item

    compiled = statement.compile(dialect=sqlalchemy.engine.make_url(url).get_dialect()())
    params = compiled.params
    if compiled.positiontup is None:  # a dialect of named placeholders
        return str(compiled) % {key: escape_item(v, charset) for key, v in params.items()}
    return str(compiled) % tuple(escape_item(params[key], charset) for key in compiled.positiontup)


def connector_extension() -> str | None:
    """Why mysql-connector-python's C extension cannot be used in this process, or None
    when it loads: its module ``_mysql_connector`` imports and the package's version is in
    the ``mysql`` extra's range (:func:`airflow_pg_bulk.db.mysql_cext.extension`, cached),
    checked without importing the ``mysql.connector`` package (0.1 s), which its rows
    path imports when it runs."""
    module = mysql_cext.extension()
    return module if isinstance(module, str) else None


def not_pymysql(url: str) -> str | None:
    """Why ``url`` (SQLAlchemy's) is not a MariaDB/MySQL source read by PyMySQL, or None
    when it is (the rows this package's readers match)."""
    import sqlalchemy

    parsed = sqlalchemy.engine.make_url(url)
    if parsed.get_backend_name() not in ("mysql", "mariadb"):
        return "the source is not MariaDB/MySQL"
    if parsed.get_driver_name() != "pymysql":
        return f"the URL's driver is {parsed.get_driver_name()}, not pymysql"
    return None


def connector_arguments(url: str) -> tuple[dict[str, Any], str] | str:
    """The connector's arguments and the Python encoding of the connection's charset for
    ``url``, or why the URL has a part they cannot carry."""
    import sqlalchemy

    why = not_pymysql(url)
    if why is not None:
        return why
    parsed = sqlalchemy.engine.make_url(url)
    query = dict(parsed.query)
    others = sorted(set(query) - {"unix_socket", "charset"})
    if others:
        return f"the URL's option {', '.join(others)} is PyMySQL's only"
    if not parsed.username:
        return "the URL names no user"
    socket = query.get("unix_socket")
    if socket is None and parsed.host in (None, "localhost"):
        return "a host of localhost without unix_socket is TCP to PyMySQL, a socket otherwise"
    charset = query.get("charset", "utf8mb4")
    if not isinstance(charset, str) or charset not in CHARSETS:
        return f"the charset {charset} is not one of {', '.join(sorted(CHARSETS))}"
    if not isinstance(socket, str | None):
        return "the URL names unix_socket twice"
    from pymysql.charset import charset_by_name

    arguments: dict[str, Any] = {
        "user": parsed.username,
        "password": parsed.password or "",
        "database": parsed.database,
        "charset": charset,
    }
    if socket is not None:
        arguments["unix_socket"] = socket
    else:
        arguments["host"] = parsed.host
        arguments["port"] = parsed.port or 3306
    return arguments, charset_by_name(charset).encoding
