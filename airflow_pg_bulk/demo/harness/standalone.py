"""Run DAGs under a real, throwaway Airflow (``airflow standalone``) and measure them.

``dag.test()`` and ``airflow dags test`` execute mapped task instances one after the
other, which hides exactly what this provider is about (parallel loads).  This class
starts a complete Airflow 3 installation -- scheduler, api-server, dag-processor and
triggerer with the LocalExecutor and a SQLite metadata database -- in a temporary
``AIRFLOW_HOME``, triggers a DAG through the REST API, polls the metadata database
directly (much faster than the ``airflow`` CLI, which costs seconds per call) and
returns per-task-instance timings.  Everything is torn down afterwards, including the
processes that do not die on ``SIGTERM`` or live outside the standalone process group
(task supervisors call ``setpgid``).

Example::

    with AirflowStandalone(Path("dags")) as af:
        result = af.run_dag("my_dag", conf={"rows": 1000})
        print(result.describe())
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from airflow_pg_bulk.demo.harness.api import RestClient
from airflow_pg_bulk.demo.harness.logs import tail
from airflow_pg_bulk.demo.harness.metadata import MetadataDb
from airflow_pg_bulk.demo.harness.processes import free_port, stop_home_processes
from airflow_pg_bulk.demo.harness.results import (
    DAG_RUN_FINISHED_STATES,
    AirflowRunnerError,
    AirflowStartupError,
    DagImportError,
    DagRunFailedError,
    DagRunResult,
)

log = logging.getLogger(__name__)

_SQLITE_PREFIX = "sqlite:///"
_POLL_INTERVAL = 0.5


def parallelism_for(partitions: int) -> int:
    """``[core] parallelism`` for one load of ``partitions`` COPY tasks: every COPY task at
    once, plus two slots for executor workers still finishing an earlier task.

    Airflow 3.3's supervisor keeps its LocalExecutor worker, and the executor the task's slot,
    for up to ``[workers] min_heartbeat_interval`` (5 s) after the task ended, when the task
    process closes its sockets before it can be reaped (it then waits in ``select`` on no
    socket); prepare's worker often is. With exactly ``partitions`` slots the last COPY task
    waited for that slot, or for another COPY task's (0.4-1.5 s measured). Airflow's own
    default is 32."""
    return max(8, partitions + 2)


class AirflowStandalone:
    """Context manager: a throwaway Airflow in a temporary ``AIRFLOW_HOME``.

    ``airflow standalone`` runs scheduler + api-server + dag-processor + triggerer with
    the LocalExecutor and a SQLite metadata database, so mapped tasks really run in
    parallel (up to ``parallelism`` task processes).  The API listens on 127.0.0.1 only
    and runs with ``simple_auth_manager_all_admins`` (no passwords), so keep it local.

    Inherited ``AIRFLOW_HOME``, ``AIRFLOW_CONFIG`` and ``AIRFLOW__*`` variables of the
    calling process are dropped (they could point at a real installation); other
    variables (``PATH``, ``PYTHONPATH``, ``AIRFLOW_CONN_*`` ...) are inherited.  ``env``
    is applied last and may override anything, e.g. connections for the DAGs.
    """

    def __init__(
        self,
        dags_folder: Path,
        *,
        env: Mapping[str, str] | None = None,
        home: Path | None = None,
        port: int | None = None,
        parallelism: int = 8,
        startup_timeout: float = 180.0,
        log_to: Path | None = None,
        stop_timeout: float = 10.0,
    ) -> None:
        """Configure (but do not start) the instance.

        :param dags_folder: folder with the DAG files (becomes ``[core] dags_folder``).
        :param env: extra environment for all Airflow processes (applied last).
        :param home: ``AIRFLOW_HOME`` to use and keep; default is a temporary directory
            that is removed on exit.
        :param port: api-server port on 127.0.0.1; default is a free port.
        :param parallelism: ``[core] parallelism`` = max concurrently running tasks.
        :param startup_timeout: seconds to wait for the api-server and scheduler.
        :param log_to: file for the combined standalone output (default ``<home>/standalone.log``).
        :param stop_timeout: seconds to wait after SIGTERM before SIGKILL on exit.
        """
        self.dags_folder = Path(dags_folder).resolve()
        if not self.dags_folder.is_dir():
            raise FileNotFoundError(f"DAGs folder {self.dags_folder} does not exist")
        self.extra_env = dict(env or {})
        self._keep_home = home is not None
        self._requested_home = Path(home).resolve() if home is not None else None
        self._requested_port = port
        self.parallelism = parallelism
        self.startup_timeout = startup_timeout
        self._log_to = Path(log_to).resolve() if log_to is not None else None
        self.stop_timeout = stop_timeout

        self.home: Path | None = None
        self.port: int | None = None
        self.log_path: Path | None = None
        self.db_path: Path | None = None
        self.env: dict[str, str] = {}
        self.started_at: float | None = None
        self.ready_seconds: float | None = None
        self.execution_api_warmup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: TextIO | None = None
        self._api: RestClient | None = None
        self._metadata: MetadataDb | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the api-server."""
        if self.port is None:
            raise AirflowRunnerError("AirflowStandalone is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def services_log(self) -> str:
        """Where the Airflow services log (for messages)."""
        return str(self.log_path)

    @property
    def pid(self) -> int | None:
        """Pid (and process-group id) of the ``airflow standalone`` process."""
        return self._proc.pid if self._proc is not None else None

    def _build_env(self) -> dict[str, str]:
        assert self.home is not None and self.port is not None
        base = {
            k: v
            for k, v in os.environ.items()
            if not (k.startswith("AIRFLOW__") or k in ("AIRFLOW_HOME", "AIRFLOW_CONFIG"))
        }
        bin_dir = os.path.dirname(sys.executable)  # not resolved: keep the venv's bin/
        base["PATH"] = bin_dir + os.pathsep + base.get("PATH", os.defpath)
        base.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _SQLITE_PREFIX
                + str(self.home / "airflow.db"),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            }
        )
        base.update(self.extra_env)
        return base

    def __enter__(self) -> AirflowStandalone:
        """Start ``airflow standalone``; wait for api-server, scheduler and dag-processor."""
        if self._proc is not None:
            raise AirflowRunnerError("AirflowStandalone is already running")
        if self._requested_home is not None:
            self.home = self._requested_home
            self.home.mkdir(parents=True, exist_ok=True)
        else:
            self.home = Path(tempfile.mkdtemp(prefix="airflow-pg-bulk-"))
        self.port = self._requested_port or free_port()
        self.env = self._build_env()
        try:
            self._metadata = MetadataDb(self._metadata_source(), self.home, self.dags_folder)
        except BaseException:
            self._cleanup_home()
            raise
        self._api = RestClient(self.base_url, self.home, self.env)
        self.log_path = self._log_to or self.home / "standalone.log"
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = self.log_path.open("a", encoding="utf-8")
        except OSError:
            self._cleanup_home()
            raise

        log.info(
            "starting airflow: home=%s port=%s dags=%s log=%s",
            self.home,
            self.port,
            self.dags_folder,
            self.log_path,
        )
        self.started_at = time.monotonic()
        try:
            self._start()
            self._wait_ready()
        except BaseException:
            self._teardown()
            raise
        self.ready_seconds = time.monotonic() - self.started_at
        log.info("airflow ready after %.1f s (pid %s)", self.ready_seconds, self.pid)
        return self

    def _metadata_source(self) -> Path | str:
        """What :class:`MetadataDb` reads: here the SQLite file ``airflow standalone`` uses."""
        conn = self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        if not conn.startswith(_SQLITE_PREFIX):
            raise AirflowRunnerError(f"only a SQLite metadata database is supported, got {conn!r}")
        self.db_path = Path(conn[len(_SQLITE_PREFIX) :].split("?", 1)[0])
        return self.db_path

    def _start(self) -> None:
        """Start the Airflow processes (here ``airflow standalone``, a process group leader)."""
        assert self.home is not None
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", "standalone"],
            cwd=str(self.home),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _exited(self) -> str | None:
        """Why Airflow is no longer running (a process exited), or ``None`` while it runs."""
        code = self._proc.poll() if self._proc is not None else None
        return None if code is None else f"airflow standalone exited with code {code}"

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop every process of this Airflow home and remove a temporary home."""
        self._teardown()

    def _startup_failure(self, message: str) -> AirflowStartupError:
        text = tail(self.log_path) if self.log_path else ""
        return AirflowStartupError(f"{message}\n--- tail of {self.log_path} ---\n{text}")

    def _wait_ready(self) -> None:
        """Poll the api-server health endpoint until scheduler and dag-processor are healthy."""
        assert self._proc is not None and self.started_at is not None
        deadline = self.started_at + self.startup_timeout
        last: Any = None
        while True:
            exited = self._exited()
            if exited is not None:
                raise self._startup_failure(f"{exited} during startup")
            try:
                health = self.api.request("GET", "/api/v2/monitor/health", auth=False, timeout=5)
            except (OSError, ValueError, AirflowRunnerError) as err:  # not up yet
                last = err
            else:
                last = health
                if (
                    health.get("metadatabase", {}).get("status") == "healthy"
                    and health.get("scheduler", {}).get("status") == "healthy"
                    and health.get("dag_processor", {}).get("status") in ("healthy", None)
                ):
                    self.api.token = self.api.fetch_token()
                    self._warm_execution_api()
                    return
            if time.monotonic() > deadline:
                raise self._startup_failure(
                    f"airflow not ready after {self.startup_timeout:.0f} s (last health: {last!r})"
                )
            time.sleep(_POLL_INTERVAL)

    def _warm_execution_api(self) -> None:
        """Send the Task Execution API its first request now, as a long-running api-server
        has had it long ago.

        Airflow 3.3's execution API is a Cadwyn app that builds its versioned routes on its
        first request (2.2-2.6 s on the quiet 2-core benchmark machine, up to 5 s loaded):
        left to the first task, it lands on the first DAG run's critical path (its first
        task's start-up) and on nothing after it. Its seconds are kept in
        ``execution_api_warmup_seconds``.
        """
        started = time.monotonic()
        self.api.request("GET", "/execution/health", auth=False, timeout=60)
        self.execution_api_warmup_seconds = time.monotonic() - started
        log.info("execution API warmed up in %.2f s", self.execution_api_warmup_seconds)

    def _teardown(self) -> None:
        """SIGTERM the process group and all processes of this home, then SIGKILL leftovers."""
        proc, self._proc = self._proc, None
        home = self.home
        try:
            if proc is not None and home is not None:
                stop_home_processes(proc, home, self.stop_timeout)
        finally:
            if self._log_fh is not None:
                self._log_fh.close()
                self._log_fh = None
            if self._api is not None:
                self._api.token = None
            self._cleanup_home()

    def _cleanup_home(self) -> None:
        if self.home is not None and not self._keep_home:
            shutil.rmtree(self.home, ignore_errors=True)

    @property
    def api(self) -> RestClient:
        """The api-server's REST client (a bearer token fetched on demand)."""
        if self._api is None:
            raise AirflowRunnerError("AirflowStandalone is not started")
        return self._api

    @property
    def metadata(self) -> MetadataDb:
        """Read-only queries on the metadata database."""
        if self._metadata is None:
            raise AirflowRunnerError("AirflowStandalone is not started")
        return self._metadata

    # ------------------------------------------------------------------ DAGs and runs

    def import_errors(self) -> list[tuple[str, str]]:
        """``(filename, stacktrace)`` of all import errors recorded by the dag-processor."""
        return self.metadata.import_errors()

    def dag_is_parsed(self, dag_id: str) -> bool:
        """Whether the DAG is serialized and active (not stale) in the metadata DB."""
        return self.metadata.dag_is_parsed(dag_id)

    def snapshot(
        self, dag_id: str, run_id: str, triggered_at: datetime, *, with_logs: bool = False
    ) -> DagRunResult:
        """Current state of a DAG run and its task instances, read from the metadata DB."""
        return self.metadata.snapshot(dag_id, run_id, triggered_at, with_logs=with_logs)

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Block until the dag-processor has parsed ``dag_id``.

        :raises DagImportError: the file defining the DAG has an import error.
        :raises TimeoutError: not parsed within ``timeout`` seconds (message lists all
            recorded import errors).
        """
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            if self.dag_is_parsed(dag_id):
                log.info("DAG %s is parsed (waited %.1f s)", dag_id, time.monotonic() - t0)
                return
            errors = self.metadata.import_errors_for(dag_id)
            if errors:
                text = "\n".join(f"--- {name} ---\n{trace}" for name, trace in errors)
                raise DagImportError(f"DAG {dag_id!r} failed to import:\n{text}")
            exited = self._exited()
            if exited is not None:
                raise AirflowRunnerError(f"{exited} while waiting for DAG {dag_id!r}")
            if time.monotonic() > deadline:
                others = "\n".join(
                    f"--- {name} ---\n{trace}" for name, trace in self.import_errors()
                )
                raise TimeoutError(
                    f"DAG {dag_id!r} not parsed from {self.dags_folder} within {timeout:.0f} s"
                    + (f"; import errors:\n{others}" if others else "")
                )
            time.sleep(_POLL_INTERVAL)

    def set_pool(self, name: str, slots: int) -> None:
        """Create the pool ``name`` with ``slots`` slots, or set its slots."""
        body = {"name": name, "slots": slots, "include_deferred": False}
        try:
            self.api.request("POST", "/api/v2/pools", body)
        except AirflowRunnerError as err:
            if "HTTP 409" not in str(err):
                raise
            quoted = urllib.parse.quote(name, safe="")
            self.api.request("PATCH", f"/api/v2/pools/{quoted}?update_mask=slots", body)

    def trigger(
        self, dag_id: str, *, conf: Mapping[str, Any] | None = None
    ) -> tuple[str, datetime]:
        """Unpause and trigger ``dag_id`` via the REST API; return ``(run_id, triggered_at)``."""
        quoted = urllib.parse.quote(dag_id, safe="")
        self.api.request(
            "PATCH", f"/api/v2/dags/{quoted}?update_mask=is_paused", {"is_paused": False}
        )
        triggered_at = datetime.now(UTC)
        resp = self.api.request(
            "POST",
            f"/api/v2/dags/{quoted}/dagRuns",
            {"logical_date": None, "conf": dict(conf or {})},
        )
        run_id = str(resp["dag_run_id"])
        log.info("triggered %s run %s", dag_id, run_id)
        return run_id, triggered_at

    def run_dag(
        self,
        dag_id: str,
        *,
        conf: Mapping[str, Any] | None = None,
        timeout: float = 1800,
        raise_on_failure: bool = False,
    ) -> DagRunResult:
        """Unpause, trigger and wait for one run of ``dag_id``.

        Waits for the DAG to be parsed first.  Returns the result whatever the final
        state; failed task instances carry the tail of their log in ``log_tail`` (also
        shown by :meth:`DagRunResult.describe`).

        :param conf: run configuration (``dag_run.conf`` / ``params``).
        :param timeout: seconds to wait for the run to finish.
        :param raise_on_failure: raise :class:`DagRunFailedError` unless the run succeeded.
        :raises TimeoutError: the run did not finish in time (message has the task table).
        """
        if self._proc is None:
            raise AirflowRunnerError(
                "AirflowStandalone is not started (use it as a context manager)"
            )
        self.wait_for_dag(dag_id, timeout=min(timeout, 300))
        run_id, triggered_at = self.trigger(dag_id, conf=conf)
        result = self.wait_for_run(dag_id, run_id, triggered_at, timeout=timeout)
        if raise_on_failure and not result.succeeded:
            raise DagRunFailedError(result)
        return result

    def wait_for_run(
        self, dag_id: str, run_id: str, triggered_at: datetime, *, timeout: float = 1800
    ) -> DagRunResult:
        """Wait for a triggered run to finish (runs of several DAGs may go on at once) and
        return its result, as :meth:`run_dag` does."""
        deadline = time.monotonic() + timeout
        last_state = None
        while True:
            rows = self.metadata.query(
                "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
            )
            state = rows[0]["state"] if rows else None
            if state != last_state:
                log.info("run %s of %s: %s", run_id, dag_id, state)
                last_state = state
            if state in DAG_RUN_FINISHED_STATES:
                break
            exited = self._exited()
            if exited is not None:
                raise AirflowRunnerError(f"{exited} during run {dag_id}/{run_id}")
            if time.monotonic() > deadline:
                snap = self.snapshot(dag_id, run_id, triggered_at)
                raise TimeoutError(
                    f"DAG run not finished within {timeout:.0f} s\n{snap.describe()}"
                )
            time.sleep(_POLL_INTERVAL)
        result = self.snapshot(dag_id, run_id, triggered_at, with_logs=state != "success")
        log.info(
            "run %s of %s finished: %s in %.1f s",
            run_id,
            dag_id,
            result.state,
            result.wall_seconds or float("nan"),
        )
        return result
