"""Finalize: check the ledger, then make the staged rows the target's.

replace: build the captured indexes and constraints on staging (each step commits on its own,
and a retry skips what is built), ANALYZE, then swap staging in for the target in one short
transaction that carries over triggers, grants, owner, comments, sequences, dependent views
and referencing foreign keys. append: one ``INSERT ... SELECT`` from staging. Every statement
runs under ``lock_timeout``; the swap and the insert under an advisory lock on the target too;
a finalize retried after its commit does nothing. See docs/design.md, "finalize".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow_pg_bulk import (
    catalog,
    fanout,
    history,
    locking,
    naming,
    offenders,
    partitioned,
    realign,
    rebuild,
    sql,
    statistics,
    translate,
    upsert,
)
from airflow_pg_bulk.driver import execute, execute_count, rollback_quietly, scalar, server_error
from airflow_pg_bulk.errors import (
    BadDataError,
    ConstraintViolationError,
    IncompleteLoadError,
    LoadRefusedError,
)
from airflow_pg_bulk.plan import ConstraintDef, LoadPlan, TargetDefinition, planning
from airflow_pg_bulk.plan.codes import ConstraintKind, Identity, Persistence, TriggerState
from airflow_pg_bulk.plan.figures import LoadSummary, PhaseClock

log = logging.getLogger(__name__)


def finalize(conn: Any, plan: LoadPlan, sessions: fanout.Sessions | None = None) -> LoadSummary:
    """Check every partition is in the ledger, then make the staged rows the target's.

    replace: build the captured indexes and constraints on staging, restore triggers, grants,
    owner and comments, ANALYZE, and swap it in for the target in one short transaction; the
    old table is dropped right after, in a transaction of its own.
    append: insert the staged rows into the target in one transaction.

    :param sessions: where a replace opens extra sessions to build several indexes at once
        (:mod:`airflow_pg_bulk.fanout`); None: one after another on ``conn``."""
    clock = PhaseClock()
    t = plan.target
    locked = False
    described = plan  # errors are told with its names (a partitioned load's, once routed)
    merged: tuple[int, int] | None = None  # upsert: rows inserted, updated
    try:
        with clock.phase("check"):
            # for the whole session: every statement of finalize (the DDL on staging too, which
            # a killed earlier attempt's backend may still lock) waits at most lock_timeout
            execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout))
            execute(conn, sql.load_lock(plan.load_id))
            conn.commit()
            locked = True
            realign.repair(conn, plan)  # ranges cut at a wrongly guessed record start
            rows, nbytes, rejected, finalized = _check_ledger(conn, plan)
        if finalized:
            log.info(
                "Load %s was finalized before (the last attempt's commit went through): "
                "%d rows are in %s; nothing to do",
                plan.load_id,
                rows,
                t.qualified,
            )
        elif partitioned.partitioned_staging(plan):
            described = routed = partitioned.route(conn, plan, clock, rows)
            if sessions is not None and partitioned.built_beside(routed) > 1:
                # the partitions to swap, built side by side first
                with clock.phase("build_partitions"):
                    partitioned.build_in_parallel(
                        sessions, routed, partitioned.side_by_side(routed)
                    )
            partitioned.finalize_partitioned(conn, routed, clock, rows, nbytes, rejected)
        elif plan.mode == "replace":
            _finalize_replace(conn, plan, clock, rows, nbytes, rejected, sessions)
        elif plan.rebuilds:
            merged = rebuild.finalize_rebuild(conn, plan, clock, rows, nbytes, rejected)
        elif plan.mode == "upsert":
            merged = upsert.finalize_upsert(conn, plan, clock, rows, nbytes, rejected)
        else:
            _finalize_append(conn, plan, clock, rows, nbytes, rejected)
        if not finalized:  # after the commit, off the critical path; never fails the load
            history.trim(conn, plan)
    except BaseException as exc:
        rollback_quietly(conn)
        error = translate.finalize_error(exc, described)
        if isinstance(error, ConstraintViolationError):  # find the row: re-read the source
            found = offenders.locate(conn, described, server_error(exc))
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
    )
    log.info(
        "Finalized load %s: %d rows now in %s (%s); finalize phases: %s",
        plan.load_id,
        rows,
        t.qualified,
        plan.mode,
        ", ".join(f"{name} {secs:.2f} s" for name, secs in clock.seconds.items()),
    )
    return summary


def _release_load_lock(conn: Any, plan: LoadPlan) -> None:
    try:
        execute(conn, sql.load_lock(plan.load_id, release=True))
        conn.commit()
    except Exception:  # the connection may be gone: the session's end released the lock
        log.debug("releasing the finalize lock failed", exc_info=True)


def check_ledger_plan(conn: Any, plan: LoadPlan) -> None:
    """Refuse to work with a ledger made for another plan, or with none.

    Prepare run again (a retry, a cleared task) for changed files makes a new ledger for its
    new plan; a COPY or finalize still holding the old plan must not mix the two."""
    t = plan.target
    found = scalar(conn, sql.ledger_digest(t.schema, plan.ledger_table))
    if found == (plan.digest or planning.plan_digest(plan)):
        return
    if found is None:
        raise IncompleteLoadError(
            f"load {plan.load_id} into {t.qualified} has no ledger ({plan.ledger_table}): "
            "its cleanup ran, or its prepare did not. Run the load again from prepare"
        )
    raise LoadRefusedError(
        f"the ledger of load {plan.load_id} was made for another plan: prepare ran again "
        "after this task read its plan (did the source files change?). Nothing was loaded "
        "by this task; clear it (or the whole load) to run with the new plan"
    )


def missing_partitions(conn: Any, plan: LoadPlan) -> list[int]:
    """The partitions not committed in the ledger (none once the load is finalized)."""
    check_ledger_plan(conn, plan)
    done = {row[0] for row in execute(conn, sql.ledger_rows(plan.target.schema, plan.ledger_table))}
    conn.commit()
    if sql.FINALIZED in done:
        return []
    return sorted(p.index for p in plan.partitions if p.index not in done)


def _check_ledger(conn: Any, plan: LoadPlan) -> tuple[int, int, int, bool]:
    """Rows, bytes and rejects of the committed partitions, and whether the load was made
    visible before (a retry after a commit whose acknowledgement was lost)."""
    t = plan.target
    check_ledger_plan(conn, plan)
    ledger = execute(conn, sql.ledger_rows(t.schema, plan.ledger_table))
    for row in ledger:
        if row[0] == sql.FINALIZED:
            conn.commit()
            return row[1], row[2], row[4], True
    done = {row[0] for row in ledger}
    missing = sorted(p.index for p in plan.partitions if p.index not in done)
    if missing:
        raise IncompleteLoadError(
            f"load {plan.load_id} into {t.qualified}: partitions {missing} are not in the ledger "
            "(their COPY tasks did not commit); run them before finalize"
        )
    rows = sum(row[1] for row in ledger)
    nbytes = sum(row[2] for row in ledger)
    rejected = sum(row[4] for row in ledger)
    if rejected > plan.errors.max_rejects:
        raise BadDataError(
            f"{rejected} rows of the source were rejected, more than max_rejects="
            f"{plan.errors.max_rejects}; nothing of this load reached {t.qualified}. "
            f"See {'.'.join(plan.reject_table or ())} for load {plan.load_id}"
        )
    # (a partitioned staging: finalize_partitioned counts each staging partition by its name,
    # also one a failed attempt detached to build on it, which the parent no longer holds)
    if not plan.staging_logged and rows and not partitioned.partitioned_staging(plan):
        size = scalar(conn, sql.relation_size(t.schema, plan.staging_table))
        if not size:
            raise IncompleteLoadError(
                f"load {plan.load_id}: the unlogged staging table {plan.staging_table} is empty "
                f"although the ledger records {rows} rows: a server crash emptied it. "
                "Nothing reached the target; run the load again"
            )
    conn.commit()
    return rows, nbytes, rejected, False


def _staging_lost(plan: LoadPlan, staged: int, rows: int) -> IncompleteLoadError:
    return IncompleteLoadError(
        f"load {plan.load_id}: the unlogged staging table {plan.staging_table} holds {staged} "
        f"rows but the ledger records {rows}: a server crash emptied it after some partitions "
        f"had committed. Nothing reached {plan.target.qualified}; run the whole load again "
        "(clear its prepare task)"
    )


def _finalize_append(
    conn: Any, plan: LoadPlan, clock: PhaseClock, rows: int, nbytes: int, rejected: int
) -> None:
    t = plan.target
    with clock.phase("insert"):
        execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True))
        execute(conn, sql.advisory_xact_lock(t.oid))
        inserted = execute_count(
            conn,
            sql.insert_from_staging(
                t.schema,
                t.table,
                plan.staging_table,
                plan.columns,
                override_identity=any(
                    c.identity == Identity.ALWAYS and c.name in plan.columns for c in t.columns
                ),
            ),
        )
        if inserted != rows:
            conn.rollback()
            raise _staging_lost(plan, inserted, rows)
        history.record_finalized(conn, plan, rows, nbytes, rejected)
        conn.commit()
    statistics.after_in_place(conn, plan, clock, rows)


def _finalize_replace(
    conn: Any,
    plan: LoadPlan,
    clock: PhaseClock,
    rows: int,
    nbytes: int,
    rejected: int,
    sessions: fanout.Sessions | None = None,
) -> None:
    """Build on staging what the target has; steps already done by an earlier attempt of this
    finalize are skipped, so a retry goes on where the last one stopped."""
    t = plan.target
    stage = plan.staging_table
    # early, before the index builds; again in the swap
    history.refuse_overwriting_newer(conn, plan)
    built = _staging_state(conn, plan)
    execute(conn, sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem))
    if ("persistence", Persistence.UNLOGGED) in built:
        if t.persistence == Persistence.PERMANENT:
            with clock.phase("set_logged"):
                execute(conn, sql.set_logged(t.schema, stage))
                conn.commit()
        # Logged now (or never: an unlogged target): check no crash emptied staging before.
        staged = scalar(conn, sql.count_rows(t.schema, stage))
        conn.commit()
        if staged != rows:
            raise _staging_lost(plan, staged, rows)
    index_names, constraint_names = build_on_staging(conn, plan, clock, built, sessions=sessions)
    with clock.phase("swap"):
        _swap(conn, plan, index_names, constraint_names)
        history.record_finalized(conn, plan, rows, nbytes, rejected)
        conn.commit()
    with clock.phase("drop_old"):
        drop_retired(conn, plan)


def build_on_staging(
    conn: Any,
    plan: LoadPlan,
    clock: PhaseClock,
    built: dict[tuple[str, str], bool | None],
    commit: Callable[[], None] | None = None,
    sessions: fanout.Sessions | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """The target's indexes and constraints on ``plan.staging_table`` (what ``built`` holds is
    skipped), then ANALYZE; returns the temporary names of the indexes and constraints.

    ``commit`` runs after each step (default: the connection's commit, so that a retried
    replace goes on where the last one stopped); a rebuild passes a no-op and keeps it all
    in its one transaction. (VALIDATE CONSTRAINT and ANALYZE run in a transaction block.)

    Each build gets ``max_parallel_maintenance_workers`` by :func:`fanout.size_builds`; with
    ``sessions`` and more than one index to build, several are built at once on sessions of
    their own (:func:`fanout.run_at_once`), each committed there."""
    t = plan.target
    stage = plan.staging_table
    commit = commit or conn.commit
    index_names, constraint_names = naming.temp_names(plan)
    with clock.phase("indexes"):
        builds = []
        for index in t.indexes:
            name = index_names[index.name]
            done_as_key = (
                index.constraint and ("constraint", constraint_names[index.constraint]) in built
            )
            if built.get(("index", name)) or done_as_key:
                continue
            if ("index", name) in built:  # an invalid leftover of an interrupted build
                execute(conn, sql.drop_index(t.schema, name))
            builds.append(
                sql.create_index(t.schema, stage, name, unique=index.unique, tail=index.tail)
            )
        sizing = fanout.server_sizing(conn, len(builds), plan.settings.index_workers)
        workers = sql.set_config("max_parallel_maintenance_workers", str(sizing.workers))
        execute(conn, workers)
        commit()
        if builds:
            log.info(
                "Load %s: building %d indexes on %s, %d at once, %d parallel workers each",
                plan.load_id,
                len(builds),
                stage,
                min(sizing.builds, len(builds)) if sessions else 1,
                sizing.workers,
            )
        if sessions is not None and sizing.builds > 1 and len(builds) > 1:
            setup = [
                sql.set_config("lock_timeout", plan.settings.lock_timeout),
                sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem),
                workers,
            ]
            fanout.run_at_once(sessions, builds, sizing.builds, setup)
        else:
            for statement in builds:
                execute(conn, statement)
                commit()
    with clock.phase("constraints"):
        for con in t.constraints:
            _add_constraint(conn, plan, con, constraint_names[con.name], index_names, built, commit)
    if plan.settings.analyze:
        with clock.phase("analyze"):
            execute(conn, sql.analyze(t.schema, stage))
            commit()
    return index_names, constraint_names


def _staging_state(conn: Any, plan: LoadPlan) -> dict[tuple[str, str], bool | None]:
    rows = execute(conn, sql.staging_state(plan.target.schema, plan.staging_table))
    conn.commit()
    return {(kind, name): flag for kind, name, flag in rows}


def _add_constraint(
    conn: Any,
    plan: LoadPlan,
    con: ConstraintDef,
    name: str,
    index_names: dict[str, str],
    built: dict[tuple[str, str], bool | None],
    commit: Callable[[], None],
) -> None:
    t = plan.target
    stage = plan.staging_table
    exists = ("constraint", name) in built
    if con.kind in (ConstraintKind.PRIMARY_KEY, ConstraintKind.UNIQUE):
        if not exists:
            execute(
                conn,
                sql.add_key_using_index(
                    t.schema,
                    stage,
                    name,
                    kind=con.kind,
                    index=index_names[con.index or ""],
                    deferrable=con.deferrable,
                    deferred=con.deferred,
                ),
            )
    elif con.kind in (ConstraintKind.CHECK, ConstraintKind.FOREIGN_KEY):
        if not exists:
            execute(conn, sql.add_constraint(t.schema, stage, name, con.definition, not_valid=True))
            commit()
        if con.validated and not built.get(("constraint", name)):
            execute(conn, sql.validate_constraint(t.schema, stage, name))
    elif not exists:
        execute(conn, sql.add_constraint(t.schema, stage, name, con.definition))
    commit()


def _swap(
    conn: Any, plan: LoadPlan, index_names: dict[str, str], constraint_names: dict[str, str]
) -> None:
    """One transaction: the staging table takes the target's place, with everything of it."""
    t = plan.target
    schema, table = t.schema, t.table
    retired = naming.retired_table(plan.load_id)
    execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True))
    execute(conn, sql.advisory_xact_lock(t.oid))
    # the target, then the tables whose foreign keys are dropped and re-added below
    locking.lock_for_swap(
        conn, [(schema, table), *dict.fromkeys((k.schema, k.table) for k in t.referencing_keys)]
    )
    # under the target's lock: no later load can slip in
    history.refuse_overwriting_newer(conn, plan)
    now = catalog.capture(conn, schema, table)  # pins search_path for the rest of the swap
    if now.fingerprint() != t.fingerprint():
        raise LoadRefusedError(
            f"the definition of {t.qualified} changed between prepare and finalize "
            "(columns, indexes, constraints, triggers, grants, owner or comments); "
            "nothing was swapped. Run the load again"
        )
    _restore_identity(conn, plan)
    columns = execute(conn, sql.column_settings(schema, table))
    views = execute(conn, sql.dependent_views(now.oid))
    identity_positions = {}
    for seq in t.sequences:
        if seq.kind == "identity":
            identity_positions[seq.column] = (
                seq.name,
                *execute(conn, sql.sequence_state(seq.schema, seq.name))[0],
            )
    for key in t.referencing_keys:
        execute(conn, sql.drop_constraint(key.schema, key.table, key.name))
    execute(conn, sql.rename_table(schema, table, retired))
    execute(conn, sql.rename_table(schema, plan.staging_table, table))
    if t.owner != scalar(conn, sql.current_user()):
        # first: a serial sequence (the target owner's) can only be owned by a table of the
        # same owner
        execute(conn, sql.set_owner(schema, table, t.owner))
    for view_schema, view_name, _kind, body, options in views:
        execute(conn, sql.create_or_replace_view(view_schema, view_name, options, body))
    for seq in t.sequences:
        if seq.kind == "serial":
            execute(conn, sql.sequence_owned_by(seq.schema, seq.name, table, seq.column))
    # Keep the old table, renamed, its files for after the commit (drop_retired): a DROP
    # here would unlink them and drop their buffers while the lock is held. Make way for the
    # new table's names, drop its foreign keys (their locks on the referenced tables are taken
    # here anyway), and drop it at a savepoint rolled back: anything unforeseen that depends
    # on it fails the swap now, as the DROP here did.
    load_id = plan.load_id
    for number, index in enumerate(t.indexes):
        execute(conn, sql.rename_index(schema, index.name, naming.retired_index(load_id, number)))
    for number, seq in enumerate(s for s in t.sequences if s.kind == "identity"):
        old_name = naming.retired_sequence(load_id, number)
        execute(conn, sql.rename_sequence(seq.schema, seq.name, old_name))
    exclusions = (c for c in t.constraints if c.kind == ConstraintKind.EXCLUSION)
    for number, con in enumerate(exclusions):  # renaming one renames its index
        old_name = naming.retired_constraint(load_id, number)
        execute(conn, sql.rename_constraint(schema, retired, con.name, old_name))
    for con in t.constraints:
        if con.kind == ConstraintKind.FOREIGN_KEY:
            execute(conn, sql.drop_constraint(schema, retired, con.name))
    execute(conn, sql.savepoint(_PROBE))
    execute(conn, sql.drop_table(schema, retired))
    execute(conn, sql.rollback_to(_PROBE))
    for original, temp in constraint_names.items():
        execute(conn, sql.rename_constraint(schema, table, temp, original))
    for index in t.indexes:
        if index.constraint is None:
            execute(conn, sql.rename_index(schema, index_names[index.name], index.name))
    for column, (name, last_value, is_called, _increment) in identity_positions.items():
        new_schema, new_name = execute(conn, sql.identity_sequence(schema, table, column))[0]
        staged_last, staged_called, increment = execute(
            conn, sql.sequence_state(new_schema, new_name)
        )[0]
        execute(conn, sql.rename_sequence(new_schema, new_name, name))
        # Rows loaded without the key took values from staging's own sequence: never go back
        # behind them (an INSERT would collide); otherwise keep the old table's position.
        if not (staged_called and (not is_called or (staged_last - last_value) * increment > 0)):
            execute(conn, sql.set_sequence(new_schema, name, last_value, is_called))
    restore_columns(conn, schema, table, columns)
    _restore_properties(conn, t)
    for key in t.referencing_keys:
        execute(
            conn,
            sql.add_constraint(
                key.schema, key.table, key.name, key.definition, not_valid=not key.validated
            ),
        )
    # (the caller notes the load as finalized in the same transaction, then commits)


