"""What travels through XCom under ``dag.test()``: a COPY task pulls a few KB, its own share,
whatever the number of files; prepare pushes a few KB.

Airflow 3.3 resolves a mapped argument over an unmapped upstream by pulling the upstream's
whole XCom and indexing it (``PlainXComArg.resolve``), and a fixed COPY task of a mapped task
group pulled prepare's whole return value too: with the pieces of every partition in it, each
COPY task received the piece list of the whole load (2.5 MB for 10,000 files). The pieces now
stay in the target database (the load's pieces table, written by prepare); the XCom carries
partition numbers and the plan without pieces.

The bytes are recorded where the task runner receives them: every XCom request a task sends
to its supervisor (``InProcessSupervisorComms.send``: ``GetXCom``, ``GetXComSequenceItem``,
``GetXComSequenceSlice``) and the size of the answer, by task instance; a real worker gets the
same answers from the execution API."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import create_items, leftovers

from airflow_pg_bulk.demo.connection import airflow_connection_json

pytestmark = pytest.mark.dag_run

DYNAMIC = Path(__file__).resolve().parent / "dags_dynamic"
MANY = 10_000
FEW = 100
SHARE_LIMIT = 8_000  # bytes a COPY task may pull, whatever the number of files
PUSH_LIMIT = 8_000  # bytes prepare may push
COPY_TASK = re.compile(r"\.copy(_\d+)?$")


@dataclass
class Traffic:
    """XCom bytes pulled and pushed, seconds from a task's start to its ``execute`` (COPY
    tasks) and from its start to its end, by (task id, map index)."""

    pulled: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    pushed: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    started: dict[tuple[str, int], float] = field(default_factory=dict)
    before_execute: dict[tuple[str, int], float] = field(default_factory=dict)
    seconds: dict[tuple[str, int], float] = field(default_factory=dict)
    connections: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    running: tuple[str, int] | None = None

    def copies(self) -> dict[tuple[str, int], int]:
        """Bytes pulled by each COPY task (``….copy`` mapped, ``….copy_<n>`` fixed)."""
        return {k: v for k, v in self.pulled.items() if COPY_TASK.search(k[0])}


@pytest.fixture
def traffic(monkeypatch: pytest.MonkeyPatch) -> Traffic:
    """Record the XCom each task instance pulls and pushes through its supervisor."""
    from airflow.sdk.execution_time import comms, supervisor

    from airflow_pg_bulk.hooks.pg_bulk import PgBulkHook
    from airflow_pg_bulk.operators.pg_bulk import PgBulkCopyOperator

    seen = Traffic()
    pulls = (comms.GetXCom, comms.GetXComSequenceItem, comms.GetXComSequenceSlice)
    send = supervisor.InProcessSupervisorComms.send

    def recording_send(self, msg):
        answer = send(self, msg)
        ti = self.supervisor.ti
        where = (ti.task_id, ti.map_index)
        if isinstance(msg, pulls):
            seen.pulled[where] += len(answer.model_dump_json()) if answer is not None else 0
        elif isinstance(msg, comms.SetXCom):
            seen.pushed[where] += len(json.dumps(msg.value, separators=(",", ":")))
        return answer

    start = supervisor.InProcessTestSupervisor.start.__func__

    def timed_start(cls, *, what, task, **kwargs):
        where = seen.running = (what.task_id, what.map_index)
        seen.started[where] = time.perf_counter()
        try:
            return start(cls, what=what, task=task, **kwargs)
        finally:
            seen.seconds[where] = time.perf_counter() - seen.started[where]
            seen.running = None

    execute = PgBulkCopyOperator.execute

    def timed_execute(self, context):
        ti = context["ti"]
        where = (ti.task_id, ti.map_index)
        seen.before_execute[where] = time.perf_counter() - seen.started[where]
        return execute(self, context)

    get_conn = PgBulkHook.get_conn

    def counted_get_conn(self):
        seen.connections[seen.running] += 1
        return get_conn(self)

    monkeypatch.setattr(PgBulkHook, "get_conn", counted_get_conn)
    monkeypatch.setattr(supervisor.InProcessSupervisorComms, "send", recording_send)
    monkeypatch.setattr(supervisor.InProcessTestSupervisor, "start", classmethod(timed_start))
    monkeypatch.setattr(PgBulkCopyOperator, "execute", timed_execute)
    return seen


@pytest.fixture(scope="module")
def file_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Directories of FEW and MANY one-row CSV files (ids apart)."""
    made = {}
    for count in (FEW, MANY):
        folder = tmp_path_factory.mktemp(f"files{count}")
        for n in range(count):
            (folder / f"part-{n:05d}.csv").write_text(f"{n},name {n},{n % 97}.25,2024-01-01,\n")
        made[count] = folder
    return made


