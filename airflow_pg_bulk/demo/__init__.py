"""The demo: a throwaway PostgreSQL, the smart-meter workload, and a run under Airflow."""
