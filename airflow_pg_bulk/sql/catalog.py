"""SQL that captures the target's definition: columns, indexes, constraints, grants, dependents."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from airflow_pg_bulk.sql.compose import OidRef, oid_ref, table_identifier

# --- catalog capture -------------------------------------------------------------------------


def remember_oids(tables: Sequence[tuple[str, str]]) -> Composed:
    """Keep the oid of each of ``tables`` ((schema, name) pairs; 0 for one that does not
    exist) in a setting of the transaction, the n-th as :func:`remembered_oid` ``(n)`` reads
    it: for queries sent in the same round trip, which cannot wait for the oids to come
    back. (An oid found by a subquery in each query cost more to plan than the round trip
    saved: 8.9 against 6.8 ms for a partition's capture; read from a setting, as a literal.)"""
    return SQL("SELECT {}").format(
        SQL(", ").join(
            SQL("set_config({}, coalesce(({})::text, '0'), true)").format(
                Literal(_OID_SETTING.format(n)),
                SQL(
                    "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = {} AND c.relname = {}"
                ).format(Literal(schema), Literal(table)),
            )
            for n, (schema, table) in enumerate(tables)
        )
    )


def remembered_oid(n: int) -> Composed:
    """The oid :func:`remember_oids` kept n-th, in a query of the same transaction."""
    return SQL("current_setting({})::oid").format(Literal(_OID_SETTING.format(n)))


_OID_SETTING = "pgbulk.oid_{}"


def leaf_oid() -> Composed:
    """The oid of the partition being captured, as :func:`choose_leaf` kept it: one setting
    for every partition, so that a partition's capture is one statement text whatever the
    partition (prepared once per session, its plan reused)."""
    return SQL("current_setting({})::oid").format(Literal(_LEAF_SETTING))


def choose_leaf(oid: Composable) -> Composed:
    """Keep ``oid`` (an expression, such as :func:`remembered_oid`) for :func:`leaf_oid`, in
    a setting of the transaction."""
    return SQL("SELECT set_config({}, ({})::text, true)").format(Literal(_LEAF_SETTING), oid)


def leaf_oid_of(schema: str, table: str) -> Composed:
    """The oid of ``schema.table``, 0 when it does not exist (for :func:`choose_leaf`)."""
    return SQL(
        "coalesce((SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = {} AND c.relname = {}), 0)"
    ).format(Literal(schema), Literal(table))


_LEAF_SETTING = "pgbulk.leaf_oid"


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


def loader_privileges(oid: OidRef) -> Composed:
    """Whether the session's role may own-operate, insert into, and create beside the target:
    (owner or member of the owner, INSERT, CREATE on its schema, current_user, UPDATE)."""
    return SQL(
        "SELECT pg_has_role(c.relowner, 'USAGE'), has_table_privilege(c.oid, 'INSERT'),"
        " has_schema_privilege(c.relnamespace, 'CREATE'), current_user::text,"
        " has_table_privilege(c.oid, 'UPDATE')"
        " FROM pg_class c WHERE c.oid = {}"
    ).format(oid_ref(oid))


def table_columns(oid: OidRef) -> Composed:
    """Columns in order: name, type, not null, generated, identity kind, comment."""
    return SQL(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
        " a.attgenerated <> '', a.attidentity::text, col_description(a.attrelid, a.attnum)"
        " FROM pg_attribute a WHERE a.attrelid = {} AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY a.attnum"
    ).format(oid_ref(oid))


def table_indexes(oid: OidRef) -> Composed:
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
    ).format(oid_ref(oid))


def table_constraints(oid: OidRef) -> Composed:
    """PK, unique, check, foreign-key and exclusion constraints with their definitions."""
    return SQL(
        "SELECT con.conname, con.contype::text, pg_get_constraintdef(con.oid), con.convalidated,"
        " ic.relname, obj_description(con.oid, 'pg_constraint'), con.confrelid = con.conrelid,"
        " con.condeferrable, con.condeferred"
        " FROM pg_constraint con LEFT JOIN pg_class ic ON ic.oid = con.conindid"
        " WHERE con.conrelid = {} AND con.contype IN ('p', 'u', 'c', 'f', 'x')"
        " ORDER BY con.conname"
    ).format(oid_ref(oid))


