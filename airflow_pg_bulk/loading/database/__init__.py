"""A database as the source: a query or a table on another database, read by the COPY step
straight into staging, behind the same :class:`~airflow_pg_bulk.source.formats.Format` the
steps use for files (:class:`.format.DatabaseFormat`, chosen once by
:mod:`airflow_pg_bulk.loading.sources`). One module a job:

- :mod:`.urls`: the source URL, held in this process, masked in the plan and the log;
- :mod:`.connections`: sessions on the source (PostgreSQL's, SQLAlchemy's), errors in words;
- :mod:`.columns`: the source's columns, matched to the target's;
- :mod:`.ranges`: a split source's ranges (the key's quantiles, a table's blocks);
- :mod:`.snapshots`: a PostgreSQL source's exported snapshot, held while its ranges are read;
- :mod:`.format`: the source as prepare matches and cuts it;
- :mod:`.piece`: the COPY step's range, by the first of its ways that moves it
  (:func:`.piece.ways`): :mod:`.postgres_copy` (COPY to COPY), :mod:`.arrow_copy` (Arrow
  record batches), :mod:`.lines_copy` (COPY text lines made by a MariaDB/MySQL server) or
  :mod:`.rows_copy` (rows from a server-side cursor, read by the reader :mod:`.row_readers`
  chose: SQLAlchemy's, or mysql-connector-python's C extension for a PyMySQL URL); the
  PostgreSQL and the rows path fed through :mod:`.streaming` (a failure of the source, or a
  value the target refused, named), the others falling back to them;
- :mod:`.schema`: ``create_target``'s schema from the source.

The package sits in ``loading/`` (the steps, with their connections), not in ``source/``
(which reads bytes and runs no query) nor in ``db/`` (the driver adapters it uses,
:mod:`airflow_pg_bulk.db.copy_out`, :mod:`airflow_pg_bulk.db.source_driver` and
:mod:`airflow_pg_bulk.db.mysql_connector`, which know drivers, not plans).

Two readers, chosen once per source from its URL's backend (:attr:`DatabaseSource.postgres`):

- **PostgreSQL** moves bytes, not rows: ``COPY (query) TO STDOUT`` on the source connection
  (psycopg2's ``copy_expert``, its per-row loop in C, writing into an OS pipe from a thread:
  :class:`airflow_pg_bulk.db.copy_out.CopyOut`) is streamed into ``COPY staging (...) FROM
  STDIN`` on the target connection (either driver, through
  :func:`airflow_pg_bulk.db.driver.copy_in`), in the binary format where the column types
  match exactly, else in PostgreSQL's text format: no value is parsed in Python and memory
  stays flat (one chunk at a time). The PostgreSQL path does not import SQLAlchemy (its URL
  is read by :mod:`.urls`).
- **Any other database** (SQLite, MariaDB/MySQL, and whatever SQLAlchemy dialect is installed)
  streams rows from a server-side cursor (``stream_results``), fetched in batches straight
  from the DB-API cursor (``fetchmany``: the driver's tuples, no SQLAlchemy ``Row``:
  :mod:`.rows_copy`) and sent through :func:`airflow_pg_bulk.db.driver.copy_rows`: a psycopg 3
  target encodes them in C (``Copy.write_row``: 0.5 µs per row of four columns, against 0.7
  for the column-wise Python encoder and 1.2 for the row-wise one,
  benchmarks/RESULTS-db-source.md), a psycopg2 target, which has no row writer, gets them
  encoded as COPY text column by column (:func:`airflow_pg_bulk.source.copy_text.batch`).
  Rows are counted per batch as they are read, for the row accounting.
  A STRICT SQLite table is read instead by ADBC's SQLite driver as Arrow record batches,
  encoded as COPY CSV by Arrow (:mod:`.arrow_readers`, chosen once by prepare, and
  :mod:`.arrow_copy`, which falls back to the cursor for a range whose Arrow read fails).
  A MariaDB/MySQL source (``mysql+pymysql``, read by either reader) over a utf8mb4
  connection has the server make each row one COPY text line
  (:mod:`airflow_pg_bulk.sql.copy_lines`) where every column's type allows, fetched as one
  bytes value a row and written into COPY in chunks (:mod:`.lines_copy`, which falls back
  to the cursor's rows for a range it cannot read or whose values the target refuses).

What each COPY stream sees: without ``split_by`` one COPY stream reads the whole source in one
statement, so it sees one snapshot of the source. With ``split_by`` each range of the key
(:func:`airflow_pg_bulk.plan.planning.quantile_ranges`: cut at the key's quantiles, so a
skewed key still gives ranges of about equal row counts) is a statement of its own, in a
session of its own:

- **In one process** (the CLI, :func:`airflow_pg_bulk.runner.load`, ``dag.test()``), a
  PostgreSQL source's ranges all read one snapshot, as pgcopydb does: prepare opens a
  REPEATABLE READ session on the source, exports its snapshot (``pg_export_snapshot``), reads
  the key's quantiles in it, and holds it in this process (:func:`.snapshots.export`); each
  range's session imports it (``SET TRANSACTION SNAPSHOT``); the holding session ends after
  the last range is read (or when the process exits: :func:`.snapshots.release_snapshots`).
- **As separate Airflow COPY tasks** (other processes, later), the prepare task's session has
  ended, so each range reads the source as of its own start: a row written on the source in
  between may be seen by one range and not another (or, its key moved across ranges, twice
  or never). The guarantee offered there is the query's own bound: a query bounded by the
  data interval (``updated_at < '{{ data_interval_end }}'``) leaves later writes outside every
  range. Other databases (SQLAlchemy) read each range in its own transaction, in-process too.

The rows read from the source must equal the rows COPY loaded, or the COPY stream fails; a
source that fails midway (a query error on a later row, a lost connection) fails the COPY
stream and its transaction is rolled back: staging keeps nothing of it and the target is
untouched.

The source URL may carry a password: it stays in this process (:func:`.urls.hold`); the plan
(what travels through XCom) names it masked, or by its Airflow connection id (resolved by the
operator in each task: :func:`.urls.hold_connection`).
"""
