"""What Airflow does with ``pg_bulk_load``'s task surface, run under ``dag.test()``
(tests/dags_dynamic/task_surface.py): the user's ``outlets`` get an asset event only from a
successful finalize (none from a failed load, whose cleanup succeeds); every argument rendered
from the run's params and checked (a wrong type fails prepare naming the argument); the DAG's
``default_args`` retries reach every task instance."""

from __future__ import annotations

from pathlib import Path

import pendulum
import pytest
from helpers import create_items, leftovers

from airflow_pg_bulk.demo.connection import airflow_connection_json

pytestmark = pytest.mark.dag_run

DYNAMIC = Path(__file__).resolve().parent / "dags_dynamic"
DAG_ID = "pg_bulk_task_surface"


@pytest.fixture
def surface(airflow_db, monkeypatch, db):
    """The DAG, with its connection pointing at the test server."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_CONN_PG_BULK_EXAMPLE", airflow_connection_json(db.dsn))
    bag = DagBag(dag_folder=str(DYNAMIC))
    assert bag.import_errors == {}
    return bag.get_dag(DAG_ID)


def _write(directory: Path, part: int, data: list[tuple[int, str, str]]) -> None:
    """``items-<part>.csv``: ``id;name;amount`` lines, no header."""
    lines = "".join(f"{i};{name};{amount}\n" for i, name, amount in data)
    (directory / f"items-{part}.csv").write_text(lines)


def _data(part: int) -> list[tuple[int, str, str]]:
    return [(part * 1000 + n, f"row {part}.{n}", f"{n}.50") for n in range(1, 61)]


def _states(run) -> dict[tuple[str, int], str]:
    return {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}


def _events(run_id: str) -> list[tuple[str, str]]:
    """(asset uri, source task id) of every asset event a run emitted."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.query(AssetEvent).filter(AssetEvent.source_run_id == run_id).all()
        return sorted((e.uri, e.source_task_id) for e in found)


def _run(dag, day: int, conf: dict):
    when = pendulum.datetime(2026, 2, day, tz="UTC")
    return dag.test(run_after=when, logical_date=when, run_conf=conf)


def test_the_asset_event_comes_only_from_a_successful_finalize(surface, db, tmp_path):
    """A load that fails (a bad row) emits no asset event at all, though its cleanup
    succeeds; the load run again with the file corrected emits the user's outlet and the
    target's asset once each, from finalize, after the rows are in the table. Every argument
    came from a template of the run's params, and every task instance has the retries of the
    DAG's default_args."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields

    loaded_uri = "pg_bulk_task_surface_loaded"
    create_items(db)
    db.run(f"INSERT INTO {db.schema}.items VALUES (-1, 'kept', 1, '2020-01-01', NULL)")
    before = db.checksum("items")
    _write(tmp_path, 0, _data(0))
    _write(tmp_path, 1, [*_data(1)[:30], (1031, "bad", "not-a-number"), *_data(1)[31:]])
    conf = {"schema": db.schema, "table": "items", "dir": str(tmp_path)}

    failed = _run(surface, 3, conf)

    states = _states(failed)
    assert failed.state == "failed", states
    assert "failed" in {s for (task, _), s in states.items() if task == "load.copy"}, states
    assert states[("load.finalize", -1)] == "upstream_failed", states
    assert states[("load.cleanup", -1)] == "success", states
    assert _events(failed.run_id) == []  # no consumer triggered by a load that failed
    assert db.checksum("items") == before
    assert leftovers(db) == []

    _write(tmp_path, 1, _data(1))
    done = _run(surface, 4, conf)

    states = _states(done)
    assert done.state == "success", states
    assert sum(1 for task, _ in states if task == "load.copy") == 2  # partitions="{{ ... }}"
    events = _events(done.run_id)
    target = [uri for uri, _ in events if uri.endswith(f"/{db.schema}/items")]
    assert len(target) == 1 and target[0].startswith("postgres://"), events
    assert sorted(events) == sorted([(loaded_uri, "load.finalize"), (target[0], "load.finalize")])
    loaded = db.run(f"SELECT id, name, amount::text, day, note FROM {db.schema}.items ORDER BY id")
    assert loaded == [(i, name, amount, None, None) for i, name, amount in _data(0) + _data(1)]

    prepare = next(ti for ti in done.get_task_instances() if ti.task_id == "load.prepare")
    rendered = RenderedTaskInstanceFields.get_templated_fields(prepare)
    assert rendered["table"] == f"{db.schema}.items"
    assert rendered["source"] == f"{tmp_path}/items-*.csv"
    assert (rendered["columns"], rendered["header"], rendered["delimiter"]) == (
        "id,name,amount",
        "False",
        ";",
    )
    for ti in done.get_task_instances():  # the DAG's default_args, on copy and finalize too
        assert ti.max_tries == 3, (ti.task_id, ti.map_index, ti.max_tries)


def test_a_rendered_value_of_the_wrong_type_fails_prepare_naming_it(surface, db, tmp_path, capfd):
    """``header`` rendered as ``yes``: prepare fails at once (no retry, though the DAG gives 3)
    saying which argument and what it was; nothing is loaded and no asset event emitted."""
    create_items(db)
    before = db.checksum("items")
    _write(tmp_path, 0, _data(0))
    conf = {"schema": db.schema, "table": "items", "dir": str(tmp_path), "header": "yes"}

    failed = _run(surface, 5, conf)

    states = _states(failed)
    assert failed.state == "failed", states
    prepare = next(ti for ti in failed.get_task_instances() if ti.task_id == "load.prepare")
    assert (prepare.state, prepare.try_number) == ("failed", 1)
    assert states[("load.cleanup", -1)] == "success", states
    out = capfd.readouterr()
    assert "header must be true or false, not 'yes' (str)" in out.out + out.err
    assert _events(failed.run_id) == []
    assert db.checksum("items") == before
    assert leftovers(db) == []


def test_prepare_logs_what_the_load_will_do_before_any_row_is_copied(surface, db, tmp_path, capfd):
    """Under Airflow, prepare's log says what the load will do (issue 22: the preview), before
    any COPY task runs: the files and bytes, the COPY streams, the effect on the target and
    the rows it holds now (the catalog's estimate), the checks passed."""
    create_items(db)
    db.run(
        f"INSERT INTO {db.schema}.items SELECT g, 'old', 1, NULL, NULL"
        " FROM generate_series(1, 40) g"
    )
    db.run(f"ANALYZE {db.schema}.items")
    _write(tmp_path, 0, _data(0))
    _write(tmp_path, 1, _data(1))
    conf = {"schema": db.schema, "table": "items", "dir": str(tmp_path)}

    done = _run(surface, 6, conf)

    assert done.state == "success", _states(done)
    log = capfd.readouterr()
    text = log.out + log.err
    told = text.index(f"this load (replace) into {db.schema}.items will:")
    assert "read 2 files" in text[told:]
    assert "replace every row of the table; rows now (the catalog's estimates):" in text[told:]
    assert f"{db.schema}.items: about 40" in text[told:]
    assert "checks passed: the definition of" in text[told:]
    assert text.index("COPY stream 0") > told  # said before the first COPY stream ran