def table_triggers(oid: OidRef) -> Composed:
    """User triggers (not the internal ones of foreign keys): name, definition, enabled state."""
    return SQL(
        "SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled::text FROM pg_trigger t"
        " WHERE t.tgrelid = {} AND NOT t.tgisinternal ORDER BY t.tgname"
    ).format(oid_ref(oid))


def table_grants(oid: OidRef) -> Composed:
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
    ).format(oid_ref(oid))


def referencing_keys(oid: OidRef) -> Composed:
    """Foreign keys of other tables that reference the target. Found through the
    dependencies on the target's columns that each foreign key records (an index lookup)
    rather than by reading all of ``pg_constraint``, which has no index on the referenced
    table and holds a row or two per partition of every partitioned table (0.8 ms at 1,826
    partitions, and growing with them). Each constraint found is read by its oid in a
    LATERAL subquery (``OFFSET 0``): as a join, the planner scanned all of ``pg_constraint``
    after all (2.6 ms against 0.3 ms of execution at 1,826 partitions)."""
    return SQL(
        "SELECT n.nspname, c.relname, con.conname, pg_get_constraintdef(con.oid), con.convalidated"
        " FROM (SELECT DISTINCT d.objid FROM pg_depend d"
        " WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = {0}"
        " AND d.refobjsubid > 0 AND d.classid = 'pg_constraint'::regclass) d,"
        " LATERAL (SELECT * FROM pg_constraint con WHERE con.oid = d.objid OFFSET 0) con"
        " JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE con.contype = 'f' AND con.confrelid = {0} AND con.conrelid <> {0}"
        " ORDER BY 1, 2, 3"
    ).format(oid_ref(oid))


def owned_sequences(oid: OidRef) -> Composed:
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
    ).format(oid_ref(oid))


def sequence_state(schema: str, name: str) -> Composed:
    """A sequence's ``last_value``, ``is_called`` and increment."""
    return SQL(
        "SELECT s.last_value, s.is_called, q.seqincrement FROM {} s, pg_catalog.pg_sequence q"
        " WHERE q.seqrelid = {}::regclass"
    ).format(table_identifier(schema, name), Literal(Identifier(schema, name).as_string()))


def dependent_views(oid: OidRef) -> Composed:
    """Views and materialized views that read the target directly, with their definitions."""
    return SQL(
        "SELECT DISTINCT n.nspname, v.relname, v.relkind::text, pg_get_viewdef(v.oid),"
        " coalesce(v.reloptions, '{{}}'::text[])"
        " FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid"
        " JOIN pg_class v ON v.oid = r.ev_class JOIN pg_namespace n ON n.oid = v.relnamespace"
        " WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass"
        " AND d.refobjid = {0} AND v.oid <> {0} ORDER BY 1, 2"
    ).format(oid_ref(oid))


def unsupported_dependents(oid: OidRef) -> Composed:
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
    ).format(oid_ref(oid))


def staging_state(schema: str, staging: str) -> Composed:
    """What finalize already built on staging (so a retried finalize goes on where it stopped):
    rows of ('persistence', p/u, NULL), ('analyzed', '', whether an ANALYZE of it ended:
    the server's count of them, which ANALYZE reports as it ends and a crash or
    ``pg_stat_reset`` sets back to 0, the table then analyzed again), ('index', name, valid),
    ('constraint', name, validated). (The count where the ``pg_stats`` view was read: 1.4 of
    a month reload's ms, for the view's joins.)"""
    return SQL(
        "WITH s AS (SELECT c.oid, c.relpersistence FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = {} AND c.relname = {})"
        " SELECT 'persistence', s.relpersistence::text, NULL::bool FROM s"
        " UNION ALL SELECT 'analyzed', '', pg_stat_get_analyze_count(s.oid)"
        " + pg_stat_get_autoanalyze_count(s.oid) > 0 FROM s"
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


def rows_of_each(queries: Sequence[Composable]) -> Composed:
    """One query for several: its one value (text) is a JSON array holding, for each of
    ``queries`` in order, the array of its rows, each row a JSON object of its columns in
    order (names may repeat: read it with ``object_pairs_hook``). One round trip where each
    query would take one (the catalog capture of a table)."""
    return SQL("SELECT json_build_array({})::text").format(
        SQL(", ").join(
            SQL("(SELECT coalesce(json_agg(q), '[]'::json) FROM ({}) AS q)").format(query)
            for query in queries
        )
    )
