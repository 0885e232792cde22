"""The plan, built by a pure function: request, captured definition and source listing in, plan out.

:func:`airflow_pg_bulk.steps.prepare` does the I/O around it (capture the target, list and
split the files, create the tables); everything decided from what it read is decided here, so
it can be tested without a server or a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pg_bulk import naming
from airflow_pg_bulk.catalog import split_name
from airflow_pg_bulk.codes import Identity, Persistence
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import (
    DEFAULT_REJECT_TABLE,
    LoadPlan,
    LoadRequest,
    Partition,
    TargetDefinition,
    UpsertSpec,
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


@dataclass(frozen=True)
class UniqueIndex:
    """A unique index of the target, as an upsert's key may match it (read by prepare).

    :param columns: its key columns in index order; empty when it has an expression.
    :param constraint: the PK or UNIQUE constraint it backs, if any.
    """

    name: str
    columns: tuple[str, ...]
    primary: bool = False
    constraint: str | None = None
    deferrable: bool = False
    partial: bool = False
    nulls_not_distinct: bool = False

    def describe(self) -> str:
        """``primary key (id)``, ``unique constraint u (a, b)`` or ``unique index i (a)``."""
        what = (
            "primary key"
            if self.primary
            else f"unique constraint {self.constraint}"
            if self.constraint
            else f"unique index {self.name}"
        )
        return f"{what} ({', '.join(self.columns) or 'an expression'})"


def upsert_spec(
    request: LoadRequest,
    target: TargetDefinition,
    columns: Sequence[str],
    unique_indexes: Sequence[UniqueIndex],
) -> UpsertSpec:
    """The upsert's key: ``request.key`` or the primary key, matched to exactly one unique
    index of the target (``ON CONFLICT`` needs one to infer); refused in words otherwise."""
    name = target.qualified
    usable = [u for u in unique_indexes if u.columns and not u.partial]
    keys = "; ".join(u.describe() for u in usable) or "none"
    if request.key is None:
        index = next((u for u in usable if u.primary), None)
        if index is None:
            raise LoadRefusedError(
                f"upsert into {name} needs a key: the table has no primary key. Name the "
                f"columns of a unique constraint or unique index with key=[...] (its unique "
                f"keys: {keys})"
            )
        key = index.columns
    else:
        key = tuple(request.key)
        repeated = sorted({c for c in key if key.count(c) > 1})
        unknown = [c for c in key if c not in {col.name for col in target.columns}]
        if repeated or unknown:
            raise LoadRefusedError(
                f"upsert key {list(key)} of {name}: "
                + (f"{unknown} are not columns of the table" if unknown else "")
                + ("; " if repeated and unknown else "")
                + (f"{repeated} named twice" if repeated else "")
            )
        matches = [u for u in usable if set(u.columns) == set(key)]
        if not matches:
            raise LoadRefusedError(
                f"upsert key {list(key)} of {name} is not unique: it is not exactly the columns "
                "of the primary key or of a unique constraint or unique index (not a partial "
                f"one) of the table, so a loaded row could match several rows. Its unique keys: "
                f"{keys}"
            )
        index = next((u for u in matches if not u.deferrable), matches[0])
    if index.deferrable:
        raise LoadRefusedError(
            f"upsert key {list(key)} of {name}: its {index.describe()} is DEFERRABLE, which "
            "INSERT ... ON CONFLICT cannot use; make it NOT DEFERRABLE or use another key"
        )
    missing = [c for c in key if c not in columns]
    if missing:
        raise LoadRefusedError(
            f"upsert into {name}: key columns {missing} are not loaded (the loaded columns: "
            f"{list(columns)}); the key must come from the files"
        )
    by_name = {c.name: c for c in target.columns}
    always = [c for c in columns if by_name[c].identity == Identity.ALWAYS and c not in key]
    if always:
        raise LoadRefusedError(
            f"upsert into {name}: {always} are GENERATED ALWAYS AS IDENTITY and not part of the "
            "key, so an upsert cannot set them on rows it updates; leave them out of the loaded "
            "columns (they keep their values, new rows get new ones)"
        )
    return UpsertSpec(
        key=key,
        index=index.name,
        on_duplicate_key=request.on_duplicate_key,
        key_may_be_null=not index.nulls_not_distinct and any(not by_name[c].not_null for c in key),
        override_identity=any(by_name[c].identity == Identity.ALWAYS for c in key),
    )


def number_pieces(partitions: Sequence[Partition], file_order: Sequence[str]) -> list[Partition]:
    """The partitions with every piece's :attr:`~airflow_pg_bulk.plan.Piece.ordinal` set: its
    place in source order (files in ``file_order``, then byte order within a file), whatever
    partition it was packed into."""
    rank = {path: n for n, path in enumerate(file_order)}
    pieces = sorted(
        (rank.get(piece.path, len(rank)), piece.path, piece.start, part.index, n)
        for part in partitions
        for n, piece in enumerate(part.pieces)
    )
    ordinal = {(index, n): k for k, (*_, index, n) in enumerate(pieces)}
    return [
        dataclasses.replace(
            part,
            pieces=tuple(
                dataclasses.replace(piece, ordinal=ordinal[(part.index, n)])
                for n, piece in enumerate(part.pieces)
            ),
        )
        for part in partitions
    ]


def build_plan(
    request: LoadRequest,
    target: TargetDefinition,
    load_id: str,
    *,
    columns: Sequence[str],
    partitions: Sequence[Partition],
    source_bytes: int,
    logical_date: str | None = None,
    upsert: UpsertSpec | None = None,
    file_order: Sequence[str] = (),
) -> LoadPlan:
    """The load's plan from what prepare read: the request, the target's captured definition,
    the columns (:func:`plan_columns`) and the source cut into partitions; for an upsert its
    key (:func:`upsert_spec`), and the pieces numbered in source order (``file_order``)."""
    if request.mode == "upsert":
        if upsert is None:
            raise ValueError("an upsert's plan needs its key (planning.upsert_spec)")
        partitions = number_pieces(partitions, file_order)
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
        upsert=upsert,
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
