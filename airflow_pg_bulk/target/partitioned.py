"""Partitioned targets: the partition-wise finalize of ``replace_partitions``, ``replace``
and ``append``; its cost follows the partitions the load's rows go to, not the number of
partitions of the target.

prepare (:func:`create_staging`) captures the parent only (its key, columns, indexes,
constraints, grants: :func:`airflow_pg_bulk.target.catalog.capture`, a few catalog queries whatever
the number of partitions) and stages the load as the plan's
:class:`~airflow_pg_bulk.plan.StagingLayout` says (chosen once, by
:func:`airflow_pg_bulk.plan.planning.choose_staging_layout`):

- ONE plain staging table shaped like it (unlogged where a plain staging would be), whatever
  the number of partitions of the target (the daily reload of one leaf of thousands); the
  COPY tasks COPY into it, and finalize routes (writes again) its rows into a new table per
  partition they go to;
- or, for a load that brings enough rows for each of few leaves (a year into 12 months),
  staging partitioned like the target: one staging partition per leaf (its bound, a CHECK of
  it, the leaf in its comment) and a DEFAULT one for rows of no partition, made in one round
  trip. The COPY tasks COPY into its parent and PostgreSQL routes each row once; finalize's
  route detaches the staging partitions that received rows as the partitions' new tables
  (a row in the DEFAULT one fails the load, named as below); nothing is written twice.

finalize first routes the staged rows of one plain staging table (:func:`route`, one
transaction, committed; with staging partitioned like the target, only step 3 and the
detach of the staging partitions with rows):

1. the partitions they go to: the distinct partition-key values in staging, and the
   partitions the planner's partition pruning keeps for them
   (:func:`airflow_pg_bulk.target.catalog.partitions_of_rows`; every partition when the key has an
   expression or the rows have more than ``MAX_ROUTED_KEYS`` distinct key values);
2. one partition: staging itself becomes its new table, with a CHECK of the partition's
   bound (which validates every row: a row of no partition fails here); several: a
   partitioned router with one partition per candidate (bound, CHECK) takes the rows in
   one ``INSERT ... SELECT`` (PostgreSQL routes them; a row of no partition fails it), the
   partitions that received rows are detached as standalone tables, the rest dropped;
3. each of those partitions of the target is captured in full (indexes, constraints,
   grants, owner, comments), its definition kept in its new table's COMMENT, so that a
   retried finalize builds and compares against exactly what was captured.

A row that no partition takes fails the load naming its file and line (read again from the
source). Then, for each partition with rows to be swapped in:

1. its new table is made logged if the target is, and gets the partition's indexes and
   constraints (FKs ``NOT VALID`` then ``VALIDATE``) and ANALYZE
   (:func:`airflow_pg_bulk.target.build.build_on_staging`), each step committed, so that a
   retried finalize goes on where the last one stopped;

then ONE transaction, under ``lock_timeout``: the parent and the partitions swapped locked
``ACCESS EXCLUSIVE`` in short tries (:mod:`airflow_pg_bulk.target.locking`; ``DETACH PARTITION``
needs that lock on the parent); the parent's definition compared with prepare's and each
swapped partition's with the one captured in step 3 (never oids: a partition swapped by
another load in the meantime keeps its definition and changes its oid); for each,
``DETACH`` and drop the old partition, give the new table the old one's name, owner,
grants, comments and options, ``ATTACH`` it (its CHECK lets ATTACH skip the scan; the
equivalent indexes and foreign keys are adopted), drop the CHECK; the load is noted
finalized; COMMIT. Nothing in that transaction reads or writes per partition of the target
(but for ``replace``, which empties the others). finalize builds the partitions one after
another on its connection; with extra sessions (:func:`build_in_parallel`) several at once.

- ``replace_partitions``: every partition that received a row is swapped; the others are not
  touched (same relfilenode, same rows, never locked);
- ``replace``: as ``replace_partitions``, and every partition that received no row is emptied
  (TRUNCATE) in the same transaction;
- ``append``: a partition that received rows and is empty is swapped; a non-empty one gets
  the rows by ``INSERT ... SELECT`` from its new table in the same transaction (so does
  every partition when the role does not own the target or a partition cannot be swapped);
- ``upsert`` does not come here: it merges through the partitions its rows go to, in place
  (see upsert.py).

See README.md, "Partitioned targets", and docs/design.md.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
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
    execute_count,
    is_database_error,
    rollback_quietly,
    scalar,
    server_error,
    server_version,
)
from airflow_pg_bulk.db.session import Sessions, start_session
from airflow_pg_bulk.errors import BadDataError, IncompleteLoadError, LoadRefusedError
from airflow_pg_bulk.plan import LeafPartition, LoadPlan, Partitioning, TargetDefinition, planning
from airflow_pg_bulk.plan.codes import Persistence
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.target import (
    build,
    catalog,
    history,
    locking,
    parallel_builds,
    staging,
    statistics,
    swap,
    violations,
)
from airflow_pg_bulk.target.history import LedgerTotals

log = logging.getLogger(__name__)


def _parts(plan: LoadPlan) -> Partitioning:
    parts = plan.target.partitioning
    if parts is None:
        raise ValueError(f"load {plan.load_id}: {plan.target.qualified} is not partitioned")
    return parts


def partitioned_staging(plan: LoadPlan) -> bool:
    """Whether the load finalizes partition by partition (every mode but upsert on a
    partitioned target; an upsert merges through the partitions in place)."""
    return plan.target.partitioning is not None and not plan.mode.keyed


def create_staging(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """prepare: the staging table shaped like the parent (its columns and defaults; an
    identity column not loaded numbered from the target's sequence), as the plan's
    :class:`~airflow_pg_bulk.plan.StagingLayout` says:

    - one plain table (unlogged where a plain staging would be). No partition of the target
      is read (but with ``on_error="reject"``: a CHECK that a row is in one of them, so that
      a row of no partition is set aside as COPY goes): the partitions the rows go to are
      found in finalize (:func:`route`), which writes them into a new table per partition;
    - ``by_partition``: partitioned like the target, one staging partition per leaf (its
      bound, a CHECK of it added while empty, the leaf's name in its comment) and a DEFAULT
      one for rows of no partition, all made in one round trip: COPY routes every row to its
      partition as it writes it, and finalize only detaches the staging partitions that
      received rows (:func:`route`)."""
    t = plan.target
    by_partition = plan.staging_layout.by_partition
    execute(
        conn,
        sql.create_partitioned_staging(
            t.schema,
            plan.staging_table,
            t.table,
            _parts(plan).key if by_partition else None,
            server_version=server_version(conn),
            logged=plan.staging_logged,
        ),
    )
    for seq in t.sequences:
        if seq.kind == "identity" and seq.column not in plan.columns:
            # numbered from the target's sequence, as an INSERT into the target would be
            execute(
                conn,
                sql.default_from_sequence(
                    t.schema, plan.staging_table, seq.column, (seq.schema, seq.name)
                ),
            )
    if by_partition:
        _stage_by_partition(conn, plan)
    elif plan.errors.rejecting:  # a row that no partition takes is set aside as a bad row
        bounds = [row[4] for row in execute(conn, sql.leaf_partitions(t.oid))]
        if bounds and all(bounds):  # (a DEFAULT partition takes any row)
            execute(
                conn,
                sql.add_partitions_check(
                    t.schema, plan.staging_table, naming.routed_check(plan.load_id), bounds
                ),
            )


def _stage_by_partition(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """The staging partitions of a staging partitioned like the target, in one round trip:
    ``router_partition(load_id, n)`` for the target's ``n``-th leaf (by name), with its bound,
    the CHECK of it (ATTACH then skips its scan) and, in its comment, the leaf as
    :func:`sql.leaf_partitions` describes it; and ``unrouted_partition(load_id)``, DEFAULT,
    unless the target has a DEFAULT partition of its own or is hash-partitioned (no DEFAULT
    there: every row has a partition when the remainders are all there)."""
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
    if _parts(plan).strategy.takes_default and not has_default:
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


def leaf_plan(plan: LoadPlan, number: int) -> LoadPlan:
    """The plan of one leaf's build (``plan`` as :func:`route` returns it): the leaf as the
    target, its new table as staging, a load id of its own (the temporary index and
    constraint names differ per leaf)."""
    leaf = _parts(plan).leaves[number]
    return dataclasses.replace(
        plan,
        load_id=naming.leaf_load_id(plan.load_id, number),
        target=leaf.definition,
        staging_table=naming.staging_partition(plan.load_id, number),
    )


def route(conn: DatabaseConnection, plan: LoadPlan, clock: PhaseClock, rows: int) -> LoadPlan:
    """finalize's first step (see the module's docstring): the staged rows in one new table
    per partition of the target they go to, ``staging_partition(load_id, n)``, each
    partition captured; returns the plan with those partitions as the target's leaves (in
    the order of ``n``). One transaction, committed; a retried finalize finds it done (the
    staging table is gone) and reads the partitions back from their tables' comments."""
    t = plan.target
    parts = _parts(plan)
    stage = plan.staging_table
    with clock.phase("route"):
        if not scalar(conn, sql.relation_exists(t.schema, stage)):
            routed = _routed_before(conn, plan)
            conn.commit()
            return routed
        by_partition = plan.staging_layout.by_partition
        if not plan.staging_logged and not by_partition:  # a crash may have emptied it
            staging.check_rows(conn, plan, rows)
        columns = [c.name for c in t.columns]
        alone = renamed = False
        if by_partition:  # COPY routed the rows: the staging partitions, as prepare made them
            candidates, unrouted = _staged_partitions(conn, plan)
        else:
            # the partition of one row, confirmed for all by the CHECK of its bound that the
            # staging table gets as that partition's new table (the scan that validates the
            # rows, which a load into one partition needs anyway); else every row's partition
            found = _one_partition(conn, plan, columns)
            alone = renamed = found is not None
            if found is not None:
                candidates = found
            else:
                names = catalog.partitions_of_rows(conn, t, stage, columns)
                candidates = execute(conn, sql.leaf_partitions(t.oid, names))
                alone = names is not None and len(candidates) == 1
        bounds = [row[4] for row in candidates]
        kept: list[tuple[str, str, str, str | None]] = []
        try:
            if by_partition:
                kept = _keep_filled(conn, plan, stage, candidates, unrouted, rows)
            elif alone:
                # staging itself becomes the partition's new table
                leaf_schema, name, _kind, bound, constraint = candidates[0]
                first = naming.staging_partition(plan.load_id, 0)
                if not renamed:  # (_one_partition did, with the CHECK)
                    execute(conn, sql.rename_table(t.schema, stage, first))
                    if constraint:  # checks every row: one of no partition fails it
                        check = naming.bound_check(plan.load_id)
                        execute(conn, sql.add_check(t.schema, first, check, constraint))
                if plan.errors.rejecting:
                    check = naming.routed_check(plan.load_id)
                    execute(conn, sql.drop_constraint(t.schema, first, check, if_exists=True))
                kept.append((leaf_schema, name, bound, constraint))
            elif candidates:
                kept = _split(conn, plan, candidates)
        except Exception as exc:
            if not isinstance(exc, _CheckFailed) and not (
                is_database_error(exc) and server_error(exc).sqlstate == _CHECK_VIOLATION
            ):
                raise
            rollback_quietly(conn)
            raise _unrouted(conn, plan, bounds) from exc
        if not candidates and rows:  # every key value pruned every partition
            conn.rollback()
            raise _unrouted(conn, plan, [])
        if by_partition:  # the bounds prepare read: still those of the target's partitions?
            _refuse_moved(conn, plan, kept)
        # a partition loaded in place needs no definition; one swapped, its own in full
        by_name = {}
        swapped = []
        for number, (leaf_schema, name, bound, constraint) in enumerate(kept):
            table = naming.staging_partition(plan.load_id, number)
            if t.triggers or scalar(
                conn, sql.too_big_or_triggered(t.schema, table, IN_PLACE_ROWS, leaf_schema, name)
            ):
                swapped.append((leaf_schema, name))
                continue
            named = TargetDefinition(leaf_schema, name, 0, "", t.persistence, ())
            by_name[leaf_schema, name] = LeafPartition(bound, constraint, named, in_place=True)
        captured = dataclasses.replace(parts, leaves=(), unsupported=())
        if swapped:
            captured = catalog.capture_leaves(conn, t, swapped)
        by_name.update(
            ((leaf.definition.schema, leaf.definition.table), leaf) for leaf in captured.leaves
        )
        leaves = []
        for number, (leaf_schema, name, bound, constraint) in enumerate(kept):
            leaf = by_name.get((leaf_schema, name))
            if leaf is None or (leaf.bound, leaf.constraint) != (bound, constraint):
                raise LoadRefusedError(
                    f"table partition {leaf_schema}.{name} of {t.qualified} was detached or "
                    "changed while this load routed its rows to it; nothing was swapped. Run the "
                    "load again"
                )
            leaves.append(leaf)
            execute(
                conn,
                sql.comment_on(
                    "TABLE",
                    sql.qualified(t.schema, naming.staging_partition(plan.load_id, number)),
                    json.dumps(leaf.to_dict()),
                ),
            )
        if not alone:  # (staging became the partition's new table: nothing left to drop)
            execute(conn, sql.drop_table(t.schema, stage, if_exists=True))
        routed = _with_leaves(plan, tuple(leaves), captured.unsupported)
        conn.commit()
    log.info(
        "Load %s: its rows go to %d table partitions of %s (%s)",
        plan.load_id,
        len(leaves),
        t.qualified,
        ", ".join(leaf.definition.table for leaf in leaves[:5])
        + (", ..." if len(leaves) > 5 else ""),
    )
    return routed


