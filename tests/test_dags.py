"""The example DAGs parse, have the documented shape, and run end to end (``dag.test()``).

``dag.test()`` runs mapped tasks one after another in one process; the demo and the
benchmarks run the same DAG under a real scheduler, where they run in parallel."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    create_items,
    leftovers,
    multiline_rows,
    plain_copy_checksum,
    returned_xcom,
    rows,
    write_csv,
    write_parts,
)

from airflow_pg_bulk.demo import workload
from airflow_pg_bulk.demo.connection import airflow_connection_json
from airflow_pg_bulk.source import window
from airflow_pg_bulk.source.boundaries import record_starts
from airflow_pg_bulk.source.syntax import RecordSyntax

pytestmark = pytest.mark.dag_run

HEADER = ["id", "name", "amount", "day", "note"]

EXAMPLES = Path(__file__).resolve().parent.parent / "dags_examples"


@pytest.fixture
def dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(EXAMPLES))


@pytest.fixture
def example_conn(monkeypatch, db):
    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_EXAMPLE", airflow_connection_json(db.dsn))
    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_DEMO", airflow_connection_json(db.dsn))
    return db


def test_example_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) >= {
        "example_pg_bulk_replace_many_csv",
        "example_pg_bulk_append_one_big_file",
        "example_pg_bulk_load_from_s3",
        "pg_bulk_smart_meter",
        "example_pg_bulk_upsert_daily",
        "example_pg_bulk_nightly_from_postgres",
        "example_pg_bulk_nightly_from_sqlite",
    }
    dag = dagbag.get_dag("example_pg_bulk_replace_many_csv")
    assert {t.task_id for t in dag.tasks} == {
        "load_readings.prepare",
        "load_readings.copy",
        "load_readings.finalize",
        "load_readings.cleanup",
        "load_readings.cleaned",
    }
    cleanup = dag.get_task("load_readings.cleanup")
    assert cleanup.is_teardown
    # a failed cleanup fails the run through `cleaned`; finalize still decides it too
    cleaned = dag.get_task("load_readings.cleaned")
    assert cleaned.is_teardown and cleaned.on_failure_fail_dagrun
    assert cleaned.upstream_task_ids == {"load_readings.cleanup"}
    assert not cleanup.on_failure_fail_dagrun
    assert dag.get_task("load_readings.copy").max_active_tis_per_dagrun == 4


def _run(dagbag, dag_id, conf):
    dag = dagbag.get_dag(dag_id)
    run = dag.test(run_conf=conf)
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    return run, states


def test_replace_many_csv_example_runs(dagbag, example_conn, tmp_path):
    db = example_conn
    create_items(db)
    whole = write_parts(tmp_path, "items", 6, 300, header=HEADER)
    expected = plain_copy_checksum(db, whole, "FORMAT csv")

    run, states = _run(
        dagbag,
        "example_pg_bulk_replace_many_csv",
        {"table": db.table("items"), "source": str(tmp_path / "items-*.csv")},
    )

    assert run.state == "success", states
    assert sum(1 for (task, _), s in states.items() if task.endswith(".copy")) == 4
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_append_one_big_file_example_runs(dagbag, example_conn, tmp_path):
    db = example_conn
    create_items(db)
    path = write_csv(tmp_path / "events.csv", rows(5000))
    expected = plain_copy_checksum(db, path, "FORMAT csv")

    run, states = _run(
        dagbag,
        "example_pg_bulk_append_one_big_file",
        {"table": db.table("items"), "source": str(path)},
    )

    assert run.state == "success", states
    assert states[("report", -1)] == "success"
    assert db.checksum("items") == expected
    assert leftovers(db) == []


def test_upsert_daily_example_runs(dagbag, example_conn, tmp_path):
    """The run of 5 March merges the files of changes/2026-03-05 (not those of another day):
    keys repeated across the day's files take the row of the later file."""
    import pendulum

    db = example_conn
    create_items(db)
    db.run(
        f"INSERT INTO {db.schema}.items SELECT n, 'old ' || n, n, '2026-01-01', NULL"
        " FROM generate_series(1, 100) n"
    )
    day = tmp_path / "2026-03-05"
    day.mkdir()
    write_csv(day / "a.csv", [(n, f"a {n}", n, "2026-03-05", None) for n in range(90, 131)],
              header=HEADER)  # fmt: skip
    write_csv(day / "b.csv", [(n, f"b {n}", n, "2026-03-05", "x") for n in range(125, 141)],
              header=HEADER)  # fmt: skip
    (tmp_path / "2026-03-04").mkdir()
    write_csv(tmp_path / "2026-03-04" / "a.csv", [(1, "other day", 1, None, None)], header=HEADER)

    dag = dagbag.get_dag("example_pg_bulk_upsert_daily")
    run = dag.test(
        logical_date=pendulum.datetime(2026, 3, 5, tz="UTC"),
        run_conf={"table": db.table("items"), "changes": str(tmp_path)},
    )
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}

    assert run.state == "success", states
    assert states[("report", -1)] == "success"
    names = dict(db.run(f"SELECT id, name FROM {db.schema}.items"))
    assert len(names) == 140
    assert names[1] == "old 1" and names[89] == "old 89"  # not in the day's changes
    assert names[90] == "a 90" and names[100] == "a 100"  # updated
    assert names[124] == "a 124" and names[125] == "b 125" and names[140] == "b 140"
    # finalize's XCom: 57 rows loaded, keys 90-100 updated, 101-140 inserted, and the a.csv
    # rows of keys 125-130 superseded by b.csv's
    figures = returned_xcom(run, "merge_changes.finalize")
    assert (figures["rows"], figures["inserted"], figures["updated"]) == (57, 40, 11)
    assert figures["superseded"] == 6
    assert leftovers(db) == []


