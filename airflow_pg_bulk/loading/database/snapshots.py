"""A PostgreSQL source's exported snapshot, held in this process while its ranges are read
(as pgcopydb does): exported by prepare (:func:`export`), imported by each range's session
(:func:`held`), released after the last range (:func:`range_done`), when a load ends
(:func:`release_snapshot`), around a prepare or preview that fails
(:func:`snapshots_released`) or when the process exits (:func:`release_snapshots`)."""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from airflow_pg_bulk.db import driver
from airflow_pg_bulk.loading.database.connections import open_postgres
from airflow_pg_bulk.loading.database.ranges import postgres_quantiles
from airflow_pg_bulk.plan import DatabaseSource
from airflow_pg_bulk.sql import source as source_sql


@dataclass
class _Held:
    """A source session holding an exported snapshot, until its ranges are all read."""

    conn: Any
    ranges: int = 0


# snapshot id -> the session that exported it, in this process only
_SNAPSHOTS: dict[str, _Held] = {}
_SNAPSHOTS_LOCK = threading.Lock()


def export(source: DatabaseSource, count: int) -> tuple[str, tuple[Any, ...]]:
    """Open a session on a PostgreSQL source, export its snapshot and hold it in this process;
    the split key's quantiles read in that snapshot (:func:`.ranges.postgres_quantiles`).
    Returns ``(snapshot, (min, cut, cut, ...))``."""
    assert source.split_by is not None
    conn = open_postgres(source.name)
    try:
        driver.execute(conn, source_sql.repeatable_read())
        snapshot = driver.execute(conn, source_sql.export_snapshot())[0][0]
        quantiles = postgres_quantiles(conn, source, count)
    except BaseException:
        driver.close_cancelling(conn)
        raise
    with _SNAPSHOTS_LOCK:
        _SNAPSHOTS[snapshot] = _Held(conn)
    exported = getattr(_PREPARING, "exported", None)
    if exported is not None:
        exported.append(snapshot)
    return snapshot, quantiles


#: the snapshots a prepare running in this thread exported (:func:`snapshots_released`)
_PREPARING = threading.local()


@contextlib.contextmanager
def snapshots_released(*, unless_prepared: bool) -> Iterator[None]:
    """Around a prepare or a preview: a snapshot it exported in this thread is released when
    it ends, or, ``unless_prepared``, only when it fails (a refusal after the source was read,
    such as an upsert key that is not unique), since a prepared plan's COPY streams read it.
    The session holding it would otherwise stay open until the process ends, holding back
    vacuum on the source."""
    outer = getattr(_PREPARING, "exported", None)
    mine: list[str] = []
    _PREPARING.exported = mine
    prepared = False
    try:
        yield
        prepared = unless_prepared
    finally:
        _PREPARING.exported = outer
        if not prepared:
            for snapshot in mine:
                _release(snapshot)


def held(snapshot: str | None) -> str | None:
    """``snapshot`` if this process holds it (in-process ranges); else None: an Airflow COPY
    task in another process reads in a snapshot of its own (see the module's docstring)."""
    with _SNAPSHOTS_LOCK:
        return snapshot if snapshot in _SNAPSHOTS else None


def expect_ranges(source: DatabaseSource | None, count: int) -> None:
    """``count`` ranges will read the snapshot of ``source`` (a database source cut into its
    COPY streams), if this process holds it: the holding session ends after the last."""
    snapshot = source.snapshot if source is not None else None
    with _SNAPSHOTS_LOCK:
        held = _SNAPSHOTS.get(snapshot) if snapshot else None
        if held is not None:
            held.ranges = count


def range_done(snapshot: str | None) -> None:
    """One range of ``snapshot`` read (or failed): after the last, the holding session ends."""
    with _SNAPSHOTS_LOCK:
        held = _SNAPSHOTS.get(snapshot) if snapshot else None
        if held is None:
            return
        held.ranges -= 1
        if held.ranges > 0:
            return
        del _SNAPSHOTS[snapshot]  # type: ignore[arg-type]
    driver.close_cancelling(held.conn)


def release_snapshot(source: DatabaseSource | None) -> None:
    """End the session holding the snapshot of ``source`` (a load's database source, or
    None), if this process still holds it: a load whose ranges were not all read (one failed
    and the others never started) would otherwise keep it, and with it the source's oldest
    snapshot (no vacuum behind it), until the process ends."""
    if source is not None and source.snapshot:
        _release(source.snapshot)


def _release(snapshot: str) -> None:
    with _SNAPSHOTS_LOCK:
        held = _SNAPSHOTS.pop(snapshot, None)
    if held is not None:
        driver.close_cancelling(held.conn)


@atexit.register
def release_snapshots() -> None:
    """End every session still holding a snapshot (a load that stopped before its ranges
    were all read)."""
    with _SNAPSHOTS_LOCK:
        held = list(_SNAPSHOTS.values())
        _SNAPSHOTS.clear()
    for each in held:
        driver.close_cancelling(each.conn)
