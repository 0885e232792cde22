"""A partitioned target's staging, one class per layout: how prepare makes it and how
finalize's route moves the staged rows into one new table per partition of the target they
go to, ``staging_partition(load_id, n)``. The layout is the plan's
:class:`~airflow_pg_bulk.plan.StagingLayout`, chosen once by
:func:`airflow_pg_bulk.plan.planning.choose_staging_layout`; :func:`layout_of` is the one
place that reads it.

- :class:`OneStagingTable`: one plain staging table shaped like the target, whatever its
  number of partitions (the daily reload of one leaf of thousands). The route finds the
  partitions the rows go to: the partition of one row, confirmed for all by the CHECK of its
  bound that staging gets as that partition's new table; else the distinct partition-key
  values in staging and the partitions the planner's partition pruning keeps for them
  (:func:`airflow_pg_bulk.target.catalog.partitions_of_rows`), and a partitioned router with
  one partition per candidate takes the rows in one ``INSERT ... SELECT`` (PostgreSQL routes
  them), its partitions that received rows detached as the new tables.
- :class:`StagingByPartition`: staging partitioned like the target, one staging partition
  per leaf (its bound, a CHECK of it, the leaf in its comment) and a DEFAULT one for rows of
  no partition; COPY routes each row once, and the route only detaches the staging
  partitions that received rows, after checking that their bounds are still the target's.

Either way a row that no partition takes fails the load, named with its file and line (read
again from the source: :func:`airflow_pg_bulk.target.violations.in_no_partition`).
"""

from __future__ import annotations

import abc
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    is_database_error,
    rollback_quietly,
    server_error,
    server_version,
)
from airflow_pg_bulk.errors import CHECK_VIOLATION, BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.target import catalog, staging, violations

#: a leaf of the target the rows may go to, as the catalog describes it
Candidate = catalog.PartitionRow
#: a partition that received rows, its new table ``staging_partition(load_id, n)`` made:
#: schema, name, bound, partition constraint
Routed = tuple[str, str, str, str | None]


class Layout(abc.ABC):
    """How a partitioned target's load is staged, in prepare and in finalize's route."""

    @abc.abstractmethod
    def partition_key(self, plan: LoadPlan) -> str | None:
        """What the staging table is partitioned by (None: a plain table)."""

    @abc.abstractmethod
    def prepare(self, conn: DatabaseConnection, plan: LoadPlan) -> None:
        """prepare, once the staging table is made: what else this layout stages with."""

    @abc.abstractmethod
    def move_rows(self, conn: DatabaseConnection, plan: LoadPlan, rows: int) -> list[Routed]:
        """finalize's route, in its transaction: the staged rows (``rows`` in the ledger) in
        one new table per partition they go to, ``staging_partition(load_id, n)``, and the
        staging table gone; returns those partitions in the order of ``n``. A row that no
        partition takes raises :class:`BadDataError` naming it (the transaction rolled
        back)."""


class OneStagingTable(Layout):
    """One plain staging table (unlogged where a plain staging would be); the route writes
    its rows again into a new table per partition."""

    def partition_key(self, plan: LoadPlan) -> str | None:
        """Not partitioned."""
        return None

    def prepare(self, conn: DatabaseConnection, plan: LoadPlan) -> None:
        """No partition of the target is read, but with ``on_error="reject"``: a CHECK that a
        row is in one of them, so that a row of no partition is set aside as COPY goes."""
        t = plan.target
        if not plan.errors.rejecting:
            return
        bounds = [row[4] for row in execute(conn, sql.leaf_partitions(t.oid))]
        if bounds and all(bounds):  # (a DEFAULT partition takes any row)
            execute(
                conn,
                sql.add_partitions_check(
                    t.schema, plan.staging_table, naming.routed_check(plan.load_id), bounds
                ),
            )

    def move_rows(self, conn: DatabaseConnection, plan: LoadPlan, rows: int) -> list[Routed]:
        """One partition: staging itself becomes its new table, with a CHECK of its bound
        (which validates every row); several: a partitioned router takes the rows
        (:func:`_split`)."""
        t = plan.target
        stage = plan.staging_table
        if not plan.staging_logged:  # a crash may have emptied it
            staging.check_rows(conn, plan, rows)
        columns = [c.name for c in t.columns]
        # the partition of one row, confirmed for all by the CHECK of its bound that the
        # staging table gets as that partition's new table (the scan that validates the
        # rows, which a load into one partition needs anyway); else every row's partition
        candidates = _one_partition(conn, plan, columns)
        alone = renamed = candidates is not None
        if candidates is None:
            names = catalog.partitions_of_rows(conn, t, stage, columns)
            candidates = execute(conn, sql.leaf_partitions(t.oid, names))
            alone = names is not None and len(candidates) == 1
        kept: list[Routed] = []
        with _naming_unrouted_rows(conn, plan, candidates):
            if alone:
                kept.append(_stage_as_the_partition(conn, plan, candidates[0], renamed))
            elif candidates:
                kept = _split(conn, plan, candidates)
        _refuse_no_partition(conn, plan, candidates, rows)
        if not alone:  # (staging became the partition's new table: nothing left to drop)
            execute(conn, sql.drop_table(t.schema, stage, if_exists=True))
        return kept


