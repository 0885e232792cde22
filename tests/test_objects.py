"""Object-storage sources against a real S3 endpoint on loopback (moto's server, fixture
``s3_server``): through an Airflow connection (``aws``, extra ``endpoint_url``) and through the
standard environment; many objects, gzip, CRLF, globs over prefixes; a missing object or
bucket, bad credentials, an object changed after prepare or while it is read, a read failing
mid-COPY. Every load is compared with a plain COPY of the same bytes."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    create_items,
    leftovers,
    multiline_rows,
    plain_copy_checksum,
    repaired_partitions,
    rows,
    write_csv,
)
from psycopg import sql

from airflow_pg_bulk import runner, steps
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.errors import (
    BadDataError,
    ConstraintViolationError,
    LoadRefusedError,
    TransientLoadError,
)
from airflow_pg_bulk.plan import CopyOptions, request_from_options
from airflow_pg_bulk.source import cutting, listing, objects, reading, window
from airflow_pg_bulk.source.objects import SourceChangedError

HEADER = ["id", "name", "amount", "day", "note"]
CONN_ID = "pgbulk_s3"


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, s3_server: Any) -> Any:
    """Credentials and endpoint from the standard environment only."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_server.region)
    monkeypatch.delenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", raising=False)
    return s3_server


@pytest.fixture
def s3_conn(monkeypatch: pytest.MonkeyPatch, s3_server: Any) -> Any:
    """Credentials and endpoint from an Airflow connection only (no AWS_* variables)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_server.region)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", s3_server.connection_json())
    return s3_server


def _parts(tmp_path: Path, count: int, per: int, *, header: bool = False, crlf: bool = False):
    """``count`` CSV files of ``per`` rows each (ids unique across them), and their
    concatenation without headers (what a plain COPY of the same rows reads)."""
    data = rows(count * per, seed=11)
    ending = "\r\n" if crlf else "\n"
    files = []
    for k in range(count):
        path = tmp_path / f"part-{k:02d}.csv"
        write_csv(path, data[k * per : (k + 1) * per], header=HEADER if header else None,
                  lineterminator=ending)  # fmt: skip
        files.append(path)
    whole = tmp_path / "whole.csv"
    write_csv(whole, data, lineterminator=ending)
    return files, whole


def _upload(server: Any, bucket: str, key: str, body: bytes) -> str:
    server.client().put_object(Bucket=bucket, Key=key, Body=body)
    return f"s3://{bucket}/{key}"


@contextlib.contextmanager
def _planned(db: Any, request: Any) -> Iterator[tuple[Any, Any]]:
    """A psycopg connection and the plan prepare made for ``request``; cleanup afterwards."""
    conn = open_connection(db.dsn, "psycopg")
    load_id = uuid.uuid4().hex[:12]
    try:
        yield conn, steps.prepare(conn, request, load_id)
    finally:
        steps.cleanup(conn, db.schema, load_id)
        conn.close()


def _copy_and_finalize(conn: Any, plan: Any) -> Any:
    for part in plan.partitions:
        steps.copy_partition(conn, plan, part.index)
    return steps.finalize(conn, plan)


def test_many_objects_gzip_and_plain_from_the_environment_equal_a_plain_copy(
    db, s3_env, tmp_path, caplog, capfd
):
    create_items(db)
    files, whole = _parts(tmp_path, 7, 300)
    bucket = s3_env.bucket()
    for k, path in enumerate(files):
        body = path.read_bytes()
        if k % 2:  # every other object gzip, named either way: told by its magic number
            body = gzip.compress(body)
        _upload(s3_env, bucket, f"data/2024/{path.name}" + (".gz" if k % 3 == 1 else ""), body)
    _upload(s3_env, bucket, "data/readme.txt", b"not data\n")  # outside the glob
    _upload(s3_env, bucket, "other/part-99.csv", b"garbage\n")  # another prefix
    expected = plain_copy_checksum(db, whole, "FORMAT csv")

    caplog.set_level(logging.INFO, logger="airflow_pg_bulk")
    summary = runner.load(
        db.dsn, db.table("items"), f"s3://{bucket}/data/**/part-*", mode="replace", partitions=3
    )

    assert summary.rows == 7 * 300
    assert db.checksum("items") == expected
    # the log goes to caplog or, once Airflow has configured logging, to stderr
    logged = caplog.text + "".join(capfd.readouterr())
    for k in range(7):  # each COPY task logs the objects it reads
        assert f"Reading s3://{bucket}/data/2024/part-{k:02d}.csv" in logged
    assert leftovers(db) == []


def test_objects_through_an_airflow_connection_header_crlf_gzip(db, s3_conn, tmp_path):
    create_items(db)
    files, whole = _parts(tmp_path, 4, 250, header=True, crlf=True)
    bucket = s3_conn.bucket()
    urls = []
    for k, path in enumerate(files):
        body = gzip.compress(path.read_bytes()) if k in (0, 3) else path.read_bytes()
        urls.append(_upload(s3_conn, bucket, f"in/{path.name}", body))
    expected = plain_copy_checksum(db, whole, "FORMAT csv")

    request = request_from_options(
        db.table("items"), f"s3://{bucket}/in/*.csv", mode="append", header=True, partitions=2,
        source_conn_id=CONN_ID,
    )  # fmt: skip
    with _planned(db, request) as (conn, plan):
        pieces = [p for part in plan.partitions for p in part.pieces]
        assert sorted(p.path for p in pieces) == urls
        assert all(p.conn_id == CONN_ID and p.etag and p.source_size for p in pieces)
        assert [p.compression for p in sorted(pieces, key=lambda p: p.path)] == [
            "gzip", None, None, "gzip",
        ]  # fmt: skip
        # the plan (XCom) holds the connection's id, never its secret
        assert s3_conn.secret_key not in json.dumps(plan.to_dict())
        summary = _copy_and_finalize(conn, plan)
    assert summary.rows == 1000
    assert db.checksum("items") == expected


def test_mixed_local_file_and_object_sources(db, s3_env, tmp_path):
    create_items(db)
    files, whole = _parts(tmp_path, 2, 200)
    bucket = s3_env.bucket()
    url = _upload(s3_env, bucket, "b.csv", files[1].read_bytes())
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    local = "file://" + str(files[0])  # a file:// URL is a local path

    summary = runner.load(db.dsn, db.table("items"), [local, url], mode="replace", partitions=2)

    assert summary.rows == 400 and db.checksum("items") == expected


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("s3://{bucket}/missing.csv", "the object does not exist"),
        ("s3://{bucket}/nothing/*.csv", "matched no objects"),
        ("s3://pgbulk-no-such-bucket/x.csv", "the bucket 'pgbulk-no-such-bucket' does not exist"),
        ("s3://pgbulk-no-such-bucket/*.csv", "the bucket 'pgbulk-no-such-bucket' does not exist"),
        ("s3://{bucket}/dir", "is a prefix"),
    ],
)
def test_a_missing_object_or_bucket_is_refused_naming_the_url(db, s3_env, source, words):
    create_items(db)
    db.run(sql.SQL("INSERT INTO {} VALUES (1, 'kept', 1, NULL, NULL)").format(db.ident("items")))
    bucket = s3_env.bucket()
    _upload(s3_env, bucket, "dir/a.csv", b"2,x,1,,\n")
    url = source.format(bucket=bucket)

    with pytest.raises(LoadRefusedError) as refused:
        runner.load(db.dsn, db.table("items"), url, mode="replace")

    assert url in str(refused.value) and words in str(refused.value)
    assert db.checksum("items")[0] == 1 and leftovers(db) == []


def test_bad_credentials_are_refused_without_the_secret(db, s3_env, monkeypatch, caplog, capfd):
    create_items(db)
    bucket = s3_env.bucket()
    url = _upload(s3_env, bucket, "a.csv", b"1,x,1,,\n")
    secret = "pgbulk-WRONG-secret-7d1e4b"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAPGBULKWRONGKEY00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # check signatures

    with caplog.at_level(logging.DEBUG), pytest.raises(LoadRefusedError) as refused:
        runner.load(db.dsn, db.table("items"), url, mode="replace")

    message = str(refused.value)
    assert url in message and "access denied" in message and "AWS_ACCESS_KEY_ID" in message
    assert secret not in message and secret not in caplog.text
    assert secret not in "".join(capfd.readouterr())
    assert db.checksum("items")[0] == 0 and leftovers(db) == []

    # the same through a connection: its id is named, its password is not
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", s3_env.connection_json(secret))
    with pytest.raises(LoadRefusedError) as refused:
        runner.load(db.dsn, db.table("items"), url, mode="replace", source_conn_id=CONN_ID)
    assert CONN_ID in str(refused.value) and secret not in str(refused.value)
    assert secret not in caplog.text and secret not in "".join(capfd.readouterr())


def _prepared(db: Any, url: str, **options: Any) -> tuple[Any, Any, str]:
    conn = open_connection(db.dsn, "psycopg")
    load_id = uuid.uuid4().hex[:12]
    request = request_from_options(db.table("items"), url, mode="replace", **options)
    return conn, steps.prepare(conn, request, load_id), load_id


def _staged(db: Any, plan: Any) -> tuple[int, int]:
    staged = db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident(plan.staging_table)))
    ledger = db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident(plan.ledger_table)))
    return staged, ledger


@pytest.mark.parametrize("change", ["same size", "longer", "deleted"])
def test_an_object_changed_after_prepare_fails_its_partition(db, s3_env, tmp_path, change):
    create_items(db)
    files, _whole = _parts(tmp_path, 1, 100)
    bucket = s3_env.bucket()
    body = files[0].read_bytes()
    url = _upload(s3_env, bucket, "a.csv", body)
    conn, plan, load_id = _prepared(db, url)
    try:
        if change == "deleted":
            s3_env.client().delete_object(Bucket=bucket, Key="a.csv")
        else:
            new = (
                body.replace(b"2024-", b"2023-") if change == "same size" else body + b"999,x,1,,\n"
            )
            assert new != body and (len(new) == len(body)) == (change == "same size")
            _upload(s3_env, bucket, "a.csv", new)

        with pytest.raises(SourceChangedError) as failed:
            steps.copy_partition(conn, plan, 0)

        assert url in str(failed.value) and "Run the load again" in str(failed.value)
        assert _staged(db, plan) == (0, 0)  # rolled back: nothing of the partition committed
    finally:
        steps.cleanup(conn, db.schema, load_id)
        conn.close()


def test_an_object_replaced_while_it_is_read_fails(db, s3_env, monkeypatch):
    bucket = s3_env.bucket()
    body = b"".join(b"%d,name %d,1.00,,\n" % (i, i) for i in range(40000))
    url = _upload(s3_env, bucket, "big.csv", body)
    monkeypatch.setattr(objects, "BLOCK_SIZE", 64 << 10)  # many range requests
    (file,) = listing.list_sources(url)
    (part,) = cutting.plan_partitions([file], CopyOptions(), 1)
    chunks = reading.piece_chunks(part.pieces[0], CopyOptions(), 16 << 10)

    first = next(chunks)
    _upload(s3_env, bucket, "big.csv", body.replace(b"name", b"NAME"))  # same size
    with pytest.raises(SourceChangedError) as failed:
        for _chunk in chunks:
            pass
    assert first and url in str(failed.value)


def test_a_read_failing_mid_copy_rolls_back_and_the_retry_reads_again(
    db, s3_env, tmp_path, monkeypatch
):
    create_items(db)
    files, whole = _parts(tmp_path, 3, 400)
    bucket = s3_env.bucket()
    for path in files:
        _upload(s3_env, bucket, f"p/{path.name}", path.read_bytes())
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    conn, plan, load_id = _prepared(db, f"s3://{bucket}/p/*.csv", partitions=1)
    (part,) = plan.partitions
    assert len(part.pieces) == 3
    real_read = objects._Counting.read
    calls = {"n": 0}

    def failing_read(self: Any, size: int = -1) -> bytes:
        calls["n"] += 1
        if calls["n"] == 4:  # part-way through an object
            raise ConnectionResetError("connection reset by peer (injected)")
        return real_read(self, size)

    monkeypatch.setattr(reading, "READ_CHUNK", 4096)  # several reads per object
    try:
        monkeypatch.setattr(objects._Counting, "read", failing_read)
        with pytest.raises(TransientLoadError) as failed:
            steps.copy_partition(conn, plan, 0)
        assert "a retry reads the object again" in str(failed.value)
        assert f"s3://{bucket}/p/part-0" in str(failed.value)
        assert _staged(db, plan) == (0, 0)

        monkeypatch.setattr(objects._Counting, "read", real_read)
        result = steps.copy_partition(conn, plan, 0)  # the retry
        assert result.rows == 1200 and not result.skipped
        assert steps.copy_partition(conn, plan, 0).skipped  # exactly once
        steps.finalize(conn, plan)
    finally:
        steps.cleanup(conn, db.schema, load_id)
        conn.close()
    assert db.checksum("items") == expected


def test_row_accounting_and_bad_rows_name_the_object_and_line(db, s3_env):
    create_items(db)
    bucket = s3_env.bucket()
    body = b"1,a,1.00,,\n2,b,not-a-number,,\n3,c,1.00,,\n"
    url = _upload(s3_env, bucket, "bad.csv", gzip.compress(body))

    with pytest.raises(BadDataError) as failed:
        runner.load(db.dsn, db.table("items"), url, mode="replace")

    assert f"{url} line 2" in str(failed.value) and "amount" in str(failed.value)
    assert db.checksum("items")[0] == 0


def test_rejected_rows_of_an_object_are_recorded(db, s3_env):
    create_items(db)
    bucket = s3_env.bucket()
    body = b"id,name,amount,day,note\r\n1,a,1.00,,\r\n2,b,oops,,\r\n3,c,2.00,,\r\n"
    url = _upload(s3_env, bucket, "r.csv", body)

    summary = runner.load(
        db.dsn, db.table("items"), url, mode="replace", header=True, on_error="reject",
        max_rejects=5,
    )  # fmt: skip

    assert (summary.rows, summary.rejects) == (2, 1)
    line, source = db.run(
        sql.SQL("SELECT line, source_file FROM {}").format(db.ident("pgbulk_rejects"))
    )[0]
    assert (line, source) == (3, url)


def test_a_byte_order_mark_loads_and_a_broken_key_names_the_object_and_line(db, s3_env):
    create_items(db)
    bucket = s3_env.bucket()
    _upload(s3_env, bucket, "bom/a.csv", b"\xef\xbb\xbf1,a,1.00,,\n2,b,2.00,,\n")
    _upload(s3_env, bucket, "bom/b.csv.gz", gzip.compress(b"\xef\xbb\xbf3,c,1.00,,\n4,d,,,\n"))

    summary = runner.load(db.dsn, db.table("items"), f"s3://{bucket}/bom/*", mode="replace")

    assert summary.rows == 4
    assert [r[0] for r in db.run(f"SELECT id FROM {db.schema}.items ORDER BY id")] == [1, 2, 3, 4]
    before = db.checksum("items")
    url = _upload(s3_env, bucket, "again.csv", b"5,e,1.00,,\n3,again,1.00,,\n")

    with pytest.raises(ConstraintViolationError) as failed:
        runner.load(db.dsn, db.table("items"), url, mode="append", strategy="in_place")

    assert f"{url} line 2, whose key is already in the target" in str(failed.value)
    assert db.checksum("items") == before


# --- one big object split into byte ranges (source/window.py) ------------------------------------


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_a_big_object_is_split_into_ranges_read_by_range_requests(
    db, s3_conn, tmp_path, monkeypatch, newline
):
    """One object cut into 4 ranges whose split points fall inside quoted multi-line fields,
    with a header, through a connection: equal to a plain COPY of the same bytes; prepare
    reads a bounded number of bytes of it; each range keeps the object's size and ETag."""
    create_items(db)
    body = multiline_rows(12_000, newline)
    whole = tmp_path / "whole.csv"
    whole.write_bytes(body)
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    header = ",".join(HEADER).encode() + newline
    url = _upload(s3_conn, s3_conn.bucket(), "big.csv", header + body)

    read = []
    real = objects.open_seekable

    def counting(*args, **kwargs):
        f = real(*args, **kwargs)
        inner = f.read

        def read_counted(size=-1):
            data = inner(size)
            read.append(len(data))
            return data

        f.read = read_counted
        return f

    monkeypatch.setattr(objects, "open_seekable", counting)
    request = request_from_options(
        db.table("items"), url, mode="replace", header=True, partitions=4, source_conn_id=CONN_ID
    )
    with _planned(db, request) as (conn, plan):
        prepared = sum(read)
        pieces = sorted((p for part in plan.partitions for p in part.pieces), key=lambda p: p.start)
        assert len(pieces) == 4
        assert [p.end for p in pieces[:-1]] == [p.start for p in pieces[1:]]
        assert (pieces[0].start, pieces[-1].end) == (len(header), len(header) + len(body))
        assert all(p.speculative and p.etag and p.source_size and p.conn_id for p in pieces)
        assert prepared <= 3 * (window.WINDOW + 1) + (64 << 10) + len(header)  # windows, line 1
        summary = _copy_and_finalize(conn, plan)
    assert summary.rows == expected[0] == 12_000
    assert db.checksum("items") == expected


