"""The one place that knows psycopg 3 from psycopg2.

Statements are composed with ``psycopg.sql`` (see :mod:`airflow_pg_bulk.sql`). For a psycopg 3
connection they run as they are; for a psycopg2 connection they are rebuilt, piece by piece,
with ``psycopg2.sql`` so that psycopg2 quotes them itself. COPY differs too: ``cursor.copy()``
against ``copy_expert`` with a file-like reader.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

import psycopg
from psycopg import sql as pg3sql
from psycopg.adapt import Dumper

from airflow_pg_bulk.errors import (
    DUPLICATE_PREPARED_STATEMENT,
    INVALID_SQL_STATEMENT_NAME,
    QUERY_CANCELED,
    LoadRefusedError,
    TransientLoadError,
)
from airflow_pg_bulk.sql.catalog import rows_of_each as one_query_for_each
from airflow_pg_bulk.sql.ledger import release, rollback_to, savepoint
from airflow_pg_bulk.sql.session import execute_named, prepare_named

log = logging.getLogger(__name__)

COPY_BUFFER = 1 << 20  # bytes handed to the driver per write; see docs/tuning.md
CANCEL_TIMEOUT = 5.0  # seconds a cancel request may take to reach the server


class DatabaseConnection(Protocol):
    """What the steps need of a DB-API connection (both drivers provide it)."""

    def cursor(self) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


class _StrDumper(Dumper):
    """A value psycopg 3 has no dumper for, as its ``str()`` (COPY text; :func:`copy_rows`)."""

    def dump(self, obj: Any) -> bytes:
        return str(obj).encode()


@dataclass(frozen=True)
class ServerError:
    """The parts of a server error that the load reports, driver-independent."""

    sqlstate: str | None
    message: str
    detail: str | None
    context: str | None
    constraint: str | None


def is_psycopg2(conn: Any) -> bool:
    """True for a psycopg2 connection, False for psycopg 3."""
    return type(conn).__module__.split(".")[0] == "psycopg2"


def _to_psycopg2(obj: pg3sql.Composable) -> Any:
    from psycopg2 import sql as pg2sql

    if isinstance(obj, pg3sql.Composed):
        return pg2sql.Composed([_to_psycopg2(part) for part in obj._obj])
    if isinstance(obj, pg3sql.SQL):
        return pg2sql.SQL(obj._obj)
    if isinstance(obj, pg3sql.Identifier):
        return pg2sql.Identifier(*obj._obj)
    if isinstance(obj, pg3sql.Literal):
        return pg2sql.Literal(obj._obj)
    raise TypeError(f"cannot translate {type(obj).__name__} to psycopg2")


def native(conn: Any, statement: pg3sql.Composable) -> Any:
    """The statement as the connection's own driver composes it."""
    return _to_psycopg2(statement) if is_psycopg2(conn) else statement


def plain_cursor(conn: Any) -> Any:
    """A cursor returning tuples, whatever cursor the connection's extras asked for.

    Refused (:class:`TransientLoadError`) on a connection whose task was killed
    (:func:`stop`): no statement of a killed step starts after the cancel."""
    if conn in _stopped:
        raise TransientLoadError(
            "the task was killed: its running statement was cancelled and no other starts",
            sqlstate=QUERY_CANCELED,
        )
    if is_psycopg2(conn):
        import psycopg2.extensions

        return conn.cursor(cursor_factory=psycopg2.extensions.cursor)
    from psycopg.rows import tuple_row

    return conn.cursor(row_factory=tuple_row)


def execute(conn: Any, statement: pg3sql.Composable) -> list[tuple[Any, ...]]:
    """Run one statement in the current transaction; return its rows (empty if none)."""
    with plain_cursor(conn) as cur:
        cur.execute(native(conn, statement))
        if cur.description is None:
            return []
        return [tuple(row) for row in cur.fetchall()]


def execute_count(
    conn: Any, statement: pg3sql.Composable, *, after: Sequence[pg3sql.Composable] = ()
) -> int:
    """Run one statement; return the number of rows it affected.

    :param after: statements that it follows, in the same round trip on psycopg 3 (one
        query string; on psycopg2, one round trip each); their results are not read."""
    psycopg2 = is_psycopg2(conn)
    if psycopg2:
        for earlier in after:
            execute(conn, earlier)
    else:
        statement = pg3sql.SQL("; ").join([*after, statement])
    with plain_cursor(conn) as cur:
        cur.execute(native(conn, statement))
        while not psycopg2 and cur.nextset():  # (the last result is the statement's)
            pass
        return int(cur.rowcount)


