"""Run DAGs on CeleryExecutor: :class:`AirflowCelery`, the harness's Airflow with the
scheduler, api-server and dag-processor started one by one (``airflow standalone`` forces the
LocalExecutor) and Celery workers in processes of their own, each with its own name.

Every process gets the same configuration, as on a real cluster: the executor, the metadata
database (PostgreSQL: Celery cannot share SQLite between machines, and Airflow refuses it), the
broker, Celery's result backend (the metadata database), the execution API's URL and one JWT
secret. Each worker runs its tasks under its own name: its Celery node name ``<name>@<host>``,
which its tasks also record as their ``hostname`` (:mod:`.hostname`).

Example::

    with AirflowCelery(Path("dags"), metadata_dsn=dsn, broker_url="redis://127.0.0.1:6379/0",
                       workers=[CeleryWorker("w1"), CeleryWorker("w2")]) as af:
        result = af.run_dag("my_dag")
        print(result.hostnames("my_group.copy"))
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_pg_bulk.demo.harness.hostname import WORKER_NAME_VARIABLE
from airflow_pg_bulk.demo.harness.logs import tail
from airflow_pg_bulk.demo.harness.results import AirflowStartupError
from airflow_pg_bulk.demo.harness.standalone import AirflowStandalone

_SERVICES = ("scheduler", "dag-processor", "api-server")


@dataclass(frozen=True)
class CeleryWorker:
    """One ``airflow celery worker``: its name (node ``<name>@<host>``), the queues it
    listens on and how many tasks it runs at once."""

    name: str
    queues: tuple[str, ...] = ("default",)
    concurrency: int = 2


def sqlalchemy_url(dsn: str, driver: str = "postgresql+psycopg2") -> str:
    """A libpq URI or connection string as a SQLAlchemy URL (host, port and the rest as query
    parameters, which psycopg2 passes to libpq: a Unix socket directory works too)."""
    from sqlalchemy.engine import URL

    params = conninfo_to_dict(dsn)
    query = {k: str(v) for k, v in params.items() if k not in ("user", "password", "dbname")}
    url = URL.create(
        driver,
        username=params.get("user"),
        password=params.get("password"),
        database=params.get("dbname"),
        query=query,
    )
    return url.render_as_string(hide_password=False)


@contextlib.contextmanager
def scratch_database(dsn: str, name: str) -> Iterator[str]:
    """Create the database ``name`` (dropped first if it exists) on the server at ``dsn``,
    yield its DSN, drop it after (``WITH (FORCE)``: Airflow's processes may linger)."""
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(drop)


class AirflowCelery(AirflowStandalone):
    """Context manager: a throwaway Airflow on CeleryExecutor in a temporary ``AIRFLOW_HOME``.

    :param metadata_dsn: an empty PostgreSQL database for Airflow's metadata (libpq URI or
        connection string); it is migrated on start and left to the caller after.
    :param broker_url: Celery's broker, e.g. ``redis://127.0.0.1:6379/0``.
    :param workers: the Celery workers to start (distinct names).
    The other parameters are :class:`AirflowStandalone`'s; each process logs to
    ``<home>/services/<name>.log``.
    """

    def __init__(
        self,
        dags_folder: Path,
        *,
        metadata_dsn: str,
        broker_url: str,
        workers: Sequence[CeleryWorker] = (CeleryWorker("w1"), CeleryWorker("w2")),
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dags_folder, env=env, **kwargs)
        names = [w.name for w in workers]
        if len(set(names)) != len(names):
            raise ValueError(f"Celery workers need distinct names, got {names}")
        self.metadata_dsn = metadata_dsn
        self.broker_url = broker_url
        self.workers = tuple(workers)
        self._services: dict[str, subprocess.Popen[bytes]] = {}
        self._service_logs: list[TextIO] = []

    @property
    def services_log(self) -> str:
        """Where the services log: ``airflow db migrate`` and one file per process."""
        assert self.home is not None
        return f"{self.log_path}, {self.home / 'services'}/*.log"

    def _build_env(self) -> dict[str, str]:
        env = super()._build_env()
        url = sqlalchemy_url(self.metadata_dsn)
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
                "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + url,
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": (
                    "airflow_pg_bulk.demo.harness.hostname.worker_hostname"
                ),
            }
        )
        env.update(self.extra_env)
        return env

    def _metadata_source(self) -> Path | str:
        return self.metadata_dsn

    def _spawn(self, name: str, args: list[str], env: Mapping[str, str]) -> None:
        assert self.home is not None
        folder = self.home / "services"
        folder.mkdir(parents=True, exist_ok=True)
        out = (folder / f"{name}.log").open("a", encoding="utf-8")
        self._service_logs.append(out)
        leader = self._proc.pid if self._proc is not None else None
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", *args],
            cwd=str(self.home),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # one process group for all (the first one's), so that teardown signals them together
            # and a Ctrl-C in the terminal reaches only the harness, which stops them in order
            process_group=leader or 0,
        )
        if self._proc is None:
            self._proc = proc
        self._services[name] = proc

    def _start(self) -> None:
        assert self.home is not None and self._log_fh is not None
        migrate = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            cwd=str(self.home),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            timeout=self.startup_timeout,
            check=False,
        )
        if migrate.returncode != 0:
            raise self._startup_failure(f"airflow db migrate exited with {migrate.returncode}")
        for service in _SERVICES:
            self._spawn(service, [service], self.env)
        for worker in self.workers:
            env = {**self.env, WORKER_NAME_VARIABLE: worker.name}
            args = ["celery", "worker", "--celery-hostname", f"{worker.name}@%h"]
            args += ["--queues", ",".join(worker.queues)]
            args += ["--concurrency", str(worker.concurrency), "--skip-serve-logs"]
            self._spawn(f"worker-{worker.name}", args, env)

    def _exited(self) -> str | None:
        for name, proc in self._services.items():
            code = proc.poll()
            if code is not None:
                return f"airflow {name} exited with code {code}"
        return None

    def _startup_failure(self, message: str) -> AirflowStartupError:
        parts = [message]
        logs = [self.log_path] if self.log_path else []
        if self.home is not None:
            logs += sorted((self.home / "services").glob("*.log"))
        for path in logs:
            if path is not None and path.exists():
                parts.append(f"--- tail of {path} ---\n{tail(path)}")
        return AirflowStartupError("\n".join(parts))

    def _teardown(self) -> None:
        try:
            super()._teardown()
        finally:
            for proc in self._services.values():
                proc.poll()
            self._services = {}
            for out in self._service_logs:
                out.close()
            self._service_logs = []

    def worker_hostnames(self) -> dict[str, str]:
        """The host name each worker's tasks record, by worker name."""
        import socket

        return {w.name: f"{w.name}@{socket.gethostname()}" for w in self.workers}
