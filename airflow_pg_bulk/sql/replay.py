"""SQL that finds the source rows that break a constraint (airflow_pg_bulk.target.violations)."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from airflow_pg_bulk.sql.compose import column_names, table_identifier

# --- finding the rows that break a constraint (airflow_pg_bulk.target.violations) ---

REPLAY_TABLE = "pgbulk_replay"  # a TEMP table: the source read again, each row numbered
REPLAY_ROW = "pgbulk_row"
_OPERATOR_NAME = frozenset("+-*/<>=~!@#%^&|`?")


def create_replay_table(schema: str, table: str, columns: Sequence[str]) -> list[Composed]:
    """A temporary table with the loaded columns' types (no NOT NULL, defaults or
    constraints) and a ``bigserial`` that numbers rows in the order COPY reads them."""
    replay = table_identifier("pg_temp", REPLAY_TABLE)
    return [
        SQL("CREATE TEMP TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            replay, column_names(columns), table_identifier(schema, table)
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
    replay: Composable = table_identifier("pg_temp", REPLAY_TABLE)
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
    ).format(
        row=row, r=table_identifier("pg_temp", REPLAY_TABLE), after=Literal(after), c=condition
    )


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
        table_identifier(schema, table), _conflict(key, ops, "t", "r"), _different(same, "t", "r")
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
    tables = [table_identifier(ref_schema, ref_table)] + ([table_identifier(*also)] if also else [])
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
