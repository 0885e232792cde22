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
of a row, a column and a split key's value are the same for both readers."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from airflow_pg_bulk.db.mysql_connector import (
    connector_arguments,
    connector_extension,
    is_text,
    pymysql_text,
    row_decoder,
)
from airflow_pg_bulk.errors import LoadRefusedError, TransientLoadError
from airflow_pg_bulk.loading.database.connections import alchemy_connection, reason
from airflow_pg_bulk.loading.database.urls import held_url

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
    def batches(self, source_name: str, statement: Any) -> Iterator[Batches]:
        """The rows of ``statement`` (SQLAlchemy, sent as PyMySQL would) on ``source_name``."""
        import mysql.connector

        url = held_url(source_name)
        text = pymysql_text(url, statement, self._arguments["charset"])
        try:
            conn = mysql.connector.connect(use_pure=False, **self._arguments)
        except Exception as exc:
            raise TransientLoadError(
                f"source {source_name}: cannot connect to the database: {reason(exc, url)}; "
                "nothing was changed"
            ) from None
        try:
            cursor = conn.cursor(raw=True, buffered=False)
            cursor.execute(text)
            yield ConnectorBatches(cursor, self._encoding)
        finally:
            with contextlib.suppress(Exception):
                conn.close()


class ConnectorBatches(Batches):
    """A raw unbuffered cursor's rows in batches of :data:`YIELD_PER`, counted, each value
    decoded as PyMySQL decodes it (:func:`row_decoder`)."""

    def __init__(self, cursor: Any, encoding: str) -> None:
        self._cursor = cursor
        self._decoded = row_decoder([is_text(c[1], c[8]) for c in cursor.description], encoding)
        self.rows = 0

    def __iter__(self) -> Iterator[Sequence[Sequence[Any]]]:
        fetch = self._cursor.fetchmany
        batch = fetch(YIELD_PER)
        while batch:
            self.rows += len(batch)
            yield self._decoded(batch)
            batch = fetch(YIELD_PER)


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
