"""``mode="replace"`` of a plain table: build on staging what the target has, then swap it in.

Staging is made LIKE the target; finalize builds the captured indexes and constraints on it
(each step commits on its own, and a retry skips what is built), ANALYZE, then swaps it in for
the target in one short transaction that carries over triggers, grants, owner, comments,
sequences, dependent views and referencing foreign keys (:mod:`airflow_pg_bulk.target.swap`).
See docs/design.md, "finalize".
"""

from __future__ import annotations

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, scalar
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.plan.codes import Persistence
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.target import build, history, staging, swap
from airflow_pg_bulk.target.history import LedgerTotals


def create_staging(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """prepare: staging LIKE the target (:func:`airflow_pg_bulk.target.staging.create_like`)."""
    staging.create_like(conn, plan)


def make_visible(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    totals: LedgerTotals,
    sessions: Sessions | None = None,
) -> None:
    """Build on staging what the target has; steps already done by an earlier attempt of this
    finalize are skipped, so a retry goes on where the last one stopped. Then the swap, and
    the old table dropped."""
    t = plan.target
    stage = plan.staging_table
    # early, before the index builds; again in the swap
    history.refuse_overwriting_newer(conn, plan)
    built = staging.existing_objects(conn, plan)
    execute(conn, sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem))
    if ("persistence", Persistence.UNLOGGED) in built:
        if t.persistence == Persistence.PERMANENT:
            with clock.phase("set_logged"):
                execute(conn, sql.set_logged(t.schema, stage))
                conn.commit()
        # Logged now (or never: an unlogged target): check no crash emptied staging before.
        staged = scalar(conn, sql.count_rows(t.schema, stage))
        conn.commit()
        staging.check_count(conn, plan, staged, totals.rows)
    index_names, constraint_names = build.build_on_staging(
        conn, plan, clock, built, sessions=sessions
    )
    with clock.phase("swap"), history.visible(conn, plan, totals):
        swap.swap_in(conn, plan, index_names, constraint_names)
    with clock.phase("drop_old"):
        swap.drop_retired(conn, plan)
