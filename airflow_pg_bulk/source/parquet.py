"""Parquet sources (``format="parquet"``): local files, globs and object-storage URLs.

Prepare reads only each file's footer (for an object: a few range requests through the same
fsspec file object :mod:`.objects` reads with) and cuts the files into pieces
of consecutive row groups, packed into partitions by their compressed bytes. The file's columns
are matched by name to the target's (exactly, then case-insensitively; any order): a Parquet
column the target lacks is refused, a target column the files lack gets its default.

Each COPY task reads its row groups one at a time, in batches of :data:`BATCH_ROWS` rows, and
encodes them for ``COPY ... (FORMAT csv)`` with Arrow's own CSV writer, so memory stays at about
one row group. The writer quotes every string (an empty string is ``""``, which COPY keeps
apart from NULL, an unquoted empty field) and doubles the quotes inside; values are converted
exactly:

- integers and decimals as their digits (never through a float); floats in their shortest
  round-trip form (``nan``, ``inf`` and ``-inf`` as PostgreSQL reads them);
- dates ``2024-02-29``; times and timestamps with their fraction (nanoseconds are rounded to
  microseconds by PostgreSQL); a timestamp with a time zone is written in UTC with ``Z``, so a
  ``timestamptz`` column gets the same instant (a ``timestamp`` column, which ignores zones, its
  UTC wall time); a timestamp without one is read in the session's ``TimeZone`` by a
  ``timestamptz`` column, as a CSV value without an offset would be;
- booleans ``true``/``false``; binary as bytea's hex form ``\\x0aff``; dictionary-encoded
  columns as their values;
- nested types (lists, structs, maps), durations and intervals are refused by prepare, naming
  the file and the column: they have no exact text form here.

A value PostgreSQL cannot convert (an int64 out of range for ``integer``, text in a ``date``
column) fails the partition naming the file, the row group, the row and the column; the
partition's transaction rolls back. A file changed after prepare read its footer (another
size, another ETag, row groups elsewhere) fails its partition rather than loading a mix.

pyarrow is an optional dependency: ``pip install airflow-pg-bulk[parquet]``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import CopyOptions, LoadRequest, Partition, Piece
from airflow_pg_bulk.source import objects
from airflow_pg_bulk.source.cutting import pack
from airflow_pg_bulk.source.header import match_columns as match_names
from airflow_pg_bulk.source.listing import SourceFile, SourceKind, piece_kind

BATCH_ROWS = 65_536  # rows encoded at once: bounds the CSV text held next to the row group
#: how the encoded rows are read: csv, comma, unquoted empty = NULL, UTF-8 (Arrow's strings)
COPY_CSV = CopyOptions(format="csv")


def pyarrow_modules() -> tuple[Any, Any, Any]:
    """``(pyarrow, pyarrow.parquet, pyarrow.csv)``, imported on first use.

    :raises LoadRefusedError: pyarrow is not installed; the message names the extra."""
    try:
        import pyarrow
        import pyarrow.csv
        import pyarrow.parquet
    except ImportError as exc:
        raise LoadRefusedError(
            f"format='parquet' needs pyarrow: pip install 'airflow-pg-bulk[parquet]' ({exc})"
        ) from None
    return pyarrow, pyarrow.parquet, pyarrow.csv


@dataclass(frozen=True)
class RowGroup:
    """One row group as the footer describes it: its rows and the bytes its chunks span."""

    index: int
    rows: int
    start: int
    end: int


@dataclass(frozen=True)
class ParquetSource:
    """What prepare read from one file's footer."""

    file: SourceFile
    names: tuple[str, ...]
    row_groups: tuple[RowGroup, ...]


# --- prepare -------------------------------------------------------------------------------


def refuse_unsupported(request: LoadRequest) -> None:
    """Options a Parquet load does not take, refused before any file is read."""
    if request.errors.rejecting:
        raise LoadRefusedError(
            "on_error='reject' is not supported with format='parquet' yet: a value that "
            "cannot convert fails the load, naming its file, row group, row and column"
        )
    if request.columns:
        raise LoadRefusedError(
            "columns= is for files without a header; a Parquet file names its columns, which "
            "are matched to the target's by name"
        )


def inspect(files: Sequence[SourceFile]) -> list[ParquetSource]:
    """Read every file's footer: its columns (checked to be loadable) and row groups; up to
    :data:`.objects.LIST_THREADS` at once (an object's takes round trips)."""
    with ThreadPoolExecutor(max_workers=min(objects.LIST_THREADS, max(1, len(files)))) as pool:
        return list(pool.map(_inspect, files))


