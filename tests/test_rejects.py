"""on_error="reject": bad rows go to the reject table with file, line, raw line and error."""

from __future__ import annotations

import pytest
from helpers import create_items, gzip_file, leftovers, plain_copy_checksum, rows, write_csv

from airflow_pg_bulk import runner
from airflow_pg_bulk.errors import BadDataError


def _with_bad_rows(count: int, bad: dict[int, tuple]) -> tuple[list, list]:
    """Rows with some replaced by bad ones; also the good rows alone."""
    data = rows(count)
    # quoted newlines in every 10th row, so lines and record numbers differ
    data = [(r[0], f"multi\nline {r[0]}" if r[0] % 10 == 0 else r[1], *r[2:]) for r in data]
    good = [r for r in data if r[0] not in bad]
    for row_id, row in bad.items():
        data[row_id - 1] = row
    return data, good


def _physical_line(data: list, row_id: int) -> int:
    """The file line where the row with this id starts (1-based, no header)."""
    line = 1
    for row in data:
        if row[0] == row_id:
            return line
        line += 1 + sum(str(v).count("\n") for v in row if v is not None)
    raise AssertionError(row_id)


BAD = {
    120: (120, "bad amount", "12x", "2024-01-01", None),
    1500: (1500, "bad date", "1.00", "2024-13-45", None),
    2900: ("x2900", "bad id", "1.00", "2024-01-01", None),
}


def test_bad_rows_are_rejected_and_the_rest_loads(db, connect, tmp_path):
    data, good = _with_bad_rows(3000, BAD)
    path = write_csv(tmp_path / "items.csv", data)
    good_path = write_csv(tmp_path / "good.csv", good)
    create_items(db)
    expected = plain_copy_checksum(db, good_path, "FORMAT csv")

    summary = runner.load(
        connect,
        db.table("items"),
        str(path),
        mode="replace",
        partitions=4,
        on_error="reject",
        max_rejects=5,
    )

    assert summary.rows == 2997
    assert summary.rejects == 3
    assert db.checksum("items") == expected
    rejected = db.run(
        f"SELECT source_file, line, raw_line, error, target FROM {db.schema}"
        ".pgbulk_rejects ORDER BY line"
    )
    assert [r[1] for r in rejected] == [_physical_line(data, i) for i in (120, 1500)] + [
        _physical_line(data, "x2900")
    ]
    assert all(r[0] == str(path) and r[4] == db.table("items") for r in rejected)
    assert rejected[0][2] == "120,bad amount,12x,2024-01-01,"
    assert "numeric" in rejected[0][3] and "12x" in rejected[0][3]
    assert "date" in rejected[1][3]
    assert leftovers(db) == []


def test_more_rejects_than_allowed_fails_and_target_untouched(db, connect, tmp_path):
    data, _good = _with_bad_rows(3000, BAD)
    path = write_csv(tmp_path / "items.csv", data)
    create_items(db)
    db.run(f"INSERT INTO {db.schema}.items VALUES (-1, 'kept', 1, NULL, NULL)")
    before = db.checksum("items")

    with pytest.raises(BadDataError, match="max_rejects=2"):
        runner.load(
            connect,
            db.table("items"),
            str(path),
            mode="replace",
            partitions=4,
            on_error="reject",
            max_rejects=2,
        )

    assert db.checksum("items") == before
    assert leftovers(db) == []


def test_rejects_in_gzip_files_with_header(db, connect, tmp_path):
    data, good = _with_bad_rows(500, {250: (250, "short row", "1.00")})
    header = ["id", "name", "amount", "day", "note"]
    path = gzip_file(write_csv(tmp_path / "items.csv", data, header=header))
    good_path = write_csv(tmp_path / "good.csv", good)
    create_items(db)
    expected = plain_copy_checksum(db, good_path, "FORMAT csv")

    summary = runner.load(
        connect,
        db.table("items"),
        str(path),
        mode="replace",
        header=True,
        on_error="reject",
        max_rejects=1,
        reject_table=db.table("bad_rows"),
    )

    assert summary.rejects == 1
    assert db.checksum("items") == expected
    ((source, line, raw, error),) = db.run(
        f"SELECT source_file, line, raw_line, error FROM {db.schema}.bad_rows"
    )
    assert source == str(path)
    assert line == 1 + _physical_line(data, 250)  # after the header line
    assert raw == "250,short row,1.00"
    assert "missing data" in error


def test_append_with_rejects_keeps_existing_rows(db, connect, tmp_path):
    data, _good = _with_bad_rows(800, {400: (400, "extra", "1", "2024-01-01", "n", "surplus")})
    path = write_csv(tmp_path / "items.csv", data)
    create_items(db)
    db.run(f"INSERT INTO {db.schema}.items VALUES (-1, 'kept', 1, NULL, NULL)")

    summary = runner.load(
        connect,
        db.table("items"),
        str(path),
        mode="append",
        partitions=2,
        on_error="reject",
        max_rejects=10,
    )

    assert (summary.rows, summary.rejects) == (799, 1)
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 800
    assert "extra data" in db.scalar(f"SELECT error FROM {db.schema}.pgbulk_rejects")


def test_one_pass_on_error_ignore_is_used_where_the_server_has_it(
    db, connect, tmp_path, monkeypatch
):
    from airflow_pg_bulk.loading import rejects

    data, _good = _with_bad_rows(2000, {100: BAD[120], 1500: BAD[1500]})
    path = write_csv(tmp_path / "items.csv", data)
    create_items(db)
    sent = []
    real_copy_in = rejects.copy_in

    def spy(conn, statement, chunks):
        sent.append(statement.as_string())
        return real_copy_in(conn, statement, chunks)

    monkeypatch.setattr(rejects, "copy_in", spy)

    summary = runner.load(
        connect,
        db.table("items"),
        str(path),
        mode="replace",
        partitions=1,
        on_error="reject",
        max_rejects=5,
    )

    assert (summary.rows, summary.rejects) == (1998, 2)
    version = db.scalar("SELECT current_setting('server_version_num')::int")
    one_pass = [s for s in sent if "ON_ERROR ignore" in s]
    if version >= 170000:
        # one COPY of the whole piece, plus one rolled-back COPY per bad row for its message
        assert len(one_pass) == 1 and len(sent) == 3
    else:
        # the fallback: the piece, then the good rows again after each bad one
        assert one_pass == [] and len(sent) == 5
