"""Every SQL statement the load issues, as pure functions returning composed SQL.

Identifiers and values are always composed with ``psycopg.sql`` (``Identifier``, ``Literal``);
nothing a user or a catalog gives us is ever formatted into SQL text by hand. The one kind of
text taken verbatim is what the server itself rendered from its catalog (``pg_get_indexdef``,
``pg_get_constraintdef``, ``pg_get_triggerdef``, ``pg_get_viewdef``), which is re-executed
under the same ``search_path`` it was rendered with (see :func:`pin_search_path`).

The driver adapter (:mod:`airflow_pg_bulk.driver`) turns these objects into the connection's
own driver objects, so the same statements serve psycopg 3 and psycopg2.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from airflow_pg_bulk.plan import CopyOptions
from airflow_pg_bulk.plan.codes import ConstraintKind, TriggerState

__all__ = ["Composable"]

PRIVILEGES = frozenset(
    {"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN"}
)
_TRIGGER_STATES = {
    TriggerState.DISABLED: "DISABLE",
    TriggerState.REPLICA: "ENABLE REPLICA",
    TriggerState.ALWAYS: "ENABLE ALWAYS",
}


def _table(schema: str, name: str) -> Identifier:
    return Identifier(schema, name)


def _columns(names: Sequence[str]) -> Composed:
    return SQL(", ").join(Identifier(n) for n in names)


# --- session ---------------------------------------------------------------------------------


def set_config(name: str, value: str, *, local: bool = False) -> Composed:
    """``set_config(name, value, local)``: a session (or transaction) setting."""
    return SQL("SELECT {}").format(_set_config_call(name, value, local))


def _set_config_call(name: str, value: str, local: bool = False) -> Composed:
    return SQL("set_config({}, {}, {})").format(Literal(name), Literal(value), Literal(local))


def session_setup(application_name: str, client_check_interval: str | None) -> Composed:
    """Name the session (``pg_stat_activity.application_name``) and, where given (PostgreSQL
    14+), have the server check every ``client_check_interval`` during a long statement that
    its client is still there, and abort the statement if not (a worker killed with SIGKILL)."""
    calls = [_set_config_call("application_name", application_name)]
    if client_check_interval is not None:
        calls.append(_set_config_call("client_connection_check_interval", client_check_interval))
    return SQL("SELECT {}").format(SQL(", ").join(calls))


def pin_search_path() -> Composed:
    """Pin ``search_path`` for this transaction so catalog-rendered SQL is fully qualified."""
    return set_config("search_path", "pg_catalog, pg_temp", local=True)


def server_version() -> Composed:
    """The server's version number (e.g. 150020)."""
    return SQL("SELECT current_setting('server_version_num')::int").format()


def current_user() -> Composed:
    """The role the session runs as."""
    return SQL("SELECT current_user").format()


def advisory_xact_lock(oid: int) -> Composed:
    """Serialise finalizes of the same target (one pair of keys per table)."""
    return SQL("SELECT pg_advisory_xact_lock(hashtext('airflow_pg_bulk'), {}::oid::int4)").format(
        Literal(oid)
    )


def creation_lock(schema: str, name: str) -> Composed:
    """Serialise the creation of a shared table (the reject table, the load history) by
    concurrent loads, until the transaction ends."""
    return SQL(
        "SELECT pg_advisory_xact_lock(hashtext('airflow_pg_bulk_create'), hashtext({}))"
    ).format(Literal(Identifier(schema, name).as_string()))


def load_lock(load_id: str, *, release: bool = False) -> Composed:
    """Take (or release) the session-level lock that one finalize of a load holds throughout,
    so a retry started while a stalled attempt still works waits for it (under lock_timeout)
    instead of racing it."""
    function = SQL("pg_advisory_unlock" if release else "pg_advisory_lock")
    return SQL("SELECT {}(hashtext('airflow_pg_bulk_finalize'), hashtext({}))").format(
        function, Literal(load_id)
    )


# --- catalog capture -------------------------------------------------------------------------


def find_table(schema: str, table: str) -> Composed:
    """The target's oid, kind, persistence, owner, options and flags."""
    return SQL(
        "SELECT c.oid, c.relkind, c.relpersistence, pg_get_userbyid(c.relowner),"
        " coalesce(c.reloptions, '{{}}'::text[]), c.relispartition, c.relrowsecurity,"
        " obj_description(c.oid, 'pg_class'),"
        " EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid OR i.inhparent = c.oid)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = {} AND c.relname = {}"
    ).format(Literal(schema), Literal(table))


def loader_privileges(oid: int) -> Composed:
    """Whether the session's role may own-operate, insert into, and create beside the target:
    (owner or member of the owner, INSERT, CREATE on its schema, current_user, UPDATE)."""
    return SQL(
        "SELECT pg_has_role(c.relowner, 'USAGE'), has_table_privilege(c.oid, 'INSERT'),"
        " has_schema_privilege(c.relnamespace, 'CREATE'), current_user::text,"
        " has_table_privilege(c.oid, 'UPDATE')"
        " FROM pg_class c WHERE c.oid = {}"
    ).format(Literal(oid))


def table_columns(oid: int) -> Composed:
    """Columns in order: name, type, not null, generated, identity kind, comment."""
    return SQL(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
        " a.attgenerated <> '', a.attidentity::text, col_description(a.attrelid, a.attnum)"
        " FROM pg_attribute a WHERE a.attrelid = {} AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY a.attnum"
    ).format(Literal(oid))


def table_indexes(oid: int) -> Composed:
    """Indexes: name, unique, full definition, the exact prefix before the access method,
    the constraint it backs (if any) and its comment."""
    return SQL(
        "SELECT ic.relname, i.indisunique, pg_get_indexdef(i.indexrelid),"
        " 'CREATE ' || CASE WHEN i.indisunique THEN 'UNIQUE ' ELSE '' END || 'INDEX '"
        "   || quote_ident(ic.relname) || ' ON '"
        "   || CASE WHEN c.relkind = 'p' THEN 'ONLY ' ELSE '' END || quote_ident(n.nspname) || '.'"
        "   || quote_ident(c.relname) || ' USING ',"
        " con.conname, con.contype::text, obj_description(ic.oid, 'pg_class')"
        " FROM pg_index i"
        " JOIN pg_class ic ON ic.oid = i.indexrelid"
        " JOIN pg_class c ON c.oid = i.indrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = c.oid"
        "   AND con.contype IN ('p', 'u', 'x')"
        " WHERE i.indrelid = {} ORDER BY ic.relname"
    ).format(Literal(oid))


def table_constraints(oid: int) -> Composed:
    """PK, unique, check, foreign-key and exclusion constraints with their definitions."""
    return SQL(
        "SELECT con.conname, con.contype::text, pg_get_constraintdef(con.oid), con.convalidated,"
        " ic.relname, obj_description(con.oid, 'pg_constraint'), con.confrelid = con.conrelid,"
        " con.condeferrable, con.condeferred"
        " FROM pg_constraint con LEFT JOIN pg_class ic ON ic.oid = con.conindid"
        " WHERE con.conrelid = {} AND con.contype IN ('p', 'u', 'c', 'f', 'x')"
        " ORDER BY con.conname"
    ).format(Literal(oid))


def table_triggers(oid: int) -> Composed:
    """User triggers (not the internal ones of foreign keys): name, definition, enabled state."""
    return SQL(
        "SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled::text FROM pg_trigger t"
        " WHERE t.tgrelid = {} AND NOT t.tgisinternal ORDER BY t.tgname"
    ).format(Literal(oid))


def table_grants(oid: int) -> Composed:
    """Table and column privileges: grantee (empty for PUBLIC), privilege, grantable, column."""
    return SQL(
        "SELECT coalesce(r.rolname, ''), a.privilege_type, a.is_grantable, NULL::name"
        " FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee"
        " WHERE c.oid = {0}"
        " UNION ALL"
        " SELECT coalesce(r.rolname, ''), a.privilege_type, a.is_grantable, att.attname"
        " FROM pg_attribute att, aclexplode(att.attacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee"
        " WHERE att.attrelid = {0} AND att.attnum > 0 AND NOT att.attisdropped"
        " ORDER BY 4 NULLS FIRST, 1, 2"
    ).format(Literal(oid))


def referencing_keys(oid: int) -> Composed:
    """Foreign keys of other tables that reference the target."""
    return SQL(
        "SELECT n.nspname, c.relname, con.conname, pg_get_constraintdef(con.oid), con.convalidated"
        " FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE con.contype = 'f' AND con.confrelid = {0} AND con.conrelid <> {0}"
        " ORDER BY 1, 2, 3"
    ).format(Literal(oid))


def owned_sequences(oid: int) -> Composed:
    """Sequences tied to the target's columns: serial (auto) or identity (internal)."""
    return SQL(
        "SELECT n.nspname, s.relname, a.attname,"
        " CASE d.deptype WHEN 'i' THEN 'identity' ELSE 'serial' END"
        " FROM pg_depend d JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'"
        " JOIN pg_namespace n ON n.oid = s.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid"
        " WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass"
        " AND d.refobjid = {} AND d.refobjsubid > 0"  # (not the partitions' rows: 0)
        " AND d.deptype IN ('a', 'i') ORDER BY a.attnum"
    ).format(Literal(oid))


def sequence_state(schema: str, name: str) -> Composed:
    """A sequence's ``last_value``, ``is_called`` and increment."""
    return SQL(
        "SELECT s.last_value, s.is_called, q.seqincrement FROM {} s, pg_catalog.pg_sequence q"
        " WHERE q.seqrelid = {}::regclass"
    ).format(_table(schema, name), Literal(Identifier(schema, name).as_string()))


def dependent_views(oid: int) -> Composed:
    """Views and materialized views that read the target directly, with their definitions."""
    return SQL(
        "SELECT DISTINCT n.nspname, v.relname, v.relkind::text, pg_get_viewdef(v.oid),"
        " coalesce(v.reloptions, '{{}}'::text[])"
        " FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid"
        " JOIN pg_class v ON v.oid = r.ev_class JOIN pg_namespace n ON n.oid = v.relnamespace"
        " WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass"
        " AND d.refobjid = {0} AND v.oid <> {0} ORDER BY 1, 2"
    ).format(Literal(oid))


