"""plan: plain frozen data that crosses XCom, and the pure planning that makes it."""

# the names of the former module airflow_pg_bulk.plan: `from airflow_pg_bulk.plan import X` works
from airflow_pg_bulk.plan.codes import Mode
from airflow_pg_bulk.plan.definition import (
    Column,
    ConstraintDef,
    Grant,
    IndexDef,
    LeafPartition,
    OwnedSequence,
    Partitioning,
    ReferencingKey,
    TargetDefinition,
    TriggerDef,
)
from airflow_pg_bulk.plan.load_plan import (
    LOAD_HISTORY_TABLE,
    LoadPlan,
    Partition,
    Piece,
    RunOrder,
    StagingLayout,
    UpsertSpec,
)
from airflow_pg_bulk.plan.plain import PlainData
from airflow_pg_bulk.plan.request import (
    BLOCKS,
    DEFAULT_PARTITION_BYTES,
    DEFAULT_REJECT_TABLE,
    LOAD_OPTIONS,
    MAX_DEFAULT_PARTITIONS,
    CopyOptions,
    DatabaseSource,
    ErrorPolicy,
    LoadRequest,
    Settings,
    column_list,
    request_from_options,
)

__all__ = [
    "BLOCKS",
    "DEFAULT_PARTITION_BYTES",
    "DEFAULT_REJECT_TABLE",
    "LOAD_HISTORY_TABLE",
    "LOAD_OPTIONS",
    "MAX_DEFAULT_PARTITIONS",
    "Column",
    "ConstraintDef",
    "CopyOptions",
    "DatabaseSource",
    "ErrorPolicy",
    "Grant",
    "IndexDef",
    "LeafPartition",
    "LoadPlan",
    "LoadRequest",
    "Mode",
    "OwnedSequence",
    "Partition",
    "Partitioning",
    "Piece",
    "PlainData",
    "ReferencingKey",
    "RunOrder",
    "Settings",
    "StagingLayout",
    "TargetDefinition",
    "TriggerDef",
    "UpsertSpec",
    "column_list",
    "request_from_options",
]
