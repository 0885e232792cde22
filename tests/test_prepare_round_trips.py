"""prepare's round trips (issue 17: a daily reload of one partition costs what its statements
cost): its reads that need no answer before the next are sent as one statement, and the
transactions it needs only. Counted on the wire (libpq's protocol trace: one ReadyForQuery
per round trip), with what each of those reads decides still checked: an earlier attempt's
tables dropped, one that may be resumed kept, an ``abandoned_after`` that is no interval
refused where it was (after the source's checks)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import test_partitioned as tp
from helpers import leftovers, write_csv
from psycopg import sql as psql

from airflow_pg_bulk import naming, steps
from airflow_pg_bulk.db.driver import connect as connect_driver
from airflow_pg_bulk.errors import AlreadyLoadedError, LoadRefusedError
from airflow_pg_bulk.plan import LoadRequest, Settings

#: a first prepare of a replace_partitions (the load history there): search_path, the table
#: and its definition with the checks, in one statement in autocommit; BEGIN, the reads
#: before making, staging, the ledger, COMMIT (it was 24 when each read was a statement of
#: its own, 10 when the checks were one of their own, 9 when the definition was read in a
#: transaction after the table was found, 6 before the ledger went with the COMMIT)
FIRST_PREPARE = 5


def _round_trips(conn: Any, work: Callable[[], Any]) -> tuple[Any, int]:
    """``work()``'s result and how many round trips it made on ``conn`` (psycopg 3)."""
    with tempfile.TemporaryFile(mode="w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(
            psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        )
        try:
            result = work()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        ends = [line for line in trace if line.split("\t")[:3:2] == ["B", "ReadyForQuery"]]
    return result, len(ends)


def _tables(db: Any) -> list[str]:
    """The tables loads left in the test schema (their indexes left out)."""
    return sorted(n for n in leftovers(db) if not n.endswith("_pkey"))


def _request(db: Any, path: Path, mode: str = "replace_partitions", **settings: Any) -> LoadRequest:
    return LoadRequest(
        mode=mode,
        table=db.table("readings"),
        source=(str(path),),
        partitions=1,
        settings=Settings(**settings),
    )


def _source(db: Any, tmp_path: Path) -> Path:
    tp.setup_target(db, "range")
    return write_csv(tmp_path / "load.csv", tp.loaded_rows(db, "range", "replace_partitions"))


@pytest.mark.parametrize("store_pieces", [False, True])
def test_a_first_prepare_makes_its_round_trips_only(db, pg_dsn, tmp_path, store_pieces):
    """Counted after a first load made the load history; with ``store_pieces`` (Airflow's
    prepare task), the pieces table is made in one more round trip (it was 24 and 29)."""
    path = _source(db, tmp_path)
    conn = connect_driver(pg_dsn)

    def prepare(load_id: str) -> Any:
        return steps.prepare(conn, _request(db, path), load_id, store_pieces=store_pieces)

    pieces = [naming.pieces_table("a" * 12)] if store_pieces else []
    try:
        steps.cleanup(conn, db.schema, prepare("f" * 12).load_id)
        plan, trips = _round_trips(conn, lambda: prepare("a" * 12))
        assert trips == FIRST_PREPARE + store_pieces
        assert _tables(db) == sorted([plan.ledger_table, plan.staging_table, *pieces])
        # run again for the same plan: staging, the ledger and the pieces kept (what they
        # were made for read with the other reads): nothing made, one round trip more for
        # the ledger's rows, and the COMMIT on its own
        again, trips = _round_trips(conn, lambda: prepare("a" * 12))
        assert again.digest == plan.digest
        assert trips == FIRST_PREPARE
        assert _tables(db) == sorted([plan.ledger_table, plan.staging_table, *pieces])
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert leftovers(db) == []


