"""A query or a table on another database behind the
:class:`~airflow_pg_bulk.source.formats.Format` protocol the steps use for files: matched in
prepare, cut into one COPY stream or one per range of its split key."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.loading.database.columns import match_names, source_description
from airflow_pg_bulk.loading.database.ranges import key_quantiles
from airflow_pg_bulk.loading.database.snapshots import expect_ranges, export
from airflow_pg_bulk.loading.database.urls import held_url, hold, is_postgres
from airflow_pg_bulk.plan import (
    BLOCKS,
    CopyOptions,
    DatabaseSource,
    LoadRequest,
    Partition,
    Piece,
    TargetDefinition,
    planning,
)
from airflow_pg_bulk.source import records
from airflow_pg_bulk.source.formats import Matched
from airflow_pg_bulk.source.listing import SourceFile

#: what the COPY into staging is given: PostgreSQL's text format, UTF-8
TEXT = CopyOptions(format="text")


@dataclass(frozen=True)
class DatabaseFormat:
    """A query or table on another database, as prepare and the COPY step use it (the
    :class:`~airflow_pg_bulk.source.formats.Format` protocol).

    :param source: what is read, and where (its columns unknown until :meth:`match`).
    :param ranges: with ``split_by``, how many ranges to cut its key into (``partitions``)."""

    source: DatabaseSource
    ranges: int = 1

    @classmethod
    def of_request(cls, request: LoadRequest) -> DatabaseFormat:
        """The database source a request names (its URL held in this process, or its Airflow
        connection id, whose URL the operator holds)."""
        if request.source_url:
            name = hold(request.source_url)
        else:
            assert request.source_conn_id is not None  # the request checked it
            name = request.source_conn_id
        postgres = is_postgres(held_url(name))
        return cls(
            DatabaseSource(
                name,
                postgres,
                request.query,
                request.source_table,
                split_by=request.split_by or None,
            ),
            ranges=request.partitions or 1,
        )

    @property
    def copy(self) -> CopyOptions:
        """What COPY into staging is given: text."""
        return TEXT

    def refuse_unsupported(self, request: LoadRequest) -> None:
        """Nothing more: the request refused what files alone take."""

    def list_files(self, request: LoadRequest) -> list[SourceFile]:
        """No files."""
        return []

    def match(self, files: Sequence[SourceFile], loadable: Sequence[str]) -> Matched:
        """The source's column names (its query run with ``LIMIT 0``, or SQLAlchemy's result
        keys), each matched to one of the table's ``loadable`` columns by name (exactly, then
        case-insensitively). A query that fails, or a column that matches none, is refused
        here, before anything is made."""
        names, types, arrow = source_description(self.source)
        matched = match_names(names, loadable, self.source.name)
        if self.source.by_blocks and not (self.source.postgres and self.source.table):
            raise LoadRefusedError(
                f"split_by={BLOCKS!r} cuts a PostgreSQL table into ranges of its blocks: it "
                f"needs source_table on a PostgreSQL source, not {self.source.describe()}; "
                "nothing was changed"
            )
        if self.source.split_by and not self.source.by_blocks and self.source.split_by not in names:
            raise LoadRefusedError(
                f"split_by {self.source.split_by!r} is not a column of the source "
                f"{self.source.name} (its columns: {list(names)}); nothing was changed"
            )
        source = dataclasses.replace(self.source, columns=names, types=types, arrow=arrow)
        quantiles = None
        if source.split_by and source.postgres:
            snapshot, quantiles = export(source, self.ranges)
            source = dataclasses.replace(source, snapshot=snapshot)
        elif source.split_by:
            quantiles = key_quantiles(source, self.ranges)
        return Matched(tuple(matched), database=source, key_bounds=quantiles)

    def columns(
        self, request: LoadRequest, target: TargetDefinition, matched: Matched
    ) -> tuple[str, ...]:
        """The target columns the source's columns matched, in the source's order."""
        return matched.names

    def cut(
        self, files: Sequence[SourceFile], partitions: int, matched: Matched
    ) -> list[Partition]:
        """One COPY stream: the whole query, read in one statement (one snapshot); split by a
        column, one per range of it between its quantiles
        (:func:`airflow_pg_bulk.plan.planning.quantile_ranges`: about equal row counts, a
        skewed key too), each read in a statement of its own."""
        ranges: list[tuple[Any, Any]] = [(None, None)]
        if matched.key_bounds is not None:
            ranges = planning.quantile_ranges(matched.key_bounds[0], matched.key_bounds[1:])
        expect_ranges(matched.database, len(ranges))
        return [
            Partition(i, (Piece(self.source.name, key_range=bounds),), 0)
            for i, bounds in enumerate(ranges)
        ]

    @property
    def copy_options(self) -> CopyOptions:
        """Text: what ``COPY ... TO STDOUT`` writes and :mod:`.copy_text` encodes."""
        return TEXT

    @property
    def sends_bytes(self) -> bool:
        """False: the COPY step calls :func:`.piece.copy_piece`."""
        return False

    def marker_rule(self, server_version: int) -> records.MarkerRule | None:
        """None: every value's backslash is escaped, so no marker can occur."""
        return None
