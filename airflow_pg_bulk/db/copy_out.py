"""``COPY ... TO STDOUT`` on a PostgreSQL source connection (psycopg 3), as chunks of bytes:
what :mod:`airflow_pg_bulk.loading.db_source` hands to the target's ``COPY ... FROM STDIN``
(:func:`airflow_pg_bulk.db.driver.copy_in`), so no value is parsed in Python."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from airflow_pg_bulk.db.driver import native

#: bytes gathered from the source's rows (libpq hands them over one row at a time) before
#: they are passed on: one write per chunk, not per row
CHUNK_BYTES = 1 << 18


class CopyOut:
    """The bytes of ``statement`` (a ``COPY ... TO STDOUT``) on ``conn``, in chunks of about
    :data:`CHUNK_BYTES`; :attr:`rows` once iterated to the end is the row count the source
    server reported (``COPY n``), :attr:`bytes` the bytes passed on."""

    def __init__(self, conn: Any, statement: Any, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._conn = conn
        self._statement = statement
        self._chunk_bytes = chunk_bytes
        self.rows: int | None = None
        self.bytes = 0

    def __iter__(self) -> Iterator[bytes]:
        buffer = bytearray()
        with self._conn.cursor() as cur:
            with cur.copy(native(self._conn, self._statement)) as copy:
                for block in copy:
                    buffer += block
                    if len(buffer) >= self._chunk_bytes:
                        self.bytes += len(buffer)
                        yield bytes(buffer)
                        buffer.clear()
            if buffer:
                self.bytes += len(buffer)
                yield bytes(buffer)
            self.rows = int(cur.rowcount)
