"""The four steps of a load: prepare, copy one partition, finalize, cleanup.

Each takes an open DB-API connection (psycopg 3 or psycopg2) and plain data, and knows nothing
of Airflow: the operators, the in-process runner and the tests all call these functions. They
live in :mod:`airflow_pg_bulk.loading` (one module per step) and are re-exported here, with
:func:`start_session`, which prepares each step's session.
"""

from __future__ import annotations

from airflow_pg_bulk.db.session import start_session
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.loading.cleanup import cleanup, drop_abandoned
from airflow_pg_bulk.loading.copy import ProgressCallback, copy_partition
from airflow_pg_bulk.loading.finalize import complete_and_finalize, finalize
from airflow_pg_bulk.loading.ledger import ledger_comment, read_pieces
from airflow_pg_bulk.loading.prepare import prepare
from airflow_pg_bulk.loading.preview import of_plan as preview_of_plan

__all__ = [
    "LoadRefusedError",
    "ProgressCallback",
    "cleanup",
    "complete_and_finalize",
    "copy_partition",
    "drop_abandoned",
    "finalize",
    "ledger_comment",
    "prepare",
    "preview_of_plan",
    "read_pieces",
    "start_session",
]
