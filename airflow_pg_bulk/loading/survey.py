"""What prepare and the preview both read before anything is made: the target's definition
and the checks on it, the source listed and matched to the target's columns, the upsert key.
Reads only; refuses, with the error prepare gives, what a load could not do. One sequence,
so that the preview refuses exactly what prepare would."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    is_database_error,
    rollback_quietly,
    rows_of_each,
)
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
    :param leaves: how many direct partitions a partitioned target has (0 for a plain one).
    :param history_exists: whether the load history exists in the target's schema.
    :param abandoned_after: the ``abandoned_after`` asked for, in seconds, as the server read
        it; None when not asked for, or when it is no interval (refused where prepare reads
        it: :func:`airflow_pg_bulk.loading.cleanup.interval_seconds`).
    :param appended: an append's record in the load history, when a load id was given (the
        rows of :func:`airflow_pg_bulk.target.history.appended_check`, none when there is no
        history): prepare refuses to append twice by it; None when not read.
    """

    target: TargetDefinition
    source: sources.Source
    files: Sequence[SourceFile]
    matched: formats.Matched
    columns: tuple[str, ...]
    key: UpsertSpec | None
    leaves: int = 0
    history_exists: bool = False
    abandoned_after: float | None = None
    appended: list[tuple] | None = None

    @property
    def total_bytes(self) -> int:
        """The size of the files listed."""
        return sum(f.size for f in self.files)


def survey(
    conn: DatabaseConnection,
    request: LoadRequest,
    schema: str,
    table: str,
    *,
    abandoned_after: str | None = None,
    load_id: str | None = None,
) -> Survey:
    """Capture ``schema.table`` and check that ``request`` can load it (the mode's needs, the
    role's privileges, the load history's access), list and match the source, find the
    upsert key. Ends with the connection's transaction rolled back.

    The checks, the target's number of partitions, whether the load history exists and the
    interval ``abandoned_after`` (when given: prepare's) are read in one statement after the
    capture (:func:`read_checks`); for an append with a ``load_id`` (prepare's), that load's
    record in the load history too, once the role is known to be allowed to read it."""
    target = catalog.capture(conn, schema, table)
    catalog.refuse_unsupported(target, request.mode)
    privileges, writable, history_exists, leaves, seconds = read_checks(
        conn, target, abandoned_after
    )
    catalog.refuse_without_privileges(conn, target, request.mode, privileges=privileges)
    history.refuse_without_access(conn, schema, writable=writable)
    appended = None
    if load_id is not None and not request.mode.replaces_rows:
        appended = execute(conn, history.appended_check(schema, load_id)) if history_exists else []
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
    return Survey(
        target,
        source,
        files,
        matched,
        tuple(columns),
        key,
        leaves,
        history_exists,
        seconds,
        appended,
    )


def read_checks(
    conn: DatabaseConnection, target: TargetDefinition, abandoned_after: str | None
) -> tuple[tuple, bool, bool, int, float | None]:
    """In one statement, in the capture's transaction: the role's privileges on the target
    (the row of ``sql.loader_privileges``), whether the load history is missing or writable,
    whether it exists, the target's number of partitions (0 for a plain table) and
    ``abandoned_after`` in seconds (None when not given).

    An ``abandoned_after`` that is no interval fails the statement: the rest is read again
    without it (in a new transaction, its search_path pinned again), and its seconds are
    None, so that prepare refuses it where it did before this read (after the source's
    checks), with the same error."""
    schema = target.schema
    queries = [
        sql.loader_privileges(target.oid),
        history.access_check(schema),
        history.exists_check(schema),
    ]
    if target.partitioning is not None:
        queries.append(sql.leaf_count(target.oid))
    found: list[list[tuple]] | None = None
    if abandoned_after is not None:
        try:
            found = rows_of_each(conn, [*queries, sql.interval_seconds(abandoned_after)])
        except Exception as exc:
            if not is_database_error(exc):
                raise
            rollback_quietly(conn)
            execute(conn, sql.pin_search_path())
    seconds = None
    if found is None:
        found = rows_of_each(conn, queries)
    else:
        seconds = float(found.pop()[0][0])
    privileges, ((writable,),), ((exists,),), *rest = found
    leaves = int(rest[0][0][0]) if rest else 0
    return privileges[0], bool(writable), bool(exists), leaves, seconds
