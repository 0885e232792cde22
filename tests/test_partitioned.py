"""Partitioned targets (range, list, hash) on a real server: every mode gives what plain SQL
computes; replace_partitions leaves the partitions that receive no row as they were (same
relfilenode) and the replaced ones keep their catalog; a row in no partition names its file,
line and value and leaves the target as it was; a DEFAULT partition takes such rows; a
failure before the swap leaves the target as it was; cleanup drops everything; a
multi-level target is refused."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import catalog_snapshot, daily_target, leftovers, write_csv
from psycopg import sql as psql

from airflow_pg_bulk import runner, sql, steps
from airflow_pg_bulk.db.driver import connect as connect_driver
from airflow_pg_bulk.errors import (
    BadDataError,
    ConstraintViolationError,
    LoadRefusedError,
    TransientLoadError,
)
from airflow_pg_bulk.plan import Column, LoadRequest, Partitioning, TargetDefinition
from airflow_pg_bulk.plan.codes import PartitionStrategy
from airflow_pg_bulk.target import catalog, partitioned

COLUMNS = ["id", "day", "region", "site", "value", "note"]
KINDS = {
    # kind: (partition key, primary key, the partitions' bounds)
    "range": (
        "RANGE (day)",
        "id, day",
        [f"FROM ('2024-{m:02d}-01') TO ('2024-{m + 1:02d}-01')" for m in range(1, 5)],
    ),
    "list": ("LIST (region)", "id, region", [f"IN ('{r}')" for r in "nsew"]),
    "hash": ("HASH (id)", "id", [f"WITH (MODULUS 4, REMAINDER {r})" for r in range(4)]),
}
# the rows loaded fall into partitions 1 and 2 (of 0..3) only
LOADED_PARTITIONS = (1, 2)
DAY0 = datetime.date(2024, 1, 1)


def _row(i: int, bump: int = 0) -> tuple[Any, ...]:
    return (
        i,
        DAY0 + datetime.timedelta(days=i * 7 % 120),
        "nsew"[i % 4],
        i % 5 + 1,
        f"{(i * 13 % 1000) / 10 + bump:.2f}",
        f"note {i}",
    )


def make_target(
    db: Any, name: str, kind: str, *, with_keys: bool = True, default: bool = False
) -> None:
    """``name`` partitioned by ``kind`` into ``name_p0`` .. ``name_p3`` (and ``name_other``,
    the DEFAULT partition, with ``default``): a primary key with the partition key, an index,
    a CHECK and a foreign key to ``sites``."""
    key, pk, bounds = KINDS[kind]
    extra = (
        psql.SQL(
            ", PRIMARY KEY ({}), CONSTRAINT {} CHECK (value >= 0),"
            " CONSTRAINT {} FOREIGN KEY (site) REFERENCES {}"
        ).format(
            psql.SQL(pk),
            psql.Identifier(f"{name}_value_ok"),
            psql.Identifier(f"{name}_site_fk"),
            db.ident("sites"),
        )
        if with_keys
        else psql.SQL("")
    )
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id integer NOT NULL, day date NOT NULL, region text NOT NULL,"
            " site integer, value numeric(10,2), note text{}) PARTITION BY {}"
        ).format(db.ident(name), extra, psql.SQL(key))
    )
    for n, bound in enumerate(bounds):
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES {}").format(
                db.ident(f"{name}_p{n}"), db.ident(name), psql.SQL(bound)
            )
        )
    if default:
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} DEFAULT").format(
                db.ident(f"{name}_other"), db.ident(name)
            )
        )
    if with_keys:
        db.run(
            psql.SQL("CREATE INDEX {} ON {} (site, day)").format(
                psql.Identifier(f"{name}_site_day"), db.ident(name)
            )
        )


def setup_target(db: Any, kind: str) -> None:
    """``sites`` and ``readings`` (400 rows in all four partitions), ``readings_p1`` with a
    grant, comments and an owner of its own."""
    db.run(psql.SQL("CREATE TABLE {} (id integer PRIMARY KEY)").format(db.ident("sites")))
    db.run(psql.SQL("INSERT INTO {} SELECT generate_series(1, 5)").format(db.ident("sites")))
    make_target(db, "readings", kind)
    _insert(db, "readings", [_row(i) for i in range(1, 401)])
    role = f"{db.schema}_r"
    db.create_role(role)
    p1 = db.ident("readings_p1")
    db.run(psql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(p1, psql.Identifier(role)))
    db.run(psql.SQL("COMMENT ON TABLE {} IS 'partition one'").format(p1))
    db.run(psql.SQL("ALTER TABLE {} OWNER TO {}").format(p1, psql.Identifier(role)))


def _insert(db: Any, table: str, data: list[tuple[Any, ...]]) -> None:
    with db.conn.cursor() as cur:
        cur.executemany(
            psql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s)").format(db.ident(table)),
            data,
        )


def loaded_rows(db: Any, kind: str, mode: str) -> list[tuple[Any, ...]]:
    """The rows a test loads: only into partitions 1 and 2 (the server says which rows go
    where: a routing table partitioned like the target); overlapping the target's keys but
    for an append; an upsert's have keys repeated later in the file with other values."""
    first = 401 if mode == "append" else 300
    candidates = [_row(i) for i in range(first, 701)]
    make_target(db, "route", kind, with_keys=False)
    _insert(db, "route", candidates)
    wanted = {
        row[0]
        for n in LOADED_PARTITIONS
        for row in db.run(psql.SQL("SELECT id FROM {}").format(db.ident(f"route_p{n}")))
    }
    db.run(psql.SQL("DROP TABLE {}").format(db.ident("route")))
    data = [row for row in candidates if row[0] in wanted]
    if mode == "upsert":
        data += [_row(row[0], bump=1) for row in data[10:40]]
    return data