def unsupported_dependents(oid: int) -> Composed:
    """Objects depending on the target that a replace cannot carry over (policies, rules,
    publications, statistics objects, functions, ...), described in words. Views and
    materialized views are not listed here: :func:`dependent_views` reads them."""
    return SQL(
        "SELECT DISTINCT pg_describe_object(d.classid, d.objid, 0) FROM pg_depend d"
        " WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = {0}"
        " AND d.deptype IN ('n', 'a')"
        " AND d.classid NOT IN ('pg_constraint'::regclass, 'pg_trigger'::regclass,"
        "   'pg_attrdef'::regclass, 'pg_type'::regclass)"
        # a relation's automatic dependents: its indexes, owned sequences and partitions
        " AND NOT (d.classid = 'pg_class'::regclass AND d.deptype = 'a')"
        " AND NOT (d.classid = 'pg_class'::regclass"
        "   AND (SELECT relkind FROM pg_class WHERE oid = d.objid) IN ('i', 'S', 't'))"
        " AND NOT (d.classid = 'pg_rewrite'::regclass AND EXISTS ("
        "   SELECT 1 FROM pg_rewrite r JOIN pg_class v ON v.oid = r.ev_class"
        "   WHERE r.oid = d.objid AND r.rulename = '_RETURN' AND v.relkind IN ('v', 'm')"
        "   AND v.oid <> {0}))"
        " ORDER BY 1"
    ).format(Literal(oid))


def staging_state(schema: str, staging: str) -> Composed:
    """What finalize already built on staging (so a retried finalize goes on where it stopped):
    rows of ('persistence', p/u, NULL), ('index', name, valid), ('constraint', name, validated)."""
    return SQL(
        "WITH s AS (SELECT c.oid, c.relpersistence FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = {} AND c.relname = {})"
        " SELECT 'persistence', s.relpersistence::text, NULL::bool FROM s"
        " UNION ALL SELECT 'index', ic.relname::text, i.indisvalid FROM s"
        " JOIN pg_index i ON i.indrelid = s.oid JOIN pg_class ic ON ic.oid = i.indexrelid"
        " UNION ALL SELECT 'constraint', con.conname::text, con.convalidated FROM s"
        " JOIN pg_constraint con ON con.conrelid = s.oid AND con.contype <> 'n'"
    ).format(Literal(schema), Literal(staging))


def run_tables(schema: str, pattern: str) -> Composed:
    """Tables in ``schema`` whose names match a LIKE pattern (a run's leftovers), but for the
    partitions of such a table: dropping it drops them, in one transaction (a partitioned
    staging has one partition per target partition, and a commit each cost a WAL flush each)."""
    return SQL(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = {s} AND c.relname LIKE {p} AND c.relkind IN ('r', 'p')"
        " AND NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class up ON up.oid = i.inhparent"
        " WHERE i.inhrelid = c.oid AND up.relnamespace = n.oid AND up.relname LIKE {p})"
        " ORDER BY c.relname"
    ).format(s=Literal(schema), p=Literal(pattern))


# --- staging and ledger ----------------------------------------------------------------------


def create_staging_like(
    schema: str, staging: str, table: str, *, logged: bool, server_version: int
) -> Composed:
    """A table with the target's columns, defaults, identity and generated columns, NOT NULL,
    storage and compression, and no indexes, constraints or triggers; autovacuum off."""
    include = ["DEFAULTS", "IDENTITY", "GENERATED", "STORAGE"]
    if server_version >= 140000:
        include.append("COMPRESSION")
    including = SQL(" ").join(SQL("INCLUDING " + word) for word in include)
    return SQL("CREATE {}TABLE {} (LIKE {} {}) WITH (autovacuum_enabled = false)").format(
        SQL("" if logged else "UNLOGGED "),
        _table(schema, staging),
        _table(schema, table),
        including,
    )


def create_staging_columns(
    schema: str, staging: str, table: str, columns: Sequence[str], *, logged: bool
) -> Composed:
    """A bare table with just the loaded columns' types (no NOT NULL, no defaults): the target
    itself checks every row when they are inserted from it."""
    return SQL(
        "CREATE {}TABLE {} WITH (autovacuum_enabled = false) AS SELECT {} FROM {} WITH NO DATA"
    ).format(
        SQL("" if logged else "UNLOGGED "),
        _table(schema, staging),
        _columns(columns),
        _table(schema, table),
    )


def create_ledger(schema: str, ledger: str) -> Composed:
    """The ledger: a partition's row is committed in the same transaction as its data."""
    return SQL(
        "CREATE TABLE {} (partition integer PRIMARY KEY, rows bigint NOT NULL DEFAULT 0,"
        " bytes bigint NOT NULL DEFAULT 0, seconds double precision NOT NULL DEFAULT 0,"
        " rejects bigint NOT NULL DEFAULT 0, loaded_at timestamptz NOT NULL DEFAULT now(),"
        " misaligned boolean NOT NULL DEFAULT false,"
        " copy_xid bigint NOT NULL DEFAULT txid_current() % 4294967296)"
    ).format(_table(schema, ledger))


def create_pieces(schema: str, name: str) -> Composed:
    """The load's pieces: one row per partition, its pieces as the text of a JSON array, ASCII
    only (kept as text: ``jsonb`` would turn ``\\u`` escapes into characters the database's
    encoding may lack); dropped with staging and the ledger."""
    return SQL(
        "CREATE TABLE {} (partition integer PRIMARY KEY, pieces text NOT NULL)"
        " WITH (autovacuum_enabled = false)"
    ).format(_table(schema, name))


def insert_pieces(schema: str, name: str, rows: Sequence[tuple[int, str]]) -> Composed:
    """Store the pieces of each partition: ``(partition, pieces as JSON text)``."""
    values = SQL(", ").join(
        SQL("({}, {})").format(Literal(index), Literal(text)) for index, text in rows
    )
    return SQL("INSERT INTO {} (partition, pieces) VALUES {}").format(_table(schema, name), values)


def select_pieces(schema: str, name: str, partitions: Sequence[int]) -> Composed:
    """The stored pieces (JSON text) of these partitions."""
    return SQL(
        "SELECT partition, pieces FROM {} WHERE partition = ANY({}::integer[]) ORDER BY partition"
    ).format(_table(schema, name), Literal(list(partitions)))


def create_reject_table(schema: str, name: str) -> Composed:
    """Where rejected rows go (kept after the load; one row per rejected source record)."""
    return SQL(
        "CREATE TABLE IF NOT EXISTS {} (load_id text NOT NULL, target text NOT NULL,"
        " source_file text NOT NULL, line bigint, raw_line text, error text NOT NULL,"
        " rejected_at timestamptz NOT NULL DEFAULT now())"
    ).format(_table(schema, name))


def insert_reject(
    schema: str,
    name: str,
    *,
    load_id: str,
    target: str,
    source_file: str,
    line: int,
    raw_line: str,
    error: str,
) -> Composed:
    """Record one rejected row (same transaction as its partition's good rows)."""
    return SQL(
        "INSERT INTO {} (load_id, target, source_file, line, raw_line, error)"
        " VALUES ({}, {}, {}, {}, {}, {})"
    ).format(
        _table(schema, name),
        Literal(load_id),
        Literal(target),
        Literal(source_file),
        Literal(line),
        Literal(raw_line),
        Literal(error),
    )


def savepoint(name: str) -> Composed:
    """Mark a point the partition's transaction can roll back to."""
    return SQL("SAVEPOINT {}").format(Identifier(name))


def rollback_to(name: str) -> Composed:
    """Undo back to the savepoint (which stays)."""
    return SQL("ROLLBACK TO SAVEPOINT {}").format(Identifier(name))


def release(name: str) -> Composed:
    """Forget the savepoint, keeping its work."""
    return SQL("RELEASE SAVEPOINT {}").format(Identifier(name))


def drop_table(schema: str, name: str, *, if_exists: bool = False) -> Composed:
    """``DROP TABLE`` without CASCADE: anything unexpected depending on it stops the drop."""
    return SQL("DROP TABLE {}{}").format(
        SQL("IF EXISTS " if if_exists else ""), _table(schema, name)
    )


def claim_partition(schema: str, ledger: str, partition: int) -> Composed:
    """Insert the partition's ledger row; returns nothing if it was committed before."""
    return SQL(
        "INSERT INTO {} (partition) VALUES ({}) ON CONFLICT (partition) DO NOTHING"
        " RETURNING partition"
    ).format(_table(schema, ledger), Literal(partition))


def record_partition(
    schema: str,
    ledger: str,
    partition: int,
    rows: int,
    nbytes: int,
    seconds: float,
    rejects: int = 0,
) -> Composed:
    """Fill in the partition's figures (same transaction as its rows)."""
    return SQL(
        "UPDATE {} SET rows = {}, bytes = {}, seconds = {}, rejects = {} WHERE partition = {}"
    ).format(
        _table(schema, ledger),
        Literal(rows),
        Literal(nbytes),
        Literal(seconds),
        Literal(rejects),
        Literal(partition),
    )


def partition_figures(schema: str, ledger: str, partition: int) -> Composed:
    """The committed figures of one partition."""
    return SQL("SELECT rows, bytes, seconds, rejects FROM {} WHERE partition = {}").format(
        _table(schema, ledger), Literal(partition)
    )


# --- ranges whose guessed start was wrong (see ranges.py) ------------------------------------


def record_misaligned(schema: str, ledger: str, partition: int) -> Composed:
    """Commit a partition with no rows, marked for finalize to load again from exact bounds."""
    return SQL(
        "INSERT INTO {} (partition, misaligned) VALUES ({}, true)"
        " ON CONFLICT (partition) DO UPDATE SET misaligned = true"
    ).format(_table(schema, ledger), Literal(partition))


