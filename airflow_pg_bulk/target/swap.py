"""The swap: a table built beside the target takes its place in one transaction, with
everything of it (triggers, grants, owner, comments, sequences, dependent views, referencing
foreign keys); the old table is dropped after the commit, in a transaction of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, rollback_quietly, scalar
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import LoadPlan, TargetDefinition
from airflow_pg_bulk.plan.codes import ConstraintKind, Identity, TriggerState
from airflow_pg_bulk.target import catalog, history, locking

log = logging.getLogger(__name__)


def swap_in(
    conn: DatabaseConnection,
    plan: LoadPlan,
    index_names: dict[str, str],
    constraint_names: dict[str, str],
) -> None:
    """In the transaction that makes the load visible (opened by
    :func:`airflow_pg_bulk.target.history.open_visible`): the staging table takes the target's
    place, with everything of it. The caller notes the load finalized, then commits."""
    t = plan.target
    schema, table = t.schema, t.table
    retired = naming.retired_table(plan.load_id)
    # the target, then the tables whose foreign keys are dropped and re-added below
    locking.lock_for_swap(
        conn, [(schema, table), *dict.fromkeys((k.schema, k.table) for k in t.referencing_keys)]
    )
    # under the target's lock: no later load can slip in
    history.refuse_overwriting_newer(conn, plan)
    # (pins search_path for the rest of the swap)
    now = catalog.capture(conn, schema, table, partitioned=False)
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
        if seq.kind.of_identity_column:
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
        if seq.kind.owned_by_column:
            execute(conn, sql.sequence_owned_by(seq.schema, seq.name, table, seq.column))
    # Keep the old table, renamed, its files for after the commit (drop_retired): a DROP
    # here would unlink them and drop their buffers while the lock is held. Make way for the
    # new table's names, drop its foreign keys (their locks on the referenced tables are taken
    # here anyway), and drop it at a savepoint rolled back: anything unforeseen that depends
    # on it fails the swap now, before the commit.
    load_id = plan.load_id
    for number, index in enumerate(t.indexes):
        execute(conn, sql.rename_index(schema, index.name, naming.retired_index(load_id, number)))
    for number, seq in enumerate(s for s in t.sequences if s.kind.of_identity_column):
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
    restore_properties(conn, t)
    for key in t.referencing_keys:
        execute(
            conn,
            sql.add_constraint(
                key.schema, key.table, key.name, key.definition, not_valid=not key.validated
            ),
        )


_PROBE = "pgbulk_drop_probe"


def restore_columns(
    conn: DatabaseConnection, schema: str, table: str, former: list[tuple[Any, ...]]
) -> None:
    """Give the columns of ``table`` what ``former`` (:func:`airflow_pg_bulk.sql.column_settings`
    of the table it replaces) says they had: defaults (not an identity's or a generated
    column's), statistics targets, storage, ``n_distinct`` options. Staging took its
    columns from the target (a partition's from the partitioned table) and none of these.
    One round trip to read them, one to change them (when any differs)."""
    now = execute(conn, sql.column_settings(schema, table))
    changes = column_statements(schema, table, now, former)
    if changes:
        execute(conn, sql.in_one_round_trip(*changes))


def column_statements(
    schema: str, table: str, now: Sequence[Sequence[Any]], former: Sequence[Sequence[Any]]
) -> list[sql.Composable]:
    """The statements :func:`restore_columns` runs: ``now`` and ``former`` are the rows of
    :func:`airflow_pg_bulk.sql.column_settings` for ``table`` and for the table it replaces
    (read as the driver gives them, or through JSON: arrays as lists either way)."""
    was = {row[0]: list(row[2:]) for row in former}
    statements: list[sql.Composable] = []
    for name, _identity, *settings in now:
        if name not in was or list(settings) == was[name]:
            continue
        generated, default, target, storage, options = settings
        _, old_default, old_target, old_storage, old_options = was[name]
        if not generated and default != old_default:
            statements.append(sql.set_default(schema, table, name, old_default))
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
            statements.append(change)
    return statements


def _restore_identity(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """An identity column that was not loaded is a plain column of staging drawing from the
    target's sequence (see :func:`airflow_pg_bulk.target.staging.create_like`): make it the
    identity it was (same kind, the sequence's options) before the swap carries the
    sequence's position over."""
    t = plan.target
    stage = plan.staging_table
    always = {c.name: c.identity == Identity.ALWAYS for c in t.columns}
    kinds = {row[0]: row[1] for row in execute(conn, sql.column_settings(t.schema, stage))}
    for number, seq in enumerate(s for s in t.sequences if s.kind.of_identity_column):
        if kinds.get(seq.column) != Identity.NONE:
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


def drop_retired(conn: DatabaseConnection, plan: LoadPlan) -> bool:
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


def restore_properties(
    conn: DatabaseConnection, t: TargetDefinition, *, triggers: bool = True
) -> None:
    """After a swap: ``t``'s triggers (unless ``triggers`` is false: a partition's come from
    its parent), options, grants and comments on the table now named as ``t``, in one round
    trip (:func:`property_statements`)."""
    execute(conn, sql.in_one_round_trip(*property_statements(t, triggers=triggers)))


def property_statements(t: TargetDefinition, *, triggers: bool = True) -> list[sql.Composable]:
    """The statements of :func:`restore_properties` (never none: autovacuum is reset)."""
    schema, table = t.schema, t.table
    statements: list[sql.Composable] = []
    for trigger in t.triggers if triggers else ():
        statements.append(sql.execute_definition(trigger.definition))
        if trigger.enabled != TriggerState.ORIGIN:
            statements.append(sql.set_trigger_state(schema, table, trigger.name, trigger.enabled))
    statements.append(sql.reset_autovacuum(schema, table))
    if t.reloptions:
        statements.append(sql.set_reloptions(schema, table, t.reloptions))
    statements.extend(
        sql.grant(schema, table, g.privilege, g.grantee, grantable=g.grantable, column=g.column)
        for g in t.grants
    )
    if t.comment is not None:
        statements.append(sql.comment_on("TABLE", sql.qualified(schema, table), t.comment))
    for column, text in t.column_comments.items():
        statements.append(sql.comment_on("COLUMN", sql.qualified(schema, table, column), text))
    for index in t.indexes:
        if index.comment is not None:
            statements.append(
                sql.comment_on("INDEX", sql.qualified(schema, index.name), index.comment)
            )
    for con in t.constraints:
        if con.comment is not None:
            statements.append(sql.comment_on_constraint(schema, table, con.name, con.comment))
    return statements
