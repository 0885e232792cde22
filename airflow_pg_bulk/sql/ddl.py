"""SQL that builds and swaps a table: indexes, constraints, renames, owner, grants, views."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from airflow_pg_bulk.plan.codes import ConstraintKind, TriggerState
from airflow_pg_bulk.sql.compose import column_names, table_identifier

PRIVILEGES = frozenset(
    {"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN"}
)
_TRIGGER_STATES = {
    TriggerState.DISABLED: "DISABLE",
    TriggerState.REPLICA: "ENABLE REPLICA",
    TriggerState.ALWAYS: "ENABLE ALWAYS",
}


# --- finalize --------------------------------------------------------------------------------


def set_logged(schema: str, name: str) -> Composed:
    """Make an unlogged staging table logged (re-writes it into WAL)."""
    return SQL("ALTER TABLE {} SET LOGGED").format(table_identifier(schema, name))


def create_index(schema: str, table: str, name: str, *, unique: bool, tail: str) -> Composed:
    """Build a captured index on staging: ``tail`` is the server's text after ``USING``."""
    return SQL("CREATE {}INDEX {} ON {} USING {}").format(
        SQL("UNIQUE " if unique else ""),
        Identifier(name),
        table_identifier(schema, table),
        SQL(tail),
    )


def drop_index(schema: str, name: str) -> Composed:
    """Drop an index (an invalid leftover of an interrupted build)."""
    return SQL("DROP INDEX {}").format(table_identifier(schema, name))


def add_key_using_index(
    schema: str, table: str, name: str, *, kind: str, index: str, deferrable: bool, deferred: bool
) -> Composed:
    """Turn a built unique index into the PRIMARY KEY or UNIQUE constraint (no re-scan)."""
    keyword = {ConstraintKind.PRIMARY_KEY: "PRIMARY KEY", ConstraintKind.UNIQUE: "UNIQUE"}[kind]
    timing = ""
    if deferrable:
        timing = " DEFERRABLE INITIALLY DEFERRED" if deferred else " DEFERRABLE"
    return SQL("ALTER TABLE {} ADD CONSTRAINT {} {} USING INDEX {}{}").format(
        table_identifier(schema, table),
        Identifier(name),
        SQL(keyword),
        Identifier(index),
        SQL(timing),
    )


def add_constraint(
    schema: str, table: str, name: str, definition: str, *, not_valid: bool = False
) -> Composed:
    """Add a captured constraint definition, optionally ``NOT VALID`` (checked later)."""
    return SQL("ALTER TABLE {} ADD CONSTRAINT {} {}{}").format(
        table_identifier(schema, table),
        Identifier(name),
        SQL(definition),
        SQL(" NOT VALID" if not_valid else ""),
    )


def validate_constraint(schema: str, table: str, name: str) -> Composed:
    """Check existing rows against a NOT VALID constraint (no exclusive lock)."""
    return SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(
        table_identifier(schema, table), Identifier(name)
    )


def drop_constraint(schema: str, table: str, name: str, *, if_exists: bool = False) -> Composed:
    """Drop a constraint (a referencing foreign key, re-added to the new table)."""
    return SQL("ALTER TABLE {} DROP CONSTRAINT {}{}").format(
        table_identifier(schema, table), SQL("IF EXISTS " if if_exists else ""), Identifier(name)
    )


def analyze(schema: str, table: str) -> Composed:
    """Planner statistics for the loaded table."""
    return SQL("ANALYZE {}").format(table_identifier(schema, table))


def estimated_rows(schema: str, table: str, bytes_per_row: int) -> Composed:
    """The planner's row estimate of a table without reading it: the sum over the table, or
    its leaf partitions (a partitioned table has no rows of its own, and autovacuum never
    ANALYZEs it), of ``reltuples``; where that is unknown (-1: never vacuumed or analyzed,
    PostgreSQL 14+), the table's size over ``bytes_per_row``. Returns (rows, leaves whose
    reltuples was unknown)."""
    return SQL(
        "SELECT coalesce(sum(CASE WHEN c.reltuples >= 0 THEN c.reltuples"
        " ELSE pg_relation_size(c.oid) / {} END), 0)::bigint,"
        " count(*) FILTER (WHERE c.reltuples < 0)"
        " FROM pg_class c WHERE (c.oid = {rel}::regclass AND c.relkind <> 'p')"
        " OR c.oid IN (SELECT relid FROM pg_partition_tree({rel}::regclass) WHERE isleaf)"
    ).format(Literal(max(1, bytes_per_row)), rel=Literal(Identifier(schema, table).as_string()))