def reference(
    db: Any, kind: str, mode: str, path: Path, *, default: bool = False
) -> tuple[int, str]:
    """What plain SQL makes of the target and the file in ``mode``: its checksum."""
    key = KINDS[kind][1]
    make_target(db, "ref", kind, with_keys=False, default=default)
    db.run(
        psql.SQL("INSERT INTO {} SELECT * FROM {}").format(db.ident("ref"), db.ident("readings"))
    )
    db.run(
        psql.SQL("CREATE TABLE {} (LIKE {}, ord bigserial)").format(
            db.ident("loaded"), db.ident("readings")
        )
    )
    with (
        db.conn.cursor() as cur,
        cur.copy(
            psql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                db.ident("loaded"), psql.SQL(", ".join(COLUMNS))
            )
        ) as copy,
    ):
        copy.write(path.read_bytes())
    cols = psql.SQL(", ".join(COLUMNS))
    insert = psql.SQL("INSERT INTO {} SELECT {} FROM {}").format(
        db.ident("ref"), cols, db.ident("loaded")
    )
    if mode == "replace":
        db.run(psql.SQL("TRUNCATE {}").format(db.ident("ref")))
    if mode == "replace_partitions":
        make_target(db, "route", kind, with_keys=False, default=default)
        db.run(
            psql.SQL("INSERT INTO {} SELECT {} FROM {}").format(
                db.ident("route"), cols, db.ident("loaded")
            )
        )
        for suffix in [f"p{n}" for n in range(4)] + (["other"] if default else []):
            routed = psql.SQL("SELECT EXISTS (SELECT FROM {})").format(db.ident(f"route_{suffix}"))
            if db.scalar(routed):
                db.run(psql.SQL("TRUNCATE {}").format(db.ident(f"ref_{suffix}")))
    if mode == "upsert":  # the loaded keys' rows go; the latest loaded row per key comes
        match = psql.SQL(" AND ").join(
            psql.SQL("r.{0} = l.{0}").format(psql.Identifier(c.strip())) for c in key.split(",")
        )
        db.run(
            psql.SQL("DELETE FROM {} r USING {} l WHERE {}").format(
                db.ident("ref"), db.ident("loaded"), match
            )
        )
        insert = psql.SQL(
            "INSERT INTO {} SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {}, ord DESC"
        ).format(db.ident("ref"), psql.SQL(key), cols, db.ident("loaded"), psql.SQL(key))
    db.run(insert)
    return db.checksum("ref", ", ".join(COLUMNS))


def filenodes(db: Any) -> dict[str, int]:
    return {
        f"readings_p{n}": db.scalar(
            "SELECT pg_relation_filenode(%s::regclass)", f'"{db.schema}"."readings_p{n}"'
        )
        for n in range(4)
    }


MODES = ["replace_partitions", "replace", "append", "upsert"]


