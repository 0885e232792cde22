"""The load's errors: what went wrong, where, and whether a retry can help.

``BadDataError`` and ``LoadRefusedError`` are terminal (a retry gives the same answer; the
Airflow operators turn them into ``AirflowFailException``). ``TransientLoadError`` (a lock
timeout, a dropped connection) is worth retrying. All of them say which table and, for data,
which file, line and column.
"""

from __future__ import annotations

import re

_COPY_CONTEXT = re.compile(
    r'COPY [^,\n]+, line (\d+)(?:, column (.*?))?(?:: "(.*)"|: null input)?\s*\Z', re.S
)


class PgBulkError(Exception):
    """Base class of every error this package raises on purpose.

    :param sqlstate: the server's SQLSTATE, when the error came from the server.
    """

    def __init__(self, *args: object, sqlstate: str | None = None) -> None:
        super().__init__(*args)
        self.sqlstate = sqlstate


class LoadRefusedError(PgBulkError):
    """The load cannot be done safely as asked; nothing was changed. Retrying will not help."""


class BadArgumentError(LoadRefusedError):
    """An argument names what the target does not have (an upsert key column): a mistake in
    the arguments, found once the target was read; nothing was changed. The CLI exits 2."""


class OlderRunError(LoadRefusedError):
    """A load of a later run of the same DAG task replaced the same rows of the target: this
    older run would put older data over newer (see ``allow_older_run``). Nothing was changed."""


class AlreadyLoadedError(LoadRefusedError):
    """This run's append was finalized before: loading it again would add its rows twice.

    :param rows: the rows that load made visible.
    :param finalized_at: when, as the server wrote it.
    """

    def __init__(self, message: str, *, rows: int, finalized_at: str) -> None:
        super().__init__(message)
        self.rows = rows
        self.finalized_at = finalized_at


class BadDataError(PgBulkError):
    """A row of the source was rejected by PostgreSQL; the target is untouched.

    :param message: the full explanation, with file, line and column.
    :param path: the source file.
    :param line: the 1-based physical line number of the bad record in that file.
    :param column: the column, when the server named one.
    :param value: the offending value (truncated), when the server quoted one.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: str | None = None,
        value: str | None = None,
        sqlstate: str | None = None,
    ) -> None:
        super().__init__(message, sqlstate=sqlstate)
        self.path = path
        self.line = line
        self.column = column
        self.value = value


class ConstraintViolationError(PgBulkError):
    """The loaded rows break a constraint of the target (found in finalize); target untouched.

    :param message: the explanation: constraint, key, and the file and line of an offending
        row (both rows of a duplicate key loaded twice) when they were found.
    :param rows: (file, line) of each offending row found (see
        :mod:`airflow_pg_bulk.target.violations`).
    :param in_target: the row conflicts with a row the target already holds.
    """

    def __init__(
        self,
        message: str,
        *,
        rows: tuple[tuple[str, int], ...] = (),
        in_target: bool = False,
        sqlstate: str | None = None,
    ) -> None:
        super().__init__(message, sqlstate=sqlstate)
        self.rows = rows
        self.in_target = in_target

    @property
    def path(self) -> str | None:
        """The file of the (first) offending row found, or None."""
        return self.rows[0][0] if self.rows else None

    @property
    def line(self) -> int | None:
        """The line of the (first) offending row found, or None."""
        return self.rows[0][1] if self.rows else None


class IncompleteLoadError(PgBulkError):
    """Finalize found COPY streams missing from the ledger or lost from staging."""


class SourceReadError(PgBulkError):
    """The source database failed while a COPY stream read it (or gave other rows than COPY
    loaded); nothing of the COPY stream was committed."""


class TransientLoadError(PgBulkError):
    """A failure that a retry may not meet again (lock timeout, connection lost)."""


# The SQLSTATEs the load tells apart, named as PostgreSQL's errcodes.txt names them: the one
# place each code is written (tests/unit/test_sqlstates.py checks that no other module writes one).
CARDINALITY_VIOLATION = "21000"  # MERGE: a target row matched by two source rows
NOT_NULL_VIOLATION = "23502"
UNIQUE_VIOLATION = "23505"
CHECK_VIOLATION = "23514"  # a CHECK, or "no partition of relation ... found for row"
SERIALIZATION_FAILURE = "40001"
DEADLOCK_DETECTED = "40P01"
DUPLICATE_TABLE = "42P07"
UNDEFINED_TABLE = "42P01"
DUPLICATE_PREPARED_STATEMENT = "42P05"
INVALID_SQL_STATEMENT_NAME = "26000"  # no such prepared statement
INSUFFICIENT_RESOURCES = "53000"
DISK_FULL = "53100"
OUT_OF_MEMORY = "53200"
TOO_MANY_CONNECTIONS = "53300"
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout, or NOWAIT
QUERY_CANCELED = "57014"  # statement_timeout, or a cancel on kill
ADMIN_SHUTDOWN = "57P01"
CRASH_SHUTDOWN = "57P02"
CANNOT_CONNECT_NOW = "57P03"

TRANSIENT_SQLSTATES = frozenset(
    {
        LOCK_NOT_AVAILABLE,
        QUERY_CANCELED,
        SERIALIZATION_FAILURE,
        DEADLOCK_DETECTED,
        ADMIN_SHUTDOWN,
        CRASH_SHUTDOWN,
        CANNOT_CONNECT_NOW,
        INSUFFICIENT_RESOURCES,
        DISK_FULL,  # worth a retry once space is freed
        OUT_OF_MEMORY,
        TOO_MANY_CONNECTIONS,
    }
)


def is_data_sqlstate(sqlstate: str | None) -> bool:
    """Data exceptions (22xxx) and integrity violations (23xxx) come from the rows themselves."""
    return bool(sqlstate) and sqlstate[:2] in {"22", "23"}


def parse_copy_context(context: str | None) -> tuple[int | None, str | None, str | None]:
    """COPY's ``line N``, column and quoted value from an error's CONTEXT, when it has them.

    The quoted value (or the whole record) may span lines: a CSV record with quoted newlines."""
    match = _COPY_CONTEXT.search(context or "")
    if not match:
        return None, None, None
    return int(match.group(1)), match.group(2), match.group(3)