def test_an_object_range_whose_guessed_start_was_wrong_is_repaired(db, s3_env, tmp_path, caplog):
    """The guessed starts of some ranges fall inside long quoted fields: the COPY tasks mark
    them misaligned and finalize loads them again (its log says which), and the table equals
    one plain COPY. Without a repair the test fails: the rows would be misread or missing."""
    create_items(db)
    body = multiline_rows(300, b"\r\n", long_note_every=60)
    whole = tmp_path / "whole.csv"
    whole.write_bytes(body)
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    url = _upload(s3_env, s3_env.bucket(), "tricky.csv", body)
    caplog.set_level(logging.WARNING, logger="airflow_pg_bulk")

    summary = runner.load(db.dsn, db.table("items"), url, mode="append", partitions=4)

    assert repaired_partitions(caplog), "no range was repaired: the guesses were all right"
    assert summary.rows == expected[0] == 300
    assert db.checksum("items") == expected


def test_an_object_range_changed_after_prepare_fails_its_partition(db, s3_env):
    create_items(db)
    body = multiline_rows(4_000, b"\n")
    bucket = s3_env.bucket()
    url = _upload(s3_env, bucket, "big.csv", body)
    request = request_from_options(db.table("items"), url, mode="replace", partitions=4)
    with _planned(db, request) as (conn, plan):
        assert len(plan.partitions) == 4
        _upload(s3_env, bucket, "big.csv", body.replace(b"name 1", b"NAME 1"))  # same size
        with pytest.raises(SourceChangedError, match="changed after prepare"):
            steps.copy_partition(conn, plan, plan.partitions[-1].index)
    assert db.checksum("items")[0] == 0


