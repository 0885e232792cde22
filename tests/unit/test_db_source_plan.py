"""A database source in the request and the plan, without a server: what is refused before
anything connects, the URL masked, and the plan's parts round-tripping through XCom's dicts."""

from __future__ import annotations

import pytest

from airflow_pg_bulk.errors import LoadRefusedError
from airflow_pg_bulk.loading.database import urls
from airflow_pg_bulk.plan import DatabaseSource, Piece, request_from_options


def test_request_takes_one_database_source_and_refuses_file_options() -> None:
    request = request_from_options(
        "s.t", None, mode="replace", source_url="sqlite:///x.db", query="SELECT 1 AS id"
    )
    assert request.from_database and request.source == ()
    refused = {
        "either source": dict(source="/x.csv", source_url="sqlite:///x.db", query="SELECT 1"),
        "query or source_table": dict(source_url="sqlite:///x.db"),
        "one of them": dict(source_url="sqlite:///x.db", query="SELECT 1", source_table="t"),
        "source_conn_id": dict(query="SELECT 1"),
        "apply to files": dict(source_url="sqlite:///x.db", query="SELECT 1", header=True),
        "not to a database": dict(
            source_url="sqlite:///x.db", query="SELECT 1", on_error="reject", max_rejects=1
        ),
        "split_by needs partitions": dict(source_url="sqlite:///x.db", query="q", split_by="id"),
        "split_by applies": dict(source="/x.csv", split_by="id", partitions=2),
    }
    for message, options in refused.items():
        source = options.pop("source", None)
        with pytest.raises(ValueError, match=message):
            request_from_options("s.t", source, mode="replace", **options)


def test_url_is_masked_and_its_backend_read() -> None:
    url = "postgresql+psycopg://loader:s3cret@db:5432/shop"
    name = urls.hold(url)
    assert "s3cret" not in name and name.startswith("postgresql+psycopg://loader:")
    assert urls.is_postgres(url) and urls.is_postgres("postgres://h/db")
    assert not urls.is_postgres("sqlite:///x.db")
    with pytest.raises(LoadRefusedError, match="must be a URL"):
        urls.masked("host=db password=s3cret")


def test_database_source_and_key_range_round_trip() -> None:
    source = DatabaseSource("conn", True, "SELECT 1", None, ("id",), "id", "00000003-1")
    assert DatabaseSource.from_dict(source.to_dict()) == source
    piece = Piece("conn", key_range=(None, "2026-01-02"))
    assert Piece.from_dict(piece.to_dict()) == piece
    assert Piece.from_dict(Piece("conn", key_range=(5, 10)).to_dict()).key_range == (5, 10)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://loader:s3cret@db:5432/shop",
        "postgres://h/db",
        "postgresql://u:p%40ss@/db?host=/run/postgresql&port=5432",
        "postgresql://[::1]:5432/x?b=2&a=1&a=3",
        "postgresql://u:@h/d b",
        "postgresql://",
    ],
)
def test_a_postgres_url_is_read_as_sqlalchemy_reads_it(url: str) -> None:
    """The PostgreSQL path reads its URL without SQLAlchemy, to the same masked name."""
    from sqlalchemy.engine import make_url

    assert urls.masked(url) == make_url(url).render_as_string(hide_password=True)
    assert urls.is_postgres(url)


def test_the_postgres_path_does_not_import_sqlalchemy() -> None:
    """Importing SQLAlchemy costs 0.12 s of a load's start; a PostgreSQL source needs it for
    nothing (checked in a fresh interpreter, after the CLI and the runner are imported)."""
    import subprocess
    import sys

    probe = (
        "import sys, airflow_pg_bulk.cli, airflow_pg_bulk.runner\n"
        "from airflow_pg_bulk.loading.database import urls\n"
        "name = urls.hold('postgresql+psycopg://u:s3cret@h/db')\n"
        "assert urls.is_postgres(name) and 's3cret' not in name\n"
        "print('sqlalchemy' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"
