"""Run DAGs under a real, throwaway Airflow (``airflow standalone``) and measure them.

``dag.test()`` and ``airflow dags test`` execute mapped task instances one after the
other, which hides exactly what this provider is about (parallel loads).  This module
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

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

log = logging.getLogger(__name__)

#: Terminal states of a DAG run.
DAG_RUN_FINISHED_STATES = frozenset({"success", "failed"})
#: Task-instance states whose log tail is attached to the result.
TASK_FAILED_STATES = frozenset({"failed", "upstream_failed"})

_SQLITE_PREFIX = "sqlite:///"
_POLL_INTERVAL = 0.5
_LOG_TAIL_LINES = 40


class AirflowRunnerError(RuntimeError):
    """Base class for errors raised by :class:`AirflowStandalone`."""


class AirflowStartupError(AirflowRunnerError):
    """The standalone Airflow did not come up (process died or readiness timed out)."""


class DagImportError(AirflowRunnerError):
    """The dag-processor recorded an import error for the file defining the DAG."""


class DagRunFailedError(AirflowRunnerError):
    """A DAG run finished in a state other than ``success``; carries the result."""

    def __init__(self, result: DagRunResult) -> None:
        super().__init__(
            f"DAG run {result.dag_id}/{result.run_id} ended in state {result.state!r}\n"
            f"{result.describe()}"
        )
        self.result = result


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class TaskRun:
    """One task instance of a DAG run (one element of a mapped task, or map_index -1)."""

    task_id: str
    map_index: int
    state: str
    start: datetime | None
    end: datetime | None
    pid: int | None
    try_number: int = 0
    log_tail: str | None = None

    @property
    def duration(self) -> float | None:
        """Seconds between start and end, or ``None`` if the task did not finish."""
        if self.start is None or self.end is None:
            return None
        return (self.end - self.start).total_seconds()

    @property
    def label(self) -> str:
        """``task_id`` or ``task_id[map_index]`` for mapped instances."""
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"


@dataclass(frozen=True)
class DagRunResult:
    """Outcome and timings of one DAG run triggered by :meth:`AirflowStandalone.run_dag`."""

    dag_id: str
    run_id: str
    state: str
    triggered_at: datetime
    queued_at: datetime | None
    start: datetime | None
    end: datetime | None
    tasks: list[TaskRun] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        """Whether the run finished in state ``success``."""
        return self.state == "success"

    @property
    def wall_seconds(self) -> float | None:
        """Seconds from the trigger request until the run ended (``None`` if it did not)."""
        if self.end is None:
            return None
        return (self.end - self.triggered_at).total_seconds()

    @property
    def scheduling_latency(self) -> float | None:
        """Seconds from the trigger request until the first task instance started."""
        starts = [t.start for t in self.tasks if t.start is not None]
        if not starts:
            return None
        return (min(starts) - self.triggered_at).total_seconds()

    @property
    def failed_tasks(self) -> list[TaskRun]:
        """Task instances in a failed state (``failed`` / ``upstream_failed``)."""
        return [t for t in self.tasks if t.state in TASK_FAILED_STATES]

    def task_runs(self, task_id: str) -> list[TaskRun]:
        """All instances of ``task_id`` ordered by map index."""
        return sorted((t for t in self.tasks if t.task_id == task_id), key=lambda t: t.map_index)

    def max_concurrency(self, task_id: str | None = None) -> int:
        """Largest number of task instances (optionally of one task) running at the same instant."""
        events: list[tuple[datetime, int]] = []
        for t in self.tasks:
            if (
                (task_id is None or t.task_id == task_id)
                and t.start is not None
                and t.end is not None
            ):
                events.append((t.start, 1))
                events.append((t.end, -1))
        # Ends sort before starts at the same instant: touching intervals do not overlap.
        events.sort(key=lambda e: (e[0], e[1]))
        best = current = 0
        for _, delta in events:
            current += delta
            best = max(best, current)
        return best

    def offset(self, moment: datetime | None) -> float | None:
        """Seconds between the trigger request and ``moment``."""
        return None if moment is None else (moment - self.triggered_at).total_seconds()

    def describe(self) -> str:
        """Multi-line text table of the task instances, times relative to the trigger."""

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:8.2f}"

        wall = self.wall_seconds
        latency = self.scheduling_latency
        lines = [
            f"DAG run {self.dag_id} / {self.run_id}: {self.state}"
            f" (wall {fmt(wall).strip()} s from trigger, first task after {fmt(latency).strip()} s,"
            f" max concurrency {self.max_concurrency()})",
        ]
        rows = [("task", "state", "start+s", "end+s", "dur s", "pid")]
        for t in sorted(
            self.tasks, key=lambda t: (t.start or datetime.max.replace(tzinfo=UTC), t.label)
        ):
            rows.append(
                (
                    t.label,
                    t.state,
                    fmt(self.offset(t.start)),
                    fmt(self.offset(t.end)),
                    fmt(t.duration),
                    "-" if t.pid is None else str(t.pid),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for i, row in enumerate(rows):
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
            lines.append("  " + "  ".join(cells).rstrip())
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        for t in self.tasks:
            if t.log_tail:
                lines.append(f"--- log tail of {t.label} ({t.state}) ---")
                lines.extend("  " + line for line in t.log_tail.splitlines())
        return "\n".join(lines)


# --------------------------------------------------------------------------- helpers


def _free_port() -> int:
    """Return a currently unused TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _parse_ts(value: Any) -> datetime | None:
    """Parse a timestamp stored by Airflow's ``UtcDateTime`` in SQLite (naive UTC text)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        dt = value
    else:
        dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of a text file ('' if missing)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            start = max(0, size - 256 * 1024)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return ""
    if start > 0:  # drop the partial first line
        data = data.partition(b"\n")[2]
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def _format_task_log(text: str) -> str:
    """Make Airflow 3 JSON-lines task logs readable (plain lines are passed through)."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if not isinstance(record, dict):
            out.append(line)
            continue
        parts = [
            str(record.get("timestamp", "")),
            str(record.get("level", "")).upper(),
            str(record.get("event", "")),
        ]
        msg = " ".join(p for p in parts if p)
        out.append(msg)
        out.extend(_format_error_detail(record.get("error_detail")))
    return "\n".join(out)


