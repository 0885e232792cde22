"""Formats: what a source format means for prepare and for the COPY task, chosen once per load
by :func:`for_copy` from the COPY options, as one object with one interface.

- :class:`Delimited` (``csv``, ``text``): a header, when there is one, is read and matched to
  the table's columns by name; big files are cut at record starts (:mod:`.cutting`); the COPY
  task sends a piece's bytes as they are (:func:`.reading.piece_chunks`), counting its records
  (:mod:`.records`), and may set bad rows aside.
- :class:`Parquet`: the footers name the columns and the row groups; pieces are runs of row
  groups (:mod:`.parquet`); the COPY task encodes the rows as COPY CSV itself
  (:mod:`airflow_pg_bulk.loading.parquet_copy`).

A new source format is one new class here and one new case in :func:`for_copy`. A database
source is the same protocol one layer up (it runs queries): its class is
:class:`airflow_pg_bulk.loading.database.format.DatabaseFormat`, chosen by
:mod:`airflow_pg_bulk.loading.sources`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from airflow_pg_bulk.plan import (
    CopyOptions,
    DatabaseSource,
    LoadRequest,
    Partition,
    TargetDefinition,
    planning,
)
from airflow_pg_bulk.plan.codes import CopyFormat
from airflow_pg_bulk.source import cutting, header, parquet, records
from airflow_pg_bulk.source.listing import SourceFile, list_sources
from airflow_pg_bulk.source.syntax import RecordSyntax


@dataclass(frozen=True)
class Matched:
    """What prepare learnt from the files about their columns.

    :param names: the table columns the files' own names matched, in file order (a header's,
        a Parquet file's); empty when the files name none (no header).
    :param header_lengths: each file's header length in bytes (delimited files with a header).
    :param layout: each file's footer (Parquet).
    :param database: a database source with its columns (its format is
        :class:`airflow_pg_bulk.loading.database.format.DatabaseFormat`).
    :param key_bounds: a database source split by a column: its min, then the values that
        start each later range (its quantiles)."""

    names: tuple[str, ...] = ()
    header_lengths: dict[str, int] = field(default_factory=dict)
    layout: tuple[parquet.ParquetSource, ...] = ()
    database: DatabaseSource | None = None
    key_bounds: tuple[object, ...] | None = None


class Format(Protocol):
    """One source format, as prepare and the COPY task use it."""

    #: the load's COPY options
    copy: CopyOptions

    def refuse_unsupported(self, request: LoadRequest) -> None:
        """Refuse options this format does not take, before any file is read."""
        ...

    def list_files(self, request: LoadRequest) -> list[SourceFile]:
        """The source's files and objects, listed (none for a database source)."""
        ...

    def match(self, files: Sequence[SourceFile], loadable: Sequence[str]) -> Matched:
        """Read what names the files' columns and match it to the table's ``loadable``
        columns by name (exactly, then case-insensitively)."""
        ...

    def columns(
        self, request: LoadRequest, target: TargetDefinition, matched: Matched
    ) -> tuple[str, ...]:
        """The target columns the COPY fills, in the files' order."""
        ...

    def cut(
        self, files: Sequence[SourceFile], partitions: int, matched: Matched
    ) -> list[Partition]:
        """The files cut into pieces, packed into about ``partitions`` partitions."""
        ...

    @property
    def copy_options(self) -> CopyOptions:
        """The options ``COPY ... FROM STDIN`` is given for what the COPY task sends."""
        ...

    @property
    def sends_bytes(self) -> bool:
        """True: the COPY task sends a piece's bytes as they are (:func:`.reading.piece_chunks`),
        counts their records and may set rows aside; False: the format encodes its rows
        itself (:mod:`airflow_pg_bulk.loading.parquet_copy`)."""
        ...

    def marker_rule(self, server_version: int) -> records.MarkerRule | None:
        """Where this server's COPY takes ``\\.`` for end of data in the bytes sent (None: the
        format encodes its rows, and no marker can occur)."""
        ...


