"""Partitioned targets: staging partitioned like the target, and the partition-wise finalize
of ``replace_partitions``, ``replace`` and ``append``.

prepare (:func:`create_staging`) makes a staging table partitioned like the target (same key,
one staging partition per leaf partition, with its bound; unlogged where a plain staging would
be) and gives each staging partition, while it is empty, a CHECK that implies its bound. The
COPY tasks COPY into the staging parent: PostgreSQL routes every row, and a row that falls in
no partition fails its COPY naming the file, line and key value (nothing is parsed in Python).

finalize (:func:`finalize_partitioned`) then, for each staging partition that received rows
and is to be swapped in:

1. detaches it from the staging parent (it is a standalone table from then on) and makes it
   logged if the target is;
2. builds the target partition's indexes and constraints on it (FKs ``NOT VALID`` then
   ``VALIDATE``) and ANALYZEs it (:func:`airflow_pg_bulk.finalize.build_on_staging`), each
   step committed, so that a retried finalize goes on where the last one stopped;

then ONE transaction, under ``lock_timeout`` (the parent locked ``ACCESS EXCLUSIVE`` in short
tries, as a replace's swap does): for each, ``DETACH`` and drop the old partition, give the
new table the old one's name, owner, grants, comments and options, ``ATTACH`` it (its CHECK
lets ATTACH skip the scan; the equivalent indexes and foreign keys are adopted), drop the
CHECK; the load is noted finalized; COMMIT. finalize builds the partitions one after another
on its connection; in one process (:func:`airflow_pg_bulk.runner.load`, the CLI) they are
built before it, several at once on sessions of their own (:func:`build_in_parallel`), and
finalize finds them built.

- ``replace_partitions``: every partition that received a row is swapped; the others are not
  touched (same relfilenode, same rows);
- ``replace``: as ``replace_partitions``, and every partition that received no row is emptied
  (TRUNCATE) in the same transaction;
- ``append``: a partition that received rows and is empty is swapped; a non-empty one gets
  the rows by ``INSERT ... SELECT`` from its staging partition in the same transaction (so does
  every partition when the role does not own the target or a partition cannot be swapped);
- ``upsert`` does not come here: it merges through the parent in place (see upsert.py).

See README.md, "Partitioned targets", and docs/design.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from airflow_pg_bulk import catalog, finalize, history, locking, naming, sql
from airflow_pg_bulk.codes import Identity, Persistence
from airflow_pg_bulk.driver import (
    close_cancelling,
    execute,
    rollback_quietly,
    scalar,
    server_version,
)
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.figures import PhaseClock
from airflow_pg_bulk.plan import LeafPartition, LoadPlan, Partitioning

log = logging.getLogger(__name__)


def _parts(plan: LoadPlan) -> Partitioning:
    parts = plan.target.partitioning
    if parts is None:
        raise ValueError(f"load {plan.load_id}: {plan.target.qualified} is not partitioned")
    return parts


def partitioned_staging(plan: LoadPlan) -> bool:
    """Whether the load's staging is partitioned like its target (every mode but upsert,
    whose staging carries a source order column and merges through the parent)."""
    return plan.target.partitioning is not None and plan.mode != "upsert"


def create_staging(conn: Any, plan: LoadPlan) -> None:
    """prepare: the staging parent, partitioned like the target, and one staging partition
    per leaf partition with the leaf's bound and, added while it is empty, a CHECK implying
    the bound (so that ATTACH PARTITION skips its scan)."""
    t = plan.target
    parts = _parts(plan)
    execute(
        conn,
        sql.create_partitioned_staging(
            t.schema, plan.staging_table, t.table, parts.key, server_version=server_version(conn)
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
    for number, leaf in enumerate(parts.leaves):
        name = naming.staging_partition(plan.load_id, number)
        execute(
            conn,
            sql.create_partition_of(
                t.schema, name, plan.staging_table, leaf.bound, logged=plan.staging_logged
            ),
        )
        if leaf.constraint:
            execute(
                conn,
                sql.add_check(t.schema, name, naming.bound_check(plan.load_id), leaf.constraint),
            )


def leaf_plan(plan: LoadPlan, number: int) -> LoadPlan:
    """The plan of one leaf's build: the leaf as the target, its staging partition as staging,
    a load id of its own (the temporary index and constraint names differ per leaf)."""
    leaf = _parts(plan).leaves[number]
    return dataclasses.replace(
        plan,
        load_id=naming.leaf_load_id(plan.load_id, number),
        target=leaf.definition,
        staging_table=naming.staging_partition(plan.load_id, number),
    )


def finalize_partitioned(
    conn: Any, plan: LoadPlan, clock: PhaseClock, rows: int, nbytes: int, rejected: int
) -> None:
    """The partition-wise finalize (see the module's docstring)."""
    t = plan.target
    parts = _parts(plan)
    history.refuse_overwriting_newer(conn, plan)
    execute(conn, sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem))
    with clock.phase("check"):
        loaded = _loaded(conn, plan)
        if not plan.staging_logged:  # a crash may have emptied some unlogged partitions
            staged = sum(
                scalar(conn, sql.count_rows(t.schema, naming.staging_partition(plan.load_id, n)))
                for n in loaded
            )
            if staged != rows:
                raise finalize._staging_lost(plan, staged, rows)
        swapped = _to_swap(conn, plan, loaded)
        conn.commit()
    built = {n: _build_leaf(conn, plan, n, clock) for n in swapped}
    leaves = parts.leaves
    inserted: list[int] = []
    with clock.phase("swap"):
        execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True))
        execute(conn, sql.advisory_xact_lock(t.oid))
        # appends in place first, before the parent is locked: readers are not held up
        for n in loaded:
            if n not in built:
                _insert_leaf(conn, plan, n)
                inserted.append(n)
        if built or plan.mode == "replace":

            def unchanged() -> None:
                # before ACCESS EXCLUSIVE: readers do not wait for the catalog of every partition
                # to be read (measured: ~100 ms with two partitions on a loaded 2-core machine)
                history.refuse_overwriting_newer(conn, plan)
                now = catalog.capture(conn, t.schema, t.table)  # pins search_path for the swap
                if now.fingerprint() != t.fingerprint():
                    raise LoadRefusedError(
                        f"the definition of {t.qualified} or of one of its partitions changed "
                        "between prepare and finalize (partitions, columns, indexes, "
                        "constraints, grants, owner or comments); nothing was swapped. Run the "
                        "load again"
                    )

            locking.lock_for_swap(
                conn,
                [(t.schema, t.table), *((t.schema, leaves[n].definition.table) for n in built)],
                under_share_update=unchanged,
            )
        for n, names in built.items():
            if plan.mode == "append" and scalar(
                conn, sql.has_rows(t.schema, leaves[n].definition.table)
            ):  # rows came in since finalize looked: append in place after all
                _insert_leaf(conn, plan, n)
                inserted.append(n)
            else:
                _swap_leaf(conn, plan, n, leaves[n], *names)
        if plan.mode == "replace":
            for n, leaf in enumerate(leaves):
                # (an empty partition is not truncated: readers wait for each TRUNCATE)
                if n not in loaded and scalar(conn, sql.has_rows(t.schema, leaf.definition.table)):
                    execute(conn, sql.truncate(t.schema, leaf.definition.table))
        history.record_finalized(conn, plan, rows, nbytes, rejected)
        conn.commit()
    if inserted and plan.settings.analyze:
        with clock.phase("analyze"):
            for n in inserted:
                execute(conn, sql.analyze(t.schema, leaves[n].definition.table))
                conn.commit()
    log.info(
        "Load %s into %s (%s): %d of %d partitions received rows; %d swapped in by ATTACH "
        "PARTITION, %d appended to in place%s",
        plan.load_id,
        t.qualified,
        plan.mode,
        len(loaded),
        len(leaves),
        len(loaded) - len(inserted),
        len(inserted),
        f", {len(leaves) - len(loaded)} emptied" if plan.mode == "replace" else "",
    )


