"""SQL of strategy="rebuild" (append, upsert): target rows and loaded rows into a new table."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from airflow_pg_bulk.sql.compose import column_names, table_identifier

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
    return SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table_identifier(schema, table))


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
            table_identifier(schema, staging), _key_match(key, nullable, "s", "t")
        )
    return SQL("INSERT INTO {} ({}){} SELECT {} FROM {} t{}").format(
        table_identifier(schema, new),
        column_names(columns),
        SQL(" OVERRIDING SYSTEM VALUE" if override_identity else ""),
        SQL(", ").join(SQL("t.{}").format(Identifier(c)) for c in columns),
        table_identifier(schema, table),
        where,
    )


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
            table_identifier(schema, table), _key_match(key, nullable, "l", "t")
        )
    else:
        values += [
            SQL("nextval({}::regclass)").format(Literal(Identifier(s, n).as_string()))
            for _, s, n in drawn
        ]
    return SQL("INSERT INTO {} ({}){} SELECT {} FROM ({}) l{}").format(
        table_identifier(schema, new),
        column_names(names),
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
        source, table_identifier(schema, table), _key_match(key, nullable, "l", "t")
    )
