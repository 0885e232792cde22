"""Identity columns in every mode and strategy, on plain and partitioned targets, GENERATED
ALWAYS and BY DEFAULT, loaded or not (issue 18): the rows plain SQL computes; a row the load
inserts without its identity value draws it from the target's own sequence, past every value
the sequence handed out before the load (a replace too: none is reused); a row kept or
updated keeps its value; the sequence (name, options, position) and the catalog of the table
and of each partition are as they were (no default gained by a swapped-in partition), and
``ALTER TABLE ... DROP IDENTITY`` works after the load; an INSERT after the load numbers on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import catalog_snapshot, leftovers, write_csv
from psycopg import sql as psql

from airflow_pg_bulk import runner
from airflow_pg_bulk.errors import LoadRefusedError

START, STEP = 10, 3  # the identity's own options, which a swap must carry over
LEAVES = ((0, 100), (100, 200), (200, 300))  # leaf 1 receives no row; leaf 2 starts empty
BEFORE = [(1, 5, 10), (2, 6, 20), (3, 150, 30), (4, 151, 40)]  # leaves 0 and 1
LOADED = [(2, 6, 21), (7, 7, 70), (8, 250, 80), (9, 251, 90)]  # leaves 0 and 2
NEW = [row for row in LOADED if row[:2] not in {r[:2] for r in BEFORE}]
GIVEN = 5000  # loaded identity values start here

CASES = [  # (partitioned, mode, strategy)
    (False, "append", "in_place"),
    (False, "append", "rebuild"),
    (False, "replace", "auto"),
    (False, "upsert", "in_place"),
    (False, "upsert", "rebuild"),
    (True, "append", "auto"),
    (True, "replace", "auto"),
    (True, "replace_partitions", "auto"),
    (True, "upsert", "auto"),
]


def _create(db: Any, partitioned: bool, kind: str) -> list[str]:
    """``pt`` (id, n, qty, rid identity) with rows in leaves 0 and 1 and its sequence moved
    past its largest value (rows inserted and deleted); returns its partitions."""
    t = db.ident("pt")
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id int, n int, qty int, rid bigint GENERATED {} AS IDENTITY"
            " (START WITH {} INCREMENT BY {}), PRIMARY KEY (id, n)){}"
        ).format(
            t,
            psql.SQL(kind),
            START,
            STEP,
            psql.SQL(" PARTITION BY RANGE (n)" if partitioned else ""),
        )
    )
    leaves = [f"pt_p{k}" for k in range(len(LEAVES))] if partitioned else []
    for name, (low, high) in zip(leaves, LEAVES, strict=False):
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(name), t, low, high
            )
        )
    insert = psql.SQL("INSERT INTO {} (id, n, qty) VALUES (%s, %s, %s)").format(t)
    for row in BEFORE:
        db.run(insert, *row)
    db.run(insert, 99, 99, 0)  # handed out, then gone: no load may use it again
    db.run(psql.SQL("DELETE FROM {} WHERE id = 99").format(t))
    return leaves


def _rows(db: Any) -> dict[tuple[int, int], tuple[int, int]]:
    return {
        (i, n): (q, r)
        for i, n, q, r in db.run(psql.SQL("SELECT id, n, qty, rid FROM {}").format(db.ident("pt")))
    }


def _expected(mode: str, data: list[tuple[int, ...]]) -> dict[tuple[int, int], int]:
    """(id, n) -> qty after loading ``data``, as plain SQL computes it."""
    before = {r[:2]: r[2] for r in BEFORE}
    loaded = {r[:2]: r[2] for r in data}
    if mode == "replace":
        return loaded
    if mode == "replace_partitions":
        touched = {next(k for k, (lo, hi) in enumerate(LEAVES) if lo <= n < hi) for _, n in loaded}
        kept = {
            key: q
            for key, q in before.items()
            if not any(LEAVES[k][0] <= key[1] < LEAVES[k][1] for k in touched)
        }
        return {**kept, **loaded}
    return {**before, **loaded}  # append (no key of the file is in the target) and upsert


def _sequence(db: Any) -> tuple[Any, ...]:
    return db.run(
        "SELECT s.relname, q.seqstart, q.seqincrement, q.seqmin, q.seqmax, q.seqcache,"
        " q.seqcycle, format_type(q.seqtypid, NULL), s.relpersistence,"
        " pg_get_userbyid(s.relowner) FROM pg_class s"
        " JOIN pg_sequence q ON q.seqrelid = s.oid"
        " WHERE s.oid = pg_get_serial_sequence(%s, 'rid')::regclass",
        f'"{db.schema}"."pt"',
    )[0]


@pytest.mark.parametrize("loaded", [False, True], ids=["rid-not-loaded", "rid-loaded"])
@pytest.mark.parametrize("kind", ["ALWAYS", "BY DEFAULT"])
@pytest.mark.parametrize(("partitioned", "mode", "strategy"), CASES)
def test_identity_in_every_mode(
    db, connect, tmp_path: Path, partitioned, mode, strategy, kind, loaded
):
    leaves = _create(db, partitioned, kind)
    data = [r for r in LOADED if mode == "upsert" or r in NEW]
    if loaded:
        data = [(*r, GIVEN + k) for k, r in enumerate(data)]
    path = write_csv(tmp_path / "load.csv", data)
    columns = ["id", "n", "qty", "rid"] if loaded else ["id", "n", "qty"]
    tables = ["pt", *leaves]
    catalog_before = {name: catalog_snapshot(db, name) for name in tables}
    sequence_before = _sequence(db)
    rows_before = _rows(db)
    handed_out = db.scalar(psql.SQL("SELECT last_value FROM {}").format(db.ident("pt_rid_seq")))

    def load() -> Any:
        return runner.load(
            connect,
            db.table("pt"),
            str(path),
            mode=mode,
            strategy=strategy,
            columns=columns,
            key=["id", "n"] if mode == "upsert" else None,
            partitions=2,
        )

    if mode == "upsert" and loaded and kind == "ALWAYS":
        # an upsert cannot set a GENERATED ALWAYS column on the rows it updates
        with pytest.raises(LoadRefusedError, match="GENERATED ALWAYS"):
            load()
        assert _rows(db) == rows_before
        return
    load()

    got = _rows(db)
    expected = _expected(mode, data)
    assert {key: qty for key, (qty, _rid) in got.items()} == expected
    for key, (_qty, rid) in got.items():
        source = next((r for r in data if r[:2] == key), None)
        if source is not None and loaded:
            assert rid == source[3], key  # the value loaded
        elif source is None or (key in rows_before and mode == "upsert"):
            assert rid == rows_before[key][1], key  # kept, or updated: its own value
        else:  # inserted without one: a new value of the target's own sequence
            assert rid > handed_out and (rid - START) % STEP == 0, (key, rid, handed_out)
    rids = [rid for _qty, rid in got.values()]
    assert len(set(rids)) == len(rids)

    assert _sequence(db) == sequence_before
    assert {name: catalog_snapshot(db, name) for name in tables} == catalog_before
    t = db.ident("pt")
    db.run(psql.SQL("INSERT INTO {} (id, n, qty) VALUES (50, 50, 5)").format(t))
    after = db.scalar(psql.SQL("SELECT rid FROM {} WHERE id = 50").format(t))
    if not loaded:
        assert after > max(rids) and (after - START) % STEP == 0
    db.run(psql.SQL("ALTER TABLE {} ALTER COLUMN rid DROP IDENTITY").format(t))
    assert leftovers(db) == []


def test_the_issues_append_into_an_empty_table_auto_rebuilds(db, connect, tmp_path, caplog):
    """Issue 18, as filed: an append (strategy auto: an empty target is rebuilt) of a table
    whose GENERATED ALWAYS identity the file does not fill failed with "column rid can only
    be updated to DEFAULT"."""
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, qty int, rid bigint GENERATED ALWAYS AS IDENTITY)"
        ).format(db.ident("ia"))
    )
    path = write_csv(tmp_path / "load.csv", [(1, 10), (2, 20)])
    caplog.set_level("INFO", logger="airflow_pg_bulk")

    runner.load(connect, db.table("ia"), str(path), mode="append", columns=["id", "qty"])

    assert any("strategy rebuild" in r.getMessage() for r in caplog.records)
    assert db.run(psql.SQL("SELECT id, qty, rid FROM {} ORDER BY id").format(db.ident("ia"))) == [
        (1, 10, 1), (2, 20, 2),
    ]  # fmt: skip
    db.run(psql.SQL("INSERT INTO {} (id, qty) VALUES (3, 30)").format(db.ident("ia")))
    assert db.scalar(psql.SQL("SELECT rid FROM {} WHERE id = 3").format(db.ident("ia"))) == 3


