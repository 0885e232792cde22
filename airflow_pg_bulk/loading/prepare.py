"""The prepare step: validate the target, the source and the columns; plan the load; create
staging (the way :func:`airflow_pg_bulk.target.strategies.for_plan` chooses) and the ledger.
prepare does the I/O around :func:`airflow_pg_bulk.plan.planning.build_plan`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import DatabaseConnection, rollback_quietly, rows_of_each
from airflow_pg_bulk.loading import cleanup, create_target, ledger, survey
from airflow_pg_bulk.plan import LoadPlan, LoadRequest, RunOrder, planning
from airflow_pg_bulk.target import catalog, history, rebuild, strategies

log = logging.getLogger(__name__)


def prepare(
    conn: DatabaseConnection,
    request: LoadRequest,
    load_id: str,
    *,
    logical_date: str | None = None,
    run: RunOrder | None = None,
    store_pieces: bool = False,
) -> LoadPlan:
    """Validate the target, the source and the columns; create staging and the ledger.

    Re-runnable: when an earlier attempt for the same ``load_id`` made a ledger for the same
    plan (same files, cut and target) and the load is not finalized, staging and the ledger
    are kept, with every partition committed in them; otherwise that attempt's tables are
    dropped and made anew. An append this ``load_id`` finalized before is refused with
    :class:`AlreadyLoadedError` (its rows would be added twice). Nothing is changed on the
    target. Returns the plan for the other steps.

    :param logical_date: the DAG run's logical date (ISO 8601), recorded with the load.
    :param run: the DAG run and its data interval (under Airflow): a replace, replace_partitions
        or upsert refuses to replace rows a later run of the same DAG task loaded (a replace or
        upsert here already, before anything is made; see :mod:`airflow_pg_bulk.target.history`).
    :param store_pieces: also write each partition's pieces into the load's pieces table
        (:func:`airflow_pg_bulk.loading.ledger.read_pieces`), in the transaction that makes the
        ledger: for steps that run in other processes and get only the plan without pieces
        (Airflow's COPY and finalize tasks). The in-process runner keeps the whole plan in
        memory and needs none."""
    naming.check_load_id(load_id)
    schema, table = naming.split_name(request.table)
    resumed = False
    try:
        if request.create_target:
            create_target.create_target_if_missing(conn, request, load_id, schema, table)
        found = survey.survey(
            conn,
            request,
            schema,
            table,
            abandoned_after=request.settings.abandoned_after,
            load_id=load_id,
        )
        target, source_format, files, matched = (
            found.target,
            found.source.format,
            found.files,
            found.matched,
        )
        columns, key, total = found.columns, found.key, found.total_bytes
        max_age = cleanup.interval_seconds(
            conn, "abandoned_after", request.settings.abandoned_after, seconds=found.abandoned_after
        )
        if not request.mode.replaces_rows:
            history.refuse_appending_twice(
                conn, schema, load_id, target.qualified, found=found.appended
            )
        conn.rollback()
        strategy = rebuild.resolve(conn, request, target, total, load_id)
        conn.rollback()
        partitions = source_format.cut(files, request.partition_count(total), matched)
        # a partitioned target: staged in one plain table, or partitioned like it (chosen
        # here, once, from its number of leaves and the load's size; every step follows it)
        layout = planning.choose_staging_layout(request, target, found.leaves, total)
        plan = planning.build_plan(
            request,
            target,
            load_id,
            columns=columns,
            partitions=partitions,
            source_bytes=total,
            logical_date=logical_date,
            upsert=key,
            file_order=[f.path for f in files],
            strategy=strategy,
            run=run,
            database=matched.database,
            staging_layout=layout,
        )
        if plan.mode.ordered_over_whole_target:  # the whole target: refused before any work
            history.refuse_overwriting_newer(conn, plan, exists=found.history_exists)
        digest = plan.digest
        before = _read_before_making(conn, plan, store_pieces)
        resumed = ledger.can_resume(conn, plan, digest, found=before.resume)
        if not resumed:
            cleanup.drop_run_tables(conn, schema, load_id, names=before.run_tables)
            strategies.for_plan(plan).create_staging(conn, plan)
        if plan.reject_table:
            catalog.create_if_missing(conn, plan.reject_table, sql.create_reject_table)
        history.ensure(conn, plan.history_table, state=before.history)
        # the transaction's last statements go with its COMMIT (one round trip where two were)
        if not resumed:
            ledger.create(conn, plan, digest, prepared_at=before.now, commit=not store_pieces)
        if store_pieces:  # (not resumed: drop_run_tables dropped the earlier pieces, if any)
            pieces = before.pieces if resumed else (None, False)
            ledger.store_pieces(conn, plan, digest, found=pieces, commit=True)
        conn.commit()  # (nothing left to send when the last statements committed)
    except BaseException:
        rollback_quietly(conn)
        raise
    cleanup.drop_abandoned(conn, plan, ledgers=before.ledgers, max_age=max_age)
    log.info(
        "Load %s: prepared into %s (%s%s): %s in %d COPY streams, staging %s (%s%s)%s",
        load_id,
        target.qualified,
        request.mode,
        ", rebuild" if plan.rebuilds else "",
        found.source.reads(len(files), total),
        len(partitions),
        plan.staging_table,
        "logged" if plan.staging_logged else "unlogged",
        f", partitioned like the target: {layout.why}" if layout.by_partition else "",
        "; kept from an earlier attempt, with its committed COPY streams" if resumed else "",
    )
    return plan


@dataclass(frozen=True)
class _Before:
    """What prepare reads before it makes staging and the ledger (see _read_before_making)."""

    resume: tuple[str | None, bool]  # for ledger.can_resume
    run_tables: list[str]  # for cleanup.drop_run_tables
    now: float  # the ledger's prepared_at
    history: tuple  # for history.ensure
    ledgers: list[tuple[str, str | None]]  # for cleanup.drop_abandoned
    pieces: tuple[str | None, bool] | None  # for ledger.store_pieces (when asked to store)


def _read_before_making(conn: DatabaseConnection, plan: LoadPlan, store_pieces: bool) -> _Before:
    """In one statement, first in the transaction that makes staging and the ledger: set
    ``lock_timeout`` (its DDL locks the target (LIKE) and any leftovers: wait no longer than
    that), and read what an earlier attempt left (its ledger's digest, staging, every table of
    this load), the server's clock (``now()``: the transaction's start, as the ledger's
    comment has it), the load history's state and every load's ledger in the schema (for
    drop_abandoned, after the commit) and, with ``store_pieces``, what the pieces table of an
    earlier attempt was made for. Reads only: no lock taken."""
    schema = plan.target.schema
    queries = [
        sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True),
        *ledger.resume_checks(plan),
        cleanup.run_tables_check(schema, plan.load_id),
        sql.now_epoch(),
        history.state_check(plan.history_table),
        cleanup.ledgers_check(schema),
    ]
    if store_pieces:
        queries += ledger.pieces_checks(plan)
    rows = rows_of_each(conn, queries)
    _, ((digest,),), ((staging,),), tables, ((now,),), (state,), ledgers, *pieces = rows
    return _Before(
        resume=(digest, bool(staging)),
        run_tables=[name for (name,) in tables],
        now=float(now),
        history=state,
        ledgers=list(ledgers),
        pieces=(pieces[0][0][0], bool(pieces[1][0][0])) if pieces else None,
    )
