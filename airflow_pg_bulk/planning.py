"""The plan, built by a pure function: request, captured definition and source listing in, plan out.

:func:`airflow_pg_bulk.steps.prepare` does the I/O around it (capture the target, list and
split the files, create the tables); everything decided from what it read is decided here, so
it can be tested without a server or a file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from airflow_pg_bulk import naming
from airflow_pg_bulk.catalog import split_name
from airflow_pg_bulk.codes import Persistence
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import (
    DEFAULT_REJECT_TABLE,
    LoadPlan,
    LoadRequest,
    Partition,
    TargetDefinition,
)


def loadable_columns(target: TargetDefinition) -> list[str]:
    """The target's columns a COPY can fill: every column that is not generated."""
    return [c.name for c in target.columns if not c.generated]


def plan_columns(
    request: LoadRequest, target: TargetDefinition, header_columns: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The target columns the fields fill, in file order.

    ``header_columns``: the columns the files' header names matched (``header=True``); empty
    or None means every loadable column. Without a header: ``request.columns`` or every
    loadable column; a column that is not loadable is refused."""
    loadable = loadable_columns(target)
    if request.copy.header:
        return tuple(header_columns or loadable)
    columns = list(request.columns or loadable)
    unknown = [c for c in columns if c not in loadable]
    if unknown:
        raise LoadRefusedError(
            f"columns {unknown} are not loadable columns of {target.qualified} "
            f"(loadable: {loadable})"
        )
    return tuple(columns)


def reject_table(request: LoadRequest, schema: str) -> tuple[str, str] | None:
    """``(schema, table)`` where rejected rows go, or None when the load does not reject."""
    if not request.errors.rejecting:
        return None
    if request.errors.reject_table:
        return split_name(request.errors.reject_table)
    return (schema, DEFAULT_REJECT_TABLE)


def staging_logged(request: LoadRequest, target: TargetDefinition) -> bool:
    """Whether staging is a logged table; an unlogged target's replacement stays unlogged."""
    return request.staging_is_logged() and not (
        request.mode == "replace" and target.persistence == Persistence.UNLOGGED
    )


def build_plan(
    request: LoadRequest,
    target: TargetDefinition,
    load_id: str,
    *,
    columns: Sequence[str],
    partitions: Sequence[Partition],
    source_bytes: int,
    logical_date: str | None = None,
) -> LoadPlan:
    """The load's plan from what prepare read: the request, the target's captured definition,
    the columns (:func:`plan_columns`) and the source cut into partitions."""
    return LoadPlan(
        load_id=naming.check_load_id(load_id),
        mode=request.mode,
        target=target,
        staging_table=naming.staging_table(load_id),
        ledger_table=naming.ledger_table(load_id),
        staging_logged=staging_logged(request, target),
        columns=tuple(columns),
        copy=request.copy,
        partitions=tuple(partitions),
        settings=request.settings,
        source_bytes=source_bytes,
        errors=request.errors,
        reject_table=reject_table(request, target.schema),
        logical_date=logical_date,
    )


_UNSTABLE = ("started_at", "prepared_at")  # stamped after the plan is made


def plan_digest(plan: LoadPlan) -> str:
    """A digest of what the plan loads and how: the same for the same files, cut and target.

    Prepare writes it on the ledger; a prepare run again keeps a ledger with the same digest
    (and the partitions committed in it), and COPY and finalize refuse a ledger made for
    another plan."""
    data = {k: v for k, v in plan.to_dict().items() if k not in _UNSTABLE}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]
