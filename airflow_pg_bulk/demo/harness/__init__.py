"""The Airflow process harness: a real, throwaway ``airflow standalone`` that runs DAGs with
mapped tasks in parallel, and the timings of each run. One module a job:

- :mod:`~airflow_pg_bulk.demo.harness.standalone`: :class:`AirflowStandalone`, start, wait,
  trigger, run, stop;
- :mod:`~airflow_pg_bulk.demo.harness.results`: :class:`DagRunResult`, :class:`TaskRun`, errors;
- :mod:`~airflow_pg_bulk.demo.harness.processes`: find and stop a home's processes;
- :mod:`~airflow_pg_bulk.demo.harness.api`: the REST API client;
- :mod:`~airflow_pg_bulk.demo.harness.metadata`: read-only queries on the metadata database;
- :mod:`~airflow_pg_bulk.demo.harness.logs`: task log tails, made readable.
"""

from airflow_pg_bulk.demo.harness.processes import find_home_processes
from airflow_pg_bulk.demo.harness.results import (
    DAG_RUN_FINISHED_STATES,
    TASK_FAILED_STATES,
    AirflowRunnerError,
    AirflowStartupError,
    DagImportError,
    DagRunFailedError,
    DagRunResult,
    TaskRun,
)
from airflow_pg_bulk.demo.harness.standalone import AirflowStandalone

__all__ = [
    "DAG_RUN_FINISHED_STATES",
    "TASK_FAILED_STATES",
    "AirflowRunnerError",
    "AirflowStandalone",
    "AirflowStartupError",
    "DagImportError",
    "DagRunFailedError",
    "DagRunResult",
    "TaskRun",
    "find_home_processes",
]
