"""``mode="upsert"``: the database work around the pure planning in
:func:`airflow_pg_bulk.plan.planning.upsert_spec`.

prepare reads the target's unique indexes (the key must match one) and gives staging a source
order column; each COPY task sets its piece's ordinal (``SET LOCAL pgbulk.piece``) before its
COPY; finalize merges staging into the target in place, in one transaction: one
``INSERT … ON CONFLICT (key) DO UPDATE`` from staging deduplicated on the key, the row latest
in source order winning (or, with ``on_duplicate_key="fail"``, a refusal naming a repeated
key). See docs/design.md, "upsert".
"""

from __future__ import annotations

import logging

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, server_version
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.plan import LoadPlan, TargetDefinition
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.plan.planning import UniqueIndex
from airflow_pg_bulk.target import catalog, history, staging, statistics, violations
from airflow_pg_bulk.target.history import LedgerTotals

log = logging.getLogger(__name__)


def unique_indexes(conn: DatabaseConnection, target: TargetDefinition) -> list[UniqueIndex]:
    """The target's valid unique indexes (for
    :func:`~airflow_pg_bulk.plan.planning.upsert_spec`)."""
    rows = execute(conn, sql.unique_indexes(target.oid, server_version(conn)))
    return [
        UniqueIndex(
            name,
            tuple(columns),
            primary=primary,
            constraint=constraint,
            deferrable=deferrable,
            partial=partial,
            nulls_not_distinct=nulls_not_distinct,
        )
        for name, columns, primary, constraint, deferrable, partial, nulls_not_distinct in rows
    ]


