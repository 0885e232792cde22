"""Database sources beside the peers, in one run (issue 20, item 8).

    python -m benchmarks.db_source --conn DSN [--meters 15000] [--days 365] [--subset 100000]
        [--reps 2] [--workdir DIR] [--json F] [--out F] [--methods a,b]

Workload A (``readings``: id PK, meter_id FK to ``meters``, reading, date; 15,000 meters x 365
days = 5,475,000 rows) lives in a source database of its own on the same server
(``bench_dbsrc_source``; ``--name`` gives another prefix), built once, not timed, kept and
reused when it already holds the rows, and, for the SQLite methods, in a SQLite file with
the same rows. Each method loads it into a target on the server at ``--conn``:

- ``floor``: ``psql \\copy (SELECT ...) TO STDOUT | psql \\copy ... FROM STDIN`` into an
  UNLOGGED table without index or key (what a database-to-database load cannot beat);
- ``pgcopydb``: ``pgcopydb copy table-data`` then ``copy indexes`` then ``copy constraints``
  (2 table jobs, 2 index jobs), then the foreign key (``copy constraints`` makes only the
  constraints backed by an index; ``pgcopydb clone`` restores FKs with pg_restore: here the
  same ALTER TABLE by psql), into a fresh database holding the source's pre-data (the tables
  without keys, as ``pg_dump --section=pre-data`` makes them; not timed): end to end, PK + FK;
- ``project_1`` / ``project_2``: this project's CLI in replace mode, ``--source-url`` +
  ``--source-table``, one COPY stream, or ``--split-by id --partitions 2``; the target has PK +
  FK and is emptied (TRUNCATE, not timed) before each run, as pgcopydb's is fresh;
- ``generic_transfer``: Airflow's ``GenericTransfer.execute()`` in-process (postgres
  connections from ``AIRFLOW_CONN_*``), default options, on the first ``--subset`` rows only
  (it reads all rows into memory, then inserts them row by row), into a table with PK + FK;
- ``project_subset``: this project on the same subset (``--query ... WHERE id <= subset``);
- ``sqlite_project`` (all rows), ``sqlite_project_subset``, ``sqlite_generic_transfer``
  (subset): the same from the SQLite file (``sqlite:///`` URL; Airflow's sqlite connection
  needs apache-airflow-providers-sqlite importable). Its ``readings`` is a STRICT table, so
  ``sqlite_project`` reads it by ADBC's driver as Arrow record batches (the ``sqlite``
  extra); ``sqlite_project_rows`` reads the same rows from ``readings_plain``, not STRICT,
  from a DB-API cursor (the rows path), as ``sqlite_project_subset`` (a query) does.
- ``maria_project_subset``, ``maria_generic_transfer`` (subset), with ``--maria URL`` only
  (``mysql+pymysql://root@127.0.0.1:3306``): the same from a MariaDB database of their own
  (``NAME_maria``, the same rows made by the server from its ``seq_`` tables, kept and reused):
  the project (the server making each row one COPY text line, every column of ``readings``
  being a number or a date, fetched as one bytes value a row by mysql-connector-python's C
  extension where it loads, else by PyMySQL, and written into COPY as it is),
  GenericTransfer through Airflow's mysql
  connection with ``mysql-connector-python`` (apache-airflow-providers-mysql and
  mysql-connector-python importable, else it is left out).

The project's and the ``--baseline`` tree's bytecode is compiled before anything is timed
(:func:`compile_bytecode`), as an installed package's is. Every method runs in a process of
its own (peak RSS and CPU time from ``wait4``); the runs of each repetition are interleaved;
before each run the server CHECKPOINTs. After each run the target's row count and
order-independent checksum must equal the source's (the run fails
otherwise), and for the key-carrying targets the PK and FK must be there.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import shlex
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __package__ in (None, ""):  # run as a script: python benchmarks/db_source.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_pg_bulk.demo import workload as demo_workload
from benchmarks.measure import loadavg, run_measured
from benchmarks.peers import pgcopydb_uri
from benchmarks.server import postmaster_of

REPO = Path(__file__).resolve().parent.parent
NAME = "bench_dbsrc"  # the target's schema; the databases are NAME_source and NAME_pgcopydb
SOURCE_SCHEMA = "bench_a"
COLUMNS = ("id", "meter_id", "reading", "date")
SELECT = "SELECT id, meter_id, reading, date FROM bench_a.readings"


@dataclass(frozen=True)
class Method:
    """One way to load the rows: its key, what it is, whether it loads the subset only."""

    key: str
    label: str
    subset: bool = False
    sqlite: bool = False
    maria: bool = False  # reads the MariaDB database (``--maria``)
    baseline: bool = False  # the project's code from ``--baseline`` (a tree before a change)


METHODS: tuple[Method, ...] = (
    Method("floor", "psql \\copy TO STDOUT | psql \\copy FROM STDIN, UNLOGGED, no index"),
    Method(
        "pgcopydb",
        "pgcopydb copy table-data + copy indexes + copy constraints (2 jobs) + the FK by psql",
    ),
    Method("project_1", "this project, replace, --source-table, 1 COPY stream"),
    Method("project_2", "this project, replace, --source-table --split-by id --partitions 2"),
    Method("generic_transfer", "Airflow GenericTransfer.execute(), defaults", subset=True),
    Method("project_subset", "this project, replace, --query ... WHERE id <= subset", subset=True),
    Method(
        "sqlite_project",
        "SQLite: this project, replace, --source-table of a STRICT table (ADBC, Arrow)",
        sqlite=True,
    ),
    Method(
        "sqlite_project_rows",
        "SQLite: this project, --source-table of the same rows not STRICT (sqlite3 cursor)",
        sqlite=True,
    ),
    Method("sqlite_project_subset", "SQLite: this project, --query WHERE id <= subset", True, True),
    Method("sqlite_generic_transfer", "SQLite: GenericTransfer.execute(), defaults", True, True),
    Method(
        "maria_project_subset",
        "MariaDB: this project, --query WHERE id <= subset (COPY text lines made by the"
        " server, read by mysql-connector-python's C extension where it loads, else PyMySQL)",
        subset=True,
        maria=True,
    ),
    Method(
        "maria_generic_transfer",
        "MariaDB: GenericTransfer.execute(), defaults (mysql-connector-python)",
        subset=True,
        maria=True,
    ),
)
#: the project's methods run again from the ``--baseline`` tree (``<key>_before``), in the same
#: run, so that a change is measured against the code before it under the same load
BASELINE_OF = (
    "project_1",
    "project_2",
    "project_subset",
    "sqlite_project",
    "sqlite_project_rows",
    "sqlite_project_subset",
    "maria_project_subset",
)
METHODS += tuple(
    dataclasses.replace(
        m, key=f"{m.key}_before", label=f"{m.label} (--baseline tree)", baseline=True
    )
    for m in METHODS
    if m.key in BASELINE_OF
)
BY_KEY = {m.key: m for m in METHODS}


@dataclass
class Run:
    """One timed run of one method."""

    method: str
    rep: int
    rows: int
    seconds: float
    rows_per_s: float
    peak_rss_mb: float
    client_cpu: float
    server_cpu: float | None
    other_cpu: float | None
    load_before: float
    ok: bool
    error: str = ""
    checksum: int = 0  # of the target's rows after the run (see :func:`checksum`)
    steps: dict[str, float] = field(default_factory=dict)


# --- connections -----------------------------------------------------------------------------


def dsn_for(dsn: str, dbname: str) -> str:
    """The DSN with another database."""
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def url_for(dsn: str, dbname: str | None = None) -> str:
    """A ``postgresql://`` URL (what ``--source-url`` and Airflow connections take)."""
    params = conninfo_to_dict(dsn if dbname is None else dsn_for(dsn, dbname))
    user = params.get("user", "postgres")
    auth = f"{user}:{params['password']}" if params.get("password") else user
    host, port = params.get("host", "localhost"), params.get("port", "5432")
    db = params.get("dbname", "postgres")
    if host.startswith("/"):
        return f"postgresql://{auth}@/{db}?host={host}&port={port}"
    return f"postgresql://{auth}@{host}:{port}/{db}"