_CHECK_VIOLATION = "23514"  # a CHECK, or "no partition of relation ... found for row"


def _one_partition(
    conn: DatabaseConnection, plan: LoadPlan, columns: list[str]
) -> list[tuple[str, str, str, str, str | None]] | None:
    """When every staged row goes to the partition of the first one: that partition (as
    :func:`sql.leaf_partitions` describes it), with staging renamed to its new table and
    the CHECK of its bound added (which validated every row). None, with nothing changed
    (a savepoint undoes the rename and the CHECK that failed): the rows go to several
    partitions, or to none, or the partition's bound cannot be checked alone."""
    t = plan.target
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
        if not (is_database_error(exc) and server_error(exc).sqlstate == _CHECK_VIOLATION):
            raise
        execute(conn, sql.rollback_to(_ALONE))
        return None
    return found


_ALONE = "pgbulk_one_partition"


def _split(
    conn: DatabaseConnection,
    plan: LoadPlan,
    candidates: list[tuple[str, str, str, str, str | None]],
) -> list[tuple[str, str, str, str | None]]:
    """The staged rows routed by PostgreSQL through a partitioned router with one partition
    per candidate (its bound, and a CHECK of it added while empty); the partitions that
    received rows become standalone tables ``staging_partition(load_id, n)``; returns their
    (schema, name, bound, constraint) in that order."""
    t = plan.target
    load_id = plan.load_id
    router = naming.router_table(load_id)
    execute(
        conn,
        sql.create_partitioned_staging(
            t.schema, router, t.table, _parts(plan).key, server_version=server_version(conn)
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
    candidates: list[tuple[str, str, str, str, str | None]],
    unrouted: str | None = None,
    rows: int = 0,
) -> list[tuple[str, str, str, str | None]]:
    """The partitions ``router_partition(load_id, n)`` of ``router`` (a partitioned table
    whose ``n``-th partition takes the rows of ``candidates[n]``) that hold rows, detached
    and renamed ``staging_partition(load_id, k)`` in order; returns their (schema, name,
    bound, constraint). A staging partitioned like the target, as prepare made it: a row in
    its DEFAULT partition ``unrouted`` fails the load (:func:`route` names it), and no
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
    kept: list[tuple[str, str, str, str | None]] = []
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


class _CheckFailed(Exception):
    """A staged row that no partition of the target takes (in the DEFAULT partition of a
    staging partitioned like the target): :func:`route` names it (:func:`_unrouted`)."""


def _staged_partitions(
    conn: DatabaseConnection, plan: LoadPlan
) -> tuple[list[tuple[str, str, str, str, str | None]], str | None]:
    """The leaves prepare made a staging partition for (:func:`_stage_by_partition`), read
    back from those partitions' comments, in the order of their numbers; and the name of
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


def _refuse_moved(
    conn: DatabaseConnection, plan: LoadPlan, kept: list[tuple[str, str, str, str | None]]
) -> None:
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


def _routed_before(conn: DatabaseConnection, plan: LoadPlan) -> LoadPlan:
    """The plan :func:`route` returned, read back from the comments of the tables it made."""
    t = plan.target
    found = execute(
        conn, sql.run_table_comments(t.schema, naming.staging_partitions_pattern(plan.load_id))
    )
    prefix = naming.staging_partition(plan.load_id, 0)[:-1]
    numbered = sorted((int(name[len(prefix) :]), text) for name, text in found)
    leaves = tuple(LeafPartition.from_dict(json.loads(text)) for _n, text in numbered)
    if [n for n, _text in numbered] != list(range(len(leaves))):
        raise IncompleteLoadError(
            f"load {plan.load_id}: its staging was routed to table partitions of {t.qualified} "
            "by an earlier attempt, but some of their tables are gone; run the whole load again"
        )
    problems = catalog.leaf_problems(t, leaves)
    return _with_leaves(plan, leaves, problems)


def _with_leaves(
    plan: LoadPlan, leaves: tuple[LeafPartition, ...], unsupported: tuple[str, ...]
) -> LoadPlan:
    parts = dataclasses.replace(_parts(plan), leaves=leaves, unsupported=unsupported)
    return dataclasses.replace(
        plan,
        target=dataclasses.replace(plan.target, partitioning=parts),
        digest=plan.digest or planning.plan_digest(plan),
    )


def _parent_fingerprint(plan: LoadPlan) -> dict[str, Any]:
    """What prepare captured of the parent (its partitions left out)."""
    t = plan.target
    bare = dataclasses.replace(_parts(plan), leaves=(), unsupported=())
    return dataclasses.replace(t, partitioning=bare).fingerprint()


def make_visible(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    totals: LedgerTotals,
    sessions: Sessions | None = None,
) -> None:
    """The partition-wise finalize of a routed load (``plan`` as :func:`route` returned it):
    with ``sessions``, the partitions to swap built side by side first
    (:func:`build_in_parallel`); then :func:`finalize_partitioned`. The server's parallel
    limits are read once, for every partition's build."""
    limits = parallel_builds.read_limits(conn)
    conn.commit()
    if sessions is not None and built_beside(plan) > 1:
        with clock.phase("build_partitions"):
            build_in_parallel(sessions, plan, side_by_side(plan), limits)
    finalize_partitioned(conn, plan, clock, totals, limits)


def finalize_partitioned(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    totals: LedgerTotals,
    limits: parallel_builds.ParallelLimits,
) -> None:
    """The partition-wise finalize (see the module's docstring); ``plan`` as :func:`route`
    returned it; ``limits``: the server's, as finalize read them."""
    t = plan.target
    rows = totals.rows
    parts = _parts(plan)
    leaves = parts.leaves
    if (
        plan.mode.swaps_table
        and parts.unsupported
        and (_to_swap(conn, plan, list(range(len(leaves)))))
    ):
        raise LoadRefusedError(
            f"{plan.mode} of the partitioned {t.qualified} refused before anything changed: "
            + "; ".join(parts.unsupported)
            + ". Its table partitions are replaced by tables built beside them, which cannot "
            "carry these over"
        )
    execute(conn, sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem))
    loaded = list(range(len(leaves)))
    with clock.phase("check"):
        if not plan.staging_logged:  # a crash may have emptied some unlogged tables
            tables = [naming.staging_partition(plan.load_id, n) for n in loaded]
            staging.check_rows(conn, plan, rows, tables)
        swapped = _to_swap(conn, plan, loaded)
        # the rows this load replaces, for the ordering rule: the partitions it swaps in
        # (replace_partitions), or the whole target (replace); checked now, before the
        # builds, and again under the lock
        replaced = _replaced_parts(plan, loaded)
        history.refuse_overwriting_newer(conn, plan, replaced)
        conn.commit()
    built = {n: _build_leaf(conn, plan, n, clock, limits) for n in swapped}
    inserted: dict[int, int] = {}  # partition: rows inserted in place
    with clock.phase("swap"):
        history.open_visible(conn, plan)
        # the ordering rule, decided here: the advisory lock serialises this transaction with
        # every other finalize of the target (an index lookup, before any table lock)
        history.refuse_overwriting_newer(conn, plan, replaced)
        in_place = [n for n in loaded if n not in built]
        emptied = [_qualified(leaves[n]) for n in in_place] if plan.mode.replaces_rows else []
        if built or plan.mode.whole_target:
            # the checks under SHARE UPDATE EXCLUSIVE on the parent (ONLY: LOCK TABLE on a
            # partitioned table would lock every partition too, one by one, and wait for an
            # autovacuum on any of them) and on the partitions swapped: no reader waits for it,
            # it keeps DDL and autovacuum off. Then ACCESS EXCLUSIVE (DETACH needs it), taken
            # in short tries, on the parent FIRST and then on the partitions swapped or
            # emptied: a reader locks the parent and then the partitions it reads, so a
            # partition locked before the parent holds up a reader that holds the parent, and
            # the parent's lock would never be granted (seen: 30 s of tries, then the load
            # failed, with autovacuum working on the partitions)
            swapped = [_qualified(leaves[n]) for n in built]
            execute(
                conn, sql.lock_tables([(t.schema, t.table)], "SHARE UPDATE EXCLUSIVE", only=True)
            )
            # a replace empties the other partitions that hold rows: locked as the swapped
            # ones (a TRUNCATE under the parent's ACCESS EXCLUSIVE waited for the autovacuum
            # of such a partition until deadlock_timeout, 1 s, and readers with it); the parent's
            # SHARE UPDATE EXCLUSIVE keeps partitions from being attached or detached meanwhile
            others = _others_with_rows(conn, plan) if plan.mode.whole_target else []
            if swapped or others:
                execute(conn, sql.lock_tables([*swapped, *others], "SHARE UPDATE EXCLUSIVE"))
            now = catalog.capture(conn, t.schema, t.table)  # pins search_path for the swap
            if now.fingerprint() != _parent_fingerprint(plan):
                raise LoadRefusedError(
                    f"the definition of {t.qualified} changed between prepare and finalize "
                    "(columns, indexes, constraints, grants, owner or comments); nothing was "
                    "swapped. Run the load again"
                )
            _refuse_changed_leaves(conn, plan, now, [leaves[n] for n in built])
            locking.lock_for_swap(
                conn, [(t.schema, t.table), *swapped, *emptied, *others], only=True
            )
        elif emptied:
            # in place alone (the daily reload): the parent is not locked beyond ROW EXCLUSIVE,
            # readers of the other partitions are not held up (a replace_partitions empties
            # each such partition first: ACCESS EXCLUSIVE on it, its own readers wait)
            locking.lock_for_swap(conn, emptied)
        for n in in_place:
            if plan.mode.replaces_rows:
                execute(conn, sql.truncate(*_qualified(leaves[n])))
            inserted[n] = _insert_leaf(conn, plan, n)
        for n, names in built.items():
            if not plan.mode.replaces_rows and scalar(
                conn, sql.has_rows(t.schema, leaves[n].definition.table)
            ):  # rows came in since finalize looked: append in place after all
                inserted[n] = _insert_leaf(conn, plan, n)
            else:
                _swap_leaf(conn, plan, n, leaves[n], *names)
        if plan.mode.whole_target:  # (reads the names of every partition, under the lock)
            mine = {(leaf.definition.schema, leaf.definition.table) for leaf in leaves}
            for leaf_schema, name in execute(conn, sql.leaf_names(t.oid)):
                # (an empty partition is not truncated: readers wait for each TRUNCATE)
                if (leaf_schema, name) not in mine and scalar(
                    conn, sql.has_rows(leaf_schema, name)
                ):
                    execute(conn, sql.truncate(leaf_schema, name))
        history.close_visible(conn, plan, totals, replaced)
    if inserted:  # each when it pays (a replace's: always)
        statistics.after_partitions_in_place(
            conn,
            plan,
            clock,
            [
                (*_qualified(leaves[n]), None if plan.mode.replaces_rows else rows)
                for n, rows in inserted.items()
            ],
        )
    log.info(
        "Load %s: %s into %s: %d table partitions received rows; %d swapped in by ATTACH "
        "PARTITION, %d loaded in place%s",
        plan.load_id,
        plan.mode,
        t.qualified,
        len(loaded),
        len(loaded) - len(inserted),
        len(inserted),
        ", the others emptied" if plan.mode.whole_target else "",
    )


