"""DAG files shipped with the package (the demo points Airflow's dags folder here)."""
