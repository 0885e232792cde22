"""When a load refreshes the target's planner statistics (ANALYZE).

A replace, a rebuild and a partition swap ANALYZE the new table before it becomes visible
(``build.build_on_staging``): every row in it is new. An in-place append or upsert adds
rows to a table that already has statistics; ANALYZE samples the whole table whatever the
batch (0.46 s on 27.4 M rows, measured: as long as the in-place insert of a day's 15,000
rows), so it runs only when the batch is a notable share of the table, the same share at
which autovacuum's own analyze starts (``autovacuum_analyze_scale_factor``, 0.1 by default).
A smaller batch is left to autovacuum, as a plain INSERT or COPY would be.
"""

from __future__ import annotations

import logging

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute
from airflow_pg_bulk.plan import LoadPlan
from airflow_pg_bulk.plan.figures import PhaseClock

log = logging.getLogger(__name__)

#: an in-place load ANALYZEs the target when it added at least this share of the target's rows
IN_PLACE_SHARE = 0.1


def worth_analyzing(loaded_rows: int, target_rows: int) -> bool:
    """Whether ``loaded_rows`` changed enough of a target of about ``target_rows`` rows (the
    catalog's estimate before the load; -1 or 0: never analyzed or empty) to ANALYZE it."""
    if target_rows <= 0:
        return loaded_rows > 0
    return loaded_rows >= IN_PLACE_SHARE * target_rows


def after_in_place(
    conn: DatabaseConnection, plan: LoadPlan, clock: PhaseClock, loaded_rows: int
) -> None:
    """After an in-place append or upsert has committed: ANALYZE the target when the option
    asks for it and the batch is worth it (:func:`worth_analyzing`), else say why not."""
    if not plan.settings.analyze:
        return
    t = plan.target
    # reltuples is the estimate of the last VACUUM/ANALYZE: the rows before this load
    target_rows = execute(conn, sql.target_size(t.oid))[0][1]
    conn.commit()
    if not worth_analyzing(loaded_rows, target_rows):
        log.info(
            "Load %s: %d rows into about %d: under %.0f%% of %s, its statistics are left to "
            "autovacuum (run ANALYZE if queries need the new rows' values at once)",
            plan.load_id,
            loaded_rows,
            target_rows,
            IN_PLACE_SHARE * 100,
            t.qualified,
        )
        return
    with clock.phase("analyze"):
        execute(conn, sql.analyze(t.schema, t.table))
        conn.commit()
