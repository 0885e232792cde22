"""Listing: paths, globs (``**`` allowed), object URLs and streams become :class:`SourceFile`
records, each with its :class:`SourceKind` decided here, once.

Files are addressed by path, so every worker that mounts the same path can load any partition
(Celery or Kubernetes workers need a shared or network file system for local-file sources).
Objects in storage (``s3://bucket/prefix/*.csv.gz``) are addressed by URL and read by
:mod:`.objects`: a gzip or small object is one whole piece, a big uncompressed one is cut into
byte ranges like a file; a ``file://`` URL is a local path. Streams (``"-"``, named pipes) are
opened here and held by this process (:mod:`.streams`).
"""

from __future__ import annotations

import enum
import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import Piece
from airflow_pg_bulk.source import objects, streams
from airflow_pg_bulk.source.syntax import GLOB_CHARS, GZIP_MAGIC


class SourceKind(enum.Enum):
    """Where a source's bytes come from, and so how they are read."""

    FILE = "file"
    GZIP_FILE = "gzip file"
    STREAM = "stream"
    OBJECT = "object"

    @property
    def read_whole(self) -> bool:
        """Whether its content is read as one (decompressed) whole through
        :func:`.reading.content_chunks` (a stream, or an object), not opened as a local file."""
        return self in (SourceKind.STREAM, SourceKind.OBJECT)


@dataclass(frozen=True)
class SourceFile:
    """One file or object of the source: its path (or URL), size and compression; an object
    also its ETag and the connection it is read with; and its kind, decided when listed."""

    path: str
    size: int
    compression: str | None
    etag: str | None = None
    conn_id: str | None = None
    kind: SourceKind = SourceKind.FILE

    @property
    def is_object(self) -> bool:
        """Whether this is an object in storage (read through :mod:`.objects`)."""
        return self.kind is SourceKind.OBJECT


def list_sources(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    conn_id: str | None = None,
) -> list[SourceFile]:
    """Expand paths, globs (``**`` allowed) and object URLs into existing files and objects,
    in a stable order (as given; each glob's matches by name).

    ``"-"`` is standard input and a path that is not a regular file (a named pipe) is a
    stream: it is opened here (a pipe's open waits for its writer) and held by this process
    for :func:`.reading.piece_chunks` (see :mod:`.streams`). URLs are listed with the Airflow
    connection ``conn_id`` (or the environment): see :mod:`.objects`."""
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not items:
        raise LoadRefusedError("no source given")
    found: list[str] = []
    held: list[str] = []
    listed: list[tuple[str, int, str | None, str | None]] = []
    for item in items:
        text = objects.local_path(os.fspath(item))
        if objects.is_url(text):
            listed.extend(objects.list_objects(text, conn_id))
            continue
        if text == streams.STDIN or streams.is_special(text):
            held.append(streams.STDIN_NAME if text == streams.STDIN else os.path.abspath(text))
        elif GLOB_CHARS & set(text):
            matches = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
            if not matches:
                raise LoadRefusedError(f"source pattern {text!r} matched no files")
            found.extend(matches)
        elif os.path.isdir(text):
            raise LoadRefusedError(
                f"source {text!r} is a directory; give a glob such as {text.rstrip('/')}/*.csv"
            )
        elif not os.path.isfile(text):
            raise LoadRefusedError(f"source file {text!r} does not exist")
        else:
            found.append(text)
    if len(set(held)) < len(held):
        raise LoadRefusedError(f"sources {held}: a stream can be read only once")
    unique = list(dict.fromkeys(os.path.abspath(p) for p in found))
    files = [_local_file(p) for p in unique]
    return files + _objects(listed) + [_stream(name) for name in held]


def _local_file(path: str) -> SourceFile:
    """A local file, gzip told by its first two bytes."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == GZIP_MAGIC
    return SourceFile(
        path,
        os.path.getsize(path),
        "gzip" if gzipped else None,
        kind=SourceKind.GZIP_FILE if gzipped else SourceKind.FILE,
    )


def _objects(listed: list[tuple[str, int, str | None, str | None]]) -> list[SourceFile]:
    """The listed objects (each once), their compression told by their first bytes."""
    unique = list({entry[0]: entry for entry in listed}.values())
    heads = objects.first_bytes([(url, conn) for url, size, _, conn in unique if size])
    return [
        SourceFile(
            url,
            size,
            "gzip" if heads.get(url) == GZIP_MAGIC else None,
            etag,
            conn,
            SourceKind.OBJECT,
        )
        for url, size, etag, conn in unique
    ]


def _stream(name: str) -> SourceFile:
    """A stream opened and held by this process (:func:`.streams.open_stream`)."""
    stream = streams.open_stream(name)
    return SourceFile(name, 0, stream.compression, kind=SourceKind.STREAM)


def piece_kind(piece: Piece) -> SourceKind:
    """The kind of the source a planned piece reads, from what the plan carries (its path and
    compression): the one place a COPY task tells a stream, an object, a gzip file and a file
    apart."""
    if piece.path == streams.STDIN_NAME or piece.path in streams.STREAMS:
        return SourceKind.STREAM
    if streams.is_special(piece.path):
        return SourceKind.STREAM
    if objects.is_url(piece.path):
        return SourceKind.OBJECT
    return SourceKind.GZIP_FILE if piece.compression == "gzip" else SourceKind.FILE