def execute_each(conn: Any, statements: Sequence[pg3sql.Composable]) -> list[list[tuple[Any, ...]]]:
    """Run ``statements`` one after another in the current transaction; return each one's rows
    (empty for a statement that returns none). On psycopg 3, all of them in one round trip
    (one query string, each result read in turn); on psycopg2, which keeps only the last
    result of such a string, one round trip each. The first that fails raises, and the rest
    do not run. (Reads that are all SELECTs go in one round trip on both drivers as one
    statement: :func:`rows_of_each`; this is for the others:
    settings, EXPLAIN, INSERT.)"""
    if is_psycopg2(conn) or len(statements) < 2:
        return [execute(conn, statement) for statement in statements]
    results = []
    with plain_cursor(conn) as cur:
        cur.execute(pg3sql.SQL("; ").join(statements))
        while True:
            rows = cur.fetchall() if cur.description is not None else []
            results.append([tuple(row) for row in rows])
            if not cur.nextset():
                break
    if len(results) != len(statements):  # (a statement that is several, or none)
        raise ValueError(f"{len(statements)} statements gave {len(results)} results")
    return results


def rows_of_each(conn: Any, queries: list[pg3sql.Composable]) -> list[list[tuple]]:
    """The rows of each of ``queries`` (reads: SELECTs), in one round trip on either driver:
    run as one statement (:func:`airflow_pg_bulk.sql.rows_of_each`), each row a tuple of its
    columns as JSON gives them (text, numbers, booleans, arrays as lists, NULL as None), as
    the driver gives the catalog's columns."""
    return json_rows(scalar(conn, one_query_for_each(queries)))


def read_prepared(
    conn: Any,
    name: str,
    statement: pg3sql.Composable,
    *,
    before: Sequence[pg3sql.Composable] = (),
) -> list[list[tuple[Any, ...]]]:
    """Run ``statement`` (a read without parameters) in the current transaction as the
    session's prepared statement ``name`` (SQL ``PREPARE`` the first time this connection
    runs it, ``EXECUTE`` then): planned once per session, for a statement the session runs
    again whose planning costs more than its execution (a partition's catalog capture:
    :func:`airflow_pg_bulk.target.catalog.capture_leaves`). ``name`` must stand for one
    statement text (a hash of it, say). Returns the rows of each of ``before`` (statements
    to run first, in the same round trip on psycopg 3; run again should the first try fail
    as below) and of ``statement``, last.

    Under a savepoint: a session that lost the statement (a ``DISCARD ALL`` or ``DEALLOCATE
    ALL``, a pooler that hands out another server session) fails the ``EXECUTE``, and one
    that has it when this connection did not know it fails the ``PREPARE``; either is
    rolled back to the savepoint and the other way tried. (psycopg 3's own prepared
    statements do not serve: it deallocates them all after any ALTER, DROP or ROLLBACK, of
    which finalize runs many.)"""
    known = _PREPARED.setdefault(conn, set())
    run = [
        savepoint(_PREPARED_SAVEPOINT),
        *before,
        execute_named(name),
        release(_PREPARED_SAVEPOINT),
    ]
    make = [*run[: 1 + len(before)], prepare_named(name, statement), *run[1 + len(before) :]]
    first, other = (run, make) if name in known else (make, run)
    try:
        results = execute_each(conn, first)
    except Exception as exc:
        if not (
            is_database_error(exc)
            and server_error(exc).sqlstate
            in (INVALID_SQL_STATEMENT_NAME, DUPLICATE_PREPARED_STATEMENT)
        ):
            raise
        execute(conn, rollback_to(_PREPARED_SAVEPOINT))
        results = execute_each(conn, other)
    known.add(name)
    return [*results[1 : 1 + len(before)], results[-2]]


#: the names of the statements each connection prepared (:func:`read_prepared`), held by the
#: connection itself (weakly: an entry goes with its connection)
_PREPARED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_PREPARED_SAVEPOINT = "pgbulk_prepared"


