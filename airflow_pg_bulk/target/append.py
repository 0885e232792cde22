"""``mode="append"`` in place: one ``INSERT ... SELECT`` from staging into the target, in the
transaction that makes the load visible (under ``lock_timeout`` and the target's advisory lock).
"""

from __future__ import annotations

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute_count
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.target import history, staging, statistics
from airflow_pg_bulk.target.history import LedgerTotals


def create_staging(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """prepare: staging with the loaded columns
    (:func:`airflow_pg_bulk.target.staging.create_columns`)."""
    staging.create_columns(conn, plan)


def make_visible(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    totals: LedgerTotals,
    sessions: Sessions | None = None,
) -> None:
    """Insert the staged rows into the target in one transaction; then ANALYZE it when the
    rows are enough of it (:func:`airflow_pg_bulk.target.statistics.after_in_place`)."""
    t = plan.target
    with clock.phase("insert"), history.visible(conn, plan, totals):
        inserted = execute_count(
            conn,
            sql.insert_from_staging(
                t.schema,
                t.table,
                plan.staging_table,
                plan.columns,
                override_identity=staging.overrides_identity(t, plan.columns),
            ),
        )
        staging.check_count(conn, plan, inserted, totals.rows)
    statistics.after_in_place(conn, plan, clock, totals.rows)