@pytest.fixture
def swapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition that receives rows is built beside the target and swapped in, however
    few its rows (by default a partition of up to IN_PLACE_ROWS rows is loaded in place)."""
    monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)


@pytest.mark.parametrize("way", ["in_place", "swap"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_matches_plain_sql(db, pg_dsn, tmp_path, monkeypatch, kind, mode, way):
    """Both ways of loading a partition (in place, or built beside and swapped in) give the
    same rows and keep the partitions' catalog. In place, a replace keeps each partition's
    file: its rows are replaced by its primary key (DELETE and MERGE), not emptied by
    TRUNCATE."""
    if way == "swap":
        monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
    setup_target(db, kind)
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, kind, mode))
    expected = reference(db, kind, mode, path)
    before = filenodes(db)
    catalog_before = {name: catalog_snapshot(db, name) for name in before}

    summary = runner.load(pg_dsn, db.table("readings"), str(path), mode=mode, partitions=2)

    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    assert summary.rows == len(path.read_text().splitlines())
    after = filenodes(db)
    for n in range(4):
        name = f"readings_p{n}"
        replaced = n in LOADED_PARTITIONS and mode in ("replace_partitions", "replace")
        swapped = replaced and way == "swap"
        if mode != "replace" and not swapped:
            assert after[name] == before[name], name  # not rewritten
        if swapped:
            assert after[name] != before[name], name
        # indexes, validated constraints, grants, comments, owner
        assert catalog_snapshot(db, name) == catalog_before[name], name
    assert leftovers(db) == []


def _snapshot(db: Any) -> tuple[Any, ...]:
    """The target's rows, its partitions' files and catalog: what 'as it was' means."""
    return (
        db.checksum("readings", ", ".join(COLUMNS)),
        filenodes(db),
        {f"readings_p{n}": catalog_snapshot(db, f"readings_p{n}") for n in range(4)},
    )


@pytest.mark.usefixtures("swapping")
def test_psycopg2_replace_partitions_reruns_to_the_same_table(db, pg_dsn, tmp_path, caplog):
    """On psycopg2 (most tests here use psycopg 3), the daily reload: the same load twice
    gives the same table. In one process the partitions are built side by side, each on a
    session of its own, before finalize (which then finds them built)."""
    setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", "replace_partitions"))
    expected = reference(db, "range", "replace_partitions", path)
    for _ in range(2):
        with caplog.at_level(logging.INFO, logger="airflow_pg_bulk"):
            summary = runner.load(
                lambda: connect_driver(pg_dsn, "psycopg2"),
                db.table("readings"),
                str(path),
                mode="replace_partitions",
                jobs=2,
            )
        assert db.checksum("readings", ", ".join(COLUMNS)) == expected
        assert summary.seconds["build_partitions"] > 0
    built = [r.getMessage() for r in caplog.records if "built on" in r.getMessage()]
    assert len(built) == 2
    assert all("2 table partitions of" in m and "2 sessions" in m for m in built)
    assert leftovers(db) == []


def test_psycopg2_replaces_in_place_by_key_and_finds_a_duplicate_key(db, pg_dsn, tmp_path, caplog):
    """On psycopg2 (the savepoint, the DELETE and the MERGE one round trip each): the
    partitions replaced by key, their files kept; a key staged twice that a partition holds
    fails the MERGE, and the load fails with the unique violation of the way without a key,
    the target as it was."""
    setup_target(db, "range")
    data = loaded_rows(db, "range", "replace_partitions")
    path = write_csv(tmp_path / "load.csv", data)
    expected = reference(db, "range", "replace_partitions", path)
    before = filenodes(db)

    def psycopg2() -> Any:
        return connect_driver(pg_dsn, "psycopg2")

    runner.load(psycopg2, db.table("readings"), str(path), mode="replace_partitions")

    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    assert filenodes(db) == before
    loaded = _snapshot(db)
    twice = write_csv(tmp_path / "twice.csv", [*data, data[3]])
    with (
        caplog.at_level(logging.INFO, logger="airflow_pg_bulk"),
        pytest.raises(ConstraintViolationError, match="_pkey"),
    ):
        runner.load(psycopg2, db.table("readings"), str(twice), mode="replace_partitions")
    assert "emptying it and inserting" in caplog.text
    assert _snapshot(db) == loaded
    assert leftovers(db) == []


def test_a_row_in_no_partition_names_file_line_and_value(db, pg_dsn, tmp_path):
    setup_target(db, "range")
    data = loaded_rows(db, "range", "replace_partitions")
    stray = (9999, datetime.date(2030, 5, 17), "n", 1, "1.00", "stray")
    path = write_csv(tmp_path / "load.csv", [*data[:50], stray, *data[50:]])
    before = _snapshot(db)

    with pytest.raises(BadDataError) as failed:
        runner.load(pg_dsn, db.table("readings"), str(path), mode="replace_partitions")

    message = str(failed.value)
    assert "load.csv line 51" in message, message
    assert "2030-05-17" in message and "readings" in message and "_pgbulk_" not in message
    assert failed.value.line == 51
    assert _snapshot(db) == before
    assert leftovers(db) == []

    # with on_error="reject", it is set aside like a bad value and the rest loads (staging
    # is one plain table: a CHECK that a row is in one of the partitions sets it aside)
    summary = runner.load(
        pg_dsn, db.table("readings"), str(path), mode="replace_partitions",
        on_error="reject", max_rejects=1,
    )  # fmt: skip
    assert (summary.rows, summary.rejects) == (len(data), 1)
    assert db.run(psql.SQL("SELECT line, error FROM {}").format(db.ident("pgbulk_rejects"))) == [
        (
            51,
            'new row for relation "readings" violates check constraint'
            ' "the table partitions of readings"',
        )
    ]
    assert leftovers(db) == []


def test_a_default_partition_takes_the_rows_no_other_takes(db, pg_dsn, tmp_path):
    """Rows of no other partition go to the DEFAULT one, which is then replaced like any (in
    place, by its primary key: no partition's file is rewritten)."""
    setup_target(db, "range")
    db.run(
        psql.SQL("CREATE TABLE {} PARTITION OF {} DEFAULT").format(
            db.ident("readings_other"), db.ident("readings")
        )
    )
    _insert(db, "readings", [(5000, datetime.date(2031, 1, 1), "n", 1, "2.00", "old")])
    data = loaded_rows(db, "range", "replace_partitions")
    late = [(6000 + i, datetime.date(2030, 1, 1 + i), "s", 2, "3.00", "late") for i in range(5)]
    path = write_csv(tmp_path / "load.csv", [*data, *late])
    expected = reference(db, "range", "replace_partitions", path, default=True)
    before = filenodes(db)

    runner.load(pg_dsn, db.table("readings"), str(path), mode="replace_partitions")

    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    assert db.scalar(psql.SQL("SELECT count(*) FROM {}").format(db.ident("readings_other"))) == 5
    assert filenodes(db) == before
    assert leftovers(db) == []


STEPS = [
    ("replace_partitions", "insert_from_staging"),  # routing the rows to their partitions
    ("replace_partitions", "add_constraint"),  # its foreign key, after its indexes
    ("replace_partitions", "validate_constraint"),
    ("replace_partitions", "attach_partition"),  # in the swap's transaction
    ("replace_partitions", "mark_finalized"),  # the swap's last statement before COMMIT
    ("replace", "truncate"),  # emptying a partition that received no row
    ("append", "insert_from_staging"),  # the in-place append into a non-empty partition
    ("append", "attach_partition"),  # the empty partition's attach
]
# the same, each partition loaded in place (few rows)
IN_PLACE_STEPS = [
    ("replace_partitions", "in_place_check"),  # routing: in place or swapped? by key?
    ("replace_partitions", "replace_by_key"),  # the DELETE and MERGE by the primary key
    ("replace_partitions", "mark_finalized"),
    ("append", "insert_from_staging"),
]


def _start(db: Any, mode: str, tmp_path: Path) -> tuple[Path, tuple[int, str]]:
    """The range target (partition 1 emptied for an append, so that both of its ways run),
    the file, and what plain SQL makes of them."""
    setup_target(db, "range")
    if mode == "append":
        db.run(psql.SQL("TRUNCATE {}").format(db.ident("readings_p1")))
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", mode))
    return path, reference(db, "range", mode, path)


@pytest.mark.parametrize(("mode", "step"), STEPS, ids=[f"{m}-{s}" for m, s in STEPS])
@pytest.mark.usefixtures("swapping")
def test_a_failure_at_each_step_leaves_the_target_and_finalize_retried_goes_on(
    db, pg_dsn, tmp_path, monkeypatch, mode, step
):
    """finalize fails at ``step``: the target is as it was; finalize run again (what was
    built is kept) loads exactly once; cleanup then drops everything the run made."""
    _fail_then_retry(db, pg_dsn, tmp_path, monkeypatch, mode, step)


@pytest.mark.parametrize(
    ("mode", "step"), IN_PLACE_STEPS, ids=[f"{m}-{s}" for m, s in IN_PLACE_STEPS]
)
def test_a_failure_at_each_step_in_place_leaves_the_target_and_finalize_retried_goes_on(
    db, pg_dsn, tmp_path, monkeypatch, mode, step
):
    _fail_then_retry(db, pg_dsn, tmp_path, monkeypatch, mode, step)


def _fail_then_retry(
    db: Any, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, step: str
) -> None:
    path, expected = _start(db, mode, tmp_path)
    before = _snapshot(db)
    request = LoadRequest(mode=mode, table=db.table("readings"), source=(str(path),), partitions=2)
    conn = connect_driver(pg_dsn)
    plan = steps.prepare(conn, request, "a1b2c3d4e5f6")
    for part in plan.partitions:
        steps.copy_partition(conn, plan, part.index)
    real = getattr(sql, step)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"injected at {step}")

    monkeypatch.setattr(sql, step, broken)
    with pytest.raises(RuntimeError, match="injected"):
        steps.finalize(conn, plan)
    assert _snapshot(db) == before
    monkeypatch.setattr(sql, step, real)

    summary = steps.finalize(conn, plan)
    assert summary.rows == len(path.read_text().splitlines())
    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    assert leftovers(db) != []  # staging is cleanup's to drop
    steps.cleanup(conn, db.schema, plan.load_id)
    conn.close()
    assert leftovers(db) == []


