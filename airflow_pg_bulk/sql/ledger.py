"""SQL of staging, the ledger and the pieces table: claim, record, misaligned ranges, COPY."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from airflow_pg_bulk.plan import CopyOptions
from airflow_pg_bulk.sql.compose import column_names, table_identifier

# --- staging and ledger ----------------------------------------------------------------------


def create_staging_like(
    schema: str, staging: str, table: str, *, logged: bool, server_version: int
) -> Composed:
    """A table with the target's columns, defaults, identity and generated columns, NOT NULL,
    storage and compression, and no indexes, constraints or triggers; autovacuum off."""
    include = ["DEFAULTS", "IDENTITY", "GENERATED", "STORAGE"]
    if server_version >= 140000:
        include.append("COMPRESSION")
    including = SQL(" ").join(SQL("INCLUDING " + word) for word in include)
    return SQL("CREATE {}TABLE {} (LIKE {} {}) WITH (autovacuum_enabled = false)").format(
        SQL("" if logged else "UNLOGGED "),
        table_identifier(schema, staging),
        table_identifier(schema, table),
        including,
    )


def create_staging_columns(
    schema: str, staging: str, table: str, columns: Sequence[str], *, logged: bool
) -> Composed:
    """A bare table with just the loaded columns' types (no NOT NULL, no defaults): the target
    itself checks every row when they are inserted from it."""
    return SQL(
        "CREATE {}TABLE {} WITH (autovacuum_enabled = false) AS SELECT {} FROM {} WITH NO DATA"
    ).format(
        SQL("" if logged else "UNLOGGED "),
        table_identifier(schema, staging),
        column_names(columns),
        table_identifier(schema, table),
    )


def create_ledger(schema: str, ledger: str) -> Composed:
    """The ledger: a partition's row is committed in the same transaction as its data."""
    return SQL(
        "CREATE TABLE {} (partition integer PRIMARY KEY, rows bigint NOT NULL DEFAULT 0,"
        " bytes bigint NOT NULL DEFAULT 0, seconds double precision NOT NULL DEFAULT 0,"
        " rejects bigint NOT NULL DEFAULT 0, loaded_at timestamptz NOT NULL DEFAULT now(),"
        " misaligned boolean NOT NULL DEFAULT false,"
        " copy_xid bigint NOT NULL DEFAULT txid_current() % 4294967296)"
    ).format(table_identifier(schema, ledger))


def create_pieces(schema: str, name: str) -> Composed:
    """The load's pieces: one row per partition, its pieces as the text of a JSON array, ASCII
    only (kept as text: ``jsonb`` would turn ``\\u`` escapes into characters the database's
    encoding may lack); dropped with staging and the ledger."""
    return SQL(
        "CREATE TABLE {} (partition integer PRIMARY KEY, pieces text NOT NULL)"
        " WITH (autovacuum_enabled = false)"
    ).format(table_identifier(schema, name))


def insert_pieces(schema: str, name: str, rows: Sequence[tuple[int, str]]) -> Composed:
    """Store the pieces of each partition: ``(partition, pieces as JSON text)``."""
    values = SQL(", ").join(
        SQL("({}, {})").format(Literal(index), Literal(text)) for index, text in rows
    )
    return SQL("INSERT INTO {} (partition, pieces) VALUES {}").format(
        table_identifier(schema, name), values
    )


def select_pieces(schema: str, name: str, partitions: Sequence[int]) -> Composed:
    """The stored pieces (JSON text) of these partitions."""
    return SQL(
        "SELECT partition, pieces FROM {} WHERE partition = ANY({}::integer[]) ORDER BY partition"
    ).format(table_identifier(schema, name), Literal(list(partitions)))


def create_reject_table(schema: str, name: str) -> Composed:
    """Where rejected rows go (kept after the load; one row per rejected source record)."""
    return SQL(
        "CREATE TABLE IF NOT EXISTS {} (load_id text NOT NULL, target text NOT NULL,"
        " source_file text NOT NULL, line bigint, raw_line text, error text NOT NULL,"
        " rejected_at timestamptz NOT NULL DEFAULT now())"
    ).format(table_identifier(schema, name))


