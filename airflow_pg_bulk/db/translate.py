"""The one translation of driver errors into the package's errors.

A driver error (psycopg 3 or psycopg2) is read into a driver-independent
:class:`~airflow_pg_bulk.db.driver.ServerError` and mapped here: a SQLSTATE in
:data:`~airflow_pg_bulk.errors.TRANSIENT_SQLSTATES` or a lost connection becomes
:class:`~airflow_pg_bulk.errors.TransientLoadError`; a data error during COPY becomes
:class:`~airflow_pg_bulk.errors.BadDataError` naming the file, line, column and value; a data
error in finalize becomes :class:`~airflow_pg_bulk.errors.ConstraintViolationError` with the
target's own names (or, on a system catalog's unique index, a transient name race). Any other
error is returned unchanged.
"""

from __future__ import annotations

from typing import Protocol

from airflow_pg_bulk import naming
from airflow_pg_bulk.db.driver import (
    ServerError,
    is_connection_lost,
    is_database_error,
    server_error,
)
from airflow_pg_bulk.errors import (
    LOCK_NOT_AVAILABLE,
    TRANSIENT_SQLSTATES,
    BadDataError,
    ConstraintViolationError,
    TransientLoadError,
    is_data_sqlstate,
    parse_copy_context,
)
from airflow_pg_bulk.plan import LoadPlan, Piece
from airflow_pg_bulk.source import lines


class Located(Protocol):
    """Where the offending rows of a broken constraint were found in the source (the layer
    above finds them: :class:`airflow_pg_bulk.target.violations.Found`)."""

    rows: tuple[tuple[str, int], ...]
    in_target: bool

    def describe(self) -> str:
        """The words the error adds about where the rows are."""
        ...


VALUE_LIMIT = 80
MESSAGE_LIMIT = 300


def truncate(value: str, limit: int = VALUE_LIMIT) -> str:
    """``value`` cut to ``limit`` characters, with ``...`` when it was longer."""
    return value if len(value) <= limit else value[:limit] + "..."


def copy_error(exc: Exception, plan: LoadPlan, piece: Piece) -> Exception:
    """What a failed ``COPY`` of ``piece`` raises: transient, bad data, or ``exc`` itself."""
    if is_connection_lost(exc):
        return TransientLoadError(
            f"loading {piece.path} into {plan.target.qualified}: the connection to the server "
            f"was lost ({str(exc).strip()}); nothing of this COPY stream was committed"
        )
    if not is_database_error(exc):
        return exc
    return copy_server_error(server_error(exc), plan, piece) or exc


def copy_server_error(err: ServerError, plan: LoadPlan, piece: Piece) -> Exception | None:
    """:func:`copy_error` for an error the server raised; None: not one of ours to translate."""
    if err.sqlstate in TRANSIENT_SQLSTATES:
        return TransientLoadError(
            f"loading {piece.path} into {plan.target.qualified}: {err.message} (SQLSTATE "
            f"{err.sqlstate}); nothing of this COPY stream was committed and a retry may succeed",
            sqlstate=err.sqlstate,
        )
    if not is_data_sqlstate(err.sqlstate):
        return None
    record, column, quoted = parse_copy_context(err.context)
    where = piece.path
    line = None
    if record is not None:
        try:
            first, last = lines.record_lines(piece, record, plan.copy)
        except ValueError:  # the file's bytes cannot be read the way the server read them
            start = lines.first_line(piece, plan.copy)
            where += f" (record {record} of the part starting at line {start})"
        else:
            line = first
            where += f" line {first}" if first == last else f" lines {first}-{last}"
    return bad_value(err, plan, piece.path, where, column, quoted, line)


def bad_value(
    err: ServerError,
    plan: LoadPlan,
    path: str,
    where: str,
    column: str | None,
    quoted: str | None,
    line: int | None = None,
) -> BadDataError:
    """The error of a value COPY could not take: ``where`` (the file and the place in it),
    the column, the server's message, the value (truncated) and its detail, in the target's
    own names; ``path``, ``line``, ``column`` and ``value`` kept on the error."""
    if column:
        where += f", column {column}"
    value = truncate(quoted) if quoted is not None else None
    message = f"{where}: {truncate(err.message, MESSAGE_LIMIT)}"
    if value is not None and value not in err.message:
        message += f" (value {value!r})"
    if err.detail:
        message += f"; {err.detail.rstrip('.')}"
    message = naming.original_names(plan, message)
    message += f". Nothing of this load reached {plan.target.qualified}."
    return BadDataError(message, path=path, line=line, column=column, value=value)


def finalize_error(
    exc: BaseException, plan: LoadPlan, found: Located | None = None
) -> BaseException:
    """What a failed finalize raises: transient, a constraint violation, or ``exc`` itself.

    :param found: where the offending rows of a constraint violation are
        (:func:`airflow_pg_bulk.target.violations.locate`), named in its message."""
    if is_connection_lost(exc):
        return TransientLoadError(
            f"finalize of {plan.target.qualified}: the connection to the server was lost "
            f"({str(exc).strip()}); the target is unchanged unless the swap had committed, "
            "and a retry goes on where this attempt stopped"
        )
    if not isinstance(exc, Exception) or not is_database_error(exc):
        return exc
    return finalize_server_error(server_error(exc), plan, found) or exc


def finalize_server_error(
    err: ServerError, plan: LoadPlan, found: Located | None = None
) -> Exception | None:
    """:func:`finalize_error` for an error the server raised; None: not one to translate."""
    t = plan.target
    if err.sqlstate in TRANSIENT_SQLSTATES:
        waited = (
            f", lock_timeout is {plan.settings.lock_timeout}"
            if err.sqlstate == LOCK_NOT_AVAILABLE
            else ""
        )
        return TransientLoadError(
            f"finalize of {t.qualified}: {err.message} (SQLSTATE {err.sqlstate}{waited}); "
            "the target is unchanged and a retry may succeed",
            sqlstate=err.sqlstate,
        )
    if not is_data_sqlstate(err.sqlstate):
        return None
    if (err.constraint or "").startswith("pg_"):
        return TransientLoadError(  # a system catalog's unique index: a race on a name
            f"finalize of {t.qualified}: {err.message} (SQLSTATE {err.sqlstate}): another "
            "session created the same object at the same time; a retry may succeed",
            sqlstate=err.sqlstate,
        )
    constraint = f" ({err.constraint})" if err.constraint else ""
    detail = f": {err.detail.rstrip('.')}" if err.detail else ""
    where = f"; {found.describe()}" if found else ""
    return ConstraintViolationError(
        naming.original_names(
            plan,
            f"the loaded rows break a constraint of {t.qualified}{constraint}: "
            f"{truncate(err.message, MESSAGE_LIMIT)}{truncate(detail, MESSAGE_LIMIT)}{where}. "
            "The target is unchanged",
        ),
        rows=found.rows if found else (),
        in_target=found.in_target if found else False,
        sqlstate=err.sqlstate,
    )


def bad_record(exc: BaseException) -> int | None:
    """COPY's ``line N`` of a row-level data error, or None for any other error."""
    if not is_database_error(exc):
        return None
    err = server_error(exc)
    if not is_data_sqlstate(err.sqlstate):
        return None
    record, _column, _value = parse_copy_context(err.context)
    return record


def is_row_error(exc: BaseException) -> bool:
    """True for a server error raised by the rows themselves (SQLSTATE class 22 or 23)."""
    return is_database_error(exc) and is_data_sqlstate(server_error(exc).sqlstate)