def misaligned_partitions(schema: str, ledger: str) -> Composed:
    """The partitions marked for loading again."""
    return SQL("SELECT partition FROM {} WHERE misaligned ORDER BY partition").format(
        _table(schema, ledger)
    )


def mark_misaligned(schema: str, ledger: str, partitions: Sequence[int]) -> Composed:
    """Mark committed partitions for loading again (before any of their rows is deleted)."""
    return SQL("UPDATE {} SET misaligned = true WHERE partition = ANY({})").format(
        _table(schema, ledger), Literal(list(partitions))
    )


def delete_partition_rows(schema: str, staging: str, ledger: str, partition: int) -> Composed:
    """Delete a partition's rows from staging: the rows its COPY transaction wrote, whose
    ``xmin`` is the transaction id the partition's ledger row recorded (``copy_xid``)."""
    return SQL(
        "DELETE FROM {} WHERE xmin::text::bigint = (SELECT copy_xid FROM {} WHERE partition = {})"
    ).format(_table(schema, staging), _table(schema, ledger), Literal(partition))


def forget_partition(schema: str, ledger: str, partition: int) -> Composed:
    """Remove a partition's ledger row (in the transaction that loads it again)."""
    return SQL("DELETE FROM {} WHERE partition = {}").format(
        _table(schema, ledger), Literal(partition)
    )


FINALIZED = -1  # the ledger row that says the load became visible


def mark_finalized(schema: str, ledger: str, rows: int, nbytes: int, rejects: int) -> Composed:
    """Note in the ledger, in the transaction that makes the load visible, that it did: a
    finalize retried after that commit (its acknowledgement lost) then does nothing."""
    return SQL(
        "INSERT INTO {} (partition, rows, bytes, rejects) VALUES ({}, {}, {}, {})"
        " ON CONFLICT (partition) DO NOTHING"
    ).format(
        _table(schema, ledger), Literal(FINALIZED), Literal(rows), Literal(nbytes), Literal(rejects)
    )


def ledger_rows(schema: str, ledger: str) -> Composed:
    """Every committed partition with its figures."""
    return SQL("SELECT partition, rows, bytes, seconds, rejects FROM {} ORDER BY partition").format(
        _table(schema, ledger)
    )


def copy_span(schema: str, ledger: str) -> Composed:
    """First COPY start and last COPY end of the committed partitions (``loaded_at`` is the
    start of the partition's transaction), and the server's clock now; epoch seconds."""
    return SQL(
        "SELECT extract(epoch FROM min(loaded_at)),"
        " extract(epoch FROM max(loaded_at + seconds * interval '1 second')),"
        " extract(epoch FROM clock_timestamp()) FROM {} WHERE partition <> {}"
    ).format(_table(schema, ledger), Literal(FINALIZED))


def relation_exists(schema: str, name: str) -> Composed:
    """Whether a table (or any relation) of that name exists."""
    return SQL("SELECT to_regclass({}) IS NOT NULL").format(
        Literal(Identifier(schema, name).as_string())
    )


def relation_size(schema: str, name: str) -> Composed:
    """Size of a table's main fork in bytes (0 after a crash emptied an unlogged table); of a
    partitioned table, its partitions' together."""
    return SQL(
        "SELECT coalesce((SELECT sum(pg_relation_size(relid))"
        " FROM pg_partition_tree({0}::regclass)), pg_relation_size({0}::regclass))"
    ).format(Literal(Identifier(schema, name).as_string()))


def copy_from_stdin(
    schema: str,
    staging: str,
    columns: Sequence[str],
    opts: CopyOptions,
    *,
    skip_bad_values: bool = False,
    reject_limit: int | None = None,
) -> Composed:
    """``COPY staging (columns) FROM STDIN WITH (...)``: never a server-side file.

    ``skip_bad_values`` (PostgreSQL 17+): ``ON_ERROR ignore`` with a NOTICE per skipped row;
    ``reject_limit`` (18+): fail after that many skipped rows."""
    options: list[Composable] = [
        SQL("FORMAT {}").format(SQL(opts.format)),
        SQL("DELIMITER {}").format(Literal(opts.effective_delimiter)),
        SQL("ENCODING {}").format(Literal(opts.encoding)),
    ]
    if opts.null is not None:
        options.append(SQL("NULL {}").format(Literal(opts.null)))
    if opts.format == "csv":
        options.append(SQL("QUOTE {}").format(Literal(opts.quote)))
        options.append(SQL("ESCAPE {}").format(Literal(opts.effective_escape)))
    if skip_bad_values:
        options.append(SQL("ON_ERROR ignore"))
        options.append(SQL("LOG_VERBOSITY verbose"))
    if reject_limit is not None:
        options.append(SQL("REJECT_LIMIT {}").format(Literal(reject_limit)))
    return SQL("COPY {} ({}) FROM STDIN WITH ({})").format(
        _table(schema, staging), _columns(columns), SQL(", ").join(options)
    )


# --- finalize --------------------------------------------------------------------------------


def set_logged(schema: str, name: str) -> Composed:
    """Make an unlogged staging table logged (re-writes it into WAL)."""
    return SQL("ALTER TABLE {} SET LOGGED").format(_table(schema, name))


def create_index(schema: str, table: str, name: str, *, unique: bool, tail: str) -> Composed:
    """Build a captured index on staging: ``tail`` is the server's text after ``USING``."""
    return SQL("CREATE {}INDEX {} ON {} USING {}").format(
        SQL("UNIQUE " if unique else ""), Identifier(name), _table(schema, table), SQL(tail)
    )


def drop_index(schema: str, name: str) -> Composed:
    """Drop an index (an invalid leftover of an interrupted build)."""
    return SQL("DROP INDEX {}").format(_table(schema, name))


def add_key_using_index(
    schema: str, table: str, name: str, *, kind: str, index: str, deferrable: bool, deferred: bool
) -> Composed:
    """Turn a built unique index into the PRIMARY KEY or UNIQUE constraint (no re-scan)."""
    keyword = {ConstraintKind.PRIMARY_KEY: "PRIMARY KEY", ConstraintKind.UNIQUE: "UNIQUE"}[kind]
    timing = ""
    if deferrable:
        timing = " DEFERRABLE INITIALLY DEFERRED" if deferred else " DEFERRABLE"
    return SQL("ALTER TABLE {} ADD CONSTRAINT {} {} USING INDEX {}{}").format(
        _table(schema, table), Identifier(name), SQL(keyword), Identifier(index), SQL(timing)
    )


def add_constraint(
    schema: str, table: str, name: str, definition: str, *, not_valid: bool = False
) -> Composed:
    """Add a captured constraint definition, optionally ``NOT VALID`` (checked later)."""
    return SQL("ALTER TABLE {} ADD CONSTRAINT {} {}{}").format(
        _table(schema, table),
        Identifier(name),
        SQL(definition),
        SQL(" NOT VALID" if not_valid else ""),
    )


def validate_constraint(schema: str, table: str, name: str) -> Composed:
    """Check existing rows against a NOT VALID constraint (no exclusive lock)."""
    return SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(
        _table(schema, table), Identifier(name)
    )


def drop_constraint(schema: str, table: str, name: str, *, if_exists: bool = False) -> Composed:
    """Drop a constraint (a referencing foreign key, re-added to the new table)."""
    return SQL("ALTER TABLE {} DROP CONSTRAINT {}{}").format(
        _table(schema, table), SQL("IF EXISTS " if if_exists else ""), Identifier(name)
    )


def analyze(schema: str, table: str) -> Composed:
    """Planner statistics for the loaded table."""
    return SQL("ANALYZE {}").format(_table(schema, table))


_LOCK_MODES = frozenset({"SHARE UPDATE EXCLUSIVE", "SHARE", "EXCLUSIVE", "ACCESS EXCLUSIVE"})


def lock_tables(tables: Sequence[tuple[str, str]], mode: str, *, only: bool = False) -> Composed:
    """``LOCK TABLE a, b IN <mode> MODE`` (in that order); waits at most ``lock_timeout``.
    ``only``: ``LOCK TABLE ONLY …``, not the partitions of a partitioned table (without it
    every partition is locked too, one after another)."""
    if mode not in _LOCK_MODES:
        raise ValueError(f"unsupported lock mode {mode!r}")
    prefix = SQL("ONLY ") if only else SQL("")
    return SQL("LOCK TABLE {} IN {} MODE").format(
        SQL(", ").join(prefix + _table(schema, name) for schema, name in tables), SQL(mode)
    )


def setting_milliseconds(name: str) -> Composed:
    """A time setting of the session in milliseconds (``lock_timeout``: 0 means no limit)."""
    return SQL("SELECT setting::bigint FROM pg_settings WHERE name = {}").format(Literal(name))


def parallel_limits() -> SQL:
    """The server's ceilings on parallel workers: ``max_worker_processes``,
    ``max_parallel_workers`` (readable by any role)."""
    return SQL(
        "SELECT current_setting('max_worker_processes')::int,"
        " current_setting('max_parallel_workers')::int"
    )


def rename_table(schema: str, old: str, new: str) -> Composed:
    """Rename a table within its schema."""
    return SQL("ALTER TABLE {} RENAME TO {}").format(_table(schema, old), Identifier(new))


def rename_constraint(schema: str, table: str, old: str, new: str) -> Composed:
    """Rename a constraint (and the index behind a key)."""
    return SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
        _table(schema, table), Identifier(old), Identifier(new)
    )


def rename_index(schema: str, old: str, new: str) -> Composed:
    """Rename an index within its schema."""
    return SQL("ALTER INDEX {} RENAME TO {}").format(_table(schema, old), Identifier(new))


def rename_sequence(schema: str, old: str, new: str) -> Composed:
    """Rename a sequence within its schema."""
    return SQL("ALTER SEQUENCE {} RENAME TO {}").format(_table(schema, old), Identifier(new))


def sequence_owned_by(schema: str, sequence: str, table: str, column: str) -> Composed:
    """Move a serial column's sequence to the new table, so dropping the old one keeps it."""
    return SQL("ALTER SEQUENCE {} OWNED BY {}").format(
        _table(schema, sequence), Identifier(schema, table, column)
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
        _table(schema, name), with_options, SQL(body.strip().rstrip(";"))
    )