def test_a_copy_retried_after_its_commit_loads_nothing_twice(db, pg_dsn, tmp_path):
    path, expected = _start(db, "replace_partitions", tmp_path)
    request = LoadRequest(
        mode="replace_partitions", table=db.table("readings"), source=(str(path),), partitions=2
    )
    conn = connect_driver(pg_dsn, "psycopg2")
    plan = steps.prepare(conn, request, "b1b2c3d4e5f6")
    first = [steps.copy_partition(conn, plan, p.index) for p in plan.partitions]
    again = [steps.copy_partition(conn, plan, p.index) for p in plan.partitions]
    assert [r.skipped for r in first + again] == [False] * 2 + [True] * 2
    steps.finalize(conn, plan)
    steps.cleanup(conn, db.schema, plan.load_id)
    conn.close()
    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    assert leftovers(db) == []


@pytest.mark.parametrize(
    ("kind", "strategy"),
    [
        ("range", PartitionStrategy.RANGE),
        ("list", PartitionStrategy.LIST),
        ("hash", PartitionStrategy.HASH),
    ],
)
def test_the_partitioning_strategy_is_captured_as_a_value(db, pg_dsn, kind, strategy):
    """prepare captures the target's strategy (``partstrat``) beside its key's text, and the
    plan carries it through plain data (XCom) as the same value."""
    make_target(db, "readings", kind, with_keys=False)
    conn = connect_driver(pg_dsn)
    try:
        parts = catalog.capture(conn, db.schema, "readings").partitioning
    finally:
        conn.close()
    assert parts is not None
    assert (parts.key, parts.strategy) == (KINDS[kind][0], strategy)
    # the key's column and type, kept for finalize's route (which reads them no more)
    column = {"range": ("day", "date"), "list": ("region", "text"), "hash": ("id", "integer")}
    assert parts.columns == (column[kind],)
    assert parts.strategy.takes_default is (strategy is not PartitionStrategy.HASH)
    again = Partitioning.from_dict(json.loads(json.dumps(parts.to_dict())))
    assert again == parts and again.strategy is strategy


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_key_with_an_expression_is_captured_part_by_part_and_its_rows_still_routed(
    db, pg_dsn, tmp_path, monkeypatch, driver
):
    """A key of an expression and a column: prepare keeps its parts in order, the
    expression's as (None, None); finalize then routes the rows by the partitions' bounds as
    it must for an expression (every partition a candidate), and a plan made before the parts
    were kept (none in it) reads them at finalize, as it did, and is not refused by the
    swap's check of the parent. The rows land where plain SQL puts them, on either driver."""
    monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)  # swapped: the parent checked
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id integer NOT NULL, region text NOT NULL, day date NOT NULL,"
            " v integer) PARTITION BY LIST (lower(region))"
        ).format(db.ident("by_expr"))
    )
    for n, region in enumerate("ns"):
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES IN ({})").format(
                db.ident(f"by_expr_{n}"), db.ident("by_expr"), psql.Literal(region)
            )
        )
    rows = [[i, "N" if i % 2 else "s", f"2024-01-{i:02d}", i * 10] for i in range(1, 21)]
    path = write_csv(tmp_path / "load.csv", rows)
    conn = connect_driver(pg_dsn, driver)
    try:
        parts = catalog.capture(conn, db.schema, "by_expr").partitioning
        conn.rollback()
        assert parts is not None and parts.columns == ((None, None),)
        for kept in (True, False):
            request = LoadRequest(
                mode="replace_partitions", table=db.table("by_expr"), source=(str(path),)
            )
            plan = steps.prepare(conn, request, f"e{int(kept)}b2c3d4e5f6")
            if not kept:  # a plan from before: no parts in it
                key = dataclasses.replace(plan.target.required_partitioning(), columns=())
                plan = dataclasses.replace(
                    plan, target=dataclasses.replace(plan.target, partitioning=key)
                )
            for part in plan.partitions:
                steps.copy_partition(conn, plan, part.index)
            summary = steps.finalize(conn, plan)
            steps.cleanup(conn, db.schema, plan.load_id)
            assert summary.rows == 20
            by_leaf = db.run(
                psql.SQL(
                    "SELECT tableoid::regclass::text, count(*) FROM {} GROUP BY 1 ORDER BY 1"
                ).format(db.ident("by_expr"))
            )
            assert [(name.split(".")[-1], n) for name, n in by_leaf] == [
                ("by_expr_0", 10),
                ("by_expr_1", 10),
            ]
    finally:
        conn.close()
    assert leftovers(db) == []


def test_multi_level_and_plain_targets_are_refused(db, pg_dsn, tmp_path):
    setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", [_row(1)])
    db.run(
        psql.SQL(
            "CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')"
            " PARTITION BY RANGE (day)"
        ).format(db.ident("readings_2025"), db.ident("readings"))
    )
    with pytest.raises(LoadRefusedError, match=r"more than one level.*readings_2025"):
        runner.load(pg_dsn, db.table("readings"), str(path), mode="replace_partitions")
    with pytest.raises(LoadRefusedError, match="top-level parent"):
        runner.load(pg_dsn, db.table("readings_2025"), str(path), mode="append")
    with pytest.raises(LoadRefusedError, match="replace_partitions needs a partitioned target"):
        runner.load(pg_dsn, db.table("sites"), str(path), mode="replace_partitions")
    assert leftovers(db) == []


@pytest.mark.usefixtures("swapping")
def test_append_attaches_into_an_empty_partition_and_attach_skips_its_scan(db, pg_dsn, tmp_path):
    """An empty partition that receives rows is swapped in by ATTACH (new relfilenode, same
    catalog), whose scan the CHECK made while empty skips (the server says so at DEBUG1); a
    partition that holds rows gets them in place (same relfilenode)."""
    setup_target(db, "range")
    db.run(psql.SQL("TRUNCATE {}").format(db.ident("readings_p1")))
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", "append"))
    expected = reference(db, "range", "append", path)
    before = filenodes(db)
    catalog_before = catalog_snapshot(db, "readings_p1")
    notices: list[str] = []

    def connect() -> Any:
        conn = psycopg.connect(pg_dsn, options="-c client_min_messages=debug1")
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        return conn

    runner.load(connect, db.table("readings"), str(path), mode="append")

    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    after = filenodes(db)
    assert [after[name] == before[name] for name in sorted(before)] == [True, False, True, True]
    assert catalog_snapshot(db, "readings_p1") == catalog_before
    implied = [m for m in notices if "is implied by existing constraints" in m]
    assert implied == [
        'partition constraint for table "readings_p1" is implied by existing constraints'
    ], notices
    assert leftovers(db) == []


