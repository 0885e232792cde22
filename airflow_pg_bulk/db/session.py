"""A step's sessions: :func:`start_session` prepares each new one (its name, the client check);
:class:`Sessions` opens a step's extra sessions on demand and stops them all on a kill."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from psycopg.sql import Composable

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    close_cancelling,
    execute,
    execute_outside_transaction,
    rollback_quietly,
    server_version,
    stop,
)
from airflow_pg_bulk.errors import QUERY_CANCELED, TransientLoadError

CLIENT_CHECK_INTERVAL = "10s"  # a backend whose client died stops its statement within this


def start_session(conn: DatabaseConnection, application_name: str) -> None:
    """Prepare a step's new session: name it (see :func:`airflow_pg_bulk.naming.application_name`:
    a DBA sees the load, DAG, task and map index in ``pg_stat_activity``) and, on PostgreSQL 14+,
    set ``client_connection_check_interval`` so that a statement whose client was killed
    (SIGKILL: no cancel could be sent) stops within seconds instead of running to its end.
    Runs outside a transaction, in autocommit: a session setting set in a transaction that
    rolls back would be undone (and one round trip, where a transaction of its own takes three;
    on a connection already in a transaction, it commits that one)."""
    try:
        execute_outside_transaction(conn, session_setup(conn, application_name))
    except BaseException:
        rollback_quietly(conn)
        raise


def session_setup(conn: DatabaseConnection, application_name: str) -> sql.Composable:
    """The statement :func:`start_session` runs, for a caller that sends it with its own
    first statement outside a transaction (one round trip for both)."""
    check = CLIENT_CHECK_INTERVAL if server_version(conn) >= 140000 else None
    return sql.session_setup(application_name, check)


class Sessions:
    """The extra sessions of one step, opened on demand by ``factory`` and named after the
    step's own session (:func:`airflow_pg_bulk.naming.helper_session`).

    :meth:`stop` (a kill, from any thread or a signal handler) cancels the statement each open
    session runs and refuses every further statement and session, as
    :func:`airflow_pg_bulk.db.driver.stop` does for the step's own connection.

    :param factory: returns a new DB-API connection (psycopg 3 or psycopg2).
    :param application_name: the step's own session name.
    """

    def __init__(self, factory: Callable[[], Any], application_name: str) -> None:
        self._factory = factory
        self._name = application_name
        self._open: list[Any] = []
        self._count = 0
        self._lock = threading.Lock()
        self.stopped = False

    def open(self, setup: Sequence[Composable] = ()) -> Any:
        """A new session, named and set up (``setup``'s statements, committed)."""
        if self.stopped:
            raise _killed()
        conn = self._factory()
        with self._lock:
            self._count += 1
            number = self._count
            self._open.append(conn)
        try:
            if self.stopped:  # a kill between the check above and the append
                stop(conn)
            start_session(conn, naming.helper_session(self._name, number))
            for statement in setup:
                execute(conn, statement)
            conn.commit()
        except BaseException:  # (a kill refuses the first statement): closed, not left open
            self.close(conn)
            raise
        return conn

    def close(self, conn: DatabaseConnection) -> None:
        """Close one session, cancelling first a statement still running."""
        with self._lock:
            if conn in self._open:
                self._open.remove(conn)
        close_cancelling(conn)

    def stop(self) -> None:
        """Cancel what every open session runs and refuse further statements and sessions.
        Takes no lock (list copies are atomic): safe from a signal handler."""
        self.stopped = True
        for conn in list(self._open):
            stop(conn)


def _killed() -> TransientLoadError:
    return TransientLoadError(
        "the task was killed: its running statements were cancelled and no other starts",
        sqlstate=QUERY_CANCELED,
    )
