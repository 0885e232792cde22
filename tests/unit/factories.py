"""Fabricated definitions, plans and driver errors for the unit tests (no server)."""

from __future__ import annotations

from typing import Any

import psycopg.errors
from psycopg.pq import DiagnosticField

from airflow_pg_bulk.plan import (
    Column,
    ConstraintDef,
    CopyOptions,
    Grant,
    IndexDef,
    LoadPlan,
    LoadRequest,
    OwnedSequence,
    Partition,
    Piece,
    ReferencingKey,
    TargetDefinition,
    TriggerDef,
    planning,
)
from airflow_pg_bulk.plan.codes import ConstraintKind, Identity, Persistence, TriggerState

LOAD_ID = "0123456789ab"


def target(**changes: Any) -> TargetDefinition:
    """A target with one of everything a replace carries over."""
    fields: dict[str, Any] = dict(
        schema="public",
        table="readings",
        oid=16384,
        owner="loader",
        persistence=Persistence.PERMANENT,
        columns=(
            Column("id", "bigint", True, identity=Identity.ALWAYS),
            Column("meter", "text", True),
            Column("value", "numeric(12,3)", False),
            Column("total", "numeric", False, generated=True),
        ),
        indexes=(
            IndexDef("readings_pkey", True, "btree (id)", constraint="readings_pkey"),
            IndexDef("readings_meter_idx", False, "btree (meter)", comment="by meter"),
        ),
        constraints=(
            ConstraintDef(
                "readings_pkey",
                ConstraintKind.PRIMARY_KEY,
                "PRIMARY KEY (id)",
                index="readings_pkey",
            ),
            ConstraintDef("readings_value_check", ConstraintKind.CHECK, "CHECK ((value >= 0))"),
        ),
        triggers=(TriggerDef("audit", "CREATE TRIGGER audit ...", TriggerState.REPLICA),),
        grants=(Grant("reader", "SELECT"), Grant("", "SELECT", column="meter")),
        referencing_keys=(
            ReferencingKey(
                "public",
                "alarms",
                "alarms_reading_fkey",
                "FOREIGN KEY (r) REFERENCES public.readings(id)",
            ),
        ),
        dependent_views=("public.daily",),
        sequences=(OwnedSequence("public", "readings_id_seq", "id", "identity"),),
        reloptions=("fillfactor=90",),
        comment="meter readings",
        column_comments={"value": "kWh"},
    )
    fields.update(changes)
    return TargetDefinition(**fields)


def request(**changes: Any) -> LoadRequest:
    fields: dict[str, Any] = dict(table="public.readings", source=("/data/r.csv",), mode="replace")
    fields.update(changes)
    return LoadRequest(**fields)


def partitions() -> tuple[Partition, ...]:
    return (
        Partition(0, (Piece("/data/r.csv", 0, 1000, 1),), 1000),
        Partition(1, (Piece("/data/r.csv", 1000, 2000, 41, newline="\r\n"),), 1000),
    )


def plan(**request_changes: Any) -> LoadPlan:
    req = request(**request_changes)
    t = target()
    return planning.build_plan(
        req,
        t,
        LOAD_ID,
        columns=planning.plan_columns(req, t),
        partitions=partitions(),
        source_bytes=2000,
    )


def driver_error(cls: type[psycopg.errors.Error], **fields: str) -> psycopg.errors.Error:
    """A psycopg 3 error as the server would raise it: ``fields`` are diagnostic fields
    (``message_primary``, ``context``, ``constraint_name``, ...)."""
    info = {DiagnosticField[name.upper()]: value.encode() for name, value in fields.items()}
    info.setdefault(DiagnosticField.SQLSTATE, (cls.sqlstate or "").encode())
    return cls(fields.get("message_primary", cls.__name__), info=info)


__all__ = ["CopyOptions", "driver_error", "plan", "request", "target"]