def test_rejected_rows_of_an_object_range_name_their_line_in_the_object(db, s3_env):
    """on_error='reject' over an object cut into ranges: a bad row in the last range is set
    aside under its line in the whole object; the other rows load."""
    create_items(db)
    data = bytearray(multiline_rows(4_000, b"\n"))
    at = data.index(b"\n3900,")
    data[at + 1 : at + 5] = b"oops"
    line = 1 + bytes(data[: at + 1]).count(b"\n")
    url = _upload(s3_env, s3_env.bucket(), "r.csv", bytes(data))

    summary = runner.load(
        db.dsn, db.table("items"), url, mode="replace", partitions=4, on_error="reject",
        max_rejects=5,
    )  # fmt: skip

    assert (summary.rows, summary.rejects) == (3_999, 1)
    (found,) = db.run(sql.SQL("SELECT line FROM {}").format(db.ident("pgbulk_rejects")))
    assert found == (line,)


def test_a_split_object_with_a_byte_order_mark_and_no_header_loads(db, s3_env, tmp_path):
    """The mark is left out of the first range (planned like a local file's first piece); the
    other ranges pass their bytes as they are."""
    create_items(db)
    body = multiline_rows(3_000, b"\n")
    whole = tmp_path / "whole.csv"
    whole.write_bytes(body)
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    url = _upload(s3_env, s3_env.bucket(), "bom-big.csv", b"\xef\xbb\xbf" + body)

    summary = runner.load(db.dsn, db.table("items"), url, mode="replace", partitions=3)

    assert summary.partitions == 3
    assert summary.rows == expected[0] == 3_000
    assert db.checksum("items") == expected


def test_the_command_line_reads_objects_without_importing_airflow(db, s3_env):
    """Without a connection id the CLI lists and reads objects through fsspec alone: importing
    Airflow for its ObjectStoragePath cost 4-5 s of every CLI load from s3:// (issue 21)."""
    create_items(db)
    bucket = s3_env.bucket()
    url = _upload(s3_env, bucket, "day.csv.gz", gzip.compress(b"1,a,1.00,,\n2,b,2.00,,\n"))
    script = (
        "import sys\n"
        "from airflow_pg_bulk import cli\n"
        "status = cli.main(sys.argv[1:])\n"
        "loaded = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))\n"
        "print('airflow modules:', loaded)\n"
        "sys.exit(status)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    done = subprocess.run(
        [sys.executable, "-c", script, "-q", "load", "--conn", db.dsn,
         "--table", db.table("items"), "--source", url, "--mode", "replace"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "airflow modules: []" in done.stdout
    assert "2 rows" in done.stdout and db.checksum("items")[0] == 2
