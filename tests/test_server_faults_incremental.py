"""Faults the server raises in the incremental modes' finalize (issue 18): an event trigger
that raises, or a backend terminated (``pg_terminate_backend`` from another session) while it
sleeps in a trap, at the DETACH and ATTACH PARTITION of a partitioned target's swap, in an
upsert's merge (plain and partitioned targets), and in a rebuild (append and upsert by
rebuild: while an index is built on the new table, and in the swap).

Nothing is patched in Python: the failure happens on the server, in the finalize's transaction,
which the server aborts. Each test checks that the target is exactly as it was (rows of the
table and of each partition, catalog of each), that the error says what happened (the trap's
own message, or a transient error for a terminated session), and that the retried finalize
(the task's retry: same plan) then gives what plain SQL gives. Traps and helpers are those of
``tests/test_server_faults.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_server_faults
from conftest import Database
from helpers import catalog_snapshot, error_chain, leftovers, rows, sqlstate_of, write_csv
from psycopg import sql
from test_server_faults import (
    Background,
    caught,
    cleanup,
    copy,
    finalize,
    prepare,
    terminate,
)

from airflow_pg_bulk.errors import TransientLoadError
from airflow_pg_bulk.plan import request_from_options

ddl_trap = test_server_faults.ddl_trap  # the fixture

LEAVES = ("items_p0", "items_p1", "items_p2")  # ids [0, 1000), [1000, 2000), [2000, 3000)
OLD = 1999  # old rows: ids 1-1999, in items_p0 and items_p1; items_p2 starts empty


def build(db: Database, partitioned: bool) -> list[str]:
    """``items`` (partitioned by id or not) with its old rows and a row trigger calling a trap
    (``row_fault``: raise or sleep when a row with the given id is inserted or updated).
    Returns the tables to check: the target and its partitions."""
    s = sql.Identifier(db.schema)
    db.run(
        sql.SQL(
            "CREATE TABLE {} (id integer PRIMARY KEY, name text NOT NULL,"
            " amount numeric(12,2) CHECK (amount >= 0), day date, note text){}"
        ).format(db.ident("items"), sql.SQL(" PARTITION BY RANGE (id)" if partitioned else ""))
    )
    leaves = list(LEAVES) if partitioned else []
    for k, leaf in enumerate(leaves):
        db.run(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(leaf), db.ident("items"), 1000 * k, 1000 * (k + 1)
            )
        )
    for statement in [
        "CREATE TABLE {s}.row_fault (at integer NOT NULL, action text NOT NULL)",
        "CREATE FUNCTION {s}.row_trap() RETURNS trigger LANGUAGE plpgsql AS $$"
        " DECLARE f record;"
        " BEGIN"
        "  FOR f IN SELECT action FROM {s}.row_fault WHERE at = NEW.id LOOP"
        "   IF f.action = 'raise' THEN RAISE EXCEPTION 'row trap at %', NEW.id; END IF;"
        "   PERFORM pg_catalog.pg_sleep(60);"
        "  END LOOP;"
        "  RETURN NEW;"
        " END $$",
        "CREATE TRIGGER items_row_trap BEFORE INSERT OR UPDATE ON {s}.items FOR EACH ROW"
        " EXECUTE FUNCTION {s}.row_trap()",
        "INSERT INTO {s}.items SELECT g, 'old ' || g, g % 100, date '2024-01-01' + g % 30, NULL"
        " FROM generate_series(1, 1999) g",
    ]:
        db.run(sql.SQL(statement).format(s=s))
    return ["items", *leaves]


def arm_row(db: Database, at: int, action: str) -> None:
    db.run(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(db.ident("row_fault")), at, action)


def disarm_row(db: Database) -> None:
    db.run(sql.SQL("DELETE FROM {}").format(db.ident("row_fault")))


class State:
    """Rows and catalog of the target and of each partition, to compare after a failure."""

    def __init__(self, db: Database, tables: list[str]) -> None:
        self.db, self.tables = db, tables
        self.taken = self._take()

    def _take(self) -> dict[str, Any]:
        return {t: (self.db.checksum(t), catalog_snapshot(self.db, t)) for t in self.tables}

    def unchanged(self) -> None:
        assert self._take() == self.taken


def batch(mode: str, partitioned: bool) -> list[tuple[Any, ...]]:
    """The file's rows: a replace_partitions' fall in items_p1 (replaced) and items_p2 (empty,
    swapped in), not items_p0; an append's are new ids (items_p2); an upsert's are half old
    ids, half new."""
    if mode == "append":
        ids = range(2000, 2600)
    elif mode == "replace_partitions":
        ids = range(1000, 3000, 3)
    else:
        ids = [*range(1500, 1800), *range(2000, 2300)]
    return [(i, *r[1:]) for i, r in zip(ids, rows(len(ids), seed=23), strict=True)]


def expected(db: Database, mode: str, path: Path) -> tuple[int, str]:
    """The checksum plain SQL gives: a copy of the target's rows, then the file's rows as the
    mode says (replace_partitions: items_p0's rows and the file's)."""
    db.run(sql.SQL("CREATE TABLE {} (LIKE {})").format(db.ident("expected"), db.ident("items")))
    keep = {
        "replace_partitions": "id < 1000",
        "upsert": "id NOT BETWEEN 1500 AND 1799 AND id NOT BETWEEN 2000 AND 2299",
    }
    db.run(
        sql.SQL("INSERT INTO {} SELECT * FROM {} WHERE {}").format(
            db.ident("expected"), db.ident("items"), sql.SQL(keep.get(mode, "true"))
        )
    )
    with (
        db.conn.cursor() as cur,
        cur.copy(sql.SQL("COPY {} FROM STDIN (FORMAT csv)").format(db.ident("expected"))) as out,
    ):
        out.write(path.read_bytes())
    return db.checksum("expected")


def load_plan(db: Database, tmp_path: Path, mode: str, partitioned: bool, strategy: str) -> Any:
    """Prepare and the COPY tasks of a load of :func:`batch`; returns the plan, the checksum
    plain SQL gives and the state before."""
    tables = build(db, partitioned)
    path = write_csv(tmp_path / "items.csv", batch(mode, partitioned))
    want = expected(db, mode, path)
    state = State(db, tables)
    request = request_from_options(
        db.table("items"), str(path), mode=mode, strategy=strategy, partitions=2,
        key=["id"] if mode == "upsert" else None,
    )  # fmt: skip
    plan = prepare(db, request)
    copy(db, plan)
    return plan, want, state


def retried(db: Database, plan: Any, want: tuple[int, str], state: State) -> None:
    """The retried finalize loads, and the target's catalog is what it was."""
    summary = finalize(db, plan)
    cleanup(db, plan)
    assert summary.rows == len(batch(plan.mode, False))
    assert db.checksum("items") == want
    for table in state.tables:
        assert catalog_snapshot(db, table) == state.taken[table][1], table
    assert leftovers(db) == []


