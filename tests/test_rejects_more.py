"""on_error="reject" in depth: exact reject rows (file, line, raw line, error) deep inside split
files, in text format and after headers; the per-partition and overall max_rejects limits; the
server-version paths (ON_ERROR ignore with REJECT_LIMIT on 18, savepoints before 17); retries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import create_items, gzip_file, leftovers, plain_copy_checksum
from psycopg import sql

from airflow_pg_bulk import runner, steps
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.loading import ledger, rejects
from airflow_pg_bulk.plan import ErrorPolicy, LoadRequest

HEADER = "id,name,amount,day,note"


def good_csv(i: int) -> str:
    """A good csv record; every 10th has a quoted newline (file lines run ahead of records)."""
    name = f'"multi\nline {i}"' if i % 10 == 0 else f"name {i}"
    return f"{i},{name},{i % 1000}.25,2024-01-{1 + i % 28:02d},note {i}"


def good_text(i: int) -> str:
    """A good text-format record; every 10th has an escaped newline and tab."""
    name = f"two\\nlines\\t{i}" if i % 10 == 0 else f"name {i}"
    note = "\\N" if i % 7 == 0 else f"note {i}"
    return f"{i}\t{name}\t{i % 1000}.25\t2024-01-{1 + i % 28:02d}\t{note}"


# bad records and the server's exact error for each (csv)
def bad_amount(i: int) -> tuple[str, str]:
    return f"{i},bad amount {i},12x,2024-01-01,", 'invalid input syntax for type numeric: "12x"'


def bad_date(i: int) -> tuple[str, str]:
    return (
        f"{i},bad date {i},1.00,2024-13-45,",
        'date/time field value out of range: "2024-13-45"',
    )


def bad_id(i: int) -> tuple[str, str]:
    return f"x{i},bad id,1.00,2024-01-01,", f'invalid input syntax for type integer: "x{i}"'


def short_row(i: int) -> tuple[str, str]:
    return f"{i},short {i},1.00", 'missing data for column "day"'


def long_row(i: int) -> tuple[str, str]:
    return f"{i},long {i},1.00,2024-01-01,n,surplus", "extra data after last expected column"


def write_source(
    path: Path,
    ids: range,
    bad: dict[int, tuple[str, str]],
    *,
    good=good_csv,
    header: str | None = None,
    eol: str = "\n",
) -> tuple[list[tuple[str, int, str, str]], list[str]]:
    """Write the records; return the expected reject rows (file, line, raw, error) in file
    order and the good records."""
    records, expected, good_records = [], [], []
    line = 2 if header else 1
    for i in ids:
        if i in bad:
            raw, error = bad[i]
            records.append(raw)
            expected.append((str(path), line, raw, error))
        else:
            records.append(good(i))
            good_records.append(records[-1])
        line += 1 + records[-1].count("\n")
    text = (header + eol if header else "") + "".join(r + eol for r in records)
    path.write_bytes(text.encode())
    return expected, good_records


def reference(db: Any, tmp_path: Path, good_records: list[str], options: str = "FORMAT csv"):
    """Checksum of the good records loaded by one plain COPY."""
    path = tmp_path / "good.data"
    path.write_text("".join(r + "\n" for r in good_records))
    return plain_copy_checksum(db, path, options)


def reject_rows(db: Any, load_id: str, table: str = "pgbulk_rejects") -> list[tuple]:
    return db.run(
        sql.SQL(
            "SELECT source_file, line, raw_line, error FROM {} WHERE load_id = %s"
            " AND target = %s ORDER BY source_file, line"
        ).format(db.ident(table)),
        load_id,
        db.table("items"),
    )


def seeded_items(db: Any) -> tuple[int, str | None]:
    create_items(db)
    db.run(
        f"INSERT INTO {db.schema}.items VALUES (-1, 'kept', 1, NULL, NULL), (-2, 'x', 2, NULL, 'y')"
    )
    return db.checksum("items")


def server_version(db: Any) -> int:
    return db.scalar("SELECT current_setting('server_version_num')::int")


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """The COPY statements the reject path sends, and the pieces it is given, in order."""
    seen: dict[str, list] = {"statements": [], "pieces": []}
    real_copy_in = rejects.copy_in
    real_copy_rejecting = rejects.copy_rejecting

    def copy_in(conn, statement, chunks):
        seen["statements"].append(statement.as_string())
        return real_copy_in(conn, statement, chunks)

    def copy_rejecting(conn, plan, piece, *args, **kwargs):
        seen["pieces"].append(piece)
        return real_copy_rejecting(conn, plan, piece, *args, **kwargs)

    monkeypatch.setattr(rejects, "copy_in", copy_in)
    monkeypatch.setattr(rejects, "copy_rejecting", copy_rejecting)
    return seen


# --- exact reject rows ---------------------------------------------------------------------------


def test_several_rejects_in_a_piece_far_from_the_file_start_name_their_own_lines(
    db, connect, tmp_path, spy
):
    path = tmp_path / "items.csv"
    bad = {
        2101: bad_amount(2101),
        2150: bad_date(2150),
        2151: bad_id(2151),  # right after another bad one
        2600: short_row(2600),  # a row error ON_ERROR does not skip
        2890: bad_amount(2890),
        3995: long_row(3995),
    }
    expected, good = write_source(path, range(1, 4001), bad)
    before = seeded_items(db)
    truth = reference(db, tmp_path, good)
    assert truth != before

    summary = runner.load(
        connect,
        db.table("items"),
        str(path),
        mode="replace",
        partitions=4,
        on_error="reject",
        max_rejects=6,
        load_id="a1a1a1a1a1a1",
    )

    assert (summary.rows, summary.rejects) == (3994, 6)
    assert db.checksum("items") == truth
    assert reject_rows(db, "a1a1a1a1a1a1") == expected
    # the bad rows sit in pieces that start deep in the file
    starts = sorted(p.start for p in spy["pieces"])
    assert len(starts) == 4 and starts[0] == 0
    offset_of_bad = path.read_bytes().index(b"\n2101,bad amount") + 1
    assert max(s for s in starts if s <= offset_of_bad) > 0
    assert leftovers(db) == []


def test_rejects_in_text_format(db, connect, tmp_path):
    path = tmp_path / "items.txt"
    bad = {
        40: ("40\tbad\t12x\t2024-01-01\t\\N", 'invalid input syntax for type numeric: "12x"'),
        1200: ("1200\tlong\t1.00\t2024-01-01\tn\tsurplus", "extra data after last expected column"),
        1201: ("1201\tshort\t1.00", 'missing data for column "day"'),
        2999: (
            "2999\tbad date\t1.00\t2024-02-30\tx",
            'date/time field value out of range: "2024-02-30"',
        ),
    }
    expected, good = write_source(path, range(1, 3001), bad, good=good_text)
    seeded_items(db)
    truth = reference(db, tmp_path, good, "FORMAT text")

    summary = runner.load(
        connect,
        db.table("items"),
        str(path),
        mode="replace",
        format="text",
        partitions=3,
        on_error="reject",
        max_rejects=4,
        load_id="b2b2b2b2b2b2",
    )

    assert (summary.rows, summary.rejects) == (2996, 4)
    assert db.checksum("items") == truth
    assert reject_rows(db, "b2b2b2b2b2b2") == expected
    assert leftovers(db) == []


def test_rejects_in_files_with_a_header_count_the_header_line(db, connect, tmp_path):
    expected, good = [], []
    for n, bad in enumerate(
        [
            {1500: bad_amount(1500), 1800: bad_date(1800)},
            {2001: bad_id(2001), 3700: short_row(3700), 3701: bad_amount(3701)},
        ]
    ):
        ids = range(1 + 2000 * n, 2001 + 2000 * n)
        e, g = write_source(tmp_path / f"part-{n}.csv", ids, bad, header=HEADER)
        expected += e
        good += g
    seeded_items(db)
    truth = reference(db, tmp_path, good)

    summary = runner.load(
        connect,
        db.table("items"),
        str(tmp_path / "part-*.csv"),
        mode="replace",
        header=True,
        partitions=4,
        on_error="reject",
        max_rejects=5,
        reject_table=db.table("bad_rows"),
        load_id="c3c3c3c3c3c3",
    )

    assert (summary.rows, summary.rejects) == (3995, 5)
    assert db.checksum("items") == truth
    assert reject_rows(db, "c3c3c3c3c3c3", "bad_rows") == expected
    assert expected[0][1] == 1 + 1500 + 149  # the header, 149 two-line records before
    assert leftovers(db) == []


def test_rejects_in_gzip_crlf_files_with_a_header(db, connect, tmp_path):
    """Compressed pieces are read back decompressed to find the bad records: lines count the
    header, raw lines carry no CR."""
    expected, good = [], []
    for n, bad in enumerate(
        [
            {30: bad_amount(30), 31: short_row(31), 900: bad_date(900)},
            {1001: bad_id(1001), 1999: long_row(1999)},
        ]
    ):
        plain = tmp_path / f"day-{n}.csv"
        ids = range(1 + 1000 * n, 1001 + 1000 * n)
        e, g = write_source(plain, ids, bad, header=HEADER, eol="\r\n")
        packed = gzip_file(plain)
        plain.unlink()
        expected += [(str(packed), *rest) for _path, *rest in e]
        good += g
    seeded_items(db)
    truth = reference(db, tmp_path, good)

    summary = runner.load(
        connect,
        db.table("items"),
        str(tmp_path / "day-*.csv.gz"),
        mode="replace",
        header=True,
        partitions=2,
        on_error="reject",
        max_rejects=5,
        load_id="c4c4c4c4c4c4",
    )

    assert (summary.rows, summary.rejects) == (1995, 5)
    assert db.checksum("items") == truth
    assert reject_rows(db, "c4c4c4c4c4c4") == expected
    assert leftovers(db) == []


def test_not_null_reject_names_the_target_not_the_staging_table(db, connect, tmp_path):
    """A reject row outlives the load; its error must name the table the user loads, not the
    staging table that is gone afterwards (finalize's errors are mapped back the same way)."""
    path = tmp_path / "items.csv"
    null_name = (
        "77,,1.00,2024-01-01,x",
        'null value in column "name" of relation "items" violates not-null constraint',
    )
    expected, good = write_source(path, range(1, 201), {77: null_name, 150: bad_amount(150)})
    seeded_items(db)
    truth = reference(db, tmp_path, good)

    summary = runner.load(
        connect,
        db.table("items"),
        str(path),
        mode="replace",
        on_error="reject",
        max_rejects=2,
        load_id="c5c5c5c5c5c5",
    )

    assert (summary.rows, summary.rejects) == (198, 2)
    assert db.checksum("items") == truth
    assert reject_rows(db, "c5c5c5c5c5c5") == expected


# --- max_rejects ----------------------------------------------------------------------------------


def test_max_rejects_counts_all_partitions_together(db, connect, tmp_path):
    expected, good = [], []
    for n in range(4):
        ids = range(1 + 1000 * n, 1001 + 1000 * n)
        bad_row = 1000 * n + 321
        e, g = write_source(tmp_path / f"day-{n}.csv", ids, {bad_row: bad_amount(bad_row)})
        expected += e
        good += g
    before = seeded_items(db)
    source = str(tmp_path / "day-*.csv")

    # each partition is within the limit, all of them together are not
    with pytest.raises(BadDataError) as info:
        runner.load(
            connect,
            db.table("items"),
            source,
            mode="replace",
            partitions=4,
            on_error="reject",
            max_rejects=3,
            load_id="d4d4d4d4d4d4",
        )

    assert str(info.value) == (
        f"4 rows of the source were rejected, more than max_rejects=3; nothing of this load "
        f"reached {db.table('items')}. See {db.schema}.pgbulk_rejects for load d4d4d4d4d4d4"
    )
    assert db.checksum("items") == before
    assert reject_rows(db, "d4d4d4d4d4d4") == expected  # kept, to be looked at
    assert leftovers(db) == []

    summary = runner.load(
        connect,
        db.table("items"),
        source,
        mode="replace",
        partitions=4,
        on_error="reject",
        max_rejects=4,
        load_id="d5d5d5d5d5d5",
    )

    assert (summary.rows, summary.rejects) == (3996, 4)
    assert db.checksum("items") == reference(db, tmp_path, good)
    assert reject_rows(db, "d5d5d5d5d5d5") == expected
    assert leftovers(db) == []


def test_one_partition_over_the_limit_fails_on_its_own_and_keeps_its_rejects(
    db, connect, tmp_path, spy
):
    path = tmp_path / "items.csv"
    bad = {i: bad_amount(i) for i in (2300, 2400, 2500, 2600, 2700)}
    expected, _good = write_source(path, range(1, 3001), bad)
    before = seeded_items(db)

    with pytest.raises(BadDataError) as info:
        runner.load(
            connect,
            db.table("items"),
            str(path),
            mode="replace",
            partitions=2,
            on_error="reject",
            max_rejects=4,
            load_id="e5e5e5e5e5e5",
        )

    assert str(info.value).startswith(
        f"more than max_rejects=4 rows of the source were rejected (the last in {path}); "
        f"nothing of this load reached {db.table('items')}."
    )
    assert str(info.value).endswith(f"See {db.schema}.pgbulk_rejects for load e5e5e5e5e5e5")
    assert info.value.path == str(path)
    assert db.checksum("items") == before
    # the failed partition rolled back, then recorded the rows it rejected on their own
    assert reject_rows(db, "e5e5e5e5e5e5") == expected
    assert leftovers(db) == []
    statements = spy["statements"]
    if server_version(db) >= 180000:
        # one pass per piece with the server counting; past the limit COPY itself stops, and
        # the piece goes the savepoint way to find the rows: a failing COPY and a re-copy each
        assert len(statements) == 2 + 2 * 5
        skipping = [s for s in statements if "ON_ERROR ignore" in s]
        assert len(skipping) == 2
        assert all("REJECT_LIMIT 4" in s for s in skipping)
    else:
        assert server_version(db) < 170000, "only 15 and 18 are tested here"
        assert not any("ON_ERROR" in s or "REJECT_LIMIT" in s for s in statements)
        # the clean piece in one COPY; the other: a failing COPY and a re-copy per bad row
        assert len(statements) == 1 + 2 * 5


def test_reject_limit_of_a_later_piece_is_what_the_earlier_pieces_left(db, connect, tmp_path, spy):
    expected, good = [], []
    bad_by_file = [{120: bad_amount(120), 480: bad_date(480)}, {1333: bad_id(1333)}]
    for n, bad in enumerate(bad_by_file):
        e, g = write_source(tmp_path / f"f-{n}.csv", range(1 + 1000 * n, 1001 + 1000 * n), bad)
        expected += e
        good += g
    seeded_items(db)

    summary = runner.load(
        connect,
        db.table("items"),
        str(tmp_path / "f-*.csv"),
        mode="replace",
        partitions=1,
        on_error="reject",
        max_rejects=3,
        load_id="f6f6f6f6f6f6",
    )

    assert (summary.rows, summary.rejects) == (1997, 3)
    assert db.checksum("items") == reference(db, tmp_path, good)
    assert reject_rows(db, "f6f6f6f6f6f6") == expected
    pieces = [Path(p.path).name for p in spy["pieces"]]
    assert sorted(pieces) == ["f-0.csv", "f-1.csv"]
    first_bad = len(bad_by_file[int(pieces[0][2])])
    statements = spy["statements"]
    if server_version(db) >= 180000:
        limits = [
            s.rsplit("REJECT_LIMIT ", 1)[1].rstrip(")") for s in statements if "ON_ERROR" in s
        ]
        assert limits == ["3", str(3 - first_bad)]
        # plus one rolled-back plain COPY per rejected row, for its exact error
        assert len(statements) == 2 + 3
    else:
        assert not any("ON_ERROR" in s for s in statements)
        assert len(statements) == (1 + 2 * 2) + (1 + 2 * 1)
    assert leftovers(db) == []


def test_limit_reached_in_a_later_piece_fails_the_partition_keeping_every_reject(
    db, connect, tmp_path
):
    expected = []
    for n, bad in enumerate([{120: bad_amount(120), 480: bad_date(480)}, {1333: bad_id(1333)}]):
        e, _g = write_source(tmp_path / f"f-{n}.csv", range(1 + 1000 * n, 1001 + 1000 * n), bad)
        expected += e
    before = seeded_items(db)

    with pytest.raises(BadDataError, match=r"^more than max_rejects=2 rows of the source"):
        runner.load(
            connect,
            db.table("items"),
            str(tmp_path / "f-*.csv"),
            mode="replace",
            partitions=1,
            on_error="reject",
            max_rejects=2,
            load_id="f7f7f7f7f7f7",
        )

    assert db.checksum("items") == before
    # the rejects of the earlier piece too, though its transaction rolled back
    assert reject_rows(db, "f7f7f7f7f7f7") == expected
    assert leftovers(db) == []


# --- retries -------------------------------------------------------------------------------------


@pytest.mark.parametrize("first_attempt", ["committed", "failed-before-commit"])
def test_partition_retried_in_reject_mode_records_rejects_and_rows_once(
    db, pg_dsn, driver, tmp_path, monkeypatch, first_attempt
):
    path = tmp_path / "items.csv"
    bad = {1700: bad_amount(1700), 1900: short_row(1900), 1901: bad_date(1901)}
    expected, good = write_source(path, range(1, 2001), bad)
    seeded_items(db)
    truth = reference(db, tmp_path, good)
    request = LoadRequest(
        mode="replace",
        table=db.table("items"),
        source=(str(path),),
        partitions=2,
        errors=ErrorPolicy(on_error="reject", max_rejects=5),
    )
    conn = open_connection(pg_dsn, driver)
    try:
        plan = steps.prepare(conn, request, "a7a7a7a7a7a7")
        assert len(plan.partitions) == 2
        first = steps.copy_partition(conn, plan, 0)
        assert first.rejects == 0
        if first_attempt == "committed":
            done = steps.copy_partition(conn, plan, 1)
            assert (first.rows + done.rows, done.rejects, done.skipped) == (1997, 3, False)
            again = steps.copy_partition(conn, plan, 1)
            assert (again.rows, again.rejects, again.skipped) == (done.rows, 3, True)
        else:
            # (the ledger's figures are sent with the COMMIT: the worker is lost before both)
            real_execute = ledger.execute_then_commit
            fired: list[str] = []

            def failing_execute(c, statement):
                text = statement.as_string()
                if not fired and text.startswith("UPDATE") and "rejects = 3" in text:
                    fired.append(text)
                    raise RuntimeError("worker lost before commit")
                return real_execute(c, statement)

            monkeypatch.setattr(ledger, "execute_then_commit", failing_execute)
            with pytest.raises(RuntimeError, match="worker lost"):
                steps.copy_partition(conn, plan, 1)
            monkeypatch.setattr(ledger, "execute_then_commit", real_execute)
            assert fired
            assert reject_rows(db, "a7a7a7a7a7a7") == []  # rolled back with the rows
            retried = steps.copy_partition(conn, plan, 1)
            assert (first.rows + retried.rows, retried.rejects, retried.skipped) == (1997, 3, False)
        assert reject_rows(db, "a7a7a7a7a7a7") == expected

        summary = steps.finalize(conn, plan)

        assert (summary.rows, summary.rejects) == (1997, 3)
        assert db.checksum("items") == truth
        assert reject_rows(db, "a7a7a7a7a7a7") == expected
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert leftovers(db) == []
