"""When a load refreshes the target's planner statistics (ANALYZE).

A replace, a rebuild and a partition swap ANALYZE the new table before it becomes visible
(``build.build_on_staging``): every row in it is new. An in-place append or upsert adds
rows to a table that already has statistics; ANALYZE samples the whole table whatever the
batch (0.46 s on 27.4 M rows, measured: as long as the in-place insert of a day's 15,000
rows), so it runs only when it pays: when the rows the load changed (inserted and updated)
are a notable share of the table's rows, the same share at which autovacuum's own analyze
starts (``autovacuum_analyze_scale_factor``, 0.1 by default). A smaller batch is left to
autovacuum, as a plain INSERT or COPY would be.

The table's rows are the catalog's estimate before the load, read without touching the
table (:func:`estimate`): ``reltuples``, summed over the leaf partitions of a partitioned
target (its parent has none: autovacuum never ANALYZEs a partitioned table, so its own
``reltuples`` stays -1 and every small load into it used to ANALYZE every partition: 1.19 of
1.69 s for an upsert of 1,600 rows, issue 21); a table or leaf never analyzed nor vacuumed
(``reltuples`` -1) counts its size over :data:`UNKNOWN_ROW_BYTES`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, execute_outside_transaction
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.plan.figures import PhaseClock

log = logging.getLogger(__name__)

#: an in-place load ANALYZEs the target when it changed at least this share of the target's rows
IN_PLACE_SHARE = 0.1

#: the bytes of heap per row assumed for a table whose rows were never counted: a narrow row
#: (23-byte header, 4-byte line pointer, a few columns); it over-counts wider rows, so that a
#: big table never analyzed is not sampled for a small batch (autovacuum analyzes it soon:
#: it counts such a table as empty)
UNKNOWN_ROW_BYTES = 64


def worth_analyzing(changed_rows: int, target_rows: int) -> bool:
    """Whether ``changed_rows`` (inserted and updated) changed enough of a target of about
    ``target_rows`` rows (:func:`estimate`, before the load; 0: empty) to ANALYZE it."""
    if target_rows <= 0:
        return changed_rows > 0
    return changed_rows >= IN_PLACE_SHARE * target_rows


def estimate(conn: DatabaseConnection, schema: str, table: str) -> int:
    """A table's rows as the catalog estimates them (see the module's docstring)."""
    return int(execute(conn, sql.estimated_rows(schema, table, UNKNOWN_ROW_BYTES))[0][0])


def after_in_place(
    conn: DatabaseConnection, plan: LoadPlan, clock: PhaseClock, changed_rows: int
) -> None:
    """After an in-place append or upsert has committed: ANALYZE the target when the option
    asks for it and the batch is worth it (:func:`worth_analyzing`), else say why not."""
    if not plan.settings.analyze:
        return
    t = plan.target
    # reltuples is the estimate of the last VACUUM/ANALYZE: the rows before this load
    target_rows = estimate(conn, t.schema, t.table)
    conn.commit()
    if not worth_analyzing(changed_rows, target_rows):
        log.info(
            "Load %s: %d rows changed of about %d: under %.0f%% of %s, its statistics are left "
            "to autovacuum (run ANALYZE if queries need the new rows' values at once)",
            plan.load_id,
            changed_rows,
            target_rows,
            IN_PLACE_SHARE * 100,
            t.qualified,
        )
        return
    log.info(
        "Load %s: %d rows changed of about %d in %s: ANALYZE",
        plan.load_id,
        changed_rows,
        target_rows,
        t.qualified,
    )
    with clock.phase("analyze"):
        execute(conn, sql.analyze(t.schema, t.table))
        conn.commit()


def after_partitions_in_place(
    conn: DatabaseConnection,
    plan: LoadPlan,
    clock: PhaseClock,
    loaded: Sequence[tuple[str, str, int | None]],
) -> None:
    """After a partition-wise finalize has committed: ANALYZE each partition loaded in place
    (schema, name, rows inserted; None: every row of it is new, a replace's) whose rows
    changed enough (:func:`worth_analyzing` against its own estimate); the others are left to
    autovacuum, which ANALYZEs partitions as it does tables."""
    if not plan.settings.analyze:
        return
    worth = []
    for schema, table, rows in loaded:
        if rows is None or worth_analyzing(rows, estimate(conn, schema, table)):
            worth.append((schema, table))
    conn.commit()
    if len(worth) < len(loaded):
        log.info(
            "Load %s: %d of %d table partitions loaded in place got under %.0f%% of their rows: "
            "their statistics are left to autovacuum",
            plan.load_id,
            len(loaded) - len(worth),
            len(loaded),
            IN_PLACE_SHARE * 100,
        )
    if not worth:
        return
    with clock.phase("analyze"):
        for schema, table in worth:  # (autocommit: one round trip each)
            execute_outside_transaction(conn, sql.analyze(schema, table))
