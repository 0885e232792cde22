"""load: the four steps of a load on a connection, without Airflow."""