class StagingByPartition(Layout):
    """Staging partitioned like the target: COPY routes each row to its staging partition,
    and the route detaches those that received rows; nothing is written twice."""

    def partition_key(self, plan: LoadPlan) -> str | None:
        """The target's key, as the server renders it."""
        return plan.target.required_partitioning().key

    def prepare(self, conn: DatabaseConnection, plan: LoadPlan) -> None:
        """The staging partitions, in one round trip: ``router_partition(load_id, n)`` for the
        target's ``n``-th leaf (by name), with its bound, the CHECK of it (ATTACH then skips
        its scan) and, in its comment, the leaf as :func:`sql.leaf_partitions` describes it;
        and ``unrouted_partition(load_id)``, DEFAULT, unless the target has a DEFAULT
        partition of its own or its strategy takes none (HASH: every row has a partition
        when the remainders are all there)."""
        t = plan.target
        load_id = plan.load_id
        leaves = execute(conn, sql.leaf_partitions(t.oid))
        statements: list[sql.Composable] = []
        for number, (leaf_schema, name, kind, bound, constraint) in enumerate(leaves):
            table = naming.router_partition(load_id, number)
            statements.append(
                sql.create_partition_of(
                    t.schema, table, plan.staging_table, bound, logged=plan.staging_logged
                )
            )
            if constraint:
                statements.append(
                    sql.add_check(t.schema, table, naming.bound_check(load_id), constraint)
                )
            described = json.dumps([leaf_schema, name, kind, bound, constraint])
            statements.append(sql.comment_on("TABLE", sql.qualified(t.schema, table), described))
        has_default = any(bound == "DEFAULT" for _s, _n, _k, bound, _c in leaves)
        if t.required_partitioning().strategy.takes_default and not has_default:
            statements.append(
                sql.create_partition_of(
                    t.schema,
                    naming.unrouted_partition(load_id),
                    plan.staging_table,
                    "DEFAULT",
                    logged=plan.staging_logged,
                )
            )
        if statements:
            execute(conn, sql.in_one_round_trip(*statements))

    def move_rows(self, conn: DatabaseConnection, plan: LoadPlan, rows: int) -> list[Routed]:
        """The staging partitions that received rows, detached as the new tables: a row in
        the DEFAULT one fails the load; then each one's bound, as prepare read it, must still
        be its partition's (:func:`_refuse_moved`)."""
        t = plan.target
        stage = plan.staging_table
        # COPY routed the rows: the staging partitions, as prepare made them
        candidates, unrouted = _staged_partitions(conn, plan)
        kept: list[Routed] = []
        with _naming_unrouted_rows(conn, plan, candidates):
            kept = _keep_filled(conn, plan, stage, candidates, unrouted, rows)
        _refuse_no_partition(conn, plan, candidates, rows)
        _refuse_moved(conn, plan, kept)  # the bounds prepare read: still the target's?
        execute(conn, sql.drop_table(t.schema, stage, if_exists=True))
        return kept


ONE_STAGING_TABLE = OneStagingTable()
STAGING_BY_PARTITION = StagingByPartition()


def layout_of(plan: LoadPlan) -> Layout:
    """The layout of the plan's staging (:attr:`LoadPlan.staging_layout`)."""
    return STAGING_BY_PARTITION if plan.staging_layout.by_partition else ONE_STAGING_TABLE


class _CheckFailed(Exception):
    """A staged row that no partition of the target takes (in the DEFAULT partition of a
    staging partitioned like the target): :func:`_naming_unrouted_rows` names it."""


