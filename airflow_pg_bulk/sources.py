"""Local-file sources: find the files, read their headers, cut them into partitions, and stream
a partition's bytes to COPY in bounded memory.

Files are addressed by path, so every worker that mounts the same path can load any partition
(Celery or Kubernetes workers need a shared or network file system for local-file sources).
"""

from __future__ import annotations

import glob
import gzip
import io
import itertools
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from airflow_pg_bulk import splitting
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import CopyOptions, Partition, Piece

READ_CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class SourceFile:
    """One file of the source: its path, size on disk and compression."""

    path: str
    size: int
    compression: str | None


def syntax_of(opts: CopyOptions) -> splitting.RecordSyntax:
    """How records end in files read with these COPY options."""
    if opts.format == "csv":
        return splitting.RecordSyntax("csv", opts.quote.encode(), opts.effective_escape.encode())
    return splitting.RecordSyntax("text")


def resolve(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[SourceFile]:
    """Expand paths and globs (``**`` allowed) into existing files, in a stable order."""
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not items:
        raise LoadRefusedError("no source given")
    found: list[str] = []
    for item in items:
        text = os.fspath(item)
        if text.startswith(("s3://", "gs://", "gcs://", "az://", "abfs://", "http://", "https://")):
            raise LoadRefusedError(
                f"source {text!r}: only local or mounted files are supported in this version"
            )
        if _GLOB_CHARS & set(text):
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
    unique = list(dict.fromkeys(os.path.abspath(p) for p in found))
    return [SourceFile(p, os.path.getsize(p), _compression(p)) for p in unique]


def _compression(path: str) -> str | None:
    with open(path, "rb") as f:
        return "gzip" if f.read(2) == GZIP_MAGIC else None


def _open(file: SourceFile):
    return gzip.open(file.path, "rb") if file.compression == "gzip" else open(file.path, "rb")


def read_header(file: SourceFile, opts: CopyOptions) -> tuple[list[str], int]:
    """The header's column names and its length in bytes (of the decompressed stream)."""
    with _open(file) as stream:
        try:
            record = splitting.first_record(stream, syntax_of(opts))
        except (OSError, EOFError, zlib.error) as exc:
            raise BadDataError(
                f"{file.path}: cannot read the header: {exc}", path=file.path
            ) from exc
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


_PYTHON_CODECS = {
    "UTF8": "utf-8",
    "SQLASCII": "latin-1",
    "LATIN1": "latin-1",
    "KOI8R": "koi8_r",
    "KOI8U": "koi8_u",
}


def python_encoding(pg_encoding: str) -> str:
    """Python's codec for a PostgreSQL encoding name (for reading header names only)."""
    key = pg_encoding.upper().replace("-", "").replace("_", "")
    if key in _PYTHON_CODECS:
        return _PYTHON_CODECS[key]
    if key.startswith("WIN"):
        return "cp" + key[3:]
    if key.startswith("LATIN"):
        return "latin" + key[5:]
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
    by_lower: dict[str, list[str]] = {}
    for col in table_columns:
        by_lower.setdefault(col.lower(), []).append(col)
    mapped, unknown = [], []
    for name in first:
        if name in table_columns:
            mapped.append(name)
        elif len(by_lower.get(name.lower(), [])) == 1:
            mapped.append(by_lower[name.lower()][0])
        else:
            unknown.append(name)
    if unknown:
        raise LoadRefusedError(
            f"header columns {unknown} match no column of the target "
            f"(columns: {list(table_columns)})"
        )
    duplicates = sorted({c for c in mapped if mapped.count(c) > 1})
    if duplicates:
        raise LoadRefusedError(f"header names columns {duplicates} more than once")
    return mapped, lengths


def plan_partitions(
    files: Sequence[SourceFile],
    opts: CopyOptions,
    partitions: int,
    header_lengths: dict[str, int] | None = None,
) -> list[Partition]:
    """Cut the files into about ``partitions`` partitions of similar size.

    A large uncompressed file is split at record starts (quote-aware); compressed files stay
    whole. Pieces are then packed into partitions, largest first, each into the lightest one.
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
        if file.compression:
            newline = _gzip_newline(file, syntax) if skip else None
            pieces.append(
                Piece(file.path, 0, None, 2 if skip else 1, file.compression, bool(skip), newline)
            )
            continue
        if file.size - skip <= 0:
            continue
        pieces.extend(_split_file(file, skip, target, syntax, opts))
    return _pack(pieces, partitions)


def _split_file(
    file: SourceFile, start: int, target: int, syntax: splitting.RecordSyntax, opts: CopyOptions
) -> list[Piece]:
    size = file.size - start
    count = max(1, round(size / target))
    if count > 1 and not splitting.can_split(opts.encoding):
        count = 1
    offsets = [start]
    if count > 1:
        wanted = [start + size * k // count for k in range(1, count)]
        offsets += splitting.record_starts(file.path, wanted, syntax)
    offsets.append(file.size)
    bounds = sorted(set(offsets))
    newline = splitting.detect_newline(file.path, syntax)
    pieces = []
    line = 1 + splitting.count_newlines(file.path, 0, start, newline=newline)
    for begin, end in itertools.pairwise(bounds):
        if end > begin:
            # a piece that does not start the file must end its lines as the file's first
            # line does (checked by the COPY task: see records.RecordCounter)
            ending = newline.decode() if begin > 0 else None
            pieces.append(Piece(file.path, begin, end, line, newline=ending))
            if end < file.size:  # the lines of the last piece are needed by no other piece
                line += splitting.count_newlines(file.path, begin, end, newline=newline)
    return pieces


def _gzip_newline(file: SourceFile, syntax: splitting.RecordSyntax) -> str | None:
    """The line ending of a compressed file's header line, or None if it has none."""
    with _open(file) as stream:
        record = splitting.first_record(stream, syntax)
    found = splitting.first_terminator(record, syntax)
    return None if found is None else record[found[0] : found[1]].decode()


def _pack(pieces: list[Piece], partitions: int) -> list[Partition]:
    def weight(piece: Piece) -> int:
        return piece.size if piece.size is not None else os.path.getsize(piece.path)

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
    if piece.compression == "gzip":
        yield from _gzip_chunks(piece, syntax_of(opts), chunk_size)
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


def _gzip_chunks(piece: Piece, syntax: splitting.RecordSyntax, chunk_size: int) -> Iterator[bytes]:
    with gzip.open(piece.path, "rb") as f:
        pending = b""
        skipping = piece.skip_header
        while True:
            try:
                chunk = f.read(chunk_size)
            except (OSError, EOFError, zlib.error) as exc:
                raise BadDataError(
                    f"{piece.path}: the gzip stream is damaged or truncated ({exc}); "
                    "nothing of this load reached the target",
                    path=piece.path,
                ) from exc
            if not chunk:
                return
            if skipping:
                pending += chunk
                header = splitting.first_record(io.BytesIO(pending), syntax)
                if not header.endswith((b"\n", b"\r")) or header == pending:
                    continue  # the header (or its CRLF) goes on in the next chunk
                chunk, pending, skipping = pending[len(header) :], b"", False
                if not chunk:
                    continue
            yield chunk


def _locate_transcoded(
    piece: Piece, record_number: int, opts: CopyOptions, syntax: splitting.RecordSyntax
) -> tuple[int, int]:
    """:func:`locate` for encodings whose multi-byte characters may hold ``\\`` or quote
    bytes (SJIS, BIG5, GBK, ...): scan the piece re-encoded as UTF-8, where they cannot."""
    raw = b"".join(piece_chunks(piece, opts))
    text = raw.decode(python_encoding(opts.encoding), errors="replace")
    with tempfile.NamedTemporaryFile(suffix=".utf8") as tmp:
        tmp.write(text.encode("utf-8"))
        tmp.flush()
        first, last = splitting.record_line_numbers(
            tmp.name, 0, os.path.getsize(tmp.name), record_number, syntax
        )
    offset = piece.first_line - 1
    return first + offset, last + offset


def locate(piece: Piece, record_number: int, opts: CopyOptions) -> tuple[int, int]:
    """Physical (first, last) line numbers, in the file, of the piece's ``record_number``-th
    record (as COPY counts records: a quoted newline does not start a new one)."""
    syntax = syntax_of(opts)
    if not splitting.can_split(opts.encoding):
        return _locate_transcoded(piece, record_number, opts, syntax)
    if piece.compression != "gzip":
        return splitting.record_line_numbers(
            piece.path, piece.start, piece.end or os.path.getsize(piece.path), record_number, syntax
        )
    with tempfile.NamedTemporaryFile(suffix=".csv") as tmp:
        with gzip.open(piece.path, "rb") as src:
            shutil.copyfileobj(src, tmp)
        tmp.flush()
        size = os.path.getsize(tmp.name)
        start = 0
        if piece.skip_header:
            with open(tmp.name, "rb") as f:
                start = len(splitting.first_record(f, syntax))
        return splitting.record_line_numbers(tmp.name, start, size, record_number, syntax)