def add_source_order(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """Give staging its source order column and the sequence behind it (dropped with it)."""
    t = plan.target
    sequence = naming.source_order_sequence(plan.load_id)
    unlogged = not plan.staging_logged and server_version(conn) >= 150000
    execute(conn, sql.create_source_order_sequence(t.schema, sequence, unlogged=unlogged))
    execute(conn, sql.add_source_order(t.schema, plan.staging_table, sequence))
    execute(
        conn,
        sql.sequence_owned_by_column(t.schema, sequence, plan.staging_table, sql.SOURCE_ORDER),
    )


def create_staging(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """prepare: staging with the loaded columns
    (:func:`airflow_pg_bulk.target.staging.create_columns`) and its source order column."""
    staging.create_columns(conn, plan)
    if plan.upsert:
        add_source_order(conn, plan)


def make_visible(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    totals: LedgerTotals,
    sessions: Sessions | None = None,
) -> tuple[int, int]:
    """Merge staging into the target in one transaction, under ``lock_timeout`` and the
    target's advisory lock, noting the load finalized in the same transaction. Returns
    (rows inserted, rows updated)."""
    t = plan.target
    rows = totals.rows
    spec = plan.upsert
    if spec is None:
        raise ValueError(f"load {plan.load_id} is an upsert without a key in its plan")
    latest_wins = spec.on_duplicate_key.latest_wins
    with clock.phase("upsert"), history.visible(conn, plan, totals):
        # the ordering rule, serialised with the other loads of the target by that lock
        history.refuse_overwriting_newer(conn, plan)
        if not plan.staging_logged:
            staging.check_rows(conn, plan, rows)
        if not latest_wins:
            refuse_duplicates(conn, plan)
        # a partitioned target: partition by partition (RETURNING cannot read xmax through
        # the parent), each partition the rows go to taking the staged rows its partition
        # constraint admits; the others are not read
        targets: list[tuple[str, str | None]] = [(t.table, None)]
        if t.partitioning is not None:
            touched = catalog.partitions_of_rows(conn, t, plan.staging_table, plan.columns)
            leaves = execute(conn, sql.leaf_partitions(t.oid, touched))
            bounds = [constraint for _s, _n, _kind, _bound, constraint in leaves]
            _refuse_unrouted(conn, plan, bounds)
            targets = [(name, constraint) for _s, name, _kind, _bound, constraint in leaves]
        inserted = updated = 0
        for table, where in targets:
            drawn = [] if where is None else _drawn(conn, plan, table)
            added, changed = execute(
                conn,
                sql.upsert_from_staging(
                    t.schema,
                    table,
                    plan.staging_table,
                    plan.columns,
                    spec.key,
                    latest_wins=latest_wins,
                    key_may_be_null=spec.key_may_be_null,
                    override_identity=spec.override_identity,
                    where=where,
                    drawn=drawn,
                ),
            )[0]
            inserted, updated = inserted + added, updated + changed
    log.info(
        "Load %s: upsert into %s on key (%s): %d rows inserted, %d updated, %d loaded rows "
        "superseded by a later row with the same key",
        plan.load_id,
        t.qualified,
        ", ".join(spec.key),
        inserted,
        updated,
        rows - inserted - updated,
    )
    statistics.after_in_place(conn, plan, clock, inserted + updated)
    return inserted, updated


def _drawn(conn: DatabaseConnection, plan: LoadPlan, partition: str) -> list[tuple[str, str, str]]:
    """The parent's identity columns not loaded that ``partition`` does not number itself
    (before PostgreSQL 17 a partition has no identity of its parent's): (column, sequence
    schema, name), drawn from the parent's sequence by the merge."""
    settings = execute(conn, sql.column_settings(plan.target.schema, partition))
    numbered = {name for name, identity, *_ in settings if identity}
    return [
        (s.column, s.schema, s.name)
        for s in plan.target.sequences
        if s.kind.of_identity_column and s.column not in plan.columns and s.column not in numbered
    ]


def refuse_duplicates(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """``on_duplicate_key="fail"``: refuse a key loaded more than once (the transaction
    rolled back), naming it and, read again from the source, where it is loaded twice."""
    t = plan.target
    spec = plan.upsert
    assert spec is not None
    found = execute(
        conn,
        sql.duplicate_keys(
            t.schema, plan.staging_table, spec.key, key_may_be_null=spec.key_may_be_null
        ),
    )
    if not found:
        return
    *values, count, keys = found[0]
    conn.rollback()
    shown = ", ".join(f"{c}={v!r}" for c, v in zip(spec.key, values, strict=True))
    where = violations.locate_repeated_key(conn, plan, list(spec.key))
    if where.rows:
        lines = " and ".join(f"{path} line {line}" for path, line in where.rows)
        located = f"; in source order, the first key loaded twice is at {lines}"
    else:
        located = f"; {where.describe()}"
    raise BadDataError(
        f"upsert into {t.qualified} with on_duplicate_key='fail': the key ({shown}) is loaded "
        f"{count} times"
        + (f" ({keys} keys are loaded more than once)" if keys > 1 else "")
        + located
        + f". Nothing of this load reached {t.qualified}; use on_duplicate_key='last' to keep "
        "the row latest in source order"
    )


def _refuse_unrouted(conn: DatabaseConnection, plan: LoadPlan, bounds: list[str | None]) -> None:
    """A partitioned target: refuse a staged row that none of the partitions with these
    constraints (``bounds``: every partition a staged row can go to) takes, naming it and,
    read again from the source (:func:`airflow_pg_bulk.target.violations.locate_failing`), its file
    and line (only once such a row is found: nothing more happens before)."""
    t = plan.target
    if any(b is None for b in bounds):  # a lone DEFAULT partition takes every row
        return
    constraints = [b for b in bounds if b]
    if not execute(conn, sql.unrouted_row(t.schema, plan.staging_table, plan.columns, constraints)):
        return
    # the first such row in source order: the one the source's second reading finds first
    row = execute(
        conn,
        sql.unrouted_row(
            t.schema, plan.staging_table, plan.columns, constraints, in_source_order=True
        ),
    )[0][0]
    conn.rollback()
    raise violations.in_no_partition(
        conn,
        plan,
        constraints,
        row,
        context=f"upsert into the partitioned {t.qualified}: ",
        named="it",
    )
