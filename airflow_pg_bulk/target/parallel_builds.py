"""Finalize on several cores: the index builds of one table at once, on sessions of their own,
each with parallel maintenance workers sized from what the server allows.

``CREATE INDEX`` takes SHARE on its table, which does not conflict with itself, so the indexes
of staging can be built at once, each on its own session (each commits on its own, as the
serial path does, so a retry goes on where the last attempt stopped). Nothing else of finalize
overlaps them: ``ALTER TABLE ... ADD CONSTRAINT`` (SHARE ROW EXCLUSIVE / ACCESS EXCLUSIVE),
``VALIDATE CONSTRAINT`` and ``ANALYZE`` (SHARE UPDATE EXCLUSIVE) conflict with SHARE on the same
table, and with each other. See docs/design.md, "finalize on several cores".

The sizing rule (:func:`size_builds`, its pool rule :func:`builds_at_once`) reads the server's
``max_worker_processes``, ``max_parallel_workers`` and ``max_parallel_maintenance_workers``
(:class:`ParallelLimits`, read once per finalize); the extra sessions come from a
:class:`airflow_pg_bulk.db.session.Sessions`, which the hook stops on a kill together with the
step's own connection.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from psycopg.sql import Composable

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, rollback_quietly
from airflow_pg_bulk.db.session import Sessions

log = logging.getLogger(__name__)

BUILDS_PER_WORKERS = 4  # one more build at once per this many parallel workers the server allows


def builds_at_once(pool: int, alongside: int = 1) -> int:
    """The pool rule (pure): how many sessions may work at once on one table, of ``alongside``
    tables worked on at once, out of a parallel worker ``pool``
    (``min(max_worker_processes, max_parallel_workers)``): one per
    :data:`BUILDS_PER_WORKERS` workers of the pool, shared by the tables, at least 1. The
    index builds of a table (:func:`size_builds`) and the sessions that fill an upsert's
    rebuilt table (:func:`airflow_pg_bulk.target.rebuild.split_sessions`) follow it."""
    return max(1, max(0, pool) // (BUILDS_PER_WORKERS * max(1, alongside)))


@dataclass(frozen=True)
class BuildSizing:
    """How finalize builds the indexes of one table.

    :param builds: index builds at once, each on its own session (1: one after another on
        finalize's own session).
    :param workers: ``max_parallel_maintenance_workers`` of each build's session.
    :param why: how the rule came to these figures, for the log (not compared).
    """

    builds: int
    workers: int
    why: str = field(default="", compare=False)


def size_builds(
    indexes: int,
    max_worker_processes: int,
    max_parallel_workers: int,
    max_parallel_maintenance_workers: int,
    index_workers: int | None = None,
    alongside: int = 1,
) -> BuildSizing:
    """The sizing rule (pure).

    ``pool = min(max_worker_processes, max_parallel_workers)`` is what the server lets all
    parallel work use at once, and the only statement of its cores that SQL can read.
    ``builds = min(indexes, max(1, pool // (4 * alongside)))`` index builds of the table at
    once (the server's default pool of 8 builds two at once, a pool of 16 four), each on its
    own session; ``alongside`` tables are built at once (the partitions of a partitioned
    target, each by its own session), so ``sessions = builds * alongside`` leaders work at
    once. Each build gets the server's ``max_parallel_maintenance_workers`` (the DBA's
    choice; ``index_workers``, the load option, when given, may raise or lower it), never
    more than its share of the pool, ``pool // sessions - 1`` (its leader works too): all
    the builds at once never ask for more processes than the pool.

    PostgreSQL itself may start fewer: by the table's size, by ``maintenance_work_mem`` (32 MB
    per participant) and by what is free in the pool.

    :param indexes: the indexes left to build that may be built at once (1: one after another).
    :param max_worker_processes: the server's setting.
    :param max_parallel_workers: the server's setting.
    :param max_parallel_maintenance_workers: the server's setting (of the load's session).
    :param index_workers: the user's choice of workers per build (the load option).
    :param alongside: tables built at once, each by this rule (at least 1).
    """
    pool = max(0, min(max_worker_processes, max_parallel_workers))
    alongside = max(1, alongside)
    builds = max(1, min(indexes, builds_at_once(pool, alongside)))
    sessions = builds * alongside
    share = max(0, pool // sessions - 1)
    if index_workers is None:
        wanted, source = (
            max(0, max_parallel_maintenance_workers),
            (f"the server's max_parallel_maintenance_workers {max_parallel_maintenance_workers}"),
        )
    else:
        wanted, source = max(0, index_workers), f"index_workers {index_workers}"
    workers = min(wanted, share)
    why = (
        f"{source}"
        + (
            f", cut to {share}: {sessions} builds at once share a pool of {pool}"
            if workers < wanted
            else f" ({sessions} builds at once within a pool of {pool})"
        )
        + f" (min(max_worker_processes {max_worker_processes}, max_parallel_workers "
    )
    why += f"{max_parallel_workers}), each build's leader counted)"
    return BuildSizing(builds=builds, workers=workers, why=why)


@dataclass(frozen=True)
class ParallelLimits:
    """The server's settings that the sizing rules read (:func:`sql.parallel_limits`), read
    once per finalize (:func:`read_limits`) and passed down to what sizes its work."""

    max_worker_processes: int
    max_parallel_workers: int
    max_parallel_maintenance_workers: int

    @property
    def pool(self) -> int:
        """What all parallel work of the server may use at once:
        ``min(max_worker_processes, max_parallel_workers)``."""
        return max(0, min(self.max_worker_processes, self.max_parallel_workers))

    def sizing(self, indexes: int, index_workers: int | None, alongside: int = 1) -> BuildSizing:
        """:func:`size_builds` with these settings."""
        return size_builds(
            indexes,
            self.max_worker_processes,
            self.max_parallel_workers,
            self.max_parallel_maintenance_workers,
            index_workers,
            alongside,
        )


def read_limits(conn: DatabaseConnection) -> ParallelLimits:
    """The server's :class:`ParallelLimits`, read on ``conn`` (in its transaction: a rebuild
    keeps everything in one)."""
    processes, parallel, maintenance = execute(conn, sql.parallel_limits())[0]
    return ParallelLimits(processes, parallel, maintenance)


def run_at_once(
    sessions: Sessions,
    statements: Sequence[Composable],
    builds: int,
    setup: Sequence[Composable] = (),
) -> None:
    """Run ``statements`` (each in its own transaction, committed) on ``builds`` sessions at
    once. The first failure stops the others (their statements cancelled, rolled back) and
    is raised; so is an exception of the calling thread (a timeout, a KeyboardInterrupt)."""
    run_jobs(sessions, [functools.partial(_commit, s) for s in statements], builds, setup)


def _commit(statement: Composable, conn: DatabaseConnection) -> None:
    execute(conn, statement)
    conn.commit()


def run_jobs(
    sessions: Sessions,
    jobs: Sequence[Callable[[Any], None]],
    at_once: int,
    setup: Sequence[Composable] = (),
) -> None:
    """Run ``jobs`` (each called with a session; it commits its own work), ``at_once`` at a
    time: each of ``at_once`` threads opens a session of its own (``setup``'s statements) and
    takes the queued jobs one after another.

    Stopped by the first failure, and by an exception of the calling thread (Airflow's
    ``AirflowTaskTimeout`` raised by the ``execution_timeout`` signal, a ``KeyboardInterrupt``)
    or a kill (:meth:`Sessions.stop`): every session is stopped (its running statement
    cancelled, no further statement or session), **no queued job starts**, and the running
    ones end as soon as their statement is cancelled (a statement that raced the stop is
    cancelled again: :func:`airflow_pg_bulk.db.driver.stop`); then the failure, or the
    calling thread's exception, is raised. A job that failed is rolled back."""
    pending = list(jobs)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker() -> None:
        conn = None
        try:
            conn = sessions.open(setup)
            while True:
                with lock:
                    if failures or not pending or sessions.stopped:
                        return
                    job = pending.pop(0)
                job(conn)
        except BaseException as exc:
            with lock:
                first = not failures
                failures.append(exc)
                pending.clear()
            if first:
                sessions.stop()  # the others' statements: cancelled
            if conn is not None:
                rollback_quietly(conn)
        finally:
            if conn is not None:
                sessions.close(conn)

    pool = ThreadPoolExecutor(max_workers=max(1, at_once), thread_name_prefix="pg-bulk-build")
    try:
        futures = [pool.submit(worker) for _ in range(min(max(1, at_once), len(pending)))]
        for future in futures:
            future.result()
    except BaseException:  # this thread's: a timeout, an interrupt
        with lock:
            pending.clear()  # no queued job starts
        sessions.stop()
        raise
    finally:
        pool.shutdown(wait=True)  # the running jobs end: their statements were cancelled
    if failures:
        raise failures[0]