def test_smart_meter_demo_dag_runs(dagbag, example_conn, tmp_path):
    db = example_conn
    conn = __import__("psycopg").connect(db.dsn)
    workload.create_schema(conn, db.schema, readings_tables=("readings", "reference"))
    workload.fill_meters(conn, db.schema, 50)
    paths = workload.write_readings(conn, workload.Workload(meters=50, days=20, files=3), tmp_path)
    workload.naive_copy(conn, db.schema, "reference", paths)

    run, states = _run(
        dagbag,
        "pg_bulk_smart_meter",
        {"table": db.table("readings"), "readings": str(tmp_path / "readings-*")},
    )

    assert run.state == "success", states
    assert workload.checksum(conn, db.schema, "readings") == workload.checksum(
        conn, db.schema, "reference"
    )
    conn.close()


def test_failed_load_fails_the_dag_and_cleanup_still_runs(dagbag, example_conn, tmp_path):
    db = example_conn
    create_items(db)
    db.run(
        f"INSERT INTO {db.schema}.items VALUES (-1, 'kept', 1, '2020-01-01', NULL),"
        " (-2, 'also kept', 2.5, NULL, 'note')"
    )
    before = db.checksum("items")
    data = rows(300)
    data[123] = (124, "bad", "not-a-number", "2024-01-01", None)
    write_csv(tmp_path / "items-0.csv", data, header=HEADER)

    run, states = _run(
        dagbag,
        "example_pg_bulk_replace_many_csv",
        {"table": db.table("items"), "source": str(tmp_path / "items-*.csv")},
    )

    assert run.state == "failed"
    assert states[("load_readings.cleanup", -1)] == "success"
    assert db.checksum("items") == before
    assert leftovers(db) == []


def test_airflow_providers_list_shows_the_provider(airflow_db):
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    out = subprocess.run(
        [airflow, "providers", "list"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("airflow-pg-bulk"))
    assert "0.1.0" in line


# --- arguments known only at run time -------------------------------------------------------

DYNAMIC = Path(__file__).resolve().parent / "dags_dynamic"


@pytest.fixture
def dynamic_dagbag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DYNAMIC))


