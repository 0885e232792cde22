"""Dropping what loads leave: cleanup (this load's tables; never the target) and, at the end of
prepare, what other loads into the same target left behind (:func:`drop_abandoned`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.sql import Composable

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    execute_each_outside_transaction,
    is_database_error,
    rollback_quietly,
    scalar,
    server_error,
)
from airflow_pg_bulk.errors import LOCK_NOT_AVAILABLE, LoadRefusedError, TransientLoadError
from airflow_pg_bulk.loading.ledger import comment_record
from airflow_pg_bulk.plan import LoadPlan, Settings

log = logging.getLogger(__name__)

CLEANUP_ATTEMPTS = 3  # cleanup's tries at a drop that meets lock_timeout
CLEANUP_BACKOFF = 1.0  # seconds before the second try, doubled before each next one


def cleanup(
    conn: DatabaseConnection,
    schema: str,
    load_id: str,
    *,
    lock_timeout: str = Settings.lock_timeout,
    attempts: int = CLEANUP_ATTEMPTS,
    backoff: float = CLEANUP_BACKOFF,
    first: Sequence[Composable] = (),
) -> list[str]:
    """Drop every table this load created (staging, ledger); never the target. Idempotent.
    The ledger goes last (see :func:`drop_abandoned`). ``first``: statements for outside a
    transaction (the session's setup), sent with cleanup's first read, in its round trip.

    The tables are dropped in one transaction under ``lock_timeout``; when that meets it, each
    in its own transaction; a drop that meets it
    (another session still holds a lock on the table: a killed task's backend that has not
    ended yet, a report reading staging) is tried again after ``backoff`` seconds, doubled
    each time, ``attempts`` times in all. Then :class:`TransientLoadError` names the tables
    left. So cleanup waits at most about ``attempts * lock_timeout`` per table plus the
    pauses. Returns the names dropped."""
    dropped: list[str] = []
    for attempt in range(1, attempts + 1):
        try:
            left = _drop_each(conn, schema, load_id, lock_timeout, dropped, first)
            first = ()
        except BaseException:
            rollback_quietly(conn)
            raise
        if not left:
            break
        if attempt == attempts:
            raise TransientLoadError(
                f"cleanup of load {load_id}: could not drop {', '.join(left)} in schema "
                f"{schema}: another session held a lock on it past lock_timeout "
                f"({lock_timeout}) {attempts} times. Retry the cleanup task, or drop them by "
                "hand once that session has ended (see pg_locks)",
                sqlstate=LOCK_NOT_AVAILABLE,
            )
        pause = backoff * 2 ** (attempt - 1)
        log.warning(
            "Load %s: cleanup: %s not dropped (locked by another session, or the ledger kept "
            "while the others are left); trying again in %.1f s",
            load_id,
            ", ".join(left),
            pause,
        )
        time.sleep(pause)
    if dropped:
        log.info("Load %s: cleanup dropped %s", load_id, ", ".join(dropped))
    return dropped


def _drop_each(
    conn: DatabaseConnection,
    schema: str,
    load_id: str,
    lock_timeout: str,
    dropped: list[str],
    first: Sequence[Composable] = (),
) -> list[str]:
    """Drop the run's tables, appending to ``dropped``; return those a lock timeout left.
    All in one transaction (one commit whatever their number); when that meets
    ``lock_timeout``, one transaction each, so that a locked table keeps no other.
    ``first``: see :func:`cleanup`."""
    left = []
    ledger = naming.ledger_table(load_id)
    # (a read in autocommit, after ``first``: one round trip)
    found = execute_each_outside_transaction(conn, [*first, run_tables_check(schema, load_id)])
    names = [row[0] for row in found[-1]]
    if not names:
        return left
    # the setting and the DROP in one round trip; the COMMIT apart: a DROP may wait for a
    # lock, and a client that dies meanwhile (a second signal: exit at once) must leave the
    # tables to `airflow-pg-bulk cleanup`, not have the server drop them when the lock comes
    try:
        execute(
            conn,
            sql.in_one_round_trip(
                sql.set_config("lock_timeout", lock_timeout, local=True),
                sql.drop_tables(schema, names),
            ),
        )
        conn.commit()
    except Exception as exc:
        if not (is_database_error(exc) and server_error(exc).sqlstate == LOCK_NOT_AVAILABLE):
            raise
        rollback_quietly(conn)
    else:
        dropped.extend(names)
        return left
    # one at a time: the ledger last; as long as any of the load's tables is left, its
    # ledger says whose they are, for the next load into the target (see drop_abandoned)
    names.sort(key=lambda name: name == ledger)
    for name in names:
        if name == ledger and left:  # kept for drop_abandoned, named with what is left
            left.append(name)
            continue
        try:
            execute(
                conn,
                sql.in_one_round_trip(
                    sql.set_config("lock_timeout", lock_timeout, local=True),
                    sql.drop_table(schema, name, if_exists=True),
                ),
            )
            conn.commit()
        except Exception as exc:
            if not (is_database_error(exc) and server_error(exc).sqlstate == LOCK_NOT_AVAILABLE):
                raise
            rollback_quietly(conn)
            left.append(name)
            continue
        dropped.append(name)
    return left


def run_tables_check(schema: str, load_id: str) -> sql.Composable:
    """The query: the names of the tables of the load ``load_id`` (what
    :func:`drop_run_tables` drops), one per row."""
    return sql.run_tables(schema, naming.run_objects_pattern(load_id))


def drop_run_tables(
    conn: DatabaseConnection, schema: str, load_id: str, *, names: list[str] | None = None
) -> list[str]:
    """Drop every table of the load ``load_id`` (in the caller's transaction); their names.
    ``names``: those tables, when the caller read them already (:func:`run_tables_check`,
    earlier in its transaction). All dropped in one round trip."""
    if names is None:
        names = [row[0] for row in execute(conn, run_tables_check(schema, load_id))]
    if names:
        drops = [sql.drop_table(schema, name, if_exists=True) for name in names]
        execute(conn, sql.in_one_round_trip(*drops))
    return names


def interval_seconds(
    conn: DatabaseConnection, name: str, interval: str, *, seconds: float | None = None
) -> float:
    """A PostgreSQL interval option in seconds; refused when it is not an interval, or
    negative. ``seconds``: the server's reading of it, when the caller read it already (then
    nothing is sent)."""
    try:
        if seconds is None:
            seconds = float(scalar(conn, sql.interval_seconds(interval)))
    except Exception as exc:
        rollback_quietly(conn)
        if not is_database_error(exc):
            raise
        raise LoadRefusedError(
            f"{name}={interval!r} is not a PostgreSQL interval (e.g. '1d', '12h', '30 min'): "
            f"{server_error(exc).message}"
        ) from None
    if seconds < 0:
        raise LoadRefusedError(f"{name}={interval!r} is negative")
    return seconds


LEFTOVER_LOCK_TIMEOUT = "100ms"  # a leftover locked that long is in use: left alone


def drop_abandoned(
    conn: DatabaseConnection,
    plan: LoadPlan,
    *,
    ledgers: list[tuple[str, str | None]] | None = None,
    max_age: float | None = None,
) -> list[str]:
    """Drop the tables other loads into the same target left behind (a crashed load's staging,
    a finalized load whose cleanup failed), never those of a load that may still be running.
    Returns the names dropped. Runs at the end of prepare, in transactions of its own.

    ``ledgers``: the rows of :func:`ledgers_check`, when the caller read them already (prepare
    reads them in its transaction, before its commit); ``max_age``: ``abandoned_after`` in
    seconds, when the caller has it (:func:`interval_seconds`). Nothing is sent when no other
    load's ledger names the target.

    Another load's tables (found by its ledger, which names the target: cleanup drops the
    ledger last) are dropped when **none** of its sessions is connected
    (``application_name`` ``pgbulk:<its load id>:…``), **no** session holds a lock on its
    ledger (a COPY holds one until it commits; waited for :data:`LEFTOVER_LOCK_TIMEOUT`), and
    it is **finalized** (its rows are in, what is left is what its cleanup did not drop) or
    has shown **no sign of life for** ``abandoned_after`` (neither its prepare nor any COPY
    committed since). Its ledger is locked first and everything is dropped in one transaction,
    so a step of that load starting meanwhile waits and then finds no ledger: it fails saying
    so (the target untouched), it never loads into half-dropped tables. A load whose tables
    cannot be dropped (locked, another role's) is skipped with a warning."""
    t = plan.target
    dropped: list[str] = []
    if ledgers is None:
        try:
            ledgers = execute(conn, ledgers_check(t.schema))
            conn.commit()
        except Exception as exc:
            rollback_quietly(conn)
            if not is_database_error(exc):
                raise
            log.warning("Load %s: could not look for abandoned loads: %s", plan.load_id, exc)
            return dropped
    for ledger, comment in ledgers:
        other = naming.load_of_ledger(ledger)
        record = comment_record(comment)
        if other in (None, plan.load_id) or record is None or record.get("target") != t.qualified:
            continue
        try:
            if max_age is None:
                max_age = interval_seconds(conn, "abandoned_after", plan.settings.abandoned_after)
            # first without a lock (a live load is not touched at all), then again under it
            execute(conn, sql.set_config("lock_timeout", LEFTOVER_LOCK_TIMEOUT, local=True))
            why = _abandoned(conn, t.schema, ledger, other, record, max_age)
            conn.rollback()
            if why is None:
                continue
            execute(conn, sql.set_config("lock_timeout", LEFTOVER_LOCK_TIMEOUT, local=True))
            execute(conn, sql.lock_tables([(t.schema, ledger)], "ACCESS EXCLUSIVE"))
            why = _abandoned(conn, t.schema, ledger, other, record, max_age)
            if why is None:
                conn.rollback()
                continue
            names = drop_run_tables(conn, t.schema, other)
            conn.commit()
        except Exception as exc:
            rollback_quietly(conn)
            if not is_database_error(exc):
                raise
            # locked: in use, by a COPY of it or a reader
            locked = server_error(exc).sqlstate == LOCK_NOT_AVAILABLE
            log.log(
                logging.INFO if locked else logging.WARNING,
                "Load %s: left the tables of load %s into %s: %s",
                plan.load_id,
                other,
                t.qualified,
                server_error(exc).message,
            )
            continue
        dropped.extend(names)
        log.warning(
            "Load %s: dropped the tables load %s into %s left behind (%s; its cleanup did not "
            "run or failed): %s",
            plan.load_id,
            other,
            t.qualified,
            why,
            ", ".join(names),
        )
    return dropped


def ledgers_check(schema: str) -> sql.Composable:
    """The query :func:`drop_abandoned` starts with: every load's ledger in ``schema``, with
    its comment."""
    return sql.load_ledgers(schema, naming.LEDGER_PATTERN)


def _abandoned(
    conn: DatabaseConnection,
    schema: str,
    ledger: str,
    load_id: str,
    record: dict[str, Any],
    max_age: float,
) -> str | None:
    """Why the load whose ledger this is may be dropped (finalized, or no sign of life for
    ``max_age`` seconds, and none of its sessions connected); None: it may be running."""
    if scalar(conn, sql.load_sessions(naming.application_name(load_id, ""))):
        return None
    finalized, copied, now = execute(conn, sql.ledger_activity(schema, ledger))[0]
    if finalized:
        return "finalized"
    quiet = now - max(float(record.get("prepared_at") or 0), float(copied or 0))
    return f"no sign of life for {quiet:.0f} s" if quiet > max_age else None


@dataclass(frozen=True)
class Leftover:
    """The tables a load into a target left in its schema (found by the load's ledger).

    :param load_id: the load's id.
    :param tables: its tables (a partitioned staging stands for its partitions).
    :param running: one of its sessions is connected, or a session holds a lock on its
        ledger (a COPY of it): its tables are in use, never removed.
    :param finalized: its rows were made visible; what is left is what its cleanup missed.
    """

    load_id: str
    tables: tuple[str, ...]
    running: bool
    finalized: bool

    def describe(self) -> str:
        """One line: the load, its state and its tables."""
        state = "running" if self.running else "finalized" if self.finalized else "not finalized"
        return f"load {self.load_id} ({state}): {', '.join(self.tables)}"


def find_leftovers(conn: DatabaseConnection, schema: str, table: str) -> list[Leftover]:
    """The loads into ``schema.table`` whose tables are still in ``schema``, by load id.
    Reads only (waits :data:`LEFTOVER_LOCK_TIMEOUT` at most for a ledger's lock)."""
    target = f"{schema}.{table}"
    found: list[Leftover] = []
    try:
        for ledger, comment in execute(conn, sql.load_ledgers(schema, naming.LEDGER_PATTERN)):
            other = naming.load_of_ledger(ledger)
            record = comment_record(comment)
            if other is None or record is None or record.get("target") != target:
                continue
            names = execute(conn, sql.run_tables(schema, naming.run_objects_pattern(other)))
            finalized = bool(execute(conn, sql.ledger_activity(schema, ledger))[0][0])
            found.append(
                Leftover(
                    other, tuple(r[0] for r in names), _in_use(conn, schema, ledger), finalized
                )
            )
    finally:
        rollback_quietly(conn)
    return found


def _in_use(conn: DatabaseConnection, schema: str, ledger: str) -> bool:
    """One of the load's sessions is connected, or a session locks its ledger (a COPY).
    Uses a savepoint of the caller's transaction; the lock, if taken, lasts until it ends."""
    load_id = naming.load_of_ledger(ledger)
    assert load_id is not None
    if scalar(conn, sql.load_sessions(naming.application_name(load_id, ""))):
        return True
    execute(conn, sql.set_config("lock_timeout", LEFTOVER_LOCK_TIMEOUT, local=True))
    execute(conn, sql.savepoint("pgbulk_leftover"))
    try:
        execute(conn, sql.lock_tables([(schema, ledger)], "ACCESS EXCLUSIVE"))
    except Exception as exc:
        if not (is_database_error(exc) and server_error(exc).sqlstate == LOCK_NOT_AVAILABLE):
            raise
        execute(conn, sql.rollback_to("pgbulk_leftover"))
        return True
    return False


def remove_leftovers(
    conn: DatabaseConnection, schema: str, table: str, *, dry_run: bool = False
) -> list[Leftover]:
    """Drop the tables of every load into ``schema.table`` that is not running (none of its
    sessions connected, its ledger not locked), finalized or not: for a load killed too hard
    to clean up after itself (SIGKILL, a crash) when the next load's own clean-up (after
    ``abandoned_after``) is too far off. Each load's tables go in one transaction, its ledger
    locked first, so a step of it that starts meanwhile waits and then finds no ledger.

    Caution: under Airflow, a load between two of its tasks has no session; one whose COPY
    tasks wait for a worker would fail (its target unchanged) if its tables were removed.

    :param dry_run: only list them. Returns the loads found, removed or (``running``) left."""
    found = find_leftovers(conn, schema, table)
    if dry_run:
        return found
    for leftover in found:
        if leftover.running:
            continue
        ledger = naming.ledger_table(leftover.load_id)
        try:
            if _in_use(conn, schema, ledger):  # under the ledger's lock: it stays so
                conn.rollback()
                continue
            names = drop_run_tables(conn, schema, leftover.load_id)
            conn.commit()
        except BaseException:
            rollback_quietly(conn)
            raise
        log.warning(
            "Load %s: removed the tables it left behind in %s (not running): %s",
            leftover.load_id,
            schema,
            ", ".join(names),
        )
    return found


def was_finalized(conn: DatabaseConnection, schema: str, load_id: str) -> bool:
    """Whether the load's rows were made visible (its ledger says so; no ledger: False)."""
    ledger = naming.ledger_table(load_id)
    try:
        if not scalar(conn, sql.relation_exists(schema, ledger)):
            return False
        return bool(execute(conn, sql.ledger_activity(schema, ledger))[0][0])
    finally:
        rollback_quietly(conn)


def end_load_sessions(conn: DatabaseConnection, load_id: str) -> int:
    """End the load's other sessions (a stopped load's, whose statements were cancelled: a
    COPY FROM STDIN waiting for its client takes no cancel until more data comes, and keeps
    its locks). Commits; returns how many were ended."""
    ended = int(scalar(conn, sql.terminate_load_sessions(naming.application_name(load_id, ""))))
    conn.commit()
    return ended
