"""Who reads the rows path's rows (:mod:`.rows_copy`) from the source: SQLAlchemy's server-side
cursor (any dialect; PyMySQL's ``SSCursor`` for MariaDB/MySQL), or, for a ``mysql+pymysql`` /
``mariadb+pymysql`` source, mysql-connector-python's C extension (an unbuffered raw cursor),
chosen once per source in this process (:func:`reader_for`) by capability:

- the URL's driver is PyMySQL (whose rows are the ones to match: other drivers hand other
  Python types, so they keep their SQLAlchemy path);
- ``mysql.connector``'s C extension loads in this process (mysql-connector-python 26.x's needs
  OpenSSL 3.2 and fails next to an older system OpenSSL that ``ssl``/psycopg loaded first;
  any release's fails after pyarrow was imported: "libstdc++.so.6: cannot allocate memory in
  static TLS block");
- every part of the URL maps onto the connector's arguments: host (not ``localhost`` without a
  ``unix_socket``: PyMySQL reaches it by TCP, libmysqlclient by its socket), port, user,
  password, database, and in the query only ``unix_socket`` and ``charset`` (utf8mb4, PyMySQL's
  default, or latin1); anything else keeps PyMySQL.

Why: PyMySQL is pure Python; fetching 1,000,000 rows of four columns took 7.1 s of CPU through
its ``SSCursor`` and 0.9 s through the C extension's raw cursor, 1.2 s with the values decoded
into exactly PyMySQL's rows (:mod:`airflow_pg_bulk.db.mysql_connector`: text as ``str``, a
binary column as ``bytes``), so the COPY writer, the row accounting and the errors' naming
of a row, a column and a split key's value are the same for both readers.

Either reader of a ``mysql+pymysql`` source also reads a range as COPY text lines the server
makes (:meth:`ConnectorReader.lines`, :meth:`AlchemyReader.lines`, tried first by
:mod:`.lines_copy`): one bytes value a row, no value decoded (:func:`line_fields`). The C
extension's reader reads those lines, and prepare's column names, through the extension's
module itself (:mod:`airflow_pg_bulk.db.mysql_cext`, which says why and how it is guarded),
without importing the ``mysql.connector`` package; its package's cursor where that fails."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from airflow_pg_bulk.db import mysql_cext
from airflow_pg_bulk.db.mysql_connector import (
    connector_arguments,
    connector_extension,
    is_mariadb,
    is_text,
    not_pymysql,
    pymysql_text,
    rendered,
    row_decoder,
)
from airflow_pg_bulk.errors import LoadRefusedError, TransientLoadError
from airflow_pg_bulk.loading.database.connections import alchemy_connection, reason
from airflow_pg_bulk.loading.database.urls import held_url
from airflow_pg_bulk.sql.copy_lines import Field, alchemy_copy_lines
from airflow_pg_bulk.sql.source import alchemy_no_rows_of

log = logging.getLogger(__name__)

#: rows fetched from the source's DB-API cursor at a time (one batch, one COPY chunk)
YIELD_PER = 10_000


class AlchemyReader:
    """Rows through SQLAlchemy's server-side cursor (``stream_results``), fetched from its
    DB-API cursor: today's path for every database but PostgreSQL."""

    name = "SQLAlchemy's server-side cursor"

    @classmethod
    def for_source(cls, source_name: str) -> AlchemyReader:
        """This reader, for any source."""
        return cls()

    @contextlib.contextmanager
    def batches(self, source_name: str, statement: Any) -> Iterator[Batches]:
        """The rows of ``statement`` (SQLAlchemy) on the source ``source_name``, in batches."""
        with alchemy_connection(source_name, copy=True) as src:
            yield AlchemyBatches(src.execution_options(stream_results=True).execute(statement))

    @contextlib.contextmanager
    def lines(self, source_name: str, rows: Any) -> Iterator[Lines | None]:
        """For a ``mysql+pymysql`` source, the rows of ``rows`` (a SQLAlchemy subquery) as
        COPY text lines the server makes, each column as :func:`line_fields` says from
        PyMySQL's description, which names no charset (a string: hex or text by the server's
        ``CHARSET()`` of it); None for another driver, or where :func:`line_fields` says
        none. One bytes value a row through PyMySQL's unbuffered cursor took 1.9-2.4 s of
        CPU per million rows of four columns, where its rows took 3.0 s and ``write_row``
        0.5 s more."""
        if not_pymysql(held_url(source_name)) is not None:
            yield None
            return
        with alchemy_connection(source_name, copy=True) as src:
            dialect = src.dialect
            charset = src.connection.dbapi_connection.charset
            no_rows = alchemy_no_rows_of(rows)
            result = src.execute(no_rows)
            description = result.cursor.description
            result.close()
            fields = line_fields(source_name, charset, description, None, dialect.is_mariadb)
            if fields is None:
                yield None
                return
            lines = src.execution_options(stream_results=True).execute(
                alchemy_copy_lines(rows, fields)
            )
            yield JoinedLines(first_values(AlchemyBatches(lines)))


