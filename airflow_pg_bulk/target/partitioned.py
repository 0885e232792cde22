"""Partitioned targets: the partition-wise finalize of ``replace_partitions``, ``replace``
and ``append``; its cost follows the partitions the load's rows go to, not the number of
partitions of the target.

prepare (:func:`create_staging`) captures the parent only (its key and strategy, columns, indexes,
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
another on its connection; with extra sessions
(:func:`~airflow_pg_bulk.target.partition_builds.build_in_parallel`) several at once.

A partition that receives few rows (at most ``IN_PLACE_ROWS``) and fires no trigger is
loaded in place instead, in that same transaction, and nothing more is captured of it: a
replace deletes its rows whose primary key is not staged and MERGEs the staged ones
(``LeafPartition.replace_key``: no TRUNCATE, no foreign-key check of a row that keeps its
key, no lock its readers wait for), or, without a usable key, empties it (TRUNCATE) and
inserts them through the parent; an append inserts them through the parent.

- ``replace_partitions``: every partition that received a row is swapped or replaced in place;
  the others are not touched (same relfilenode, same rows, never locked);
- ``replace``: as ``replace_partitions``, and every partition that received no row is emptied
  (TRUNCATE) in the same transaction;
- ``append``: a partition that received rows and is empty is swapped; a non-empty one gets
  the rows by ``INSERT ... SELECT`` from its new table in the same transaction (so does
  every partition when the role does not own the target or a partition cannot be swapped);
- ``upsert`` does not come here: it merges through the partitions its rows go to, in place
  (see upsert.py).

This module runs the steps; each job has a module of its own:
:mod:`~airflow_pg_bulk.target.partition_staging` (the two staging layouts: prepare's staging
and the route's move of its rows), :mod:`~airflow_pg_bulk.target.partition_builds` (which
partitions are built beside the target, and their builds, side by side or one after
another), :mod:`~airflow_pg_bulk.target.partition_checks` (what is compared before and under
the swap's lock).

See README.md, "Partitioned targets", and docs/design.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    execute_count,
    execute_each_outside_transaction,
    execute_outside_transaction,
    execute_then_commit,
    is_database_error,
    scalar,
    server_error,
    server_version,
)
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.errors import CARDINALITY_VIOLATION, IncompleteLoadError, LoadRefusedError
from airflow_pg_bulk.plan import LeafPartition, LoadPlan, TargetDefinition, planning
from airflow_pg_bulk.plan.codes import Identity
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.target import (
    catalog,
    history,
    locking,
    parallel_builds,
    partition_builds,
    partition_checks,
    partition_staging,
    staging,
    statistics,
    swap,
)
from airflow_pg_bulk.target.history import LedgerTotals

log = logging.getLogger(__name__)


def partitioned_staging(plan: LoadPlan) -> bool:
    """Whether the load finalizes partition by partition (every mode but upsert on a
    partitioned target; an upsert merges through the partitions in place)."""
    return plan.target.partitioning is not None and not plan.mode.keyed


def create_staging(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """prepare: the staging table shaped like the parent (its columns and defaults; an
    identity column not loaded numbered from the target's sequence), as the plan's
    :class:`~airflow_pg_bulk.plan.StagingLayout` says
    (:mod:`airflow_pg_bulk.target.partition_staging`):

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
    layout = partition_staging.layout_of(plan)
    execute(
        conn,
        sql.create_partitioned_staging(
            t.schema,
            plan.staging_table,
            t.table,
            layout.partition_key(plan),
            server_version=server_version(conn),
            logged=plan.staging_logged,
        ),
    )
    for seq in t.sequences:
        if seq.kind.of_identity_column and seq.column not in plan.columns:
            # numbered from the target's sequence, as an INSERT into the target would be
            execute(
                conn,
                sql.default_from_sequence(
                    t.schema, plan.staging_table, seq.column, (seq.schema, seq.name)
                ),
            )
    layout.prepare(conn, plan)


def route(
    conn: DatabaseConnection, plan: LoadPlan, clock: PhaseClock, totals: LedgerTotals
) -> LoadPlan:
    """finalize's first step (see the module's docstring): the staged rows in one new table
    per partition of the target they go to, ``staging_partition(load_id, n)``, by the
    staging's layout (:meth:`~airflow_pg_bulk.target.partition_staging.Layout.move_rows`),
    each partition captured; returns the plan with those partitions as the target's leaves
    (in the order of ``n``). One transaction, committed; a retried finalize finds it done
    (the staging table is gone: as ``totals`` found it, when they looked) and reads the
    partitions back from their tables' comments."""
    t = plan.target
    rows = totals.rows
    with clock.phase("route"):
        staged = totals.staging_exists
        if staged is None:
            staged = scalar(conn, sql.relation_exists(t.schema, plan.staging_table))
        if not staged:
            routed = _routed_before(conn, plan)
            conn.commit()
            return routed
        kept = partition_staging.layout_of(plan).move_rows(conn, plan, rows)
        leaves, unsupported = _capture_routed(conn, plan, kept, rows)
        routed = _with_leaves(plan, leaves, unsupported)
        # each new table's COMMENT and the COMMIT: one round trip
        comments = [
            sql.comment_on(
                "TABLE",
                sql.qualified(t.schema, naming.staging_partition(plan.load_id, number)),
                json.dumps(leaf.to_dict()),
            )
            for number, leaf in enumerate(leaves)
        ]
        if comments:
            execute_then_commit(conn, sql.in_one_round_trip(*comments))
        else:
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


def _capture_routed(
    conn: DatabaseConnection, plan: LoadPlan, kept: list[partition_staging.Routed], rows: int
) -> tuple[tuple[LeafPartition, ...], tuple[str, ...]]:
    """The partitions that received rows (``kept``, each with its new table; ``rows`` in all,
    the ledger's): which are loaded in place (at most :data:`IN_PLACE_ROWS` rows, no
    trigger; a replace's by its primary key where it can), each other one captured in full;
    returns them in order and what a partition-wise load cannot carry over for them.
    (:func:`route` keeps each one's definition in its new table's COMMENT, so that a retried
    finalize builds and compares against exactly what was captured.)"""
    t = plan.target
    # a partition loaded in place needs no definition; one swapped, its own in full
    by_name = {}
    swapped = []
    by_key = plan.mode.replaces_rows and server_version(conn) >= 150000  # (MERGE)
    for number, (leaf_schema, name, bound, constraint) in enumerate(kept):
        table = naming.staging_partition(plan.load_id, number)
        if t.triggers:
            swapped.append((leaf_schema, name))
            continue
        # (the rows of a load into one partition are all its: not counted again, and more
        # than IN_PLACE_ROWS of them swap it, whatever the rest would say)
        alone = rows if len(kept) == 1 else None
        if alone is not None and alone > IN_PLACE_ROWS:
            swapped.append((leaf_schema, name))
            continue
        ((too_big, key),) = execute(
            conn, sql.in_place_check(t.schema, table, IN_PLACE_ROWS, leaf_schema, name, alone)
        )
        if too_big:
            swapped.append((leaf_schema, name))
            continue
        named = TargetDefinition(leaf_schema, name, 0, "", t.persistence, ())
        by_name[leaf_schema, name] = LeafPartition(
            bound,
            constraint,
            named,
            in_place=True,
            replace_key=_replace_key(t, key) if by_key else (),
        )
    unsupported: tuple[str, ...] = ()
    if swapped:
        captured = catalog.capture_leaves(conn, t, swapped)
        by_name.update((leaf.schema_and_name, leaf) for leaf in captured.leaves)
        unsupported = captured.unsupported
    leaves = []
    for leaf_schema, name, bound, constraint in kept:
        leaf = by_name.get((leaf_schema, name))
        if leaf is None or (leaf.bound, leaf.constraint) != (bound, constraint):
            raise LoadRefusedError(
                f"table partition {leaf_schema}.{name} of {t.qualified} was detached or "
                "changed while this load routed its rows to it; nothing was swapped. Run the "
                "load again"
            )
        leaves.append(leaf)
    return tuple(leaves), unsupported


def _replace_key(target: TargetDefinition, key: Sequence[str] | None) -> tuple[str, ...]:
    """The key by which a partition loaded in place has its rows replaced
    (:attr:`LeafPartition.replace_key`): its primary key as :func:`sql.replace_key` read it,
    when the MERGE can set every other loaded column (none is a ``GENERATED ALWAYS``
    identity, which an UPDATE cannot set) and no key column is generated; else none."""
    if not key:
        return ()
    loaded = [c for c in target.columns if not c.generated]
    names = {c.name for c in loaded}
    if any(k not in names for k in key):
        return ()
    if any(c.identity == Identity.ALWAYS and c.name not in key for c in loaded):
        return ()
    return tuple(key)


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
    parts = dataclasses.replace(
        plan.target.required_partitioning(), leaves=leaves, unsupported=unsupported
    )
    return dataclasses.replace(
        plan,
        target=dataclasses.replace(plan.target, partitioning=parts),
        digest=plan.digest or planning.plan_digest(plan),
    )


def make_visible(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    totals: LedgerTotals,
    sessions: Sessions | None = None,
) -> None:
    """The partition-wise finalize of a routed load (``plan`` as :func:`route` returned it):
    with ``sessions``, the partitions to swap built side by side first
    (:func:`~airflow_pg_bulk.target.partition_builds.build_in_parallel`); then
    :func:`finalize_partitioned`. The server's parallel limits are read once, for every
    partition's build, and only when something is built (a load in place builds nothing)."""
    limits = None
    if sessions is not None and partition_builds.built_beside(plan) > 1:
        limits = parallel_builds.read_limits(conn)
        conn.commit()
        with clock.phase("build_partitions"):
            partition_builds.build_in_parallel(
                sessions, plan, partition_builds.side_by_side(plan), limits
            )
    finalize_partitioned(conn, plan, clock, totals, limits)


def finalize_partitioned(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    totals: LedgerTotals,
    limits: parallel_builds.ParallelLimits | None,
) -> None:
    """The partition-wise finalize (see the module's docstring); ``plan`` as :func:`route`
    returned it; ``limits``: the server's, as finalize read them, or None when not read yet
    (read here then, only if a partition is built)."""
    t = plan.target
    rows = totals.rows
    parts = plan.target.required_partitioning()
    leaves = parts.leaves
    if (
        plan.mode.swaps_table
        and parts.unsupported
        and (partition_builds.to_swap(conn, plan, list(range(len(leaves)))))
    ):
        raise LoadRefusedError(
            f"{plan.mode} of the partitioned {t.qualified} refused before anything changed: "
            + "; ".join(parts.unsupported)
            + ". Its table partitions are replaced by tables built beside them, which cannot "
            "carry these over"
        )
    loaded = list(range(len(leaves)))
    with clock.phase("check"):
        if not plan.staging_logged:  # a crash may have emptied some unlogged tables
            tables = [naming.staging_partition(plan.load_id, n) for n in loaded]
            staging.check_rows(conn, plan, rows, tables)
        swapped = partition_builds.to_swap(conn, plan, loaded)
        # the rows this load replaces, for the ordering rule: the partitions it swaps in
        # (replace_partitions), or the whole target (replace); checked now, before the
        # builds, and again under the lock
        replaced = partition_checks.replaced_parts(plan, loaded)
        history.refuse_overwriting_newer(conn, plan, replaced)
    # (reads: committed before the builds, or, when nothing is built, by the swap's
    # transaction, which they open)
    built: dict[int, tuple[dict[str, str], dict[str, str]]] = {}
    if swapped:
        # only what is built reads these: index builds and constraint validations use
        # maintenance_work_mem, the builds' sizing the server's parallel limits; a load
        # in place builds nothing
        # (in autocommit, one round trip, when no transaction is open)
        memory = sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem)
        if limits is None:
            _set, (row,) = execute_each_outside_transaction(conn, [memory, sql.parallel_limits()])
            limits = parallel_builds.ParallelLimits(*row)
        else:
            execute_outside_transaction(conn, memory)
        built = {n: partition_builds.build_leaf(conn, plan, n, clock, limits) for n in swapped}
    # partition: rows inserted in place (None: replaced by key, not counted; a replace's
    # statistics do not need them)
    inserted: dict[int, int | None] = {}
    with clock.phase("swap"):
        # the transaction that makes the rows visible, opened by its first statements, which
        # go with the next round trip's, whichever it is
        opening = history.opening(plan)

        def opened(*statements: sql.Composable) -> list[sql.Composable]:
            """The opening, unless sent already, then ``statements``."""
            first = [*opening, *statements]
            opening.clear()
            return first

        if history.orders_runs(plan):
            # the ordering rule, decided here: the advisory lock serialises this transaction
            # with every other finalize of the target (an index lookup, before any table lock)
            execute(conn, sql.in_one_round_trip(*opened()))
            history.refuse_overwriting_newer(conn, plan, replaced)
        in_place = [n for n in loaded if n not in built]
        emptied = [leaves[n].schema_and_name for n in in_place] if plan.mode.replaces_rows else []
        changes: dict[int, list[sql.Composable]] = {}  # a partition swapped: its statements
        if built or plan.mode.whole_target:
            # the checks under SHARE UPDATE EXCLUSIVE on the parent (ONLY: LOCK TABLE on a
            # partitioned table would lock every partition too, one by one, and wait for an
            # autovacuum on any of them) and on the partitions swapped or emptied: no reader
            # waits for it, it keeps DDL and autovacuum off. Then ACCESS EXCLUSIVE (DETACH
            # needs it), taken in short tries, on the parent FIRST and then on the partitions
            # swapped or emptied: a reader locks the parent and then the partitions it reads,
            # so a partition locked before the parent holds up a reader that holds the parent,
            # and the parent's lock would never be granted (seen: 30 s of tries, then the load
            # failed, with autovacuum working on the partitions)
            swapped = [leaves[n].schema_and_name for n in built]
            parent = sql.lock_tables([(t.schema, t.table)], "SHARE UPDATE EXCLUSIVE", only=True)
            if plan.mode.whole_target:
                # a replace empties the other partitions that hold rows: locked as the swapped
                # ones (a TRUNCATE under the parent's ACCESS EXCLUSIVE waited for the autovacuum
                # of such a partition until deadlock_timeout, 1 s, and readers with it); the
                # parent's SHARE UPDATE EXCLUSIVE keeps partitions from being attached or
                # detached meanwhile
                execute(conn, sql.in_one_round_trip(*opened(parent)))
                others = partition_checks.others_with_rows(conn, plan)
                locked = [*swapped, *emptied, *others]
                if locked:
                    execute(conn, sql.lock_tables(locked, "SHARE UPDATE EXCLUSIVE"))
            else:  # the parent, then the partitions, in that order: one round trip
                others = []
                execute(
                    conn,
                    sql.in_one_round_trip(
                        *opened(
                            parent, sql.lock_tables([*swapped, *emptied], "SHARE UPDATE EXCLUSIVE")
                        )
                    ),
                )
            # the parent (its capture pins search_path for the swap) and, in its round trip,
            # the partitions swapped as the catalog has them now, each captured in full, and
            # what their swaps read (which the lock keeps as read)
            leaf_reads = catalog.leaf_queries(swapped)
            swap_reads = _swap_reads(plan, list(built))
            now, found = catalog.capture_with(
                conn,
                t.schema,
                t.table,
                lambda oid, _p: [sql.leaf_partitions(oid, swapped), *leaf_reads, *swap_reads],
                partitioned=True,
            )
            if partition_checks.parent_fingerprint(now) != partition_checks.parent_fingerprint(t):
                raise LoadRefusedError(
                    f"the definition of {t.qualified} changed between prepare and finalize "
                    "(columns, indexes, constraints, grants, owner or comments); nothing was "
                    "swapped. Run the load again"
                )
            leaf_rows = found[1 : 1 + len(leaf_reads)]
            partition_checks.refuse_changed_leaves(
                conn, plan, now, [leaves[n] for n in built], found=found[0], read=leaf_rows
            )
            ((user,),), *settings = found[1 + len(leaf_reads) :]
            changes = {
                n: _swap_statements(plan, n, leaves[n], *names, settings[2 * k : 2 * k + 2], user)
                for k, (n, names) in enumerate(built.items())
            }
            locking.lock_for_swap(
                conn,
                [(t.schema, t.table), *swapped, *emptied, *others],
                only=True,
                share_update_held=True,
            )
        elif emptied:
            # in place alone (the daily reload): the parent is not locked beyond ROW EXCLUSIVE,
            # readers of the other partitions are not held up; a partition replaced by key
            # neither (ROW EXCLUSIVE: its own readers read the rows it had until the commit),
            # one emptied by TRUNCATE takes ACCESS EXCLUSIVE on it, and its readers wait
            truncated = [leaves[n].schema_and_name for n in in_place if not leaves[n].replace_key]
            if truncated:
                if opening:
                    execute(conn, sql.in_one_round_trip(*opened()))
                locking.lock_for_swap(conn, truncated)
        for n in in_place:
            if plan.mode.replaces_rows and leaves[n].replace_key:
                inserted[n] = _replace_leaf_by_key(conn, plan, n, after=opened())
                continue
            # (a replace empties it first, in the same round trip)
            emptying = [sql.truncate(*leaves[n].schema_and_name)] if plan.mode.replaces_rows else []
            inserted[n] = _insert_leaf(conn, plan, n, after=opened(*emptying))
        swaps: list[sql.Composable] = []  # sent with the load's note in the history
        for n in built:  # (the transaction is open: built, the checks above opened it)
            if not plan.mode.replaces_rows and scalar(
                conn, sql.has_rows(t.schema, leaves[n].definition.table)
            ):  # rows came in since finalize looked: append in place after all
                inserted[n] = _insert_leaf(conn, plan, n)
            else:
                swaps += changes[n]
        if plan.mode.whole_target:  # (reads the names of every partition, under the lock)
            mine = {(leaf.definition.schema, leaf.definition.table) for leaf in leaves}
            for leaf_schema, name in execute(conn, sql.leaf_names(t.oid)):
                # (an empty partition is not truncated: readers wait for each TRUNCATE)
                if (leaf_schema, name) not in mine and scalar(
                    conn, sql.has_rows(leaf_schema, name)
                ):
                    execute(conn, sql.truncate(leaf_schema, name))
        history.close_visible(conn, plan, totals, replaced, before=opened(*swaps))
    if inserted:  # each when it pays (a replace's: always)
        statistics.after_partitions_in_place(
            conn,
            plan,
            clock,
            [
                (*leaves[n].schema_and_name, None if plan.mode.replaces_rows else rows)
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


def _insert_leaf(
    conn: DatabaseConnection, plan: LoadPlan, number: int, after: Sequence[sql.Composable] = ()
) -> int:
    """Insert a partition's staged rows in place, through the parent (they go to the same
    partition; the role needs INSERT on the parent only, as for a plain append): every
    column but the generated ones, as staging holds them (an identity column not loaded was
    numbered from the target's sequence there). Returns the rows inserted. ``after``:
    statements to run first, in the same round trip."""
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
        after=after,
    )


def _replace_leaf_by_key(
    conn: DatabaseConnection, plan: LoadPlan, number: int, after: Sequence[sql.Composable] = ()
) -> int | None:
    """Replace a partition's rows in place by its staged ones, matched by its primary key
    (:func:`sql.replace_by_key`: no TRUNCATE, and no foreign-key check of a row that keeps
    its key); returns None (the rows are not counted: from PostgreSQL 17 one MERGE also
    deletes), or the rows inserted when it falls back to inserting. Two staged rows with a
    key the partition holds: the savepoint taken before is rolled back to, and the partition
    is emptied and the rows inserted as without a key, so that the load fails with the
    unique violation (and the source line) it always gave. ``after``: statements to run
    first, in the same round trip (before the savepoint)."""
    t = plan.target
    leaf = t.required_partitioning().leaves[number]
    columns = [c.name for c in t.columns if not c.generated]
    *first, merge = sql.replace_by_key(
        leaf.schema_and_name,
        (t.schema, naming.staging_partition(plan.load_id, number)),
        columns,
        leaf.replace_key,
        override_identity=staging.overrides_identity(t, columns),
        server_version=server_version(conn),
    )
    try:
        execute_count(conn, merge, after=[*after, sql.savepoint(_BY_KEY), *first])
        return None
    except Exception as exc:
        if not (is_database_error(exc) and server_error(exc).sqlstate == CARDINALITY_VIOLATION):
            raise
    execute(conn, sql.rollback_to(_BY_KEY))
    log.info(
        "Load %s: two staged rows of %s.%s have one key it holds; emptying it and inserting "
        "them instead, to find the duplicate",
        plan.load_id,
        *leaf.schema_and_name,
    )
    locking.lock_for_swap(conn, [leaf.schema_and_name])
    return _insert_leaf(conn, plan, number, after=[sql.truncate(*leaf.schema_and_name)])


_BY_KEY = "pgbulk_by_key"

#: a partition that receives at most this many rows is loaded in place (a replace empties it
#: first, in the same transaction) rather than built beside it and swapped in: at this size
#: the swap's fixed costs (indexes, constraints, ANALYZE of a new table, DETACH and ATTACH,
#: which take ACCESS EXCLUSIVE on the parent) outweigh inserting the rows with their index
#: entries and foreign-key checks; and no reader of another partition waits at all
IN_PLACE_ROWS = 10_000


def _swap_reads(plan: LoadPlan, numbers: list[int]) -> list[sql.Composable]:
    """What the swaps of the partitions ``numbers`` read (for :func:`_swap_statements`), in
    the round trip of the checks under the lock: the session's role, then for each, the
    settings of the partition's columns and of its new table's."""
    t = plan.target
    leaves = t.required_partitioning().leaves
    return [
        sql.current_user(),
        *(
            query
            for n in numbers
            for query in (
                sql.column_settings(t.schema, leaves[n].definition.table),
                sql.column_settings(t.schema, naming.staging_partition(plan.load_id, n)),
            )
        ),
    ]


def _swap_statements(
    plan: LoadPlan,
    number: int,
    leaf: LeafPartition,
    index_names: dict[str, str],
    constraint_names: dict[str, str],
    settings: list[list[tuple]],
    user: str,
) -> list[sql.Composable]:
    """In the swap's transaction: the statements by which the built table takes the place of
    one partition (DETACH, DROP, renames, its properties, column settings, ATTACH), sent with
    the load's note in the history (one round trip for all on psycopg 3). ``settings``: the
    rows of :func:`sql.column_settings` of the partition and of its new table, and ``user``
    the session's role (:func:`_swap_reads`)."""
    t = plan.target
    d = leaf.definition
    stage = naming.staging_partition(plan.load_id, number)
    # the columns as the partition had them (the staging partition took its parent's
    # defaults, e.g. an identity column's nextval() on the target's sequence, and none of its
    # own statistics targets, storage or options); an identity inherited from the parent
    # (PostgreSQL 17+) comes back with ATTACH
    former, built = settings
    statements = [
        sql.detach_partition(t.schema, t.table, d.table),
        sql.drop_table(t.schema, d.table),
        sql.rename_table(t.schema, stage, d.table),
    ]
    statements += [
        sql.rename_constraint(t.schema, d.table, temp, original)
        for original, temp in constraint_names.items()
    ]
    statements += [
        sql.rename_index(t.schema, index_names[index.name], index.name)
        for index in d.indexes
        if index.constraint is None
    ]
    if d.owner != user:
        statements.append(sql.set_owner(t.schema, d.table, d.owner))
    if d.comment is None:  # (its comment held the partition's definition: see route)
        statements.append(sql.comment_on("TABLE", sql.qualified(t.schema, d.table), None))
    statements += swap.property_statements(d, triggers=False)
    statements += swap.column_statements(t.schema, d.table, built, former)
    statements.append(sql.attach_partition(t.schema, t.table, d.table, leaf.bound))
    if leaf.constraint:
        statements.append(sql.drop_constraint(t.schema, d.table, naming.bound_check(plan.load_id)))
    return statements
