"""What a source database's DB-API driver is asked for when the COPY step reads rows from it
(:mod:`airflow_pg_bulk.loading.database`): values as the server sent them where the server's
text is already what PostgreSQL's COPY text reads.

PyMySQL (pure Python) receives every value of MySQL's text protocol as text and then converts
it in Python (``int``, ``float``, ``Decimal``, ``date``, ``timedelta``...), only for the COPY
step to turn it back into text: without those decoders a 1,000,000-row read of four columns
took 2.5 s of CPU instead of 3.7 (benchmarks/RESULTS-db-source.md). The server's text is what
COPY reads for every type PyMySQL decodes: integers, DECIMAL and DOUBLE (the digits PyMySQL
would have parsed), DATE, DATETIME/TIMESTAMP (``2026-01-02 03:04:05.000006``), TIME
(``-838:59:59``, which PostgreSQL's ``interval`` and, within a day, ``time`` read; the
``timedelta`` PyMySQL made of it was written as ``N days N seconds``, which ``time`` does not
read), YEAR. BIT keeps its decoder (its value is bytes, not text). Strings and bytes are as
before (decoded by the connection's charset; binary kept as bytes).
"""

from __future__ import annotations

from typing import Any


def copy_connect_args(driver_name: str) -> dict[str, Any]:
    """The ``connect_args`` (SQLAlchemy's ``create_engine``) for the driver named
    ``driver_name`` (``URL.get_driver_name()``: ``pymysql``, ``pysqlite``...) when the COPY
    step reads rows with it; empty for a driver that is given nothing."""
    if driver_name != "pymysql":
        return {}
    from pymysql import converters
    from pymysql.constants import FIELD_TYPE

    return {
        "conv": {
            key: value
            for key, value in converters.conversions.items()
            if not isinstance(key, int) or key == FIELD_TYPE.BIT  # the encoders, and BIT
        }
    }
