"""A MariaDB (or MySQL) server for the database-source tests, reached through SQLAlchemy with
PyMySQL (``mysql+pymysql://``).

Which server, first found:

1. ``PG_BULK_TEST_MYSQL_URL`` (a SQLAlchemy URL of a server where the tests may create and
   drop databases; ``start``: skip 2., to exercise 3.);
2. a server answering on 127.0.0.1:3306 as ``root`` with no password (a developer's machine,
   a CI service container);
3. a throwaway ``mariadbd`` of Debian's ``mariadb-server`` package (``/usr/sbin/mariadbd``),
   its data directory made by ``mariadb-install-db`` in a temporary directory, listening on
   a free loopback port, stopped and deleted at the end of the session (``.ci/run`` installs
   the package when missing).

Else the tests that need it are skipped with the reason (failed under ``CI=true``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servers import skip_or_fail

from airflow_pg_bulk.demo.harness.processes import free_port

URL_ENV = "PG_BULK_TEST_MYSQL_URL"
DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
MARIADBD = Path("/usr/sbin/mariadbd")


def _answers(url: str) -> bool:
    """A MariaDB/MySQL server accepts ``url``'s login."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return True
    except Exception:
        return False
    finally:
        engine.dispose()


@contextmanager
def _throwaway() -> Iterator[str]:
    """A ``mariadbd`` of its own on a loopback port; yields its server URL (no database)."""
    work = Path(tempfile.mkdtemp(prefix="pgbulk-mariadb-"))
    user = ["--user=mysql"] if os.getuid() == 0 else []
    if os.getuid() == 0:
        shutil.chown(work, "mysql", "mysql")
    data = work / "data"
    install = subprocess.run(
        ["mariadb-install-db", f"--datadir={data}", "--auth-root-authentication-method=normal",
         "--skip-test-db", *user],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    if install.returncode:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"mariadb-install-db failed: {install.stderr[-2000:]}")
    port = free_port()
    log_file = (work / "server.log").open("wb")
    server = subprocess.Popen(
        [str(MARIADBD), "--no-defaults", f"--datadir={data}", "--bind-address=127.0.0.1",
         f"--port={port}", f"--socket={work / 'mysqld.sock'}", f"--pid-file={work / 'pid'}",
         "--innodb-buffer-pool-size=64M", *user],
        stdout=subprocess.DEVNULL, stderr=log_file,
    )  # fmt: skip
    url = f"mysql+pymysql://root@127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while not _answers(url):
            if server.poll() is not None or time.monotonic() > deadline:
                log = (work / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"mariadbd did not start: {log}")
            time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log_file.close()
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def mariadb_server() -> Iterator[str]:
    """A server URL (``mysql+pymysql://user@host:port/``, no database) as the module says;
    skips (fails under CI) when there is none."""
    given = os.environ.get(URL_ENV, "")
    if given and given != "start":
        yield given
        return
    if not given and _answers(DEFAULT_URL):
        yield DEFAULT_URL
        return
    if not MARIADBD.exists():
        skip_or_fail(
            f"no MariaDB/MySQL server: {URL_ENV} not set, nothing answers on 127.0.0.1:3306 "
            f"and no {MARIADBD} to start one (apt-get install mariadb-server)"
        )
    with _throwaway() as url:
        yield url


@contextmanager
def database_on(server_url: str) -> Iterator[str]:
    """A database of its own on the server, dropped at the end; yields its URL."""
    import sqlalchemy

    name = f"pgbulk_{uuid.uuid4().hex[:10]}"
    engine = sqlalchemy.create_engine(server_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        url = sqlalchemy.engine.make_url(server_url).set(database=name)
        yield url.render_as_string(hide_password=False) + "?charset=utf8mb4"
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        engine.dispose()
