"""airflow-pg-bulk: fast, safe, observable bulk loads into PostgreSQL as Airflow tasks.

``pg_bulk_load(...)`` builds the TaskGroup (prepare → parallel COPY → finalize, with a cleanup
teardown); ``load(...)`` runs the same steps in one process. Airflow is imported only when an
Airflow-facing name is used, so the command line and ``load`` start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "pg_bulk_load": "airflow_pg_bulk.task_group",
    "PgBulkLoadGroup": "airflow_pg_bulk.task_group",
    "PgBulkHook": "airflow_pg_bulk.hooks.pg_bulk",
    "PgBulkPrepareOperator": "airflow_pg_bulk.operators.pg_bulk",
    "PgBulkCopyOperator": "airflow_pg_bulk.operators.pg_bulk",
    "PgBulkFinalizeOperator": "airflow_pg_bulk.operators.pg_bulk",
    "PgBulkCleanupOperator": "airflow_pg_bulk.operators.pg_bulk",
    "load": "airflow_pg_bulk.runner",
    "LoadSummary": "airflow_pg_bulk.plan.figures",
    "Settings": "airflow_pg_bulk.plan",
    "CopyOptions": "airflow_pg_bulk.plan",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'airflow_pg_bulk' has no attribute {name!r}")