_PROBE = "pgbulk_drop_probe"


def restore_columns(conn: Any, schema: str, table: str, former: list[tuple[Any, ...]]) -> None:
    """Give the columns of ``table`` what ``former`` (:func:`airflow_pg_bulk.sql.column_settings`
    of the table it replaces) says they had: defaults (not an identity's or a generated
    column's), statistics targets, storage, ``n_distinct`` options. Staging took its
    columns from the target (a partition's from the partitioned table) and none of these."""
    was = {row[0]: row[2:] for row in former}
    for name, _identity, *now in execute(conn, sql.column_settings(schema, table)):
        if name not in was or now == list(was[name]):
            continue
        generated, default, target, storage, options = now
        _, old_default, old_target, old_storage, old_options = was[name]
        if not generated and default != old_default:
            execute(conn, sql.set_default(schema, table, name, old_default))
        kept = {option.split("=", 1)[0] for option in old_options}
        change = sql.set_column(
            schema,
            table,
            name,
            statistics=old_target if target != old_target else None,
            storage=old_storage if storage != old_storage else None,
            options=old_options if sorted(options) != sorted(old_options) else (),
            reset=sorted({option.split("=", 1)[0] for option in options} - kept),
        )
        if change is not None:
            execute(conn, change)


def _restore_identity(conn: Any, plan: LoadPlan) -> None:
    """An identity column that was not loaded is a plain column of staging drawing from the
    target's sequence (see steps._create_staging): make it the identity it was (same kind,
    the sequence's options) before the swap carries the sequence's position over."""
    t = plan.target
    stage = plan.staging_table
    always = {c.name: c.identity == Identity.ALWAYS for c in t.columns}
    kinds = {row[0]: row[1] for row in execute(conn, sql.column_settings(t.schema, stage))}
    for number, seq in enumerate(s for s in t.sequences if s.kind == "identity"):
        if kinds.get(seq.column) != "":
            continue  # an identity (LIKE the target's), or no such column
        execute(conn, sql.set_default(t.schema, stage, seq.column, None))
        execute(
            conn,
            sql.add_identity(
                t.schema,
                stage,
                seq.column,
                always=always[seq.column],
                sequence=(seq.schema, naming.temp_sequence(plan.load_id, number)),
                options=execute(conn, sql.sequence_options(seq.schema, seq.name))[0],
            ),
        )


