"""Statements run on a database source (:mod:`airflow_pg_bulk.loading.database`): the user's
query, or a whole table, read by ``COPY ... TO STDOUT`` (a PostgreSQL source) or through
SQLAlchemy (any other database)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal


def source_select(query: str | None, table: str | None) -> Composable:
    """The SELECT a PostgreSQL source is read with: the user's query, or every row of
    ``table`` (``schema.table`` or ``table``)."""
    if table is not None:
        return SQL("SELECT * FROM {}").format(Identifier(*table.split(".", 1)))
    # The query is SQL text the user wrote for their own source database (as Airflow's
    # SQLExecuteQueryOperator takes one); it runs there with the source connection's own
    # privileges, so taking it verbatim is its intended use, not an injection: nothing of
    # ours is formatted into it, and it is wrapped whole in the parentheses below.
    assert query is not None
    return SQL(query)  # type: ignore[arg-type]  # a user-given str, not a literal


def copy_out(select: Composable, *, binary: bool = False) -> Composed:
    """``COPY (select) TO STDOUT`` in PostgreSQL's text format, or its binary one."""
    statement = SQL("COPY ({}) TO STDOUT").format(select)
    return statement + SQL(" (FORMAT binary)") if binary else statement


def copy_binary_in(schema: str, table: str, columns: Sequence[str]) -> Composed:
    """``COPY table (columns) FROM STDIN`` in PostgreSQL's binary format (what
    :func:`copy_out` with ``binary`` writes)."""
    return SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(
        Identifier(schema, table), SQL(", ").join(Identifier(c) for c in columns)
    )


#: the first oid a database gives its own objects: below it, the types every PostgreSQL
#: server has under the same oid, with the same binary representation
FIRST_NORMAL_OID = 16384


def exact_types(oids: Sequence[int], modifiers: Sequence[int]) -> Composed:
    """Each result column's type as ``format_type`` renders it with its modifier
    (``numeric(12,2)``), from its type oid and modifier (``PQftype``, ``PQfmod``); an empty
    string for a type of the database's own (an enum, a domain, a composite), which another
    server may know under another oid or not at all. One row, one text array."""
    return SQL(
        "SELECT coalesce(array_agg(CASE WHEN u.o < {} THEN format_type(u.o, u.m) ELSE '' END"
        " ORDER BY u.n), '{{}}') FROM unnest({}::oid[], {}::int[]) WITH ORDINALITY AS u(o, m, n)"
    ).format(Literal(FIRST_NORMAL_OID), Literal(list(oids)), Literal(list(modifiers)))


def no_rows(select: Composable) -> Composed:
    """The select's columns without its rows: run in prepare to name the columns and to fail
    a query that cannot run (a syntax error, a missing table or privilege) before any work."""
    return SQL("SELECT * FROM ({}) AS pgbulk_source LIMIT 0").format(select)


def alchemy_select(query: str | None, table: str | None) -> Any:
    """The SQLAlchemy statement another database is read with: the query as a ``text()``
    (user-given SQL, see :func:`source_select`), or every row of ``table``, quoted by the
    dialect."""
    import sqlalchemy

    if table is not None:
        schema, _, name = table.rpartition(".")
        return sqlalchemy.select(sqlalchemy.text("*")).select_from(
            sqlalchemy.table(name, schema=schema or None)
        )
    return sqlalchemy.text(query)  # type: ignore[arg-type]


def _key_predicate(column: str, low: Any, high: Any) -> Composable:
    """The rows of one range of the split key: ``low <= key < high``; no low: below high, and
    the NULL keys; no high: from low."""
    key = Identifier(column)
    if low is None and high is None:
        return SQL("TRUE")
    if low is None:
        return SQL("({} < {} OR {} IS NULL)").format(key, Literal(high), key)
    if high is None:
        return SQL("{} >= {}").format(key, Literal(low))
    return SQL("{} >= {} AND {} < {}").format(key, Literal(low), key, Literal(high))


