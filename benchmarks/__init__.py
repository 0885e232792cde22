"""The benchmark suite of airflow-pg-bulk: ``python -m benchmarks.run --help``.

It loads the same files into the same PostgreSQL server by every method (row INSERTs, COPY,
the postgres provider's hook, this project's pipeline in-process and as an Airflow DAG, and
the peer tools pgloader and pgcopydb), and writes the figures to ``benchmarks/RESULTS.md``.
"""
