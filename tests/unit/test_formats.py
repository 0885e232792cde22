"""airflow_pg_bulk.source.formats: the format is chosen once, and a Delimited format matches and
cuts files as the header and cutting functions do (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.plan import CopyOptions, request_from_options
from airflow_pg_bulk.source import cutting, formats, header, listing, records
from airflow_pg_bulk.source.syntax import RecordSyntax


def test_the_format_is_chosen_from_the_copy_options() -> None:
    csv = formats.for_copy(CopyOptions(quote="'"))
    assert isinstance(csv, formats.Delimited) and csv.sends_bytes
    assert csv.syntax == RecordSyntax("csv", b"'", b"'")
    assert csv.marker_rule(180000) is records.MarkerRule.NONE
    text = formats.for_copy(CopyOptions(format="text"))
    assert isinstance(text, formats.Delimited) and text.syntax == RecordSyntax("text")
    parquet = formats.for_copy(CopyOptions(format="parquet"))
    assert isinstance(parquet, formats.Parquet) and not parquet.sends_bytes
    assert parquet.marker_rule(180000) is None
    assert parquet.copy_options.format == "csv"


def test_delimited_matches_and_cuts_as_header_and_cutting_do(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b"ID,name\n" + b"".join(b'%d,"x\ny"\n' % i for i in range(5000)))
    copy = CopyOptions(header=True)
    files = listing.list_sources(str(path))
    fmt = formats.for_copy(copy)
    matched = fmt.match(files, ["id", "name"])
    names, lengths = header.map_header(files, copy, ["id", "name"])
    assert matched.names == tuple(names) == ("id", "name")
    assert matched.header_lengths == lengths == {str(path): 8}
    assert fmt.cut(files, 3, matched) == cutting.plan_partitions(files, copy, 3, lengths)


def test_parquet_refuses_what_it_does_not_take() -> None:
    request = request_from_options(
        "s.t", "/x.parquet", mode="replace", format="parquet", columns=["a"]
    )
    with pytest.raises(LoadRefusedError, match="columns= is for files without a header"):
        formats.for_copy(request.copy).refuse_unsupported(request)
    formats.for_copy(CopyOptions()).refuse_unsupported(request)  # delimited: nothing refused
