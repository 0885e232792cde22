"""The rows path's Arrow reader: a range read as Arrow record batches (:mod:`.arrow_readers`),
encoded as COPY CSV by Arrow's writer (the Parquet path's encoding,
:func:`airflow_pg_bulk.source.parquet.encode`) and streamed into ``COPY ... FROM STDIN`` of
staging, one batch at a time, under a savepoint: when anything fails (the reader, the source,
a value the target refuses), the savepoint undoes the rows and the caller reads the range
again by the DB-API rows path (:mod:`.rows_copy`), which loads it after all or fails naming
the source's error, or the range, the split key's value and the column of the value refused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import driver
from airflow_pg_bulk.loading.database.arrow_readers import READERS
from airflow_pg_bulk.loading.database.urls import held_url
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.source import parquet
from airflow_pg_bulk.sql import source as source_sql

log = logging.getLogger(__name__)

_ARROW = "pgbulk_arrow"


class _Encoded:
    """A reader's record batches as COPY CSV chunks, rows and bytes counted as they go."""

    def __init__(self, batches: Any) -> None:
        self._batches = batches
        self.rows = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[bytes]:
        for batch in self._batches:
            names = batch.schema.names
            chunk = parquet.encode(parquet.text_arrays(batch, names), names)
            self.rows += batch.num_rows
            self.bytes += len(chunk)
            yield chunk


def copy_range(conn: Any, plan: LoadPlan, bounds: tuple[Any, Any]) -> tuple[int, int, int] | None:
    """A range of the source read by its Arrow reader (:attr:`DatabaseSource.arrow`) into
    staging on ``conn``; (rows loaded, rows read, bytes), or None when it failed (nothing of
    it is left in staging: read it again by the rows path)."""
    import sqlalchemy

    source = plan.database
    assert source is not None and source.arrow is not None
    reader = READERS[source.arrow]
    t = plan.target
    statement = sql.copy_from_stdin(t.schema, plan.staging_table, plan.columns, parquet.COPY_CSV)
    driver.execute(conn, sql.savepoint(_ARROW))
    try:
        url = sqlalchemy.engine.make_url(held_url(source.name))
        select = source_sql.alchemy_key_range(
            source.query, source.table, source.split_by or "", *bounds
        )
        text = str(
            select.compile(
                dialect=url.get_dialect()(paramstyle="named"),
                compile_kwargs={"literal_binds": True},
            )
        )
        with reader.batches(url, text) as batches:
            encoded = _Encoded(batches)
            loaded = driver.copy_in(conn, statement, encoded)
    except BaseException as exc:  # a Rust reader's panic is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        driver.execute(conn, sql.rollback_to(_ARROW))
        log.info(
            "Load %s: the Arrow reader %s failed (%s); the rows are read again from a cursor",
            plan.load_id,
            reader.name,
            driver.redact(str(exc).strip().split("\n")[0], held_url(source.name)),
        )
        return None
    driver.execute(conn, sql.release(_ARROW))
    return loaded, encoded.rows, encoded.bytes