def execute_definition(definition: str) -> SQL:
    """Run a complete statement the server rendered (``pg_get_triggerdef``)."""
    return SQL(definition)


def set_trigger_state(schema: str, table: str, trigger: str, state: str) -> Composed:
    """Restore a trigger's enabled state (disabled, replica or always)."""
    return SQL("ALTER TABLE {} {} TRIGGER {}").format(
        _table(schema, table), SQL(_TRIGGER_STATES[state]), Identifier(trigger)
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
        _table(schema, table),
        Identifier(grantee) if grantee else SQL("PUBLIC"),
        SQL(" WITH GRANT OPTION" if grantable else ""),
    )


def set_owner(schema: str, table: str, owner: str) -> Composed:
    """Give the new table the old one's owner."""
    return SQL("ALTER TABLE {} OWNER TO {}").format(_table(schema, table), Identifier(owner))


def comment_on(kind: str, target: Composable, text: str | None) -> Composed:
    """``COMMENT ON {TABLE|COLUMN|INDEX} target IS text``."""
    if kind not in {"TABLE", "COLUMN", "INDEX"}:
        raise ValueError(f"unsupported comment kind {kind!r}")
    return SQL("COMMENT ON {} {} IS {}").format(SQL(kind), target, Literal(text))


def comment_on_constraint(schema: str, table: str, name: str, text: str | None) -> Composed:
    """``COMMENT ON CONSTRAINT name ON table IS text``."""
    return SQL("COMMENT ON CONSTRAINT {} ON {} IS {}").format(
        Identifier(name), _table(schema, table), Literal(text)
    )


def qualified(*names: str) -> Identifier:
    """A (schema-)qualified name, for :func:`comment_on`."""
    return Identifier(*names)


def set_reloptions(schema: str, table: str, options: Iterable[str]) -> Composed:
    """Restore the target's storage parameters on the new table."""
    pairs = [option.split("=", 1) for option in options]
    return SQL("ALTER TABLE {} SET ({})").format(
        _table(schema, table),
        SQL(", ").join(
            SQL("{} = {}").format(SQL(_reloption_name(k)), Literal(v)) for k, v in pairs
        ),
    )


def reset_autovacuum(schema: str, table: str) -> Composed:
    """Undo the staging table's ``autovacuum_enabled = false``."""
    return SQL("ALTER TABLE {} RESET (autovacuum_enabled)").format(_table(schema, table))


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
        _table(schema, table),
        _columns(columns),
        SQL(" OVERRIDING SYSTEM VALUE" if override_identity else ""),
        _columns(columns),
        _table(schema, staging),
    )


def count_rows(schema: str, table: str) -> Composed:
    """Exact row count."""
    return SQL("SELECT count(*) FROM {}").format(_table(schema, table))


# --- the plan a ledger belongs to, and the history of finalized loads ------------------------


def ledger_digest(schema: str, ledger: str) -> Composed:
    """The digest of the plan the ledger was made for (the first line of its comment: see
    :func:`airflow_pg_bulk.steps.ledger_comment`), or NULL."""
    return SQL(
        "SELECT split_part(obj_description(to_regclass({}), 'pg_class'), chr(10), 1)"
    ).format(Literal(Identifier(schema, ledger).as_string()))


def load_ledgers(schema: str, pattern: str) -> Composed:
    """Every load's ledger in ``schema`` (``pattern``:
    :data:`airflow_pg_bulk.naming.LEDGER_PATTERN`), with its comment. A load's tables last as
    long as its ledger: cleanup drops it last."""
    return SQL(
        "SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = {}"
        " AND c.relname LIKE {} AND c.relkind = 'r' ORDER BY c.relname"
    ).format(Literal(schema), Literal(pattern))


def ledger_activity(schema: str, ledger: str) -> Composed:
    """Whether the load was finalized, the end of its last committed COPY (epoch seconds, NULL
    if none), and the server's clock (epoch seconds)."""
    return SQL(
        "SELECT coalesce(bool_or(partition = {}), false),"
        " extract(epoch FROM max(loaded_at + seconds * interval '1 second'))::float8,"
        " extract(epoch FROM now())::float8 FROM {}"
    ).format(Literal(FINALIZED), _table(schema, ledger))


def load_sessions(application_prefix: str) -> Composed:
    """How many other sessions are named ``<application_prefix>…`` (a load's steps name theirs
    ``pgbulk:<load id>:…``; see :func:`airflow_pg_bulk.naming.application_name`)."""
    return SQL(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        " AND starts_with(application_name, {})"
    ).format(Literal(application_prefix))


def now_epoch() -> SQL:
    """The server's clock (the transaction's start), in epoch seconds."""
    return SQL("SELECT extract(epoch FROM now())::float8")


def interval_seconds(text: str) -> Composed:
    """A PostgreSQL interval (``1d``, ``12 hours``) in seconds; an error if it is not one."""
    return SQL("SELECT date_part('epoch', {}::interval)").format(Literal(text))


def table_privileges(schema: str, name: str, privileges: str) -> Composed:
    """Whether the session's role holds every one of ``privileges`` on the table."""
    return SQL("SELECT has_table_privilege({}, {})").format(
        Literal(Identifier(schema, name).as_string()), Literal(privileges)
    )


#: the load history's columns that the ordering rule added (an older history gets them by
#: :func:`upgrade_load_history`): the DAG task that loads the target (its scope), the run, its
#: data interval, and the partitions a ``replace_partitions`` swapped (NULL: the whole target)
LOAD_HISTORY_ORDER_COLUMNS = ("scope", "run_id", "interval_start", "interval_end", "parts")


def create_load_history(schema: str, name: str) -> Composed:
    """One row per finalized load, kept (a few, see :func:`trim_load_history`): what made
    each load visible, and when, for which run and data interval."""
    return SQL(
        "CREATE TABLE {} (load_id text PRIMARY KEY, target text NOT NULL, mode text NOT NULL,"
        " logical_date timestamptz, rows bigint NOT NULL, rejects bigint NOT NULL DEFAULT 0,"
        " finalized_at timestamptz NOT NULL DEFAULT now(), scope text, run_id text,"
        " interval_start timestamptz, interval_end timestamptz, parts text[])"
    ).format(_table(schema, name))


def missing_columns(schema: str, name: str, columns: Sequence[str]) -> Composed:
    """Which of ``columns`` the table lacks."""
    return SQL(
        "SELECT c FROM unnest({}) AS c WHERE NOT EXISTS (SELECT FROM pg_attribute"
        " WHERE attrelid = to_regclass({}) AND attname = c AND NOT attisdropped)"
    ).format(_text_array(columns), Literal(Identifier(schema, name).as_string()))


def upgrade_load_history(schema: str, name: str) -> Composed:
    """Give a load history made by an earlier version the ordering rule's columns."""
    types = {
        "scope": "text",
        "run_id": "text",
        "interval_start": "timestamptz",
        "interval_end": "timestamptz",
        "parts": "text[]",
    }
    return SQL("ALTER TABLE {} {}").format(
        _table(schema, name),
        SQL(", ").join(
            SQL("ADD COLUMN IF NOT EXISTS {} {}").format(Identifier(c), SQL(types[c]))
            for c in LOAD_HISTORY_ORDER_COLUMNS
        ),
    )


def create_load_history_index(schema: str, name: str, index: str) -> Composed:
    """The index the ordering rule's lookup and the trimming read: the loads of one target
    and scope by data interval."""
    return SQL(
        "CREATE INDEX IF NOT EXISTS {} ON {} (target, scope, interval_end, interval_start)"
    ).format(Identifier(index), _table(schema, name))


def record_load(
    schema: str,
    name: str,
    *,
    load_id: str,
    target: str,
    mode: str,
    logical_date: str | None,
    rows: int,
    rejects: int,
    scope: str | None = None,
    run_id: str | None = None,
    interval: tuple[str, str] | None = None,
    parts: Sequence[str] | None = None,
) -> Composed:
    """Note a load as finalized (in the transaction that makes it visible)."""
    start, end = interval or (None, None)
    return SQL(
        "INSERT INTO {} (load_id, target, mode, logical_date, rows, rejects, scope, run_id,"
        " interval_start, interval_end, parts)"
        " VALUES ({}, {}, {}, {}::timestamptz, {}, {}, {}, {}, {}::timestamptz, {}::timestamptz,"
        " {}) ON CONFLICT (load_id) DO UPDATE SET"
        " logical_date = EXCLUDED.logical_date, rows = EXCLUDED.rows,"
        " rejects = EXCLUDED.rejects, finalized_at = now(), scope = EXCLUDED.scope,"
        " run_id = EXCLUDED.run_id, interval_start = EXCLUDED.interval_start,"
        " interval_end = EXCLUDED.interval_end, parts = EXCLUDED.parts"
    ).format(
        _table(schema, name),
        Literal(load_id),
        Literal(target),
        Literal(mode),
        Literal(logical_date),
        Literal(rows),
        Literal(rejects),
        Literal(scope),
        Literal(run_id),
        Literal(start),
        Literal(end),
        SQL("NULL::text[]") if parts is None else _text_array(parts),
    )


def load_record(schema: str, name: str, load_id: str) -> Composed:
    """Rows, rejects and finalization time of a finalized load (no row: never finalized)."""
    return SQL("SELECT rows, rejects, finalized_at::text FROM {} WHERE load_id = {}").format(
        _table(schema, name), Literal(load_id)
    )


#: the modes whose loads replace rows: the ordering rule compares their loads
ORDERED_MODES = ("replace", "replace_partitions", "upsert")