def key_quantiles(select: Composable, column: str, count: int) -> Composed:
    """The smallest key of each of ``count`` buckets of equal row counts (``ntile`` over the
    key's order; NULL keys left out), in order: the key's min, then the values that start
    each later range. Exact, at the cost of one sort of the key's values."""
    key = Identifier(column)
    return SQL(
        "SELECT min(k) FROM (SELECT {} AS k, ntile({}) OVER (ORDER BY {}) AS b"
        " FROM ({}) AS pgbulk_source WHERE {} IS NOT NULL) AS pgbulk_buckets"
        " GROUP BY b ORDER BY b"
    ).format(key, Literal(count), key, select, key)


def key_histogram(table: str, column: str) -> Composed:
    """The column's histogram in the source's statistics (``pg_stats.histogram_bounds`` as
    text: bounds of buckets of equal row counts, from ANALYZE's sample), where the histogram
    covers every row: the column has no list of most common values (whose rows the histogram
    leaves out). No row: never analyzed, or a column with values common enough to be listed
    (then :func:`key_quantiles` reads the rows themselves)."""
    return SQL(
        "SELECT histogram_bounds::text::text[] FROM pg_stats"
        " WHERE format('%I.%I', schemaname, tablename)::regclass = {}::regclass"
        " AND attname = {} AND NOT inherited AND histogram_bounds IS NOT NULL"
        " AND most_common_vals IS NULL"
    ).format(_regclass(table), Literal(column))


def key_range(select: Composable, column: str, low: Any, high: Any) -> Composable:
    """The source's rows in one range of its split key (all of them without a split)."""
    if low is None and high is None:
        return select
    return SQL("SELECT * FROM ({}) AS pgbulk_source WHERE {}").format(
        select, _key_predicate(column, low, high)
    )


def block_count(table: str) -> Composed:
    """How many blocks the table has now (its main fork's size; rows a snapshot sees lie
    in blocks below it, or in blocks added later that the last range takes anyway)."""
    return SQL(
        "SELECT pg_relation_size({}::regclass) / current_setting('block_size')::bigint"
    ).format(_regclass(table))


def block_range(table: str, low: int | None, high: int | None) -> Composed:
    """Every row of ``table`` in blocks ``low`` to ``high`` (excluded); no low: from the
    first block, no high: to the last, so that consecutive ranges take every row once. A
    TID range scan on PostgreSQL 14+: only those blocks are read."""
    where = [
        SQL("ctid >= {}::tid").format(Literal(f"({block},0)"))
        for block in (low,)
        if block is not None
    ] + [
        SQL("ctid < {}::tid").format(Literal(f"({block},0)"))
        for block in (high,)
        if block is not None
    ]
    return SQL("SELECT * FROM {}{}").format(
        Identifier(*table.split(".", 1)),
        SQL(" WHERE {}").format(SQL(" AND ").join(where)) if where else SQL(""),
    )


def _alchemy_source(query: str | None, table: str | None) -> Any:
    return (
        alchemy_select(query, table).columns().subquery("pgbulk_source")
        if table is None
        else (alchemy_select(query, table).subquery("pgbulk_source"))
    )


def alchemy_no_rows(query: str | None, table: str | None) -> Any:
    """:func:`no_rows` through SQLAlchemy: the source's column names, without reading its rows
    (a streamed result closed before its end would read them all: PyMySQL's server-side
    cursor drains the rest of the result when closed)."""
    return alchemy_no_rows_of(_alchemy_source(query, table))


def alchemy_no_rows_of(rows: Any) -> Any:
    """``SELECT * FROM rows LIMIT 0`` (``rows``: a SQLAlchemy table, text query or subquery,
    e.g. :func:`alchemy_range_rows`): its columns' description, no row read."""
    import sqlalchemy

    return sqlalchemy.select(sqlalchemy.text("*")).select_from(rows).limit(0)


