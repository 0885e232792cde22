"""``COPY ... TO STDOUT`` on a PostgreSQL source connection, as chunks of bytes: what
:mod:`airflow_pg_bulk.loading.database` hands to the target's ``COPY ... FROM STDIN``
(:func:`airflow_pg_bulk.db.driver.copy_in`), so no value is parsed in Python.

libpq hands COPY data over one row per call. psycopg 3 has no C loop for that (each row
passes through its Python generators: 2.3 to 2.8 s of CPU for 5.5 million rows, 180 MB), while
psycopg2's ``copy_expert`` keeps the per-row loop in C (0.8 s for the same rows, measured in
benchmarks/RESULTS-db-source.md). So the source connection is psycopg2's
(:data:`SOURCE_DRIVER`), and ``copy_expert`` writes into an OS pipe from a thread of its own
(it releases the GIL while it waits on the server); the COPY step reads the pipe in large
chunks, whatever driver the target connection has.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from typing import Any

from airflow_pg_bulk.db import driver

#: the driver of the source connection a COPY stream reads (see the module's docstring)
SOURCE_DRIVER = "psycopg2"
#: bytes read from the pipe at a time, and the pipe's size where Linux lets it be raised
CHUNK_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class CopyOut:
    """The bytes of ``statement`` (a ``COPY ... TO STDOUT``) on ``conn``, in chunks of up to
    :data:`CHUNK_BYTES`. A context manager: entered, a thread runs the COPY into a pipe;
    iterated, the chunks are read from the pipe; left, the pipe is closed and, if the COPY
    still runs (the target failed or was killed), it is cancelled and its thread ended.

    :attr:`rows` once iterated to the end is the row count the source server reported
    (``COPY n``), :attr:`bytes` the bytes passed on. A failure of the source (a query error
    on a later row, a lost connection) is raised by the iteration, after the data before it."""

    def __init__(self, conn: Any, statement: Any, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._conn = conn
        self._statement = statement
        self._chunk_bytes = chunk_bytes
        self._thread: threading.Thread | None = None
        self._reader: Any = None
        self._error: BaseException | None = None
        self.rows: int | None = None
        self.bytes = 0

    def __enter__(self) -> CopyOut:
        read_fd, write_fd = os.pipe()
        # above /proc/sys/fs/pipe-max-size the default size serves too
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, self._chunk_bytes)
        self._reader = open(read_fd, "rb", buffering=0)  # closed by __exit__
        self._thread = threading.Thread(
            target=self._produce, args=(write_fd,), name="pg-bulk-copy-out", daemon=True
        )
        self._thread.start()
        return self

    def _produce(self, write_fd: int) -> None:
        try:
            with open(write_fd, "wb", buffering=self._chunk_bytes) as out:
                self.rows = driver.copy_to(self._conn, self._statement, out)
        except BaseException as exc:  # raised by the iteration, in the COPY step's thread
            self._error = exc

    def __iter__(self) -> Iterator[bytes]:
        assert self._reader is not None and self._thread is not None, "use CopyOut in a with"
        read = self._reader.read
        while True:
            chunk = read(self._chunk_bytes)
            if not chunk:
                break
            self.bytes += len(chunk)
            yield chunk
        self._thread.join()
        if self._error is not None:
            raise self._error

    def __exit__(self, *exc_info: object) -> None:
        if self._reader is not None:
            self._reader.close()  # a COPY still writing gets EPIPE and ends
        if self._thread is not None:
            if self._thread.is_alive():
                driver.cancel(self._conn)
            self._thread.join()
