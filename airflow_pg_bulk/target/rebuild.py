"""``strategy="rebuild"`` for append and upsert: a new table built from the target's rows and
the loaded rows, indexed and constrained as the target is, then swapped in as a replace does.

prepare resolves the strategy (:func:`resolve`: the pure cost model is
:func:`airflow_pg_bulk.plan.planning.choose_strategy`; a rebuild needs a replace's privileges).
finalize (:func:`make_visible`) works in ONE transaction, under ``lock_timeout`` and the
target's advisory lock:

1. ``LOCK target IN EXCLUSIVE MODE``: writers wait from here to the commit; readers go on
   reading the old table;
2. the new table: for an append, staging itself (created LIKE the target by prepare, the
   loaded rows COPYed into it) plus the target's rows; for an upsert, a table LIKE the target
   filled with the target's rows whose key is not loaded and the latest loaded row per key
   (the columns not loaded taken from the row it replaces) — staging, with its source order
   column, stays as it is;
3. the target's indexes and constraints (FKs NOT VALID then VALIDATE), ANALYZE
   (:func:`airflow_pg_bulk.target.build.build_on_staging`);
4. the replace's swap (:func:`airflow_pg_bulk.target.swap.swap_in`: triggers, grants, owner,
   comments, sequences, views, referencing keys), the load noted finalized, COMMIT; then the
   old table dropped in a transaction of its own.

The index builds stay on this one session, one after another (each with parallel maintenance
workers): a build on another session could not see the new table before the commit. An
upsert's new table is the exception: on a big enough target it is created and committed
before the transaction and filled by several sessions at once, one key range each, under the
EXCLUSIVE lock taken by finalize's session, which lets them read the target and keeps its
writers out until the swap (:func:`_fill_at_once`).

A failure anywhere rolls all of it back: the target is as it was, the new table never
existed (or, filled by several sessions, is dropped by the next attempt or by cleanup). See
docs/design.md, "append and upsert: in place or rebuild".
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from typing import Any

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    execute_count,
    read_each,
    scalar,
    server_version,
)
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.plan import LoadPlan, LoadRequest, TargetDefinition, planning
from airflow_pg_bulk.plan.codes import ConstraintKind, Persistence, RowStrategy
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.target import build, history, parallel_builds, staging, swap, upsert
from airflow_pg_bulk.target.history import LedgerTotals

log = logging.getLogger(__name__)

SPLIT_MIN_BYTES = 64 * 1024 * 1024  # target and staging together: below, copy_over is serial
#: key ranges per session of a split copy_over: each range reads all of the target and
#: staging (a seq scan, filtered), so more ranges cost more: 2 sessions x 1 range used 16 %
#: more server CPU than the serial copy, 2 x 2 ranges 34 % (upsert 12 onto 12, PostgreSQL 15)
RANGES_PER_SESSION = 1


def obstacle(conn: DatabaseConnection, target: TargetDefinition) -> str | None:
    """Why the target cannot be rebuilt and swapped (what a replace would refuse), or None."""
    if target.partitioning is not None:
        return "the target is partitioned (its table partitions are loaded one by one instead)"
    owner, _insert, _create, role, _update = execute(conn, sql.loader_privileges(target.oid))[0]
    if not owner:
        return (
            f"a rebuild swaps in a new table, which needs the role {role} to own "
            f"{target.qualified} as a replace does (its owner is {target.owner})"
        )
    if target.unsupported:
        return "; ".join(target.unsupported) + " (a swapped-in table cannot carry it over)"
    return None


def resolve(
    conn: DatabaseConnection,
    request: LoadRequest,
    target: TargetDefinition,
    load_bytes: int,
    load_id: str,
) -> RowStrategy:
    """prepare: the strategy of an append or upsert, by the cost model; logs why (naming the
    load by ``load_id``)."""
    if not request.mode.takes_strategy:
        return RowStrategy.IN_PLACE
    choice = choose(conn, request, target, load_bytes)
    warn = choice.rebuild_blocked and actionable(target)
    (log.warning if warn else log.info)(
        "Load %s: %s into %s: strategy %s (%s)",
        load_id,
        request.mode,
        target.qualified,
        choice.strategy,
        choice.why,
    )
    return choice.strategy


def actionable(target: TargetDefinition) -> bool:
    """Whether a rebuild found not possible is worth a warning: the user can act on it (the
    role does not own the target, an object a swap cannot carry over). A partitioned target
    is loaded partition by partition, as designed: nothing to act on, said at INFO."""
    return target.partitioning is None


def choose(
    conn: DatabaseConnection, request: LoadRequest, target: TargetDefinition, load_bytes: int
) -> planning.StrategyChoice:
    """The strategy of an append or upsert by the cost model, and why (reads only: in
    autocommit when no transaction is open, one round trip)."""
    ((target_bytes, _rows, triggers),) = read_each(conn, [sql.target_size(target.oid)])[0]
    return planning.choose_strategy(
        planning.StrategyInputs(
            mode=request.mode,
            requested=request.strategy,
            load_bytes=load_bytes,
            target_bytes=target_bytes,
            indexes=len(target.indexes),
            foreign_keys=sum(c.kind == ConstraintKind.FOREIGN_KEY for c in target.constraints),
            triggers=triggers,
            obstacle=(None if request.strategy is RowStrategy.IN_PLACE else obstacle(conn, target)),
        )
    )


def create_staging(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """prepare: an append COPYs into the table it swaps in, staging LIKE the target; an upsert
    into staging as an upsert in place does (with its source order column)."""
    if not plan.mode.keyed:
        staging.create_like(conn, plan)
    else:
        upsert.create_staging(conn, plan)


def make_visible(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    totals: LedgerTotals,
    sessions: Sessions | None = None,
) -> tuple[int, int] | None:
    """Build the new table and swap it in, in one transaction (see the module's docstring).
    Returns an upsert's (rows inserted, rows updated); None for an append.

    With ``sessions``, an upsert of a big enough target fills the new table on several
    sessions at once, each a range of the key (:func:`split_sessions`)."""
    t = plan.target
    rows = totals.rows
    execute(conn, sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem))
    limits = parallel_builds.read_limits(conn)  # once: the split and the index builds
    at_once = _split_sessions(conn, plan, sessions, limits)
    if plan.mode.keyed:  # an earlier attempt's, committed by a split copy
        execute(conn, sql.drop_table(t.schema, naming.rebuilt_table(plan.load_id), if_exists=True))
        if at_once > 1:  # the other sessions fill it: it must be theirs to see
            _create_rebuilt(conn, plan)
    conn.commit()
    merged = None
    with clock.phase("copy_over"):
        history.open_visible(conn, plan)
        execute(conn, sql.lock_for_rebuild(t.schema, t.table))
        history.refuse_overwriting_newer(conn, plan)  # an upsert's ordering rule (under lock)
        if not plan.mode.keyed:
            new = _append_rows(conn, plan, rows)
        else:
            new, merged = _upsert_rows(conn, plan, rows, sessions if at_once > 1 else None, at_once)
    # the swap's plan: the new table in staging's place; its ordering check was made above,
    # under the lock the swap keeps
    built = dataclasses.replace(plan, staging_table=new, run=None)
    index_names, constraint_names = build.build_on_staging(
        conn, built, clock, {}, commit=lambda: None, limits=limits
    )
    with clock.phase("swap"):
        swap.swap_in(conn, built, index_names, constraint_names)
        history.close_visible(conn, plan, totals)
    with clock.phase("drop_old"):
        swap.drop_retired(conn, plan)
    if merged:
        log.info(
            "Load %s: upsert into %s rebuilt: %d rows inserted, %d updated",
            plan.load_id,
            t.qualified,
            *merged,
        )
    return merged


def _copied_columns(target: TargetDefinition) -> list[str]:
    return planning.loadable_columns(target)


def _append_rows(conn: DatabaseConnection, plan: LoadPlan, rows: int) -> str:
    """Append: staging (LIKE the target) holds the loaded rows; add the target's to it."""
    t = plan.target
    stage = plan.staging_table
    staging.check_rows(conn, plan, rows)
    if not plan.staging_logged and t.persistence == Persistence.PERMANENT:
        execute(conn, sql.set_logged(t.schema, stage))
    columns = _copied_columns(t)
    execute(
        conn,
        sql.copy_rows_over(
            t.schema,
            stage,
            t.table,
            columns,
            override_identity=staging.overrides_identity(t, columns),
        ),
    )
    return stage


def _create_rebuilt(conn: DatabaseConnection, plan: LoadPlan) -> str:
    t = plan.target
    new = naming.rebuilt_table(plan.load_id)
    execute(
        conn,
        sql.create_staging_like(
            t.schema,
            new,
            t.table,
            logged=t.persistence == Persistence.PERMANENT,
            server_version=server_version(conn),
        ),
    )
    return new


def split_sessions(pool: int, free_connections: int, table_bytes: int, min_bytes: int) -> int:
    """How many sessions fill the new table of an upsert rebuild at once (pure); 1: the one
    serial statement on finalize's own session.

    As many as index builds at once (:func:`parallel_builds.builds_at_once`: one per 4 of
    the server's parallel worker pool, ``min(max_worker_processes, max_parallel_workers)``,
    the only statement of its cores SQL can read), leaving one of the server's
    ``free_connections`` spare; 1 below ``min_bytes`` of target and staging together (the
    sessions' start and the sampled bounds cost more than they save; measured in
    benchmarks/RESULTS-incremental.md, "copy_over on several sessions")."""
    if table_bytes < min_bytes:
        return 1
    wanted = parallel_builds.builds_at_once(pool)
    return max(1, min(wanted, free_connections - 1))


def _split_sessions(
    conn: DatabaseConnection,
    plan: LoadPlan,
    sessions: Sessions | None,
    limits: parallel_builds.ParallelLimits,
) -> int:
    """:func:`split_sessions` with the server's settings (``limits``) and the tables' sizes."""
    if sessions is None or not plan.mode.keyed:
        return 1
    t = plan.target
    target_bytes = execute(conn, sql.target_size(t.oid))[0][0]
    staging_bytes = scalar(conn, sql.relation_size(t.schema, plan.staging_table))
    return split_sessions(
        limits.pool,
        scalar(conn, sql.free_connections()),
        target_bytes + staging_bytes,
        SPLIT_MIN_BYTES,
    )


def _upsert_rows(
    conn: DatabaseConnection,
    plan: LoadPlan,
    rows: int,
    sessions: Sessions | None = None,
    at_once: int = 1,
) -> tuple[str, tuple[int, int]]:
    """Upsert: a new table LIKE the target = its rows whose key is not loaded + the latest
    loaded row per key. Returns the new table and (rows inserted, rows updated).

    With ``sessions`` (the new table created and committed before): ``at_once`` sessions
    fill it at once, each :data:`RANGES_PER_SESSION` ranges of the key's first column in
    turn (:func:`_fill_at_once`)."""
    t = plan.target
    spec = plan.upsert
    if spec is None:
        raise ValueError(f"load {plan.load_id} is an upsert without a key in its plan")
    if not plan.staging_logged:
        staging.check_rows(conn, plan, rows)
    if spec.on_duplicate_key.refuses_duplicates:
        upsert.refuse_duplicates(conn, plan)
    before = scalar(conn, sql.count_rows(t.schema, t.table))
    if sessions is None:
        new = _create_rebuilt(conn, plan)
        kept, loaded = _fill_range(conn, plan, None)
    else:
        new = naming.rebuilt_table(plan.load_id)
        kept, loaded = _fill_at_once(conn, plan, sessions, at_once)
    updated = before - kept
    if _not_loaded(plan):
        return new, (loaded, updated)  # the inserts counted apart from the updates
    return new, (loaded - updated, updated)


def _not_loaded(plan: LoadPlan) -> list[str]:
    return [c for c in _copied_columns(plan.target) if c not in plan.columns]


def _fill_range(
    conn: DatabaseConnection, plan: LoadPlan, within: sql.KeyRange | None
) -> tuple[int, int]:
    """Fill the new table with the rows of one key range (None: all): the target's rows
    whose key is not loaded, then the latest loaded row per key. Returns (target rows kept,
    loaded rows inserted) — with columns not loaded, only the loaded rows whose key is not
    in the target (the others counted as updates by the caller)."""
    t = plan.target
    spec = plan.upsert
    assert spec is not None
    stage = plan.staging_table
    new = naming.rebuilt_table(plan.load_id)
    by_name = {c.name: c for c in t.columns}
    # NULL matches NULL only where the key's index says NULLs are not distinct
    nullable = [] if spec.key_may_be_null else [c for c in spec.key if not by_name[c].not_null]
    columns = _copied_columns(t)
    kept = execute_count(
        conn,
        sql.copy_rows_over(
            t.schema,
            new,
            t.table,
            columns,
            override_identity=staging.overrides_identity(t, columns),
            unless_loaded=(stage, spec.key, nullable),
            within=within,
        ),
    )
    latest: Any = sql.latest_loaded(
        t.schema, stage, plan.columns, spec.key, key_may_be_null=spec.key_may_be_null
    )
    if within is not None:
        latest = sql.rows_in_key_range(latest, within)
    others = _not_loaded(plan)

    def insert(source: Any, **how: Any) -> int:
        return execute_count(
            conn,
            sql.insert_loaded_rebuild(t.schema, new, t.table, source, plan.columns, **how),
        )

    if not others:
        loaded = insert(latest, override_identity=staging.overrides_identity(t, plan.columns))
        return kept, loaded
    # columns not loaded: an updated row keeps its own, an inserted row gets the defaults
    insert(
        latest,
        kept=others,
        match=(spec.key, nullable),
        override_identity=staging.overrides_identity(t, columns),
    )
    drawn = [
        (s.column, s.schema, s.name)
        for s in t.sequences
        if s.kind.of_identity_column and s.column not in plan.columns
    ]
    inserted = insert(
        sql.loaded_not_in_target(t.schema, t.table, latest, spec.key, nullable),
        drawn=drawn,
        override_identity=staging.overrides_identity(t, plan.columns),
    )
    return kept, inserted


def _fill_at_once(
    conn: DatabaseConnection, plan: LoadPlan, sessions: Sessions, at_once: int
) -> tuple[int, int]:
    """:func:`_fill_range` of each key range on ``at_once`` sessions of their own, each
    range committed there; returns the sums. ``conn`` holds the target's EXCLUSIVE lock:
    no writer changes it until the swap, so the sessions, which start reading after the
    lock was granted, read the rows the swap replaces. The ranges' bounds come from a
    sample of the target and staging (:func:`sql.key_bounds`). A failure, a timeout or a
    kill stops every session (:func:`parallel_builds.run_jobs`) and is raised: the caller
    rolls back, the target is untouched, and the new table, committed half-filled, is
    dropped by the next attempt or by cleanup (its name is the load's)."""
    t = plan.target
    spec = plan.upsert
    assert spec is not None
    column = spec.key[0]
    parts = at_once * RANGES_PER_SESSION
    bounds = scalar(conn, sql.key_bounds(t.schema, [t.table, plan.staging_table], column, parts))
    edges: list[str | None] = [None, *dict.fromkeys(bounds or []), None]  # each bound once
    ranges = [sql.KeyRange(column, low, high) for low, high in itertools.pairwise(edges)]
    counts: list[tuple[int, int]] = []

    def fill(within: sql.KeyRange, session: DatabaseConnection) -> None:
        counts.append(_fill_range(session, plan, within))
        session.commit()

    log.info(
        "Load %s: filling the new table of %s on %d sessions at once, %d ranges of %s",
        plan.load_id,
        t.qualified,
        at_once,
        len(ranges),
        column,
    )
    # finalize's session waits idle in its transaction meanwhile, holding the lock: a server's
    # idle_in_transaction_session_timeout must not end it
    execute(conn, sql.set_config("idle_in_transaction_session_timeout", "0", local=True))
    setup = [sql.set_config("lock_timeout", plan.settings.lock_timeout)]
    parallel_builds.run_jobs(sessions, [functools.partial(fill, r) for r in ranges], at_once, setup)
    return sum(c[0] for c in counts), sum(c[1] for c in counts)