def alchemy_key_quantiles(query: str | None, table: str | None, column: str, count: int) -> Any:
    """:func:`key_quantiles` through SQLAlchemy, for a database with window functions (SQLite
    3.25+, MariaDB 10.2+, MySQL 8)."""
    import sqlalchemy

    key = sqlalchemy.column(column)
    buckets = (
        sqlalchemy.select(
            key.label("k"), sqlalchemy.func.ntile(count).over(order_by=key).label("b")
        )
        .select_from(_alchemy_source(query, table))
        .where(key.is_not(None))
        .subquery("pgbulk_buckets")
    )
    return (
        sqlalchemy.select(sqlalchemy.func.min(buckets.c.k))
        .group_by(buckets.c.b)
        .order_by(buckets.c.b)
    )


def alchemy_key_range(
    query: str | None, table: str | None, column: str, low: Any, high: Any
) -> Any:
    """:func:`key_range` through SQLAlchemy (the bounds as bound parameters)."""
    import sqlalchemy

    if low is None and high is None:
        return alchemy_select(query, table)
    key = sqlalchemy.column(column)
    if low is None:
        where = sqlalchemy.or_(key < high, key.is_(None))
    elif high is None:
        where = key >= low
    else:
        where = sqlalchemy.and_(key >= low, key < high)
    return (
        sqlalchemy.select(sqlalchemy.text("*"))
        .select_from(_alchemy_source(query, table))
        .where(where)
    )


def row_at(select: Composable, key: str, column: str, offset: int) -> Composed:
    """The split key and ``column`` (as text) of the source's row after ``offset`` rows, in
    the order the source returns them: a rejected row's key, re-read for its error."""
    return SQL("SELECT {}, {}::text FROM ({}) AS pgbulk_source OFFSET {} LIMIT 1").format(
        Identifier(key), Identifier(column), select, Literal(offset)
    )


def alchemy_range_rows(
    query: str | None, table: str | None, key: str, bounds: tuple[Any, Any]
) -> Any:
    """:func:`alchemy_key_range` as a subquery (``pgbulk_range``), its columns selectable by
    name from an outer SELECT (a ``text()`` query given its columns)."""
    rows = alchemy_key_range(query, table, key, *bounds)
    if bounds == (None, None):
        rows = rows.columns() if table is None else rows
    return rows.subquery("pgbulk_range")


def alchemy_row_at(
    query: str | None,
    table: str | None,
    key: str,
    column: str,
    bounds: tuple[Any, Any],
    offset: int,
) -> Any:
    """:func:`row_at` through SQLAlchemy, in one range of the key."""
    import sqlalchemy

    return (
        sqlalchemy.select(sqlalchemy.column(key), sqlalchemy.column(column))
        .select_from(alchemy_range_rows(query, table, key, bounds))
        .offset(offset)
        .limit(1)
    )