@pytest.fixture
def dynamic_dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DYNAMIC / "many_files.py"))


def _load(dagbag, monkeypatch, db, dag_id: str, folder: Path, count: int, traffic: Traffic):
    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_EXAMPLE", airflow_connection_json(db.dsn))
    table = f"items_{count}"
    create_items(db, table)
    run = dagbag.get_dag(dag_id).test(
        run_conf={"table": db.table(table), "source": str(folder / "part-*.csv")}
    )
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert run.state == "success", states
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.{table}") == count
    assert leftovers(db) == []
    return Traffic(
        pulled=dict(traffic.pulled),
        pushed=dict(traffic.pushed),
        before_execute=dict(traffic.before_execute),
        seconds=dict(traffic.seconds),
        connections=dict(traffic.connections),
    )


@pytest.mark.parametrize(
    ("dag_id", "copy_tasks"),
    [("pg_bulk_many_files", 16), ("pg_bulk_many_files_mapped_group", 4)],
    ids=["mapped_copy", "mapped_task_group"],
)
def test_a_copy_task_pulls_a_few_kb_whatever_the_number_of_files(
    dynamic_dagbag, db, file_sets, traffic, monkeypatch, dag_id, copy_tasks
):
    measured = {}
    for count in (FEW, MANY):
        for record in (traffic.pulled, traffic.pushed, traffic.before_execute, traffic.seconds):
            record.clear()
        traffic.connections.clear()
        measured[count] = _load(
            dynamic_dagbag, monkeypatch, db, dag_id, file_sets[count], count, traffic
        )

    for count, seen in measured.items():
        copies = seen.copies()
        steps = {
            k[0].rsplit(".", 1)[-1]: round(s, 2)
            for k, s in seen.seconds.items()
            if k[0].endswith(("prepare", "finalize"))
        }
        print(
            f"{dag_id} {count} files: COPY tasks pulled {sorted(copies.values())}"
            f" bytes, prepare pushed {[v for k, v in seen.pushed.items() if 'prepare' in k[0]]},"
            f" before execute {sorted(round(s, 2) for s in seen.before_execute.values())} s,"
            f" whole task {sorted(round(s, 2) for k, s in seen.seconds.items() if k in copies)} s;"
            f" seconds {steps}"
        )
    for seen in measured.values():
        copies = seen.copies()
        assert len(copies) == copy_tasks, copies
        # one session per COPY task: its pieces read and its COPYs (a pool then bounds sessions)
        assert {seen.connections.get(task) for task in copies} == {1}, seen.connections
        # and one for finalize: its pieces, the COPY span and finalize itself
        finalize = [k for k in seen.seconds if k[0].endswith("load.finalize")]
        assert [seen.connections.get(k) for k in finalize] == [1], seen.connections
        assert max(copies.values()) <= SHARE_LIMIT, copies
        (pushed,) = [v for k, v in seen.pushed.items() if k[0].endswith("load.prepare")]
        assert pushed <= PUSH_LIMIT
    few, many = measured[FEW], measured[MANY]
    # the same few KB at 100 and at 10,000 files (digits of byte counts apart)
    assert max(many.copies().values()) <= max(few.copies().values()) + 200


def test_a_retried_copy_task_reads_the_same_pieces(
    dynamic_dagbag, db, file_sets, traffic, monkeypatch
):
    """COPY task 5 fails once after reading its pieces; its retry reads the same ones and the
    load has every row once."""
    from airflow_pg_bulk.errors import TransientLoadError
    from airflow_pg_bulk.hooks.pg_bulk import PgBulkHook

    read, failed = [], []
    read_pieces, copy_partition = PgBulkHook.read_pieces, PgBulkHook.copy_partition

    def recording_read(self, plan, partitions, **kwargs):
        found = read_pieces(self, plan, partitions, **kwargs)
        if list(partitions) == [5]:
            read.append(found)
        return found

    def failing_once(self, plan, index, *args, **kwargs):
        if index == 5 and not failed:
            failed.append(index)
            raise TransientLoadError("injected: COPY task 5 fails on its first try")
        return copy_partition(self, plan, index, *args, **kwargs)

    monkeypatch.setattr(PgBulkHook, "read_pieces", recording_read)
    monkeypatch.setattr(PgBulkHook, "copy_partition", failing_once)
    seen = _load(
        dynamic_dagbag, monkeypatch, db, "pg_bulk_many_files", file_sets[FEW], FEW, traffic
    )

    assert failed == [5]
    first, retry = read  # two tries of the task, the same pieces
    assert first == retry and first[0].pieces
    assert seen.pulled[("load.copy", 5)] <= 2 * SHARE_LIMIT
