"""Streams as sources: standard input (``source="-"``) and named pipes, read once, front to back.

Against the real server: the command line fed through its standard input, a FIFO written by a
thread, gzip and headers in a stream, reject mode (the stream is spooled), bad rows named by
record, and the refusals (a terminal, an Airflow task, a stream read twice).
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import create_items, leftovers, plain_copy_checksum, rows, write_csv

from airflow_pg_bulk import runner
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import CopyOptions, Piece
from airflow_pg_bulk.source import listing, reading, streams

CLI = [os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")]


def _load_command(db, *flags: str) -> list[str]:
    return [*CLI, "load", "--conn", db.dsn, "--table", db.table("items"), "--source", "-", *flags]


HEADER = ["id", "name", "amount", "day", "note"]


def _data_and_reference(db, tmp_path: Path, count: int = 2000) -> tuple[bytes, tuple]:
    """A CSV with a header (quoted newlines inside) and the checksum of a plain COPY of it."""
    path = write_csv(tmp_path / "items.csv", rows(count), header=HEADER)
    create_items(db)
    expected = plain_copy_checksum(db, path, "FORMAT csv, HEADER true")
    return path.read_bytes(), expected


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[str, list[bytes], threading.Thread]]:
    """A named pipe, and a list: what is put in it is written to the pipe by a thread."""
    path = str(tmp_path / "items.pipe")
    os.mkfifo(path)
    content: list[bytes] = []

    def write() -> None:
        with open(path, "wb") as pipe:  # blocks until the load opens the pipe
            for chunk in content:
                pipe.write(chunk)

    writer = threading.Thread(target=write, daemon=True)
    yield path, content, writer
    if writer.is_alive():  # the load failed before opening the pipe: unblock the writer
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(5)


def _start(fifo_fixture, data: bytes) -> str:
    path, content, writer = fifo_fixture
    content.append(data)
    writer.start()
    return path


def test_cli_loads_gzip_csv_from_standard_input(db, tmp_path):
    data, expected = _data_and_reference(db, tmp_path)

    done = subprocess.run(
        _load_command(db, "--header", "--mode", "replace", "--partitions", "4", "--json"),
        input=gzip.compress(data),
        capture_output=True,
        timeout=600,
    )

    assert done.returncode == 0, done.stderr.decode()
    assert b'"rows": 2000' in done.stdout
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_cli_bad_row_in_standard_input_names_its_record(db, tmp_path):
    data, _expected = _data_and_reference(db, tmp_path, count=50)
    lines = data.split(b"\n")
    bad = data.replace(b"\n12,", b"\n12x,", 1)
    assert bad != data and len(lines) > 12

    done = subprocess.run(
        _load_command(db, "--header", "--mode", "replace"),
        input=bad,
        capture_output=True,
        timeout=600,
    )

    assert done.returncode == 1
    err = done.stderr.decode()
    # the server's line number within the stream (it counts quoted newlines too): the file's
    # line cannot be checked without the bytes, which a stream does not give twice
    assert re.search(r"<stdin> \(record \d+ of the part starting at line 2\), column id", err), err
    assert 'invalid input syntax for type integer: "12x"' in err
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 0
    assert leftovers(db) == []


def test_named_pipe_is_one_partition_read_once(db, connect, tmp_path, fifo):
    data, expected = _data_and_reference(db, tmp_path)
    path = _start(fifo, data)

    summary = runner.load(
        connect, db.table("items"), path, header=True, mode="replace", partitions=4
    )

    assert (summary.rows, summary.partitions) == (2000, 1)
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_gzip_named_pipe_in_reject_mode_records_file_lines(db, connect, tmp_path, fifo):
    data = rows(300)
    data[99] = (100, "bad amount", "12x", "2024-01-01", None)
    data[249] = ("x250", "bad id", "1.00", "2024-01-01", None)
    source = write_csv(tmp_path / "items.csv", data, header=HEADER, lineterminator="\r\n")
    create_items(db)
    path = _start(fifo, gzip.compress(source.read_bytes()))

    summary = runner.load(
        connect,
        db.table("items"),
        path,
        header=True,
        mode="replace",
        on_error="reject",
        max_rejects=2,
        load_id="a1b2c3d4e5f6",
    )

    assert (summary.rows, summary.rejects) == (298, 2)
    rejected = db.run(
        f"SELECT source_file, line, raw_line FROM {db.schema}.pgbulk_rejects ORDER BY line"
    )
    text = source.read_bytes().decode()
    expected_lines = [_line_of(text, "100,bad amount"), _line_of(text, "x250,bad id")]
    assert [r[1] for r in rejected] == expected_lines
    assert {r[0] for r in rejected} == {os.path.abspath(path)}
    assert [r[2] for r in rejected] == [
        "100,bad amount,12x,2024-01-01,",
        "x250,bad id,1.00,2024-01-01,",
    ]
    assert leftovers(db) == []


def _line_of(text: str, start: str) -> int:
    return text[: text.index("\r\n" + start) + 2].count("\n") + 1


def test_standard_input_in_process_with_too_many_rejects(db, connect, tmp_path, monkeypatch):
    data = rows(100)
    for i in (10, 20, 30):
        data[i - 1] = (i, "bad", "12x", "2024-01-01", None)
    source = write_csv(tmp_path / "items.csv", data)
    create_items(db)
    read_end, write_end = os.pipe()
    os.write(write_end, source.read_bytes())
    os.close(write_end)
    monkeypatch.setattr(sys, "stdin", open(read_end, encoding="utf-8"))  # noqa: SIM115

    with pytest.raises(BadDataError) as info:
        runner.load(
            connect,
            db.table("items"),
            "-",
            mode="replace",
            on_error="reject",
            max_rejects=2,
            load_id="b1b2b3b4b5b6",
        )

    assert str(info.value).startswith("more than max_rejects=2 rows of the source were rejected")
    assert str(info.value).endswith(f"See {db.schema}.pgbulk_rejects for load b1b2b3b4b5b6")
    kept = db.run(f"SELECT source_file, line FROM {db.schema}.pgbulk_rejects ORDER BY line")
    text = source.read_bytes().decode()
    assert kept == [("<stdin>", _plain_line_of(text, f"{i},bad,")) for i in (10, 20, 30)]
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 0
    assert leftovers(db) == []


def _plain_line_of(text: str, start: str) -> int:
    return text[: text.index("\n" + start) + 1].count("\n") + 1


def test_a_terminal_on_standard_input_is_refused(monkeypatch):
    primary, secondary = os.openpty()
    monkeypatch.setattr(sys, "stdin", open(secondary, encoding="utf-8"))  # noqa: SIM115
    try:
        with pytest.raises(LoadRefusedError, match="standard input, which is a terminal"):
            listing.list_sources("-")
    finally:
        os.close(primary)


def test_streams_are_refused_in_an_airflow_task_process(monkeypatch, tmp_path):
    from airflow.sdk.execution_time import task_runner

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object(), raising=False)
    pipe = tmp_path / "p"
    os.mkfifo(pipe)

    with pytest.raises(LoadRefusedError, match=r"standard input \('-'\) can be read only by"):
        listing.list_sources("-")
    with pytest.raises(LoadRefusedError, match=r"the named pipe .* can be read only by"):
        listing.list_sources(str(pipe))  # refused before the open (which would wait for a writer)


def test_a_stream_piece_of_another_process_or_read_twice_is_refused(tmp_path, fifo, monkeypatch):
    monkeypatch.setattr(streams, "STREAMS", {})  # as in a process that did not run prepare
    opts = CopyOptions()
    with pytest.raises(LoadRefusedError, match="opened by another process"):
        list(reading.piece_chunks(Piece(streams.STDIN_NAME), opts))

    path = _start(fifo, b"1,a\n2,b\n")
    (file,) = listing.list_sources(path)
    piece = Piece(file.path)
    assert b"".join(reading.piece_chunks(piece, opts)) == b"1,a\n2,b\n"
    with pytest.raises(LoadRefusedError, match="was read already"):
        list(reading.piece_chunks(piece, opts))


def test_header_split_at_the_wrong_delimiter_names_the_likely_one(db, connect, tmp_path):
    create_items(db)
    path = tmp_path / "items.csv"
    path.write_text("id;name;amount\n1;a;1.00\n")

    with pytest.raises(LoadRefusedError) as info:
        runner.load(connect, db.table("items"), str(path), header=True, mode="replace")

    assert "header columns ['id;name;amount'] match no column of the target" in str(info.value)
    assert str(info.value).endswith(
        "the header was split at the delimiter ',', but the file seems to use ';': "
        "give delimiter=';' (--delimiter)"
    )


@pytest.mark.dag_run
def test_standard_input_is_refused_by_the_prepare_task_under_airflow(airflow_db, db, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from airflow_pg_bulk.demo.connection import airflow_connection_json

    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_EXAMPLE", airflow_connection_json(db.dsn))
    create_items(db)
    examples = Path(__file__).resolve().parent.parent / "dags_examples"
    dag = DagBag(dag_folder=str(examples)).get_dag("example_pg_bulk_replace_many_csv")
    refused = []
    real = streams.refuse_under_airflow

    def spy(name: str) -> None:
        try:
            real(name)
        except LoadRefusedError as exc:
            refused.append(str(exc))
            raise

    monkeypatch.setattr(streams, "refuse_under_airflow", spy)

    run = dag.test(run_conf={"table": db.table("items"), "source": "-"})

    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "failed"
    assert states["load_readings.prepare"] == "failed"
    assert refused and "can be read only by the in-process runner" in refused[0]
    assert leftovers(db) == []
