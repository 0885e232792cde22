"""What finalize reads for the summary of what a load changed: the catalog's row estimates
(no scan of the target) and the rows of the load's own staging partitions."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.sql import SQL, Composed, Literal

from airflow_pg_bulk.sql.compose import table_identifier


def row_estimates(oid: int) -> Composed:
    """(schema, name, reltuples) of the table ``oid`` when it is not partitioned, else of each
    of its partitions (one level: a load refuses more): the estimate of the last VACUUM or
    ANALYZE (-1: never; PostgreSQL 13 and older say 0). Reads the catalog alone, and locks
    nothing (``pg_partition_tree`` would lock every partition)."""
    return SQL(
        "SELECT n.nspname, c.relname, c.reltuples::bigint FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE (c.oid = {o} AND c.relkind <> 'p') OR c.oid IN"
        " (SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = {o})"
        " ORDER BY 1, 2"
    ).format(o=Literal(oid))


def staged_rows(schema: str, tables: Sequence[str]) -> Composed:
    """(position in ``tables``, rows) of each of the load's own tables: one statement, a scan
    of the loaded rows only."""
    parts = [
        SQL("SELECT {}, count(*) FROM {}").format(Literal(n), table_identifier(schema, name))
        for n, name in enumerate(tables)
    ]
    return SQL(" UNION ALL ").join(parts)