def _others_with_rows(conn: DatabaseConnection, plan: LoadPlan) -> list[tuple[str, str]]:
    """The target's partitions that this load does not load and that hold rows (a replace
    empties them)."""
    t = plan.target
    mine = {_qualified(leaf) for leaf in _parts(plan).leaves}
    return [
        (leaf_schema, name)
        for leaf_schema, name in execute(conn, sql.leaf_names(t.oid))
        if (leaf_schema, name) not in mine and scalar(conn, sql.has_rows(leaf_schema, name))
    ]


def _replaced_parts(plan: LoadPlan, loaded: list[int]) -> list[str] | None:
    """The partitions (leaf table names) whose rows a ``replace_partitions`` replaces: those
    that receive rows; None for the other modes (a replace replaces the whole target)."""
    if not plan.mode.replaces_loaded_partitions:
        return None
    leaves = _parts(plan).leaves
    return [leaves[n].definition.table for n in loaded]


def _refuse_changed_leaves(
    conn: DatabaseConnection, plan: LoadPlan, parent: TargetDefinition, swapped: list[LeafPartition]
) -> None:
    """Under the swap's lock: each partition to swap is still a partition of the target,
    with the bound and definition its new table was built for (its oid aside: another load
    may have swapped it since, keeping its definition)."""
    if not swapped:
        return
    now = catalog.capture_leaves(
        conn, parent, [(leaf.definition.schema, leaf.definition.table) for leaf in swapped]
    )
    current = {(leaf.definition.schema, leaf.definition.table): leaf for leaf in now.leaves}
    for leaf in swapped:
        d = leaf.definition
        found = current.get((d.schema, d.table))
        if (
            found is None
            or (found.bound, found.constraint) != (leaf.bound, leaf.constraint)
            or found.definition.fingerprint() != d.fingerprint()
        ):
            raise LoadRefusedError(
                f"table partition {d.qualified} of {plan.target.qualified} was detached, or its "
                "definition changed (indexes, constraints, grants, owner or comments), "
                "between the build of its new table and the swap; nothing was swapped. Run "
                "the load again"
            )