def newer_load(
    schema: str,
    name: str,
    *,
    target: str,
    scope: str,
    interval: tuple[str, str],
    load_id: str,
    parts: Sequence[str] | None = None,
) -> Composed:
    """The newest other load into ``target`` by the same ``scope`` (DAG and task) whose data
    interval is later than ``interval`` (by its end, then its start) and that replaced some
    of the same rows: the whole target, or one of ``parts`` (None: the whole target). An
    index range scan of :func:`create_load_history_index` (only the later loads are read)."""
    start, end = interval
    overlap = (
        SQL("")
        if parts is None
        else SQL(" AND (parts IS NULL OR parts && {})").format(_text_array(parts))
    )
    return SQL(
        "SELECT load_id, run_id, mode, interval_start::text, interval_end::text,"
        " finalized_at::text, parts FROM {} AS h"
        " WHERE target = {} AND scope = {}"
        " AND (interval_end, interval_start) > ({}::timestamptz, {}::timestamptz)"
        " AND mode = ANY({}) AND load_id <> {}{}"
        " ORDER BY h.interval_end DESC, h.interval_start DESC LIMIT 1"
    ).format(
        _table(schema, name),
        Literal(target),
        Literal(scope),
        Literal(end),
        Literal(start),
        _text_array(ORDERED_MODES),
        Literal(load_id),
        overlap,
    )


def trim_load_history(schema: str, name: str, *, target: str, keep: int) -> Composed:
    """Delete the loads into ``target`` beyond the ``keep`` last finalized, except the newest
    (by data interval) of each scope and partition, which the ordering rule needs. Returns
    the number deleted. Takes the target's trimming lock first and does nothing without it
    (another load is trimming the same rows)."""
    return SQL(
        "WITH locked AS (SELECT pg_try_advisory_xact_lock(hashtext('airflow_pg_bulk_trim'),"
        " hashtext({target})) AS got),"
        " loads AS (SELECT load_id, scope, finalized_at, interval_end, interval_start, parts"
        " FROM {table} WHERE target = {target} AND (SELECT got FROM locked)),"
        " kept AS ((SELECT load_id FROM loads ORDER BY finalized_at DESC, load_id LIMIT {keep})"
        " UNION (SELECT DISTINCT ON (scope, part) load_id FROM loads,"
        " unnest(coalesce(parts, ARRAY['']::text[])) AS part WHERE scope IS NOT NULL"
        " ORDER BY scope, part, interval_end DESC, interval_start DESC)),"
        " gone AS (DELETE FROM {table} h USING loads WHERE h.load_id = loads.load_id"
        " AND loads.load_id NOT IN (SELECT load_id FROM kept) RETURNING 1)"
        " SELECT count(*) FROM gone"
    ).format(table=_table(schema, name), target=Literal(target), keep=Literal(keep))


def _text_array(values: Iterable[str]) -> Composed:
    items = [Literal(v) for v in values]
    if not items:
        return SQL("'{{}}'::text[]").format()
    return SQL("ARRAY[{}]::text[]").format(SQL(", ").join(items))


# --- upsert ----------------------------------------------------------------------------------

#: The setting each COPY task sets (``SET LOCAL``) to its piece's ordinal in source order; the
#: staging column :data:`SOURCE_ORDER` reads it in its DEFAULT (see docs/design.md, "upsert").
PIECE_SETTING = "pgbulk.piece"
SOURCE_ORDER = "_pgbulk_source_order"
PIECE_SHIFT = 40  # a load's rows are numbered below 2**40 (a trillion) within the ordinal


def unique_indexes(oid: int, server_version: int) -> Composed:
    """The target's valid unique indexes: name, key columns in order (none with an expression),
    primary, the constraint behind it, deferrable, partial, NULLS NOT DISTINCT (15+)."""
    nulls = SQL("i.indnullsnotdistinct" if server_version >= 150000 else "false")
    return SQL(
        "SELECT ic.relname,"
        " CASE WHEN i.indexprs IS NULL THEN ARRAY(SELECT a.attname"
        "   FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)"
        "   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        "   WHERE k.n <= i.indnkeyatts ORDER BY k.n)::text[] ELSE '{{}}'::text[] END,"
        " i.indisprimary, con.conname, NOT i.indimmediate, i.indpred IS NOT NULL, {}"
        " FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
        " LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid"
        "   AND con.conrelid = i.indrelid AND con.contype IN ('p', 'u')"
        " WHERE i.indrelid = {} AND i.indisunique AND i.indisvalid"
        " ORDER BY i.indisprimary DESC, ic.relname"
    ).format(nulls, Literal(oid))


def create_source_order_sequence(schema: str, name: str, *, unlogged: bool) -> Composed:
    """The sequence that numbers staged rows within their COPY session (cached per session:
    values one session takes increase, whatever the other sessions take)."""
    return SQL("CREATE {}SEQUENCE {} CACHE 1000").format(
        SQL("UNLOGGED " if unlogged else ""), _table(schema, name)
    )


def add_source_order(schema: str, staging: str, sequence: str) -> Composed:
    """Staging's provenance column: the COPY task's piece ordinal (from :data:`PIECE_SETTING`)
    in the high bits, the session's row number below; larger is later in source order."""
    return SQL(
        "ALTER TABLE {} ADD COLUMN {} bigint NOT NULL"
        " DEFAULT (current_setting({})::bigint << {}) + nextval({}::regclass)"
    ).format(
        _table(schema, staging),
        Identifier(SOURCE_ORDER),
        Literal(PIECE_SETTING),
        Literal(PIECE_SHIFT),
        Literal(Identifier(schema, sequence).as_string()),
    )


def sequence_owned_by_column(schema: str, sequence: str, table: str, column: str) -> Composed:
    """Tie a sequence to a column, so that dropping the table drops it."""
    return SQL("ALTER SEQUENCE {} OWNED BY {}").format(
        _table(schema, sequence), Identifier(schema, table, column)
    )


def _all_not_null(key: Sequence[str]) -> Composed:
    return SQL(" AND ").join(SQL("{} IS NOT NULL").format(Identifier(c)) for c in key)


def duplicate_keys(
    schema: str, staging: str, key: Sequence[str], *, key_may_be_null: bool
) -> Composed:
    """The first key staged more than once (each column as text), its count, and how many keys
    are; no row when every key is staged once. Keys with a NULL never match (when
    ``key_may_be_null``) and are left out."""
    where = SQL(" WHERE {}").format(_all_not_null(key)) if key_may_be_null else SQL("")
    return SQL(
        "SELECT {}, count(*), count(*) OVER () FROM {}{} GROUP BY {} HAVING count(*) > 1"
        " ORDER BY {} LIMIT 1"
    ).format(
        SQL(", ").join(SQL("{}::text").format(Identifier(c)) for c in key),
        _table(schema, staging),
        where,
        _columns(key),
        _columns(key),
    )


def upsert_from_staging(
    schema: str,
    table: str,
    staging: str,
    columns: Sequence[str],
    key: Sequence[str],
    *,
    latest_wins: bool,
    key_may_be_null: bool,
    override_identity: bool,
    where: str | None = None,
    drawn: Sequence[tuple[str, str, str]] = (),
) -> Composed:
    """Upsert in place: one ``INSERT … ON CONFLICT (key) DO UPDATE`` from staging, returning
    (rows inserted, rows updated). ``where``: only the staged rows that satisfy this
    server-rendered expression (a partition's constraint: the upsert of one partition).
    ``drawn``: identity columns not loaded, (column, sequence schema, name), whose inserted
    values are drawn from the sequence here (a partition of a partitioned target: before
    PostgreSQL 17 it does not apply its parent's identity); an updated row keeps its own.

    ``latest_wins``: staging may hold a key more than once; only its row latest in source
    order (the largest :data:`SOURCE_ORDER`) is upserted (``DISTINCT ON``, which also feeds
    the rows in key order). ``key_may_be_null``: rows with a NULL in the key never match a
    row (the index treats NULLs as distinct) and are all inserted. Inserted and updated are
    told apart by the new row version's ``xmax``: 0 for an insert; an ON CONFLICT update
    leaves the lock it took on the old version there (tested on every supported server)."""
    source: Composable = SQL("SELECT {} FROM {}").format(_columns(columns), _table(schema, staging))
    if latest_wins:
        source = latest_loaded(schema, staging, columns, key, key_may_be_null=key_may_be_null)
    updated = [c for c in columns if c not in key] or list(key[:1])
    values: list[Composable] = [Identifier(c) for c in columns]
    values += [
        SQL("nextval({}::regclass)").format(Literal(Identifier(s, n).as_string()))
        for _, s, n in drawn
    ]
    return SQL(
        "WITH upserted AS (INSERT INTO {} AS target ({}){} SELECT {} FROM ({}) AS loaded"
        "{} ON CONFLICT ({}) DO UPDATE SET {} RETURNING target.xmax = 0 AS inserted)"
        " SELECT count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted)"
        " FROM upserted"
    ).format(
        _table(schema, table),
        _columns([*columns, *(c for c, _, _ in drawn)]),
        SQL(" OVERRIDING SYSTEM VALUE" if override_identity or drawn else ""),
        SQL(", ").join(values),
        source,
        SQL(" WHERE ({})").format(SQL(where)) if where else SQL(""),
        _columns(key),
        SQL(", ").join(
            SQL("{} = EXCLUDED.{}").format(Identifier(c), Identifier(c)) for c in updated
        ),
    )


# --- strategy="rebuild" (append, upsert) ---------------------------------------------------


def target_size(oid: int) -> Composed:
    """What the strategy's cost model reads of the target: its main fork's bytes (exact and
    cheap), its estimated rows, and whether it has enabled user triggers."""
    return SQL(
        "SELECT pg_relation_size(c.oid), c.reltuples::bigint, EXISTS (SELECT 1 FROM pg_trigger t"
        " WHERE t.tgrelid = c.oid AND NOT t.tgisinternal AND t.tgenabled <> 'D')"
        " FROM pg_class c WHERE c.oid = {}"
    ).format(Literal(oid))


def lock_for_rebuild(schema: str, table: str) -> Composed:
    """Block writers (and other rebuilds) while the target's rows are read into the new table;
    readers go on reading the old table until the swap's ACCESS EXCLUSIVE."""
    return SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(_table(schema, table))