def test_upsert_refuses_a_row_in_no_partition_naming_its_file_and_line(db, pg_dsn, tmp_path):
    """upsert stages into a plain table and routes in finalize: a row no partition takes
    fails the load naming its values and, read again from the source, its file and line (the
    line in the file, not in its piece); of two such rows, the first in source order; the
    target is as it was."""
    setup_target(db, "list")
    a = write_csv(tmp_path / "a.csv", [_row(i) for i in range(300, 360)])
    b_rows = [_row(i) for i in range(360, 420)]
    b_rows[39] = (9998, datetime.date(2024, 2, 2), "x", 1, "1.00", "stray")  # b.csv line 40
    b_rows[51] = (9999, datetime.date(2024, 2, 3), "y", 1, "1.00", "stray")  # b.csv line 52
    b = write_csv(tmp_path / "b.csv", b_rows)
    before = _snapshot(db)
    request = LoadRequest(
        mode="upsert", table=db.table("readings"), source=(str(a), str(b)), partitions=4
    )
    conn = connect_driver(pg_dsn)
    plan = steps.prepare(conn, request, "c1b2c3d4e5f6")
    stray_at = len("".join(b.read_text().splitlines(keepends=True)[:39]))  # its byte offset
    holder = max(
        (p for part in plan.partitions for p in part.pieces if p.path == str(b)),
        key=lambda p: p.start if p.start <= stray_at else -1,
    )
    assert holder.start > 0  # a later piece of b.csv: its line 40 is not its piece's line 40
    for part in plan.partitions:
        steps.copy_partition(conn, plan, part.index)

    with pytest.raises(BadDataError) as failed:
        steps.finalize(conn, plan)

    message = str(failed.value)
    assert "no table partition of it takes the loaded row (9998," in message
    assert f"found at {b} line 40." in message
    assert (failed.value.path, failed.value.line) == (str(b), 40)
    assert "9999" not in message
    assert _snapshot(db) == before
    steps.cleanup(conn, db.schema, plan.load_id)
    conn.close()
    assert leftovers(db) == []


def test_upsert_names_the_files_when_the_row_in_no_partition_cannot_be_found(db, pg_dsn, tmp_path):
    """A row set aside by on_error="reject" (a.csv line 3) stops the source's second reading
    before the row no partition takes: the error names the files the load read instead."""
    setup_target(db, "list")
    a_rows: list[tuple[Any, ...]] = [_row(i) for i in range(300, 310)]
    a_rows[2] = (302, "not a date", "n", 1, "1.00", "bad")
    a = write_csv(tmp_path / "a.csv", a_rows)
    b = write_csv(tmp_path / "b.csv", [(9998, datetime.date(2024, 2, 2), "x", 1, "1.00", "")])
    before = _snapshot(db)
    with pytest.raises(BadDataError) as failed:
        runner.load(
            pg_dsn, db.table("readings"), [str(a), str(b)], mode="upsert",
            on_error="reject", max_rejects=1,
        )  # fmt: skip
    message = str(failed.value)
    assert "no table partition of it takes the loaded row (9998," in message
    assert f"the offending rows came from {a}, {b}." in message
    assert (failed.value.path, failed.value.line) == (None, None)
    assert _snapshot(db) == before
    assert leftovers(db) == []


def test_append_by_a_role_that_does_not_own_the_target_goes_in_place(db, pg_dsn, tmp_path):
    """No ownership, INSERT on the parent only: every partition appended to in place (even
    the empty one), through the parent."""
    setup_target(db, "range")
    db.run(psql.SQL("TRUNCATE {}").format(db.ident("readings_p1")))
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", "append"))
    expected = reference(db, "range", "append", path)
    loader = f"{db.schema}_loader"
    db.create_role(loader)
    db.run(
        psql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(
            psql.Identifier(db.schema), psql.Identifier(loader)
        )
    )
    db.run(
        psql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(
            db.ident("readings"), psql.Identifier(loader)
        )
    )
    before = filenodes(db)

    runner.load(
        lambda: psycopg.connect(pg_dsn, options=f"-c role={loader}"),
        db.table("readings"),
        str(path),
        mode="append",
    )

    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    assert filenodes(db) == before
    assert leftovers(db) == []


@pytest.mark.usefixtures("swapping")
def test_the_swap_waits_for_a_reader_at_most_lock_timeout(db, pg_dsn, tmp_path):
    """A transaction reading the target holds the swap off: finalize gives up after
    lock_timeout with a retryable error, the target as it was; the reader was never blocked."""
    setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", "replace_partitions"))
    before = _snapshot(db)
    with psycopg.connect(pg_dsn) as reader:
        reader.execute(psql.SQL("SELECT count(*) FROM {}").format(db.ident("readings")))
        with pytest.raises(TransientLoadError, match="lock"):
            runner.load(
                pg_dsn,
                db.table("readings"),
                str(path),
                mode="replace_partitions",
                lock_timeout="300ms",
            )
        reader.rollback()
    assert _snapshot(db) == before
    assert leftovers(db) == []


def _two_months(db: Any, table: str) -> None:
    """``<table>_0`` and ``<table>_1``: January and February 2024, partitions of ``table``."""
    for n, (start, end) in enumerate((("2024-01-01", "2024-02-01"), ("2024-02-01", "2024-03-01"))):
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"{table}_{n}"), db.ident(table), psql.Literal(start), psql.Literal(end)
            )
        )


def test_an_identity_column_not_loaded_is_numbered_from_the_targets_sequence(db, pg_dsn, tmp_path):
    """As an INSERT into the target would: the loaded rows draw from its identity sequence,
    which goes on from there; an error in staging names the target."""
    t = db.ident("events")
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id bigint GENERATED ALWAYS AS IDENTITY, day date NOT NULL,"
            " note text NOT NULL, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)"
        ).format(t)
    )
    _two_months(db, "events")
    db.run(
        psql.SQL(
            "INSERT INTO {} (day, note) VALUES ('2024-01-05', 'a'), ('2024-02-05', 'b')"
        ).format(t)
    )
    path = write_csv(tmp_path / "load.csv", [("2024-01-07", "x"), ("2024-01-08", "y")])

    runner.load(
        pg_dsn, db.table("events"), str(path), mode="replace_partitions", columns=["day", "note"]
    )
    db.run(psql.SQL("INSERT INTO {} (day, note) VALUES ('2024-02-09', 'after')").format(t))

    assert db.run(psql.SQL("SELECT id, note FROM {} ORDER BY id").format(t)) == [
        (2, "b"), (3, "x"), (4, "y"), (5, "after"),
    ]  # fmt: skip
    # an append of rows that carry their identity values, into a partition that has rows
    more = write_csv(tmp_path / "more.csv", [(100, "2024-02-10", "given")])
    runner.load(pg_dsn, db.table("events"), str(more), mode="append")
    assert db.scalar(psql.SQL("SELECT note FROM {} WHERE id = 100").format(t)) == "given"
    bad = write_csv(tmp_path / "bad.csv", [("2024-01-07", "x"), ("2024-01-08", None)])
    with pytest.raises(BadDataError, match=r"bad.csv line 2.*relation \"events\"") as failed:
        runner.load(
            pg_dsn, db.table("events"), str(bad), mode="replace_partitions", columns=["day", "note"]
        )
    assert "_pgbulk_" not in str(failed.value)
    assert leftovers(db) == []