def insert_reject(
    schema: str,
    name: str,
    *,
    load_id: str,
    target: str,
    source_file: str,
    line: int,
    raw_line: str,
    error: str,
) -> Composed:
    """Record one rejected row (same transaction as its partition's good rows)."""
    return SQL(
        "INSERT INTO {} (load_id, target, source_file, line, raw_line, error)"
        " VALUES ({}, {}, {}, {}, {}, {})"
    ).format(
        table_identifier(schema, name),
        Literal(load_id),
        Literal(target),
        Literal(source_file),
        Literal(line),
        Literal(raw_line),
        Literal(error),
    )


def savepoint(name: str) -> Composed:
    """Mark a point the partition's transaction can roll back to."""
    return SQL("SAVEPOINT {}").format(Identifier(name))


def rollback_to(name: str) -> Composed:
    """Undo back to the savepoint (which stays)."""
    return SQL("ROLLBACK TO SAVEPOINT {}").format(Identifier(name))


def release(name: str) -> Composed:
    """Forget the savepoint, keeping its work."""
    return SQL("RELEASE SAVEPOINT {}").format(Identifier(name))


def drop_table(schema: str, name: str, *, if_exists: bool = False) -> Composed:
    """``DROP TABLE`` without CASCADE: anything unexpected depending on it stops the drop."""
    return SQL("DROP TABLE {}{}").format(
        SQL("IF EXISTS " if if_exists else ""), table_identifier(schema, name)
    )


def claim_partition(schema: str, ledger: str, partition: int) -> Composed:
    """Insert the partition's ledger row; returns nothing if it was committed before."""
    return SQL(
        "INSERT INTO {} (partition) VALUES ({}) ON CONFLICT (partition) DO NOTHING"
        " RETURNING partition"
    ).format(table_identifier(schema, ledger), Literal(partition))


def record_partition(
    schema: str,
    ledger: str,
    partition: int,
    rows: int,
    nbytes: int,
    seconds: float,
    rejects: int = 0,
) -> Composed:
    """Fill in the partition's figures (same transaction as its rows)."""
    return SQL(
        "UPDATE {} SET rows = {}, bytes = {}, seconds = {}, rejects = {} WHERE partition = {}"
    ).format(
        table_identifier(schema, ledger),
        Literal(rows),
        Literal(nbytes),
        Literal(seconds),
        Literal(rejects),
        Literal(partition),
    )


def partition_figures(schema: str, ledger: str, partition: int) -> Composed:
    """The committed figures of one partition."""
    return SQL("SELECT rows, bytes, seconds, rejects FROM {} WHERE partition = {}").format(
        table_identifier(schema, ledger), Literal(partition)
    )


# --- ranges whose guessed start was wrong (see ranges.py) ------------------------------------


def record_misaligned(schema: str, ledger: str, partition: int) -> Composed:
    """Commit a partition with no rows, marked for finalize to load again from exact bounds."""
    return SQL(
        "INSERT INTO {} (partition, misaligned) VALUES ({}, true)"
        " ON CONFLICT (partition) DO UPDATE SET misaligned = true"
    ).format(table_identifier(schema, ledger), Literal(partition))


def misaligned_partitions(schema: str, ledger: str) -> Composed:
    """The partitions marked for loading again."""
    return SQL("SELECT partition FROM {} WHERE misaligned ORDER BY partition").format(
        table_identifier(schema, ledger)
    )


def mark_misaligned(schema: str, ledger: str, partitions: Sequence[int]) -> Composed:
    """Mark committed partitions for loading again (before any of their rows is deleted)."""
    return SQL("UPDATE {} SET misaligned = true WHERE partition = ANY({})").format(
        table_identifier(schema, ledger), Literal(list(partitions))
    )


def delete_partition_rows(schema: str, staging: str, ledger: str, partition: int) -> Composed:
    """Delete a partition's rows from staging: the rows its COPY transaction wrote, whose
    ``xmin`` is the transaction id the partition's ledger row recorded (``copy_xid``)."""
    return SQL(
        "DELETE FROM {} WHERE xmin::text::bigint = (SELECT copy_xid FROM {} WHERE partition = {})"
    ).format(
        table_identifier(schema, staging), table_identifier(schema, ledger), Literal(partition)
    )