def repeatable_read() -> Composed:
    """The transaction's isolation: one snapshot for all its statements (a source session that
    exports or imports a snapshot)."""
    return SQL("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def export_snapshot() -> Composed:
    """Export the transaction's snapshot, for the COPY sessions of a split source to share."""
    return SQL("SELECT pg_export_snapshot()")


def set_snapshot(snapshot: str) -> Composed:
    """Read in the snapshot another session exported (first statement of a transaction)."""
    return SQL("SET TRANSACTION SNAPSHOT {}").format(Literal(snapshot))


def column_types(oids: list[int], typmods: list[int]) -> Composed:
    """Run on a PostgreSQL source: for each result column (its type OID and modifier, from the
    query's description) the type as that server renders it (``format_type``: ``numeric(12,3)``,
    ``text[]``, ``timestamp with time zone``), and whether it is an enum or an array of one
    (``create_target`` makes those ``text``/``text[]``: the enum type is not on the target)."""
    return SQL(
        "SELECT format_type(c.oid, c.mod), t.typtype = 'e', coalesce(e.typtype = 'e', false)"
        " FROM unnest({}::oid[], {}::int[]) WITH ORDINALITY AS c(oid, mod, n)"
        " JOIN pg_type t ON t.oid = c.oid"
        " LEFT JOIN pg_type e ON t.typcategory = 'A' AND e.oid = t.typelem"
        " ORDER BY c.n"
    ).format(Literal(oids), Literal(typmods))


def table_keys(table: str) -> Composed:
    """Run on a PostgreSQL source: the NOT NULL columns of ``table`` and its primary key's
    columns in key order (``attname``, ``attnotnull``, position in the key, from 0, or NULL:
    ``indkey`` is an ``int2vector``, subscripted from 0)."""
    return SQL(
        "SELECT a.attname, a.attnotnull, array_position(i.indkey::int2[], a.attnum)"
        " FROM pg_attribute a LEFT JOIN pg_index i"
        " ON i.indrelid = a.attrelid AND i.indisprimary"
        " WHERE a.attrelid = {}::regclass AND a.attnum > 0 AND NOT a.attisdropped"
    ).format(_regclass(table))


def _regclass(table: str) -> Composable:
    """``table`` (``schema.table`` or ``table``, each part an exact name, as
    :func:`source_select` reads it) quoted by the server, for a ``::regclass`` cast."""
    parts = table.split(".", 1)
    if len(parts) == 1:
        return SQL("quote_ident({})").format(Literal(parts[0]))
    return SQL("format('%I.%I', {}, {})").format(Literal(parts[0]), Literal(parts[1]))


def create_target(
    schema: str,
    table: str,
    columns: list[tuple[str, str, bool]],
    primary_key: list[str],
) -> Composed:
    """``CREATE TABLE`` of the target from a source's columns: (name, type as the source
    server's ``format_type`` rendered it, NOT NULL) and its primary key (may be empty). The
    type text is the server's own rendering of a catalog type (as ``pg_get_indexdef`` is: see
    :mod:`airflow_pg_bulk.sql`), checked against the target's catalog before use."""
    parts: list[Composable] = [
        SQL("{} {}{}").format(
            Identifier(name),
            SQL(type_text),  # type: ignore[arg-type]  # format_type's rendering, checked
            SQL(" NOT NULL") if not_null else SQL(""),
        )
        for name, type_text, not_null in columns
    ]
    if primary_key:
        parts.append(
            SQL("PRIMARY KEY ({})").format(SQL(", ").join(Identifier(c) for c in primary_key))
        )
    return SQL("CREATE TABLE {} ({})").format(Identifier(schema, table), SQL(", ").join(parts))


def known_types(types: list[str]) -> Composed:
    """Run on the target: each type text resolved in its catalog (``to_regtype``: NULL where
    the target has no such type, e.g. an extension's not installed there)."""
    return SQL("SELECT t, to_regtype(t) IS NOT NULL FROM unnest({}::text[]) AS t").format(
        Literal(types)
    )


def alchemy_sqlite_strict(table: str) -> Any:
    """A SQLite table's ``(strict, other_types)``: 1 when it is a STRICT table, and how many of
    its columns are of a type other than INT, INTEGER, REAL, TEXT and BLOB (``ANY``); no row
    for a view or a table that is not there (SQLite 3.37+: ``pragma_table_list``)."""
    import sqlalchemy

    schema, _, name = table.rpartition(".")
    return sqlalchemy.text(
        "SELECT t.strict, (SELECT count(*) FROM pragma_table_xinfo(t.name, t.schema)"
        " WHERE upper(type) NOT IN ('INT', 'INTEGER', 'REAL', 'TEXT', 'BLOB'))"
        " FROM pragma_table_list AS t WHERE t.name = :name AND t.schema = :schema"
    ).bindparams(name=name, schema=schema or "main")