@pytest.mark.parametrize("way", ["in_place", "swap"])
def test_a_key_loaded_twice_fails_naming_the_partitions_key_and_the_target_is_untouched(
    db, pg_dsn, tmp_path, monkeypatch, caplog, way
):
    """As a plain COPY into the target would fail: the duplicate key is found when the
    partition's primary key is built (swapped), or in place when the MERGE by key meets a
    row of the partition twice (it then empties the partition and inserts, which fails on
    the key as an INSERT does); the message names the target's own constraint."""
    if way == "swap":
        monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
    setup_target(db, "range")
    data = loaded_rows(db, "range", "replace_partitions")
    path = write_csv(tmp_path / "load.csv", [*data, data[3]])
    before = _snapshot(db)
    with (
        caplog.at_level(logging.INFO, logger="airflow_pg_bulk"),
        pytest.raises(ConstraintViolationError) as failed,  # (swapped: built side by side)
    ):
        runner.load(pg_dsn, db.table("readings"), str(path), mode="replace_partitions", jobs=2)
    assert data[3][0] <= 400  # a key the target holds: the MERGE met it twice
    assert ("emptying it and inserting" in caplog.text) == (way == "in_place")
    message = str(failed.value)
    assert "readings_p" in message and "_pkey" in message and f"({data[3][0]}," in message, message
    assert "_pgbulk_" not in message, message
    assert _snapshot(db) == before
    assert leftovers(db) == []


def _unkeyed_target(db: Any) -> None:
    """``plain_readings`` (id, day, v), partitioned by month, no primary key, two rows in
    January and one in February."""
    t = db.ident("plain_readings")
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id integer NOT NULL, day date NOT NULL, v integer)"
            " PARTITION BY RANGE (day)"
        ).format(t)
    )
    _two_months(db, "plain_readings")
    db.run(
        psql.SQL(
            "INSERT INTO {} VALUES (1, '2024-01-02', 1), (2, '2024-01-03', 2), (3, '2024-02-01', 3)"
        ).format(t)
    )


def test_a_partition_without_a_primary_key_is_emptied_and_its_rows_inserted(db, pg_dsn, tmp_path):
    """In place, a partition with no primary key cannot have its rows replaced by key: it is
    emptied (TRUNCATE: a new file) and the staged rows inserted; the other partition is not
    touched."""
    _unkeyed_target(db)
    before = {
        name: db.scalar(
            psql.SQL("SELECT pg_relation_filenode({}::regclass)").format(
                psql.Literal(db.table(name))
            )
        )
        for name in ("plain_readings_0", "plain_readings_1")
    }
    path = write_csv(tmp_path / "jan.csv", [(7, "2024-01-09", 70), (8, "2024-01-10", 80)])

    runner.load(pg_dsn, db.table("plain_readings"), str(path), mode="replace_partitions")

    rows = db.run(
        psql.SQL("SELECT id, day::text, v FROM {} ORDER BY id").format(db.ident("plain_readings"))
    )
    assert rows == [(3, "2024-02-01", 3), (7, "2024-01-09", 70), (8, "2024-01-10", 80)]
    after = {
        name: db.scalar(
            psql.SQL("SELECT pg_relation_filenode({}::regclass)").format(
                psql.Literal(db.table(name))
            )
        )
        for name in before
    }
    assert after["plain_readings_0"] != before["plain_readings_0"]  # emptied by TRUNCATE
    assert after["plain_readings_1"] == before["plain_readings_1"]
    assert leftovers(db) == []


def test_a_reader_of_the_reloaded_partition_does_not_hold_up_a_replace_by_key(db, pg_dsn, tmp_path):
    """A partition replaced in place by its primary key takes ROW EXCLUSIVE only: a session
    that read it in a transaction still open (ACCESS SHARE, which TRUNCATE waits for until
    lock_timeout) does not hold the load up."""
    setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", "replace_partitions"))
    expected = reference(db, "range", "replace_partitions", path)
    reader = psycopg.connect(db.dsn)
    try:
        for n in LOADED_PARTITIONS:  # each loaded partition read, the transaction kept open
            reader.execute(psql.SQL("SELECT count(*) FROM {}").format(db.ident(f"readings_p{n}")))
        runner.load(
            pg_dsn, db.table("readings"), str(path), mode="replace_partitions", lock_timeout="1s"
        )
        assert reader.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    finally:
        reader.rollback()
        reader.close()
    assert db.checksum("readings", ", ".join(COLUMNS)) == expected


