"""SQL of an upsert: the source order column, duplicate keys, ON CONFLICT."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from airflow_pg_bulk.sql.compose import column_names, table_identifier

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
        SQL("UNLOGGED " if unlogged else ""), table_identifier(schema, name)
    )


def add_source_order(schema: str, staging: str, sequence: str) -> Composed:
    """Staging's provenance column: the COPY task's piece ordinal (from :data:`PIECE_SETTING`)
    in the high bits, the session's row number below; larger is later in source order."""
    return SQL(
        "ALTER TABLE {} ADD COLUMN {} bigint NOT NULL"
        " DEFAULT (current_setting({})::bigint << {}) + nextval({}::regclass)"
    ).format(
        table_identifier(schema, staging),
        Identifier(SOURCE_ORDER),
        Literal(PIECE_SETTING),
        Literal(PIECE_SHIFT),
        Literal(Identifier(schema, sequence).as_string()),
    )


def sequence_owned_by_column(schema: str, sequence: str, table: str, column: str) -> Composed:
    """Tie a sequence to a column, so that dropping the table drops it."""
    return SQL("ALTER SEQUENCE {} OWNED BY {}").format(
        table_identifier(schema, sequence), Identifier(schema, table, column)
    )


def all_not_null(key: Sequence[str]) -> Composed:
    return SQL(" AND ").join(SQL("{} IS NOT NULL").format(Identifier(c)) for c in key)


def duplicate_keys(
    schema: str, staging: str, key: Sequence[str], *, key_may_be_null: bool
) -> Composed:
    """The first key staged more than once (each column as text), its count, and how many keys
    are; no row when every key is staged once. Keys with a NULL never match (when
    ``key_may_be_null``) and are left out."""
    where = SQL(" WHERE {}").format(all_not_null(key)) if key_may_be_null else SQL("")
    return SQL(
        "SELECT {}, count(*), count(*) OVER () FROM {}{} GROUP BY {} HAVING count(*) > 1"
        " ORDER BY {} LIMIT 1"
    ).format(
        SQL(", ").join(SQL("{}::text").format(Identifier(c)) for c in key),
        table_identifier(schema, staging),
        where,
        column_names(key),
        column_names(key),
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
    source: Composable = SQL("SELECT {} FROM {}").format(
        column_names(columns), table_identifier(schema, staging)
    )
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
        table_identifier(schema, table),
        column_names([*columns, *(c for c, _, _ in drawn)]),
        SQL(" OVERRIDING SYSTEM VALUE" if override_identity or drawn else ""),
        SQL(", ").join(values),
        source,
        SQL(" WHERE ({})").format(SQL(where)) if where else SQL(""),
        column_names(key),
        SQL(", ").join(
            SQL("{} = EXCLUDED.{}").format(Identifier(c), Identifier(c)) for c in updated
        ),
    )


def latest_loaded(
    schema: str, staging: str, columns: Sequence[str], key: Sequence[str], *, key_may_be_null: bool
) -> Composed:
    """Upsert: staging's rows, the latest in source order per key (rows with a NULL in a key
    that may be NULL never match a row: all of them)."""
    source: Composable = SQL("SELECT DISTINCT ON ({}) {} FROM {}{} ORDER BY {}, {} DESC").format(
        column_names(key),
        column_names(columns),
        table_identifier(schema, staging),
        SQL(" WHERE {}").format(all_not_null(key)) if key_may_be_null else SQL(""),
        column_names(key),
        Identifier(SOURCE_ORDER),
    )
    if key_may_be_null:
        source = SQL("({}) UNION ALL SELECT {} FROM {} WHERE NOT ({})").format(
            source, column_names(columns), table_identifier(schema, staging), all_not_null(key)
        )
    return source