#: at most this many partitions are built at once by finalize's extra sessions
MAX_SIDE_BY_SIDE = 8


def side_by_side(plan: LoadPlan) -> int:
    """How many partitions finalize builds at once: as many as the load's COPY partitions (the
    parallelism the load was given for the server), at least 2, at most ``MAX_SIDE_BY_SIDE``."""
    return max(2, min(len(plan.partitions), MAX_SIDE_BY_SIDE))


def build_in_parallel(connect: Callable[[], Any], plan: LoadPlan, jobs: int) -> float:
    """At the start of finalize (in one process and under Airflow alike, on finalize's extra
    sessions): build the partitions finalize will swap in (detach, indexes, constraints), up
    to ``jobs`` at once, each on a session of its own (``connect``); finalize then finds them
    built, ANALYZEs them and swaps them in (each build step is committed and skipped when
    found done). Nothing here touches the target.
    Returns the seconds taken (0: nothing to build side by side: fewer than two partitions,
    or the load finalized)."""
    if not partitioned_staging(plan) or jobs < 2:
        return 0.0
    started = time.perf_counter()
    with _session(connect, plan, "build") as conn:
        if any(row[0] == sql.FINALIZED for row in execute(conn, _ledger(plan))):
            return 0.0
        swapped = _to_swap(conn, plan, _loaded(conn, plan))
        conn.commit()
    if len(swapped) < 2:
        return 0.0

    # ANALYZE is left to finalize: it cannot tell whether a table was analyzed, and would
    # analyze it again (indexes and constraints it finds built)
    unanalyzed = dataclasses.replace(
        plan, settings=dataclasses.replace(plan.settings, analyze=False)
    )

    def build(number: int) -> None:
        with _session(connect, plan, "build", number) as conn:
            try:
                _build_leaf(conn, unanalyzed, number, PhaseClock())
            except BaseException:
                rollback_quietly(conn)
                raise  # finalize translates it (and finds the row of a broken constraint)

    workers = min(jobs, len(swapped))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for done in [pool.submit(build, n) for n in swapped]:
            done.result()
    seconds = time.perf_counter() - started
    log.info(
        "Load %s: %d partitions of %s built on %d sessions at once in %.2f s",
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
    from airflow_pg_bulk.steps import start_session  # (steps imports this module)

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


def _loaded(conn: Any, plan: LoadPlan) -> list[int]:
    """The leaves whose staging partition received rows."""
    return [
        n
        for n in range(len(_parts(plan).leaves))
        if scalar(conn, sql.has_rows(plan.target.schema, naming.staging_partition(plan.load_id, n)))
    ]


def _insert_leaf(conn: Any, plan: LoadPlan, number: int) -> None:
    """Append a staging partition's rows in place, through the parent (they go to the same
    partition; the role needs INSERT on the parent only, as for a plain append)."""
    t = plan.target
    execute(
        conn,
        sql.insert_from_staging(
            t.schema,
            t.table,
            naming.staging_partition(plan.load_id, number),
            plan.columns,
            override_identity=any(
                c.identity == Identity.ALWAYS and c.name in plan.columns for c in t.columns
            ),
        ),
    )


def _to_swap(conn: Any, plan: LoadPlan, loaded: list[int]) -> list[int]:
    """The loaded leaves to build and swap in: all of them for a replace; for an append, the
    empty ones, when the role owns the target and nothing stands in the way of a swap."""
    if plan.mode != "append":
        return loaded
    parts = _parts(plan)
    owner = execute(conn, sql.loader_privileges(plan.target.oid))[0][0]
    if not owner or parts.unsupported or plan.target.referencing_keys:
        log.info(
            "append into %s: every partition in place (a partition cannot be swapped in: %s)",
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
    conn: Any, plan: LoadPlan, number: int, clock: PhaseClock
) -> tuple[dict[str, str], dict[str, str]]:
    """Detach a staging partition and build on it what its target partition has; each step
    commits and a retry skips what is done. Returns the temporary index and constraint names."""
    built_plan = leaf_plan(plan, number)
    t = plan.target
    stage = built_plan.staging_table
    with clock.phase("detach"):
        if execute(conn, sql.partition_of(t.schema, stage)):
            execute(conn, sql.detach_partition(t.schema, plan.staging_table, stage))
            conn.commit()
    state = finalize._staging_state(conn, built_plan)
    if ("persistence", Persistence.UNLOGGED) in state and (
        built_plan.target.persistence == Persistence.PERMANENT
    ):
        with clock.phase("set_logged"):
            execute(conn, sql.set_logged(t.schema, stage))
            conn.commit()
    return finalize.build_on_staging(conn, built_plan, clock, state)


def _swap_leaf(
    conn: Any,
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
    finalize._restore_properties(conn, d, triggers=False)
    finalize.restore_columns(conn, t.schema, d.table, former)
    execute(conn, sql.attach_partition(t.schema, t.table, d.table, leaf.bound))
    if leaf.constraint:
        execute(conn, sql.drop_constraint(t.schema, d.table, naming.bound_check(plan.load_id)))
