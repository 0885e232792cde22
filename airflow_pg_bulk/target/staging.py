"""The staging table: created for a plan, what is on it, and the check that no crash emptied it.

Every way of making rows visible (:mod:`airflow_pg_bulk.target.strategies`) creates its staging
with one of :func:`create_like` or :func:`create_columns` (a partitioned target's, with
:func:`airflow_pg_bulk.target.partitioned.create_staging`), and checks with
:func:`check_rows` or :func:`check_count` that staging still holds the rows the ledger records.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    execute_outside_transaction,
    rollback_quietly,
    scalar,
)
from airflow_pg_bulk.errors import IncompleteLoadError
from airflow_pg_bulk.plan import LoadPlan, TargetDefinition
from airflow_pg_bulk.plan.codes import Identity

#: what a staging table has: (kind, name) -> its state (``("index", name)``: valid;
#: ``("constraint", name)``: validated; ``("persistence", code)``: None)
Existing = dict[tuple[str, str], bool | None]


def overrides_identity(target: TargetDefinition, columns: Sequence[str]) -> bool:
    """Whether an INSERT of ``columns`` into ``target`` needs ``OVERRIDING SYSTEM VALUE``:
    one of them is a ``GENERATED ALWAYS`` identity."""
    return any(c.identity == Identity.ALWAYS and c.name in columns for c in target.columns)


def create_like(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """Staging LIKE the target (a replace, an append that rebuilds: the table swapped in). An
    identity column not loaded is a plain column numbered from the target's own sequence, as
    an INSERT into the target would be (no value it handed out is used again); the swap makes
    it an identity again (:func:`airflow_pg_bulk.target.swap.swap_in`)."""
    t = plan.target
    version = scalar(conn, sql.server_version())
    execute(
        conn,
        sql.create_staging_like(
            t.schema,
            plan.staging_table,
            t.table,
            logged=plan.staging_logged,
            server_version=version,
        ),
    )
    for seq in t.sequences:
        if seq.kind.of_identity_column and seq.column not in plan.columns:
            execute(conn, sql.drop_identity(t.schema, plan.staging_table, seq.column))
            execute(
                conn,
                sql.default_from_sequence(
                    t.schema, plan.staging_table, seq.column, (seq.schema, seq.name)
                ),
            )


def create_columns(conn: DatabaseConnection, plan: LoadPlan) -> None:
    """Staging with the loaded columns of the target only (rows inserted or merged from it)."""
    t = plan.target
    execute(
        conn,
        sql.create_staging_columns(
            t.schema, plan.staging_table, t.table, plan.columns, logged=plan.staging_logged
        ),
    )


def existing_objects(conn: DatabaseConnection, plan: LoadPlan) -> Existing:
    """What ``plan.staging_table`` has already (its indexes, constraints, persistence), each
    with its state (an index: valid; a constraint: validated): what an earlier attempt built
    and a retry skips. Committed (in autocommit, one round trip, when no transaction is open)."""
    rows = execute_outside_transaction(
        conn, sql.staging_state(plan.target.schema, plan.staging_table)
    )
    return {(kind, name): flag for kind, name, flag in rows}


def check_count(conn: DatabaseConnection, plan: LoadPlan, staged: int, rows: int) -> None:
    """Refuse to go on when staging holds ``staged`` rows but the ledger records ``rows``: a
    server crash emptied the unlogged staging after some partitions had committed. The
    transaction is rolled back; nothing reached the target."""
    if staged == rows:
        return
    rollback_quietly(conn)
    raise IncompleteLoadError(
        f"load {plan.load_id}: the unlogged staging table {plan.staging_table} holds {staged} "
        f"rows but the ledger records {rows}: a server crash emptied it after some COPY streams "
        f"had committed. Nothing reached {plan.target.qualified}; run the whole load again "
        "(clear its prepare task)"
    )


def check_rows(
    conn: DatabaseConnection, plan: LoadPlan, rows: int, tables: list[str] | None = None
) -> None:
    """:func:`check_count` on the rows of ``tables`` (default: ``plan.staging_table``)."""
    schema = plan.target.schema
    staged = sum(
        scalar(conn, sql.count_rows(schema, name)) for name in tables or [plan.staging_table]
    )
    check_count(conn, plan, staged, rows)
