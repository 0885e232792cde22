"""``PgBulkHook``: the postgres provider's hook, plus the four steps of a bulk load."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.providers.postgres.hooks.postgres import PostgresHook

from airflow_pg_bulk import naming

if TYPE_CHECKING:  # the steps (and with them the SQL and splitting) are imported when run
    from airflow_pg_bulk.plan import LoadPlan, LoadRequest, Partition, RunOrder
    from airflow_pg_bulk.plan.figures import LoadSummary, PartitionResult


class PgBulkHook(PostgresHook):
    """A :class:`PostgresHook` that runs the steps of a bulk load.

    It uses the ordinary ``postgres`` connection type (``postgres_conn_id``), so connections,
    extras and secrets backends work as for any Postgres task. Each step opens its own
    connection (psycopg 3 under Airflow 3.3, psycopg2 where the provider hands those out), names
    its session (``application_name``, see :func:`airflow_pg_bulk.naming.application_name`;
    each step takes it as ``application_name``, by default ``pgbulk:<load_id>:<step>``) and
    closes it when done, cancelling first a statement still running. :meth:`cancel` cancels
    the running statement from another thread or a signal handler.

    :param postgres_conn_id: the Airflow connection id of the target database.
    """

    hook_name = "Postgres (bulk load)"
    _in_use: Any = None  # the connection of the step running now (read by cancel)
    _sessions: Any = None  # finalize's extra sessions (session.Sessions), stopped by cancel too
    _held: Any = None  # the connection of an open session(), which the steps inside share

    @contextmanager
    def session(self, application_name: str) -> Iterator[None]:
        """One session for every step called inside (each step still its own transactions):
        a COPY task reads its pieces and copies its partitions on one connection, so it
        never holds two sessions, even for the moment a closed one takes to end on the
        server (a pool bounding COPY tasks then bounds their sessions)."""
        with self._bulk_connection(application_name) as conn:
            self._held = conn
            try:
                yield
            finally:
                self._held = None

    @contextmanager
    def _bulk_connection(self, application_name: str) -> Iterator[Any]:
        from airflow_pg_bulk import steps
        from airflow_pg_bulk.db import driver

        if self._held is not None:  # inside session(): its connection, named and kept open
            yield self._held
            return
        conn = self.get_conn()
        self._in_use = conn
        try:
            steps.start_session(conn, application_name)
            yield conn
        finally:
            self._in_use = None
            driver.close_cancelling(conn)

    def cancel(self) -> bool:
        """Stop the step in progress: cancel the statement the server runs for it and refuse
        any further statement on its connection (see :func:`airflow_pg_bulk.db.driver.stop`);
        True when a step was in progress. Takes no lock: safe from another thread and from a
        signal handler that interrupted the step (Airflow's SIGTERM handler calls
        ``on_kill``). The step then fails with the server's ``QueryCanceled`` or, between
        statements, with :class:`~airflow_pg_bulk.errors.TransientLoadError`."""
        conn = self._in_use
        if conn is None:
            return False
        from airflow_pg_bulk.db import driver

        sessions = self._sessions
        if sessions is not None:
            sessions.stop()
        driver.stop(conn)
        return True

    def prepare(
        self,
        request: LoadRequest,
        load_id: str,
        *,
        logical_date: str | None = None,
        run: RunOrder | None = None,
        application_name: str | None = None,
    ) -> LoadPlan:
        """Validate, capture the target's definition, create staging; store each COPY stream's
        pieces in the load's pieces table (:meth:`read_pieces`); return the plan.

        :param logical_date: the DAG run's logical date (ISO 8601), kept with the load.
        :param run: the DAG run and its data interval, for the ordering rule."""
        from airflow_pg_bulk import steps

        name = application_name or naming.application_name(load_id, "prepare")
        with self._bulk_connection(name) as conn:
            plan = steps.prepare(
                conn, request, load_id, logical_date=logical_date, run=run, store_pieces=True
            )
            # what the load will do, in the prepare task's log, before any row is copied and
            # before the target is touched (a dry run from the command line says the same)
            heading = f"Load {load_id}: prepared; this load ({plan.mode}) into "
            heading += f"{plan.target.qualified} will:"
            self.log.info("%s", steps.preview_of_plan(conn, plan).describe(heading))
            return plan

    def read_pieces(
        self, plan: LoadPlan, partitions: Sequence[int], *, application_name: str | None = None
    ) -> list[Partition]:
        """These COPY streams of ``plan`` (the plan without pieces, :meth:`LoadPlan.shared`),
        with the pieces :meth:`prepare` stored for them (see
        :func:`airflow_pg_bulk.steps.read_pieces`)."""
        from airflow_pg_bulk import steps

        name = application_name or naming.application_name(plan.load_id, "pieces")
        with self._bulk_connection(name) as conn:
            return steps.read_pieces(conn, plan, partitions)

    def copy_span(
        self, plan: LoadPlan, *, application_name: str | None = None
    ) -> tuple[float, float] | None:
        """The first COPY's start and the last COPY's end, from ``plan``'s ledger, on this
        process's clock; None when no COPY stream is in it (see
        :func:`airflow_pg_bulk.loading.ledger.copy_span`)."""
        from airflow_pg_bulk.loading import ledger

        name = application_name or naming.application_name(plan.load_id, "finalize")
        with self._bulk_connection(name) as conn:
            return ledger.copy_span(conn, plan)

    def copy_partition(
        self,
        plan: LoadPlan,
        index: int,
        progress: Callable[[int, int], None] | None = None,
        *,
        application_name: str | None = None,
    ) -> PartitionResult:
        """COPY one COPY stream into staging, exactly once."""
        from airflow_pg_bulk import steps

        name = application_name or naming.application_name(plan.load_id, "copy", index)
        with self._bulk_connection(name) as conn:
            return steps.copy_partition(conn, plan, index, progress)

    def finalize(
        self,
        plan: LoadPlan,
        progress: Callable[[int, int], None] | None = None,
        *,
        application_name: str | None = None,
    ) -> LoadSummary:
        """COPY any COPY stream the ledger lacks (after a partial clear), then build indexes
        (several at once, each on a session of its own named after this step's, with a
        ``+<n>`` suffix) and constraints and swap (replace) or insert (append) atomically.
        :meth:`cancel` stops the extra sessions too."""
        from airflow_pg_bulk import steps
        from airflow_pg_bulk.db import session

        name = application_name or naming.application_name(plan.load_id, "finalize")
        self._sessions = session.Sessions(self.get_conn, name)
        try:
            with self._bulk_connection(name) as conn:
                return steps.complete_and_finalize(conn, plan, progress, self._sessions)
        finally:
            self._sessions = None

    def cleanup(
        self,
        schema: str,
        load_id: str,
        *,
        lock_timeout: str | None = None,
        application_name: str | None = None,
    ) -> list[str]:
        """Drop the run's staging and ledger tables, each waiting at most ``lock_timeout`` (a
        few times: see :func:`airflow_pg_bulk.steps.cleanup`); returns their names."""
        from airflow_pg_bulk import steps

        name = application_name or naming.application_name(load_id, "cleanup")
        timeouts = {"lock_timeout": lock_timeout} if lock_timeout else {}
        with self._bulk_connection(name) as conn:
            return steps.cleanup(conn, schema, load_id, **timeouts)
