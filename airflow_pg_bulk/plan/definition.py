"""The target's definition as prepare captured it from the catalog: columns, indexes,
constraints, triggers, grants, dependents, and a partitioned target's key and leaves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_pg_bulk.plan.codes import PartitionStrategy, SequenceKind
from airflow_pg_bulk.plan.plain import PlainData


@dataclass(frozen=True)
class Column(PlainData):
    """A column of the target table as captured by prepare."""

    name: str
    type: str
    not_null: bool
    generated: bool = False
    identity: str = ""  # codes.Identity: "" none, "a" always, "d" by default


@dataclass(frozen=True)
class IndexDef(PlainData):
    """An index of the target, kept as the server rendered it.

    :param tail: what follows ``USING`` in ``pg_get_indexdef``: access method, keys, INCLUDE,
        WITH, WHERE; it names columns only, never the table, so it applies to staging as is.
    :param constraint: the name of the PK/unique constraint this index backs, if any.
    """

    name: str
    unique: bool
    tail: str
    constraint: str | None = None
    comment: str | None = None


@dataclass(frozen=True)
class ConstraintDef(PlainData):
    """A constraint of the target: ``definition`` is ``pg_get_constraintdef`` output."""

    name: str
    kind: str  # codes.ConstraintKind: p u c f x
    definition: str
    validated: bool = True
    index: str | None = None
    comment: str | None = None
    deferrable: bool = False
    deferred: bool = False


@dataclass(frozen=True)
class TriggerDef(PlainData):
    """A user trigger of the target: its full ``CREATE TRIGGER`` text and enabled state."""

    name: str
    definition: str
    enabled: str = "O"  # codes.TriggerState: O origin, D disabled, R replica, A always


@dataclass(frozen=True)
class Grant(PlainData):
    """One privilege on the table (or one column of it) held by ``grantee`` (empty: PUBLIC)."""

    grantee: str
    privilege: str
    grantable: bool = False
    column: str | None = None


@dataclass(frozen=True)
class ReferencingKey(PlainData):
    """A foreign key of another table that references the target."""

    schema: str
    table: str
    name: str
    definition: str
    validated: bool = True


@dataclass(frozen=True)
class OwnedSequence(PlainData):
    """A sequence tied to a target column: ``kind`` ``serial`` (OWNED BY) or ``identity``."""

    schema: str
    name: str
    column: str
    kind: SequenceKind

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SequenceKind(self.kind))  # a plain str from the catalog


@dataclass(frozen=True)
class TargetDefinition(PlainData):
    """Everything about the target that a replace must carry over to the new table."""

    schema: str
    table: str
    oid: int
    owner: str
    persistence: str  # codes.Persistence: p permanent, u unlogged
    columns: tuple[Column, ...]
    indexes: tuple[IndexDef, ...] = ()
    constraints: tuple[ConstraintDef, ...] = ()
    triggers: tuple[TriggerDef, ...] = ()
    grants: tuple[Grant, ...] = ()
    referencing_keys: tuple[ReferencingKey, ...] = ()
    dependent_views: tuple[str, ...] = ()  # "schema.view", for the record; re-read at swap time
    sequences: tuple[OwnedSequence, ...] = ()
    reloptions: tuple[str, ...] = ()
    comment: str | None = None
    column_comments: dict[str, str] = field(default_factory=dict)
    unsupported: tuple[str, ...] = ()  # what a replace cannot carry over, in words
    # a partitioned target: its key and leaf partitions (None: a plain table)
    partitioning: Partitioning | None = None

    @property
    def qualified(self) -> str:
        """``schema.table`` for messages (not for SQL)."""
        return f"{self.schema}.{self.table}"

    def required_partitioning(self) -> Partitioning:
        """Its partitioning, for the partition-wise steps; ValueError for a plain table."""
        if self.partitioning is None:
            raise ValueError(f"{self.qualified} is not partitioned")
        return self.partitioning

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between prepare and the swap (the oid excluded)."""
        data = self.to_dict()
        data.pop("oid")
        data.pop("dependent_views")
        return data


@dataclass(frozen=True)
class LeafPartition(PlainData):
    """One leaf partition of a partitioned target, as captured by prepare.

    :param bound: its bound as the server renders it (``FOR VALUES FROM (...) TO (...)``,
        ``FOR VALUES IN (...)``, ``FOR VALUES WITH (...)``, ``DEFAULT``).
    :param constraint: its partition constraint (``pg_get_partition_constraintdef``): the
        CHECK that lets ATTACH PARTITION skip its scan; None for a lone DEFAULT partition.
    :param definition: the partition's own definition (indexes, constraints, grants, owner,
        comments), what a table swapped in for it is built with (with ``in_place``: its
        schema and name only).
    :param in_place: a load's rows go into the partition in place rather than by a table
        built beside it and swapped in (few rows: see
        :data:`airflow_pg_bulk.target.partitioned.IN_PLACE_ROWS`).
    :param replace_key: loaded in place by a load that replaces its rows: the columns of its
        primary key, by which its rows are replaced (a DELETE of those not staged and a MERGE
        of the staged ones: see :func:`airflow_pg_bulk.sql.replace_by_key`); empty: it is
        emptied (TRUNCATE) and the staged rows inserted.
    """

    bound: str
    constraint: str | None
    definition: TargetDefinition
    in_place: bool = False
    replace_key: tuple[str, ...] = ()

    @property
    def schema_and_name(self) -> tuple[str, str]:
        """The partition's (schema, table name), as statements take them."""
        return self.definition.schema, self.definition.table


@dataclass(frozen=True)
class Partitioning(PlainData):
    """A partitioned target's key (``pg_get_partkeydef``: ``RANGE (day)``), its strategy
    (``pg_partitioned_table.partstrat``, what the load decides on; the key's text is only
    rendered into SQL) and leaves, and what the partition-wise finalize cannot carry over,
    in words; ``count``: how many partitions it had when prepare captured it (0: not
    counted); ``columns``: the key's parts in order, each a column's (name, type as
    ``format_type`` gives it), or (None, None) for an expression (empty: not captured, as
    in a plan made before it was)."""

    key: str
    strategy: PartitionStrategy
    leaves: tuple[LeafPartition, ...] = ()
    unsupported: tuple[str, ...] = ()
    count: int = 0
    columns: tuple[tuple[str | None, ...], ...] = ()

    def __post_init__(self) -> None:
        # a plain str from to_dict / XCom
        object.__setattr__(self, "strategy", PartitionStrategy(self.strategy))