@contextmanager
def _naming_unrouted_rows(
    conn: DatabaseConnection, plan: LoadPlan, candidates: list[Candidate]
) -> Iterator[None]:
    """Around the move of the staged rows into the candidates' new tables: a row that none of
    them takes (a CHECK of a bound failed, or PostgreSQL found no partition) rolls the
    transaction back and raises the error that names it (:func:`_unrouted`)."""
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, _CheckFailed) and not (
            is_database_error(exc) and server_error(exc).sqlstate == CHECK_VIOLATION
        ):
            raise
        rollback_quietly(conn)
        raise _unrouted(conn, plan, [row[4] for row in candidates]) from exc


def _refuse_no_partition(
    conn: DatabaseConnection, plan: LoadPlan, candidates: list[Candidate], rows: int
) -> None:
    """Rows staged and no candidate partition: every key value pruned every partition."""
    if not candidates and rows:
        conn.rollback()
        raise _unrouted(conn, plan, [])


def _stage_as_the_partition(
    conn: DatabaseConnection, plan: LoadPlan, candidate: Candidate, renamed: bool
) -> Routed:
    """Staging itself becomes the new table of the one partition its rows go to, with the
    CHECK of its bound (``renamed``: :func:`_one_partition` did both)."""
    t = plan.target
    leaf_schema, name, _kind, bound, constraint = candidate
    first = naming.staging_partition(plan.load_id, 0)
    if not renamed:
        execute(conn, sql.rename_table(t.schema, plan.staging_table, first))
        if constraint:  # checks every row: one of no partition fails it
            check = naming.bound_check(plan.load_id)
            execute(conn, sql.add_check(t.schema, first, check, constraint))
    if plan.errors.rejecting:
        check = naming.routed_check(plan.load_id)
        execute(conn, sql.drop_constraint(t.schema, first, check, if_exists=True))
    return leaf_schema, name, bound, constraint


def _one_partition(
    conn: DatabaseConnection, plan: LoadPlan, columns: list[str]
) -> list[Candidate] | None:
    """When every staged row goes to the partition of the first one: that partition (as
    :func:`sql.leaf_partitions` describes it), with staging renamed to its new table and
    the CHECK of its bound added (which validated every row). None, with nothing changed
    (a savepoint undoes the rename and the CHECK that failed): the rows go to several
    partitions, or to none, or the partition's bound cannot be checked alone."""
    t = plan.target
    newest = catalog.newest_partition_of_a_row(conn, t, plan.staging_table)
    if newest is not None:
        found = [newest]
    else:  # a partition made earlier: the planner's partition pruning finds it
        guess = catalog.partition_of_a_row(conn, t, plan.staging_table, columns)
        if guess is None:
            return None
        found = execute(conn, sql.leaf_partitions(t.oid, [guess]))
        if len(found) != 1 or not found[0][4]:
            return None
    first = naming.staging_partition(plan.load_id, 0)
    try:  # one round trip
        execute(
            conn,
            sql.in_one_round_trip(
                sql.savepoint(_ALONE),
                sql.rename_table(t.schema, plan.staging_table, first),
                sql.add_check(t.schema, first, naming.bound_check(plan.load_id), found[0][4]),
                sql.release(_ALONE),
            ),
        )
    except Exception as exc:
        if not (is_database_error(exc) and server_error(exc).sqlstate == CHECK_VIOLATION):
            raise
        execute(conn, sql.rollback_to(_ALONE))
        return None
    return found


_ALONE = "pgbulk_one_partition"


def _split(conn: DatabaseConnection, plan: LoadPlan, candidates: list[Candidate]) -> list[Routed]:
    """The staged rows routed by PostgreSQL through a partitioned router with one partition
    per candidate (its bound, and a CHECK of it added while empty); the partitions that
    received rows become standalone tables ``staging_partition(load_id, n)``; returns their
    (schema, name, bound, constraint) in that order."""
    t = plan.target
    load_id = plan.load_id
    router = naming.router_table(load_id)
    key = t.required_partitioning().key
    execute(
        conn,
        sql.create_partitioned_staging(
            t.schema, router, t.table, key, server_version=server_version(conn)
        ),
    )
    for number, (_s, _n, _kind, bound, constraint) in enumerate(candidates):
        name = naming.router_partition(load_id, number)
        execute(
            conn,
            sql.create_partition_of(t.schema, name, router, bound, logged=plan.staging_logged),
        )
        if constraint:
            execute(conn, sql.add_check(t.schema, name, naming.bound_check(load_id), constraint))
    columns = [c.name for c in t.columns if not c.generated]
    execute(
        conn,
        sql.insert_from_staging(
            t.schema, router, plan.staging_table, columns, override_identity=False
        ),
    )
    kept = _keep_filled(conn, plan, router, candidates)
    execute(conn, sql.drop_table(t.schema, router))  # with the partitions that got no row
    return kept


