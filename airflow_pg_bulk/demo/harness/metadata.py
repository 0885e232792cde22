"""Read-only queries on the harness's metadata database, SQLite or PostgreSQL (much faster
than the CLI)."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_pg_bulk.demo.harness.logs import task_log_tail
from airflow_pg_bulk.demo.harness.results import AirflowRunnerError, DagRunResult, TaskRun

log = logging.getLogger(__name__)


def parse_ts(value: Any) -> datetime | None:
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


class MetadataDb:
    """Queries on the metadata database, opened read-only for each query: the SQLite file
    ``db`` (a path), or the PostgreSQL database at ``db`` (a libpq URI or connection string,
    see :func:`libpq_dsn`). Queries are written with ``?`` placeholders for both.

    :param home: the ``AIRFLOW_HOME``, for task logs; :param dags_folder: for import errors.
    """

    def __init__(self, db: Path | str, home: Path, dags_folder: Path) -> None:
        self.db_path = db if isinstance(db, Path) else None
        self.dsn = db if isinstance(db, str) else None
        self.home = home
        self.dags_folder = dags_folder

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Run a read-only query; rows are read by column name (``row["state"]``). SQLite is
        retried briefly while the database is locked or not migrated."""
        if self.dsn is not None:
            return self._pg_query(sql, params)
        for attempt in range(20):
            try:
                with self._sqlite() as conn:
                    return list(conn.execute(sql, params).fetchall())
            except sqlite3.OperationalError as err:
                if attempt == 19:
                    raise
                log.debug("sqlite read failed (%s), retrying", err)
                time.sleep(0.25)
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _sqlite(self) -> Iterator[sqlite3.Connection]:
        uri = "file:" + urllib.parse.quote(str(self.db_path)) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=10)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    def _pg_query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        import psycopg
        from psycopg.rows import dict_row

        assert self.dsn is not None
        # the harness's own queries: ``?`` is never inside a literal in them
        text = sql.replace("%", "%%").replace("?", "%s")
        with psycopg.connect(
            self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=10
        ) as conn:
            return list(conn.execute(text, params).fetchall())

    def import_errors(self) -> list[tuple[str, str]]:
        """``(filename, stacktrace)`` of all import errors recorded by the dag-processor."""
        rows = self.query("SELECT filename, stacktrace FROM import_error ORDER BY id")
        return [(str(r["filename"] or ""), str(r["stacktrace"] or "")) for r in rows]

    def import_errors_for(self, dag_id: str) -> list[tuple[str, str]]:
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
        rows = self.query(
            "SELECT d.is_stale FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id"
            " WHERE d.dag_id = ? LIMIT 1",
            (dag_id,),
        )
        return bool(rows) and not rows[0]["is_stale"]

    def snapshot(
        self, dag_id: str, run_id: str, triggered_at: datetime, *, with_logs: bool = False
    ) -> DagRunResult:
        """Current state of a DAG run and its task instances, read from the metadata DB."""
        runs = self.query(
            "SELECT state, queued_at, start_date, end_date FROM dag_run"
            " WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        )
        if not runs:
            raise AirflowRunnerError(f"DAG run {dag_id}/{run_id} not found in the metadata DB")
        run = runs[0]
        tis = self.query(
            "SELECT task_id, map_index, state, start_date, end_date, pid, try_number,"
            " hostname, queue"
            " FROM task_instance"
            " WHERE dag_id = ? AND run_id = ? ORDER BY task_id, map_index",
            (dag_id, run_id),
        )
        tasks = []
        for ti in tis:
            state = str(ti["state"] or "none")
            tail = None
            if with_logs and state == "failed":
                tail = task_log_tail(
                    self.home,
                    dag_id,
                    run_id,
                    ti["task_id"],
                    int(ti["map_index"]),
                    int(ti["try_number"] or 0),
                )
            tasks.append(
                TaskRun(
                    task_id=str(ti["task_id"]),
                    map_index=int(ti["map_index"]),
                    state=state,
                    start=parse_ts(ti["start_date"]),
                    end=parse_ts(ti["end_date"]),
                    pid=int(ti["pid"]) if ti["pid"] is not None else None,
                    try_number=int(ti["try_number"] or 0),
                    log_tail=tail,
                    hostname=ti["hostname"] or None,
                    queue=ti["queue"] or None,
                )
            )
        return DagRunResult(
            dag_id=dag_id,
            run_id=run_id,
            state=str(run["state"] or "none"),
            triggered_at=triggered_at,
            queued_at=parse_ts(run["queued_at"]),
            start=parse_ts(run["start_date"]),
            end=parse_ts(run["end_date"]),
            tasks=tasks,
        )