_LOCK_MODES = frozenset({"SHARE UPDATE EXCLUSIVE", "SHARE", "EXCLUSIVE", "ACCESS EXCLUSIVE"})


def lock_tables(tables: Sequence[tuple[str, str]], mode: str, *, only: bool = False) -> Composed:
    """``LOCK TABLE a, b IN <mode> MODE`` (in that order); waits at most ``lock_timeout``.
    ``only``: ``LOCK TABLE ONLY …``, not the partitions of a partitioned table (without it
    every partition is locked too, one after another)."""
    if mode not in _LOCK_MODES:
        raise ValueError(f"unsupported lock mode {mode!r}")
    prefix = SQL("ONLY ") if only else SQL("")
    return SQL("LOCK TABLE {} IN {} MODE").format(
        SQL(", ").join(prefix + table_identifier(schema, name) for schema, name in tables),
        SQL(mode),
    )


def setting_milliseconds(name: str) -> Composed:
    """A time setting of the session in milliseconds (``lock_timeout``: 0 means no limit).
    Read with ``current_setting`` (its value always carries a unit, but 0), not from the
    ``pg_settings`` view, which builds a row for every setting of the server."""
    return SQL(
        "SELECT round(extract(epoch FROM current_setting({})::interval) * 1000)::bigint"
    ).format(Literal(name))


def copy_setting(source: str, into: str) -> Composed:
    """Set ``into`` for this transaction to the session's value of ``source``, without the
    client reading it (``into`` may be a custom setting, ``pgbulk.*``, to keep a value and
    put it back later in the same round trip)."""
    return SQL("SELECT set_config({}, current_setting({}), true)").format(
        Literal(into), Literal(source)
    )


def parallel_limits() -> SQL:
    """The server's ceilings on parallel workers: ``max_worker_processes``,
    ``max_parallel_workers``, and ``max_parallel_maintenance_workers`` as the session had it
    before any ``SET`` (the server's, database's or role's setting; a finalize sets its own on
    the session), readable by any role."""
    return SQL(
        "SELECT current_setting('max_worker_processes')::int,"
        " current_setting('max_parallel_workers')::int,"
        " (SELECT reset_val::int FROM pg_settings"
        " WHERE name = 'max_parallel_maintenance_workers')"
    )


def rename_table(schema: str, old: str, new: str) -> Composed:
    """Rename a table within its schema."""
    return SQL("ALTER TABLE {} RENAME TO {}").format(table_identifier(schema, old), Identifier(new))


def rename_constraint(schema: str, table: str, old: str, new: str) -> Composed:
    """Rename a constraint (and the index behind a key)."""
    return SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
        table_identifier(schema, table), Identifier(old), Identifier(new)
    )


def rename_index(schema: str, old: str, new: str) -> Composed:
    """Rename an index within its schema."""
    return SQL("ALTER INDEX {} RENAME TO {}").format(table_identifier(schema, old), Identifier(new))


def rename_sequence(schema: str, old: str, new: str) -> Composed:
    """Rename a sequence within its schema."""
    return SQL("ALTER SEQUENCE {} RENAME TO {}").format(
        table_identifier(schema, old), Identifier(new)
    )


def sequence_owned_by(schema: str, sequence: str, table: str, column: str) -> Composed:
    """Move a serial column's sequence to the new table, so dropping the old one keeps it."""
    return SQL("ALTER SEQUENCE {} OWNED BY {}").format(
        table_identifier(schema, sequence), Identifier(schema, table, column)
    )


def identity_sequence(schema: str, table: str, column: str) -> Composed:
    """The identity sequence of a column as (schema, name)."""
    return SQL(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = pg_get_serial_sequence({}, {})::regclass"
    ).format(Literal(Identifier(schema, table).as_string()), Literal(column))


def set_sequence(schema: str, name: str, value: int, is_called: bool) -> Composed:
    """Carry a sequence's position over to its replacement."""
    return SQL("SELECT setval({}::regclass, {}, {})").format(
        Literal(Identifier(schema, name).as_string()), Literal(value), Literal(is_called)
    )


def create_or_replace_view(schema: str, name: str, options: Sequence[str], body: str) -> Composed:
    """Re-bind a view to the table that now has the target's name, keeping its oid, owner,
    grants and the views built on it. ``body`` is ``pg_get_viewdef`` output."""
    with_options: Composable = SQL("")
    if options:
        pairs = [option.split("=", 1) for option in options]
        with_options = SQL(" WITH ({})").format(
            SQL(", ").join(SQL("{} = {}").format(Identifier(k), Literal(v)) for k, v in pairs)
        )
    return SQL("CREATE OR REPLACE VIEW {}{} AS {}").format(
        table_identifier(schema, name), with_options, SQL(body.strip().rstrip(";"))
    )


