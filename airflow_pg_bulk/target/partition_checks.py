"""The checks of the partition-wise finalize (:mod:`airflow_pg_bulk.target.partitioned`) before
and under the swap's lock: what prepare and the route captured must still be what the
target is (never oids: a partition swapped by another load in the meantime keeps its
definition and changes its oid), and which other partitions a load replaces or empties."""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, scalar
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import LeafPartition, LoadPlan, TargetDefinition
from airflow_pg_bulk.target import catalog


def parent_fingerprint(target: TargetDefinition) -> dict[str, Any]:
    """What must not change of a partitioned parent between prepare's capture and the swap:
    its partitions left out, and their number (partitions added or dropped meanwhile change
    nothing the load swaps), and the key's parts (the key's text says the same; a plan made
    before they were captured has none)."""
    bare = dataclasses.replace(
        target.required_partitioning(), leaves=(), unsupported=(), count=0, columns=()
    )
    return dataclasses.replace(target, partitioning=bare).fingerprint()


def others_with_rows(conn: DatabaseConnection, plan: LoadPlan) -> list[tuple[str, str]]:
    """The target's partitions that this load does not load and that hold rows (a replace
    empties them)."""
    t = plan.target
    mine = {leaf.schema_and_name for leaf in t.required_partitioning().leaves}
    return [
        (leaf_schema, name)
        for leaf_schema, name in execute(conn, sql.leaf_names(t.oid))
        if (leaf_schema, name) not in mine and scalar(conn, sql.has_rows(leaf_schema, name))
    ]


def replaced_parts(plan: LoadPlan, loaded: list[int]) -> list[str] | None:
    """The partitions (leaf table names) whose rows a ``replace_partitions`` replaces: those
    that receive rows; None for the other modes (a replace replaces the whole target)."""
    if not plan.mode.replaces_loaded_partitions:
        return None
    leaves = plan.target.required_partitioning().leaves
    return [leaves[n].definition.table for n in loaded]


def refuse_changed_leaves(
    conn: DatabaseConnection,
    plan: LoadPlan,
    parent: TargetDefinition,
    swapped: list[LeafPartition],
    *,
    found: list[tuple] | None = None,
    read: list[list[tuple]] | None = None,
) -> None:
    """Under the swap's lock: each partition to swap is still a partition of the target,
    with the bound and definition its new table was built for (its oid aside: another load
    may have swapped it since, keeping its definition). ``found``: their rows of
    ``sql.leaf_partitions``, when read already; ``read``: and the rows of their
    :func:`~airflow_pg_bulk.target.catalog.leaf_queries`."""
    if not swapped:
        return
    names = [leaf.schema_and_name for leaf in swapped]
    now = catalog.capture_leaves(conn, parent, names, found=found, read=read)
    current = {leaf.schema_and_name: leaf for leaf in now.leaves}
    for leaf in swapped:
        d = leaf.definition
        found = current.get(leaf.schema_and_name)
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
