"""The pieces every builder composes with: a qualified table, a column list."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.sql import SQL, Composed, Identifier


def table_identifier(schema: str, name: str) -> Identifier:
    """A schema-qualified table (or other relation) name."""
    return Identifier(schema, name)


def column_names(names: Sequence[str]) -> Composed:
    """Column names, comma-separated."""
    return SQL(", ").join(Identifier(n) for n in names)
