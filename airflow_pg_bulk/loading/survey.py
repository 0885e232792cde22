"""What prepare and the preview both read before anything is made: the target's definition
and the checks on it, the source listed and matched to the target's columns, the upsert key.
Reads only; refuses, with the error prepare gives, what a load could not do. One sequence,
so that the preview refuses exactly what prepare would."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg.sql import Composable

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    is_database_error,
    read_each,
    rollback_quietly,
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
    interval ``abandoned_after`` (when given: prepare's) are read in the capture's own
    statement (:func:`capture_and_check`); for an append with a ``load_id`` (prepare's), that load's
    record in the load history too, once the role is known to be allowed to read it."""
    # (replace_partitions loads only a partitioned target: its capture in one round trip)
    partitioned = True if request.mode.replaces_loaded_partitions else None
    target, checks = capture_and_check(conn, schema, table, abandoned_after, partitioned)
    catalog.refuse_unsupported(target, request.mode)
    privileges, writable, history_exists, leaves, seconds = checks
    if target.partitioning is not None:  # (for the summary: see loading.changes)
        counted = dataclasses.replace(target.partitioning, count=leaves)
        target = dataclasses.replace(target, partitioning=counted)
    catalog.refuse_without_privileges(conn, target, request.mode, privileges=privileges)
    history.refuse_without_access(conn, schema, writable=writable)
    appended = None
    if load_id is not None and not request.mode.replaces_rows:
        # (in autocommit when no transaction is open: one round trip)
        appended = (
            read_each(conn, [history.appended_check(schema, load_id)])[0] if history_exists else []
        )
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


def check_queries(
    schema: str, oid: sql.OidRef, partitioned: bool, abandoned_after: str | None = None
) -> list[Composable]:
    """The reads of :func:`capture_and_check`, for the target ``oid`` in ``schema``."""
    queries = [
        sql.loader_privileges(oid),
        history.access_check(schema),
        history.exists_check(schema),
    ]
    if partitioned:
        queries.append(sql.leaf_count(oid))
    if abandoned_after is not None:
        queries.append(sql.interval_seconds(abandoned_after))
    return queries


#: what :func:`capture_and_check` read besides the definition: the role's privileges on the
#: target (the row of ``sql.loader_privileges``), whether the load history is missing or
#: writable, whether it exists, the target's number of partitions (0 for a plain table),
#: ``abandoned_after`` in seconds (None when not given, or no interval)
Checks = tuple[tuple, bool, bool, int, float | None]


def capture_and_check(
    conn: DatabaseConnection,
    schema: str,
    table: str,
    abandoned_after: str | None,
    partitioned: bool | None = None,
) -> tuple[TargetDefinition, Checks]:
    """The target's definition (:func:`catalog.capture`) and the checks on it
    (:data:`Checks`), read in the capture's round trip (:func:`catalog.capture_with`);
    ``partitioned``: whether the target is expected to be partitioned (then one round trip
    in all on psycopg 3; a target of the other kind is read again, as when not known).

    An ``abandoned_after`` that is no interval fails that statement: the whole is read again
    without it (in a new transaction), and its seconds are None, so that prepare refuses it
    where it did before this read (after the source's checks), with the same error."""

    def with_interval(oid: sql.OidRef, partitioned: bool) -> list[Composable]:
        return check_queries(schema, oid, partitioned, abandoned_after)

    seconds = None
    try:
        target, found = catalog.capture_with(
            conn, schema, table, with_interval, partitioned=partitioned
        )
        if abandoned_after is not None:
            seconds = float(found.pop()[0][0])
    except Exception as exc:
        if abandoned_after is None or not is_database_error(exc):
            raise
        rollback_quietly(conn)
        target, found = catalog.capture_with(
            conn,
            schema,
            table,
            lambda oid, kind: check_queries(schema, oid, kind),
            partitioned=partitioned,
        )
    privileges, ((writable,),), ((exists,),), *rest = found
    leaves = int(rest[0][0][0]) if rest else 0
    return target, (privileges[0], bool(writable), bool(exists), leaves, seconds)