@dataclass(frozen=True)
class Delimited:
    """csv or PostgreSQL's text format: records cut by :attr:`syntax`, built once here."""

    copy: CopyOptions
    syntax: RecordSyntax

    def refuse_unsupported(self, request: LoadRequest) -> None:
        """Nothing: every load option applies to delimited files."""

    def list_files(self, request: LoadRequest) -> list[SourceFile]:
        """The files and objects ``source`` names (:func:`.listing.list_sources`)."""
        return list_sources(request.source, request.source_conn_id)

    def match(self, files: Sequence[SourceFile], loadable: Sequence[str]) -> Matched:
        """The header's names matched to the table's columns, and each file's header length;
        nothing without a header."""
        if not self.copy.header:
            return Matched()
        names, lengths = header.map_header(files, self.copy, loadable, syntax=self.syntax)
        return Matched(tuple(names), lengths)

    def columns(
        self, request: LoadRequest, target: TargetDefinition, matched: Matched
    ) -> tuple[str, ...]:
        """The header's columns, else ``columns=``, else every loadable column."""
        return planning.plan_columns(request, target, list(matched.names))

    def cut(
        self, files: Sequence[SourceFile], partitions: int, matched: Matched
    ) -> list[Partition]:
        """Big files cut at record starts found from a window at each split point."""
        return cutting.plan_partitions(
            files, self.copy, partitions, matched.header_lengths, syntax=self.syntax
        )

    @property
    def copy_options(self) -> CopyOptions:
        """The load's own options: the bytes go to COPY as they are."""
        return self.copy

    @property
    def sends_bytes(self) -> bool:
        """True: a piece's bytes are sent as they are."""
        return True

    def marker_rule(self, server_version: int) -> records.MarkerRule | None:
        """This server's end-of-data marker rule for the format."""
        return records.marker_rule(self.copy.format, server_version)


@dataclass(frozen=True)
class Parquet:
    """Parquet files: footers read in prepare, row groups encoded as COPY CSV by Arrow."""

    copy: CopyOptions

    def refuse_unsupported(self, request: LoadRequest) -> None:
        """``on_error='reject'`` and ``columns=`` (see :func:`.parquet.refuse_unsupported`)."""
        parquet.refuse_unsupported(request)

    def list_files(self, request: LoadRequest) -> list[SourceFile]:
        """The files and objects ``source`` names (:func:`.listing.list_sources`)."""
        return list_sources(request.source, request.source_conn_id)

    def match(self, files: Sequence[SourceFile], loadable: Sequence[str]) -> Matched:
        """Every file's footer, and its column names matched to the table's."""
        layout = tuple(parquet.inspect(files))
        return Matched(tuple(parquet.match_columns(layout, loadable)), layout=layout)

    def columns(
        self, request: LoadRequest, target: TargetDefinition, matched: Matched
    ) -> tuple[str, ...]:
        """The columns the files name."""
        return matched.names

    def cut(
        self, files: Sequence[SourceFile], partitions: int, matched: Matched
    ) -> list[Partition]:
        """Runs of whole row groups of similar compressed size."""
        return parquet.plan_partitions(matched.layout, partitions)

    @property
    def copy_options(self) -> CopyOptions:
        """COPY CSV as Arrow's writer encodes it (:data:`.parquet.COPY_CSV`)."""
        return parquet.COPY_CSV

    @property
    def sends_bytes(self) -> bool:
        """False: the rows are encoded by :mod:`airflow_pg_bulk.loading.parquet_copy`."""
        return False

    def marker_rule(self, server_version: int) -> records.MarkerRule | None:
        """None: Arrow's CSV writer quotes every string, so no marker is read."""
        return None


def for_copy(copy: CopyOptions) -> Format:
    """The format a load's COPY options name: the one place that decides it."""
    match copy.format:
        case CopyFormat.PARQUET:
            return Parquet(copy)
        case CopyFormat.CSV | CopyFormat.TEXT:
            return Delimited(copy, RecordSyntax.of(copy))
        case other:
            raise ValueError(f"unknown format {other!r}")
