"""The statements of partitioned targets, rendered without a connection: identifiers quoted,
the server-rendered key, bounds and partition constraints taken as they are."""

from __future__ import annotations

import dataclasses

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.plan import (
    Column,
    ConstraintDef,
    CopyOptions,
    IndexDef,
    LeafPartition,
    LoadPlan,
    Partitioning,
    StagingLayout,
    TargetDefinition,
)
from airflow_pg_bulk.plan.codes import PartitionStrategy
from airflow_pg_bulk.target import partition_staging


def text(statement: sql.Composable) -> str:
    return statement.as_string(None)


def test_staging_partitioned_like_the_target() -> None:
    assert text(
        sql.create_partitioned_staging("s", "_st", "t", "RANGE (day)", server_version=150000)
    ) == (
        'CREATE TABLE "s"."_st" (LIKE "s"."t" INCLUDING DEFAULTS INCLUDING GENERATED'
        " INCLUDING STORAGE INCLUDING COMPRESSION) PARTITION BY RANGE (day)"
    )
    assert text(
        sql.create_partition_of("s", "p 1", "_st", "FOR VALUES IN ('a')", logged=False)
    ) == (
        'CREATE UNLOGGED TABLE "s"."p 1" PARTITION OF "s"."_st" FOR VALUES IN (\'a\')'
        " WITH (autovacuum_enabled = false)"
    )
    assert text(sql.add_check("s", "p", "c", "(day IS NOT NULL)")) == (
        'ALTER TABLE "s"."p" ADD CONSTRAINT "c" CHECK ((day IS NOT NULL))'
    )


def test_detach_and_attach() -> None:
    assert (
        text(sql.detach_partition("s", "t", "p")) == 'ALTER TABLE "s"."t" DETACH PARTITION "s"."p"'
    )
    assert text(sql.attach_partition("s", "t", "p", "DEFAULT")) == (
        'ALTER TABLE "s"."t" ATTACH PARTITION "s"."p" DEFAULT'
    )


def test_upsert_of_one_partition_takes_the_rows_its_constraint_admits() -> None:
    statement = text(
        sql.upsert_from_staging(
            "s", "t_p1", "stage", ["id", "v"], ["id"], latest_wins=False,
            key_may_be_null=False, override_identity=False, where="(id >= 10)",
        )
    )  # fmt: skip
    assert 'INSERT INTO "s"."t_p1" AS target' in statement
    assert ') AS loaded WHERE ((id >= 10)) ON CONFLICT ("id")' in statement
    unrouted = text(sql.unrouted_row("s", "stage", ["id"], ["(id < 10)", "(id >= 10)"]))
    assert unrouted == (
        'SELECT ("id")::text FROM "s"."stage" AS loaded'
        " WHERE NOT (coalesce(((id < 10)), false) OR coalesce(((id >= 10)), false)) LIMIT 1"
    )
    # once refused: the first such row in source order, and the source read again for its line
    first = text(sql.unrouted_row("s", "stage", ["id"], ["(id < 10)"], in_source_order=True))
    assert first.endswith(' ORDER BY "_pgbulk_source_order" LIMIT 1')
    replayed = text(sql.replay_failing(sql.in_no_partition(["(id < 10)"]), after=7))
    assert replayed == (
        'SELECT r."pgbulk_row" FROM "pg_temp"."pgbulk_replay" r WHERE r."pgbulk_row" > 7'
        ' AND (NOT (coalesce(((id < 10)), false))) ORDER BY r."pgbulk_row" LIMIT 1'
    )


def test_messages_name_the_target_partitions_not_the_staging_ones() -> None:
    leaf = TargetDefinition(
        "s", "t_p0", 2, "o", "p", (Column("id", "integer", True),),
        indexes=(IndexDef("t_p0_pkey", True, "btree (id)", "t_p0_pkey"),),
        constraints=(ConstraintDef("t_p0_pkey", "p", "PRIMARY KEY (id)", True, "t_p0_pkey"),),
    )  # fmt: skip
    target = TargetDefinition(
        "s", "t", 1, "o", "p", (Column("id", "integer", True),),
        partitioning=Partitioning(
            "RANGE (id)", PartitionStrategy.RANGE, (LeafPartition("DEFAULT", None, leaf),)
        ),
    )  # fmt: skip
    plan = LoadPlan(
        "0123456789ab", "replace_partitions", target, naming.staging_table("0123456789ab"),
        naming.ledger_table("0123456789ab"), True, ("id",), CopyOptions(), (),
    )  # fmt: skip
    leaf_id = naming.leaf_load_id(plan.load_id, 0)
    raw = (
        f"{naming.staging_partition(plan.load_id, 0)} of {plan.staging_table}: "
        f"{naming.temp_constraint(leaf_id, 0)} on {naming.temp_index(leaf_id, 0)}"
    )
    assert naming.original_names(plan, raw) == "t_p0 of t: t_p0_pkey on t_p0_pkey"
    again = LoadPlan.from_dict(plan.to_dict())  # the plan travels through XCom
    assert again == plan
    assert again.target.partitioning is not None
    assert again.target.partitioning.strategy is PartitionStrategy.RANGE  # a value, not a str


def test_the_partition_key_is_read_with_its_strategy() -> None:
    assert text(sql.partition_key(42)).startswith(
        "SELECT pg_get_partkeydef(p.partrelid), p.partstrat::text,"
    )
    assert text(sql.partition_key(42)).endswith("WHERE p.partrelid = 42")
    assert [s.takes_default for s in PartitionStrategy] == [True, True, False]
    assert Partitioning.from_dict({"key": "HASH (id)", "strategy": "h"}).strategy is (
        PartitionStrategy.HASH
    )


def test_the_staging_layout_is_one_object_chosen_from_the_plan() -> None:
    """The plan's StagingLayout picks the layout once: its staging's partition key, prepare's
    staging and the route's move of the rows all come from that one object."""
    target = TargetDefinition(
        "s", "t", 1, "o", "p", (Column("id", "integer", True),),
        partitioning=Partitioning("LIST (id)", PartitionStrategy.LIST),
    )  # fmt: skip
    plain = LoadPlan(
        "0123456789ab", "replace_partitions", target, naming.staging_table("0123456789ab"),
        naming.ledger_table("0123456789ab"), True, ("id",), CopyOptions(), (),
    )  # fmt: skip
    by_partition = dataclasses.replace(plain, staging_layout=StagingLayout(True, "few leaves"))
    assert partition_staging.layout_of(plain) is partition_staging.ONE_STAGING_TABLE
    assert partition_staging.layout_of(plain).partition_key(plain) is None
    layout = partition_staging.layout_of(LoadPlan.from_dict(by_partition.to_dict()))
    assert layout is partition_staging.STAGING_BY_PARTITION
    assert layout.partition_key(by_partition) == "LIST (id)"