COLUMN_SETTINGS = (
    "SELECT attname, attnotnull, attidentity, pg_get_expr(adbin, adrelid),"
    " coalesce(attstattarget, -1)::int, attstorage, ARRAY(SELECT o FROM"
    " unnest(coalesce(attoptions, '{}')) o WHERE o LIKE 'n\\_distinct%%')::text[]"
    " FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum"
    " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
)


@pytest.mark.parametrize(
    ("partitioned", "mode", "strategy"),
    [
        (False, "replace", "auto"),
        (False, "append", "rebuild"),
        (True, "replace", "auto"),
        (True, "replace_partitions", "auto"),
        (True, "append", "auto"),  # into the empty pt_p2: swapped in
    ],
)
def test_a_swapped_in_table_keeps_its_columns_settings(
    db, connect, tmp_path, partitioned, mode, strategy
):
    """A column's statistics target, storage, n_distinct and (a partition's own) default are
    the replaced table's, not those staging took from the target."""
    leaves = _create(db, partitioned, "ALWAYS")
    tables = [leaves[0], leaves[2]] if partitioned else ["pt"]
    db.run(psql.SQL("ALTER TABLE {} ADD COLUMN note text").format(db.ident("pt")))
    for name in tables:
        t = db.ident(name)
        db.run(psql.SQL("ALTER TABLE {} ALTER qty SET STATISTICS 500").format(t))
        db.run(psql.SQL("ALTER TABLE {} ALTER qty SET (n_distinct = 7)").format(t))
        db.run(psql.SQL("ALTER TABLE {} ALTER note SET STORAGE EXTERNAL").format(t))
        if partitioned:
            db.run(psql.SQL("ALTER TABLE {} ALTER qty SET DEFAULT 7").format(t))
    before = {name: db.run(COLUMN_SETTINGS, f'"{db.schema}"."{name}"') for name in tables}
    path = write_csv(tmp_path / "load.csv", NEW)

    runner.load(
        connect, db.table("pt"), str(path), mode=mode, strategy=strategy,
        columns=["id", "n", "qty"],
    )  # fmt: skip

    after = {name: db.run(COLUMN_SETTINGS, f'"{db.schema}"."{name}"') for name in tables}
    assert after == before
    assert _expected(mode, NEW) == {key: q for key, (q, _rid) in _rows(db).items()}
