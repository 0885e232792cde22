"""Sources: find the files, read their headers, cut them into partitions, and stream a
partition's bytes to COPY in bounded memory.

Files are addressed by path, so every worker that mounts the same path can load any partition
(Celery or Kubernetes workers need a shared or network file system for local-file sources).
Objects in storage (``s3://bucket/prefix/*.csv.gz``) are addressed by URL and read by
:mod:`~airflow_pg_bulk.objects`: a gzip or small object is one whole piece, a big uncompressed
one is cut into byte ranges like a file; a ``file://`` URL is a local path.

Streams: ``"-"`` (standard input, named ``<stdin>`` in messages and in the reject table) and
anything that exists but is not a regular file (a named pipe such as bash's ``<(zcat x.gz)``,
``/dev/stdin``) can be read only once, front to back. Such a source is opened by
:func:`resolve`, held by this process, and is one partition of one piece, read as a stream:

- gzip is detected from its first two bytes and decompressed on the way; a header is the first
  record of the (decompressed) stream, read ahead by :func:`read_header` and dropped from what
  COPY gets; row accounting counts the stream as it counts a file;
- nothing is written to disk with ``on_error="fail"``: a bad row is named by the server's line
  number within the stream (``record N of the part starting at line L``; COPY counts line breaks
  inside quoted fields too), because mapping it to the file's line would need the bytes again;
  with ``on_error="reject"`` the stream is spooled, decompressed, to a temporary file
  (``TMPDIR``) while it is loaded, since setting rows aside re-reads byte ranges
  (:mod:`~airflow_pg_bulk.rejects`); the spool is deleted when the piece is done;
- only the process that opened the stream can load it, so the in-process runner
  (:func:`airflow_pg_bulk.load`, ``airflow-pg-bulk load``) reads streams, and an Airflow task
  refuses them: prepare and each COPY task run in processes of their own, and a task's
  standard input is its channel to the Airflow supervisor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import gzip
import io
import itertools
import os
import shutil
import stat
import sys
import tempfile
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from airflow_pg_bulk import charsets, objects, ranges, splitting
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import CopyOptions, Partition, Piece

READ_CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
_GLOB_CHARS = frozenset("*?[")
STDIN = "-"
STDIN_NAME = "<stdin>"
_DELIMITERS = (",", ";", "\t", "|")
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SourceFile:
    """One file or object of the source: its path (or URL), size and compression; an object
    also its ETag and the connection it is read with."""

    path: str
    size: int
    compression: str | None
    etag: str | None = None
    conn_id: str | None = None

    @property
    def is_object(self) -> bool:
        """Whether this is an object in storage (read through :mod:`objects`)."""
        return objects.is_url(self.path)


def syntax_of(opts: CopyOptions) -> splitting.RecordSyntax:
    """How records end in files read with these COPY options."""
    if opts.format == "csv":
        return splitting.RecordSyntax("csv", opts.quote.encode(), opts.effective_escape.encode())
    return splitting.RecordSyntax("text")


def resolve(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    conn_id: str | None = None,
) -> list[SourceFile]:
    """Expand paths, globs (``**`` allowed) and object URLs into existing files and objects,
    in a stable order (as given; each glob's matches by name).

    ``"-"`` is standard input and a path that is not a regular file (a named pipe) is a
    stream: it is opened here (a pipe's open waits for its writer) and held by this process
    for :func:`piece_chunks` (see the module's docstring). URLs are listed with the Airflow
    connection ``conn_id`` (or the environment): see :mod:`~airflow_pg_bulk.objects`."""
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not items:
        raise LoadRefusedError("no source given")
    found: list[str] = []
    streams: list[str] = []
    listed: list[tuple[str, int, str | None, str | None]] = []
    for item in items:
        text = objects.local_path(os.fspath(item))
        if objects.is_url(text):
            listed.extend(objects.list_objects(text, conn_id))
            continue
        if text == STDIN or _is_special(text):
            streams.append(STDIN_NAME if text == STDIN else os.path.abspath(text))
        elif _GLOB_CHARS & set(text):
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
    if len(set(streams)) < len(streams):
        raise LoadRefusedError(f"sources {streams}: a stream can be read only once")
    unique = list(dict.fromkeys(os.path.abspath(p) for p in found))
    files = [SourceFile(p, os.path.getsize(p), _compression(p)) for p in unique]
    return files + _objects(listed) + [_open_stream(name) for name in streams]


def _objects(listed: list[tuple[str, int, str | None, str | None]]) -> list[SourceFile]:
    """The listed objects (each once), their compression told by their first bytes."""
    unique = list({entry[0]: entry for entry in listed}.values())
    heads = objects.first_bytes([(url, conn) for url, size, _, conn in unique if size])
    return [
        SourceFile(url, size, "gzip" if heads.get(url) == GZIP_MAGIC else None, etag, conn)
        for url, size, etag, conn in unique
    ]


def _is_special(path: str) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a directory (a pipe)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def is_stream(path: str) -> bool:
    """Whether a piece's path names a stream (standard input or a named pipe): read once."""
    return path == STDIN_NAME or path in _STREAMS or _is_special(path)


class _Prefixed(io.RawIOBase):
    """A raw stream with bytes already read from it put back in front."""

    def __init__(self, prefix: bytes, raw: IO[bytes]) -> None:
        self._prefix = prefix
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _Recording:
    """A non-seekable reader that keeps every byte read through it (a header read ahead)."""

    def __init__(self, reader: IO[bytes]) -> None:
        self._reader = reader
        self.kept: list[bytes] = []

    def seekable(self) -> bool:
        return False

    def read(self, size: int = -1) -> bytes:
        data = self._reader.read(size)
        self.kept.append(data)
        return data


class _Stream:
    """A source read once, front to back: standard input or a named pipe.

    :param name: ``<stdin>`` or the pipe's path (in messages and reject rows).
    :param raw: the open binary stream; closed when read to its end if ``owned``."""

    def __init__(self, name: str, raw: IO[bytes], owned: bool) -> None:
        self.name = name
        self._raw = raw
        self._owned = owned
        self._lock = threading.Lock()
        self._taken = False
        magic = b""
        while len(magic) < 2:
            more = raw.read(2 - len(magic))
            if not more:
                break
            magic += more
        self.compression = "gzip" if magic == GZIP_MAGIC else None
        buffered = io.BufferedReader(_Prefixed(magic, raw), READ_CHUNK)
        self._reader: IO[bytes] = (
            gzip.GzipFile(fileobj=buffered, mode="rb") if self.compression else buffered
        )
        self._ahead = b""  # decompressed bytes read ahead (the header)
        self._header: bytes | None = None

    def header(self, syntax: splitting.RecordSyntax) -> bytes:
        """The first record (read ahead once; COPY still gets it unless the piece skips it)."""
        with self._lock:
            if self._header is None:
                recording = _Recording(self._reader)
                try:
                    self._header = splitting.first_record(recording, syntax)
                finally:
                    self._ahead += b"".join(recording.kept)
            return self._header

    def chunks(self, chunk_size: int) -> Iterator[bytes]:
        """The whole (decompressed) stream, header included; only once."""
        with self._lock:
            if self._taken:
                raise LoadRefusedError(
                    f"source {self.name} is a stream and was read already: it cannot be read "
                    "twice (a retried partition needs the data again; load it from a file)"
                )
            self._taken = True
        try:
            if self._ahead:
                yield self._ahead
                self._ahead = b""
            while chunk := self._reader.read(chunk_size):
                yield chunk
        finally:
            if self._owned:
                self._raw.close()


_STREAMS: dict[str, _Stream] = {}


def _open_stream(name: str) -> SourceFile:
    """Open a stream source and hold it in this process for :func:`piece_chunks`."""
    _refuse_under_airflow(name)
    if name == STDIN_NAME:
        stdin = sys.stdin
        if stdin is None or stdin.isatty():
            raise LoadRefusedError(
                "source '-' reads standard input, which is a terminal (or closed) here: pipe "
                "the data in, e.g. zcat data.csv.gz | airflow-pg-bulk load ... --source -"
            )
        stream = _Stream(name, stdin.buffer, owned=False)
    else:
        try:
            stream = _Stream(name, open(name, "rb", buffering=0), owned=True)  # noqa: SIM115
        except OSError as exc:
            raise LoadRefusedError(f"source {name!r} cannot be read: {exc}") from exc
    _STREAMS[name] = stream
    return SourceFile(name, 0, stream.compression)


def _refuse_under_airflow(name: str) -> None:
    """Streams belong to the in-process runner: in an Airflow task process (where standard
    input is the task's channel to its supervisor) they are refused before anything is read."""
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    if runner is not None and getattr(runner, "SUPERVISOR_COMMS", None) is not None:
        what = "standard input ('-')" if name == STDIN_NAME else f"the named pipe {name!r}"
        raise LoadRefusedError(
            f"source {what} can be read only by the in-process runner (airflow_pg_bulk.load or "
            "airflow-pg-bulk load): under Airflow, prepare and each COPY task run in processes "
            "of their own, a stream can be read once, and a task's standard input is its "
            "channel to the Airflow supervisor. Write the data to a file every worker can read"
        )


def _held_stream(path: str) -> _Stream:
    stream = _STREAMS.get(path)
    if stream is None:
        raise LoadRefusedError(
            f"source {path} is a stream opened by another process (the one that ran prepare): "
            "only the in-process runner (airflow_pg_bulk.load, airflow-pg-bulk load) can load "
            "a stream"
        )
    return stream


def _compression(path: str) -> str | None:
    with open(path, "rb") as f:
        return "gzip" if f.read(2) == GZIP_MAGIC else None


def _open(file: SourceFile):
    return gzip.open(file.path, "rb") if file.compression == "gzip" else open(file.path, "rb")


def read_header(file: SourceFile, opts: CopyOptions) -> tuple[list[str], int]:
    """The header's column names and its length in bytes (of the decompressed stream)."""
    try:
        record = _header_record(file, syntax_of(opts))
    except (OSError, EOFError, zlib.error) as exc:
        raise BadDataError(f"{file.path}: cannot read the header: {exc}", path=file.path) from exc
    if not record:
        return [], 0
    try:
        names = splitting.parse_header(
            record,
            syntax_of(opts),
            delimiter=opts.effective_delimiter.encode(),
            encoding=python_encoding(opts.encoding),
        )
    except ValueError as exc:  # UnicodeDecodeError is one
        raise BadDataError(
            f"{file.path} line 1: cannot read the header: {exc}", path=file.path, line=1
        ) from None
    return names, len(record)


def _header_record(file: SourceFile, syntax: splitting.RecordSyntax) -> bytes:
    """The raw first record of the file's (decompressed) content; a stream keeps it."""
    if is_stream(file.path):
        return _held_stream(file.path).header(syntax)
    if file.is_object:
        with objects.open_header(file.path, file.conn_id, file.compression) as stream:
            return splitting.first_record(stream, syntax)
    with _open(file) as stream:
        return splitting.first_record(stream, syntax)


def python_encoding(pg_encoding: str) -> str:
    """Python's codec for a PostgreSQL encoding name (:func:`charsets.python_codec`); a name
    without one is returned as is."""
    try:
        return charsets.python_codec(pg_encoding)
    except ValueError:
        return pg_encoding


def map_header(
    files: Sequence[SourceFile], opts: CopyOptions, table_columns: Sequence[str]
) -> tuple[list[str], dict[str, int]]:
    """Match every file's header to the table's columns by name.

    Returns the column list for COPY and each file's header length. Names match exactly first,
    then case-insensitively; all files must have the same header."""
    lengths: dict[str, int] = {}
    first: list[str] | None = None
    for file in files:
        names, length = read_header(file, opts)
        lengths[file.path] = length
        if not names and length == 0:
            continue  # empty file: nothing to load, nothing to match
        if first is None:
            first = names
        elif names != first:
            raise LoadRefusedError(
                f"{file.path}: header {names} differs from {files[0].path}'s header {first}"
            )
    if first is None:
        return [], lengths
    return match_columns(first, table_columns, opts), lengths


def match_columns(
    names: Sequence[str],
    table_columns: Sequence[str],
    opts: CopyOptions | None = None,
    what: str = "header",
) -> list[str]:
    """The table's column for each of ``names`` (a header's, a Parquet file's), in their
    order: the same name, else the one column whose name differs only in case.

    :param opts: a csv or text header's COPY options (a name holding another delimiter hints
        at it); None for a source that names its columns itself.
    :param what: what named them, for the message (``header``, ``Parquet``).
    :raises LoadRefusedError: a name matches no column, or two names the same column."""
    by_lower: dict[str, list[str]] = {}
    for col in table_columns:
        by_lower.setdefault(col.lower(), []).append(col)
    mapped, unknown = [], []
    for name in names:
        if name in table_columns:
            mapped.append(name)
        elif len(by_lower.get(name.lower(), [])) == 1:
            mapped.append(by_lower[name.lower()][0])
        else:
            unknown.append(name)
    if unknown:
        hint = _delimiter_hint(unknown, opts) if opts is not None else ""
        raise LoadRefusedError(
            f"{what} columns {unknown} match no column of the target "
            f"(columns: {list(table_columns)}){hint}"
        )
    duplicates = sorted({c for c in mapped if mapped.count(c) > 1})
    if duplicates:
        raise LoadRefusedError(f"{what} names columns {duplicates} more than once")
    return mapped


def _delimiter_hint(unknown: Sequence[str], opts: CopyOptions) -> str:
    """A hint when the unmatched header names hold another common delimiter (``a;b;c`` read
    as one name): the file seems to use that one."""
    used = opts.effective_delimiter
    counts = {d: sum(name.count(d) for name in unknown) for d in _DELIMITERS if d != used}
    best = max(counts, key=lambda d: counts[d])
    if not counts[best]:
        return ""
    return (
        f"; the header was split at the delimiter {used!r}, but the file seems to use "
        f"{best!r}: give delimiter={best!r} (--delimiter)"
    )


def plan_partitions(
    files: Sequence[SourceFile],
    opts: CopyOptions,
    partitions: int,
    header_lengths: dict[str, int] | None = None,
) -> list[Partition]:
    """Cut the files into about ``partitions`` partitions of similar size.

    A large uncompressed file or object is split at record starts found from a bounded window
    at each split point (:func:`_split_file`); compressed files and streams stay whole.
    Pieces are then packed into partitions, largest first, each into the lightest one.
    """
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    header_lengths = header_lengths or {}
    syntax = syntax_of(opts)
    total = sum(f.size for f in files)
    target = max(1, -(-total // partitions))
    pieces: list[Piece] = []
    for file in files:
        skip = header_lengths.get(file.path, 0) if opts.header else 0
        if file.is_object and file.size == 0:
            continue
        whole_object = file.is_object and _range_count(file.size - skip, target, opts) < 2
        if file.compression or is_stream(file.path) or whole_object:
            newline = _header_newline(file, syntax) if skip else None
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
        pieces.extend(_split_file(file, skip, target, syntax, opts))
    return _pack(pieces, partitions, {f.path: f.size for f in files})


def _range_count(size: int, target: int, opts: CopyOptions) -> int:
    """How many ranges a file of ``size`` bytes (after its header) is cut into."""
    count = max(1, round(size / target))
    return count if count < 2 or splitting.can_split(opts.encoding) else 1


@contextlib.contextmanager
def open_source(path: str, conn_id: str | None = None) -> Iterator[tuple[IO[bytes], int]]:
    """An uncompressed file or object opened for reads at any offset (an object by range
    requests of what is read), and its size."""
    if objects.is_url(path):
        with objects.open_seekable(path, conn_id) as f:
            yield f, int(f.size)
    else:
        with open(path, "rb") as f:
            yield f, os.fstat(f.fileno()).st_size


def _split_file(
    file: SourceFile, start: int, target: int, syntax: splitting.RecordSyntax, opts: CopyOptions
) -> list[Piece]:
    """The file's (or uncompressed object's) pieces, cut at record starts found from a bounded
    window at each split point (:mod:`~airflow_pg_bulk.ranges`): no scan of the whole file. A
    piece whose start or end was guessed is speculative, and its first line is counted only if
    an error needs it."""
    count = _range_count(file.size - start, target, opts)
    found: list[ranges.Boundary] = []
    with open_source(file.path, file.conn_id) as (f, _size):
        if count > 1:
            found, _read = ranges.split_points(
                f, start, file.size, count, syntax, opts.effective_delimiter.encode()
            )
        f.seek(0)
        newline = splitting.detect_newline(f, syntax)
        f.seek(0)
        line = 1 + f.read(start).count(newline[-1:])  # the header's lines
    bounds = [ranges.Boundary(start, True), *found, ranges.Boundary(file.size, True)]
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


def drops_bom(opts: CopyOptions) -> bool:
    """Whether a UTF-8 byte-order mark at the start of a file is dropped (not data): when the
    file is read as UTF-8. With a header the mark is part of the header line, dropped with it;
    without one, the file's first piece starts after it (see docs/design.md, "byte-order mark").
    """
    return charsets.pg_name(opts.encoding) == "UTF8"


def _has_bom(file: SourceFile, opts: CopyOptions) -> bool:
    """A plain file or object read as UTF-8 that starts with a byte-order mark."""
    if not drops_bom(opts) or file.size < len(UTF8_BOM):
        return False
    with open_source(file.path, file.conn_id) as (f, _size):
        return f.read(len(UTF8_BOM)) == UTF8_BOM


def content_start(spooled: IO[bytes], piece: Piece, opts: CopyOptions) -> int:
    """Where the data of a whole-file piece's (decompressed) content, spooled to ``spooled``,
    begins: after its header, or after a UTF-8 byte-order mark when it has no header."""
    spooled.seek(0)
    if piece.skip_header:
        return len(splitting.first_record(spooled, syntax_of(opts)))
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
    size = piece.source_size if objects.is_url(piece.path) else os.path.getsize(piece.path)
    return size is None or piece.end >= size


def first_line(piece: Piece, opts: CopyOptions) -> int:
    """The physical line number of the piece's first byte in its file: as planned, or counted
    now for a piece past a guessed split point (prepare does not read the file to count it)."""
    if piece.first_line:
        return piece.first_line
    with open_source(piece.path, piece.conn_id) as (f, _size):
        f.seek(0)
        needle = splitting.detect_newline(f, syntax_of(opts))[-1:]
        f.seek(0)
        lines, left = 1, piece.start
        while left > 0 and (block := f.read(min(READ_CHUNK, left))):
            lines += block.count(needle)
            left -= len(block)
        return lines


def _header_newline(file: SourceFile, syntax: splitting.RecordSyntax) -> str | None:
    """The line ending of a compressed file's or a stream's header line, or None."""
    record = _header_record(file, syntax)
    found = splitting.first_terminator(record, syntax)
    return None if found is None else record[found[0] : found[1]].decode()


def _pack(pieces: list[Piece], partitions: int, sizes: dict[str, int]) -> list[Partition]:
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


def piece_chunks(piece: Piece, opts: CopyOptions, chunk_size: int | None = None) -> Iterator[bytes]:
    """The piece's bytes, in chunks of at most ``chunk_size`` (decompressed, header dropped)."""
    chunk_size = chunk_size or READ_CHUNK  # read at call time, so it can be tuned
    if is_stream(piece.path) or objects.is_url(piece.path):
        chunks = content_chunks(piece, chunk_size)
        yield from _content(chunks, piece, opts)
        return
    if piece.compression == "gzip":
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


def content_chunks(piece: Piece, chunk_size: int | None = None) -> Iterator[bytes]:
    """The whole (decompressed) content of a stream or an object, header included; or the
    bytes of an object's range (a piece with an ``end``)."""
    if objects.is_url(piece.path):
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
    stream = _held_stream(piece.path)
    return _damage_named(piece.path, stream.chunks(chunk_size or READ_CHUNK))


def _gzip_chunks(piece: Piece, opts: CopyOptions, chunk_size: int) -> Iterator[bytes]:
    with gzip.open(piece.path, "rb") as f:
        chunks = _damage_named(piece.path, iter(lambda: f.read(chunk_size), b""))
        yield from _content(chunks, piece, opts)


def _content(chunks: Iterator[bytes], piece: Piece, opts: CopyOptions) -> Iterator[bytes]:
    """A whole-file piece's data: its header dropped, or else a UTF-8 byte-order mark. A byte
    range of an object is its bytes as they are: its bounds leave out the header and the mark
    (planned like a local file's pieces)."""
    if piece.end is not None:
        return chunks
    if piece.skip_header:
        return _without_header(chunks, syntax_of(opts))
    return _without_bom(chunks) if drops_bom(opts) else chunks


def _damage_named(path: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Chunks of a decompressed stream; a damaged or truncated gzip stream names the file."""
    try:
        yield from chunks
    except (OSError, EOFError, zlib.error) as exc:
        raise BadDataError(
            f"{path}: the gzip stream is damaged or truncated ({exc}); "
            "nothing of this load reached the target",
            path=path,
        ) from exc


def _without_header(chunks: Iterator[bytes], syntax: splitting.RecordSyntax) -> Iterator[bytes]:
    """The chunks with the stream's first record (the header) dropped."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        header = splitting.first_record(io.BytesIO(pending), syntax)
        if not header.endswith((b"\n", b"\r")) or header == pending:
            continue  # the header (or its CRLF) goes on in the next chunk
        if len(pending) > len(header):
            yield pending[len(header) :]
        break
    yield from chunks


def _locate_transcoded(
    piece: Piece,
    record_number: int,
    opts: CopyOptions,
    syntax: splitting.RecordSyntax,
    numbering: splitting.Numbering = "postgres",
) -> tuple[int, int]:
    """:func:`locate` for encodings whose multi-byte characters may hold ``\\`` or quote
    bytes (SJIS, BIG5, GBK, ...): scan the piece re-encoded as UTF-8, where they cannot."""
    raw = b"".join(piece_chunks(piece, opts))
    text = raw.decode(python_encoding(opts.encoding), errors="replace")
    with tempfile.NamedTemporaryFile(suffix=".utf8") as tmp:
        tmp.write(text.encode("utf-8"))
        tmp.flush()
        first, last = splitting.record_line_numbers(
            tmp.name, 0, os.path.getsize(tmp.name), record_number, syntax, numbering=numbering
        )
    offset = first_line(piece, opts) - 1
    return first + offset, last + offset


def locate(
    piece: Piece, record_number: int, opts: CopyOptions, numbering: splitting.Numbering = "postgres"
) -> tuple[int, int]:
    """Physical (first, last) line numbers, in the file, of the piece's ``record_number``-th
    record: ``numbering="postgres"`` for the ``line N`` of a COPY error's context (csv: it
    also counts the newlines inside quotes), ``"records"`` for a plain count of records (a
    quoted newline does not start a new one); see :func:`splitting.record_line_numbers`."""
    syntax = syntax_of(opts)
    if is_stream(piece.path):
        raise ValueError(f"{piece.path} is a stream: it cannot be read again to count lines")
    if not splitting.can_split(opts.encoding):
        return _locate_transcoded(piece, record_number, opts, syntax, numbering)
    if piece.compression != "gzip" and not objects.is_url(piece.path):
        end = piece.end or os.path.getsize(piece.path)
        return splitting.record_line_numbers(
            piece.path, piece.start, end, record_number, syntax, numbering=numbering
        )
    # a gzip file or an object: its content spooled to a temporary file, to count lines in
    with tempfile.NamedTemporaryFile(suffix=".csv") as tmp:
        if objects.is_url(piece.path):
            for chunk in content_chunks(piece):
                tmp.write(chunk)
        else:
            with gzip.open(piece.path, "rb") as src:
                shutil.copyfileobj(src, tmp)
        tmp.flush()
        size = os.path.getsize(tmp.name)
        if objects.is_url(piece.path) and piece.end is not None:  # a range, spooled alone
            start, end = 0, piece.end - piece.start
            first, last = splitting.record_line_numbers(
                tmp.name, start, end, record_number, syntax, numbering=numbering
            )
            offset = first_line(piece, opts) - 1
            return first + offset, last + offset
        with open(tmp.name, "rb") as f:
            start = content_start(f, piece, opts)
        return splitting.record_line_numbers(
            tmp.name, start, size, record_number, syntax, numbering=numbering
        )
