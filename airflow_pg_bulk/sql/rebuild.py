"""SQL of strategy="rebuild" (append, upsert): target rows and loaded rows into a new table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from airflow_pg_bulk.sql.compose import column_names, table_identifier

SAMPLE_BLOCKS = 200  # blocks read of each table for the bounds of a split copy

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


@dataclass(frozen=True)
class KeyRange:
    """One range of a key's first column, for a rebuild's copy split across sessions:
    ``low <= column < high`` (bounds as text, compared as the column's type; None: unbounded).
    The first range (``low`` None) also takes the rows whose column is NULL, so that the
    ranges, together, hold every row once."""

    column: str
    low: str | None
    high: str | None


def in_key_range(alias: str, within: KeyRange) -> Composed:
    """``alias.column`` within the range (a bound is an untyped literal: the server reads it
    as the column's type)."""
    column = SQL("{}.{}").format(Identifier(alias), Identifier(within.column))
    if within.low is None:
        if within.high is None:
            return SQL("true")
        return SQL("({} < {}) IS NOT FALSE").format(column, Literal(within.high))
    low = SQL("{} >= {}").format(column, Literal(within.low))
    if within.high is None:
        return low
    return SQL("{} AND {} < {}").format(low, column, Literal(within.high))


def rows_in_key_range(source: Composable, within: KeyRange) -> Composed:
    """The rows of ``source`` (a query) within the range (the server pushes the condition
    down into ``source``'s DISTINCT ON or UNION ALL)."""
    return SQL("SELECT * FROM ({}) r WHERE {}").format(source, in_key_range("r", within))


def key_bounds(schema: str, tables: Sequence[str], column: str, parts: int) -> Composed:
    """The ``parts - 1`` bounds (as text, NULL-free, ascending, maybe repeated) that cut
    ``column``'s values in ``tables`` together into ``parts`` ranges of about as many rows,
    from a sample of about :data:`SAMPLE_BLOCKS` blocks of each table (``TABLESAMPLE
    SYSTEM``: a skewed key is cut where its rows are, not by its minimum and maximum)."""
    fractions = Literal([k / parts for k in range(1, parts)])
    samples = SQL(" UNION ALL ").join(
        SQL(
            "SELECT {c} AS k FROM {t} TABLESAMPLE SYSTEM (least(100, 100.0 * {n} / greatest(1,"
            " pg_relation_size({name}::regclass) / current_setting('block_size')::int)))"
        ).format(
            c=Identifier(column),
            t=table_identifier(schema, table),
            n=Literal(SAMPLE_BLOCKS),
            name=Literal(table_identifier(schema, table).as_string(None)),
        )
        for table in tables
    )
    return SQL(
        "SELECT percentile_disc({}::float8[]) WITHIN GROUP (ORDER BY k)::text[] FROM ({}) x"
    ).format(fractions, samples)


def free_connections() -> SQL:
    """How many more sessions the server would accept from a role that is not a superuser
    (``max_connections`` less those reserved and those open)."""
    return SQL(
        "SELECT current_setting('max_connections')::int"
        " - current_setting('superuser_reserved_connections')::int"
        " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
    )


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
    within: KeyRange | None = None,
) -> Composed:
    """Rebuild: the target's rows into the new table (every column a COPY could fill;
    generated columns are computed again). ``unless_loaded`` = (staging, key, nullable key
    columns to match as not distinct): only the rows whose key is not in staging (upsert).
    ``within``: only the rows of one key range (:func:`in_key_range`; a row of staging can
    match only a row of the same range, so staging is read within it too)."""
    conditions: list[Composable] = []
    if within is not None:
        conditions.append(in_key_range("t", within))
    if unless_loaded is not None:
        staging, key, nullable = unless_loaded
        inner: list[Composable] = [_key_match(key, nullable, "s", "t")]
        if within is not None:
            inner.append(in_key_range("s", within))
        conditions.append(
            SQL("NOT EXISTS (SELECT 1 FROM {} s WHERE {})").format(
                table_identifier(schema, staging), SQL(" AND ").join(inner)
            )
        )
    where: Composable = (
        SQL(" WHERE {}").format(SQL(" AND ").join(conditions)) if conditions else SQL("")
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