def raised_then_retried(
    db: Database, plan: Any, want: tuple[int, str], state: State, text: str, disarm: Any
) -> None:
    """finalize fails with the trap's error (``text`` in it), the target as it was; once
    ``disarm`` ran, the retry loads."""
    with pytest.raises(Exception) as info:
        finalize(db, plan)
    assert sqlstate_of(info.value) == "P0001", list(error_chain(info.value))
    assert text in str(info.value), str(info.value)
    state.unchanged()
    disarm()
    retried(db, plan, want, state)


def terminated_then_retried(
    db: Database, plan: Any, want: tuple[int, str], state: State, needle: str, disarm: Any
) -> None:
    """finalize's session, caught sleeping in a statement holding ``needle``, is terminated
    by another session: a transient error, the target as it was; the retry loads."""
    step = Background(lambda: finalize(db, plan))
    terminate(db, caught(db, needle, step=step))
    error = step.join()
    assert isinstance(error, TransientLoadError), repr(error)
    state.unchanged()
    disarm()
    retried(db, plan, want, state)


# --- partitioned targets: DETACH and ATTACH PARTITION in the swap ----------------------------


@pytest.mark.parametrize("mode", ["replace_partitions", "append"])
@pytest.mark.parametrize("needle", ["DETACH PARTITION", "ATTACH PARTITION"])
def test_ddl_raising_at_detach_or_attach_then_retry_swaps(db, tmp_path, ddl_trap, mode, needle):
    """The event trigger raises right after the DETACH (or the ATTACH) of a partition swapped
    in: the whole swap rolls back, every partition is as it was."""
    plan, want, state = load_plan(db, tmp_path, mode, True, "auto")
    ddl_trap.arm(needle, "raise")
    raised_then_retried(db, plan, want, state, needle, ddl_trap.disarm)


@pytest.mark.parametrize("needle", ["DETACH PARTITION", "ATTACH PARTITION"])
def test_terminated_at_detach_or_attach_then_retry_swaps(db, tmp_path, ddl_trap, needle):
    """The session sleeps in the event trigger after the DETACH (or ATTACH), holding the swap's
    locks; another session terminates it: the swap rolls back, the retry swaps."""
    plan, want, state = load_plan(db, tmp_path, "replace_partitions", True, "auto")
    ddl_trap.arm(needle)
    terminated_then_retried(db, plan, want, state, needle, ddl_trap.disarm)


# --- the upsert's merge -----------------------------------------------------------------------


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
@pytest.mark.parametrize("at", [1600, 2100], ids=["update", "insert"])
def test_trigger_raising_in_the_upsert_merge_then_retry_merges(db, tmp_path, partitioned, at):
    """The target's row trigger raises on one row of the merge (a row it updates, or one it
    inserts): nothing of the merge stays; the retry merges."""
    plan, want, state = load_plan(db, tmp_path, "upsert", partitioned, "in_place")
    arm_row(db, at, "raise")
    raised_then_retried(db, plan, want, state, f"row trap at {at}", lambda: disarm_row(db))


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_terminated_in_the_upsert_merge_then_retry_merges(db, tmp_path, partitioned):
    plan, want, state = load_plan(db, tmp_path, "upsert", partitioned, "in_place")
    arm_row(db, 2100, "sleep")
    terminated_then_retried(db, plan, want, state, "INSERT INTO", lambda: disarm_row(db))


# --- rebuild (append and upsert) ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_terminated_during_the_rebuild_then_retry_rebuilds(db, tmp_path, ddl_trap, mode):
    """The session sleeps after building the new table's primary key index (the rebuild's one
    transaction: the target's rows already copied over); terminated, nothing of it stays."""
    plan, want, state = load_plan(db, tmp_path, mode, False, "rebuild")
    assert plan.rebuilds
    ddl_trap.arm("CREATE UNIQUE INDEX")
    terminated_then_retried(db, plan, want, state, "CREATE UNIQUE INDEX", ddl_trap.disarm)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_ddl_raising_in_the_rebuild_swap_then_retry_rebuilds(db, tmp_path, ddl_trap, mode):
    plan, want, state = load_plan(db, tmp_path, mode, False, "rebuild")
    needle = '" RENAME TO "items"'
    ddl_trap.arm(needle, "raise")
    raised_then_retried(db, plan, want, state, needle, ddl_trap.disarm)