def test_dags_with_run_time_arguments_parse(dynamic_dagbag):
    assert dynamic_dagbag.import_errors == {}
    assert set(dynamic_dagbag.dag_ids) == {
        "pg_bulk_upstream_source",
        "pg_bulk_mapped_group",
        "pg_bulk_mapped_operators",
        "pg_bulk_task_surface",
        "pg_bulk_run_order",
        "pg_bulk_finalize_timeout",  # stops.py: run by tests/test_stops.py
        "pg_bulk_append_in_place",
        "pg_bulk_many_files",
        "pg_bulk_many_files_mapped_group",
    }
    prepare = dynamic_dagbag.get_dag("pg_bulk_mapped_operators").get_task("prepare")
    assert prepare.partial_kwargs["mode"] == "append"
    group = dynamic_dagbag.get_dag("pg_bulk_mapped_group")
    assert {t.task_id for t in group.tasks} >= {
        "load_table.load.prepare",
        "load_table.load.copy_0",
        "load_table.load.copy_1",
        "load_table.load.finalize",
        "load_table.load.cleanup",
        "load_table.load.cleaned",
    }
    assert not any(t.is_mapped for t in group.tasks)  # the group is mapped, no task in it is


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_upstream_output_as_source_and_templated_mode_run(
    dynamic_dagbag, example_conn, tmp_path, mode
):
    db = example_conn
    create_items(db)
    whole = write_parts(tmp_path, "items", 3, 200, header=HEADER)
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    files = sorted(str(p) for p in tmp_path.glob("items-*.csv"))

    run, states = _run(
        dynamic_dagbag,
        "pg_bulk_upstream_source",
        {
            "conn_id": "pg_bulk_example",
            "table": db.table("items"),
            "files": files,
            "mode": mode,
            "partitions": "2",
        },
    )

    assert run.state == "success", states
    assert sum(1 for (task, _) in states if task == "load.copy") == 2
    assert db.checksum("items") == expected
    assert leftovers(db) == []


# --- clearing and re-running a run, failures after prepare's commit --------------------------


def test_a_run_cleared_and_run_again_converges(dagbag, example_conn, tmp_path):
    """``dag.test()`` with the same logical date clears the run's task instances and runs
    them again in the same DAG run (same run id, so the same load id): the whole group
    cleared. An append finalized before loads nothing the second time (prepare is skipped,
    saying why); the rows are there once."""
    import pendulum

    db = example_conn
    create_items(db)
    path = write_csv(tmp_path / "events.csv", rows(4000, seed=31))
    expected = plain_copy_checksum(db, path, "FORMAT csv")
    dag = dagbag.get_dag("example_pg_bulk_append_one_big_file")
    when = pendulum.datetime(2026, 11, 20, tz="UTC")
    conf = {"table": db.table("items"), "source": str(path)}

    first = dag.test(run_after=when, logical_date=when, run_conf=conf)
    second = dag.test(run_after=when, logical_date=when, run_conf=conf)

    assert first.run_id == second.run_id
    states = {ti.task_id: ti.state for ti in second.get_task_instances() if ti.map_index < 1}
    assert states["load_events.prepare"] == "skipped", states
    assert states["load_events.cleanup"] == "success", states
    assert db.checksum("items") == expected  # appended once
    assert leftovers(db) == []


def test_a_prepare_that_fails_after_its_commit_leaves_nothing(
    dagbag, example_conn, tmp_path, monkeypatch
):
    """Prepare's tables are committed before it pushes the plan; if it fails then (here: the
    step after its commit raises), cleanup still runs and drops them."""
    from airflow_pg_bulk.plan import figures

    def fail_after_commit(*args, **kwargs):
        raise RuntimeError("injected: prepare fails after its commit")

    monkeypatch.setattr(figures, "stamp_prepare", fail_after_commit)
    db = example_conn
    create_items(db)
    before = db.checksum("items")
    write_csv(tmp_path / "items-0.csv", rows(300), header=HEADER)

    run, states = _run(
        dagbag,
        "example_pg_bulk_replace_many_csv",
        {"table": db.table("items"), "source": str(tmp_path / "items-*.csv")},
    )

    assert run.state == "failed"
    assert states[("load_readings.prepare", -1)] == "failed", states
    assert states[("load_readings.cleanup", -1)] == "success", states
    assert db.checksum("items") == before