def test_an_append_reads_its_record_in_the_load_history_with_the_checks(db, pg_dsn, tmp_path):
    """Three round trips more than a replace_partitions: the table found before its
    definition is read (an append's target may be of either kind), the load's record in the
    history, and the strategy's read of the target's size, each in autocommit (it was 29
    round trips in all, then 15, 13, 9 now); an append finalized before is refused by the
    record, nothing made."""
    tp.setup_target(db, "range")
    path = write_csv(tmp_path / "load.csv", tp.loaded_rows(db, "range", "append"))
    conn = connect_driver(pg_dsn)
    try:
        first = steps.prepare(conn, _request(db, path, "append"), "f" * 12)
        steps.copy_partition(conn, first, 0)
        steps.finalize(conn, first)
        steps.cleanup(conn, db.schema, first.load_id)
        with pytest.raises(AlreadyLoadedError, match="would add them twice"):
            steps.prepare(conn, _request(db, path, "append"), "f" * 12)
        assert leftovers(db) == []
        plan, trips = _round_trips(
            conn, lambda: steps.prepare(conn, _request(db, path, "append"), "a" * 12)
        )
        assert trips == FIRST_PREPARE + 3
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert leftovers(db) == []


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_an_earlier_attempts_table_without_its_ledger_is_dropped(db, pg_dsn, tmp_path, driver):
    """A cleanup that met a lock drops what it can, the ledger too: the staging it left
    has no ledger; prepare run again for the load drops it (every table of the load is
    looked for, whatever its ledger says) and makes staging anew."""
    path = _source(db, tmp_path)
    load_id = "b" * 12
    conn = connect_driver(pg_dsn, driver)
    try:
        plan = steps.prepare(conn, _request(db, path), load_id)
        db.run(psql.SQL("DROP TABLE {}").format(db.ident(plan.ledger_table)))
        db.run(psql.SQL("INSERT INTO {} SELECT * FROM {} LIMIT 1").format(
            db.ident(plan.staging_table), db.ident("readings")))  # fmt: skip
        again = steps.prepare(conn, _request(db, path), load_id)
        assert _tables(db) == [again.ledger_table, again.staging_table]
        assert (
            db.scalar(psql.SQL("SELECT count(*) FROM {}").format(db.ident(plan.staging_table))) == 0
        )
        steps.cleanup(conn, db.schema, load_id)
    finally:
        conn.close()
    assert leftovers(db) == []


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_an_abandoned_after_that_is_no_interval_is_refused_after_the_sources_checks(
    db, pg_dsn, tmp_path, driver
):
    """Read with the other checks, it is refused where it was before: a missing file is
    named first; with the file there, the interval is refused (nothing made), and a
    negative one too."""
    path = _source(db, tmp_path)
    conn = connect_driver(pg_dsn, driver)
    try:
        missing = tmp_path / "missing.csv"
        with pytest.raises(LoadRefusedError) as info:
            steps.prepare(conn, _request(db, missing, abandoned_after="soon"), "c" * 12)
        assert "interval" not in str(info.value)
        assert "missing.csv" in str(info.value)
        with pytest.raises(LoadRefusedError, match="abandoned_after='soon' is not a PostgreSQL"):
            steps.prepare(conn, _request(db, path, abandoned_after="soon"), "c" * 12)
        with pytest.raises(LoadRefusedError, match="abandoned_after='-1 h' is negative"):
            steps.prepare(conn, _request(db, path, abandoned_after="-1 h"), "c" * 12)
        assert leftovers(db) == []
        plan = steps.prepare(conn, _request(db, path, abandoned_after="2 h"), "c" * 12)
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert leftovers(db) == []


def test_an_abandoned_load_into_the_target_is_dropped_by_the_next_prepare(db, pg_dsn, tmp_path):
    """Every load's ledger is read before prepare commits; another load's, finalized and
    not cleaned up, has its tables dropped after the commit (none of its sessions left)."""
    path = _source(db, tmp_path)
    conn = connect_driver(pg_dsn)
    try:
        other = steps.prepare(conn, _request(db, path), "d" * 12)
        steps.copy_partition(conn, other, 0)
        steps.finalize(conn, other)
        assert leftovers(db)
        plan = steps.prepare(conn, _request(db, path), "e" * 12)
        assert _tables(db) == [plan.ledger_table, plan.staging_table]
        assert naming.ledger_table(other.load_id) not in leftovers(db)
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert leftovers(db) == []
