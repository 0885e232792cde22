"""The source of a load chosen once, as an object: files in a format
(:func:`airflow_pg_bulk.source.formats.for_copy`) or a query or table on another database
(:class:`airflow_pg_bulk.loading.db_source.DatabaseFormat`); prepare and the COPY step ask it
what they need and never test the kind again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_pg_bulk.loading import db_source, parquet_copy
from airflow_pg_bulk.plan import LoadPlan, LoadRequest, Piece
from airflow_pg_bulk.source import formats, parquet

#: COPY one piece whose rows the load encodes itself, in the caller's transaction:
#: ``(conn, plan, piece, progress, done, expected) -> (rows, bytes)``
PieceEncoder = Callable[[Any, LoadPlan, Piece, Any, int, int], tuple[int, int]]


def for_request(request: LoadRequest) -> formats.Format:
    """The source a request names, as prepare uses it."""
    if request.from_database:
        return db_source.DatabaseFormat.of_request(request)
    return formats.for_copy(request.copy)


def for_plan(plan: LoadPlan) -> formats.Format:
    """The source a plan reads, as the COPY step uses it."""
    if plan.database is not None:
        return db_source.DatabaseFormat(plan.database)
    return formats.for_copy(plan.copy)


def encoder(plan: LoadPlan) -> PieceEncoder:
    """How a piece is COPYed when its format does not send its bytes as they are: a database
    source's rows, or a Parquet piece's."""
    return db_source.copy_piece if plan.database is not None else parquet_copy.copy_piece


def source_schema(request: LoadRequest) -> tuple[db_source.Schema, str]:
    """What ``create_target`` makes a missing target from, and the source in words: a
    database source's columns and key (:func:`.db_source.source_schema`), or the first
    Parquet file's columns (:func:`airflow_pg_bulk.source.parquet.target_schema`; the request
    refused create_target for other files)."""
    if request.from_database:
        return db_source.source_schema(request)
    files = formats.for_copy(request.copy).list_files(request)
    return (parquet.target_schema(files[0]), []), f"the Parquet file {files[0].path}"
