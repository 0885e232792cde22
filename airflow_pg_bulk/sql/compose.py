"""The pieces every builder composes with: a qualified table, a column list."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal


def table_identifier(schema: str, name: str) -> Identifier:
    """A schema-qualified table (or other relation) name."""
    return Identifier(schema, name)


def column_names(names: Sequence[str]) -> Composed:
    """Column names, comma-separated."""
    return SQL(", ").join(Identifier(n) for n in names)


def in_one_round_trip(*statements: Composable) -> Composed:
    """Statements sent together, as one query string (the simple query protocol, which both
    drivers use for a statement without parameters): run one after another in the current
    transaction; the first that fails stops the rest and raises. Only for statements whose
    results are not read (the drivers return different ones: psycopg2 the last, psycopg 3 the
    first)."""
    return SQL("; ").join(statements)


#: a table's oid in a query: the number, or an expression that finds it on the server
#: (:func:`airflow_pg_bulk.sql.remembered_oid`), so that the queries of a capture need not
#: wait for the oid to come back
OidRef = int | Composable


def oid_ref(oid: OidRef) -> Composable:
    """The oid as a query gets it: a number as a literal, an expression as it is."""
    return oid if isinstance(oid, Composable) else Literal(oid)