def _format_error_detail(detail: Any, max_frames: int = 6) -> list[str]:
    """Render the structured ``error_detail`` of an Airflow 3 log record like a traceback."""
    if not isinstance(detail, list):
        return [] if detail is None else [f"  {detail}"]
    lines = []
    for exc in detail:
        if not isinstance(exc, dict):
            lines.append(f"  {exc}")
            continue
        frames = exc.get("frames") or []
        if len(frames) > max_frames:
            lines.append(f"  ... {len(frames) - max_frames} frames omitted")
        for frame in frames[-max_frames:]:
            if isinstance(frame, dict):
                lines.append(
                    f'  File "{frame.get("filename")}", line {frame.get("lineno")},'
                    f" in {frame.get('name')}"
                )
        lines.append(f"  {exc.get('exc_type', 'Exception')}: {exc.get('exc_value', '')}")
    return lines


def _proc_read(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of ``pid`` from /proc, or ``None`` if it is gone."""
    raw = _proc_read(pid, "stat").decode("ascii", "replace")
    if not raw:
        return None
    # comm may contain spaces/parens: split after the last ')'
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None


def _describe_pid(pid: int) -> str:
    """Short command line of ``pid`` for log messages."""
    cmd = _proc_read(pid, "cmdline").replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return (cmd or "?")[:80]


def _all_pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def find_home_processes(
    home: Path, *, pgid: int | None = None, root_pid: int | None = None
) -> set[int]:
    """Live (non-zombie) processes belonging to an Airflow home.

    A process belongs if its environment has ``AIRFLOW_HOME=<home>``, its command line
    mentions ``home``, it is in process group ``pgid``, or it descends from ``root_pid``.
    The calling process is never included.
    """
    me = os.getpid()
    home_b = os.fsencode(str(home))
    env_marker = b"AIRFLOW_HOME=" + home_b
    stats: dict[int, tuple[str, int, int]] = {}
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st is not None:
            stats[pid] = st
    found: set[int] = set()
    for pid, (state, _ppid, group) in stats.items():
        if pid == me or state in ("Z", "X"):
            continue
        if pgid is not None and group == pgid:
            found.add(pid)
            continue
        if env_marker in _proc_read(pid, "environ").split(b"\0"):
            found.add(pid)
            continue
        if home_b in _proc_read(pid, "cmdline"):
            found.add(pid)
    if root_pid is not None:
        children: dict[int, list[int]] = {}
        for pid, (_state, ppid, _group) in stats.items():
            children.setdefault(ppid, []).append(pid)
        stack = [root_pid]
        while stack:
            for child in children.get(stack.pop(), []):
                if child != me and stats[child][0] not in ("Z", "X") and child not in found:
                    found.add(child)
                    stack.append(child)
        if root_pid in stats and stats[root_pid][0] not in ("Z", "X") and root_pid != me:
            found.add(root_pid)
    return found


# --------------------------------------------------------------------------- runner


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
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: TextIO | None = None
        self._token: str | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the api-server."""
        if self.port is None:
            raise AirflowRunnerError("AirflowStandalone is not started")
        return f"http://127.0.0.1:{self.port}"

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
        self.port = self._requested_port or _free_port()
        self.env = self._build_env()
        conn = self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        if not conn.startswith(_SQLITE_PREFIX):
            self._cleanup_home()
            raise AirflowRunnerError(f"only a SQLite metadata database is supported, got {conn!r}")
        self.db_path = Path(conn[len(_SQLITE_PREFIX) :].split("?", 1)[0])
        self.log_path = self._log_to or self.home / "standalone.log"
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = self.log_path.open("a", encoding="utf-8")
        except OSError:
            self._cleanup_home()
            raise

        log.info(
            "starting airflow standalone: home=%s port=%s dags=%s log=%s",
            self.home,
            self.port,
            self.dags_folder,
            self.log_path,
        )
        self.started_at = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "airflow", "standalone"],
                cwd=str(self.home),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=self._log_fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self._wait_ready()
        except BaseException:
            self._teardown()
            raise
        self.ready_seconds = time.monotonic() - self.started_at
        log.info(
            "airflow standalone ready after %.1f s (pid %s)", self.ready_seconds, self._proc.pid
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop every process of this Airflow home and remove a temporary home."""
        self._teardown()

    def _startup_failure(self, message: str) -> AirflowStartupError:
        tail = _tail(self.log_path) if self.log_path else ""
        return AirflowStartupError(f"{message}\n--- tail of {self.log_path} ---\n{tail}")

    def _wait_ready(self) -> None:
        """Poll the api-server health endpoint until scheduler and dag-processor are healthy."""
        assert self._proc is not None and self.started_at is not None
        deadline = self.started_at + self.startup_timeout
        last: Any = None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._startup_failure(
                    f"airflow standalone exited with code {code} during startup"
                )
            try:
                health = self._request("GET", "/api/v2/monitor/health", auth=False, timeout=5)
            except (OSError, ValueError, AirflowRunnerError) as err:  # not up yet
                last = err
            else:
                last = health
                if (
                    health.get("metadatabase", {}).get("status") == "healthy"
                    and health.get("scheduler", {}).get("status") == "healthy"
                    and health.get("dag_processor", {}).get("status") in ("healthy", None)
                ):
                    self._token = self._fetch_token()
                    return
            if time.monotonic() > deadline:
                raise self._startup_failure(
                    f"airflow standalone not ready after {self.startup_timeout:.0f} s"
                    f" (last health: {last!r})"
                )
            time.sleep(_POLL_INTERVAL)

    def _teardown(self) -> None:
        """SIGTERM the process group and all processes of this home, then SIGKILL leftovers."""
        proc, self._proc = self._proc, None
        home = self.home
        try:
            if proc is not None and home is not None:
                self._kill_all(proc, home)
        finally:
            if self._log_fh is not None:
                self._log_fh.close()
                self._log_fh = None
            self._token = None
            self._cleanup_home()

    def _kill_all(self, proc: subprocess.Popen[bytes], home: Path) -> None:
        """Stop all processes of ``home``: SIGTERM to all of them, then SIGKILL.

        SIGTERM goes to the standalone process group *and* to every process whose
        environment has this ``AIRFLOW_HOME`` (task supervisors call ``setpgid``, so
        they are outside the group).  Survivors get a second SIGTERM after 40 % of
        ``stop_timeout`` (the scheduler's LocalExecutor waits for its workers unless
        signalled again) and SIGKILL after ``stop_timeout`` (seen: dag-processor or
        triggerer ignoring SIGTERM).  A graceful SIGINT to the standalone parent was
        tried and is slower: its triggerer then takes > 5 s to stop.
        """
        pgid = proc.pid
        t0 = time.monotonic()

        def survivors() -> set[int]:
            proc.poll()  # reap our direct child so it does not linger as a zombie
            return find_home_processes(home, pgid=pgid, root_pid=proc.pid)

        def signal_all(sig: signal.Signals, pids: set[int]) -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

        def wait_gone(seconds: float) -> set[int]:
            deadline = time.monotonic() + seconds
            alive = survivors()
            while alive and time.monotonic() < deadline:
                time.sleep(0.2)
                alive = survivors()
            return alive

        alive = survivors()
        log.info("stopping airflow standalone (%d processes)", len(alive))
        signal_all(signal.SIGTERM, alive)
        alive = wait_gone(self.stop_timeout * 0.4)
        if alive:
            # "Shutting down LocalExecutor; waiting for running tasks to finish.
            # Signal again if you don't want to wait." -- so signal again.
            log.info(
                "second SIGTERM to %d airflow processes: %s",
                len(alive),
                "; ".join(f"{pid} {_describe_pid(pid)}" for pid in sorted(alive)),
            )
            signal_all(signal.SIGTERM, alive)
            alive = wait_gone(self.stop_timeout * 0.6)
        for _ in range(10):
            if not alive:
                break
            log.info(
                "SIGKILL to %d airflow processes that survived SIGTERM: %s",
                len(alive),
                "; ".join(f"{pid} {_describe_pid(pid)}" for pid in sorted(alive)),
            )
            signal_all(signal.SIGKILL, alive)
            time.sleep(0.2)
            alive = survivors()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if alive:
            log.warning("could not stop airflow processes %s", sorted(alive))
        log.info("airflow standalone stopped in %.1f s", time.monotonic() - t0)

    def _cleanup_home(self) -> None:
        if self.home is not None and not self._keep_home:
            shutil.rmtree(self.home, ignore_errors=True)

    # ------------------------------------------------------------------ REST API

    def _fetch_token(self) -> str:
        """JWT for the REST API: all-admins token, else login with the generated password."""
        try:
            data = self._request("GET", "/auth/token", auth=False)
        except AirflowRunnerError as err:
            # The caller turned simple_auth_manager_all_admins off: use the password
            # file that SimpleAuthManager generates in AIRFLOW_HOME.
            assert self.home is not None
            pw_file = Path(
                self.env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
                or self.home / "simple_auth_manager_passwords.json.generated"
            )
            try:
                username, password = next(iter(json.loads(pw_file.read_text()).items()))
            except (OSError, ValueError, StopIteration):
                raise err from None
            data = self._request(
                "POST", "/auth/token", {"username": username, "password": password}, auth=False
            )
        token = data.get("access_token") if isinstance(data, dict) else None
        if not token:
            raise AirflowRunnerError(f"no access_token from /auth/token: {data!r}")
        return str(token)

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: bool = True,
        timeout: float = 30,
        _retry_auth: bool = True,
    ) -> Any:
        """Call the api-server and return the decoded JSON response."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            if self._token is None:
                self._token = self._fetch_token()
            headers["Authorization"] = f"Bearer {self._token}"
        req = urllib.request.Request(
            self.base_url + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", "replace")
            if err.code == 401 and auth and _retry_auth:
                self._token = None
                return self._request(
                    method, path, body, auth=auth, timeout=timeout, _retry_auth=False
                )
            raise AirflowRunnerError(f"{method} {path} -> HTTP {err.code}: {detail}") from err
        return json.loads(raw) if raw else None

    # ------------------------------------------------------------------ metadata DB

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        if self.db_path is None:
            raise AirflowRunnerError("AirflowStandalone is not started")
        uri = "file:" + urllib.parse.quote(str(self.db_path)) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=10)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Run a read-only query, retrying briefly while the database is locked / not migrated."""
        for attempt in range(20):
            try:
                with self._db() as conn:
                    return list(conn.execute(sql, params).fetchall())
            except sqlite3.OperationalError as err:
                if attempt == 19:
                    raise
                log.debug("sqlite read failed (%s), retrying", err)
                time.sleep(0.25)
        raise AssertionError("unreachable")

    def import_errors(self) -> list[tuple[str, str]]:
        """``(filename, stacktrace)`` of all import errors recorded by the dag-processor."""
        rows = self._query("SELECT filename, stacktrace FROM import_error ORDER BY id")
        return [(str(r["filename"] or ""), str(r["stacktrace"] or "")) for r in rows]

    def _import_errors_for(self, dag_id: str) -> list[tuple[str, str]]:
        """Import errors of files that (textually) mention ``dag_id``, or that cannot be read."""
        relevant = []
        for filename, stacktrace in self.import_errors():
            path = Path(filename)
            if not path.is_absolute():
                path = self.dags_folder / path
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                relevant.append((filename, stacktrace))
                continue
            if dag_id in text:
                relevant.append((filename, stacktrace))
        return relevant

    def dag_is_parsed(self, dag_id: str) -> bool:
        """Whether the DAG is serialized and active (not stale) in the metadata DB."""
        rows = self._query(
            "SELECT d.is_stale FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id"
            " WHERE d.dag_id = ? LIMIT 1",
            (dag_id,),
        )
        return bool(rows) and not rows[0]["is_stale"]

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
            errors = self._import_errors_for(dag_id)
            if errors:
                text = "\n".join(f"--- {name} ---\n{trace}" for name, trace in errors)
                raise DagImportError(f"DAG {dag_id!r} failed to import:\n{text}")
            if self._proc is not None and self._proc.poll() is not None:
                raise AirflowRunnerError(
                    f"airflow standalone died while waiting for DAG {dag_id!r}"
                )
            if time.monotonic() > deadline:
                others = "\n".join(
                    f"--- {name} ---\n{trace}" for name, trace in self.import_errors()
                )
                raise TimeoutError(
                    f"DAG {dag_id!r} not parsed from {self.dags_folder} within {timeout:.0f} s"
                    + (f"; import errors:\n{others}" if others else "")
                )
            time.sleep(_POLL_INTERVAL)

    # ------------------------------------------------------------------ runs

    def trigger(
        self, dag_id: str, *, conf: Mapping[str, Any] | None = None
    ) -> tuple[str, datetime]:
        """Unpause and trigger ``dag_id`` via the REST API; return ``(run_id, triggered_at)``."""
        quoted = urllib.parse.quote(dag_id, safe="")
        self._request("PATCH", f"/api/v2/dags/{quoted}?update_mask=is_paused", {"is_paused": False})
        triggered_at = datetime.now(UTC)
        resp = self._request(
            "POST",
            f"/api/v2/dags/{quoted}/dagRuns",
            {"logical_date": None, "conf": dict(conf or {})},
        )
        run_id = str(resp["dag_run_id"])
        log.info("triggered %s run %s", dag_id, run_id)
        return run_id, triggered_at

    def _task_log_tail(
        self, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int
    ) -> str:
        """Tail of the newest task log under ``<home>/logs`` for one task instance."""
        assert self.home is not None
        base = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        if map_index >= 0:
            base = base / f"map_index={map_index}"
        candidates = [base / f"attempt={try_number}.log"] if try_number > 0 else []
        if not candidates or not candidates[0].exists():
            candidates = sorted(base.glob("attempt=*.log"), key=lambda p: p.stat().st_mtime)[-1:]
        if not candidates or not candidates[0].exists():
            return f"(no log file under {base})"
        text = _format_task_log(_tail(candidates[0], 400))
        return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])

    def snapshot(
        self, dag_id: str, run_id: str, triggered_at: datetime, *, with_logs: bool = False
    ) -> DagRunResult:
        """Current state of a DAG run and its task instances, read from the metadata DB."""
        runs = self._query(
            "SELECT state, queued_at, start_date, end_date FROM dag_run"
            " WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        )
        if not runs:
            raise AirflowRunnerError(f"DAG run {dag_id}/{run_id} not found in the metadata DB")
        run = runs[0]
        tis = self._query(
            "SELECT task_id, map_index, state, start_date, end_date, pid, try_number"
            " FROM task_instance"
            " WHERE dag_id = ? AND run_id = ? ORDER BY task_id, map_index",
            (dag_id, run_id),
        )
        tasks = []
        for ti in tis:
            state = str(ti["state"] or "none")
            tail = None
            if with_logs and state == "failed":
                tail = self._task_log_tail(
                    dag_id, run_id, ti["task_id"], int(ti["map_index"]), int(ti["try_number"] or 0)
                )
            tasks.append(
                TaskRun(
                    task_id=str(ti["task_id"]),
                    map_index=int(ti["map_index"]),
                    state=state,
                    start=_parse_ts(ti["start_date"]),
                    end=_parse_ts(ti["end_date"]),
                    pid=int(ti["pid"]) if ti["pid"] is not None else None,
                    try_number=int(ti["try_number"] or 0),
                    log_tail=tail,
                )
            )
        return DagRunResult(
            dag_id=dag_id,
            run_id=run_id,
            state=str(run["state"] or "none"),
            triggered_at=triggered_at,
            queued_at=_parse_ts(run["queued_at"]),
            start=_parse_ts(run["start_date"]),
            end=_parse_ts(run["end_date"]),
            tasks=tasks,
        )

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
        deadline = time.monotonic() + timeout
        last_state = None
        while True:
            rows = self._query(
                "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
            )
            state = rows[0]["state"] if rows else None
            if state != last_state:
                log.info("run %s of %s: %s", run_id, dag_id, state)
                last_state = state
            if state in DAG_RUN_FINISHED_STATES:
                break
            if self._proc.poll() is not None:
                raise AirflowRunnerError(f"airflow standalone died during run {dag_id}/{run_id}")
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
        if raise_on_failure and not result.succeeded:
            raise DagRunFailedError(result)
        return result