def execute_definition(definition: str) -> SQL:
    """Run a complete statement the server rendered (``pg_get_triggerdef``)."""
    return SQL(definition)


def set_trigger_state(schema: str, table: str, trigger: str, state: str) -> Composed:
    """Restore a trigger's enabled state (disabled, replica or always)."""
    return SQL("ALTER TABLE {} {} TRIGGER {}").format(
        table_identifier(schema, table), SQL(_TRIGGER_STATES[state]), Identifier(trigger)
    )


def grant(
    schema: str, table: str, privilege: str, grantee: str, *, grantable: bool, column: str | None
) -> Composed:
    """Re-grant one captured privilege (``grantee`` empty means PUBLIC)."""
    if privilege not in PRIVILEGES:
        raise ValueError(f"unknown privilege {privilege!r}")
    on_columns = SQL(" ({})").format(Identifier(column)) if column else SQL("")
    return SQL("GRANT {}{} ON TABLE {} TO {}{}").format(
        SQL(privilege),
        on_columns,
        table_identifier(schema, table),
        Identifier(grantee) if grantee else SQL("PUBLIC"),
        SQL(" WITH GRANT OPTION" if grantable else ""),
    )


def set_owner(schema: str, table: str, owner: str) -> Composed:
    """Give the new table the old one's owner."""
    return SQL("ALTER TABLE {} OWNER TO {}").format(
        table_identifier(schema, table), Identifier(owner)
    )


def comment_on(kind: str, target: Composable, text: str | None) -> Composed:
    """``COMMENT ON {TABLE|COLUMN|INDEX} target IS text``."""
    if kind not in {"TABLE", "COLUMN", "INDEX"}:
        raise ValueError(f"unsupported comment kind {kind!r}")
    return SQL("COMMENT ON {} {} IS {}").format(SQL(kind), target, Literal(text))


def comment_on_constraint(schema: str, table: str, name: str, text: str | None) -> Composed:
    """``COMMENT ON CONSTRAINT name ON table IS text``."""
    return SQL("COMMENT ON CONSTRAINT {} ON {} IS {}").format(
        Identifier(name), table_identifier(schema, table), Literal(text)
    )


def qualified(*names: str) -> Identifier:
    """A (schema-)qualified name, for :func:`comment_on`."""
    return Identifier(*names)


def set_reloptions(schema: str, table: str, options: Iterable[str]) -> Composed:
    """Restore the target's storage parameters on the new table."""
    pairs = [option.split("=", 1) for option in options]
    return SQL("ALTER TABLE {} SET ({})").format(
        table_identifier(schema, table),
        SQL(", ").join(
            SQL("{} = {}").format(SQL(_reloption_name(k)), Literal(v)) for k, v in pairs
        ),
    )


def reset_autovacuum(schema: str, table: str) -> Composed:
    """Undo the staging table's ``autovacuum_enabled = false``."""
    return SQL("ALTER TABLE {} RESET (autovacuum_enabled)").format(table_identifier(schema, table))


def _reloption_name(name: str) -> str:
    # Storage parameter names may be dotted (toast.autovacuum_enabled), which Identifier would
    # quote as one name; they come from pg_class.reloptions, so check their shape and pass them.
    parts = name.split(".")
    if not all(part.isidentifier() and part.isascii() for part in parts):
        raise ValueError(f"unexpected storage parameter name {name!r}")
    return name


def insert_from_staging(
    schema: str, table: str, staging: str, columns: Sequence[str], *, override_identity: bool
) -> Composed:
    """Append: move the staged rows into the target in one statement.

    ``override_identity``: the rows carry values for a ``GENERATED ALWAYS AS IDENTITY`` column,
    which COPY would have accepted; ``OVERRIDING SYSTEM VALUE`` lets the INSERT take them too."""
    return SQL("INSERT INTO {} ({}){} SELECT {} FROM {}").format(
        table_identifier(schema, table),
        column_names(columns),
        SQL(" OVERRIDING SYSTEM VALUE" if override_identity else ""),
        column_names(columns),
        table_identifier(schema, staging),
    )


def count_rows(schema: str, table: str) -> Composed:
    """Exact row count."""
    return SQL("SELECT count(*) FROM {}").format(table_identifier(schema, table))
