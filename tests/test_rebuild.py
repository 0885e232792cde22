"""strategy="rebuild" and "in_place" of append and upsert on a real server: the same rows as
plain SQL computes, the swapped-in table keeps everything of the target, a failure before
the swap leaves the target as it was, a finalize retried after its commit does nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from helpers import catalog_snapshot, create_items, leftovers, rows, write_csv
from psycopg import sql as psql
from test_replace import build_rich_target, new_rows
from test_upsert import READINGS, _existing, _files, _reference

from airflow_pg_bulk import runner, sql, steps
from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import LoadRequest

STRATEGIES = ["in_place", "rebuild", "auto"]
ITEM_COLUMNS = ["id", "name", "amount", "day", "note"]


def _strategy_of(caplog: Any) -> str:
    found = [r.getMessage() for r in caplog.records if ": strategy " in r.getMessage()]
    assert len(found) == 1, found
    return found[0].split(": strategy ")[1].split(" ")[0]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("partitions", [1, 3])
def test_upsert_each_strategy_matches_plain_sql(db, connect, tmp_path, strategy, partitions):
    create_items(db)
    _existing(db)
    files = _files(tmp_path)
    updated, inserted = _reference(db, files, ["id"], ITEM_COLUMNS)

    summary = runner.load(
        connect, db.table("items"), str(tmp_path / "*.csv"), mode="upsert",
        partitions=partitions, strategy=strategy,
    )  # fmt: skip

    assert (summary.inserted, summary.updated) == (inserted, updated)
    assert db.checksum("items") == db.checksum("expected")
    assert leftovers(db) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("existing", [True, False], ids=["onto-rows", "into-empty"])
def test_append_each_strategy_matches_plain_sql(db, connect, tmp_path, strategy, existing, caplog):
    create_items(db)
    if existing:
        _existing(db)
    path = write_csv(tmp_path / "a.csv", [(r[0] + 10_000, *r[1:]) for r in rows(2000, seed=3)])
    db.run(psql.SQL("CREATE TABLE {} AS TABLE {}").format(db.ident("expected"), db.ident("items")))
    with (
        db.conn.cursor() as cur,
        cur.copy(psql.SQL("COPY {} FROM STDIN (FORMAT csv)").format(db.ident("expected"))) as copy,
    ):
        copy.write(path.read_bytes())

    with caplog.at_level(logging.INFO, logger="airflow_pg_bulk"):
        summary = runner.load(
            connect, db.table("items"), str(path), mode="append", partitions=2, strategy=strategy
        )

    assert summary.rows == 2000
    assert db.checksum("items") == db.checksum("expected")
    assert leftovers(db) == []
    chosen = _strategy_of(caplog)
    if strategy == "auto":  # the empty target is rebuilt; 512 rows onto 2000 too (small)
        assert chosen == "rebuild"
    else:
        assert chosen == strategy


@pytest.mark.parametrize("strategy", ["in_place", "rebuild"])
def test_identity_serial_and_defaults_match_in_place(db, connect, tmp_path, strategy):
    """Upsert of a subset of the columns: updated rows keep the others (identity included),
    inserted rows get the defaults and identity values from the target's own sequence."""
    db.run(psql.SQL(READINGS).format(db.ident("readings")))
    db.run(
        f"INSERT INTO {db.schema}.readings (meter, day, value, note)"
        " SELECT m, date '2026-01-01' + d, m + d, 'old' FROM generate_series(1, 20) m,"
        " generate_series(0, 9) d"
    )
    lines = [f"{m},2026-01-{1 + d:02d},{m * 100 + d}.5" for m in range(15, 31) for d in range(12)]
    lines += ["15,2026-01-01,0.25"]
    path = tmp_path / "r.csv"
    path.write_text("\n".join(lines) + "\n")

    summary = runner.load(
        connect, db.table("readings"), str(path), mode="upsert", key=["meter", "day"],
        columns=["meter", "day", "value"], partitions=2, strategy=strategy,
    )  # fmt: skip

    got = {
        (m, str(d)): (rid, v, note)
        for rid, m, d, v, note in db.run(
            f"SELECT rid, meter, day, value::text, note FROM {db.schema}.readings"
        )
    }
    assert (summary.updated, summary.inserted) == (6 * 10, 10 * 12 + 6 * 2)
    assert got[(15, "2026-01-01")][1:] == ("0.25", "old")
    assert got[(30, "2026-01-12")][1:] == ("3011.50", "none")
    old = [rid for (m, _d), (rid, *_) in got.items() if m <= 20 and _d <= "2026-01-10"]
    new = [rid for (m, _d), (rid, *_) in got.items() if not (m <= 20 and _d <= "2026-01-10")]
    assert sorted(old) == list(range(1, 201))  # kept their identity
    # from the target's sequence (in place, ON CONFLICT draws a value for updated rows too)
    assert min(new) > 200 and len(set(new)) == len(new)
    db.run(f"INSERT INTO {db.schema}.readings (meter, day) VALUES (99, '2026-01-01')")
    assert db.scalar(f"SELECT max(rid) FROM {db.schema}.readings") > max(new)
    assert len({s for (s,) in db.run(f"SELECT seen FROM {db.schema}.readings")}) == len(got) + 1


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_rebuild_keeps_everything_a_replace_keeps(db, connect, tmp_path, mode):
    build_rich_target(db)
    db.run(f'ALTER TABLE {db.schema}."Items" DISABLE TRIGGER items_touch')
    before = catalog_snapshot(db, "Items")
    old = db.checksum("Items")
    shift = 40 if mode == "upsert" else 1000  # upsert: ids 41-50 replaced
    data = [(r[0] + shift, *r[1:]) for r in new_rows(200)]
    path = write_csv(tmp_path / "items.csv", data)

    summary = runner.load(
        connect, f'{db.schema}."Items"', str(path), mode=mode, partitions=2,
        strategy="rebuild", columns=["id", "name", "amount", "gid", "day", "note"],
    )  # fmt: skip

    assert catalog_snapshot(db, "Items") == before
    assert summary.rows == 200
    assert db.checksum("Items")[0] == old[0] + 200 - (10 if mode == "upsert" else 0)
    # validated constraints, enforced; the referencing key back; the serial went on
    assert db.scalar(
        f"SELECT bool_and(convalidated) FROM pg_constraint"
        f" WHERE conrelid = '{db.schema}.\"Items\"'::regclass"
    )
    with pytest.raises(Exception, match="items_amount_ok"):
        db.run(f"INSERT INTO {db.schema}.\"Items\" (name, amount) VALUES ('x', -1)")
    with pytest.raises(Exception, match="orders_item_fk"):
        db.run(f"INSERT INTO {db.schema}.orders VALUES (3, 999999)")
    db.run(f"INSERT INTO {db.schema}.\"Items\" (id, name) VALUES (100000, 'late')")
    serials = [s for (s,) in db.run(f'SELECT serial_no FROM {db.schema}."Items"')]
    assert len(set(serials)) == len(serials)
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.expensive_count") == 1
    assert leftovers(db) == []


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_without_ownership_auto_goes_in_place_and_rebuild_refuses(
    db, connect, tmp_path, mode, caplog, pg_dsn
):
    create_items(db)
    _existing(db)
    role = f"{db.schema}_loader"
    db.create_role(role)
    for statement in [
        "GRANT USAGE, CREATE ON SCHEMA {s} TO {r}",
        "GRANT SELECT, INSERT, UPDATE ON {s}.items TO {r}",
    ]:
        db.run(psql.SQL(statement).format(s=psql.Identifier(db.schema), r=psql.Identifier(role)))
    path = write_csv(tmp_path / "a.csv", [(r[0] + 10_000, *r[1:]) for r in rows(500, seed=3)])

    def as_loader() -> Any:
        conn = connect()
        with conn.cursor() as cur:
            cur.execute(f'SET ROLE "{role}"')
        conn.commit()
        return conn

    before = db.checksum("items")
    with pytest.raises(LoadRefusedError, match=r"strategy='rebuild' refused .* to own"):
        runner.load(as_loader, db.table("items"), str(path), mode=mode, strategy="rebuild")
    assert db.checksum("items") == before
    with caplog.at_level(logging.INFO, logger="airflow_pg_bulk"):
        runner.load(as_loader, db.table("items"), str(path), mode=mode, strategy="auto")
    assert _strategy_of(caplog) == "in_place"
    assert any("rebuild is not possible" in r.getMessage() for r in caplog.records)
    assert db.checksum("items")[0] == before[0] + 500
    assert leftovers(db) == []


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_failure_before_the_swap_commits_leaves_the_target(
    db, connect, tmp_path, mode, monkeypatch
):
    create_items(db)
    _existing(db)
    before = db.checksum("items")
    snapshot = catalog_snapshot(db, "items")
    write_csv(tmp_path / "a.csv", [(r[0] + 10_000, *r[1:]) for r in rows(3000, seed=3)])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected before the commit")

    monkeypatch.setattr(sql, "mark_finalized", broken)
    with pytest.raises(RuntimeError, match="injected"):
        runner.load(
            connect, db.table("items"), str(tmp_path / "a.csv"), mode=mode, partitions=2,
            strategy="rebuild",
        )  # fmt: skip

    assert db.checksum("items") == before
    assert catalog_snapshot(db, "items") == snapshot
    assert leftovers(db) == []


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_rebuild_retried_after_its_commit_does_nothing(db, connect, tmp_path, mode):
    create_items(db)
    _existing(db)
    _files(tmp_path)
    request = LoadRequest(
        table=db.table("items"), source=(str(tmp_path / "b.csv"),), mode=mode, partitions=2,
        strategy="rebuild",
    )  # fmt: skip
    conn = connect()
    try:
        plan = steps.prepare(conn, request, "00000000b7e1")
        assert plan.rebuilds
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        first = steps.finalize(conn, plan)
        after = db.checksum("items")
        again = steps.finalize(conn, plan)
        assert db.checksum("items") == after
        assert again.rows == first.rows
    finally:
        steps.cleanup(conn, db.schema, "00000000b7e1")
        conn.close()
    assert leftovers(db) == []


def test_strategy_is_for_append_and_upsert_only(tmp_path):
    with pytest.raises(ValueError, match="strategy applies to mode='append' and mode='upsert'"):
        LoadRequest(table="t", source=("x",), mode="replace", strategy="rebuild")
    with pytest.raises(ValueError, match="strategy must be one of"):
        LoadRequest(table="t", source=("x",), mode="append", strategy="fast")
