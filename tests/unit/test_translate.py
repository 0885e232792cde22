"""airflow_pg_bulk.db.translate: driver errors into the package's errors, on fabricated errors."""

from __future__ import annotations

import dataclasses

import psycopg.errors
import pytest

from airflow_pg_bulk.db import translate
from airflow_pg_bulk.db.driver import ServerError, is_connection_lost, server_error
from airflow_pg_bulk.errors import (
    TRANSIENT_SQLSTATES,
    BadDataError,
    ConstraintViolationError,
    TransientLoadError,
)
from airflow_pg_bulk.plan import Piece
from airflow_pg_bulk.target import violations

from .factories import driver_error, plan


def _piece_plan(tmp_path, text: bytes):
    path = tmp_path / "r.csv"
    path.write_bytes(text)
    p = plan(source=(str(path),))
    piece = Piece(str(path), 0, len(text), 1)
    return p, piece


def test_a_bad_value_names_file_line_column_and_value(tmp_path) -> None:
    p, piece = _piece_plan(tmp_path, b'1,a,1.0\n2,"b\nc",x\n3,d,2\n')
    exc = driver_error(
        psycopg.errors.InvalidTextRepresentation,
        message_primary='invalid input syntax for type numeric: "x"',
        context=f'COPY {p.staging_table}, line 3, column value: "x"',
    )
    error = translate.copy_error(exc, p, piece)
    assert isinstance(error, BadDataError)
    assert (error.path, error.line, error.column, error.value) == (piece.path, 2, "value", "x")
    # line 3 as COPY counts it (the quoted newline counted) is the record on lines 2-3
    assert f"{piece.path} lines 2-3, column value: invalid input syntax" in str(error)
    assert p.staging_table not in str(error)
    assert str(error).endswith("Nothing of this load reached public.readings.")


def test_a_long_value_is_truncated_and_quoted_when_the_message_lacks_it(tmp_path) -> None:
    p, piece = _piece_plan(tmp_path, b"1\n" + b"y" * 200 + b"\n")
    exc = driver_error(
        psycopg.errors.StringDataRightTruncation,
        message_primary="value too long for type character varying(5)",
        context=f'COPY {p.staging_table}, line 2, column meter: "{"y" * 200}"',
        message_detail="Some detail.",
    )
    error = translate.copy_error(exc, p, piece)
    assert isinstance(error, BadDataError)
    assert error.value == "y" * 80 + "..."
    assert f"(value {error.value!r}); Some detail." in str(error)


def test_a_lock_timeout_is_transient_with_its_sqlstate() -> None:
    p = plan()
    exc = driver_error(
        psycopg.errors.LockNotAvailable, message_primary="canceling statement due to lock timeout"
    )
    error = translate.finalize_error(exc, p)
    assert isinstance(error, TransientLoadError)
    assert error.sqlstate == "55P03"
    assert "lock_timeout is 30s" in str(error)
    copy = translate.copy_error(exc, p, p.partitions[0].pieces[0])
    assert isinstance(copy, TransientLoadError) and copy.sqlstate == "55P03"


@pytest.mark.parametrize("sqlstate", sorted(TRANSIENT_SQLSTATES))
def test_every_transient_sqlstate_is_transient(sqlstate: str) -> None:
    err = ServerError(sqlstate, "boom", None, None, None)
    p = plan()
    assert isinstance(translate.finalize_server_error(err, p), TransientLoadError)
    piece = p.partitions[0].pieces[0]
    assert translate.copy_server_error(err, p, piece).sqlstate == sqlstate


def test_a_unique_violation_keeps_the_targets_names() -> None:
    p = plan()
    exc = driver_error(
        psycopg.errors.UniqueViolation,
        message_primary=f'could not create unique index "_pgbulk_{p.load_id}_i0"',
        constraint_name=f"_pgbulk_{p.load_id}_i0",
        message_detail="Key (id)=(1) is duplicated.",
    )
    error = translate.finalize_error(exc, p)
    assert isinstance(error, ConstraintViolationError)
    assert '"readings_pkey"' in str(error) and "(readings_pkey)" in str(error)
    assert "_pgbulk_" not in str(error)
    assert str(error).endswith("Key (id)=(1) is duplicated. The target is unchanged")


@pytest.mark.parametrize(
    ("found", "words"),
    [
        (
            violations.Found(rows=(("/d/a.csv", 3), ("/d/b.csv", 7))),
            "; found at /d/a.csv line 3 and /d/b.csv line 7. The target is unchanged",
        ),
        (
            violations.Found(rows=(("/d/b.csv", 7),), in_target=True),
            "; found at /d/b.csv line 7, whose key is already in the target. The target is"
            " unchanged",
        ),
        (
            violations.Found(files=tuple(f"/d/{n}.csv" for n in range(7))),
            "; the offending rows came from /d/0.csv, /d/1.csv, /d/2.csv, /d/3.csv, /d/4.csv"
            " and 2 more files. The target is unchanged",
        ),
    ],
)
def test_a_constraint_violation_names_the_rows_found(found, words) -> None:
    p = plan()
    exc = driver_error(
        psycopg.errors.UniqueViolation,
        message_primary="duplicate key value violates unique constraint",
        constraint_name="readings_pkey",
        message_detail="Key (id)=(1) already exists.",
    )
    error = translate.finalize_error(exc, p, found)
    assert isinstance(error, ConstraintViolationError) and error.sqlstate == "23505"
    assert str(error).endswith(words)
    assert error.rows == found.rows and error.in_target == found.in_target
    assert (error.path, error.line) == (found.rows[0] if found.rows else (None, None))


def test_a_unique_violation_on_a_system_catalog_index_is_a_race() -> None:
    exc = driver_error(
        psycopg.errors.UniqueViolation,
        message_primary="duplicate key value violates unique constraint",
        constraint_name="pg_type_typname_nsp_index",
    )
    error = translate.finalize_error(exc, plan())
    assert isinstance(error, TransientLoadError) and error.sqlstate == "23505"


def test_other_errors_pass_through() -> None:
    p = plan()
    exc = driver_error(psycopg.errors.UndefinedTable, message_primary="no such table")
    assert translate.finalize_error(exc, p) is exc
    assert translate.copy_error(exc, p, p.partitions[0].pieces[0]) is exc
    plain = RuntimeError("worker lost")
    assert translate.finalize_error(plain, p) is plain
    interrupt = KeyboardInterrupt()
    assert translate.finalize_error(interrupt, p) is interrupt


def test_a_lost_connection_is_transient() -> None:
    exc = psycopg.OperationalError("server closed the connection unexpectedly")
    assert is_connection_lost(exc)
    assert isinstance(translate.finalize_error(exc, plan()), TransientLoadError)


def test_bad_record_reads_copys_line_number() -> None:
    bad = driver_error(
        psycopg.errors.BadCopyFileFormat,
        message_primary="extra data after last expected column",
        context='COPY t, line 7: "1,2,3,4"',
    )
    assert translate.bad_record(bad) == 7
    assert translate.is_row_error(bad)
    other = driver_error(psycopg.errors.LockNotAvailable, context="COPY t, line 7")
    assert translate.bad_record(other) is None
    assert translate.bad_record(ValueError("x")) is None


def test_server_error_reads_the_diagnostics() -> None:
    exc = driver_error(
        psycopg.errors.CheckViolation,
        message_primary="violates check",
        message_detail="Failing row",
        constraint_name="c",
        context="ctx",
    )
    assert dataclasses.astuple(server_error(exc)) == (
        "23514", "violates check", "Failing row", "ctx", "c"
    )  # fmt: skip
