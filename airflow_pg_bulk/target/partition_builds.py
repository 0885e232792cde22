"""The partitions a partition-wise load (:mod:`airflow_pg_bulk.target.partitioned`) builds
beside the target: which loaded partitions get a new table swapped in rather than their rows
inserted in place (:func:`to_swap`), and the build of each new table (its indexes and
constraints, ANALYZE: :func:`build_leaf`), one after another on finalize's session or
several at once on sessions of their own (:func:`build_in_parallel`). Each build step is
committed and skipped when found done, so that a retried finalize goes on where the last
one stopped; nothing here touches the target."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    close_cancelling,
    execute,
    rollback_quietly,
    scalar,
)
from airflow_pg_bulk.db.session import Sessions, start_session
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.plan.codes import Persistence
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.target import build, parallel_builds, staging

log = logging.getLogger(__name__)

#: at most this many partitions are built at once by finalize's extra sessions
MAX_SIDE_BY_SIDE = 8


def leaf_plan(plan: LoadPlan, number: int) -> LoadPlan:
    """The plan of one leaf's build (``plan`` as the route returned it:
    :func:`airflow_pg_bulk.target.partitioned.route`): the leaf as the target, its new table
    as staging, a load id of its own (the temporary index and constraint names differ per
    leaf)."""
    leaf = plan.target.required_partitioning().leaves[number]
    return dataclasses.replace(
        plan,
        load_id=naming.leaf_load_id(plan.load_id, number),
        target=leaf.definition,
        staging_table=naming.staging_partition(plan.load_id, number),
    )


def to_swap(conn: DatabaseConnection, plan: LoadPlan, loaded: list[int]) -> list[int]:
    """The loaded leaves to build and swap in: for a replace, those not loaded in place (more
    than :data:`airflow_pg_bulk.target.partitioned.IN_PLACE_ROWS` rows, or a trigger that an
    INSERT would fire and a swap does not: decided by the route); for an append, of those,
    the empty ones, when the role owns the target and nothing stands in the way of a swap."""
    parts = plan.target.required_partitioning()
    loaded = [n for n in loaded if not parts.leaves[n].in_place]
    if plan.mode.replaces_rows:
        return loaded
    owner = execute(conn, sql.loader_privileges(plan.target.oid))[0][0]
    if not owner or parts.unsupported or plan.target.referencing_keys:
        log.info(
            "Load %s: append into %s: every table partition in place (none can be swapped in: %s)",
            plan.load_id,
            plan.target.qualified,
            "the role does not own the target" if not owner else "; ".join(parts.unsupported),
        )
        return []
    return [
        n
        for n in loaded
        if not scalar(conn, sql.has_rows(plan.target.schema, parts.leaves[n].definition.table))
    ]


def build_leaf(
    conn: DatabaseConnection,
    plan: LoadPlan,
    number: int,
    clock: PhaseClock,
    limits: parallel_builds.ParallelLimits,
    alongside: int = 1,
) -> tuple[dict[str, str], dict[str, str]]:
    """Build on a partition's new table what the partition has, then ANALYZE it; each step
    commits and a retry skips what is done. Returns the temporary index and constraint names.
    ``limits``: the server's, as finalize read them; ``alongside``: partitions built at once
    (they share the server's parallel workers)."""
    built_plan = leaf_plan(plan, number)
    t = plan.target
    stage = built_plan.staging_table
    state = staging.existing_objects(conn, built_plan)
    if ("persistence", Persistence.UNLOGGED) in state and (
        built_plan.target.persistence == Persistence.PERMANENT
    ):
        with clock.phase("set_logged"):
            execute(conn, sql.set_logged(t.schema, stage))
            conn.commit()
    return build.build_on_staging(
        conn, built_plan, clock, state, alongside=alongside, limits=limits
    )


def built_beside(plan: LoadPlan) -> int:
    """How many partitions a routed load builds beside the target (not loaded in place)."""
    return sum(not leaf.in_place for leaf in plan.target.required_partitioning().leaves)


def side_by_side(plan: LoadPlan) -> int:
    """How many partitions finalize builds at once: as many as the load's COPY partitions (the
    parallelism the load was given for the server), at least 2, at most ``MAX_SIDE_BY_SIDE``."""
    return max(2, min(len(plan.partitions), MAX_SIDE_BY_SIDE))


def build_in_parallel(
    sessions: Sessions, plan: LoadPlan, jobs: int, limits: parallel_builds.ParallelLimits
) -> float:
    """At the start of finalize (in one process and under Airflow alike, on finalize's extra
    sessions): build the partitions finalize will swap in (indexes, constraints, ANALYZE), up
    to ``jobs`` at once, each thread on a session of its own (``sessions``); finalize then finds
    them built and analyzed, and swaps them in (each build step is committed and skipped
    when found done). Nothing here touches the target.
    ``plan``: a partition-wise load's, as the route returned it; ``limits``: the server's, as
    finalize read them.

    A kill or timeout (:func:`airflow_pg_bulk.target.parallel_builds.run_jobs`) cancels the
    running builds and starts none of those still queued.
    Returns the seconds taken (0: nothing to build side by side: fewer than two partitions,
    or the load finalized)."""
    if jobs < 2:
        return 0.0
    started = time.perf_counter()
    with _session(sessions.open, plan, "build") as conn:
        if any(row[0] == sql.FINALIZED for row in execute(conn, _ledger(plan))):
            return 0.0
        leaves = plan.target.required_partitioning().leaves
        swapped = to_swap(conn, plan, list(range(len(leaves))))
        conn.commit()
    if len(swapped) < 2:
        return 0.0

    workers = min(jobs, len(swapped))

    # each leaf's ANALYZE too, in its build (finalize then finds it built and analyzed, and
    # skips both: build.build_on_staging)
    def build(number: int, conn: DatabaseConnection) -> None:
        try:
            build_leaf(conn, plan, number, PhaseClock(), limits, alongside=workers)
        except BaseException:
            rollback_quietly(conn)
            raise  # finalize translates it (and finds the row of a broken constraint)

    setup = [
        sql.set_config("lock_timeout", plan.settings.lock_timeout),
        sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem),
    ]
    parallel_builds.run_jobs(
        sessions, [functools.partial(build, n) for n in swapped], workers, setup
    )
    seconds = time.perf_counter() - started
    log.info(
        "Load %s: %d table partitions of %s built on %d sessions at once in %.2f s",
        plan.load_id,
        len(swapped),
        plan.target.qualified,
        workers,
        seconds,
    )
    return seconds


@contextmanager
def _session(
    connect: Callable[[], Any], plan: LoadPlan, what: str, index: int | None = None
) -> Iterator[Any]:
    conn = connect()
    try:
        start_session(conn, naming.application_name(plan.load_id, what, index))
        execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout))
        execute(conn, sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem))
        conn.commit()
        yield conn
    finally:
        close_cancelling(conn)


def _ledger(plan: LoadPlan) -> sql.Composable:
    return sql.ledger_rows(plan.target.schema, plan.ledger_table)
