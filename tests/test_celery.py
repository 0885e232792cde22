"""The load on CeleryExecutor (issues 11 and 12): a real scheduler, api-server and
dag-processor, Celery workers in processes of their own, a throwaway broker, Airflow's metadata
in a PostgreSQL database of its own.

- two workers on ``default``: the rows are the source's; the COPY tasks ran on the workers (both
  of them), and a pool of 2 slots keeps at most 2 COPY sessions in ``pg_stat_activity`` at once;
- ``pg_bulk_load(..., queue="bulkq")``: a worker listening only on ``bulkq`` runs every task of
  the load (prepare, the copies, finalize, cleanup).

One Airflow, the two loads at once: Airflow's start-up is most of the test's time (CI's budget)."""

from __future__ import annotations

import csv
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import Database
from psycopg import sql
from servers import require

from airflow_pg_bulk.demo.connection import airflow_connection_json
from airflow_pg_bulk.demo.harness.broker import throwaway_broker
from airflow_pg_bulk.demo.harness.celery import AirflowCelery, CeleryWorker, scratch_database

require("airflow.providers.celery", "needs the test extra (celery provider)")
require("celery", "needs the test extra (celery[redis])")
require("redis", "needs the test extra (celery[redis])")

DAGS = Path(__file__).parent / "celery_dags"
CONN_ID = "pg_bulk_test"
POOL = "pgbulk_copies"
FILES, ROWS = 4, 20_000  # rows per file
TASKS = ("load.prepare", "load.copy", "load.finalize", "load.cleanup")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def celery(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowCelery]:
    """Airflow on CeleryExecutor: workers w1 and w2 on ``default``, ``bulk`` on ``bulkq``."""
    work = tmp_path_factory.mktemp("celery")
    metadata = f"pgbulk_airflow_{uuid.uuid4().hex[:8]}"
    workers = [
        CeleryWorker("w1", concurrency=2),
        CeleryWorker("w2", concurrency=2),
        CeleryWorker("bulk", queues=("bulkq",), concurrency=2),
    ]
    env = {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": airflow_connection_json(pg_dsn),
        "PG_BULK_TEST_CONN_ID": CONN_ID,
        "PG_BULK_TEST_POOL": POOL,
    }
    with (
        scratch_database(pg_dsn, metadata) as metadata_dsn,
        throwaway_broker(work / "broker") as broker,
        AirflowCelery(
            DAGS,
            metadata_dsn=metadata_dsn,
            broker_url=broker,
            workers=workers,
            env=env,
            parallelism=8,
            startup_timeout=240,
        ) as airflow,
    ):
        airflow.set_pool(POOL, 2)
        yield airflow


def _source(db: Database, folder: Path) -> str:
    """Four CSV files; the tables ``target`` and ``expected`` (their rows, by plain COPY)."""
    folder.mkdir()
    columns = sql.SQL("(id bigint PRIMARY KEY, name text, amount numeric)")
    for name in ("target", "expected"):
        db.run(sql.SQL("CREATE TABLE {} {}").format(db.ident(name), columns))
    for f in range(FILES):
        path = folder / f"part-{f}.csv"
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            for i in range(f * ROWS, (f + 1) * ROWS):
                writer.writerow([i, f'name {i}, "quoted"', f"{i * 0.01:.2f}"])
        copy_in = sql.SQL("COPY {} FROM STDIN (FORMAT csv)").format(db.ident("expected"))
        with db.conn.cursor() as cur, cur.copy(copy_in) as copy:
            copy.write(path.read_bytes())
    return str(folder / "part-*.csv")


