"""The upsert's key, piece numbering and SQL, decided without a server."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_pg_bulk import sql
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import Column, LoadPlan, Partition, Piece, planning

from .factories import LOAD_ID, request, target

PKEY = planning.UniqueIndex("readings_pkey", ("id",), primary=True, constraint="readings_pkey")
BY_METER = planning.UniqueIndex("readings_meter_key", ("meter", "value"), constraint="m_key")


def _spec(key=None, indexes=(PKEY, BY_METER), columns=("id", "meter", "value"), **changes):
    req = request(mode="upsert", key=key, **changes)
    return planning.upsert_spec(req, target(), columns, indexes)


def test_the_key_defaults_to_the_primary_key():
    spec = _spec()
    assert (spec.key, spec.index, spec.on_duplicate_key) == (("id",), "readings_pkey", "last")
    assert spec.override_identity and not spec.key_may_be_null  # id is GENERATED ALWAYS


def test_a_named_key_matches_a_unique_constraint_in_any_order():
    spec = _spec(key=("value", "meter"), columns=("meter", "value"))
    assert spec.key == ("value", "meter") and spec.index == "readings_meter_key"
    assert spec.key_may_be_null  # value is nullable and the index treats NULLs as distinct
    nnd = dataclasses.replace(BY_METER, nulls_not_distinct=True)
    assert not _spec(
        key=("meter", "value"), indexes=(nnd,), columns=("meter", "value")
    ).key_may_be_null


@pytest.mark.parametrize(
    ("key", "indexes", "columns", "message"),
    [
        (None, (BY_METER,), ("meter", "value"), "has no primary key.*unique constraint m_key"),
        (("meter",), (PKEY, BY_METER), ("meter",), "is not unique"),
        (("nope",), (PKEY,), ("id",), r"\['nope'\] are not columns"),
        (("id", "id"), (PKEY,), ("id",), "named twice"),
        (("meter", "value"), (dataclasses.replace(BY_METER, partial=True),), (), "is not unique"),
        (("meter", "value"), (dataclasses.replace(BY_METER, deferrable=True),), (), "DEFERRABLE"),
        (None, (PKEY,), ("meter", "value"), r"key columns \['id'\] are not loaded"),
    ],
)
def test_refusals_say_why(key, indexes, columns, message):
    with pytest.raises(LoadRefusedError, match=message):
        _spec(key=key, indexes=indexes, columns=columns)


def test_an_identity_always_column_outside_the_key_is_refused():
    t = target(columns=(Column("k", "int", True), Column("id", "bigint", True, identity="a")))
    req = request(mode="upsert", key=("k",))
    with pytest.raises(LoadRefusedError, match="GENERATED ALWAYS AS IDENTITY"):
        planning.upsert_spec(req, t, ("k", "id"), [planning.UniqueIndex("k_key", ("k",))])


def test_key_and_on_duplicate_key_belong_to_upsert():
    with pytest.raises(ValueError, match="apply to mode='upsert' only"):
        request(mode="append", key=("id",))
    with pytest.raises(ValueError, match="on_duplicate_key must be one of"):
        request(mode="upsert", on_duplicate_key="first")


def test_pieces_are_numbered_in_source_order_whatever_their_partition():
    parts = (
        Partition(0, (Piece("/b.csv", 0), Piece("/a.csv", 500, None)), 10),
        Partition(1, (Piece("/a.csv", 0, 500),), 10),
    )
    numbered = planning.number_pieces(parts, ["/a.csv", "/b.csv"])
    assert [[p.ordinal for p in part.pieces] for part in numbered] == [[2, 1], [0]]


def test_the_upsert_plan_round_trips_and_numbers_its_pieces():
    req = request(mode="upsert")
    spec = planning.upsert_spec(req, target(), ("id", "meter", "value"), [PKEY])
    p = planning.build_plan(
        req,
        target(),
        LOAD_ID,
        columns=("id", "meter", "value"),
        partitions=(Partition(0, (Piece("/r.csv", 0, 10), Piece("/r.csv", 10, 20)), 20),),
        source_bytes=20,
        upsert=spec,
        file_order=["/r.csv"],
    )
    assert LoadPlan.from_dict(p.to_dict()) == p
    assert [piece.ordinal for piece in p.partitions[0].pieces] == [0, 1]
    assert not p.staging_logged


def test_upsert_sql_renders_with_every_name_quoted():
    text = sql.upsert_from_staging(
        "s", "t", "stage", ["id", "Odd name"], ["id"],
        latest_wins=True, key_may_be_null=True, override_identity=True,
    ).as_string(None)  # fmt: skip
    assert 'INSERT INTO "s"."t" AS target ("id", "Odd name") OVERRIDING SYSTEM VALUE' in text
    assert (
        'SELECT DISTINCT ON ("id") "id", "Odd name" FROM "s"."stage" WHERE "id" IS NOT NULL' in text
    )
    assert 'ORDER BY "id", "_pgbulk_source_order" DESC' in text
    assert 'UNION ALL SELECT "id", "Odd name" FROM "s"."stage" WHERE NOT ("id" IS NOT NULL)' in text
    assert 'ON CONFLICT ("id") DO UPDATE SET "Odd name" = EXCLUDED."Odd name"' in text
    only_key = sql.upsert_from_staging(
        "s", "t", "stage", ["id"], ["id"],
        latest_wins=False, key_may_be_null=False, override_identity=False,
    ).as_string(None)  # fmt: skip
    assert 'SELECT "id" FROM "s"."stage"' in only_key
    assert 'DO UPDATE SET "id" = EXCLUDED."id"' in only_key
