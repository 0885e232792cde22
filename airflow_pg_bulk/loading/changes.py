"""What a load changed, for its summary (:class:`airflow_pg_bulk.plan.figures.TableChange`): per
table partition touched, the action and the rows before and after; the rows the target holds
after the load.

finalize never counts the target: its cost must not grow with the target's size. The rows
before come from the catalog's estimate (``pg_class.reltuples``, said to be one), read in one
statement before the rows become visible (the partitions touched one by one, the others as
one sum computed by the server, but for a load into some of more than
:data:`SUMMED_PARTITIONS` partitions, whose summary then leaves the target's total out); the
rows a partition receives are the ledger's total (one partition) or counted in the load's
own staging partitions (several: one statement, a scan of the loaded rows alone)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from airflow_pg_bulk import naming
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    is_database_error,
    read_each,
    rollback_quietly,
)
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.plan.figures import TableChange
from airflow_pg_bulk.sql.summary import estimates_around, staged_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Others:
    """The partitions of a partitioned target that a load does not touch, as one sum.

    :param count: how many there are.
    :param held: the sum of their known row estimates.
    :param holding: how many of them hold rows or are unknown (estimate not 0).
    :param unknown: how many were never analyzed (no estimate).
    """

    count: int
    held: int
    holding: int
    unknown: int


@dataclass(frozen=True)
class Before:
    """What finalize reads before the rows become visible.

    :param estimates: (schema, name) of the target (not partitioned), or of each partition the
        load touches, to the catalog's row estimate (-1: never analyzed).
    :param staged: rows per staging partition number (several partitions touched); None:
        one, or not counted.
    :param others: the partitions the load does not touch (a plain target: none); None: not
        read (a load into a few of more than :data:`SUMMED_PARTITIONS`: see
        :func:`read_before`).
    """

    estimates: dict[tuple[str, str], int]
    staged: dict[int, int] | None
    others: Others | None = Others(0, 0, 0, 0)


#: a load that touches some partitions of a target with more than this many does not read the
#: others' estimates (their sum is one catalog row per partition: ~2 ms at 1,826 partitions,
#: for the summary's "holds about ... rows now" alone); a replace, which empties them, does
SUMMED_PARTITIONS = 200


def read_before(conn: DatabaseConnection, plan: LoadPlan) -> Before | None:
    """The estimates and staged counts of a routed ``plan`` (see the module's docstring);
    None when they could not be read (the summary then says nothing of the changes: it never
    fails the load). One round trip, in autocommit when no transaction is open (a
    partition-wise load's route committed its own), else in the one open, left open
    (:func:`~airflow_pg_bulk.db.driver.read_each`); the reads lock no table of the target
    (the catalog, and the load's own staging partitions: ACCESS SHARE, which a build in the
    same session does not wait for, and finalize commits before other sessions build)."""
    t = plan.target
    leaves = t.partitioning.leaves if t.partitioning else ()
    summed = (
        plan.mode.whole_target
        or t.partitioning is None
        or t.partitioning.count <= SUMMED_PARTITIONS
    )
    try:
        touched = [(leaf.definition.schema, leaf.definition.table) for leaf in leaves]
        estimates = {}
        every = Others(0, 0, 0, 0)  # all the partitions, the touched ones included
        reads = [estimates_around(t.oid, touched, every=summed)]
        if len(leaves) > 1:
            names = [naming.staging_partition(plan.load_id, n) for n in range(len(leaves))]
            reads.append(staged_rows(t.schema, names))
        found, *counted = read_each(conn, reads)
        for schema, name, estimate, count, holding, unknown in found:
            if schema is None:
                every = Others(int(count), int(estimate), int(holding), int(unknown))
            else:
                estimates[schema, name] = int(estimate)
        others = (
            _without(every, [e for key, e in estimates.items() if key in touched])
            if summed
            else None
        )
        staged = {int(n): int(r) for n, r in counted[0]} if counted else None
    except Exception as exc:
        rollback_quietly(conn)
        if not is_database_error(exc):
            raise
        log.info("Load %s: the summary of changes is left out: %s", plan.load_id, exc)
        return None
    return Before(estimates, staged, others)


def _without(every: Others, touched: list[int]) -> Others:
    """The partitions a load does not touch: ``every`` partition less the ``touched`` ones'
    estimates."""
    return Others(
        every.count - len(touched),
        every.held - sum(e for e in touched if e > 0),
        every.holding - sum(1 for e in touched if e != 0),
        every.unknown - sum(1 for e in touched if e < 0),
    )


def _known(estimate: int | None) -> int | None:
    return None if estimate is None or estimate < 0 else estimate


def _plus(before: int | None, added: int | None) -> int | None:
    return None if before is None or added is None else before + added


def summary_fields(
    plan: LoadPlan, before: Before | None, rows: int, inserted: int | None
) -> dict[str, Any]:
    """``changes``, ``table_rows`` and ``table_rows_estimated`` of the load's summary, for a
    routed ``plan`` that loaded ``rows`` (an upsert: ``inserted`` of them new)."""
    if before is None:
        return {}
    t = plan.target
    mode = plan.mode
    added = inserted if mode.keyed else rows
    leaves = t.partitioning.leaves if t.partitioning else ()
    others = before.others
    # the untouched partitions' rows (None: unknown, or not read)
    held = None if others is None or others.unknown else others.held
    everything = [_known(e) for e in before.estimates.values()] + [held]
    whole = None if None in everything else sum(everything)  # type: ignore[arg-type]
    if not leaves:  # a plain table, or an upsert (in place, through the parent)
        action = "upserted into" if mode.keyed else "appended to"
        if mode.replaces_rows and not mode.keyed:
            change = TableChange(t.qualified, "replaced", whole, rows)
        else:
            change = TableChange(t.qualified, action, whole, _plus(whole, added), True, True)
        return {
            "changes": (change,),
            "table_rows": change.rows_after,
            "table_rows_estimated": change.after_estimated,
        }
    changes = []
    for number, leaf in enumerate(leaves):
        key = (leaf.definition.schema, leaf.definition.table)
        was = _known(before.estimates.get(key, -1))
        got = rows if len(leaves) == 1 else (before.staged or {}).get(number)
        name = f"{key[0]}.{key[1]}"
        if mode.replaces_rows:
            changes.append(TableChange(name, "replaced", was, got))
        else:
            changes.append(TableChange(name, "appended to", was, _plus(was, got), True, True))
    if mode.whole_target:
        if others is not None and others.holding:
            label = f"{others.holding} other table partitions of {t.qualified}"
            changes.append(TableChange(label, "emptied", held, 0))
        return {"changes": tuple(changes), "table_rows": rows, "table_rows_estimated": False}
    if others is None:  # the other partitions not read: the target's total is not told
        return {"changes": tuple(changes), "table_rows": None, "table_rows_estimated": False}
    afters = [c.rows_after for c in changes] + [held]
    total = None if None in afters else sum(afters)  # type: ignore[arg-type]
    estimated = bool(others.count) or any(c.after_estimated for c in changes)
    return {"changes": tuple(changes), "table_rows": total, "table_rows_estimated": estimated}
