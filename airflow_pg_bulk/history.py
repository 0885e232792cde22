"""The load history: one row per finalized load in ``pgbulk_loads`` (in the target's schema).

Written in the transaction that makes a load visible, and kept after cleanup, it is what lets
a cleared, finished append refuse to append its rows twice, and a replace refuse to overwrite
the rows of a load with a later logical date. See README, "Retries, clearing tasks".
"""

from __future__ import annotations

from typing import Any

from airflow_pg_bulk import catalog, sql
from airflow_pg_bulk.driver import execute, scalar
from airflow_pg_bulk.errors import AlreadyLoadedError, LoadRefusedError
from airflow_pg_bulk.plan import LOAD_HISTORY_TABLE, LoadPlan


def refuse_appending_twice(conn: Any, schema: str, load_id: str, target: str) -> None:
    """Raise :class:`AlreadyLoadedError` when this load id was finalized before."""
    table = (schema, LOAD_HISTORY_TABLE)
    if not scalar(conn, sql.relation_exists(*table)):
        return
    found = execute(conn, sql.load_record(*table, load_id))
    if found:
        rows, _rejects, finalized_at = found[0]
        raise AlreadyLoadedError(
            f"load {load_id} appended {rows} rows to {target} at {finalized_at}; appending "
            "them again would add them twice, so this run loads nothing. To append the "
            "files again, start a new run (a new load id)",
            rows=rows,
            finalized_at=finalized_at,
        )


def refuse_without_access(conn: Any, schema: str) -> None:
    """Refuse before anything is made when another role's load history cannot be written."""
    table = (schema, LOAD_HISTORY_TABLE)
    if not scalar(conn, sql.relation_exists(*table)):
        return
    if not scalar(conn, sql.table_privileges(*table, "SELECT, INSERT, UPDATE")):
        name = sql.qualified(*table).as_string()
        raise LoadRefusedError(
            f"this role cannot write the load history {name} (another role made it): "
            f"GRANT SELECT, INSERT, UPDATE ON {name} TO the loading role"
        )


def record_finalized(conn: Any, plan: LoadPlan, rows: int, nbytes: int, rejected: int) -> None:
    """In the transaction that makes the load visible: note it in the ledger (a retried
    finalize then does nothing) and in the load history (kept after cleanup)."""
    t = plan.target
    execute(conn, sql.mark_finalized(t.schema, plan.ledger_table, rows, nbytes, rejected))
    table = plan.history_table
    catalog.create_if_missing(conn, table, sql.create_load_history)  # (dropped since prepare?)
    execute(
        conn,
        sql.record_load(
            *table,
            load_id=plan.load_id,
            target=t.qualified,
            mode=plan.mode,
            logical_date=plan.logical_date,
            rows=rows,
            rejects=rejected,
        ),
    )


def refuse_overwriting_newer(conn: Any, plan: LoadPlan) -> None:
    """A replace must not overwrite the rows of a load whose logical date is later (two runs
    of one DAG at once, or a late retry of an old run): refuse, naming that load. (An append
    or upsert rebuilt by the same swap keeps every row of the target: nothing to refuse.)"""
    table = plan.history_table
    if plan.mode != "replace" or plan.logical_date is None:
        return
    if not scalar(conn, sql.relation_exists(*table)):
        return
    newer = execute(
        conn,
        sql.newer_load(
            *table,
            target=plan.target.qualified,
            logical_date=plan.logical_date,
            load_id=plan.load_id,
        ),
    )
    if newer:
        load_id, mode, logical_date, finalized_at = newer[0]
        raise LoadRefusedError(
            f"{plan.target.qualified} holds the rows of a later run: load {load_id} ({mode}, "
            f"logical date {logical_date}) was finalized at {finalized_at}; this load "
            f"(logical date {plan.logical_date}) would replace them with older data, so "
            "nothing was swapped. Run the DAG with max_active_runs=1 to keep its runs in order"
        )
