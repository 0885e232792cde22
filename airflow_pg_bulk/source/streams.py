"""Streams: standard input (``"-"``, named ``<stdin>`` in messages and in the reject table) and
anything that exists but is not a regular file (a named pipe such as bash's ``<(zcat x.gz)``,
``/dev/stdin``), read once, front to back, and held by the process that opened them.

Such a source is opened when it is listed (:func:`.listing.list_sources`), held by this process
(:data:`STREAMS`), and is one partition of one piece, read as a stream:

- gzip is detected from its first two bytes and decompressed on the way; a header is the first
  record of the (decompressed) stream, read ahead by :meth:`Stream.header` and dropped from
  what COPY gets; row accounting counts the stream as it counts a file;
- nothing is written to disk with ``on_error="fail"``: a bad row is named by the server's line
  number within the stream (``record N of the part starting at line L``; COPY counts line breaks
  inside quoted fields too), because mapping it to the file's line would need the bytes again;
  with ``on_error="reject"`` the stream is spooled, decompressed, to a temporary file
  (``TMPDIR``) while it is loaded, since setting rows aside re-reads byte ranges
  (:mod:`~airflow_pg_bulk.loading.rejects`); the spool is deleted when the piece is done;
- only the process that opened the stream can load it, so the in-process runner
  (:func:`airflow_pg_bulk.load`, ``airflow-pg-bulk load``) reads streams, and an Airflow task
  refuses them: prepare and each COPY task run in processes of their own, and a task's
  standard input is its channel to the Airflow supervisor.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import threading
from collections.abc import Iterator
from typing import IO

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.source.boundaries import first_record
from airflow_pg_bulk.source.syntax import GZIP_MAGIC, RecordSyntax

STDIN = "-"
STDIN_NAME = "<stdin>"
#: the size of a stream's read buffer
BUFFER_SIZE = 1 << 20


def is_special(path: str) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a directory (a pipe)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


class Prefixed(io.RawIOBase):
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


class Recording:
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


class Stream:
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
        buffered = io.BufferedReader(Prefixed(magic, raw), BUFFER_SIZE)
        self._reader: IO[bytes] = (
            gzip.GzipFile(fileobj=buffered, mode="rb") if self.compression else buffered
        )
        self._ahead = b""  # decompressed bytes read ahead (the header)
        self._header: bytes | None = None

    def header(self, syntax: RecordSyntax) -> bytes:
        """The first record (read ahead once; COPY still gets it unless the piece skips it)."""
        with self._lock:
            if self._header is None:
                recording = Recording(self._reader)
                try:
                    self._header = first_record(recording, syntax)
                finally:
                    self._ahead += b"".join(recording.kept)
            return self._header

    def chunks(self, chunk_size: int) -> Iterator[bytes]:
        """The whole (decompressed) stream, header included; only once."""
        with self._lock:
            if self._taken:
                raise LoadRefusedError(
                    f"source {self.name} is a stream and was read already: it cannot be read "
                    "twice (a retried COPY stream needs the data again; load it from a file)"
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


#: the streams this process opened, by name (a process-level resource: read once)
STREAMS: dict[str, Stream] = {}


def open_stream(name: str) -> Stream:
    """Open a stream source and hold it in this process for :func:`.reading.piece_chunks`."""
    refuse_under_airflow(name)
    if name == STDIN_NAME:
        stdin = sys.stdin
        if stdin is None or stdin.isatty():
            raise LoadRefusedError(
                "source '-' reads standard input, which is a terminal (or closed) here: pipe "
                "the data in, e.g. zcat data.csv.gz | airflow-pg-bulk load ... --source -"
            )
        stream = Stream(name, stdin.buffer, owned=False)
    else:
        try:
            stream = Stream(name, open(name, "rb", buffering=0), owned=True)  # noqa: SIM115
        except OSError as exc:
            raise LoadRefusedError(f"source {name!r} cannot be read: {exc}") from exc
    STREAMS[name] = stream
    return stream


def refuse_under_airflow(name: str) -> None:
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


def held_stream(path: str) -> Stream:
    """The stream this process opened for ``path``.

    :raises LoadRefusedError: another process opened it (the one that ran prepare)."""
    stream = STREAMS.get(path)
    if stream is None:
        raise LoadRefusedError(
            f"source {path} is a stream opened by another process (the one that ran prepare): "
            "only the in-process runner (airflow_pg_bulk.load, airflow-pg-bulk load) can load "
            "a stream"
        )
    return stream
