"""What prepare and the preview both read before anything is made: the target's definition
and the checks on it, the source listed and matched to the target's columns, the upsert key.
Reads only; refuses, with the error prepare gives, what a load could not do. One sequence,
so that the preview refuses exactly what prepare would."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pg_bulk.db.driver import DatabaseConnection
from airflow_pg_bulk.loading import sources
from airflow_pg_bulk.plan import LoadRequest, TargetDefinition, UpsertSpec, planning
from airflow_pg_bulk.source import formats
from airflow_pg_bulk.source.listing import SourceFile
from airflow_pg_bulk.target import catalog, history, upsert


@dataclass(frozen=True)
class Survey:
    """What a load of a request would work with.

    :param target: the target's definition, as captured now.
    :param source: the source the request names (files in a format, or a database's query
        or table), chosen once (:func:`airflow_pg_bulk.loading.sources.for_request`).
    :param files: the files listed (none for a database source).
    :param matched: what the files told of their columns.
    :param columns: the target's columns the load fills, in the source's order.
    :param key: an upsert's key and how duplicates are settled; None for the other modes.
    """

    target: TargetDefinition
    source: sources.Source
    files: Sequence[SourceFile]
    matched: formats.Matched
    columns: tuple[str, ...]
    key: UpsertSpec | None

    @property
    def total_bytes(self) -> int:
        """The size of the files listed."""
        return sum(f.size for f in self.files)


def survey(conn: DatabaseConnection, request: LoadRequest, schema: str, table: str) -> Survey:
    """Capture ``schema.table`` and check that ``request`` can load it (the mode's needs, the
    role's privileges, the load history's access), list and match the source, find the
    upsert key. Ends with the connection's transaction rolled back."""
    target = catalog.capture(conn, schema, table)
    catalog.refuse_unsupported(target, request.mode)
    catalog.refuse_without_privileges(conn, target, request.mode)
    history.refuse_without_access(conn, schema)
    conn.rollback()
    source = sources.for_request(request)
    source_format = source.format
    source_format.refuse_unsupported(request)
    files = source_format.list_files(request)
    matched = source_format.match(files, planning.loadable_columns(target))
    columns = source_format.columns(request, target, matched)
    key = None
    if request.mode.keyed:
        indexes = upsert.unique_indexes(conn, target)
        conn.rollback()
        key = planning.upsert_spec(request, target, columns, indexes)
    return Survey(target, source, files, matched, tuple(columns), key)
