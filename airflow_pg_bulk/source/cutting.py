"""Cutting: files into pieces, pieces into partitions of similar size.

A large uncompressed file or object is split at record starts found from a bounded window at
each split point (:mod:`.window`); compressed files, streams and small objects stay whole.
Pieces are packed into partitions, largest first, each into the lightest (:func:`pack`, which
Parquet's row-group pieces use too).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from airflow_pg_bulk.plan import CopyOptions, Partition, Piece
from airflow_pg_bulk.source import charsets, window
from airflow_pg_bulk.source.boundaries import detect_newline
from airflow_pg_bulk.source.header import header_newline
from airflow_pg_bulk.source.listing import SourceFile, SourceKind
from airflow_pg_bulk.source.reading import drops_bom, open_source
from airflow_pg_bulk.source.syntax import UTF8_BOM, RecordSyntax


def plan_partitions(
    files: Sequence[SourceFile],
    opts: CopyOptions,
    partitions: int,
    header_lengths: dict[str, int] | None = None,
    *,
    syntax: RecordSyntax | None = None,
) -> list[Partition]:
    """Cut the files into about ``partitions`` partitions of similar size.

    A large uncompressed file or object is split at record starts found from a bounded window
    at each split point (:func:`split_file`); compressed files and streams stay whole.
    Pieces are then packed into partitions, largest first, each into the lightest one.
    ``syntax``: the options' record syntax, when the caller built it
    (:class:`.formats.Delimited`).
    """
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    header_lengths = header_lengths or {}
    syntax = syntax or RecordSyntax.of(opts)
    total = sum(f.size for f in files)
    target = max(1, -(-total // partitions))
    pieces: list[Piece] = []
    for file in files:
        skip = header_lengths.get(file.path, 0) if opts.header else 0
        if file.is_object and file.size == 0:
            continue
        whole_object = file.is_object and _range_count(file.size - skip, target, opts) < 2
        if file.compression or file.kind is SourceKind.STREAM or whole_object:
            newline = header_newline(file, syntax) if skip else None
            pieces.append(
                Piece(
                    file.path,
                    0,
                    None,
                    2 if skip else 1,
                    file.compression,
                    bool(skip),
                    newline,
                    conn_id=file.conn_id if file.is_object else None,
                    source_size=file.size if file.is_object else None,
                    etag=file.etag,
                )
            )
            continue
        if not skip and _has_bom(file, opts):
            skip = len(UTF8_BOM)  # the file's first piece starts after it, on line 1
        if file.size - skip <= 0:
            continue
        pieces.extend(split_file(file, skip, target, syntax, opts))
    return pack(pieces, partitions, {f.path: f.size for f in files})


def _range_count(size: int, target: int, opts: CopyOptions) -> int:
    """How many ranges a file of ``size`` bytes (after its header) is cut into."""
    count = max(1, round(size / target))
    return count if count < 2 or charsets.can_split(opts.encoding) else 1


def split_file(
    file: SourceFile, start: int, target: int, syntax: RecordSyntax, opts: CopyOptions
) -> list[Piece]:
    """The file's (or uncompressed object's) pieces, cut at record starts found from a bounded
    window at each split point (:mod:`.window`): no scan of the whole file. A
    piece whose start or end was guessed is speculative, and its first line is counted only if
    an error needs it."""
    count = _range_count(file.size - start, target, opts)
    found: list[window.Boundary] = []
    with open_source(file.path, file.conn_id) as (f, _size):
        if count > 1:
            found, _read = window.split_points(
                f, start, file.size, count, syntax, opts.effective_delimiter.encode()
            )
        f.seek(0)
        newline = detect_newline(f, syntax)
        f.seek(0)
        line = 1 + f.read(start).count(newline[-1:])  # the header's lines
    bounds = [window.Boundary(start, True), *found, window.Boundary(file.size, True)]
    pieces = []
    for begin, end in itertools.pairwise(bounds):
        # a piece that does not start the file must end its lines as the file's first
        # line does (checked by the COPY task: see records.RecordCounter)
        ending = newline.decode() if begin.offset > 0 else None
        speculative = not (begin.exact and end.exact)
        first = line if begin.offset == start else 0
        piece = Piece(
            file.path, begin.offset, end.offset, first, newline=ending, speculative=speculative
        )
        if file.is_object:
            piece = dataclasses.replace(
                piece, conn_id=file.conn_id, source_size=file.size, etag=file.etag
            )
        pieces.append(piece)
    return pieces


def _has_bom(file: SourceFile, opts: CopyOptions) -> bool:
    """A plain file or object read as UTF-8 that starts with a byte-order mark."""
    if not drops_bom(opts) or file.size < len(UTF8_BOM):
        return False
    with open_source(file.path, file.conn_id) as (f, _size):
        return f.read(len(UTF8_BOM)) == UTF8_BOM


def pack(pieces: list[Piece], partitions: int, sizes: dict[str, int]) -> list[Partition]:
    """Pack pieces into at most ``partitions`` partitions, largest piece first, each into the
    lightest partition so far; a piece without a size weighs its file's size in ``sizes``."""

    def weight(piece: Piece) -> int:
        return piece.size if piece.size is not None else sizes[piece.path]

    bins: list[list[Piece]] = [[] for _ in range(min(partitions, len(pieces)))]
    loads = [0] * len(bins)
    for piece in sorted(pieces, key=weight, reverse=True):
        lightest = loads.index(min(loads))
        bins[lightest].append(piece)
        loads[lightest] += weight(piece)
    result = []
    for members, load in zip(bins, loads, strict=True):
        members.sort(key=lambda p: (p.path, p.start))
        result.append(Partition(len(result), tuple(members), load))
    return result
