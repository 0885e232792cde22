"""The load history: one row per finalized load in ``pgbulk_loads`` (in the target's schema).

Written in the transaction that makes a load visible, and kept after cleanup, it is what lets
a cleared, finished append refuse to append its rows twice, and what orders the runs that
touch the same rows: a load never replaces rows that a load of a *later* run of the same DAG
task put there (the ordering rule, :func:`refuse_overwriting_newer`). See docs/design.md,
"Runs that overlap", and README, "Retries, clearing tasks".

It stays small and off the critical path: an index on (target, scope, data interval) makes
the ordering check under the swap's lock an index range scan over the later loads only (none,
in the usual case), and after each finalize the loads of the target beyond ``history_keep``
are deleted (:func:`trim`), in a transaction of their own, after the swap's commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    execute_each,
    execute_each_outside_transaction,
    execute_then_commit,
    is_database_error,
    rollback_quietly,
    scalar,
)
from airflow_pg_bulk.errors import AlreadyLoadedError, LoadRefusedError, OlderRunError
from airflow_pg_bulk.plan import LOAD_HISTORY_TABLE, LoadPlan
from airflow_pg_bulk.target import catalog

log = logging.getLogger(__name__)

#: the index the ordering check and the trimming read (see :func:`ensure`)
HISTORY_INDEX = f"{LOAD_HISTORY_TABLE}_order"


def refuse_appending_twice(
    conn: DatabaseConnection,
    schema: str,
    load_id: str,
    target: str,
    *,
    found: list[tuple] | None = None,
) -> None:
    """Raise :class:`AlreadyLoadedError` when this load id was finalized before. ``found``:
    the rows of :func:`appended_check` (none where there is no history), when the caller read
    them already."""
    if found is None:
        if not scalar(conn, exists_check(schema)):
            return
        found = execute(conn, appended_check(schema, load_id))
    if found:
        rows, _rejects, finalized_at = found[0]
        raise AlreadyLoadedError(
            f"load {load_id} appended {rows} rows to {target} at {finalized_at}; appending "
            "them again would add them twice, so this run loads nothing. To append the "
            "files again, start a new run (a new load id)",
            rows=rows,
            finalized_at=finalized_at,
        )


def appended_check(schema: str, load_id: str) -> sql.Composable:
    """The query: the load history's record of the load ``load_id`` (rows, rejects, when it
    was finalized; no row: never finalized). Only where the history exists."""
    return sql.load_record(schema, LOAD_HISTORY_TABLE, load_id)


def exists_check(schema: str) -> sql.Composable:
    """The query: whether the load history of ``schema`` exists."""
    return sql.relation_exists(schema, LOAD_HISTORY_TABLE)


def access_check(schema: str) -> sql.Composable:
    """The query: whether the load history of ``schema`` is missing or this role can write it
    (what :func:`refuse_without_access` reads)."""
    return sql.writable_unless_missing(schema, LOAD_HISTORY_TABLE, ("SELECT", "INSERT", "UPDATE"))


def refuse_without_access(
    conn: DatabaseConnection, schema: str, *, writable: bool | None = None
) -> None:
    """Refuse before anything is made when another role's load history cannot be written.
    ``writable``: the answer of :func:`access_check`, when the caller read it already."""
    table = (schema, LOAD_HISTORY_TABLE)
    if writable is None:
        writable = bool(scalar(conn, access_check(schema)))
    if not writable:
        name = sql.qualified(*table).as_string()
        raise LoadRefusedError(
            f"this role cannot write the load history {name} (another role made it): "
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {name} TO the loading role"
        )


def state_check(table: tuple[str, str]) -> sql.Composable:
    """The query :func:`ensure` starts with: whether the history exists, the ordering rule's
    columns it lacks, whether its index exists."""
    return sql.load_history_state(*table, sql.LOAD_HISTORY_ORDER_COLUMNS, HISTORY_INDEX)


def ensure(
    conn: DatabaseConnection,
    table: tuple[str, str],
    *,
    state: Sequence[object] | None = None,
) -> None:
    """The load history with the ordering rule's columns and index: created if missing, and
    a history made by an earlier version upgraded (columns added, index built: once, under
    the creation lock, in the caller's transaction). A role that may not alter another
    role's history gets a refusal naming the statements its owner must run. One query when
    the history is there as it should be (every load after the first); none when the caller
    read that query's row already, earlier in its transaction (``state``: the row of
    :func:`state_check`)."""
    if state is None:
        state = execute(conn, state_check(table))[0]
    exists, missing, index = state
    if exists and not missing and index:
        return
    catalog.create_if_missing(conn, table, sql.create_load_history)
    missing = execute(conn, sql.missing_columns(*table, sql.LOAD_HISTORY_ORDER_COLUMNS))
    index = scalar(conn, sql.relation_exists(table[0], HISTORY_INDEX))
    if not missing and index:
        return
    execute(conn, sql.creation_lock(*table))
    execute(conn, sql.savepoint("pgbulk_history"))
    try:
        if missing:
            execute(conn, sql.upgrade_load_history(*table))
        execute(conn, sql.create_load_history_index(*table, HISTORY_INDEX))
    except Exception as exc:
        if not is_database_error(exc):
            raise
        execute(conn, sql.rollback_to("pgbulk_history"))
        name = sql.qualified(*table).as_string()
        statements = "; ".join(
            s.as_string()
            for s in (
                sql.upgrade_load_history(*table),
                sql.create_load_history_index(*table, HISTORY_INDEX),
            )
        )
        if missing:
            raise LoadRefusedError(
                f"the load history {name} was made by an earlier version and this role cannot "
                f"upgrade it ({exc}); its owner must run: {statements}"
            ) from exc
        log.warning(
            "the load history %s has no index %s and this role cannot build it (%s): the "
            "ordering check reads the whole history; its owner should run: %s",
            name,
            HISTORY_INDEX,
            exc,
            statements,
        )
    execute(conn, sql.release("pgbulk_history"))


@dataclass(frozen=True)
class LedgerTotals:
    """What the ledger's committed partitions add up to (what the history row records), and
    whether the ledger says the load was made visible before (a retry after a commit whose
    acknowledgement was lost); ``staging_exists``: whether the staging table existed when
    they were read (None: not read)."""

    rows: int
    nbytes: int
    rejected: int
    finalized: bool = False
    staging_exists: bool | None = None


def open_visible(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """Open the transaction that makes the load's rows the target's: every statement in it
    waits at most ``lock_timeout``, and it holds the target's advisory lock (one such
    transaction per target at a time). :func:`close_visible` ends it."""
    execute(conn, sql.in_one_round_trip(*opening(plan)))


def opening(plan: LoadPlan) -> list[sql.Composable]:
    """The statements of :func:`open_visible`, for a caller that sends them with its next
    ones (in their round trip: nothing is read in between)."""
    return [
        sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True),
        sql.advisory_xact_lock(plan.target.oid),
    ]


def orders_runs(plan: LoadPlan) -> bool:
    """Whether :func:`refuse_overwriting_newer` reads anything for this load (a mode ordered
    by the run's data interval, and a run)."""
    return plan.mode.ordered_by_run and plan.run is not None


def close_visible(
    conn: DatabaseConnection,
    plan: LoadPlan,
    totals: LedgerTotals,
    parts: Sequence[str] | None = None,
    *,
    before: Sequence[sql.Composable] = (),
) -> None:
    """End the transaction :func:`open_visible` opened: the load noted finalized
    (:func:`record_finalized`), then COMMIT. ``before``: the caller's last statements (each
    one statement; their results are not read), sent first in the same round trip."""
    record_finalized(
        conn, plan, totals.rows, totals.nbytes, totals.rejected, parts, commit=True, before=before
    )


@contextmanager
def visible(
    conn: DatabaseConnection,
    plan: LoadPlan,
    totals: LedgerTotals,
    parts: Sequence[str] | None = None,
) -> Iterator[None]:
    """:func:`open_visible`, the block, :func:`close_visible`; an exception leaves the
    transaction to the caller to roll back."""
    open_visible(conn, plan)
    yield
    close_visible(conn, plan, totals, parts)


def record_finalized(
    conn: DatabaseConnection,
    plan: LoadPlan,
    rows: int,
    nbytes: int,
    rejected: int,
    parts: Sequence[str] | None = None,
    *,
    commit: bool = False,
    before: Sequence[sql.Composable] = (),
) -> None:
    """In the transaction that makes the load visible: note it in the ledger (a retried
    finalize then does nothing) and in the load history (kept after cleanup), with its run,
    data interval and, for ``replace_partitions``, the partitions it swapped (``parts``);
    ``commit``: and commit, in the same round trip as the history's row; ``before``: the
    caller's statements to run first (each one statement), in the round trip of the ledger's
    note."""
    t = plan.target
    table = plan.history_table
    *_before, _marked, ((exists,),) = execute_each(
        conn,
        [
            *before,
            sql.mark_finalized(t.schema, plan.ledger_table, rows, nbytes, rejected),
            sql.relation_exists(*table),
        ],
    )
    if not exists:  # (dropped since prepare?)
        ensure(conn, table)
    run = plan.run
    (execute_then_commit if commit else execute)(
        conn,
        sql.record_load(
            *table,
            load_id=plan.load_id,
            target=t.qualified,
            mode=plan.mode,
            logical_date=plan.logical_date,
            rows=rows,
            rejects=rejected,
            scope=run.scope if run else None,
            run_id=run.run_id if run else None,
            interval=run.interval if run else None,
            parts=parts,
        ),
    )


def refuse_overwriting_newer(
    conn: DatabaseConnection,
    plan: LoadPlan,
    parts: Sequence[str] | None = None,
    *,
    exists: bool | None = None,
) -> None:
    """The ordering rule: a replace, replace_partitions or upsert must not replace rows that
    a load of a later run of the same DAG task put in the target (two runs at once, a
    backfill, a late retry of an old run). Refuse with :class:`OlderRunError`, naming that
    load, unless ``allow_older_run``.

    ``parts``: the partitions a ``replace_partitions`` swaps (only a later load that replaced
    the whole target or one of them counts); None: the whole target. Called early (before the
    work) and again under the target's lock, where an index range scan of the later loads is
    all it costs. Loads without a run (outside Airflow) are not ordered.

    ``exists``: whether the load history exists, when the caller read it already (for the
    early check only: the one under the lock reads it there)."""
    run = plan.run
    if not plan.mode.ordered_by_run or run is None:
        return
    table = plan.history_table
    if exists is None:
        exists = bool(scalar(conn, sql.relation_exists(*table)))
    if not exists:
        return
    newer = execute(
        conn,
        sql.newer_load(
            *table,
            target=plan.target.qualified,
            scope=run.scope,
            interval=run.interval,
            load_id=plan.load_id,
            parts=parts,
        ),
    )
    if not newer:
        return
    load_id, run_id, mode, start, end, finalized_at, their_parts = newer[0]
    what = plan.target.qualified
    if parts is not None and their_parts:
        shared = sorted(set(their_parts) & set(parts))
        what = f"table partition{'s' if len(shared) > 1 else ''} {', '.join(shared)} of {what}"
    if plan.settings.allow_older_run:
        log.warning(
            "Load %s: run %s (data interval %s to %s) replaces rows of %s that the later run "
            "%s (data interval %s to %s, load %s) loaded: allow_older_run is set",
            plan.load_id,
            run.run_id,
            run.interval_start,
            run.interval_end,
            what,
            run_id,
            start,
            end,
            load_id,
        )
        return
    raise OlderRunError(
        f"{what} holds rows of a later run: load {load_id} ({mode}) of run {run_id} of "
        f"{run.scope}, data interval {start} to {end}, finalized at {finalized_at}. This run "
        f"({run.run_id}, data interval {run.interval_start} to {run.interval_end}) is older "
        f"and would replace them with older data, so nothing was changed. To reload the past "
        "on purpose, run it again with allow_older_run=True"
    )


def trim(
    conn: DatabaseConnection, plan: LoadPlan, *, then: Sequence[sql.Composable] = ()
) -> int | None:
    """After the load's commit, in a transaction of its own: delete the loads into the target
    beyond the ``history_keep`` last finalized, except the newest (by data interval) of each
    DAG task and partition. Never fails the load (logged); returns the rows deleted, None
    when it failed.

    :param then: statements to run after it in the same round trip on psycopg 3 (and the
        same implicit transaction: they do not run when it fails), such as the release of
        finalize's session lock."""
    table = plan.history_table
    try:
        found, *_ = execute_each_outside_transaction(  # (its own transaction: one round trip)
            conn,
            [
                sql.trim_load_history(
                    *table, target=plan.target.qualified, keep=plan.settings.history_keep
                ),
                *then,
            ],
        )
        deleted = found[0][0] if found else None
    except Exception:
        rollback_quietly(conn)
        log.warning(
            "Load %s: could not trim the load history %s.%s (needs DELETE on it)%s",
            plan.load_id,
            *table,
            ", or could not run what follows the trim" if then else "",
            exc_info=True,
        )
        return None
    if deleted:
        log.info(
            "Load %s: %d older loads of %s deleted from the load history (history_keep=%d)",
            plan.load_id,
            deleted,
            plan.target.qualified,
            plan.settings.history_keep,
        )
    return int(deleted or 0)
