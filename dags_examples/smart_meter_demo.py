"""The demo's DAG (``airflow-pg-bulk demo`` runs it under a real scheduler): a replace of the
smart-meter readings from many CSV files. Defined in the package so the demo finds it when
installed; exposed here with the other examples."""

from airflow_pg_bulk.demo.dags.smart_meter import smart_meter_dag  # noqa: F401  (an airflow dag)