class Batches:
    """A cursor's rows in batches of :data:`YIELD_PER`, counted as they go (:attr:`rows`)."""

    rows: int

    def __iter__(self) -> Iterator[Sequence[Sequence[Any]]]:  # pragma: no cover - protocol
        raise NotImplementedError


class AlchemyBatches(Batches):
    """A SQLAlchemy result's rows in batches of :data:`YIELD_PER`, counted as they go
    (:attr:`rows`), read from its DB-API cursor (``fetchmany``: the driver's own tuples), not
    through SQLAlchemy's ``Row`` objects: the statement is compiled, bound and executed by
    SQLAlchemy (the dialect's server-side cursor included), only the fetching bypasses it.
    1,000,000 SQLite rows of four columns took 0.76 s to fetch and 0.35 s more to become
    ``Row`` objects (benchmarks/RESULTS-db-source.md). The result's statements are ``text()``
    or ``SELECT *`` of no typed column, so SQLAlchemy had no value to convert.

    The first row is taken through SQLAlchemy: a server-side cursor's result buffers one row
    ahead when it is made (``BufferedRowCursorFetchStrategy``, "fetches only one row
    initially"); ``fetchmany(1)`` hands that row over, and leaves nothing buffered."""

    def __init__(self, result: Any) -> None:
        self._result = result
        self.rows = 0

    def __iter__(self) -> Iterator[Sequence[Sequence[Any]]]:
        first = self._result.fetchmany(1)
        if not first:
            return
        fetch = self._result.cursor.fetchmany
        batch = [tuple(first[0]), *fetch(YIELD_PER - 1)]
        while batch:
            self.rows += len(batch)
            yield batch
            batch = fetch(YIELD_PER)
        self._result.close()


