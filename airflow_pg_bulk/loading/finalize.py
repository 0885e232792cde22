"""Finalize: check the ledger, then make the staged rows the target's.

Under the load's lock (one finalize of a load at a time): misaligned partitions loaded again
(:mod:`airflow_pg_bulk.loading.repair`), the ledger added up
(:func:`airflow_pg_bulk.loading.ledger.totals`), then the strategy
:func:`airflow_pg_bulk.target.strategies.for_plan` chooses makes the rows visible; a
constraint broken on the way is told with the source line of the row that breaks it
(:mod:`airflow_pg_bulk.target.violations`). A finalize retried after its commit does
nothing. See docs/design.md, "finalize".
"""

from __future__ import annotations

import logging

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import translate
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute_outside_transaction,
    rollback_quietly,
    server_error,
)
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.errors import ConstraintViolationError
from airflow_pg_bulk.loading import changes, copy, ledger, repair
from airflow_pg_bulk.loading.copy import ProgressCallback
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.plan.figures import LoadSummary, PhaseClock
from airflow_pg_bulk.target import history, strategies, violations
from airflow_pg_bulk.target.strategies import Merged

log = logging.getLogger(__name__)


def finalize(
    conn: DatabaseConnection, plan: LoadPlan, sessions: Sessions | None = None
) -> LoadSummary:
    """Check every partition is in the ledger, then make the staged rows the target's, the
    way :func:`airflow_pg_bulk.target.strategies.for_plan` chooses (replace: build on staging
    and swap it in; append: insert in place; upsert: merge in place; a rebuild; a partitioned
    target: partition by partition).

    :param sessions: where a replace opens extra sessions to build several indexes at once
        (:mod:`airflow_pg_bulk.target.parallel_builds`); None: one after another on ``conn``."""
    clock = PhaseClock()
    t = plan.target
    locked = False
    described = plan  # errors are told with its names (a partitioned load's, once routed)
    merged: Merged | None = None  # upsert: rows inserted, updated
    before: changes.Before | None = None  # for the summary of what changed
    try:
        with clock.phase("check"):
            # for the whole session: every statement of finalize (the DDL on staging too, which
            # a killed earlier attempt's backend may still lock) waits at most lock_timeout
            # (both session-level: in autocommit, one round trip)
            execute_outside_transaction(
                conn,
                sql.in_one_round_trip(
                    sql.set_config("lock_timeout", plan.settings.lock_timeout),
                    sql.load_lock(plan.load_id),
                ),
            )
            locked = True
            repair.repair(conn, plan)  # ranges cut at a wrongly guessed record start
            totals = ledger.totals(conn, plan)
        rows, nbytes, rejected = totals.rows, totals.nbytes, totals.rejected
        if totals.finalized:
            log.info(
                "Load %s: finalized before (the last attempt's commit went through): "
                "%d rows are in %s; nothing to do",
                plan.load_id,
                rows,
                t.qualified,
            )
        else:
            strategy = strategies.for_plan(plan)
            described = strategy.route(conn, plan, clock, totals)
            before = changes.read_before(conn, described)
            merged = strategy.make_visible(conn, described, clock, totals, sessions)
        if not totals.finalized:  # after the commit, off the critical path; never fails the load
            # with the release of the finalize lock, in one round trip (else released below)
            unlock = sql.load_lock(plan.load_id, release=True)
            if history.trim(conn, plan, then=[unlock]) is not None:
                locked = False
    except BaseException as exc:
        rollback_quietly(conn)
        error = translate.finalize_error(exc, described)
        if isinstance(error, ConstraintViolationError):  # find the row: re-read the source
            found = violations.locate(conn, described, server_error(exc))
            error = translate.finalize_error(exc, described, found)
        raise error from exc
    finally:
        if locked:
            _release_load_lock(conn, plan)
    summary = LoadSummary(
        t.qualified,
        plan.mode,
        rows,
        nbytes,
        len(plan.partitions),
        clock.seconds,
        rejected,
        records=rows + rejected,  # each partition's accounting checked rows + rejects = records
        inserted=merged[0] if merged else None,
        updated=merged[1] if merged else None,
        **changes.summary_fields(described, before, rows, merged[0] if merged else None),
        reject_table=".".join(plan.reject_table) if plan.reject_table else None,
    )
    log.info(
        "Load %s: finalized: %d rows loaded into %s (%s)%s; finalize phases: %s",
        plan.load_id,
        rows,
        t.qualified,
        plan.mode,
        "".join(f"; {line}" for line in summary.what_changed(most=10)),
        ", ".join(f"{name} {secs:.2f} s" for name, secs in clock.seconds.items()),
    )
    return summary


def _release_load_lock(conn: DatabaseConnection, plan: LoadPlan) -> None:
    try:
        execute_outside_transaction(conn, sql.load_lock(plan.load_id, release=True))
    except Exception:  # the connection may be gone: the session's end released the lock
        log.debug("releasing the finalize lock failed", exc_info=True)


def complete_and_finalize(
    conn: DatabaseConnection,
    plan: LoadPlan,
    progress: ProgressCallback | None = None,
    sessions: Sessions | None = None,
) -> LoadSummary:
    """COPY the partitions the ledger lacks, then :func:`finalize`.

    The COPY tasks normally leave nothing to do here. A partition is missing when prepare ran
    again after they committed — the run's tasks were cleared in part (clearing finalize
    clears its setup, prepare, and its teardown, cleanup, but not the COPY tasks) — and the
    staging those COPY tasks filled was dropped. Each missing partition is loaded here,
    exactly once (the ledger's claim), before anything becomes visible.

    :param sessions: extra sessions for building several indexes at once (see
        :func:`finalize`)."""
    for index in ledger.missing_partitions(conn, plan):
        log.warning(
            "Load %s: COPY stream %d is not in the ledger (prepare ran again since its COPY "
            "task committed); loading it in finalize",
            plan.load_id,
            index,
        )
        copy.copy_partition(conn, plan, index, progress)
    return finalize(conn, plan, sessions)
