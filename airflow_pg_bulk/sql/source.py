"""Statements run on a database source (:mod:`airflow_pg_bulk.loading.db_source`): the user's
query, or a whole table, read by ``COPY ... TO STDOUT`` (a PostgreSQL source) or through
SQLAlchemy (any other database)."""

from __future__ import annotations

from typing import Any

from psycopg.sql import SQL, Composable, Composed, Identifier


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