class ConnectorReader:
    """Rows of a MariaDB/MySQL source through mysql-connector-python's C extension (an
    unbuffered raw cursor: the server's text as bytes), decoded into PyMySQL's rows."""

    name = "mysql-connector-python's C extension"

    def __init__(self, arguments: dict[str, Any], encoding: str) -> None:
        self._arguments = arguments
        self._encoding = encoding

    @classmethod
    def for_source(cls, source_name: str) -> ConnectorReader:
        """This reader for the source held as ``source_name``; refused (a
        :class:`~airflow_pg_bulk.errors.LoadRefusedError`) where its URL does not map."""
        mapped = connector_arguments(held_url(source_name))
        if isinstance(mapped, str):
            raise LoadRefusedError(f"source {source_name}: {cls.name} cannot read it: {mapped}")
        return cls(*mapped)

    @contextlib.contextmanager
    def _connection(self, source_name: str) -> Iterator[Any]:
        """A connection of its own to ``source_name``."""
        import mysql.connector

        try:
            conn = mysql.connector.connect(use_pure=False, **self._arguments)
        except Exception as exc:
            raise TransientLoadError(
                f"source {source_name}: cannot connect to the database: "
                f"{reason(exc, held_url(source_name))}; nothing was changed"
            ) from None
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def _run(self, source_name: str, cursor: Any, statement: Any) -> None:
        """``statement`` (SQLAlchemy) executed on ``cursor`` as PyMySQL would send it."""
        cursor.execute(pymysql_text(held_url(source_name), statement, self._arguments["charset"]))

    @contextlib.contextmanager
    def batches(self, source_name: str, statement: Any) -> Iterator[Batches]:
        """The rows of ``statement`` (SQLAlchemy, sent as PyMySQL would) on ``source_name``."""
        with self._connection(source_name) as conn:
            cursor = conn.cursor(raw=True, buffered=False)
            self._run(source_name, cursor, statement)
            yield ConnectorBatches(cursor, self._encoding)

    @contextlib.contextmanager
    def lines(self, source_name: str, rows: Any) -> Iterator[Lines | None]:
        """The rows of ``rows`` (a SQLAlchemy subquery:
        :func:`airflow_pg_bulk.sql.source.alchemy_range_rows`) on ``source_name`` as COPY
        text lines the server makes (:func:`airflow_pg_bulk.sql.copy_lines.alchemy_copy_lines`,
        each column as :func:`line_fields` says from the description of ``rows`` without
        rows); None where it says none. Read through the C extension's module directly
        (:mod:`airflow_pg_bulk.db.mysql_cext`: ``mysql.connector`` not imported, no Python
        code per row); where anything of that fails before the first line, said in an INFO
        line, through the package's raw cursor as before."""
        with contextlib.ExitStack() as stack:
            try:
                lines = stack.enter_context(self._direct_lines(source_name, rows))
            except Exception as exc:
                log.info("Source %s: COPY lines not read by %s's module directly (%s): read "
                         "through its package", source_name, self.name,
                         reason(exc, held_url(source_name)))  # fmt: skip
                lines = stack.enter_context(self._package_lines(source_name, rows))
            yield lines

    @contextlib.contextmanager
    def _direct_lines(self, source_name: str, rows: Any) -> Iterator[Lines | None]:
        """:meth:`lines` through ``_mysql_connector`` itself; its first chunk is read before
        it is handed, so what fails before the first line fails here."""
        module = mysql_cext.extension()
        if isinstance(module, str):
            raise LookupError(module)
        url, charset = held_url(source_name), self._arguments["charset"]
        with mysql_cext.connected(module, self._arguments) as conn:
            no_rows = alchemy_no_rows_of(rows)
            description = conn.description(pymysql_text(url, no_rows, charset))
            mariadb = is_mariadb(conn.server)
            fields = line_fields(source_name, charset, description, 8, mariadb)
            if fields is None:
                yield None
                return
            text = pymysql_text(url, alchemy_copy_lines(rows, fields), charset)
            batches = conn.first_values(text, YIELD_PER)
            first = next(batches, [])
            yield JoinedLines(itertools.chain([first] if first else [], batches))

    def column_names(self, source_name: str, statement: Any) -> tuple[str, ...] | None:
        """The names of the columns of ``statement`` (SQLAlchemy, a query without rows) on
        ``source_name``, read through the C extension's module directly (a connection of
        1.3 ms, where PyMySQL's took 22 ms, 20 of them making the TLS context of its
        PREFERRED mode); None where anything of that fails (the caller asks SQLAlchemy,
        whose error is the one said)."""
        module = mysql_cext.extension()
        if isinstance(module, str) or self._arguments["charset"] not in mysql_cext.SET_NAMES:
            return None
        url, charset = held_url(source_name), self._arguments["charset"]
        try:
            with mysql_cext.connected(module, self._arguments) as conn:
                description = conn.description(pymysql_text(url, statement, charset))
        except Exception:
            return None
        return tuple(str(d[0]) for d in description)

    @contextlib.contextmanager
    def _package_lines(self, source_name: str, rows: Any) -> Iterator[Lines | None]:
        """:meth:`lines` through the package's unbuffered raw cursor."""
        with self._connection(source_name) as conn:
            cursor = conn.cursor(raw=True, buffered=False)
            no_rows = alchemy_no_rows_of(rows)
            self._run(source_name, cursor, no_rows)
            cursor.fetchall()
            mariadb = is_mariadb(conn.server_info)
            fields = line_fields(
                source_name, self._arguments["charset"], cursor.description, 8, mariadb
            )
            if fields is None:
                yield None
                return
            self._run(source_name, cursor, alchemy_copy_lines(rows, fields))
            yield JoinedLines(first_values(RawBatches(cursor)))


class Lines:
    """A source's rows as COPY text chunks (each of whole lines, ``\\n``-ended), rows and
    bytes counted as they go (:attr:`rows`, :attr:`bytes`)."""

    rows: int
    bytes: int

    def __iter__(self) -> Iterator[bytes]:  # pragma: no cover - protocol
        raise NotImplementedError


