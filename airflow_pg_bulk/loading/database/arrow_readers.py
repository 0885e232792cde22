"""The Arrow readers of the rows path: another database's rows read as Arrow record batches
by a reader written in C, so that no value becomes a Python object; :mod:`.arrow_copy`
encodes them as COPY CSV with the Parquet path's encoder.

One is chosen once, by prepare (:func:`choose`), from the source's URL and its tables, named
in the plan (:attr:`DatabaseSource.arrow`) and looked up by the COPY step in
:data:`READERS`; it is chosen only where every value goes through Arrow exactly as the rows
path gives it, else the source keeps the rows path. One reader today:

- **SQLite** (``adbc_sqlite``: ADBC's SQLite driver, ``adbc-driver-sqlite``, the ``sqlite``
  extra), for a ``source_table`` that is a STRICT table whose columns are INT/INTEGER, REAL,
  TEXT or BLOB. ADBC types each column by its first rows; another table may hold any type in
  any column, and ADBC converts some of those values silently and inexactly (a REAL in a
  column it typed as text becomes ``1.250000e+00``, an integer in a column it typed as REAL
  a double), so a query, a view or a table that is not STRICT keeps the rows path. A STRICT
  column whose first rows are all NULL is typed as integers, and a later value of another
  type fails the Arrow read: :mod:`.arrow_copy` then reads the range again from a cursor.
  The driver reads the rows as it is asked for them (one batch ahead at most): memory stays
  flat in the number of rows.

Measured (``benchmarks/db_readers.py``: 1,000,100 rows of four columns into an unlogged
table, client CPU during the load, medians of three, a busy 2-core machine): SQLite by the
rows path 2.30 s (wall 2.93 s), by ADBC 0.90 s (wall 1.70 s); ConnectorX's SQLite reader
0.90 s as well, but it panics (a Rust panic, not an error) where ADBC raises.

Not taken: **ConnectorX for MySQL/MariaDB** (0.4.6). It took 6.8x less client CPU than the
rows path (0.87 s against 5.95 s; wall 1.8 s against 7.3 s: PyMySQL's decoding in Python is
the cost), but its ``arrow_stream`` result is fed by a thread through an unbounded channel
(``std::sync::mpsc::channel`` in its ``destinations/arrowstream``): when COPY takes the
batches more slowly than MariaDB sends them, they pile up (a load's peak RSS was 169 MB
for 150,000 rows of 120 bytes, 278 MB for 1,500,000 and 398 MB for 3,000,000), so a COPY
task's memory would grow with the source. It also fails on a DECIMAL(30,10), and an Arrow
time cannot hold MariaDB's TIME past a day; those columns would keep the rows path anyway.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

from airflow_pg_bulk.plan import DatabaseSource
from airflow_pg_bulk.sql import source as source_sql

#: rows in one Arrow record batch (one COPY chunk): about 3 MB of CSV for four columns
BATCH_ROWS = 65_536


class AdbcSqlite:
    """SQLite through ADBC's driver (``adbc-driver-sqlite``, the ``sqlite`` extra)."""

    name = "adbc_sqlite"

    def takes(self, url: Any, conn: Any, source: DatabaseSource) -> bool:
        """Whether the source is a STRICT table of a SQLite file (see the module), and ADBC's
        driver is installed."""
        if url.get_backend_name() != "sqlite" or url.query or not source.table:
            return False
        if url.database in (None, "", ":memory:") or not _installed("adbc_driver_sqlite"):
            return False
        try:
            found = conn.execute(source_sql.alchemy_sqlite_strict(source.table)).first()
        except Exception:  # SQLite before 3.37: no STRICT tables
            return False
        return found is not None and tuple(found) == (1, 0)

    @contextlib.contextmanager
    def batches(self, url: Any, statement: str) -> Iterator[Any]:
        """The statement's rows, a record batch at a time (a ``RecordBatchReader``)."""
        from adbc_driver_sqlite import dbapi

        with dbapi.connect(url.database) as conn, conn.cursor() as cursor:
            cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            cursor.execute(statement)
            yield cursor.fetch_record_batch()


#: the Arrow readers, by the name the plan carries
READERS = {reader.name: reader for reader in (AdbcSqlite(),)}


def choose(source: DatabaseSource, url: Any, conn: Any) -> str | None:
    """The name of the Arrow reader that reads ``source`` exactly (its SQLAlchemy ``url``, a
    connection ``conn`` to it), or None for the rows path."""
    for reader in READERS.values():
        if reader.takes(url, conn, source):
            return reader.name
    return None


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