def forget_partition(schema: str, ledger: str, partition: int) -> Composed:
    """Remove a partition's ledger row (in the transaction that loads it again)."""
    return SQL("DELETE FROM {} WHERE partition = {}").format(
        table_identifier(schema, ledger), Literal(partition)
    )


FINALIZED = -1  # the ledger row that says the load became visible


def mark_finalized(schema: str, ledger: str, rows: int, nbytes: int, rejects: int) -> Composed:
    """Note in the ledger, in the transaction that makes the load visible, that it did: a
    finalize retried after that commit (its acknowledgement lost) then does nothing."""
    return SQL(
        "INSERT INTO {} (partition, rows, bytes, rejects) VALUES ({}, {}, {}, {})"
        " ON CONFLICT (partition) DO NOTHING"
    ).format(
        table_identifier(schema, ledger),
        Literal(FINALIZED),
        Literal(rows),
        Literal(nbytes),
        Literal(rejects),
    )


def ledger_rows(schema: str, ledger: str) -> Composed:
    """Every committed partition with its figures."""
    return SQL("SELECT partition, rows, bytes, seconds, rejects FROM {} ORDER BY partition").format(
        table_identifier(schema, ledger)
    )


def copy_span(schema: str, ledger: str) -> Composed:
    """First COPY start and last COPY end of the committed partitions (``loaded_at`` is the
    start of the partition's transaction), and the server's clock now; epoch seconds."""
    return SQL(
        "SELECT extract(epoch FROM min(loaded_at)),"
        " extract(epoch FROM max(loaded_at + seconds * interval '1 second')),"
        " extract(epoch FROM clock_timestamp()) FROM {} WHERE partition <> {}"
    ).format(table_identifier(schema, ledger), Literal(FINALIZED))


def relation_exists(schema: str, name: str) -> Composed:
    """Whether a table (or any relation) of that name exists."""
    return SQL("SELECT to_regclass({}) IS NOT NULL").format(
        Literal(Identifier(schema, name).as_string())
    )


def relation_size(schema: str, name: str) -> Composed:
    """Size of a table's main fork in bytes (0 after a crash emptied an unlogged table); of a
    partitioned table, its partitions' together."""
    return SQL(
        "SELECT coalesce((SELECT sum(pg_relation_size(relid))"
        " FROM pg_partition_tree({0}::regclass)), pg_relation_size({0}::regclass))"
    ).format(Literal(Identifier(schema, name).as_string()))


def copy_from_stdin(
    schema: str,
    staging: str,
    columns: Sequence[str],
    opts: CopyOptions,
    *,
    skip_bad_values: bool = False,
    reject_limit: int | None = None,
) -> Composed:
    """``COPY staging (columns) FROM STDIN WITH (...)``: never a server-side file.

    ``skip_bad_values`` (PostgreSQL 17+): ``ON_ERROR ignore`` with a NOTICE per skipped row;
    ``reject_limit`` (18+): fail after that many skipped rows."""
    options: list[Composable] = [
        SQL("FORMAT {}").format(SQL(opts.format)),
        SQL("DELIMITER {}").format(Literal(opts.effective_delimiter)),
        SQL("ENCODING {}").format(Literal(opts.encoding)),
    ]
    if opts.null is not None:
        options.append(SQL("NULL {}").format(Literal(opts.null)))
    if opts.format.is_csv:
        options.append(SQL("QUOTE {}").format(Literal(opts.quote)))
        options.append(SQL("ESCAPE {}").format(Literal(opts.effective_escape)))
    if skip_bad_values:
        options.append(SQL("ON_ERROR ignore"))
        options.append(SQL("LOG_VERBOSITY verbose"))
    if reject_limit is not None:
        options.append(SQL("REJECT_LIMIT {}").format(Literal(reject_limit)))
    return SQL("COPY {} ({}) FROM STDIN WITH ({})").format(
        table_identifier(schema, staging), column_names(columns), SQL(", ").join(options)
    )