def _inspect(file: SourceFile) -> ParquetSource:
    metadata, schema = _footer(file)
    for field in schema:
        kind = unsupported_type(field.type)
        if kind:
            raise LoadRefusedError(
                f"{file.path}: column {field.name!r} is {field.type}: {kind} are not loaded "
                "(there is no exact text form for them here); leave the column out of the "
                "file, or write it as a string (JSON, say) to load into a json/text column"
            )
    groups = tuple(row_group(metadata, i) for i in range(metadata.num_row_groups))
    return ParquetSource(file, tuple(schema.names), groups)


def _footer(file: SourceFile) -> tuple[Any, Any]:
    """A file's (or object's) footer: its metadata and Arrow schema."""
    if file.kind is SourceKind.STREAM:
        raise LoadRefusedError(
            f"source {file.path} is a stream: a Parquet file is read from its footer first, "
            "so it must be a file or an object"
        )
    _pa, pq, _csv = pyarrow_modules()
    try:
        if file.is_object:
            with objects.open_header(file.path, file.conn_id, None) as raw:
                parquet_file = pq.ParquetFile(raw)
                metadata, schema = parquet_file.metadata, parquet_file.schema_arrow
        else:
            with pq.ParquetFile(file.path) as parquet_file:
                metadata, schema = parquet_file.metadata, parquet_file.schema_arrow
    except (LoadRefusedError, PermissionError):
        raise
    except Exception as exc:  # pyarrow's ArrowInvalid (not Parquet), ArrowIOError, ...
        raise BadDataError(
            f"{file.path}: cannot read it as a Parquet file ({type(exc).__name__}: "
            f"{objects.scrub(str(exc))})",
            path=file.path,
        ) from None
    return metadata, schema


def target_schema(file: SourceFile) -> list[tuple[str, str, bool]]:
    """``create_target``'s columns from a Parquet file's schema: each column's name, its
    Arrow type as PostgreSQL's (:func:`postgres_type`) and NOT NULL where the file declares
    it non-nullable (a Parquet file has no key). A type with no exact PostgreSQL equivalent
    is refused, not guessed."""
    _metadata, schema = _footer(file)
    columns = []
    for field in schema:
        type_text = postgres_type(field.type)
        if type_text is None:
            raise LoadRefusedError(
                f"create_target: column {field.name!r} of {file.path} is {field.type}, which "
                "has no exact PostgreSQL type here; nothing was changed. Create the target "
                "table first"
            )
        columns.append((field.name, type_text, not field.nullable))
    return columns


def postgres_type(arrow_type: Any) -> str | None:
    """The PostgreSQL type that holds every value of an Arrow type exactly: integers in the
    smallest type that holds them (``uint64``: ``numeric(20)``), ``float32`` as ``real``,
    decimals with their precision and scale, timestamps with their time zone or without,
    a dictionary as its values' type; None for what the load cannot take
    (:func:`unsupported_type`) or a column of nulls only (its type unknown)."""
    pa, _pq, _csv = pyarrow_modules()
    t = pa.types
    if t.is_dictionary(arrow_type):
        return postgres_type(arrow_type.value_type)
    if unsupported_type(arrow_type) or t.is_null(arrow_type):
        return None
    if t.is_integer(arrow_type):
        bits = arrow_type.bit_width + (1 if t.is_unsigned_integer(arrow_type) else 0)
        for size, name in ((16, "smallint"), (32, "integer"), (64, "bigint")):
            if bits <= size:
                return name
        return "numeric(20,0)"
    if t.is_decimal(arrow_type):
        return f"numeric({arrow_type.precision},{arrow_type.scale})"
    if t.is_timestamp(arrow_type):
        zone = "with" if arrow_type.tz else "without"
        return f"timestamp {zone} time zone"
    simple = (
        (t.is_boolean, "boolean"),
        (t.is_float16, "real"),
        (t.is_float32, "real"),
        (t.is_float64, "double precision"),
        (t.is_date, "date"),
        (t.is_time, "time without time zone"),
        (_is_binary, "bytea"),
    )
    return next((name for test, name in simple if test(arrow_type)), "text")  # strings


def unsupported_type(arrow_type: Any) -> str | None:
    """Why a column of this Arrow type cannot be loaded (``"nested types"``), or None."""
    pa, _pq, _csv = pyarrow_modules()
    t = pa.types
    if t.is_dictionary(arrow_type):
        return unsupported_type(arrow_type.value_type)
    if t.is_nested(arrow_type):
        return "nested types (lists, structs, maps, unions)"
    if t.is_duration(arrow_type) or t.is_interval(arrow_type):
        return "durations and intervals"
    simple = (
        t.is_null,
        t.is_boolean,
        t.is_integer,
        t.is_floating,
        t.is_decimal,
        t.is_string,
        t.is_large_string,
        t.is_string_view,
        t.is_date,
        t.is_time,
        t.is_timestamp,
    )
    if any(test(arrow_type) for test in simple) or _is_binary(arrow_type):
        return None
    return f"{arrow_type} columns"


