"""The catalog's letter codes, named: what the captured definition's one-letter fields mean.

The plan keeps them as plain strings (JSON through XCom); a ``StrEnum`` member equals its code,
so ``con.kind == ConstraintKind.UNIQUE`` reads a plan as it is, and a definition built with the
members round-trips through ``to_dict``/``from_dict`` and JSON unchanged.
"""

from __future__ import annotations

import enum


class Persistence(enum.StrEnum):
    """``pg_class.relpersistence`` of a table (:attr:`TargetDefinition.persistence`)."""

    PERMANENT = "p"
    UNLOGGED = "u"
    TEMPORARY = "t"


class RelKind(enum.StrEnum):
    """``pg_class.relkind`` values the load tells apart."""

    TABLE = "r"
    PARTITIONED = "p"
    VIEW = "v"
    MATERIALIZED_VIEW = "m"
    FOREIGN_TABLE = "f"


class ConstraintKind(enum.StrEnum):
    """``pg_constraint.contype`` (:attr:`ConstraintDef.kind`)."""

    PRIMARY_KEY = "p"
    UNIQUE = "u"
    CHECK = "c"
    FOREIGN_KEY = "f"
    EXCLUSION = "x"


class TriggerState(enum.StrEnum):
    """``pg_trigger.tgenabled`` (:attr:`TriggerDef.enabled`)."""

    ORIGIN = "O"  # fires in origin and local sessions (ENABLE, the default)
    DISABLED = "D"
    REPLICA = "R"  # fires only in replica sessions (ENABLE REPLICA)
    ALWAYS = "A"  # fires always (ENABLE ALWAYS)


class Identity(enum.StrEnum):
    """``pg_attribute.attidentity`` (:attr:`Column.identity`)."""

    NONE = ""
    ALWAYS = "a"
    BY_DEFAULT = "d"