@pytest.fixture
def other_db(db: Database) -> Iterator[Database]:
    """A second schema on the same server, dropped after the test."""
    schema = f"t_{uuid.uuid4().hex[:10]}"
    db.run(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield Database(db.dsn, schema, db.conn)
    finally:
        db.run(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


class CopySessions(threading.Thread):
    """Holds the COPY tasks of the load into ``schema`` at the door and counts them.

    As soon as the load's staging table exists, locks it (ACCESS EXCLUSIVE) until ``hold``
    seconds after the first COPY session shows: every COPY task that starts meanwhile waits on
    the lock, so its session stays in ``pg_stat_activity`` (application_name
    ``pgbulk:<load id>:<dag>.<task>[i]``) whatever the machine's speed. The workers have four
    slots: without the pool all four would be seen at once. ``most``: the most seen at once,
    polled every 10 ms for the whole run."""

    def __init__(self, dsn: str, schema: str, dag_id: str, hold: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.dsn, self.schema, self.hold = dsn, schema, hold
        self.pattern = f"pgbulk:%:{dag_id}.load.copy[%"
        self.most, self.seen, self.held = 0, set[str](), 0.0
        self.stop = threading.Event()

    def _count(self, conn: psycopg.Connection) -> int:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
                (self.pattern,),
            )
        ]
        self.most = max(self.most, len(names))
        self.seen.update(names)
        return len(names)

    def run(self) -> None:
        with (
            psycopg.connect(self.dsn, autocommit=True) as watch,
            psycopg.connect(self.dsn) as door,
        ):
            staging = None
            while staging is None and not self.stop.is_set():
                row = watch.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s"
                    " AND tablename LIKE '\\_pgbulk\\_%%\\_stage'",
                    (self.schema,),
                ).fetchone()
                staging = row[0] if row else None
                self._count(watch)
                time.sleep(0.01)
            if staging is not None:
                door.execute(
                    sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                        sql.Identifier(self.schema, staging)
                    )
                )
                locked, first = time.monotonic(), None
                while not self.stop.is_set() and time.monotonic() - locked < 120:
                    if self._count(watch) and first is None:
                        first = time.monotonic()
                    if first is not None and time.monotonic() - first >= self.hold:
                        break
                    time.sleep(0.01)
                self.held = time.monotonic() - (first or locked)
                door.rollback()
            while not self.stop.is_set():
                self._count(watch)
                time.sleep(0.01)


def test_celery_workers_a_pool_and_a_queue(
    celery: AirflowCelery, db: Database, other_db: Database, tmp_path: Path
) -> None:
    """Two runs at once: the pool's load on w1 and w2, the ``bulkq`` load on ``bulk``."""
    pool_source = _source(db, tmp_path / "pool")
    queue_source = _source(other_db, tmp_path / "queue")
    celery.wait_for_dag("pg_bulk_celery_pool")
    celery.wait_for_dag("pg_bulk_celery_bulkq")
    sessions = CopySessions(db.dsn, db.schema, "pg_bulk_celery_pool")
    sessions.start()
    runs = {}
    try:
        for dag_id, target, source in (
            ("pg_bulk_celery_pool", db, pool_source),
            ("pg_bulk_celery_bulkq", other_db, queue_source),
        ):
            conf = {"table": target.table("target"), "source": source}
            runs[dag_id] = celery.trigger(dag_id, conf=conf)
        results = {
            dag_id: celery.wait_for_run(dag_id, run_id, at, timeout=300)
            for dag_id, (run_id, at) in runs.items()
        }
    finally:
        sessions.stop.set()
        sessions.join()
    hosts = celery.worker_hostnames()
    pool, queue = results["pg_bulk_celery_pool"], results["pg_bulk_celery_bulkq"]
    copies = pool.task_runs("load.copy")
    print(
        f"\n{pool.describe()}\n{queue.describe()}\ncopy tasks ran on: "
        f"{sorted({t.hostname or '?' for t in copies})}; COPY sessions at once (most): "
        f"{sessions.most}, staging locked {sessions.held:.1f} s"
    )
    for result, target in ((pool, db), (queue, other_db)):
        assert result.state == "success", result.describe()
        assert target.checksum("target") == target.checksum("expected")

    # two workers on `default` ran the COPY tasks
    assert len(copies) == FILES
    assert {t.hostname for t in copies} == {hosts["w1"], hosts["w2"]}, pool.describe()
    # the pool of 2 slots: 2 COPY sessions at once while the staging was locked, never more
    assert sessions.held >= sessions.hold, "no COPY session waited at the locked staging"
    assert len(sessions.seen) == FILES, sessions.seen
    assert sessions.most == 2, sessions.most
    assert pool.max_concurrency("load.copy") <= 2, pool.describe()

    # queue="bulkq": every task of the load went to bulkq and ran on its only worker
    # (`cleaned`, the empty teardown that fails the run when cleanup failed, runs nowhere:
    # the scheduler marks it)
    worked = [t for t in queue.tasks if t.task_id != "load.cleaned"]
    assert {t.task_id for t in worked} == set(TASKS), queue.describe()
    ran = {(t.label, t.queue, t.hostname) for t in worked}
    assert ran == {(t.label, "bulkq", hosts["bulk"]) for t in worked}, ran
    (cleaned,) = queue.task_runs("load.cleaned")
    assert cleaned.state == "success" and not cleaned.hostname, queue.describe()