def drop_retired(conn: Any, plan: LoadPlan) -> bool:
    """Drop the old table a swap left (committed), in a transaction of its own under
    ``lock_timeout``; True when it was dropped. A failure is logged, not raised: the load is
    visible already, and cleanup drops the table (its name is one of the run's)."""
    t = plan.target
    retired = naming.retired_table(plan.load_id)
    try:
        execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True))
        execute(conn, sql.drop_table(t.schema, retired, if_exists=True))
        conn.commit()
    except Exception:
        rollback_quietly(conn)
        log.warning(
            "Load %s: could not drop the old table, now %s.%s; cleanup drops it",
            plan.load_id,
            t.schema,
            retired,
            exc_info=True,
        )
        return False
    return True


def _restore_properties(conn: Any, t: TargetDefinition, *, triggers: bool = True) -> None:
    """``t``'s triggers (unless ``triggers`` is false: a partition's come from its parent),
    options, grants and comments on the table now named as ``t``."""
    schema, table = t.schema, t.table
    for trigger in t.triggers if triggers else ():
        execute(conn, sql.execute_definition(trigger.definition))
        if trigger.enabled != TriggerState.ORIGIN:
            execute(conn, sql.set_trigger_state(schema, table, trigger.name, trigger.enabled))
    execute(conn, sql.reset_autovacuum(schema, table))
    if t.reloptions:
        execute(conn, sql.set_reloptions(schema, table, t.reloptions))
    for g in t.grants:
        execute(
            conn,
            sql.grant(
                schema, table, g.privilege, g.grantee, grantable=g.grantable, column=g.column
            ),
        )
    if t.comment is not None:
        execute(conn, sql.comment_on("TABLE", sql.qualified(schema, table), t.comment))
    for column, text in t.column_comments.items():
        execute(conn, sql.comment_on("COLUMN", sql.qualified(schema, table, column), text))
    for index in t.indexes:
        if index.comment is not None:
            execute(conn, sql.comment_on("INDEX", sql.qualified(schema, index.name), index.comment))
    for con in t.constraints:
        if con.comment is not None:
            execute(conn, sql.comment_on_constraint(schema, table, con.name, con.comment))