def _admin(dsn: str, *statements: sql.Composable) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _database_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return row is not None


def _recreate_database(dsn: str, name: str) -> None:
    _admin(
        dsn,
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)),
    )


# --- the data, not timed -----------------------------------------------------------------------

_FILL = sql.SQL(
    "INSERT INTO bench_a.readings (id, meter_id, reading, date) OVERRIDING SYSTEM VALUE"
    " SELECT (m - 1) * {days} + d + 1, m, ((m * 7919 + d * 104729) % 1000000) / 1000000.0,"
    " {start}::date + d"
    " FROM generate_series({first}, {last}) m, generate_series(0, {days} - 1) d ORDER BY m, d"
)


def checksum(dsn: str, table: str, subset: int | None = None) -> tuple[int, int]:
    """Row count and order-independent checksum of ``table`` (``schema.table``) on ``dsn``,
    of its rows with ``id <= subset`` when given."""
    schema, name = table.split(".")
    where = sql.SQL("") if subset is None else sql.SQL(" WHERE id <= {}").format(subset)
    query = sql.SQL(
        "SELECT count(*), coalesce(sum(hashtext((id, meter_id, reading, date)::text)), 0) FROM {}{}"
    ).format(sql.Identifier(schema, name), where)
    with psycopg.connect(dsn) as conn:
        count, total = conn.execute(query).fetchone()  # type: ignore[misc]
    return int(count), int(total)


