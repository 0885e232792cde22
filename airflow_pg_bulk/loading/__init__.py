"""load: the four steps of a load on a connection (prepare, copy, finalize, cleanup), no Airflow."""
