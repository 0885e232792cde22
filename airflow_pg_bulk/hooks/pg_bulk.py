"""``PgBulkHook``: the postgres provider's hook, plus the four steps of a bulk load."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any

from airflow.providers.postgres.hooks.postgres import PostgresHook

if TYPE_CHECKING:  # the steps (and with them the SQL and splitting) are imported when run
    from airflow_pg_bulk.figures import LoadSummary, PartitionResult
    from airflow_pg_bulk.plan import LoadPlan, LoadRequest


class PgBulkHook(PostgresHook):
    """A :class:`PostgresHook` that runs the steps of a bulk load.

    It uses the ordinary ``postgres`` connection type (``postgres_conn_id``), so connections,
    extras and secrets backends work as for any Postgres task. Each step opens its own
    connection (psycopg 3 under Airflow 3.3, psycopg2 where the provider hands those out) and
    closes it when done.

    :param postgres_conn_id: the Airflow connection id of the target database.
    """

    hook_name = "Postgres (bulk load)"

    @contextmanager
    def _bulk_connection(self) -> Iterator[Any]:
        with closing(self.get_conn()) as conn:
            yield conn

    def prepare(
        self, request: LoadRequest, load_id: str, *, logical_date: str | None = None
    ) -> LoadPlan:
        """Validate, capture the target's definition, create staging; return the plan.

        :param logical_date: the DAG run's logical date (ISO 8601), kept with the load."""
        from airflow_pg_bulk import steps

        with self._bulk_connection() as conn:
            return steps.prepare(conn, request, load_id, logical_date=logical_date)

    def copy_partition(
        self, plan: LoadPlan, index: int, progress: Callable[[int, int], None] | None = None
    ) -> PartitionResult:
        """COPY one partition into staging, exactly once."""
        from airflow_pg_bulk import steps

        with self._bulk_connection() as conn:
            return steps.copy_partition(conn, plan, index, progress)

    def finalize(
        self, plan: LoadPlan, progress: Callable[[int, int], None] | None = None
    ) -> LoadSummary:
        """COPY any partition the ledger lacks (after a partial clear), then build indexes
        and constraints and swap (replace) or insert (append) atomically."""
        from airflow_pg_bulk import steps

        with self._bulk_connection() as conn:
            return steps.complete_and_finalize(conn, plan, progress)

    def cleanup(self, schema: str, load_id: str) -> list[str]:
        """Drop the run's staging and ledger tables; returns their names."""
        from airflow_pg_bulk import steps

        with self._bulk_connection() as conn:
            return steps.cleanup(conn, schema, load_id)