def _keep_filled(
    conn: DatabaseConnection,
    plan: LoadPlan,
    router: str,
    candidates: list[Candidate],
    unrouted: str | None = None,
    rows: int = 0,
) -> list[Routed]:
    """The partitions ``router_partition(load_id, n)`` of ``router`` (a partitioned table
    whose ``n``-th partition takes the rows of ``candidates[n]``) that hold rows, detached
    and renamed ``staging_partition(load_id, k)`` in order; returns their (schema, name,
    bound, constraint). A staging partitioned like the target, as prepare made it: a row in
    its DEFAULT partition ``unrouted`` fails the load (:class:`_CheckFailed`), and no
    partition holding a row while the ledger records ``rows`` means a crash emptied the
    unlogged staging."""
    t = plan.target
    load_id = plan.load_id
    names = [naming.router_partition(load_id, n) for n in range(len(candidates))]
    asked = [*names, unrouted] if unrouted else names
    filled = {row[0] for row in execute(conn, sql.tables_with_rows(t.schema, asked))}
    if unrouted in filled:
        raise _CheckFailed
    if rows and not filled and not plan.staging_logged:
        staging.check_count(conn, plan, 0, rows)
    kept: list[Routed] = []
    moves: list[sql.Composable] = []
    for name, candidate in zip(names, candidates, strict=True):
        leaf_schema, leaf_name, _kind, bound, constraint = candidate
        if name in filled:
            moves.append(sql.detach_partition(t.schema, router, name))
            moves.append(
                sql.rename_table(t.schema, name, naming.staging_partition(load_id, len(kept)))
            )
            kept.append((leaf_schema, leaf_name, bound, constraint))
    if moves:
        execute(conn, sql.in_one_round_trip(*moves))
    return kept


def _staged_partitions(
    conn: DatabaseConnection, plan: LoadPlan
) -> tuple[list[Candidate], str | None]:
    """The leaves prepare made a staging partition for (:meth:`StagingByPartition.prepare`),
    read back from those partitions' comments, in the order of their numbers; and the name of
    staging's DEFAULT partition (None: it has none)."""
    t = plan.target
    found = dict(execute(conn, sql.partitions_with_comments(t.schema, plan.staging_table)))
    unrouted = naming.unrouted_partition(plan.load_id)
    candidates = []
    for number in itertools.count():
        text = found.get(naming.router_partition(plan.load_id, number))
        if text is None:
            return candidates, unrouted if unrouted in found else None
        leaf_schema, name, kind, bound, constraint = json.loads(text)
        candidates.append((leaf_schema, name, kind, bound, constraint))
    raise AssertionError("unreachable")


def _refuse_moved(conn: DatabaseConnection, plan: LoadPlan, kept: list[Routed]) -> None:
    """A staging partitioned like the target was made with the partitions' bounds as prepare
    read them: each partition that received rows must still be a partition of the target
    with that bound (one catalog query, on those partitions only)."""
    t = plan.target
    now = {
        (leaf_schema, name): (bound, constraint)
        for leaf_schema, name, _kind, bound, constraint in execute(
            conn, sql.leaf_partitions(t.oid, [(s, n) for s, n, _b, _c in kept])
        )
    }
    for leaf_schema, name, bound, constraint in kept:
        if now.get((leaf_schema, name)) != (bound, constraint):
            raise LoadRefusedError(
                f"table partition {leaf_schema}.{name} of {t.qualified} was detached or "
                "changed after prepare made this load's staging for it; nothing was swapped. "
                "Run the load again"
            )


def _unrouted(conn: DatabaseConnection, plan: LoadPlan, bounds: list[str | None]) -> BadDataError:
    """The error for a staged row that no partition of the target takes (the transaction
    rolled back: staging as COPY left it), naming the row and, read again from the source,
    its file and line."""
    t = plan.target
    constraints = [b for b in bounds if b]
    shown = execute(conn, sql.unrouted_row(t.schema, plan.staging_table, plan.columns, constraints))
    conn.rollback()
    row = shown[0][0] if shown else "?"
    return violations.in_no_partition(conn, plan, constraints, row)
