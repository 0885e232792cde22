"""The source of a load chosen once, as an object (:class:`Source`): :class:`Files` in a format
(:func:`airflow_pg_bulk.source.formats.for_copy`) or a query or table on another
:class:`Database` (:class:`airflow_pg_bulk.loading.database.format.DatabaseFormat`). It is chosen in
one place from a request (:func:`for_request`: prepare, the preview, the operator's prepare
task) and in one place from a plan (:func:`for_plan`: the COPY step, the operator's COPY task,
the runner's cleanup); every step asks it what it needs (its COPY format, its piece encoder,
create_target's schema, the words of prepare's log, the connection a task holds, what the
preview shows) and never tests the kind again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from airflow_pg_bulk.loading import parquet_copy
from airflow_pg_bulk.loading.database import piece, schema, snapshots
from airflow_pg_bulk.loading.database.format import DatabaseFormat
from airflow_pg_bulk.plan import CopyOptions, LoadPlan, LoadRequest, Piece
from airflow_pg_bulk.source import formats, parquet

#: COPY one piece whose rows the load encodes itself, in the caller's transaction:
#: ``(conn, plan, piece, progress, done, expected) -> (rows, bytes)``
PieceEncoder = Callable[[Any, LoadPlan, Piece, Any, int, int], tuple[int, int]]

#: a source's schema as create_target takes it: ``(name, PostgreSQL type text, NOT NULL)`` per
#: column, and the primary key's columns in key order (may be empty)
Schema = schema.Schema


class Source(Protocol):
    """What a load reads, as every step asks it."""

    @property
    def format(self) -> formats.Format:
        """How prepare lists, matches and cuts it, and what the COPY step gives COPY."""
        ...

    @property
    def encoder(self) -> PieceEncoder:
        """How the COPY step COPYs a piece when :attr:`format` does not send its bytes as
        they are (``format.sends_bytes`` is False)."""
        ...

    @property
    def connection_id(self) -> str | None:
        """The Airflow connection a task resolves and holds in its process before it reads
        the source (None: nothing to hold)."""
        ...

    @property
    def shown(self) -> str | None:
        """The source database in words, as the preview names it (None: files)."""
        ...

    def target_schema(self, request: LoadRequest) -> tuple[Schema, str]:
        """What ``create_target`` makes a missing target from, and the source in words."""
        ...

    def reads(self, files: int, total: int) -> str:
        """What the load reads, for prepare's log line (``files`` listed, ``total`` bytes)."""
        ...

    def release(self) -> None:
        """Free what this process holds for reading the source once the load is done."""
        ...


@dataclass(frozen=True)
class Files:
    """Files and objects in a format: their bytes sent as they are, or a Parquet piece's
    rows encoded by :func:`airflow_pg_bulk.loading.parquet_copy.copy_piece`."""

    copy: CopyOptions

    @cached_property
    def format(self) -> formats.Format:
        """The format the COPY options name (:func:`.formats.for_copy`)."""
        return formats.for_copy(self.copy)

    @property
    def encoder(self) -> PieceEncoder:
        """A Parquet piece's rows encoded as COPY CSV (the one format that needs it)."""
        return parquet_copy.copy_piece

    @property
    def connection_id(self) -> None:
        """None: an object store's connection is resolved where the files are listed."""
        return None

    @property
    def shown(self) -> None:
        """None: the preview lists the files."""
        return None

    def target_schema(self, request: LoadRequest) -> tuple[Schema, str]:
        """The first Parquet file's columns (:func:`airflow_pg_bulk.source.parquet.target_schema`;
        the request refused create_target for other files) and no key."""
        files = self.format.list_files(request)
        return (parquet.target_schema(files[0]), []), f"the Parquet file {files[0].path}"

    def reads(self, files: int, total: int) -> str:
        """``3 files, 12.5 MB``."""
        return f"{files} files, {total / 1e6:.1f} MB"

    def release(self) -> None:
        """Nothing is held."""


@dataclass(frozen=True)
class Database:
    """A query or a table on another database (:class:`.database.format.DatabaseFormat`),
    its rows read by :func:`.database.piece.copy_piece`.

    :param connection_id: the Airflow connection a task holds before it reads the source
        (:attr:`Source.connection_id`).
    :param make_format: its format, made when first asked for (a request's source URL is
        looked up then, so a task may hold its connection first)."""

    connection_id: str | None
    make_format: Callable[[], DatabaseFormat] = field(repr=False, compare=False)

    @cached_property
    def format(self) -> DatabaseFormat:
        """The query or table, as prepare and the COPY step use it."""
        return self.make_format()

    @property
    def encoder(self) -> PieceEncoder:
        """The source's rows read and COPYed by :func:`.database.piece.copy_piece`."""
        return piece.copy_piece

    @property
    def shown(self) -> str:
        """The query or table and where (:meth:`airflow_pg_bulk.plan.DatabaseSource.describe`)."""
        return self.format.source.describe()

    def target_schema(self, request: LoadRequest) -> tuple[Schema, str]:
        """The source's columns and key (:func:`.database.schema.source_schema`)."""
        return schema.source_schema(self.format.source, request.table)

    def reads(self, files: int, total: int) -> str:
        """``reading the table public.readings on warehouse_src``."""
        return f"reading {self.shown}"

    def release(self) -> None:
        """End the session holding its exported snapshot, if this process still holds it
        (:func:`.database.snapshots.release_snapshot`)."""
        snapshots.release_snapshot(self.format.source)


def for_request(request: LoadRequest) -> Source:
    """The source a request names, as prepare, the preview and the operator use it."""
    if request.from_database:
        return Database(request.source_conn_id, lambda: DatabaseFormat.of_request(request))
    return Files(request.copy)


def for_plan(plan: LoadPlan) -> Source:
    """The source a plan reads, as the COPY step and the tasks after prepare use it (under
    Airflow a database source's name is its connection id: the operator refuses a URL)."""
    database = plan.database
    if database is not None:
        return Database(database.name, lambda: DatabaseFormat(database))
    return Files(plan.copy)