class RawBatches(Batches):
    """A raw unbuffered cursor's rows (the server's bytes) in batches of :data:`YIELD_PER`,
    counted."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self.rows = 0

    def __iter__(self) -> Iterator[Sequence[Sequence[Any]]]:
        fetch = self._cursor.fetchmany
        batch = fetch(YIELD_PER)
        while batch:
            self.rows += len(batch)
            yield batch
            batch = fetch(YIELD_PER)


class ConnectorBatches(RawBatches):
    """:class:`RawBatches` with each value decoded as PyMySQL decodes it
    (:func:`row_decoder`)."""

    def __init__(self, cursor: Any, encoding: str) -> None:
        super().__init__(cursor)
        self._decoded = row_decoder([is_text(c[1], c[8]) for c in cursor.description], encoding)

    def __iter__(self) -> Iterator[Sequence[Sequence[Any]]]:
        return map(self._decoded, super().__iter__())


class JoinedLines(Lines):
    """Lists of COPY text lines (one a row), each list joined into one chunk; a NULL line (a
    value the server could not make: :mod:`airflow_pg_bulk.sql.copy_lines`) fails it."""

    def __init__(self, values: Iterable[list[Any]]) -> None:
        self._values = values
        self.rows = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[bytes]:
        for lines in self._values:
            if None in lines:
                raise ValueError(
                    f"the server made no COPY line of row {self.rows + 1 + lines.index(None)}"
                    " (a value longer than max_allowed_packet?)"
                )
            chunk = b"\n".join(lines) + b"\n"
            self.rows += len(lines)
            self.bytes += len(chunk)
            yield chunk


def first_values(batches: Batches) -> Iterator[list[Any]]:
    """Each batch of one-value rows as the list of its values."""
    first = operator.itemgetter(0)
    for batch in batches:
        yield list(map(first, batch))


def line_fields(
    source_name: str,
    charset: str,
    description: Sequence[Sequence[Any]],
    charset_item: int | None,
    mariadb: bool,
) -> list[Field] | None:
    """The COPY text fields of the columns a cursor ``description`` names (a DB-API
    description; ``charset_item``: which item of it is the column's charset number, None
    where it has none), each rendered by its type
    (:func:`~airflow_pg_bulk.db.mysql_connector.rendered`); None (said in an INFO line)
    where a column's type has no such text, or the connection's ``charset`` is not utf8mb4
    (the text protocol's conversion to another charset is what the rows path loads)."""
    if charset != "utf8mb4":
        log.info("Source %s: COPY lines not made by the server: its charset is %s, not "
                 "utf8mb4", source_name, charset)  # fmt: skip
        return None
    described = [
        (d[0], rendered(d[1], None if charset_item is None else d[charset_item], mariadb), d[6])
        for d in description
    ]
    others = [name for name, how, _ in described if how is None]
    if others:
        log.info("Source %s: COPY lines not made by the server: no text of the type of %s",
                 source_name, ", ".join(others))  # fmt: skip
        return None
    return [Field(name, how, bool(null)) for name, how, null in described if how is not None]


def column_names(source_name: str, statement: Any) -> tuple[str, ...] | None:
    """The names of the columns of ``statement`` (SQLAlchemy, a query without rows) on the
    source held as ``source_name``, where its reader (:func:`reader_for`) is the C
    extension's and reads them (:meth:`ConnectorReader.column_names`); else None. No reader
    is chosen (nor its INFO line said) for a URL the C extension cannot read."""
    if forced is None and isinstance(connector_arguments(held_url(source_name)), str):
        return None
    reader = reader_for(source_name)
    if not isinstance(reader, ConnectorReader):
        return None
    return reader.column_names(source_name, statement)


#: the reader every source of the rows path gets in this process when set (the tests, and a
#: benchmark comparing the two): :class:`AlchemyReader` or :class:`ConnectorReader` (the
#: class); None (the default): chosen by capability (:func:`chosen`)
forced: type[AlchemyReader] | type[ConnectorReader] | None = None


def reader_for(source_name: str) -> AlchemyReader | ConnectorReader:
    """The reader of the rows path for the source held as ``source_name``: :data:`forced`'s
    if set, else the one :func:`chosen` for it."""
    return forced.for_source(source_name) if forced is not None else chosen(source_name)


@functools.cache
def chosen(source_name: str) -> AlchemyReader | ConnectorReader:
    """The reader chosen once in this process for ``source_name``, said in one INFO line."""
    url = held_url(source_name)
    mapped = connector_arguments(url)
    why = mapped if isinstance(mapped, str) else connector_extension()
    if why is None:
        assert not isinstance(mapped, str)
        log.info(
            "Source %s: rows read by %s (the URL maps onto it, and it loads)",
            source_name,
            ConnectorReader.name,
        )
        return ConnectorReader(*mapped)
    log.info("Source %s: rows read by %s: %s", source_name, AlchemyReader.name, why)
    return AlchemyReader()
