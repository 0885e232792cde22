"""Row accounting end to end: the issue's repros at 1, 3 and 7 partitions against one plain COPY
of the whole file, and a disagreement between the load's reading and the server's caught
before commit."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Database
from helpers import create_items, leftovers
from psycopg import sql

from airflow_pg_bulk import naming, runner, steps
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.db.driver import copy_in
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.loading import accounting
from airflow_pg_bulk.plan import CopyOptions, Piece, request_from_options
from airflow_pg_bulk.source import records

LINE_40 = b"".join(b"%d\tx\\.\n" % i if i == 40 else b"%d\tx\n" % i for i in range(1, 101))

# (name, bytes, format, header, columns)
REPROS = [
    ("escaped-cr", b"1\ta\tbbb\n2\tc\td\\\r\n3\te\tfff\n", "text", False, 3),
    ("header-crlf-data-lf", b"a,b,c\r\n1,x,y\n2,z,w\n", "csv", True, 3),
    ("final-marker", b"1,a,b\n2,c,d\n\\.\n", "csv", False, 3),
    ("marker-after-data", b"1\ta\tb\\.\n2\tc\td\n3\te\tf\n", "text", False, 3),
    ("marker-inside-quotes", b'1,"x\n\\.\ny",z\n2,b,c\n', "csv", False, 3),
    ("line-40", LINE_40, "text", False, 2),
]


def plain_copy(db: Database, table: str, data: bytes, fmt: str, header: bool) -> int | None:
    """Rows one plain COPY of the whole file loads (options written here, not by the package),
    or None where it fails."""
    options = sql.SQL("FORMAT {}, HEADER {}").format(sql.SQL(fmt), sql.SQL(str(header).upper()))
    statement = sql.SQL("COPY {} FROM STDIN ({})").format(db.ident(table), options)
    try:
        with db.conn.transaction(), db.conn.cursor() as cur:
            with cur.copy(statement) as copy:
                copy.write(data)
            return cur.rowcount
    except Exception:
        return None


def make_table(db: Database, name: str, columns: int) -> None:
    cols = sql.SQL(", ").join(
        sql.SQL("{} text").format(sql.Identifier(f"c{i}")) for i in range(columns)
    )
    db.run(sql.SQL("CREATE TABLE {} ({})").format(db.ident(name), cols))


@pytest.mark.parametrize("partitions", [1, 3, 7])
@pytest.mark.parametrize(
    ("name", "data", "fmt", "header", "columns"), REPROS, ids=[r[0] for r in REPROS]
)
def test_the_outcome_is_copys_at_every_partition_count(
    db, tmp_path, name, data, fmt, header, columns, partitions
):
    make_table(db, "reference", columns)
    make_table(db, "target", columns)
    if header:  # the header names the columns
        for old, new in (("c0", "a"), ("c1", "b"), ("c2", "c")):
            db.run(
                sql.SQL("ALTER TABLE {} RENAME {} TO {}").format(
                    db.ident("target"), sql.Identifier(old), sql.Identifier(new)
                )
            )
    old_row = sql.SQL(", ").join([sql.Literal("old")] * columns)
    db.run(sql.SQL("INSERT INTO {} VALUES ({})").format(db.ident("target"), old_row))
    before = db.checksum("target")
    path = tmp_path / f"{name}.{fmt}"
    path.write_bytes(data)
    copied = plain_copy(db, "reference", data, fmt, header)
    version = db.scalar("SELECT current_setting('server_version_num')::int")
    marker_lost = {  # where plain COPY reports success but stopped at an end-of-data marker
        "marker-after-data": 1,
        "line-40": 40,
    }
    load = lambda: runner.load(  # noqa: E731
        db.dsn, db.table("target"), str(path), format=fmt, header=header, mode="append",
        partitions=partitions,
    )  # fmt: skip

    if name in marker_lost and version < 180000:
        assert copied is not None and copied < data.count(b"\n")  # COPY's silent loss
        with pytest.raises(BadDataError) as info:
            load()
        assert info.value.line == marker_lost[name]
        assert f"{path} line {marker_lost[name]}:" in str(info.value)
        assert db.checksum("target") == before
    elif copied is None:
        with pytest.raises(BadDataError):
            load()
        assert db.checksum("target") == before
    else:
        summary = load()
        assert summary.rows == copied
        assert summary.records == copied
        count = sql.SQL("SELECT count(*) FROM {}").format(db.ident("target"))
        assert db.scalar(count) == copied + 1
    assert leftovers(db) == []


def test_a_disagreement_with_the_server_fails_before_commit_naming_the_first_missing_line(
    db, pg_dsn, tmp_path
):
    """If the load's reading of the records ever differs from the server's, the counts differ
    and the COPY fails. Provoked here by counting with a rule that ignores the end-of-data
    marker: the server stops at the line holding only ``\\.`` (every version, text format)."""
    make_table(db, "target", 2)
    data = b"".join(b"%d\tr\n" % i for i in range(1, 11)) + b"\\.\n" + b"11\tr\n12\tr\n"
    path = tmp_path / "marker.txt"
    path.write_bytes(data)
    piece = Piece(str(path), 0, len(data), 1)
    opts = CopyOptions(format="text")
    conn = open_connection(pg_dsn)
    try:
        counter, chunks = accounting.counted_chunks(
            piece, opts, records.MarkerRule.NONE, db.table("target")
        )
        statement = sql.SQL("COPY {} FROM STDIN (FORMAT text)").format(db.ident("target"))
        loaded = copy_in(conn, statement, chunks)
        assert loaded == 10  # what the server silently did
        with pytest.raises(BadDataError) as info:
            accounting.check_rows(counter, piece, opts, db.table("target"), loaded)
        conn.rollback()
    finally:
        conn.close()
    assert info.value.line == 11
    assert f"{path} line 11: COPY reported 10 rows where the data sent holds 13 records" in str(
        info.value
    )
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("target"))) == 0


def test_summary_reports_records_read_and_rows_loaded(db, tmp_path):
    make_table(db, "target", 2)
    path = tmp_path / "ok.csv"
    path.write_bytes(b"".join(b"%d,x\n" % i for i in range(1, 1001)))
    summary = runner.load(db.dsn, db.table("target"), str(path), mode="append", partitions=3)
    assert (summary.records, summary.rows, summary.rejects) == (1000, 1000, 0)
    assert "1,000 records read from the source: 1,000 loaded, 0 rejected" in summary.describe()


def test_rejected_rows_count_as_records_read(db, tmp_path):
    db.run(sql.SQL("CREATE TABLE {} (a int, b text)").format(db.ident("target")))
    path = tmp_path / "some-bad.csv"
    lines = [b"%d,x\n" % i if i % 100 else b"bad,x\n" for i in range(1, 1001)]
    path.write_bytes(b"".join(lines))
    summary = runner.load(
        db.dsn, db.table("target"), str(path), mode="append", partitions=3,
        on_error="reject", max_rejects=50,
    )  # fmt: skip
    assert (summary.records, summary.rows, summary.rejects) == (1000, 990, 10)


def test_the_marker_rule_is_the_one_the_server_applies(db, tmp_path):
    """A text line holding only ``\\.`` in the middle: every version stops there. The load
    refuses naming it; a final one loads every row before it, as COPY does."""
    make_table(db, "target", 2)
    middle = tmp_path / "middle.txt"
    middle.write_bytes(b"1\ta\n\\.\n3\tc\n")
    with pytest.raises(BadDataError) as info:
        runner.load(db.dsn, db.table("target"), str(middle), format="text", mode="append")
    assert info.value.line == 2
    final = tmp_path / "final.txt"
    final.write_bytes(b"1\ta\n2\tb\n\\.\n")
    summary = runner.load(db.dsn, db.table("target"), str(final), format="text", mode="append")
    assert summary.rows == 2
    assert leftovers(db) == []


# --- the server takes fewer rows than were sent: every COPY path must notice ----------------
#
# A BEFORE INSERT trigger that returns NULL makes the server skip a row without an error, and
# COPY reports only the rows it inserted: the same silent shortfall as an end-of-data marker,
# made on the server. The test adds the trigger to the load's staging table between prepare and
# the COPY task (the steps run one by one), so every COPY path the task can take is exercised:
#
# - "plain": the COPY of a load without rejects (steps.copy_partition);
# - "skipping": on_error="reject" on PostgreSQL 17+, one ``COPY ... ON_ERROR ignore`` (a bad
#   value in the file is skipped by the server and named in a notice); before 17 the same file
#   takes the savepoint way, whose COPY of the piece stops at the bad value, the rows before it
#   are copied again, then the rest;
# - "savepoint-before" / "savepoint-after": on_error="reject" with a row ON_ERROR ignore does not
#   skip (a missing field), so every version takes the savepoint way: the COPY of the piece
#   stops at the bad row, the rows before it are copied again (the row dropped is among them:
#   "before") and the rows after it in a last COPY (the row dropped is among them: "after").

ACCOUNTED_ROWS = 40
BAD_LINE = 20  # the line of the bad row, where the path has one


def _accounting_file(tmp_path, bad: str | None) -> Any:
    lines = [b"%d,name %d,1.00,2024-01-01,x\n" % (i, i) for i in range(1, ACCOUNTED_ROWS + 1)]
    if bad == "value":  # ON_ERROR ignore skips it
        lines[BAD_LINE - 1] = b"%d,name,not a number,2024-01-01,x\n" % BAD_LINE
    elif bad == "fields":  # ON_ERROR ignore does not: the savepoint way
        lines[BAD_LINE - 1] = b"%d,name\n" % BAD_LINE
    path = tmp_path / "accounted.csv"
    path.write_bytes(b"".join(lines))
    return path


ACCOUNTING_PATHS = {
    # name: (bad row in the file, the id the trigger drops, load options)
    "plain": (None, 7, {}),
    "skipping": ("value", 30, {"on_error": "reject", "max_rejects": 5}),
    "savepoint-before": ("fields", 7, {"on_error": "reject", "max_rejects": 5}),
    "savepoint-after": ("fields", 30, {"on_error": "reject", "max_rejects": 5}),
}


@pytest.mark.parametrize("path_name", list(ACCOUNTING_PATHS))
def test_rows_the_server_drops_fail_the_copy_on_every_path(db, pg_dsn, tmp_path, path_name):
    """Deleting any ``accounting.check_rows`` call makes one of these load rows short."""
    bad, dropped, options = ACCOUNTING_PATHS[path_name]
    create_items(db)
    db.run(sql.SQL("INSERT INTO {} VALUES (1000, 'old', 1, NULL, NULL)").format(db.ident("items")))
    before = db.checksum("items")
    path = _accounting_file(tmp_path, bad)
    request = request_from_options(
        db.table("items"), str(path), mode="append", strategy="in_place", partitions=1, **options
    )
    conn = open_connection(pg_dsn)
    load_id = naming.new_load_id()
    try:
        plan = steps.prepare(conn, request, load_id)
        staging = sql.Identifier(db.schema, plan.staging_table)
        db.run(
            sql.SQL(
                "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS"
                " $$BEGIN IF NEW.id = {id} THEN RETURN NULL; END IF; RETURN NEW; END$$"
            ).format(f=db.ident("drop_one"), id=sql.Literal(dropped))
        )
        db.run(
            sql.SQL(
                "CREATE TRIGGER drop_one BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
            ).format(staging, db.ident("drop_one"))
        )
        with pytest.raises(BadDataError) as info:
            steps.copy_partition(conn, plan, 0)
        message = str(info.value)
        assert "COPY reported" in message and "where the data sent holds" in message, message
        assert f"Nothing of this load reached {db.table('items')}" in message
        # nothing of the partition committed: no staged row, no ledger entry
        assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(staging)) == 0
        ledger = sql.Identifier(db.schema, plan.ledger_table)
        assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(ledger)) == 0
        # the trigger gone, the COPY task's retry loads every row and the load completes
        db.run(sql.SQL("DROP TRIGGER drop_one ON {}").format(staging))
        done = steps.copy_partition(conn, plan, 0)
        assert done.rows == ACCOUNTED_ROWS - (1 if bad else 0)
        summary = steps.finalize(conn, plan)
        assert summary.rows == ACCOUNTED_ROWS - (1 if bad else 0)
    finally:
        steps.cleanup(conn, db.schema, load_id)
        conn.close()
    assert db.checksum("items") != before
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("items"))) == (
        1 + ACCOUNTED_ROWS - (1 if bad else 0)
    )
    assert leftovers(db) == []