def json_rows(text: str) -> list[list[tuple]]:
    """The rows of each query, from the one value of
    :func:`airflow_pg_bulk.sql.rows_of_each` (as :func:`rows_of_each` returns them)."""
    return json.loads(text, object_pairs_hook=lambda pairs: tuple(v for _k, v in pairs))


def execute_then_commit(conn: Any, statement: pg3sql.Composable) -> list[tuple[Any, ...]]:
    """Run ``statement``, the last of its transaction, and commit. On psycopg 3, ``COMMIT``
    goes in the same query string as the statement (one round trip where two were); the
    driver then sees the transaction ended, and its own commit has nothing to send. A
    failure raises as :func:`execute` does and leaves the transaction failed (the COMMIT is
    not reached), for the caller to roll back. Only for a statement that cannot wait long (a
    lock it may queue for, heavy work): should the client die while it runs, the server
    still commits when it ends, where a COMMIT of its own would never have come. (Pipeline
    mode, which would also carry the ``BEGIN``, cost more client time than the round trip it
    saved: 0.44 against 0.31 ms for a one-statement transaction, measured on loopback.)"""
    if is_psycopg2(conn) or conn.autocommit:
        rows = execute(conn, statement)
        conn.commit()
        return rows
    with plain_cursor(conn) as cur:  # psycopg 3: the first statement's rows
        cur.execute(pg3sql.SQL("{}; COMMIT").format(statement))
        rows = [tuple(row) for row in cur.fetchall()] if cur.description is not None else []
    conn.commit()  # (nothing to send: the server ended the transaction)
    return rows


def execute_outside_transaction(conn: Any, statement: pg3sql.Composable) -> list[tuple[Any, ...]]:
    """Run ``statement`` on its own, in autocommit, and return its rows: one round trip
    where ``BEGIN``, the statement and ``COMMIT`` take three. For a statement whose effect
    outlives transactions (a session setting, a session's advisory lock) or a read that
    needs no transaction. On a connection inside a transaction, it runs and commits there."""
    return _outside_transaction(conn, lambda: execute(conn, statement))


def execute_each_outside_transaction(
    conn: Any, statements: Sequence[pg3sql.Composable]
) -> list[list[tuple[Any, ...]]]:
    """:func:`execute_each` in autocommit, as :func:`execute_outside_transaction` runs one
    statement: each one's rows, in one round trip on psycopg 3 (where the server runs such
    a string as one implicit transaction: the first that fails undoes the others and stops
    them), one each on psycopg2."""
    return _outside_transaction(conn, lambda: execute_each(conn, statements))


def read_each(conn: Any, statements: Sequence[pg3sql.Composable]) -> list[list[tuple[Any, ...]]]:
    """Reads (SELECTs that change nothing): each one's rows, as :func:`execute_each` gives
    them. With no transaction open, in autocommit: one round trip on psycopg 3, where a
    transaction of their own takes three (BEGIN, the reads, COMMIT); with one open, in it,
    and it stays open."""
    if _idle(conn) and not conn.autocommit:
        return execute_each_outside_transaction(conn, statements)
    return execute_each(conn, statements)


def _outside_transaction(conn: Any, run: Callable[[], Any]) -> Any:
    if not _idle(conn) or conn.autocommit:
        rows = run()
        conn.commit()
        return rows
    conn.autocommit = True
    try:
        return run()
    finally:
        conn.autocommit = False


def _idle(conn: Any) -> bool:
    """True when the connection is in no transaction (libpq's IDLE transaction status)."""
    if is_psycopg2(conn):
        import psycopg2.extensions

        return conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    from psycopg.pq import TransactionStatus

    return conn.pgconn.transaction_status == TransactionStatus.IDLE


def scalar(conn: Any, statement: pg3sql.Composable) -> Any:
    """The first column of the first row, or None."""
    rows = execute(conn, statement)
    return rows[0][0] if rows else None