def build_source(dsn: str, name: str, meters: int, days: int) -> str:
    """The source database ``name`` holding workload A (PK + FK, vacuumed), reused when it
    holds the rows already. Returns its DSN."""
    source = dsn_for(dsn, name)
    rows = meters * days
    if _database_exists(dsn, name):
        try:
            with psycopg.connect(source) as conn:
                got = conn.execute(
                    "SELECT (SELECT count(*) FROM bench_a.meters), count(*), max(id)"
                    " FROM bench_a.readings"
                ).fetchone()
            if got == (meters, rows, rows):
                return source
        except psycopg.Error:
            pass
    _recreate_database(dsn, name)
    with psycopg.connect(source) as conn:
        demo_workload.create_schema(conn, SOURCE_SCHEMA)
        demo_workload.fill_meters(conn, SOURCE_SCHEMA, meters)
        step = 1000
        for first in range(1, meters + 1, step):
            conn.execute(
                _FILL.format(
                    days=sql.Literal(days),
                    start=sql.Literal(demo_workload.START_DATE),
                    first=sql.Literal(first),
                    last=sql.Literal(min(meters, first + step - 1)),
                )
            )
            conn.commit()
    _admin(source, sql.SQL("VACUUM ANALYZE"))
    return source


def build_sqlite(source: str, path: Path, rows: int) -> None:
    """A SQLite file with the source's readings twice (reused when it holds ``rows`` rows in
    each): ``readings``, a STRICT table (read by ADBC's driver as Arrow record batches, with
    the ``sqlite`` extra), and ``readings_plain``, the same rows in a table that is not
    STRICT (read from a DB-API cursor: the rows path)."""
    if path.exists():
        with sqlite3.connect(path) as lite:
            try:
                held = lite.execute(
                    "SELECT count(*), max(id), (SELECT strict FROM pragma_table_list"
                    " WHERE name = 'readings'), (SELECT count(*) FROM readings_plain)"
                    " FROM readings"
                ).fetchone()
                if held == (rows, rows, 1, rows):
                    return
            except sqlite3.Error:
                pass
        path.unlink()
    lite = sqlite3.connect(path)
    lite.execute(
        "CREATE TABLE readings (id INTEGER PRIMARY KEY, meter_id INTEGER NOT NULL,"
        " reading REAL, date TEXT) STRICT"
    )
    with psycopg.connect(source) as conn, conn.cursor("sqlite_export") as cur:
        cur.itersize = 50_000
        cur.execute(SELECT + " ORDER BY id")
        while batch := cur.fetchmany(50_000):
            lite.executemany(
                "INSERT INTO readings VALUES (?, ?, ?, ?)",
                [(i, m, r, d.isoformat()) for i, m, r, d in batch],
            )
    lite.execute(
        "CREATE TABLE readings_plain (id INTEGER PRIMARY KEY, meter_id INTEGER NOT NULL,"
        " reading REAL, date TEXT)"
    )
    lite.execute("INSERT INTO readings_plain SELECT * FROM readings")
    lite.commit()
    lite.close()


def build_maria(url: str, meters: int, days: int) -> str:
    """The MariaDB database ``url`` names (made when missing) holding the source's readings,
    made by the server from its ``seq_`` tables with the source's formula (``_FILL``: the
    same values, a DOUBLE divided by 1e6 as PostgreSQL's numeric is rounded to float8); kept
    and reused when it holds the rows already. Returns ``url``."""
    import sqlalchemy

    rows = meters * days
    database = urlsplit(url).path.lstrip("/")
    server = sqlalchemy.create_engine(urlsplit(url)._replace(path="/").geturl())
    try:
        with server.begin() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    finally:
        server.dispose()
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as conn:
            try:
                held = conn.exec_driver_sql("SELECT count(*), max(id) FROM readings").one()
                if tuple(held) == (rows, rows):
                    return url
            except sqlalchemy.exc.DBAPIError:
                pass
            conn.exec_driver_sql("DROP TABLE IF EXISTS readings")
            conn.exec_driver_sql(
                "CREATE TABLE readings (id bigint PRIMARY KEY, meter_id bigint NOT NULL,"
                " reading double, date date)"
            )
            conn.exec_driver_sql(
                f"INSERT INTO readings SELECT (m.seq - 1) * {days} + d.seq + 1, m.seq,"
                " CAST(MOD(m.seq * 7919 + d.seq * 104729, 1000000) AS double) / 1e6,"
                f" date '{demo_workload.START_DATE}' + INTERVAL d.seq DAY"
                f" FROM seq_1_to_{meters} m, seq_0_to_{days - 1} d ORDER BY m.seq, d.seq"
            )
    finally:
        engine.dispose()
    return url


