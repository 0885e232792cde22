"""What a table swapped in needs before the swap: the target's indexes and constraints built on
it, then ANALYZE (each step committed, so that a retried finalize goes on where the last one
stopped; a rebuild keeps them in its one transaction).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, execute_outside_transaction
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.plan import ConstraintDef, LoadPlan
from airflow_pg_bulk.plan.codes import ConstraintKind
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.target import parallel_builds
from airflow_pg_bulk.target.staging import Existing

log = logging.getLogger(__name__)


def build_on_staging(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    built: Existing,
    commit: Callable[[], None] | None = None,
    sessions: Sessions | None = None,
    alongside: int = 1,
    limits: parallel_builds.ParallelLimits | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """The target's indexes and constraints on ``plan.staging_table`` (what ``built`` holds is
    skipped), then ANALYZE; returns the temporary names of the indexes and constraints.

    ``commit`` runs after each step; default: each step is a transaction of its own, so that
    a retried replace goes on where the last one stopped (one round trip each, in autocommit,
    where BEGIN, the statement and COMMIT were three); a rebuild passes a no-op and keeps it
    all in its one transaction. (VALIDATE CONSTRAINT and ANALYZE run in a transaction block.)

    Each build gets ``max_parallel_maintenance_workers`` by
    :func:`parallel_builds.size_builds`; with ``sessions`` and more than one index to build,
    several are built at once on sessions of their own (:func:`parallel_builds.run_at_once`),
    each committed there. ``alongside``: how many tables are built at once, this one included
    (the partitions of a partitioned target built side by side), which share the server's
    parallel workers. ``limits``: the server's settings as finalize read them (None: read
    here, on ``conn``).

    ANALYZE is skipped when ``built`` says an ANALYZE of the table ended (``("analyzed", "")``,
    :func:`sql.staging_state`: an earlier attempt, or a side-by-side build, analyzed it; its
    rows do not change after COPY, and autovacuum is off on staging tables, so those
    statistics are of these rows), so that a retried finalize does not analyze it again."""
    t = plan.target
    stage = plan.staging_table
    step = _Steps(conn, commit)
    index_names, constraint_names = naming.temp_names(plan)
    with clock.phase("indexes"):
        builds = []
        for index in t.indexes:
            name = index_names[index.name]
            done_as_key = (
                index.constraint and ("constraint", constraint_names[index.constraint]) in built
            )
            if built.get(("index", name)) or done_as_key:
                continue
            if ("index", name) in built:  # an invalid leftover of an interrupted build
                execute(conn, sql.drop_index(t.schema, name))
            builds.append(
                sql.create_index(t.schema, stage, name, unique=index.unique, tail=index.tail)
            )
        at_once = len(builds) if sessions is not None else 1
        if limits is None:
            limits = parallel_builds.read_limits(conn)
        sizing = limits.sizing(at_once, plan.settings.index_workers, alongside)
        workers = sql.set_config("max_parallel_maintenance_workers", str(sizing.workers))
        step(workers, later=True)
        if builds:
            log.info(
                "Load %s: building %d indexes on %s for %s, %d at once, %d parallel workers "
                "each: %s",
                naming.owning_load_id(stage) or plan.load_id,
                len(builds),
                stage,
                t.qualified,
                min(sizing.builds, len(builds)),
                sizing.workers,
                sizing.why,
            )
        if sessions is not None and sizing.builds > 1 and len(builds) > 1:
            setup = [
                sql.set_config("lock_timeout", plan.settings.lock_timeout),
                sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem),
                workers,
            ]
            parallel_builds.run_at_once(sessions, builds, sizing.builds, setup)
        else:
            for statement in builds:
                step(statement)
    with clock.phase("constraints"):
        for con in t.constraints:
            _add_constraint(plan, con, constraint_names[con.name], index_names, built, step)
    if plan.settings.analyze and not built.get(("analyzed", "")):
        with clock.phase("analyze"):
            step(sql.analyze(t.schema, stage))
    step.flush()
    return index_names, constraint_names


class _Steps:
    """How :func:`build_on_staging` runs a step and ends it (see its ``commit``): with no
    ``commit``, in autocommit (a transaction of its own; in the one open, if any, which it
    commits); else in the current transaction, then ``commit``. A step told ``later`` (a
    setting, a change of staging's catalog alone: nothing another session waits for) is
    sent with the next one, in its round trip and transaction; :meth:`flush` sends what is
    left."""

    def __init__(self, conn: DatabaseConnection, commit: Callable[[], None] | None) -> None:
        self._conn = conn
        self._commit = commit
        self._later: list[sql.Composable] = []

    def __call__(self, statement: sql.Composable, *, later: bool = False) -> None:
        self._later.append(statement)
        if not later:
            self.flush()

    def flush(self) -> None:
        """Send what is waiting, as one step."""
        if not self._later:
            return
        together, self._later = sql.in_one_round_trip(*self._later), []
        if self._commit is None:
            execute_outside_transaction(self._conn, together)
            return
        execute(self._conn, together)
        self._commit()


def _add_constraint(
    plan: LoadPlan,
    con: ConstraintDef,
    name: str,
    index_names: dict[str, str],
    built: Existing,
    step: _Steps,
) -> None:
    """One constraint on staging, each statement a step (see :class:`_Steps`)."""
    t = plan.target
    stage = plan.staging_table
    exists = ("constraint", name) in built
    if con.kind in (ConstraintKind.PRIMARY_KEY, ConstraintKind.UNIQUE):
        if not exists:  # (only staging's catalog changes: sent with the next step)
            step(
                later=True,
                statement=sql.add_key_using_index(
                    t.schema,
                    stage,
                    name,
                    kind=con.kind,
                    index=index_names[con.index or ""],
                    deferrable=con.deferrable,
                    deferred=con.deferred,
                ),
            )
    elif con.kind in (ConstraintKind.CHECK, ConstraintKind.FOREIGN_KEY):
        if not exists:
            step(sql.add_constraint(t.schema, stage, name, con.definition, not_valid=True))
        if con.validated and not built.get(("constraint", name)):
            step(sql.validate_constraint(t.schema, stage, name))
    elif not exists:
        step(sql.add_constraint(t.schema, stage, name, con.definition))