def test_copy_tasks_render_no_plan(dynamic_dagbag, example_conn, tmp_path):
    """The plan reaches copy and finalize through XCom at run time, not as a rendered
    template field: what Airflow stores for a COPY task is its partition and connection."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields

    db = example_conn
    create_items(db)
    whole = write_parts(tmp_path, "items", 2, 100, header=HEADER)
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    files = sorted(str(p) for p in tmp_path.glob("items-*.csv"))
    conf = {"conn_id": "pg_bulk_example", "table": db.table("items"), "files": files}
    conf["partitions"] = "2"
    run, states = _run(dynamic_dagbag, "pg_bulk_upstream_source", {**conf, "mode": "replace"})

    assert run.state == "success", states
    assert db.checksum("items") == expected
    copies = [ti for ti in run.get_task_instances() if ti.task_id == "load.copy"]
    assert len(copies) == 2
    for ti in copies:
        fields = RenderedTaskInstanceFields.get_templated_fields(ti)
        assert set(fields) == {"partition", "postgres_conn_id"}, fields
        # its partition's number (its pieces are read from the load's pieces table), nothing
        # of the plan every task shares
        assert fields["partition"] == ti.map_index
        assert "load_id" not in repr(fields) and "_pgbulk_" not in repr(fields)
    finalize = next(ti for ti in run.get_task_instances() if ti.task_id == "load.finalize")
    assert set(RenderedTaskInstanceFields.get_templated_fields(finalize)) == {"postgres_conn_id"}


def _two_tables(db, tmp_path, stems=("items_a", "items_b")):
    """Tables ``items_a`` and ``items_b`` and their CSV files (3 and 2 parts; ids apart);
    the checksum each should end up with."""
    expected = {}
    for parts, stem in zip((3, 2), stems, strict=True):
        create_items(db, stem)
        whole = write_parts(tmp_path, stem, parts, 150, header=HEADER)
        expected[stem] = plain_copy_checksum(
            db, whole, "FORMAT csv", name=f"{stem}_reference", like=stem
        )
    return expected


def test_pg_bulk_load_in_a_mapped_task_group_loads_each_table(
    dynamic_dagbag, example_conn, tmp_path
):
    db = example_conn
    expected = _two_tables(db, tmp_path)
    db.run(f"INSERT INTO {db.schema}.items_b VALUES (-1, 'replaced', 1, NULL, NULL)")

    run, states = _run(
        dynamic_dagbag,
        "pg_bulk_mapped_group",
        {"tables": [db.table("items_a"), db.table("items_b")], "dir": str(tmp_path)},
    )

    assert run.state == "success", states
    for stem, checksum in expected.items():
        assert db.checksum(stem) == checksum, stem
    for task in ("prepare", "copy_0", "copy_1", "finalize", "cleanup"):
        assert {i for (t, i), s in states.items() if t == f"load_table.load.{task}"} == {0, 1}
    assert set(states.values()) == {"success"}, states
    assert leftovers(db) == []


def test_operators_mapped_over_tables_by_hand(dynamic_dagbag, example_conn, tmp_path):
    db = example_conn
    expected = _two_tables(db, tmp_path)

    run, states = _run(
        dynamic_dagbag, "pg_bulk_mapped_operators", {"schema": db.schema, "dir": str(tmp_path)}
    )

    assert run.state == "success", states
    for stem, checksum in expected.items():
        assert db.checksum(stem) == checksum, stem
    for task in ("prepare", "copy", "finalize", "cleanup"):
        assert {i for (t, i), s in states.items() if t == task} == {0, 1}
    assert leftovers(db) == []


def test_a_failed_load_in_a_mapped_task_group_leaves_the_other_loaded_and_nothing_behind(
    dynamic_dagbag, example_conn, tmp_path
):
    """Each instance of the group is its own load: a bad row in one table's files fails that
    load (its table unchanged), the other loads, and each cleanup drops its own staging."""
    db = example_conn
    expected = _two_tables(db, tmp_path)
    db.run(f"INSERT INTO {db.schema}.items_b VALUES (-1, 'kept', 1, NULL, NULL)")
    before = db.checksum("items_b")
    with (tmp_path / "items_b-1.csv").open("a") as f:
        f.write("999999,bad,not-a-number,,\n")

    run, states = _run(
        dynamic_dagbag,
        "pg_bulk_mapped_group",
        {"tables": [db.table("items_a"), db.table("items_b")], "dir": str(tmp_path)},
    )

    assert run.state == "failed"
    assert db.checksum("items_a") == expected["items_a"]
    assert db.checksum("items_b") == before
    assert states[("load_table.load.finalize", 0)] == "success"
    assert states[("load_table.load.cleanup", 0)] == "success"
    assert states[("load_table.load.cleanup", 1)] == "success"
    assert leftovers(db) == []


# --- lineage: the target's Asset event and OpenLineage ---------------------------------------


def test_a_load_emits_the_targets_asset_event_and_openlineage(airflow_db, example_conn, tmp_path):
    """Finalize attaches ``postgres://host:port/database/schema/table`` to its AssetAlias
    outlet (an Asset event DAGs can be scheduled on), and the openlineage provider (a file
    transport here) emits the files in and the table out, with schema, rows, bytes and
    OVERWRITE for a replace. The DAG runs in a process of its own: the provider reads its
    settings once per process (and its events would slow every other test's tasks)."""
    import json

    from airflow.models.asset import AssetEvent
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    db = example_conn
    create_items(db)
    write_parts(tmp_path, "items", 2, 300, header=HEADER)
    paths = sorted(tmp_path.glob("items-*.csv"))
    events_file = tmp_path / "openlineage.jsonl"
    conf = {"table": db.table("items"), "source": str(tmp_path / "items-*.csv")}
    script = (
        "import json, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"dag = DagBag(dag_folder={str(EXAMPLES)!r}).get_dag('example_pg_bulk_replace_many_csv')\n"
        "run = dag.test(run_conf=json.loads(sys.argv[1]))\n"
        "print('RUN', run.run_id, run.state)\n"
    )
    env = dict(
        os.environ,
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RUN ")]
    assert line, done.stdout[-2000:] + done.stderr[-4000:]
    _, run_id, state = line[-1].split()
    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.run_id == run_id).one()
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert state == "success", states
    suffix = f"/{db.schema}/items"
    with create_session() as session:
        events = [
            e
            for e in session.query(AssetEvent).filter(AssetEvent.source_run_id == run.run_id)
            if e.uri.endswith(suffix)
        ]
    assert len(events) == 1, [e.uri for e in events]
    assert events[0].uri.startswith("postgres://")
    assert events[0].extra["rows"] == 600
    assert events[0].extra["mode"] == "replace"

    emitted = [json.loads(line) for line in events_file.read_text().splitlines() if line]
    complete = [
        e
        for e in emitted
        if e.get("eventType") == "COMPLETE"
        and e["job"]["name"].endswith(".finalize")
        and any(o["name"].endswith(f"{db.schema}.items") for o in e.get("outputs", []))
    ]
    assert complete, [(e.get("eventType"), e["job"]["name"]) for e in emitted]
    event = complete[-1]
    assert {i["name"] for i in event["inputs"]} == {str(p) for p in paths}
    (output,) = event["outputs"]
    assert output["name"].endswith(f"{db.schema}.items")
    assert output["outputFacets"]["outputStatistics"]["rowCount"] == 600
    assert output["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "OVERWRITE"
    assert [f["name"] for f in output["facets"]["schema"]["fields"]] == HEADER


def test_load_from_s3_example_runs(dagbag, example_conn, s3_server, monkeypatch, tmp_path):
    """The S3 example against a real S3 endpoint (moto's server) through an aws connection:
    one object, a header, cut into 4 ranges, some of whose guessed starts are wrong (long
    quoted fields of quote-free lines): the COPY tasks mark them, finalize loads them again,
    and the table equals a plain COPY of the same rows."""
    db = example_conn
    create_items(db)
    body = multiline_rows(300, b"\r\n", long_note_every=60)
    whole = tmp_path / "whole.csv"
    whole.write_bytes(body)
    expected = plain_copy_checksum(db, whole, "FORMAT csv")
    bucket = s3_server.bucket()
    header = ",".join(HEADER).encode() + b"\r\n"
    whole_object = tmp_path / "object.csv"
    whole_object.write_bytes(header + body)
    guesses, _ = window.split_points(
        io.BytesIO(header + body), len(header), len(header + body), 4, RecordSyntax()
    )
    wrong = [
        g for g in guesses if record_starts(whole_object, [g.offset], RecordSyntax()) != [g.offset]
    ]
    assert wrong  # the repair runs under Airflow
    s3_server.client().put_object(Bucket=bucket, Key="in/events.csv", Body=header + body)
    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_S3", s3_server.connection_json())
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_server.region)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)

    run, states = _run(
        dagbag,
        "example_pg_bulk_load_from_s3",
        {"table": db.table("items"), "source": f"s3://{bucket}/in/events.csv"},
    )

    assert run.state == "success", states
    assert sum(1 for (task, _), s in states.items() if task.endswith(".copy")) == 4
    assert states[("report", -1)] == "success"
    assert db.checksum("items") == expected
    assert leftovers(db) == []