def test_the_key_a_partition_is_replaced_by() -> None:
    """The primary key read from the catalog is the replace key, but when the MERGE could not
    set a loaded column (a GENERATED ALWAYS identity outside the key) or a key column is
    not loaded (generated)."""
    cols = (
        Column("id", "bigint", True, identity="a"),
        Column("day", "date", True),
        Column("v", "integer", False),
    )
    target = TargetDefinition("s", "t", 1, "o", "p", cols)
    assert partitioned._replace_key(target, ["id", "day"]) == ("id", "day")
    assert partitioned._replace_key(target, ["day"]) == ()  # id (ALWAYS) would be SET
    assert partitioned._replace_key(target, None) == ()  # no primary key, or not allowed
    generated = (Column("day", "date", True), Column("k", "int", True, generated=True))
    assert partitioned._replace_key(TargetDefinition("s", "t", 1, "o", "p", generated), ["k"]) == ()


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("way", ["in_place", "swap"])
def test_overlapping_loads_into_disjoint_partitions_all_succeed(
    db, pg_dsn, tmp_path, monkeypatch, way, order
):
    """Three replace_partitions loads (three runs of a daily DAG, say), each of its own
    partition, all prepared and COPYed before the first finalize: each finalizes, in either
    order (a swap gives a partition a new oid, which no other load compares), and each
    partition holds exactly its load's rows; the partition no load touches is as it was."""
    if way == "swap":
        monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
    setup_target(db, "range")
    untouched = (filenodes(db)["readings_p0"], catalog_snapshot(db, "readings_p0"))
    p0_rows = db.checksum("readings_p0", ", ".join(COLUMNS))
    conn = connect_driver(pg_dsn)
    sent: dict[int, list[tuple[Any, ...]]] = {}
    plans = []
    for n in (1, 2, 3):  # partition n holds month n + 1 of 2024
        sent[n] = [row for row in (_row(i, bump=n) for i in range(1, 401)) if row[1].month == n + 1]
        path = write_csv(tmp_path / f"p{n}.csv", sent[n])
        request = LoadRequest(
            mode="replace_partitions", table=db.table("readings"), source=(str(path),)
        )
        plan = steps.prepare(conn, request, f"{n:012x}")
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        plans.append(plan)

    for plan in plans if order == "forward" else plans[::-1]:
        summary = steps.finalize(conn, plan)
        assert summary.rows == len(sent[int(plan.load_id, 16)])
    for plan in plans:
        steps.cleanup(conn, db.schema, plan.load_id)
    conn.close()

    for n, rows in sent.items():
        got = db.run(
            psql.SQL("SELECT id, day, region, site, value::text, note FROM {} ORDER BY id").format(
                db.ident(f"readings_p{n}")
            )
        )
        assert got == sorted(rows), f"readings_p{n}"
    assert (filenodes(db)["readings_p0"], catalog_snapshot(db, "readings_p0")) == untouched
    assert db.checksum("readings_p0", ", ".join(COLUMNS)) == p0_rows
    assert leftovers(db) == []


PARENT_CHANGES = {
    # each made on the parent between prepare and finalize; PostgreSQL makes it on every
    # partition too, so the partition a load builds from its own definition (captured by
    # finalize) carries it, and a load in place goes through it
    "index-added": "CREATE INDEX readings_note ON {t} (note)",
    "check-added": "ALTER TABLE {t} ADD CONSTRAINT readings_id_ok CHECK (id > 0)",
    "unique-added": "ALTER TABLE {t} ADD CONSTRAINT readings_id_day UNIQUE (id, day)",
}


@pytest.mark.parametrize("way", ["in_place", "swap"])
@pytest.mark.parametrize("change", list(PARENT_CHANGES))
def test_an_index_or_constraint_added_to_the_parent_after_prepare_is_on_the_loaded_partitions(
    db, pg_dsn, tmp_path, monkeypatch, change, way
):
    """A partitioned parent's own indexes and constraints are not captured (each partition
    has them): one added to the parent between prepare and finalize is on every partition
    that the load replaced, built beside the target or loaded in place, and the rows are what
    plain SQL makes of them."""
    if way == "swap":
        monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
    setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", "replace_partitions"))
    expected = reference(db, "range", "replace_partitions", path)
    request = LoadRequest(
        mode="replace_partitions", table=db.table("readings"), source=(str(path),), partitions=2
    )
    conn = connect_driver(pg_dsn)
    try:
        plan = steps.prepare(conn, request, "c1b2c3d4e5f6")
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        db.run(psql.SQL(PARENT_CHANGES[change]).format(t=db.ident("readings")))
        summary = steps.finalize(conn, plan)
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert summary.rows == len(path.read_text().splitlines())
    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    # the parent's new index or constraint is on each partition replaced, attached to it
    for n in LOADED_PARTITIONS:
        leaf = f'"{db.schema}"."readings_p{n}"'
        if change == "index-added":
            found = db.scalar(
                "SELECT count(*) FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indexrelid"
                " WHERE i.indrelid = %s::regclass AND h.inhparent = %s::regclass",
                leaf,
                f'"{db.schema}"."readings_note"',
            )
        else:
            # a CHECK is inherited by name; a UNIQUE is tied to the parent's (conparentid)
            found = db.scalar(
                "SELECT count(*) FROM pg_constraint c"
                " LEFT JOIN pg_constraint p ON p.oid = c.conparentid"
                " WHERE c.conrelid = %s::regclass AND (c.conname = 'readings_id_ok'"
                " AND NOT c.conislocal OR p.conname = 'readings_id_day')",
                leaf,
            )
        assert found == 1, (change, way, n)
    assert leftovers(db) == []


LEAF_CHANGES = {
    # each made on a partition the load swaps, after finalize captured it and before the swap
    "index-added": "CREATE INDEX readings_p1_note ON {t} (note)",
    "grant-added": "GRANT SELECT ON {t} TO PUBLIC",
    "comment-changed": "COMMENT ON TABLE {t} IS 'changed'",
    "check-added": "ALTER TABLE {t} ADD CONSTRAINT readings_p1_id_ok CHECK (id > 0)",
}