def _key_match(key: Sequence[str], nullable: Sequence[str], left: str, right: str) -> Composed:
    """``left.k = right.k AND …``; ``IS NOT DISTINCT FROM`` for the ``nullable`` columns (an
    index whose NULLs are not distinct matches NULL with NULL)."""
    return SQL(" AND ").join(
        SQL("{}.{} {} {}.{}").format(
            Identifier(left),
            Identifier(c),
            SQL("IS NOT DISTINCT FROM" if c in nullable else "="),
            Identifier(right),
            Identifier(c),
        )
        for c in key
    )


def copy_rows_over(
    schema: str,
    new: str,
    table: str,
    columns: Sequence[str],
    *,
    override_identity: bool,
    unless_loaded: tuple[str, Sequence[str], Sequence[str]] | None = None,
) -> Composed:
    """Rebuild: the target's rows into the new table (every column a COPY could fill;
    generated columns are computed again). ``unless_loaded`` = (staging, key, nullable key
    columns to match as not distinct): only the rows whose key is not in staging (upsert)."""
    where: Composable = SQL("")
    if unless_loaded is not None:
        staging, key, nullable = unless_loaded
        where = SQL(" WHERE NOT EXISTS (SELECT 1 FROM {} s WHERE {})").format(
            _table(schema, staging), _key_match(key, nullable, "s", "t")
        )
    return SQL("INSERT INTO {} ({}){} SELECT {} FROM {} t{}").format(
        _table(schema, new),
        _columns(columns),
        SQL(" OVERRIDING SYSTEM VALUE" if override_identity else ""),
        SQL(", ").join(SQL("t.{}").format(Identifier(c)) for c in columns),
        _table(schema, table),
        where,
    )


def latest_loaded(
    schema: str, staging: str, columns: Sequence[str], key: Sequence[str], *, key_may_be_null: bool
) -> Composed:
    """Upsert: staging's rows, the latest in source order per key (rows with a NULL in a key
    that may be NULL never match a row: all of them)."""
    source: Composable = SQL("SELECT DISTINCT ON ({}) {} FROM {}{} ORDER BY {}, {} DESC").format(
        _columns(key),
        _columns(columns),
        _table(schema, staging),
        SQL(" WHERE {}").format(_all_not_null(key)) if key_may_be_null else SQL(""),
        _columns(key),
        Identifier(SOURCE_ORDER),
    )
    if key_may_be_null:
        source = SQL("({}) UNION ALL SELECT {} FROM {} WHERE NOT ({})").format(
            source, _columns(columns), _table(schema, staging), _all_not_null(key)
        )
    return source


def insert_loaded_rebuild(
    schema: str,
    new: str,
    table: str,
    source: Composable,
    columns: Sequence[str],
    *,
    kept: Sequence[str] = (),
    drawn: Sequence[tuple[str, str, str]] = (),
    match: tuple[Sequence[str], Sequence[str]] | None = None,
    override_identity: bool,
) -> Composed:
    """Rebuild: loaded rows (``source`` selects ``columns``) into the new table.

    With ``match`` = (key, nullable key columns): only the rows whose key is in the target,
    taking the columns not loaded (``kept``) from the target's row — an update. Without: every
    row of ``source`` (an insert; the columns not loaded get their defaults, an identity
    column ``drawn`` = (column, sequence schema, name)
    its value from the target's own sequence, as an INSERT into the target would)."""
    names = [*columns, *kept, *(c for c, _, _ in drawn)]
    values: list[Composable] = [SQL("l.{}").format(Identifier(c)) for c in columns]
    tail: Composable = SQL("")
    if match is not None:
        key, nullable = match
        values += [SQL("t.{}").format(Identifier(c)) for c in kept]
        tail = SQL(" JOIN {} t ON {}").format(
            _table(schema, table), _key_match(key, nullable, "l", "t")
        )
    else:
        values += [
            SQL("nextval({}::regclass)").format(Literal(Identifier(s, n).as_string()))
            for _, s, n in drawn
        ]
    return SQL("INSERT INTO {} ({}){} SELECT {} FROM ({}) l{}").format(
        _table(schema, new),
        _columns(names),
        SQL(" OVERRIDING SYSTEM VALUE" if override_identity or drawn else ""),
        SQL(", ").join(values),
        source,
        tail,
    )


def loaded_not_in_target(
    schema: str, table: str, source: Composable, key: Sequence[str], nullable: Sequence[str]
) -> Composed:
    """``source`` (the latest loaded rows) less the rows whose key is in the target."""
    return SQL("SELECT l.* FROM ({}) l WHERE NOT EXISTS (SELECT 1 FROM {} t WHERE {})").format(
        source, _table(schema, table), _key_match(key, nullable, "l", "t")
    )


# --- finding the rows that break a constraint (airflow_pg_bulk.offenders) ----------------------

REPLAY_TABLE = "pgbulk_replay"  # a TEMP table: the source read again, each row numbered
REPLAY_ROW = "pgbulk_row"
_OPERATOR_NAME = frozenset("+-*/<>=~!@#%^&|`?")


def create_replay_table(schema: str, table: str, columns: Sequence[str]) -> list[Composed]:
    """A temporary table with the loaded columns' types (no NOT NULL, defaults or
    constraints) and a ``bigserial`` that numbers rows in the order COPY reads them."""
    replay = _table("pg_temp", REPLAY_TABLE)
    return [
        SQL("CREATE TEMP TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            replay, _columns(columns), _table(schema, table)
        ),
        SQL("ALTER TABLE {} ADD COLUMN {} bigserial").format(replay, Identifier(REPLAY_ROW)),
    ]


def violated_constraint(oid: int, name: str) -> Composed:
    """The target's constraint (or unique index without one) ``name``: its kind (``p u f c x``,
    ``i`` for such an index), key columns in order (empty when one is an expression), the
    referenced table's schema, name and columns (``f``), the operators' schemas and names
    (``x``), the expression (``c``), and whether it comes from a parent (a partition's
    share of its partitioned table's constraint or index)."""
    return SQL(
        "SELECT con.contype::text,"
        " CASE WHEN 0 = ANY(con.conkey) THEN '{{}}'::text[] ELSE ARRAY(SELECT a.attname"
        "   FROM unnest(con.conkey) WITH ORDINALITY k(attnum, n) JOIN pg_attribute a"
        "   ON a.attrelid = con.conrelid AND a.attnum = k.attnum ORDER BY k.n)::text[] END,"
        " fn.nspname::text, fc.relname::text,"
        " ARRAY(SELECT a.attname FROM unnest(con.confkey) WITH ORDINALITY k(attnum, n)"
        "   JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum"
        "   ORDER BY k.n)::text[],"
        " ARRAY(SELECT ns.nspname FROM unnest(con.conexclop) WITH ORDINALITY e(op, n)"
        "   JOIN pg_operator o ON o.oid = e.op JOIN pg_namespace ns ON ns.oid = o.oprnamespace"
        "   ORDER BY e.n)::text[],"
        " ARRAY(SELECT o.oprname FROM unnest(con.conexclop) WITH ORDINALITY e(op, n)"
        "   JOIN pg_operator o ON o.oid = e.op ORDER BY e.n)::text[],"
        " pg_get_expr(con.conbin, con.conrelid), con.conparentid <> 0 OR con.coninhcount > 0"
        " FROM pg_constraint con LEFT JOIN pg_class fc ON fc.oid = con.confrelid"
        " LEFT JOIN pg_namespace fn ON fn.oid = fc.relnamespace"
        " WHERE con.conrelid = {oid} AND con.conname = {name}"
        " UNION ALL"
        " SELECT 'i', CASE WHEN i.indexprs IS NULL THEN ARRAY(SELECT a.attname"
        "   FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)"
        "   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        "   WHERE k.n <= i.indnkeyatts ORDER BY k.n)::text[] ELSE '{{}}'::text[] END,"
        " NULL, NULL, '{{}}'::text[], '{{}}'::text[], '{{}}'::text[], NULL,"
        " EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)"
        " FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
        " WHERE i.indrelid = {oid} AND ic.relname = {name} AND i.indisunique"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid"
        "   AND c.conrelid = i.indrelid)"
    ).format(oid=Literal(oid), name=Literal(name))


def partition_with_constraint(oid: int, name: str) -> Composed:
    """The direct partition of the partitioned table ``oid`` that has a constraint or an index
    named ``name`` (its share of the parent's key, or a constraint of its own): its oid, name
    and partition constraint; one catalog lookup by name, whatever the number of partitions."""
    return SQL(
        "SELECT c.oid::int8, c.relname::text, pg_get_partition_constraintdef(c.oid)"
        " FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid"
        " WHERE h.inhparent = {oid} AND (EXISTS (SELECT 1 FROM pg_constraint con"
        "   WHERE con.conrelid = c.oid AND con.conname = {name})"
        " OR EXISTS (SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
        "   WHERE i.indrelid = c.oid AND ic.relname = {name}))"
        " LIMIT 1"
    ).format(oid=Literal(oid), name=Literal(name))


def _operator(op: tuple[str, str] | None) -> Composable:
    """``=``, or ``OPERATOR(schema.op)`` for an exclusion constraint's operator."""
    if op is None:
        return SQL("=")
    schema, name = op
    if not name or not set(name) <= _OPERATOR_NAME:
        raise ValueError(f"unexpected operator name {name!r}")
    return SQL("OPERATOR({}.{})").format(Identifier(schema), SQL(name))


def _conflict(
    key: Sequence[str], ops: Sequence[tuple[str, str] | None], left: str, right: str
) -> Composed:
    return SQL(" AND ").join(
        SQL("{}.{} {} {}.{}").format(
            Identifier(left), Identifier(c), _operator(op), Identifier(right), Identifier(c)
        )
        for c, op in zip(key, ops, strict=True)
    )


def _different(same: Sequence[str], left: str, right: str) -> Composable:
    """Rows whose ``same`` columns differ (an upsert's key: equal ones are one row, updated)."""
    if not same:
        return SQL("")
    return SQL(" AND ({}) IS DISTINCT FROM ({})").format(
        SQL(", ").join(SQL("{}.{}").format(Identifier(left), Identifier(c)) for c in same),
        SQL(", ").join(SQL("{}.{}").format(Identifier(right), Identifier(c)) for c in same),
    )