def _is_binary(arrow_type: Any) -> bool:
    pa, _pq, _csv = pyarrow_modules()
    t = pa.types
    return (
        t.is_binary(arrow_type)
        or t.is_large_binary(arrow_type)
        or t.is_fixed_size_binary(arrow_type)
        or t.is_binary_view(arrow_type)
    )


def row_group(metadata: Any, index: int) -> RowGroup:
    """A row group's rows and the bytes its column chunks span (dictionary pages included)."""
    group = metadata.row_group(index)
    starts, ends = [], []
    for c in range(group.num_columns):
        chunk = group.column(c)
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
            start = min(start, chunk.dictionary_page_offset)
        starts.append(start)
        ends.append(start + chunk.total_compressed_size)
    if not starts:
        return RowGroup(index, group.num_rows, 0, 0)
    return RowGroup(index, group.num_rows, min(starts), max(ends))


def match_columns(layout: Sequence[ParquetSource], table_columns: Sequence[str]) -> list[str]:
    """The target columns the files fill, in the first file's column order; every file must
    have the same columns (in any order)."""
    mapped: list[str] | None = None
    first = None
    for source in layout:
        if not source.row_groups:
            continue
        names = match_names(source.names, table_columns, what="Parquet")
        if mapped is None:
            mapped, first = names, source
        elif set(names) != set(mapped):
            raise LoadRefusedError(
                f"{source.file.path}: its columns {list(source.names)} differ from "
                f"{first.file.path}'s {list(first.names)}; every file of a load must have the "
                "same columns (in any order)"
            )
    return mapped or []


def plan_partitions(layout: Sequence[ParquetSource], partitions: int) -> list[Partition]:
    """Cut the files into pieces of consecutive row groups of about ``1/partitions`` of the
    compressed bytes each, packed into ``partitions`` partitions (largest first, each into the
    lightest). A row group is never split."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    total = sum(g.end - g.start for s in layout for g in s.row_groups)
    target = max(1, -(-total // partitions))
    pieces: list[Piece] = []
    for source in layout:
        run: list[RowGroup] = []
        for group in source.row_groups:
            run.append(group)
            if sum(g.end - g.start for g in run) >= target:
                pieces.append(_piece(source, run))
                run = []
        if run:
            pieces.append(_piece(source, run))
    return pack(pieces, partitions, {})


def _piece(source: ParquetSource, run: Sequence[RowGroup]) -> Piece:
    file = source.file
    return Piece(
        file.path,
        min(g.start for g in run),
        max(g.end for g in run),
        conn_id=file.conn_id,
        source_size=file.size,
        etag=file.etag,
        row_groups=tuple(g.index for g in run),
    )


# --- reading a piece -----------------------------------------------------------------------


def groups_text(groups: Sequence[int]) -> str:
    """Row groups as a message names them: ``3`` or ``3-5``."""
    return f"{groups[0]}-{groups[-1]}" if len(groups) > 1 else str(groups[0])


@contextmanager
def open_piece(piece: Piece) -> Iterator[Any]:
    """The piece's file opened with pyarrow, checked to be the file prepare read."""
    _pa, pq, _csv = pyarrow_modules()
    if piece_kind(piece) is SourceKind.OBJECT:
        with objects.open_checked(piece.path, piece.conn_id, piece.source_size, piece.etag) as raw:
            parquet_file = pq.ParquetFile(raw)
            _check_row_groups(parquet_file, piece)
            yield parquet_file
        return
    size = os.path.getsize(piece.path) if os.path.exists(piece.path) else None
    if size != piece.source_size:
        raise objects.SourceChangedError(
            f"source {piece.path} changed after prepare read it (size {piece.source_size} -> "
            f"{size} bytes); nothing of this COPY stream was committed. Run the load again"
        )
    with pq.ParquetFile(piece.path) as parquet_file:
        _check_row_groups(parquet_file, piece)
        yield parquet_file


def _check_row_groups(parquet_file: Any, piece: Piece) -> None:
    metadata = parquet_file.metadata
    if max(piece.row_groups) < metadata.num_row_groups:
        groups = [row_group(metadata, i) for i in piece.row_groups]
        if (min(g.start for g in groups), max(g.end for g in groups)) == (piece.start, piece.end):
            return
    raise objects.SourceChangedError(
        f"source {piece.path} changed after prepare read it (its row groups "
        f"{groups_text(piece.row_groups)} are not where they were); nothing of this "
        "COPY stream was committed. Run the load again"
    )


