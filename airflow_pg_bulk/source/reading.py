"""Reading: a planned piece's bytes for COPY, in bounded memory: a range of a file, a gzip file
decompressed, an object (:mod:`.objects`) or a held stream (:mod:`.streams`), with the header
or a UTF-8 byte-order mark dropped where the piece starts the file.

What a piece is read from is told once per piece by :func:`.listing.piece_kind`.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
import zlib
from collections.abc import Iterator
from typing import IO

from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.plan import CopyOptions, Piece
from airflow_pg_bulk.source import charsets, objects, streams
from airflow_pg_bulk.source.boundaries import first_record
from airflow_pg_bulk.source.listing import SourceKind, piece_kind
from airflow_pg_bulk.source.syntax import UTF8_BOM, RecordSyntax

#: bytes per chunk handed to COPY (read at call time, so it can be tuned)
READ_CHUNK = 1 << 20


@contextlib.contextmanager
def open_source(path: str, conn_id: str | None = None) -> Iterator[tuple[IO[bytes], int]]:
    """An uncompressed file or object opened for reads at any offset (an object by range
    requests of what is read), and its size."""
    if objects.is_url(path):  # a path (not a piece) as realign and cutting hold it
        with objects.open_seekable(path, conn_id) as f:
            yield f, int(f.size)
    else:
        with open(path, "rb") as f:
            yield f, os.fstat(f.fileno()).st_size


def drops_bom(opts: CopyOptions) -> bool:
    """Whether a UTF-8 byte-order mark at the start of a file is dropped (not data): when the
    file is read as UTF-8. With a header the mark is part of the header line, dropped with it;
    without one, the file's first piece starts after it (see docs/design.md, "byte-order mark").
    """
    return charsets.pg_name(opts.encoding) == "UTF8"


def content_start(spooled: IO[bytes], piece: Piece, opts: CopyOptions) -> int:
    """Where the data of a whole-file piece's (decompressed) content, spooled to ``spooled``,
    begins: after its header, or after a UTF-8 byte-order mark when it has no header."""
    spooled.seek(0)
    if piece.skip_header:
        return len(first_record(spooled, RecordSyntax.of(opts)))
    return len(UTF8_BOM) if drops_bom(opts) and spooled.read(3) == UTF8_BOM else 0


def _without_bom(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The chunks with a UTF-8 byte-order mark at the very start dropped."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        if len(pending) < len(UTF8_BOM) and UTF8_BOM.startswith(pending):
            continue  # too short to tell yet
        yield pending[len(UTF8_BOM) :] if pending.startswith(UTF8_BOM) else pending
        break
    else:
        if pending:
            yield pending
        return
    yield from chunks


def piece_ends_file(piece: Piece) -> bool:
    """Whether the piece's bytes run to the end of its file or object."""
    if piece.compression or piece.end is None:
        return True
    if piece_kind(piece) is SourceKind.OBJECT:
        size = piece.source_size
    else:
        size = os.path.getsize(piece.path)
    return size is None or piece.end >= size


def piece_chunks(piece: Piece, opts: CopyOptions, chunk_size: int | None = None) -> Iterator[bytes]:
    """The piece's bytes, in chunks of at most ``chunk_size`` (decompressed, header dropped)."""
    chunk_size = chunk_size or READ_CHUNK  # read at call time, so it can be tuned
    kind = piece_kind(piece)
    if kind.read_whole:
        chunks = content_chunks(piece, chunk_size)
        yield from _content(chunks, piece, opts)
        return
    if kind is SourceKind.GZIP_FILE:
        yield from _gzip_chunks(piece, opts, chunk_size)
        return
    with open(piece.path, "rb") as f:
        f.seek(piece.start)
        remaining = None if piece.end is None else piece.end - piece.start
        while remaining is None or remaining > 0:
            chunk = f.read(chunk_size if remaining is None else min(chunk_size, remaining))
            if not chunk:
                break
            if remaining is not None:
                remaining -= len(chunk)
            yield chunk


def write_content(piece: Piece, out: IO[bytes]) -> None:
    """Write a gzip file's, a stream's or an object's whole (decompressed) content, header
    included, or an object range's bytes, to ``out`` (a spool to read again)."""
    if piece_kind(piece).read_whole:
        for chunk in content_chunks(piece):
            out.write(chunk)
    else:
        with gzip.open(piece.path, "rb") as src:
            shutil.copyfileobj(src, out)


def content_chunks(piece: Piece, chunk_size: int | None = None) -> Iterator[bytes]:
    """The whole (decompressed) content of a stream or an object, header included; or the
    bytes of an object's range (a piece with an ``end``)."""
    if piece_kind(piece) is SourceKind.OBJECT:
        return objects.content_chunks(
            piece.path,
            piece.conn_id,
            piece.compression,
            piece.source_size,
            piece.etag,
            chunk_size or READ_CHUNK,
            piece.start,
            piece.end,
        )
    return stream_chunks(piece, chunk_size)


def stream_chunks(piece: Piece, chunk_size: int | None = None) -> Iterator[bytes]:
    """A stream piece's whole (decompressed) content, header included, read once."""
    stream = streams.held_stream(piece.path)
    return damage_named(piece.path, stream.chunks(chunk_size or READ_CHUNK))


def _gzip_chunks(piece: Piece, opts: CopyOptions, chunk_size: int) -> Iterator[bytes]:
    with gzip.open(piece.path, "rb") as f:
        chunks = damage_named(piece.path, iter(lambda: f.read(chunk_size), b""))
        yield from _content(chunks, piece, opts)


def _content(chunks: Iterator[bytes], piece: Piece, opts: CopyOptions) -> Iterator[bytes]:
    """A whole-file piece's data: its header dropped, or else a UTF-8 byte-order mark. A byte
    range of an object is its bytes as they are: its bounds leave out the header and the mark
    (planned like a local file's pieces)."""
    if piece.end is not None:
        return chunks
    if piece.skip_header:
        return _without_header(chunks, RecordSyntax.of(opts))
    return _without_bom(chunks) if drops_bom(opts) else chunks


def damage_named(path: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Chunks of a decompressed stream; a damaged or truncated gzip stream names the file."""
    try:
        yield from chunks
    except (OSError, EOFError, zlib.error) as exc:
        raise BadDataError(
            f"{path}: the gzip stream is damaged or truncated ({exc}); "
            "nothing of this load reached the target",
            path=path,
        ) from exc


def _without_header(chunks: Iterator[bytes], syntax: RecordSyntax) -> Iterator[bytes]:
    """The chunks with the stream's first record (the header) dropped."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        header = first_record(io.BytesIO(pending), syntax)
        if not header.endswith((b"\n", b"\r")) or header == pending:
            continue  # the header (or its CRLF) goes on in the next chunk
        if len(pending) > len(header):
            yield pending[len(header) :]
        break
    yield from chunks