def replay_conflicting_pair(
    key: Sequence[str],
    ops: Sequence[tuple[str, str] | None],
    *,
    after: int,
    same: Sequence[str] = (),
    within: Composable | None = None,
) -> Composed:
    """The first two replayed rows that conflict on ``key`` (equal, or each column's exclusion
    operator true), the later one numbered past ``after``; rows equal on ``same`` never do;
    ``within``: only rows for which this condition on their unqualified columns holds."""
    replay: Composable = _table("pg_temp", REPLAY_TABLE)
    if within is not None:
        replay = SQL("(SELECT * FROM {} WHERE {})").format(replay, within)
    row = Identifier(REPLAY_ROW)
    return SQL(
        "SELECT a.{row}, b.{row} FROM {r} a JOIN {r} b ON a.{row} < b.{row} AND {on}{same}"
        " WHERE b.{row} > {after} ORDER BY b.{row}, a.{row} LIMIT 1"
    ).format(
        row=row,
        r=replay,
        on=_conflict(key, ops, "a", "b"),
        same=_different(same, "a", "b"),
        after=Literal(after),
    )


def replay_failing(condition: Composable, *, after: int) -> Composed:
    """The first replayed row (alias ``r``) numbered past ``after`` for which ``condition``
    holds."""
    row = Identifier(REPLAY_ROW)
    return SQL(
        "SELECT r.{row} FROM {r} r WHERE r.{row} > {after} AND ({c}) ORDER BY r.{row} LIMIT 1"
    ).format(row=row, r=_table("pg_temp", REPLAY_TABLE), after=Literal(after), c=condition)


def conflicts_with_target(
    schema: str,
    table: str,
    key: Sequence[str],
    ops: Sequence[tuple[str, str] | None],
    *,
    same: Sequence[str] = (),
) -> Composed:
    """A replayed row ``r`` conflicts on ``key`` with a row of the target (rows equal on
    ``same``, an upsert's key, never do)."""
    return SQL("EXISTS (SELECT 1 FROM {} t WHERE {}{})").format(
        _table(schema, table), _conflict(key, ops, "t", "r"), _different(same, "t", "r")
    )


def unreferenced(
    key: Sequence[str],
    ref_schema: str,
    ref_table: str,
    ref_key: Sequence[str],
    *,
    also: tuple[str, str] | None = None,
) -> Composed:
    """A replayed row ``r``'s foreign key (no column NULL) matches no referenced row (in
    the referenced table, nor in ``also``, (schema, table): the loaded rows of a table whose
    key references itself)."""
    match = SQL(" AND ").join(
        SQL("p.{} = r.{}").format(Identifier(pc), Identifier(c))
        for c, pc in zip(key, ref_key, strict=True)
    )
    tables = [_table(ref_schema, ref_table)] + ([_table(*also)] if also else [])
    return SQL("{} AND {}").format(
        SQL(" AND ").join(SQL("r.{} IS NOT NULL").format(Identifier(c)) for c in key),
        SQL(" AND ").join(
            SQL("NOT EXISTS (SELECT 1 FROM {} p WHERE {})").format(t, match) for t in tables
        ),
    )


def all_of(conditions: Sequence[Composable]) -> Composable | None:
    """The conditions joined by AND; None for none."""
    if not conditions:
        return None
    return SQL(" AND ").join(SQL("({})").format(c) for c in conditions)


def in_partition(constraint: str) -> Composed:
    """A row (its columns unqualified) that a partition takes: its partition constraint as
    ``pg_get_partition_constraintdef`` renders it."""
    return SQL("({})").format(SQL(constraint))


def key_rendered_as(key: Sequence[str], value: str) -> Composed:
    """A row (its columns unqualified) whose ``key`` reads ``value`` as a duplicate key error
    renders it: each column's text output (``null`` for NULL), joined by ``, ``."""
    return SQL("concat_ws(', ', {}) = {}").format(
        SQL(", ").join(
            SQL("CASE WHEN {0} IS NULL THEN 'null' ELSE format('%s', {0}) END").format(
                Identifier(c)
            )
            for c in key
        ),
        Literal(value),
    )


def is_null(column: str) -> Composed:
    """``r.column IS NULL`` (a NOT NULL constraint's failing rows)."""
    return SQL("r.{} IS NULL").format(Identifier(column))


def check_fails(expression: str) -> Composed:
    """A CHECK constraint's failing rows: its expression, as ``pg_get_expr`` rendered it from
    the catalog, is false (NULL passes a check)."""
    return SQL("({}) IS FALSE").format(SQL(expression))


# --- partitioned targets (see airflow_pg_bulk/partitioned.py) --------------------------------


def partition_key(oid: int) -> Composed:
    """A partitioned table's key as the server renders it (``RANGE (day)``)."""
    return SQL("SELECT pg_get_partkeydef({})").format(Literal(oid))


def leaf_partitions(oid: int, names: Sequence[tuple[str, str]] | None = None) -> Composed:
    """A partitioned table's direct partitions (those of ``names``, (schema, name) pairs, when
    given): schema, name, relkind, bound, partition constraint (NULL for a lone DEFAULT
    partition), ordered by name. (The constraint takes ACCESS SHARE on each partition.)"""
    chosen = SQL("")
    if names is not None:
        chosen = SQL(" AND (n.nspname, c.relname) IN ({})").format(
            SQL(", ").join(SQL("({}, {})").format(Literal(s), Literal(t)) for s, t in names)
            if names
            else SQL("(NULL, NULL)")
        )
    return SQL(
        "SELECT n.nspname, c.relname, c.relkind::text, pg_get_expr(c.relpartbound, c.oid),"
        " pg_get_partition_constraintdef(c.oid)"
        " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE i.inhparent = {}{} ORDER BY c.relname"
    ).format(Literal(oid), chosen)


def leaf_names(oid: int) -> Composed:
    """The names of a partitioned table's direct partitions (schema, name): no lock taken."""
    return SQL(
        "SELECT n.nspname, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE i.inhparent = {}"
        " ORDER BY c.relname"
    ).format(Literal(oid))


def run_table_comments(schema: str, pattern: str) -> Composed:
    """The tables in ``schema`` whose names match a LIKE pattern, with their comments."""
    return SQL(
        "SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = {} AND c.relname LIKE {} AND c.relkind = 'r' ORDER BY c.relname"
    ).format(Literal(schema), Literal(pattern))


def drop_tables(schema: str, names: Sequence[str]) -> Composed:
    """Drop several tables in one statement (``IF EXISTS``, no CASCADE; a partitioned one
    takes its partitions with it)."""
    return SQL("DROP TABLE IF EXISTS {}").format(
        SQL(", ").join(_table(schema, name) for name in names)
    )


def create_partitioned_staging(
    schema: str,
    staging: str,
    table: str,
    key: str | None,
    *,
    server_version: int,
    logged: bool = True,
) -> Composed:
    """A table with the target's columns and defaults (an identity column's values come from
    the target's sequence: see :func:`default_from_sequence`), no index or constraint:
    partitioned like the target (``key``: :func:`partition_key`'s text; PostgreSQL routes each
    row inserted), or, with ``key`` None, a plain table (autovacuum off)."""
    include = ["DEFAULTS", "GENERATED", "STORAGE"]
    if server_version >= 140000:
        include.append("COMPRESSION")
    including = SQL(" ").join(SQL("INCLUDING " + word) for word in include)
    if key is None:
        return SQL("CREATE {}TABLE {} (LIKE {} {}) WITH (autovacuum_enabled = false)").format(
            SQL("" if logged else "UNLOGGED "),
            _table(schema, staging),
            _table(schema, table),
            including,
        )
    return SQL("CREATE TABLE {} (LIKE {} {}) PARTITION BY {}").format(
        _table(schema, staging), _table(schema, table), including, SQL(key)
    )


def partition_key_columns(oid: int) -> Composed:
    """A partitioned table's key, one row per key part in order: the column's name and type
    (``format_type``), or two NULLs for an expression."""
    return SQL(
        "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)"
        " FROM pg_partitioned_table p"
        " CROSS JOIN LATERAL unnest(p.partattrs::int2[]) WITH ORDINALITY AS k(attnum, ord)"
        " LEFT JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = k.attnum"
        " WHERE p.partrelid = {} ORDER BY k.ord"
    ).format(Literal(oid))


def unsupported_partition(oid: int) -> Composed:
    """The direct partitions of a partitioned table that are not plain tables (schema, name,
    relkind: a sub-partitioned or foreign partition), usually none: one index lookup per
    partition, no lock taken. (No ORDER BY ... LIMIT: with one, the planner walked pg_class
    in name order looking for a match, 3.9 s at 10,000 partitions.)"""
    return SQL(
        "SELECT n.nspname, c.relname, c.relkind::text FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE i.inhparent = {} AND c.relkind <> 'r'"
    ).format(Literal(oid))


def distinct_keys(schema: str, table: str, columns: Sequence[str], limit: int) -> Composed:
    """Up to ``limit`` distinct values of the partition key ``columns`` in a staging table,
    each as text (NULL stays NULL)."""
    return SQL("SELECT DISTINCT {} FROM {} LIMIT {}").format(
        SQL(", ").join(SQL("{}::text").format(Identifier(c)) for c in columns),
        _table(schema, table),
        Literal(limit),
    )


