"""Taking the swap's ACCESS EXCLUSIVE lock without making readers queue behind it.

A lock request that waits blocks every later request that conflicts with it: while the swap
waits for ACCESS EXCLUSIVE, every reader of the target queues behind it. It waits longest
for autovacuum, which works on a table after every big load: PostgreSQL cancels an
autovacuum that blocks a lock request only after ``deadlock_timeout`` (1 s by default, a
superuser setting), and meanwhile readers stall (measured: 1,014 ms, README "Modes").

So the swap locks in two steps:

1. ``SHARE UPDATE EXCLUSIVE``, waiting up to ``lock_timeout``. It conflicts with autovacuum
   (and VACUUM, ANALYZE, other DDL) but with no reader or writer, so waiting for it stalls
   nobody; after ``deadlock_timeout`` PostgreSQL cancels an autovacuum that blocks it (not
   one preventing wraparound), and once held, no autovacuum can start on the table.
2. ``ACCESS EXCLUSIVE`` in short tries (:data:`TRY_MS` each, at a savepoint), with pauses
   between them, until ``lock_timeout`` has passed: a reader waits at most one try.

Readers wait, too, for everything the swap does once it holds ACCESS EXCLUSIVE: work that only
needs the definition to stay as it is (reading the catalog to check it) is done between the two
steps (``under_share_update``): SHARE UPDATE EXCLUSIVE already keeps out every DDL that takes a
lock on the tables.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    is_database_error,
    scalar,
    server_error,
)
from airflow_pg_bulk.errors import LOCK_NOT_AVAILABLE, TransientLoadError

log = logging.getLogger(__name__)

TRY_MS = 20  # the longest a reader queues behind one try
PAUSE_SECONDS = (0.02, 0.25)  # between tries: from the first, doubling up to the last
_SAVEPOINT = "pgbulk_lock"
_KEPT = "pgbulk.lock_timeout"  # where a try keeps the transaction's lock_timeout


def lock_for_swap(
    conn: DatabaseConnection,
    tables: Sequence[tuple[str, str]],
    under_share_update: Callable[[], None] | None = None,
    *,
    only: bool = False,
    share_update_held: bool = False,
) -> int:
    """Hold ACCESS EXCLUSIVE on ``tables`` (the target first) in the current transaction,
    under the session's ``lock_timeout`` in all, without queueing readers for longer than
    :data:`TRY_MS` at a time. Returns the number of tries. Raises
    :class:`~airflow_pg_bulk.errors.TransientLoadError` (SQLSTATE 55P03) when the time is up.

    :param under_share_update: called once SHARE UPDATE EXCLUSIVE is held, before the tries
        (readers go on meanwhile): checks of the definition, which no DDL can change from then
        on.
    :param only: lock a partitioned table alone, not its partitions (``LOCK TABLE ONLY``).
    :param share_update_held: the caller holds SHARE UPDATE EXCLUSIVE on ``tables`` already
        (taken in that order), and checked what it needed under it: not taken again."""
    start = time.monotonic()
    budget_ms: int | None = None  # lock_timeout, read when a try fails (not when it is granted)
    if not share_update_held:
        execute(conn, sql.lock_tables(tables, "SHARE UPDATE EXCLUSIVE", only=only))
    if under_share_update is not None:
        under_share_update()
    pause = PAUSE_SECONDS[0]
    tries = 0
    while True:
        tries += 1
        try:
            # one round trip when the lock is granted (the usual case): lock_timeout kept
            # aside by the server and put back, the client reads nothing; the settings made
            # after the savepoint go back with it when the lock is not
            execute(
                conn,
                sql.in_one_round_trip(
                    sql.savepoint(_SAVEPOINT),
                    sql.copy_setting("lock_timeout", _KEPT),
                    sql.set_config("lock_timeout", f"{TRY_MS}ms", local=True),
                    sql.lock_tables(tables, "ACCESS EXCLUSIVE", only=only),
                    sql.release(_SAVEPOINT),
                    sql.copy_setting(_KEPT, "lock_timeout"),
                ),
            )
        except Exception as exc:
            if not is_database_error(exc) or server_error(exc).sqlstate != LOCK_NOT_AVAILABLE:
                raise
            execute(conn, sql.rollback_to(_SAVEPOINT))
            if budget_ms is None:  # (lock_timeout as it was: the savepoint undid the try's)
                budget_ms = scalar(conn, sql.setting_milliseconds("lock_timeout")) or 0
            deadline = start + budget_ms / 1000 if budget_ms else None
            if deadline is not None and time.monotonic() + pause > deadline:
                names = ", ".join(".".join(t) for t in tables)
                raise TransientLoadError(
                    f"lock timeout: could not lock {names} for the swap within lock_timeout "
                    f"({budget_ms} ms, {tries} tries of {TRY_MS} ms each): other sessions "
                    "kept using it. Nothing was swapped; a retry goes on where this attempt "
                    "stopped",
                    sqlstate=LOCK_NOT_AVAILABLE,
                ) from exc
            time.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, PAUSE_SECONDS[1])
            continue
        if tries > 1:
            log.info("Locked %s for the swap after %d tries", tables[0][1], tries)
        return tries
