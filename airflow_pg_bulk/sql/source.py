"""Statements run on a database source (:mod:`airflow_pg_bulk.loading.db_source`): the user's
query, or a whole table, read by ``COPY ... TO STDOUT`` (a PostgreSQL source) or through
SQLAlchemy (any other database)."""

from __future__ import annotations

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


def copy_out(select: Composable) -> Composed:
    """``COPY (select) TO STDOUT`` in PostgreSQL's text format."""
    return SQL("COPY ({}) TO STDOUT").format(select)


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


def key_bounds(select: Composable, column: str) -> Composed:
    """The split key's min and max over the source's rows."""
    key = Identifier(column)
    return SQL("SELECT min({}), max({}) FROM ({}) AS pgbulk_source").format(key, key, select)


def key_range(select: Composable, column: str, low: Any, high: Any) -> Composable:
    """The source's rows in one range of its split key (all of them without a split)."""
    if low is None and high is None:
        return select
    return SQL("SELECT * FROM ({}) AS pgbulk_source WHERE {}").format(
        select, _key_predicate(column, low, high)
    )


def _alchemy_source(query: str | None, table: str | None) -> Any:
    return (
        alchemy_select(query, table).columns().subquery("pgbulk_source")
        if table is None
        else (alchemy_select(query, table).subquery("pgbulk_source"))
    )


def alchemy_key_bounds(query: str | None, table: str | None, column: str) -> Any:
    """:func:`key_bounds` through SQLAlchemy."""
    import sqlalchemy

    key = sqlalchemy.column(column)
    return sqlalchemy.select(sqlalchemy.func.min(key), sqlalchemy.func.max(key)).select_from(
        _alchemy_source(query, table)
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
