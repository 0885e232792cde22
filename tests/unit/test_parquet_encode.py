"""The Parquet encoder without a server: what COPY CSV gets for each kind of value, which
types are refused, and the message when pyarrow is missing."""

from __future__ import annotations

import datetime as dt
import sys
from decimal import Decimal

import pytest
from servers import require

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.source import parquet

pa = require("pyarrow", "needs airflow-pg-bulk[parquet]")


def _csv(**columns: object) -> bytes:
    batch = pa.RecordBatch.from_pydict(columns)
    names = list(columns)
    return parquet.encode(parquet.text_arrays(batch, names), names)


def test_strings_are_always_quoted_so_null_and_empty_differ():
    assert _csv(s=["", None, "a,b", 'q"x', "l1\nl2", "\\."]) == (
        b'""\n\n"a,b"\n"q""x"\n"l1\nl2"\n"\\."\n'
    )


def test_exact_forms_of_numbers_times_and_binary():
    paris = dt.timezone(dt.timedelta(hours=1))
    out = _csv(
        d=pa.array([Decimal("-12345678901234567890.123456789")], pa.decimal128(38, 9)),
        f=[0.1],
        b=[False],
        day=[dt.date(2024, 2, 29)],
        at=pa.array(
            [dt.datetime(2024, 1, 1, 1, 0, tzinfo=paris)], pa.timestamp("us", "Europe/Paris")
        ),
        seen=pa.array([dt.datetime(2024, 1, 1, 1, 0, 0, 5)], pa.timestamp("us")),
        raw=pa.array([b"\x00\xff,"], pa.binary()),
        tag=pa.array(["x"]).dictionary_encode(),
    )
    assert out == (
        b"-12345678901234567890.123456789,0.1,false,2024-02-29,2024-01-01 00:00:00.000000Z,"
        b'2024-01-01 01:00:00.000005,"\\x00ff2c","x"\n'
    )


@pytest.mark.parametrize(
    ("arrow_type", "words"),
    [
        (pa.list_(pa.int32()), "nested types"),
        (pa.struct([("a", pa.int32())]), "nested types"),
        (pa.duration("s"), "durations"),
    ],
)
def test_types_without_an_exact_text_form_are_refused(arrow_type, words):
    assert words in (parquet.unsupported_type(arrow_type) or "")
    assert parquet.unsupported_type(pa.dictionary(pa.int8(), pa.string())) is None


def test_missing_pyarrow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(LoadRefusedError) as refused:
        parquet.pyarrow_modules()
    assert "airflow-pg-bulk[parquet]" in str(refused.value)


def test_a_parquet_piece_round_trips_as_plain_data():
    from airflow_pg_bulk.plan import Piece

    piece = Piece("s3://b/a.parquet", 4, 9000, conn_id="c", source_size=9100, row_groups=(3, 4))
    assert Piece.from_dict(piece.to_dict()) == piece and piece.size == 8996


def test_options_a_parquet_load_does_not_take_are_refused():
    from airflow_pg_bulk.plan import CopyOptions, request_from_options

    with pytest.raises(ValueError, match="a Parquet file names its columns"):
        CopyOptions(format="parquet", header=True)
    for options, words in (
        ({"on_error": "reject"}, "on_error='reject'"),
        ({"columns": ["a"]}, "columns="),
    ):
        request = request_from_options(
            "s.t", "/x/*.parquet", mode="replace", format="parquet", **options
        )
        with pytest.raises(LoadRefusedError, match=words):
            parquet.refuse_unsupported(request)