@pytest.mark.parametrize("change", list(LEAF_CHANGES))
def test_a_partition_changed_between_its_capture_and_the_swap_is_refused(
    db, pg_dsn, tmp_path, monkeypatch, driver, change
):
    """The swap checks, under its lock, that each partition it swaps still has the
    definition its new table was built for (read with the parent's, in one round trip): one
    changed meanwhile refuses the load, the target keeps its rows, and the load run again goes
    through, carrying the change over."""
    from airflow_pg_bulk.target import partition_builds

    monkeypatch.setattr(partitioned, "IN_PLACE_ROWS", 0)
    setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", loaded_rows(db, "range", "replace_partitions"))
    expected = reference(db, "range", "replace_partitions", path)
    before = db.checksum("readings", ", ".join(COLUMNS))
    real = partition_builds.build_leaf
    changed = []

    def build_then_change(conn: Any, plan: Any, number: int, *args: Any, **kwargs: Any) -> Any:
        built = real(conn, plan, number, *args, **kwargs)
        leaf = plan.target.required_partitioning().leaves[number].definition.table
        if leaf == "readings_p1" and not changed:
            db.run(psql.SQL(LEAF_CHANGES[change]).format(t=db.ident("readings_p1")))
            changed.append(leaf)
        return built

    monkeypatch.setattr(partition_builds, "build_leaf", build_then_change)
    request = LoadRequest(
        mode="replace_partitions", table=db.table("readings"), source=(str(path),), partitions=2
    )
    conn = connect_driver(pg_dsn, driver)
    try:
        plan = steps.prepare(conn, request, "d1b2c3d4e5f6")
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        with pytest.raises(LoadRefusedError) as info:
            steps.finalize(conn, plan)
        assert "table partition" in str(info.value) and "readings_p1" in str(info.value)
        assert "definition changed" in str(info.value) and "nothing was swapped" in str(info.value)
        assert db.checksum("readings", ", ".join(COLUMNS)) == before
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert changed == ["readings_p1"]
    assert leftovers(db) == []

    runner.load(pg_dsn, db.table("readings"), str(path), mode="replace_partitions", driver=driver)
    assert db.checksum("readings", ", ".join(COLUMNS)) == expected
    kept = {
        "index-added": "SELECT count(*) FROM pg_indexes WHERE schemaname = %s"
        " AND indexname = 'readings_p1_note'",
        "grant-added": "SELECT count(*) FROM information_schema.role_table_grants"
        " WHERE table_schema = %s AND table_name = 'readings_p1' AND grantee = 'PUBLIC'",
        "comment-changed": "SELECT count(*) FROM pg_description d JOIN pg_class c ON c.oid ="
        " d.objoid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s"
        " AND c.relname = 'readings_p1' AND d.objsubid = 0 AND d.description = 'changed'",
        "check-added": "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n"
        " ON n.oid = c.connamespace WHERE n.nspname = %s AND c.conname = 'readings_p1_id_ok'",
    }[change]
    assert db.scalar(kept, db.schema) == 1


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_run_ordered_load_empties_an_unkeyed_partition_on_either_driver(
    db, pg_dsn, tmp_path, driver
):
    """A load of an Airflow run (the ordering rule reads the history first, under the
    transaction's advisory lock) into a partition without a primary key: emptied and its rows
    inserted, on both drivers (the transaction's opening is sent once, and not again empty)."""
    from airflow_pg_bulk.plan import RunOrder

    _unkeyed_target(db)
    path = write_csv(tmp_path / "jan.csv", [(7, "2024-01-09", 70), (8, "2024-01-10", 80)])
    request = LoadRequest(
        mode="replace_partitions", table=db.table("plain_readings"), source=(str(path),)
    )
    run = RunOrder("dag.load.prepare", "scheduled__2024-01-09", "2024-01-09", "2024-01-10")
    conn = connect_driver(pg_dsn, driver)
    try:
        plan = steps.prepare(conn, request, "e1b2c3d4e5f6", run=run)
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        summary = steps.finalize(conn, plan)
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert summary.rows == 2
    rows = db.run(
        psql.SQL("SELECT id, day::text, v FROM {} ORDER BY id").format(db.ident("plain_readings"))
    )
    assert rows == [(3, "2024-02-01", 3), (7, "2024-01-09", 70), (8, "2024-01-10", 80)]
    assert leftovers(db) == []


@pytest.mark.parametrize(
    "case, days, newest, pruned",
    [
        # the newest partition: found among the newest
        ("newest", ["2024-01-12"], "readings_20240112", 0),
        # the 11th newest: not among them; partition pruning finds it
        ("older", ["2024-01-02"], None, 1),
        # two partitions: the first row's found among the newest, its CHECK fails on the
        # other day's rows, and every row is routed
        ("both", ["2024-01-12", "2024-01-02"], "readings_20240112", 0),
        # the DEFAULT partition, newer still, is skipped
        ("default", ["2024-01-12"], "readings_20240112", 0),
        # no bound takes it: partition pruning sends it into the DEFAULT partition
        ("unbounded", ["2024-02-01"], None, 1),
    ],
)
def test_a_reload_into_one_of_the_newest_partitions_is_routed_without_partition_pruning(
    db, pg_dsn, tmp_path, monkeypatch, driver, case, days, newest, pruned
):
    """A reload into one partition looks first among the target's newest partitions
    (``catalog.NEWEST_PARTITIONS``, by their constraints, against the first staged row), so
    that a daily load does not have the planner build the parent's partition descriptor;
    a partition made earlier, rows of several partitions, a DEFAULT partition among the
    newest and a row that only the DEFAULT partition takes are routed as before (the
    planner's partition pruning: ``partition_of_a_row``). Every day's rows land in their
    partition, and the partitions that received none keep their rows, on either driver."""
    daily_target(db, 12, "2024-01-01")
    if case in ("default", "unbounded"):
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} DEFAULT").format(
                db.ident("readings_default"), db.ident("readings")
            )
        )
    tried: list[tuple[str, str | None]] = []  # each way to the partition, in order
    real_pruning = catalog.partition_of_a_row
    real_newest = catalog.newest_partition_of_a_row

    def counted(*args: Any, **kwargs: Any) -> Any:
        tried.append(("pruning", None))
        return real_pruning(*args, **kwargs)

    def among_newest(*args: Any, **kwargs: Any) -> Any:
        found = real_newest(*args, **kwargs)
        tried.append(("newest", None if found is None else found[1]))
        return found

    monkeypatch.setattr(catalog, "partition_of_a_row", counted)
    monkeypatch.setattr(catalog, "newest_partition_of_a_row", among_newest)
    rows = [[m, day, m * 100 + n] for n, day in enumerate(days) for m in range(1, 8)]
    path = tmp_path / "days.csv"
    path.write_text("".join(f"{m},{day},{v}\n" for m, day, v in rows))
    summary = runner.load(
        pg_dsn,
        db.table("readings"),
        str(path),
        mode="replace_partitions",
        columns=["meter_id", "day", "reading"],
        driver=driver,
    )
    assert summary.rows == len(rows)
    # the newest partitions first, once, whatever they gave; then pruning, when needed
    assert tried == [("newest", newest)] + [("pruning", None)] * pruned
    found = db.run(
        psql.SQL(
            "SELECT tableoid::regclass::text, day::text, count(*), sum(reading) FROM {}"
            " GROUP BY 1, 2 ORDER BY 2"
        ).format(db.ident("readings"))
    )
    expected = {  # the 12 days as daily_target made them: 5 meters, reading 1
        f"2024-01-{d:02d}": (f"readings_202401{d:02d}", 5, 5.0) for d in range(1, 13)
    }
    for n, day in enumerate(days):  # each reloaded day: 7 meters, its own readings
        leaf = "readings_default" if case == "unbounded" else f"readings_{day.replace('-', '')}"
        expected[day] = (leaf, 7, float(sum(m * 100 + n for m in range(1, 8))))
    assert {day: (leaf.split(".")[-1], c, s) for leaf, day, c, s in found} == expected
    assert leftovers(db) == []