def build_target(dsn: str, schema: str, meters: int) -> None:
    """The target schema: ``meters`` (filled), ``readings`` (the project's target, identity PK
    + FK, as workload A's) and ``gt_readings`` (GenericTransfer's: PK + FK, a plain bigint id,
    since its INSERTs give the id)."""
    with psycopg.connect(dsn) as conn:
        demo_workload.drop_schema(conn, schema)
        demo_workload.create_schema(conn, schema)
        demo_workload.fill_meters(conn, schema, meters)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, meter_id bigint REFERENCES {},"
                " reading double precision, date date)"
            ).format(sql.Identifier(schema, "gt_readings"), sql.Identifier(schema, "meters"))
        )
        conn.commit()


def _keys(dsn: str, table: str) -> list[str]:
    """The PK and FK constraints on ``table``."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT contype FROM pg_constraint WHERE conrelid = %s::regclass"
            " AND contype IN ('p', 'f') ORDER BY contype",
            (table,),
        ).fetchall()
    return [r[0] for r in rows]


# --- the methods -------------------------------------------------------------------------------


@dataclass
class Context:
    """What every method needs: DSNs, paths, sizes."""

    dsn: str  # the target
    source: str  # the source database's DSN
    sqlite_path: Path
    workdir: Path
    rows: int
    subset: int
    schema: str  # the target's; NAME unless told
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    baseline: Path | None = None  # the tree the ``_before`` methods run the project from
    maria: str | None = None  # the MariaDB source database's SQLAlchemy URL (``--maria``)


@dataclass
class Prepared:
    """A method ready to run: its commands (run one after another, timed together), the table
    whose rows are checked, and on which database."""

    commands: list[tuple[str, list[str]]]
    check_dsn: str
    check_table: str
    keys: bool  # PK + FK expected on the checked table
    tree: Path = REPO  # the commands' working directory, first on PYTHONPATH


def _psql(dsn: str, command: str) -> str:
    return f"psql {shlex.quote(dsn)} -X -q -v ON_ERROR_STOP=1 -c {shlex.quote(command)}"


def prepare_floor(ctx: Context) -> Prepared:
    """The psql pipe into a fresh UNLOGGED table without index."""
    _admin(
        ctx.dsn,
        sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(ctx.schema, "floor")),
        sql.SQL(
            "CREATE UNLOGGED TABLE {} (id bigint, meter_id bigint,"
            " reading double precision, date date)"
        ).format(sql.Identifier(ctx.schema, "floor")),
    )
    out = _psql(ctx.source, f"\\copy ({SELECT}) TO STDOUT")
    into = _psql(ctx.dsn, f"\\copy {ctx.schema}.floor (id, meter_id, reading, date) FROM STDIN")
    command = ["bash", "-c", f"set -o pipefail; {out} | {into}"]
    return Prepared([("pipe", command)], ctx.dsn, f"{ctx.schema}.floor", keys=False)


# pgcopydb's ``copy constraints`` makes the constraints backed by an index (the PK); a foreign
# key is post-data, which its ``clone`` restores with pg_restore: this statement, here by psql.
_FK = (
    "ALTER TABLE bench_a.readings ADD CONSTRAINT fk__readings_meters"
    " FOREIGN KEY (meter_id) REFERENCES bench_a.meters (id)"
)


# The source's pre-data, as ``pg_dump --section=pre-data`` gives it: the tables without their
# keys (pg_dump itself is left out: its version must match the server's).
_PRE_DATA = (
    "CREATE SCHEMA bench_a",
    "CREATE TABLE bench_a.meters (id bigint NOT NULL)",
    "CREATE TABLE bench_a.readings (id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,"
    " meter_id bigint, reading double precision, date date)",
)


def prepare_pgcopydb(ctx: Context) -> Prepared:
    """pgcopydb's copy, index and constraint steps, then the FK, into a fresh database."""
    _recreate_database(ctx.dsn, f"{ctx.schema}_pgcopydb")
    target = dsn_for(ctx.dsn, f"{ctx.schema}_pgcopydb")
    _admin(target, *(sql.SQL(statement) for statement in _PRE_DATA))
    directory = ctx.workdir / "pgcopydb"
    shutil.rmtree(directory, ignore_errors=True)
    common = [
        "--source",
        pgcopydb_uri(ctx.source),
        "--target",
        pgcopydb_uri(target),
        "--dir",
        str(directory),
    ]
    return Prepared(
        [
            ("table-data", ["pgcopydb", "copy", "table-data", *common, "--table-jobs", "2"]),
            (
                "indexes",
                [
                    "pgcopydb",
                    "copy",
                    "indexes",
                    *common,
                    "--index-jobs",
                    "2",
                    "--resume",
                    "--not-consistent",
                ],
            ),
            (
                "constraints",
                ["pgcopydb", "copy", "constraints", *common, "--resume", "--not-consistent"],
            ),
            ("foreign key", ["psql", target, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", _FK]),
        ],
        target,
        "bench_a.readings",
        keys=True,
    )


def _project(ctx: Context, source_url: str, *extra: str) -> Prepared:
    _admin(ctx.dsn, sql.SQL("TRUNCATE {}").format(sql.Identifier(ctx.schema, "readings")))
    command = [
        ctx.python,
        "-m",
        "airflow_pg_bulk.cli",
        "load",
        "--conn",
        ctx.dsn,
        "--table",
        f"{ctx.schema}.readings",
        "--mode",
        "replace",
        "--source-url",
        source_url,
        *extra,
    ]
    return Prepared([("load", command)], ctx.dsn, f"{ctx.schema}.readings", keys=True)


def _before(key: str) -> Callable[[Context], Prepared]:
    """Method ``key`` with the project's code from the ``--baseline`` tree."""

    def prepare(ctx: Context) -> Prepared:
        assert ctx.baseline is not None, "the _before methods need --baseline"
        return dataclasses.replace(PREPARE[key](ctx), tree=ctx.baseline)

    return prepare


def _subset_query(ctx: Context, table: str) -> str:
    return f"SELECT id, meter_id, reading, date FROM {table} WHERE id <= {ctx.subset}"


def _sqlite_url(ctx: Context) -> str:
    return f"sqlite:///{ctx.sqlite_path}"


def _maria_url(ctx: Context) -> str:
    assert ctx.maria is not None, "the maria methods need --maria"
    return ctx.maria


def _generic_transfer(ctx: Context, source_url: str, query: str) -> Prepared:
    command = [
        ctx.python,
        "-m",
        "benchmarks.db_source",
        "--generic-transfer",
        "--source-url",
        source_url,
        "--target-url",
        url_for(ctx.dsn),
        "--query",
        query,
        "--name",
        ctx.schema,
    ]
    return Prepared([("execute", command)], ctx.dsn, f"{ctx.schema}.gt_readings", keys=True)


PREPARE: dict[str, Callable[[Context], Prepared]] = {
    "floor": prepare_floor,
    "pgcopydb": prepare_pgcopydb,
    "project_1": lambda c: _project(c, url_for(c.source), "--source-table", "bench_a.readings"),
    "project_2": lambda c: _project(
        c,
        url_for(c.source),
        "--source-table",
        "bench_a.readings",
        "--split-by",
        "id",
        "--partitions",
        "2",
    ),
    "generic_transfer": lambda c: _generic_transfer(
        c, url_for(c.source), _subset_query(c, "bench_a.readings")
    ),
    "project_subset": lambda c: _project(
        c, url_for(c.source), "--query", _subset_query(c, "bench_a.readings")
    ),
    "sqlite_project": lambda c: _project(c, _sqlite_url(c), "--source-table", "readings"),
    "sqlite_project_rows": lambda c: _project(
        c, _sqlite_url(c), "--source-table", "readings_plain"
    ),
    "sqlite_project_subset": lambda c: _project(
        c, _sqlite_url(c), "--query", _subset_query(c, "readings")
    ),
    "sqlite_generic_transfer": lambda c: _generic_transfer(
        c, _sqlite_url(c), _subset_query(c, "readings")
    ),
    "maria_project_subset": lambda c: _project(
        c, _maria_url(c), "--query", _subset_query(c, "readings")
    ),
    "maria_generic_transfer": lambda c: _generic_transfer(
        c, _maria_url(c), _subset_query(c, "readings")
    ),
}
PREPARE.update({f"{key}_before": _before(key) for key in BASELINE_OF})


def compile_bytecode(tree: Path) -> None:
    """The bytecode of ``tree``'s modules (the project's and the benchmarks'), compiled
    before anything is timed, as pip compiles an installed package's: run from a checkout
    with ``PYTHONDONTWRITEBYTECODE`` set (as this machine's environment does), every CLI start
    compiled each of the project's modules again, 0.13 s of CPU an installed package does
    not spend (``import airflow_pg_bulk.runner, airflow_pg_bulk.cli``: 0.40 s against
    0.26 s, three runs each)."""
    import compileall

    for package in ("airflow_pg_bulk", "benchmarks"):
        compileall.compile_dir(tree / package, quiet=1)


def generic_transfer(source_url: str, target_url: str, query: str, schema: str) -> None:
    """Airflow's GenericTransfer, run through its ``execute()`` in this process, as a task
    would run it: connections from ``AIRFLOW_CONN_*``, default options, a TRUNCATE of the
    destination as its preoperator."""
    if source_url.startswith("sqlite:///"):  # Airflow's sqlite URI form: the path as host
        source_url = json.dumps({"conn_type": "sqlite", "host": source_url[len("sqlite:///") :]})
    elif source_url.startswith("mysql"):  # Airflow's mysql connection, through a C-backed driver
        url = urlsplit(source_url)
        source_url = json.dumps(
            {
                "conn_type": "mysql",
                "host": url.hostname,
                "port": url.port or 3306,
                "login": url.username,
                "password": url.password or "",
                "schema": url.path.lstrip("/"),
                "extra": {"client": "mysql-connector-python"},
            }
        )
    os.environ["AIRFLOW_CONN_BENCH_SOURCE"] = source_url
    os.environ["AIRFLOW_CONN_BENCH_TARGET"] = target_url
    from airflow.providers.common.sql.operators.generic_transfer import GenericTransfer

    task = GenericTransfer(
        task_id="generic_transfer",
        sql=query,
        source_conn_id="bench_source",
        destination_conn_id="bench_target",
        destination_table=f"{schema}.gt_readings",
        preoperator=f"TRUNCATE {schema}.gt_readings",
        insert_args={"target_fields": list(COLUMNS)},
    )
    task.execute(context={})  # type: ignore[arg-type]


def _env_for(env: dict[str, str], tree: Path) -> dict[str, str]:
    """``env`` with ``tree`` first on PYTHONPATH in place of this repository."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    return {**env, "PYTHONPATH": os.pathsep.join([str(tree), *rest])}


def run_method(ctx: Context, method: Method, rep: int, expected: tuple[int, int]) -> Run:
    """Prepare (not timed), CHECKPOINT, run and measure the method's commands, check the
    target's rows."""
    prepared = PREPARE[method.key](ctx)
    _admin(ctx.dsn, sql.SQL("CHECKPOINT"))
    with psycopg.connect(ctx.dsn) as conn:
        postmaster = postmaster_of(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
    log = ctx.workdir / f"{method.key}.log"
    steps: dict[str, float] = {}
    wall = client = 0.0
    server: float | None = 0.0
    other: float | None = 0.0
    rss = 0
    load_before = loadavg()
    error = ""
    for name, command in prepared.commands:
        with open(log, "a") as f:
            f.write(f"\n=== rep {rep} {name}: {shlex.join(command)}\n")
        m = run_measured(  # (its peak RSS through measure's launcher)
            command,
            log_path=log,
            postmaster=postmaster,
            env=_env_for(ctx.env, prepared.tree),
            cwd=prepared.tree,
            new_session=True,
        )
        steps[name] = round(m.wall, 3)
        wall += m.wall
        client += m.client_cpu
        server = None if server is None or m.server_cpu is None else server + m.server_cpu
        other = None if other is None or m.other_cpu is None else other + m.other_cpu
        rss = max(rss, m.peak_rss_kb)
        if m.returncode != 0:
            error = f"{name} exited {m.returncode}: see {log}"
            break
    rows = total = 0
    if not error:
        got = checksum(prepared.check_dsn, prepared.check_table)
        rows, total = got
        if got != expected:
            error = f"{prepared.check_table}: {got} rows/checksum, expected {expected}"
        elif prepared.keys and _keys(prepared.check_dsn, prepared.check_table) != ["f", "p"]:
            error = f"{prepared.check_table}: PK + FK missing after the load"
    return Run(
        method=method.key,
        rep=rep,
        rows=rows,
        seconds=round(wall, 3),
        rows_per_s=round(rows / wall) if wall else 0,
        peak_rss_mb=round(rss / 1024, 1),
        client_cpu=round(client, 2),
        server_cpu=None if server is None else round(server, 2),
        other_cpu=None if other is None else round(other, 2),
        load_before=load_before,
        ok=not error,
        error=error,
        checksum=total,
        steps=steps,
    )


# --- the report --------------------------------------------------------------------------------


def medians(runs: list[Run]) -> dict[str, dict[str, float]]:
    """Per method: median seconds, rows/s and peak RSS of its successful runs."""
    out: dict[str, dict[str, float]] = {}
    for key in dict.fromkeys(r.method for r in runs):
        mine = [r for r in runs if r.method == key and r.ok]
        if mine:
            out[key] = {
                "seconds": round(statistics.median(r.seconds for r in mine), 3),
                "rows_per_s": round(statistics.median(r.rows_per_s for r in mine)),
                "peak_rss_mb": max(r.peak_rss_mb for r in mine),
                "rows": mine[0].rows,
            }
    return out


def targets(med: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """The issue's targets, from the medians of this run: met or missed, by how much.
    Ratios between methods of different row counts compare rows/s (labelled)."""
    out = []

    def add(name: str, value: float, limit: float, higher_is_better: bool, how: str) -> None:
        met = value >= limit if higher_is_better else value <= limit
        out.append(
            {"target": name, "value": round(value, 2), "limit": limit, "met": met, "how": how}
        )

    best = (
        min((med[k]["seconds"], k) for k in ("project_1", "project_2") if k in med)
        if ("project_1" in med or "project_2" in med)
        else None
    )
    if best and "floor" in med:
        add(
            "project <= 1.3x the floor",
            best[0] / med["floor"]["seconds"],
            1.3,
            False,
            f"{best[1]} s / floor s",
        )
    if best and "pgcopydb" in med:
        add(
            "project faster than pgcopydb end to end",
            med["pgcopydb"]["seconds"] / best[0],
            1.0,
            True,
            f"pgcopydb s / {best[1]} s",
        )
    for gt, project, limit in (
        ("generic_transfer", "project_subset", 20.0),
        ("sqlite_generic_transfer", "sqlite_project_subset", 10.0),
        ("maria_generic_transfer", "maria_project_subset", 10.0),
    ):
        if gt in med and project in med:
            add(
                f"{project} >= {limit:g}x {gt}, same rows",
                med[gt]["seconds"] / med[project]["seconds"],
                limit,
                True,
                f"{gt} s / {project} s",
            )
        full = {"generic_transfer": "project_1", "sqlite_generic_transfer": "sqlite_project"}.get(
            gt, ""
        )
        if gt in med and full in med:
            add(
                f"{full} rows/s >= {limit:g}x {gt} rows/s (extrapolated from its subset)",
                med[full]["rows_per_s"] / med[gt]["rows_per_s"],
                limit,
                True,
                f"{full} rows/s / {gt} rows/s",
            )
    return out


def changes(med: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Each project method against its ``_before`` (the ``--baseline`` tree) in this run:
    median seconds before and after, and before / after (above 1: faster now)."""
    return [
        {
            "method": key,
            "before": med[f"{key}_before"]["seconds"],
            "after": med[key]["seconds"],
            "speedup": round(med[f"{key}_before"]["seconds"] / med[key]["seconds"], 2),
        }
        for key in BASELINE_OF
        if key in med and f"{key}_before" in med
    ]


def markdown(result: dict[str, Any]) -> str:
    """Every run, the medians, the targets."""
    lines = [
        f"Finished {result['date']}, {result['host']}, {result['cpus']} CPUs, load average before "
        f"{result['load_before']}, after {result['load_after']}; {result['server']}.",
        f"Rows: {result['rows']:,} (subset {result['subset']:,}).",
        "",
        "| method | rep | rows | seconds | rows/s | peak RSS MiB | client CPU s | server CPU s "
        "| other CPU s | load before | steps | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        steps = ", ".join(f"{k} {v}" for k, v in r["steps"].items())
        lines.append(
            f"| `{r['method']}` | {r['rep']} | {r['rows']:,} | {r['seconds']} | "
            f"{r['rows_per_s']:,} | {r['peak_rss_mb']} | {r['client_cpu']} | {r['server_cpu']} "
            f"| {r['other_cpu']} | {r['load_before']} | {steps} | "
            f"{'yes' if r['ok'] else 'NO: ' + r['error']} |"
        )
    lines += [
        "",
        "| method | what | rows | median s | median rows/s | peak RSS MiB |",
        "|---|---|---|---|---|---|",
    ]
    for key, m in result["medians"].items():
        label = BY_KEY[key].label.replace("|", "\\|")  # a pipe in a cell ends it
        lines.append(
            f"| `{key}` | {label} | {m['rows']:,} | {m['seconds']} | "
            f"{m['rows_per_s']:,} | {m['peak_rss_mb']} |"
        )
    lines += ["", "| target | measured | limit | met | how |", "|---|---|---|---|---|"]
    for t in result["targets"]:
        lines.append(
            f"| {t['target']} | {t['value']} | {t['limit']} | {'met' if t['met'] else 'MISSED'} "
            f"| {t['how']} |"
        )
    if result.get("changes"):
        lines += [
            "",
            "| method | before (--baseline) median s | after median s | before / after |",
            "|---|---|---|---|",
        ]
        for c in result["changes"]:
            lines.append(f"| `{c['method']}` | {c['before']} | {c['after']} | {c['speedup']} |")
    return "\n".join(lines) + "\n"


def _importable(*modules: str) -> bool:
    """Each of ``modules`` can be imported (its parent packages too)."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ModuleNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every run loaded the source's rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conn", default=os.environ.get("PG_BULK_TEST_DSN"))
    parser.add_argument("--meters", type=int, default=15_000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--subset", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument(
        "--methods", help="default: every method (the _before ones with --baseline)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a tree of this project before a change (git worktree add DIR REV): its _before"
        " methods run the project from there, in the same run",
    )
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--name", default=NAME, help="the target's schema; databases NAME_source, NAME_pgcopydb"
    )
    parser.add_argument(
        "--maria",
        help="a MariaDB server's SQLAlchemy URL (mysql+pymysql://root@127.0.0.1:3306): adds the"
        " maria_ methods, reading the database NAME_maria there",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--generic-transfer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source-url", help=argparse.SUPPRESS)
    parser.add_argument("--target-url", help=argparse.SUPPRESS)
    parser.add_argument("--query", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.generic_transfer:  # the worker: one GenericTransfer, in this process
        generic_transfer(args.source_url, args.target_url, args.query, args.name)
        return 0
    if not args.conn:
        parser.error("--conn (or PG_BULK_TEST_DSN) is required")
    every = [
        m.key for m in METHODS if (args.baseline or not m.baseline) and (args.maria or not m.maria)
    ]
    keys = [k for k in (args.methods or ",".join(every)).split(",") if k]
    unknown = set(keys) - set(BY_KEY)
    if unknown:
        parser.error(f"unknown methods: {sorted(unknown)}")
    if any(BY_KEY[k].baseline for k in keys) and args.baseline is None:
        parser.error("the _before methods need --baseline")
    if any(BY_KEY[k].maria for k in keys) and args.maria is None:
        parser.error("the maria_ methods need --maria")
    if "maria_generic_transfer" in keys and not _importable(
        "airflow.providers.mysql", "mysql.connector"
    ):
        print(
            "apache-airflow-providers-mysql or mysql-connector-python is not importable:"
            " maria_generic_transfer is left out",
            file=sys.stderr,
        )
        keys.remove("maria_generic_transfer")
    if "pgcopydb" in keys and shutil.which("pgcopydb") is None:
        print("pgcopydb is not installed: its method is left out", file=sys.stderr)
        keys.remove("pgcopydb")
    if "sqlite_generic_transfer" in keys and importlib.util.find_spec("airflow") is not None:
        try:
            sqlite_provider = importlib.util.find_spec("airflow.providers.sqlite")
        except ModuleNotFoundError:
            sqlite_provider = None
        if sqlite_provider is None:
            print(
                "apache-airflow-providers-sqlite is not importable: sqlite_generic_transfer"
                " is left out",
                file=sys.stderr,
            )
            keys.remove("sqlite_generic_transfer")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-dbsrc-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = args.meters * args.days
    subset = min(args.subset, rows)
    started = time.time()
    source = build_source(args.conn, f"{args.name}_source", args.meters, args.days)
    sqlite_path = workdir / "readings.db"
    if any(BY_KEY[k].sqlite for k in keys):
        build_sqlite(source, sqlite_path, rows)
    maria = None
    if args.maria:
        maria = urlsplit(args.maria)._replace(path=f"/{args.name}_maria").geturl()
        if any(BY_KEY[k].maria for k in keys):
            build_maria(maria, args.meters, args.days)
    build_target(args.conn, args.name, args.meters)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    for tree in filter(None, [REPO, args.baseline]):
        compile_bytecode(tree)
    ctx = Context(
        args.conn,
        source,
        sqlite_path,
        workdir,
        rows,
        subset,
        args.name,
        env=env,
        baseline=args.baseline.resolve() if args.baseline else None,
        maria=maria,
    )
    expected = {
        False: checksum(source, "bench_a.readings"),
        True: checksum(source, "bench_a.readings", subset),
    }
    print(f"setup {time.time() - started:.0f} s; {rows:,} rows, subset {subset:,}", flush=True)
    load_before = loadavg()
    runs: list[Run] = []
    for rep in range(1, args.reps + 1):
        for key in keys:
            run = run_method(ctx, BY_KEY[key], rep, expected[BY_KEY[key].subset])
            runs.append(run)
            print(json.dumps(asdict(run)), flush=True)
    with psycopg.connect(args.conn) as conn:
        server = conn.execute("SELECT version()").fetchone()[0]  # type: ignore[index]
    med = medians(runs)
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": loadavg(),
        "server": server,
        "rows": rows,
        "subset": subset,
        "runs": [asdict(r) for r in runs],
        "medians": med,
        "targets": targets(med),
        "changes": changes(med),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    text = markdown(result)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
