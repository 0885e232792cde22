"""The Parquet-against-CSV benchmark at a tiny size: both loads run in processes of their own
and give the same table (the benchmark itself fails otherwise). No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import psycopg
from servers import require

from airflow_pg_bulk.demo import workload as demo_workload

require("pyarrow", "needs airflow-pg-bulk[parquet]")


def test_parquet_and_csv_of_the_same_rows_load_the_same_table(pg_dsn: str, tmp_path: Path):
    from benchmarks import parquet_vs_csv

    out = tmp_path / "parquet.md"
    try:
        runs = parquet_vs_csv.main(
            ["--conn", pg_dsn, "--meters", "40", "--days", "10", "--files", "2", "--reps", "1",
             "--row-group-rows", "150", "--workdir", str(tmp_path), "--out", str(out)]
        )  # fmt: skip
    finally:
        with psycopg.connect(pg_dsn) as conn:
            demo_workload.drop_schema(conn, "bench_a")
    assert sorted(r.fmt for r in runs) == ["csv", "parquet"]
    assert {r.checksum[0] for r in runs} == {400}
    assert runs[0].checksum == runs[1].checksum
    assert "| parquet |" in out.read_text() and "| csv |" in out.read_text()