def partitions_for_keys(
    schema: str, table: str, columns: Sequence[tuple[str, str]], keys: Sequence[Sequence[Any]]
) -> Composed:
    """The plan of a query on a partitioned table for rows with these key values
    (``columns``: (name, type); ``keys``: each value as text or None): the partitions left
    after the planner's partition pruning are the ones the values go to (a key that no
    partition takes prunes every one). Run with ``enable_partition_pruning`` on."""

    def part(name: str, type_: str, value: Any) -> Composed:
        if value is None:
            return SQL("{} IS NULL").format(Identifier(name))
        return SQL("{} = {}::{}").format(Identifier(name), Literal(value), SQL(type_))

    return SQL("EXPLAIN (FORMAT JSON, COSTS OFF, VERBOSE) SELECT 1 FROM {} WHERE {}").format(
        _table(schema, table),
        SQL(" OR ").join(
            SQL("({})").format(
                SQL(" AND ").join(part(n, t, v) for (n, t), v in zip(columns, key, strict=True))
            )
            for key in keys
        ),
    )


def create_partition_of(
    schema: str, name: str, parent: str, bound: str, *, logged: bool
) -> Composed:
    """A staging partition with a target partition's bound (the server's rendering)."""
    return SQL("CREATE {}TABLE {} PARTITION OF {} {} WITH (autovacuum_enabled = false)").format(
        SQL("" if logged else "UNLOGGED "), _table(schema, name), _table(schema, parent), SQL(bound)
    )


def add_check(schema: str, table: str, name: str, expression: str) -> Composed:
    """Add a CHECK constraint whose expression the server rendered
    (``pg_get_partition_constraintdef``)."""
    return SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK ({})").format(
        _table(schema, table), Identifier(name), SQL(expression)
    )


def default_from_sequence(
    schema: str, table: str, column: str, sequence: tuple[str, str]
) -> Composed:
    """A column's default drawn from a sequence (staging: an identity column not loaded takes
    its values from the target's own identity sequence)."""
    return SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT nextval({}::regclass)").format(
        _table(schema, table), Identifier(column), Literal(Identifier(*sequence).as_string())
    )


def column_settings(schema: str, table: str) -> Composed:
    """What a table's columns have of their own, in order: name, identity kind
    (``attidentity``), generated, default expression as the server renders it (NULL: none),
    statistics target (-1: the default), storage (``p e x m``), and the options
    ``n_distinct`` and ``n_distinct_inherited`` as ``name=value``."""
    return SQL(
        "SELECT a.attname, a.attidentity::text, a.attgenerated <> '',"
        " pg_get_expr(d.adbin, d.adrelid), coalesce(a.attstattarget, -1)::int,"
        " a.attstorage::text, ARRAY(SELECT o FROM unnest(coalesce(a.attoptions, '{{}}')) o"
        "   WHERE o LIKE 'n\\_distinct%')::text[]"
        " FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid"
        " AND d.adnum = a.attnum WHERE a.attrelid = {}::regclass AND a.attnum > 0"
        " AND NOT a.attisdropped ORDER BY a.attnum"
    ).format(Literal(Identifier(schema, table).as_string()))


def set_default(schema: str, table: str, column: str, expression: str | None) -> Composed:
    """Give a column the default ``expression`` (as :func:`column_settings` rendered it from
    the catalog, under the same ``search_path``), or none."""
    if expression is None:
        return SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(
            _table(schema, table), Identifier(column)
        )
    return SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {}").format(
        _table(schema, table), Identifier(column), SQL(expression)
    )


_STORAGE = {"p": "PLAIN", "e": "EXTERNAL", "x": "EXTENDED", "m": "MAIN"}
_COLUMN_OPTIONS = frozenset({"n_distinct", "n_distinct_inherited"})


def set_column(
    schema: str,
    table: str,
    column: str,
    *,
    statistics: int | None = None,
    storage: str | None = None,
    options: Sequence[str] = (),
    reset: Sequence[str] = (),
) -> Composed | None:
    """Give a column a statistics target, a storage (``p e x m``), the options ``name=value``
    (``n_distinct``, ``n_distinct_inherited``), and reset the options named in ``reset``;
    None when nothing is to be given."""
    actions: list[Composable] = []
    if statistics is not None:
        actions.append(SQL("SET STATISTICS {}").format(Literal(statistics)))
    if storage is not None:
        actions.append(SQL("SET STORAGE " + _STORAGE[storage]))
    pairs = [option.split("=", 1) for option in options]
    if any(name not in _COLUMN_OPTIONS for name, _ in pairs) or not set(reset) <= _COLUMN_OPTIONS:
        raise ValueError(f"unexpected column options {options!r} {reset!r}")
    if pairs:
        actions.append(
            SQL("SET ({})").format(
                SQL(", ").join(SQL("{} = {}").format(SQL(k), Literal(v)) for k, v in pairs)
            )
        )
    if reset:
        actions.append(SQL("RESET ({})").format(SQL(", ").join(SQL(name) for name in reset)))
    if not actions:
        return None
    return SQL(", ").join(
        SQL("ALTER TABLE {} ALTER COLUMN {} {}").format(
            _table(schema, table), Identifier(column), action
        )
        if n == 0
        else SQL("ALTER COLUMN {} {}").format(Identifier(column), action)
        for n, action in enumerate(actions)
    )


def drop_identity(schema: str, table: str, column: str) -> Composed:
    """Make an identity column a plain one (its sequence goes with it)."""
    return SQL("ALTER TABLE {} ALTER COLUMN {} DROP IDENTITY").format(
        _table(schema, table), Identifier(column)
    )


def sequence_options(schema: str, name: str) -> Composed:
    """A sequence's start, increment, minimum, maximum, cache and cycle (``pg_sequence``)."""
    return SQL(
        "SELECT seqstart, seqincrement, seqmin, seqmax, seqcache, seqcycle"
        " FROM pg_catalog.pg_sequence WHERE seqrelid = {}::regclass"
    ).format(Literal(Identifier(schema, name).as_string()))


def add_identity(
    schema: str,
    table: str,
    column: str,
    *,
    always: bool,
    sequence: tuple[str, str],
    options: Sequence[Any],
) -> Composed:
    """Make a plain NOT NULL column an identity column whose new sequence is ``sequence``
    (schema, name) with ``options`` as :func:`sequence_options` read them (from the sequence
    it takes the place of)."""
    start, increment, minimum, maximum, cache, cycle = options
    return SQL(
        "ALTER TABLE {} ALTER COLUMN {} ADD GENERATED {} AS IDENTITY (SEQUENCE NAME {}"
        " START WITH {} INCREMENT BY {} MINVALUE {} MAXVALUE {} CACHE {} {})"
    ).format(
        _table(schema, table),
        Identifier(column),
        SQL("ALWAYS" if always else "BY DEFAULT"),
        Identifier(*sequence),
        Literal(start),
        Literal(increment),
        Literal(minimum),
        Literal(maximum),
        Literal(cache),
        SQL("CYCLE" if cycle else "NO CYCLE"),
    )


def detach_partition(schema: str, parent: str, name: str) -> Composed:
    """Detach a partition (ACCESS EXCLUSIVE on the parent: run under lock_timeout)."""
    return SQL("ALTER TABLE {} DETACH PARTITION {}").format(
        _table(schema, parent), _table(schema, name)
    )


def attach_partition(schema: str, parent: str, name: str, bound: str) -> Composed:
    """Attach a table as a partition; a valid CHECK implying the bound skips its scan, and
    equivalent indexes and foreign keys are adopted."""
    return SQL("ALTER TABLE {} ATTACH PARTITION {} {}").format(
        _table(schema, parent), _table(schema, name), SQL(bound)
    )


def partition_of(schema: str, name: str) -> Composed:
    """The parent of a partition (schema, name), or no row."""
    return SQL(
        "SELECT pn.nspname, p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent"
        " JOIN pg_namespace pn ON pn.oid = p.relnamespace WHERE i.inhrelid = {}::regclass"
    ).format(Literal(Identifier(schema, name).as_string()))


def more_rows_than(schema: str, table: str, limit: int) -> Composed:
    """Whether a table holds more than ``limit`` rows (reads at most ``limit + 1``)."""
    return SQL("SELECT count(*) > {0} FROM (SELECT FROM {1} LIMIT {0} + 1) AS r").format(
        Literal(limit), _table(schema, table)
    )


def has_user_triggers(schema: str, table: str) -> Composed:
    """Whether a table has a trigger of a user (not one of a constraint)."""
    return SQL(
        "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = {}::regclass AND NOT tgisinternal)"
    ).format(Literal(Identifier(schema, table).as_string()))


def has_rows(schema: str, table: str) -> Composed:
    """Whether a table holds at least one row."""
    return SQL("SELECT EXISTS (SELECT FROM {})").format(_table(schema, table))


def truncate(schema: str, table: str) -> Composed:
    """Empty a table (ACCESS EXCLUSIVE on it)."""
    return SQL("TRUNCATE {}").format(_table(schema, table))


def unrouted_row(
    schema: str,
    staging: str,
    columns: Sequence[str],
    bounds: Sequence[str],
    *,
    in_source_order: bool = False,
) -> Composed:
    """One staged row that satisfies none of the partitions' constraints (``bounds``, rendered
    by the server), as text, or no row; ``in_source_order``: the first such row in source
    order (an upsert's staging, by :data:`SOURCE_ORDER`), else any."""
    return SQL("SELECT ({})::text FROM {} AS loaded WHERE {}{} LIMIT 1").format(
        _columns(columns),
        _table(schema, staging),
        in_no_partition(bounds),
        SQL(" ORDER BY {}").format(Identifier(SOURCE_ORDER)) if in_source_order else SQL(""),
    )


def add_partitions_check(schema: str, table: str, name: str, bounds: Sequence[str]) -> Composed:
    """A CHECK that a row satisfies one of the partitions' constraints (``bounds``, as
    ``pg_get_partition_constraintdef`` renders them): a row that no partition takes fails."""
    return SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK (NOT {})").format(
        _table(schema, table), Identifier(name), in_no_partition(bounds)
    )


def in_no_partition(bounds: Sequence[str]) -> Composed:
    """A row (its columns unqualified) satisfies none of the partitions' constraints
    (``bounds``, as ``pg_get_partition_constraintdef`` renders them; NULL counts as not)."""
    if not bounds:
        return SQL("true")
    return SQL("NOT ({})").format(
        SQL(" OR ").join(SQL("coalesce(({}), false)").format(SQL(b)) for b in bounds)
    )
