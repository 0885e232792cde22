"""The one place that decides how a plan's staged rows become the target's.

:func:`for_plan` picks a :class:`Strategy` from the plan (target kind, mode, strategy); prepare
creates staging with it (:attr:`Strategy.create_staging`) and finalize makes the rows visible
with it (:attr:`Strategy.route`, then :attr:`Strategy.make_visible`). A new way of loading is
one new module of ``target/`` and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from airflow_pg_bulk.db.driver import DatabaseConnection
from airflow_pg_bulk.db.session import Sessions
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.plan.figures import PhaseClock
from airflow_pg_bulk.target import append, partitioned, rebuild, replace, upsert
from airflow_pg_bulk.target.history import LedgerTotals

#: an upsert's (rows inserted, rows updated)
Merged = tuple[int, int]


def as_planned(
    conn: DatabaseConnection, plan: LoadPlan, clock: PhaseClock, totals: LedgerTotals
) -> LoadPlan:
    """The route of every strategy but the partition-wise one: the plan as it is."""
    return plan


@dataclass(frozen=True)
class Strategy:
    """One way of making staged rows the target's.

    :param name: for logs and errors.
    :param create_staging: prepare's staging table (or tables) for the plan.
    :param route: finalize's first step, given what the ledger adds up to, returning the plan
        finalize goes on with (and tells errors with): a partitioned target's rows routed to
        its partitions.
    :param make_visible: the rest of finalize, the load noted finalized in the transaction
        that makes its rows visible; returns an upsert's :data:`Merged`, else None.
    """

    name: str
    create_staging: Callable[[DatabaseConnection, LoadPlan], None]
    make_visible: Callable[
        [DatabaseConnection, LoadPlan, PhaseClock, LedgerTotals, Sessions | None], Merged | None
    ]
    route: Callable[[DatabaseConnection, LoadPlan, PhaseClock, LedgerTotals], LoadPlan] = as_planned


PARTITIONED = Strategy(
    "partition-wise", partitioned.create_staging, partitioned.make_visible, partitioned.route
)
REPLACE = Strategy("swap", replace.create_staging, replace.make_visible)
REBUILD = Strategy("rebuild", rebuild.create_staging, rebuild.make_visible)
UPSERT = Strategy("upsert in place", upsert.create_staging, upsert.make_visible)
APPEND = Strategy("append in place", append.create_staging, append.make_visible)


def for_plan(plan: LoadPlan) -> Strategy:
    """How this plan's rows become the target's: partition by partition (a partitioned target,
    every mode but upsert), a swap (replace), a rebuild (append or upsert with
    ``strategy="rebuild"`` chosen), a merge in place (upsert) or an insert in place."""
    if partitioned.partitioned_staging(plan):
        return PARTITIONED
    if plan.mode.whole_target:
        return REPLACE
    if plan.rebuilds:
        return REBUILD
    if plan.mode.keyed:
        return UPSERT
    return APPEND