class _ChunkReader:
    """A file-like ``read(size)`` over an iterator of byte chunks (for psycopg2)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._pending = b""
        self.error: BaseException | None = None

    def read(self, size: int = -1) -> bytes:
        try:
            return self._read(size)
        except BaseException as exc:  # psycopg2 would only keep its text
            self.error = exc
            raise

    def _read(self, size: int) -> bytes:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._pending = chunk
        if size < 0 or size >= len(self._pending):
            out, self._pending = self._pending, b""
        else:
            out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def readline(self, size: int = -1) -> bytes:  # psycopg2 may probe for it
        return self.read(size)


def copy_in(conn: Any, statement: pg3sql.Composable, chunks: Iterable[bytes]) -> int:
    """Stream ``chunks`` into ``COPY ... FROM STDIN``; return the number of rows loaded.

    A Python exception raised by ``chunks`` aborts the COPY on the server with that message."""
    with plain_cursor(conn) as cur:
        if is_psycopg2(conn):
            reader = _ChunkReader(chunks)
            try:
                cur.copy_expert(native(conn, statement), reader, size=COPY_BUFFER)
            except Exception:
                if reader.error is not None:
                    raise reader.error from None
                raise
        else:
            with cur.copy(statement) as copy:
                for chunk in chunks:
                    copy.write(chunk)
        return int(cur.rowcount)


def copy_to(conn: Any, statement: pg3sql.Composable, file: Any) -> int:
    """Run ``COPY ... TO STDOUT`` on ``conn``, writing its bytes to ``file`` (``write(bytes)``);
    return the number of rows the server sent.

    psycopg2's ``copy_expert`` runs the per-row loop in C (libpq hands COPY data over one row
    per call); psycopg 3 has no C loop for COPY out, so its rows pass through Python."""
    with plain_cursor(conn) as cur:
        if is_psycopg2(conn):
            cur.copy_expert(native(conn, statement), file, size=COPY_BUFFER)
        else:
            with cur.copy(statement) as copy:
                for block in copy:
                    file.write(block)
        return int(cur.rowcount)


def copy_rows(
    conn: Any,
    statement: pg3sql.Composable,
    batches: Iterable[Sequence[Sequence[Any]]],
    encode: Callable[[Iterable[Sequence[Sequence[Any]]]], Iterable[bytes]],
) -> tuple[int, int]:
    """COPY rows of Python values (given in batches) into ``COPY ... FROM STDIN`` in text
    format; return the rows loaded and the bytes sent.

    psycopg 3 encodes each row in C (``Copy.write_row``), a dict or list as JSON and a value
    of a type it has no dumper for as its ``str()``; psycopg2, which has no row writer, sends
    the chunks ``encode(batches)`` makes. A Python exception raised by ``batches`` aborts the
    COPY on the server with that message."""
    sent = 0
    if is_psycopg2(conn):

        def counted() -> Iterator[bytes]:
            nonlocal sent
            for chunk in encode(batches):
                sent += len(chunk)
                yield chunk

        return copy_in(conn, statement, counted()), sent
    from psycopg.copy import LibpqWriter
    from psycopg.types.json import JsonDumper

    class CountingWriter(LibpqWriter):
        def write(self, data: Any) -> None:
            nonlocal sent
            sent += len(data)
            super().write(data)

    with plain_cursor(conn) as cur:
        cur.adapters.register_dumper(dict, JsonDumper)
        cur.adapters.register_dumper(list, JsonDumper)
        cur.adapters.register_dumper(object, _StrDumper)
        done = 0
        with cur.copy(statement, writer=CountingWriter(cur)) as copy:
            write_row = copy.write_row
            for batch in batches:
                try:
                    for row in batch:
                        write_row(row)
                except (psycopg.DataError, psycopg.ProgrammingError) as exc:
                    raise _not_written(cur, batch, row, done, exc) from exc
                done += len(batch)
        return int(cur.rowcount), sent


class RowNotEncoded(Exception):
    """A value psycopg 3 could not encode for COPY (a string holding NUL); the COPY was
    aborted.

    :param row: the row's 1-based number in the COPY stream.
    :param column: the value's 0-based position in the row, when found.
    :param value: the value."""

    def __init__(self, message: str, row: int, column: int | None, value: Any) -> None:
        super().__init__(message)
        self.row = row
        self.column = column
        self.value = value


def _not_written(
    cur: Any, batch: Sequence[Any], row: Sequence[Any], done: int, exc: Exception
) -> RowNotEncoded:
    """The row that ``write_row`` refused, its number and the value it failed on."""
    from psycopg.adapt import PyFormat, Transformer

    number = done + 1 + next(i for i, each in enumerate(batch) if each is row)
    dumpers = Transformer.from_context(cur)
    for column, value in enumerate(row):
        if value is None:
            continue
        try:
            dumpers.get_dumper(value, PyFormat.TEXT).dump(value)
        except Exception:
            return RowNotEncoded(str(exc), number, column, value)
    return RowNotEncoded(str(exc), number, None, None)


def statement_in_flight(conn: Any) -> bool:
    """True while the connection waits for the result of a statement (or is in a COPY): libpq's
    ACTIVE transaction status. Reads no lock, so it may be called from another thread or a
    signal handler while the statement runs."""
    if conn.closed:
        return False
    if is_psycopg2(conn):
        import psycopg2.extensions

        return conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_ACTIVE
    from psycopg.pq import TransactionStatus

    return conn.pgconn.transaction_status == TransactionStatus.ACTIVE


def cancel(conn: Any) -> bool:
    """Ask the server to cancel the statement the connection is running, if it runs one;
    True when a cancel request was delivered.

    Safe from another thread or a signal handler (neither driver takes the connection's lock
    to cancel): psycopg 3's ``cancel_safe()`` (libpq 17's encrypted, bounded cancel; older
    psycopg: ``cancel()``), psycopg2's ``cancel()``. The server then aborts the statement and
    its transaction; the waiting caller gets ``QueryCanceled`` (SQLSTATE 57014)."""
    if not statement_in_flight(conn):
        return False
    try:
        if not is_psycopg2(conn) and hasattr(conn, "cancel_safe"):
            conn.cancel_safe(timeout=CANCEL_TIMEOUT)
        else:
            conn.cancel()
    except Exception:
        log.warning("could not cancel the running statement", exc_info=True)
        return False
    return True


#: the connections of killed steps, held by the connection itself (weakly: an entry goes with
#: its connection). Never by ``id()``: a connection opened later may get a dead one's id, and
#: with it a kill it never had (a load refused as killed that nobody killed).
_stopped: weakref.WeakSet[Any] = weakref.WeakSet()


def stop(conn: Any) -> bool:
    """A kill: cancel the running statement (:func:`cancel`) and refuse every further one on
    this connection, so that a cancel arriving between two statements (which the server
    ignores) does not let the step go on with the next; True when a statement was cancelled.

    Then, for :data:`RECANCEL_FOR` seconds, a statement that the connection is found running
    is cancelled again (:func:`_recancel`): one whose thread passed the check of
    :func:`plain_cursor` just before the kill, or one the server was still reading when the
    cancel came (it ignores a cancel then) would otherwise run to its end (seen: an index
    build that sleeps 60 s ran its 60 s after a failing side-by-side build stopped it).
    Takes no lock (a set's add is atomic): safe from another thread or a signal handler."""
    _stopped.add(conn)
    cancelled = cancel(conn)
    _RECANCEL["until"] = time.monotonic() + RECANCEL_FOR
    watcher = _RECANCEL.get("thread")
    if watcher is None or not watcher.is_alive():  # type: ignore[attr-defined]
        watcher = threading.Thread(target=_recancel, name="pg-bulk-recancel", daemon=True)
        _RECANCEL["thread"] = watcher
        watcher.start()
    return cancelled


#: seconds after a kill during which a stopped connection's statements are cancelled again,
#: and how often they are looked for
RECANCEL_FOR = 30.0
RECANCEL_EVERY = 0.05
_RECANCEL: dict[str, Any] = {"until": 0.0, "thread": None}


def _recancel() -> None:
    """Cancel what a stopped connection (:func:`stop`) runs, until :data:`RECANCEL_FOR`
    seconds after the last kill; a connection closed by :func:`close_cancelling` or gone
    leaves :data:`_stopped` and is no longer watched."""
    while time.monotonic() < _RECANCEL["until"]:
        try:
            stopped = list(_stopped)
        except RuntimeError:  # (a kill in another thread added one meanwhile)
            stopped = []
        for conn in stopped:
            cancel(conn)  # (only while it runs a statement)
        time.sleep(RECANCEL_EVERY)


def rollback_quietly(conn: Any) -> None:
    """Roll back, ignoring a failure: the connection may be gone, and then the server rolls
    back on its own.

    A statement still in flight (an exception such as Airflow's ``AirflowTaskTimeout`` was
    raised by a signal handler while the driver waited; psycopg 3 cancels by itself only on
    ``KeyboardInterrupt``) is cancelled first, so the server stops its work instead of running
    it to the end; the connection is then only fit for closing."""
    cancel(conn)
    try:
        conn.rollback()
    except Exception:
        log.debug("rollback failed", exc_info=True)


def close_cancelling(conn: Any) -> None:
    """Close the connection, cancelling first a statement still in flight (closing alone
    would leave the server running it until it next writes to the client)."""
    cancel(conn)
    try:
        conn.close()
    except Exception:
        log.debug("close failed", exc_info=True)
    _stopped.discard(conn)


def server_version(conn: Any) -> int:
    """The server's version number (e.g. 150020 or 180006)."""
    return int(conn.server_version if is_psycopg2(conn) else conn.info.server_version)


@contextmanager
def collect_notices(conn: Any) -> Iterator[list[str]]:
    """Collect the primary text of the server's NOTICE messages while the block runs."""
    messages: list[str] = []
    if is_psycopg2(conn):
        saved = conn.notices
        raw: list[str] = []
        conn.notices = raw  # psycopg2 appends "NOTICE:  text\n" to any list given
        try:
            yield messages
        finally:
            conn.notices = saved
            messages.extend(n.split(":", 1)[-1].strip() for n in raw)
        return

    def handler(diag: Any) -> None:
        messages.append(diag.message_primary or "")

    conn.add_notice_handler(handler)
    try:
        yield messages
    finally:
        conn.remove_notice_handler(handler)


def is_database_error(exc: BaseException) -> bool:
    """True for an error raised by either driver."""
    module = type(exc).__module__.split(".")[0]
    return module in {"psycopg", "psycopg2"} and hasattr(exc, "diag")


def is_connection_lost(exc: BaseException) -> bool:
    """True when the connection to the server broke (no SQLSTATE, or class 08)."""
    if not is_database_error(exc) or type(exc).__name__ not in {
        "OperationalError",
        "InterfaceError",
    }:
        return False
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return sqlstate is None or sqlstate.startswith("08")


def server_error(exc: BaseException) -> ServerError:
    """The sqlstate, message and context of a driver error."""
    diag = getattr(exc, "diag", None)
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    message = (getattr(diag, "message_primary", None) or str(exc)).strip()
    return ServerError(
        sqlstate=sqlstate,
        message=message,
        detail=getattr(diag, "message_detail", None),
        context=getattr(diag, "context", None),
        constraint=getattr(diag, "constraint_name", None),
    )


def connect(dsn: str, driver: str = "psycopg", *, application_name: str = "airflow-pg-bulk") -> Any:
    """Open a connection with the chosen driver (``psycopg`` or ``psycopg2``).

    A failure raises :class:`TransientLoadError` (the server did not answer or refused) or
    :class:`LoadRefusedError` (a malformed DSN) with any password in the DSN masked, and
    without chaining the driver's error, whose text may quote the DSN."""
    if driver not in ("psycopg", "psycopg2"):
        raise ValueError(f"driver must be 'psycopg' or 'psycopg2', not {driver!r}")
    try:
        if driver == "psycopg2":
            import psycopg2

            return psycopg2.connect(dsn, application_name=application_name)
        import psycopg

        return psycopg.connect(dsn, application_name=application_name)
    except Exception as exc:
        message = redact(str(exc).strip(), dsn)
        if type(exc).__name__ == "OperationalError":
            raise TransientLoadError(f"cannot connect to the database: {message}") from None
        raise LoadRefusedError(f"cannot use the connection string: {message}") from None


_PASSWORD_PATTERNS = (
    re.compile(r"password\s*=\s*'((?:[^'\\]|\\.)*)'"),
    re.compile(r"password\s*=\s*([^\s']\S*)"),
    re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*:([^@/?#]*)@"),
    re.compile(r"[?&]password=([^&#]*)"),
)


def redact(text: str, dsn: str) -> str:
    """``text`` with every password found in ``dsn`` (key=value or URI form) masked."""
    secrets: set[str] = set()
    for pattern in _PASSWORD_PATTERNS:
        for match in pattern.finditer(dsn):
            value = match.group(1)
            secrets.update(v for v in (value, unquote(value)) if v)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "****")
    return text