def file_columns(file_names: Sequence[str], columns: Sequence[str]) -> list[str]:
    """The file's column for each target column, by the rule prepare matched them with."""
    found = []
    for column in columns:
        if column in file_names:
            found.append(column)
            continue
        same = [n for n in file_names if n.lower() == column.lower()]
        if len(same) != 1:
            raise LoadRefusedError(f"the Parquet file has no column {column!r}: {file_names}")
        found.append(same[0])
    return found


def damage_named(batches: Iterator[Any], piece: Piece, group: int) -> Iterator[Any]:
    """The batches of a row group; one that Arrow finds damaged (a page header or page it
    cannot decode: Arrow raises ArrowInvalid or a plain OSError) names the file and the row
    group: terminal, as bad data is."""
    pa, _pq, _csv = pyarrow_modules()
    try:
        yield from batches
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, OSError) and type(exc) is not OSError:
            raise  # a reader's own error (a lost connection, an expired ETag): not Arrow's
        raise BadDataError(
            f"{piece.path} row group {group}: cannot read it ({exc}); the file is damaged",
            path=piece.path,
        ) from exc


def batches(parquet_file: Any, group: int, names: Sequence[str]) -> Iterator[Any]:
    """A row group's rows in batches of at most :data:`BATCH_ROWS` rows."""
    return parquet_file.iter_batches(
        batch_size=BATCH_ROWS, row_groups=[group], columns=list(names), use_threads=False
    )


def text_arrays(batch: Any, names: Sequence[str]) -> list[Any]:
    """A record batch's columns, in ``names`` order, as the CSV writer writes them exactly."""
    return [_as_text_ready(batch.column(name)) for name in names]


def _strings(arrays: Sequence[Any]) -> list[Any]:
    """The string columns (the only ones whose text can hold a line break)."""
    pa, _pq, _csv = pyarrow_modules()
    return [a for a in arrays if pa.types.is_string(a.type) or pa.types.is_large_string(a.type)]


def newline_counts(arrays: Sequence[Any]) -> list[int]:
    """Per row, the line breaks inside its strings (COPY counts them as lines)."""
    import pyarrow.compute as pc

    counts = [0] * (len(arrays[0]) if arrays else 0)
    for array in _strings(arrays):
        found = pc.fill_null(pc.count_substring(array, "\n"), 0).to_pylist()
        counts = [a + b for a, b in zip(counts, found, strict=True)]
    return counts


def newlines(arrays: Sequence[Any]) -> int:
    """The line breaks inside the strings of a batch."""
    import pyarrow.compute as pc

    return sum(int(pc.sum(pc.count_substring(a, "\n")).as_py() or 0) for a in _strings(arrays))


def encode(
    arrays: Sequence[Any], names: Sequence[str], path: str = "", group: int = 0, row: int = 0
) -> bytes:
    """Columns (:func:`text_arrays`) as COPY CSV rows (no header).

    :param path: the file, ``group`` and ``row`` where the batch starts: for the message of a
        value the writer cannot encode."""
    pa, _pq, csv = pyarrow_modules()
    out = io.BytesIO()
    options = csv.WriteOptions(include_header=False, quoting_style="needed")
    try:
        csv.write_csv(pa.RecordBatch.from_arrays(arrays, names=list(names)), out, options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _encode_error(exc, arrays, names, path, group, row) from None
    return out.getvalue()


def _as_text_ready(array: Any) -> Any:
    """A column as the CSV writer writes it exactly: dictionaries decoded, string views as
    strings, binary as bytea hex text, zoned timestamps in UTC."""
    pa, _pq, _csv = pyarrow_modules()
    t = pa.types
    if t.is_dictionary(array.type):
        array = array.dictionary_decode()
    if _is_binary(array.type):
        return pa.array(
            [None if v is None else "\\x" + v.hex() for v in array.to_pylist()], pa.string()
        )
    if t.is_string_view(array.type):
        return array.cast(pa.string())
    if t.is_timestamp(array.type) and array.type.tz is not None:
        return array.cast(pa.timestamp(array.type.unit, tz="UTC"))
    return array


def _encode_error(
    exc: Exception, arrays: Sequence[Any], names: Sequence[str], path: str, group: int, row: int
) -> BadDataError:
    """Which column the CSV writer failed on (each is tried alone) and why."""
    pa, _pq, csv = pyarrow_modules()
    column = None
    for name, array in zip(names, arrays, strict=True):
        try:
            csv.write_csv(pa.table({name: array}), io.BytesIO())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            column = name
            break
    where = f", column {column}" if column else ""
    return BadDataError(
        f"{path} row group {group}, rows from {row}{where}: cannot encode for COPY ({exc})",
        path=path,
        column=column,
    )