#: at most this many partitions are built at once by finalize's extra sessions
MAX_SIDE_BY_SIDE = 8


def built_beside(plan: LoadPlan) -> int:
    """How many partitions a routed load (:func:`route`) builds beside the target (not loaded
    in place)."""
    return sum(not leaf.in_place for leaf in _parts(plan).leaves)


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
    ``plan`` as :func:`route` returned it; ``limits``: the server's, as finalize read them.

    A kill or timeout (:func:`airflow_pg_bulk.target.parallel_builds.run_jobs`) cancels the
    running builds and starts none of those still queued.
    Returns the seconds taken (0: nothing to build side by side: fewer than two partitions,
    or the load finalized)."""
    if not partitioned_staging(plan) or jobs < 2:
        return 0.0
    started = time.perf_counter()
    with _session(sessions.open, plan, "build") as conn:
        if any(row[0] == sql.FINALIZED for row in execute(conn, _ledger(plan))):
            return 0.0
        swapped = _to_swap(conn, plan, list(range(len(_parts(plan).leaves))))
        conn.commit()
    if len(swapped) < 2:
        return 0.0

    workers = min(jobs, len(swapped))

    # each leaf's ANALYZE too, in its build (finalize then finds it built and analyzed, and
    # skips both: build.build_on_staging)
    def build(number: int, conn: DatabaseConnection) -> None:
        try:
            _build_leaf(conn, plan, number, PhaseClock(), limits, alongside=workers)
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


def _insert_leaf(conn: DatabaseConnection, plan: LoadPlan, number: int) -> int:
    """Insert a partition's staged rows in place, through the parent (they go to the same
    partition; the role needs INSERT on the parent only, as for a plain append): every
    column but the generated ones, as staging holds them (an identity column not loaded was
    numbered from the target's sequence there). Returns the rows inserted."""
    t = plan.target
    columns = [c.name for c in t.columns if not c.generated]
    return execute_count(
        conn,
        sql.insert_from_staging(
            t.schema,
            t.table,
            naming.staging_partition(plan.load_id, number),
            columns,
            override_identity=staging.overrides_identity(t, columns),
        ),
    )


#: a partition that receives at most this many rows is loaded in place (a replace empties it
#: first, in the same transaction) rather than built beside it and swapped in: at this size
#: the swap's fixed costs (indexes, constraints, ANALYZE of a new table, DETACH and ATTACH,
#: which take ACCESS EXCLUSIVE on the parent) outweigh inserting the rows with their index
#: entries and foreign-key checks; and no reader of another partition waits at all
IN_PLACE_ROWS = 10_000


def _qualified(leaf: LeafPartition) -> tuple[str, str]:
    return leaf.definition.schema, leaf.definition.table


def _to_swap(conn: DatabaseConnection, plan: LoadPlan, loaded: list[int]) -> list[int]:
    """The loaded leaves to build and swap in: for a replace, those not loaded in place (more
    than :data:`IN_PLACE_ROWS` rows, or a trigger that an INSERT would fire and a swap does
    not: decided by :func:`route`); for an append, of those, the empty ones, when the role
    owns the target and nothing stands in the way of a swap."""
    parts = _parts(plan)
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


def _build_leaf(
    conn: DatabaseConnection,
    plan: LoadPlan,
    number: int,
    clock: PhaseClock,
    limits: parallel_builds.ParallelLimits,
    alongside: int = 1,
) -> tuple[dict[str, str], dict[str, str]]:
    """Build on a partition's new table what the partition has, then ANALYZE it; each step
    commits and a retry skips what is done. Returns the temporary index and constraint names.
    ``alongside``: partitions built at once (they share the server's parallel workers)."""
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


def _swap_leaf(
    conn: DatabaseConnection,
    plan: LoadPlan,
    number: int,
    leaf: LeafPartition,
    index_names: dict[str, str],
    constraint_names: dict[str, str],
) -> None:
    """In the swap's transaction: the built table takes the place of one partition."""
    t = plan.target
    d = leaf.definition
    stage = naming.staging_partition(plan.load_id, number)
    # the columns as the partition had them (the staging partition took its parent's
    # defaults, e.g. an identity column's nextval() on the target's sequence, and none of its
    # own statistics targets, storage or options); an identity inherited from the parent
    # (PostgreSQL 17+) comes back with ATTACH
    former = execute(conn, sql.column_settings(t.schema, d.table))
    execute(conn, sql.detach_partition(t.schema, t.table, d.table))
    execute(conn, sql.drop_table(t.schema, d.table))
    execute(conn, sql.rename_table(t.schema, stage, d.table))
    for original, temp in constraint_names.items():
        execute(conn, sql.rename_constraint(t.schema, d.table, temp, original))
    for index in d.indexes:
        if index.constraint is None:
            execute(conn, sql.rename_index(t.schema, index_names[index.name], index.name))
    if d.owner != scalar(conn, sql.current_user()):
        execute(conn, sql.set_owner(t.schema, d.table, d.owner))
    if d.comment is None:  # (its comment held the partition's definition: see route)
        execute(conn, sql.comment_on("TABLE", sql.qualified(t.schema, d.table), None))
    swap.restore_properties(conn, d, triggers=False)
    swap.restore_columns(conn, t.schema, d.table, former)
    execute(conn, sql.attach_partition(t.schema, t.table, d.table, leaf.bound))
    if leaf.constraint:
        execute(conn, sql.drop_constraint(t.schema, d.table, naming.bound_check(plan.load_id)))
