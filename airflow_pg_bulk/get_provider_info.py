"""Airflow's provider registration (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers list`` shows. ``package-name`` must equal the distribution name.

    No connection type is registered: the hook reuses the postgres provider's ``postgres``
    connections, so users' existing connections, extras and secrets work unchanged."""
    from airflow_pg_bulk import __version__

    return {
        "package-name": "airflow-pg-bulk",
        "name": "PostgreSQL bulk load",
        "description": "Parallel, exactly-once, atomic bulk loads into PostgreSQL: "
        "prepare, mapped COPY tasks, finalize.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "PostgreSQL bulk load",
                "external-doc-url": "https://www.postgresql.org/docs/current/sql-copy.html",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "PostgreSQL bulk load",
                "python-modules": ["airflow_pg_bulk.hooks.pg_bulk"],
            }
        ],
        "operators": [
            {
                "integration-name": "PostgreSQL bulk load",
                "python-modules": ["airflow_pg_bulk.operators.pg_bulk"],
            }
        ],
    }
