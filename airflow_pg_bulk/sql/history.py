"""SQL of the plan a ledger belongs to and of the history of finalized loads (pgbulk_loads)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from psycopg.sql import SQL, Composed, Identifier, Literal

from airflow_pg_bulk.plan.codes import Mode
from airflow_pg_bulk.sql.compose import table_identifier
from airflow_pg_bulk.sql.ledger import FINALIZED

# --- the plan a ledger belongs to, and the history of finalized loads ------------------------


def ledger_digest(schema: str, ledger: str) -> Composed:
    """The digest of the plan the ledger was made for (the first line of its comment: see
    :func:`airflow_pg_bulk.steps.ledger_comment`), or NULL."""
    return SQL(
        "SELECT split_part(obj_description(to_regclass({}), 'pg_class'), chr(10), 1)"
    ).format(Literal(Identifier(schema, ledger).as_string()))


def load_ledgers(schema: str, pattern: str) -> Composed:
    """Every load's ledger in ``schema`` (``pattern``:
    :data:`airflow_pg_bulk.naming.LEDGER_PATTERN`), with its comment. A load's tables last as
    long as its ledger: cleanup drops it last."""
    return SQL(
        "SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = {}"
        " AND c.relname LIKE {} AND c.relkind = 'r' ORDER BY c.relname"
    ).format(Literal(schema), Literal(pattern))


def ledger_activity(schema: str, ledger: str) -> Composed:
    """Whether the load was finalized, the end of its last committed COPY (epoch seconds, NULL
    if none), and the server's clock (epoch seconds)."""
    return SQL(
        "SELECT coalesce(bool_or(partition = {}), false),"
        " extract(epoch FROM max(loaded_at + seconds * interval '1 second'))::float8,"
        " extract(epoch FROM now())::float8 FROM {}"
    ).format(Literal(FINALIZED), table_identifier(schema, ledger))


def load_sessions(application_prefix: str) -> Composed:
    """How many other sessions are named ``<application_prefix>…`` (a load's steps name theirs
    ``pgbulk:<load id>:…``; see :func:`airflow_pg_bulk.naming.application_name`)."""
    return SQL(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        " AND starts_with(application_name, {})"
    ).format(Literal(application_prefix))


def terminate_load_sessions(application_prefix: str) -> Composed:
    """End the other sessions named ``<application_prefix>…`` (a stopped load's: a COPY FROM
    STDIN waiting for its client takes no cancel until data comes); how many."""
    return SQL(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE pid <> pg_backend_pid() AND starts_with(application_name, {})"
    ).format(Literal(application_prefix))


def now_epoch() -> SQL:
    """The server's clock (the transaction's start), in epoch seconds."""
    return SQL("SELECT extract(epoch FROM now())::float8")


def interval_seconds(text: str) -> Composed:
    """A PostgreSQL interval (``1d``, ``12 hours``) in seconds; an error if it is not one."""
    return SQL("SELECT date_part('epoch', {}::interval)").format(Literal(text))


#: the load history's columns that the ordering rule added (an older history gets them by
#: :func:`upgrade_load_history`): the DAG task that loads the target (its scope), the run, its
#: data interval, and the partitions a ``replace_partitions`` swapped (NULL: the whole target)
LOAD_HISTORY_ORDER_COLUMNS = ("scope", "run_id", "interval_start", "interval_end", "parts")


def create_load_history(schema: str, name: str) -> Composed:
    """One row per finalized load, kept (a few, see :func:`trim_load_history`): what made
    each load visible, and when, for which run and data interval."""
    return SQL(
        "CREATE TABLE {} (load_id text PRIMARY KEY, target text NOT NULL, mode text NOT NULL,"
        " logical_date timestamptz, rows bigint NOT NULL, rejects bigint NOT NULL DEFAULT 0,"
        " finalized_at timestamptz NOT NULL DEFAULT now(), scope text, run_id text,"
        " interval_start timestamptz, interval_end timestamptz, parts text[])"
    ).format(table_identifier(schema, name))


def missing_columns(schema: str, name: str, columns: Sequence[str]) -> Composed:
    """Which of ``columns`` the table lacks."""
    return SQL(
        "SELECT c FROM unnest({}) AS c WHERE NOT EXISTS (SELECT FROM pg_attribute"
        " WHERE attrelid = to_regclass({}) AND attname = c AND NOT attisdropped)"
    ).format(text_array(columns), Literal(Identifier(schema, name).as_string()))


def load_history_state(schema: str, name: str, columns: Sequence[str], index: str) -> Composed:
    """In one query: whether the table exists, which of ``columns`` it lacks (text[]), and
    whether the index ``index`` (in the same schema) exists."""
    table = Literal(Identifier(schema, name).as_string())
    return SQL(
        "SELECT to_regclass({0}) IS NOT NULL, ARRAY(SELECT c FROM unnest({1}) AS c WHERE NOT"
        " EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass({0}) AND attname = c"
        " AND NOT attisdropped)), to_regclass({2}) IS NOT NULL"
    ).format(table, text_array(columns), Literal(Identifier(schema, index).as_string()))


def writable_unless_missing(schema: str, name: str, privileges: Sequence[str]) -> Composed:
    """Whether the table is missing, or the session's role holds every one of ``privileges``
    on it (one query)."""
    table = Literal(Identifier(schema, name).as_string())
    return SQL("SELECT CASE WHEN to_regclass({}) IS NULL THEN true ELSE {} END").format(
        table,
        SQL(" AND ").join(
            SQL("has_table_privilege({}, {})").format(table, Literal(p)) for p in privileges
        ),
    )


def upgrade_load_history(schema: str, name: str) -> Composed:
    """Give a load history made by an earlier version the ordering rule's columns."""
    types = {
        "scope": "text",
        "run_id": "text",
        "interval_start": "timestamptz",
        "interval_end": "timestamptz",
        "parts": "text[]",
    }
    return SQL("ALTER TABLE {} {}").format(
        table_identifier(schema, name),
        SQL(", ").join(
            SQL("ADD COLUMN IF NOT EXISTS {} {}").format(Identifier(c), SQL(types[c]))
            for c in LOAD_HISTORY_ORDER_COLUMNS
        ),
    )


def create_load_history_index(schema: str, name: str, index: str) -> Composed:
    """The index the ordering rule's lookup and the trimming read: the loads of one target
    and scope by data interval."""
    return SQL(
        "CREATE INDEX IF NOT EXISTS {} ON {} (target, scope, interval_end, interval_start)"
    ).format(Identifier(index), table_identifier(schema, name))


def record_load(
    schema: str,
    name: str,
    *,
    load_id: str,
    target: str,
    mode: str,
    logical_date: str | None,
    rows: int,
    rejects: int,
    scope: str | None = None,
    run_id: str | None = None,
    interval: tuple[str, str] | None = None,
    parts: Sequence[str] | None = None,
) -> Composed:
    """Note a load as finalized (in the transaction that makes it visible)."""
    start, end = interval or (None, None)
    return SQL(
        "INSERT INTO {} (load_id, target, mode, logical_date, rows, rejects, scope, run_id,"
        " interval_start, interval_end, parts)"
        " VALUES ({}, {}, {}, {}::timestamptz, {}, {}, {}, {}, {}::timestamptz, {}::timestamptz,"
        " {}) ON CONFLICT (load_id) DO UPDATE SET"
        " logical_date = EXCLUDED.logical_date, rows = EXCLUDED.rows,"
        " rejects = EXCLUDED.rejects, finalized_at = now(), scope = EXCLUDED.scope,"
        " run_id = EXCLUDED.run_id, interval_start = EXCLUDED.interval_start,"
        " interval_end = EXCLUDED.interval_end, parts = EXCLUDED.parts"
    ).format(
        table_identifier(schema, name),
        Literal(load_id),
        Literal(target),
        Literal(mode),
        Literal(logical_date),
        Literal(rows),
        Literal(rejects),
        Literal(scope),
        Literal(run_id),
        Literal(start),
        Literal(end),
        SQL("NULL::text[]") if parts is None else text_array(parts),
    )


def load_record(schema: str, name: str, load_id: str) -> Composed:
    """Rows, rejects and finalization time of a finalized load (no row: never finalized)."""
    return SQL("SELECT rows, rejects, finalized_at::text FROM {} WHERE load_id = {}").format(
        table_identifier(schema, name), Literal(load_id)
    )


#: the modes whose loads replace rows: the ordering rule compares their loads
ORDERED_MODES: tuple[str, ...] = tuple(m.value for m in Mode if m.ordered_by_run)


def newer_load(
    schema: str,
    name: str,
    *,
    target: str,
    scope: str,
    interval: tuple[str, str],
    load_id: str,
    parts: Sequence[str] | None = None,
) -> Composed:
    """The newest other load into ``target`` by the same ``scope`` (DAG and task) whose data
    interval is later than ``interval`` (by its end, then its start) and that replaced some
    of the same rows: the whole target, or one of ``parts`` (None: the whole target). An
    index range scan of :func:`create_load_history_index` (only the later loads are read)."""
    start, end = interval
    overlap = (
        SQL("")
        if parts is None
        else SQL(" AND (parts IS NULL OR parts && {})").format(text_array(parts))
    )
    return SQL(
        "SELECT load_id, run_id, mode, interval_start::text, interval_end::text,"
        " finalized_at::text, parts FROM {} AS h"
        " WHERE target = {} AND scope = {}"
        " AND (interval_end, interval_start) > ({}::timestamptz, {}::timestamptz)"
        " AND mode = ANY({}) AND load_id <> {}{}"
        " ORDER BY h.interval_end DESC, h.interval_start DESC LIMIT 1"
    ).format(
        table_identifier(schema, name),
        Literal(target),
        Literal(scope),
        Literal(end),
        Literal(start),
        text_array(ORDERED_MODES),
        Literal(load_id),
        overlap,
    )


def trim_load_history(schema: str, name: str, *, target: str, keep: int) -> Composed:
    """Delete the loads into ``target`` beyond the ``keep`` last finalized, except the newest
    (by data interval) of each scope and partition, which the ordering rule needs. Returns
    the number deleted. Takes the target's trimming lock first and does nothing without it
    (another load is trimming the same rows)."""
    return SQL(
        "WITH locked AS (SELECT pg_try_advisory_xact_lock(hashtext('airflow_pg_bulk_trim'),"
        " hashtext({target})) AS got),"
        " loads AS (SELECT load_id, scope, finalized_at, interval_end, interval_start, parts"
        " FROM {table} WHERE target = {target} AND (SELECT got FROM locked)),"
        " kept AS ((SELECT load_id FROM loads ORDER BY finalized_at DESC, load_id LIMIT {keep})"
        " UNION (SELECT DISTINCT ON (scope, part) load_id FROM loads,"
        " unnest(coalesce(parts, ARRAY['']::text[])) AS part WHERE scope IS NOT NULL"
        " ORDER BY scope, part, interval_end DESC, interval_start DESC)),"
        " gone AS (DELETE FROM {table} h USING loads WHERE h.load_id = loads.load_id"
        " AND loads.load_id NOT IN (SELECT load_id FROM kept) RETURNING 1)"
        " SELECT count(*) FROM gone"
    ).format(table=table_identifier(schema, name), target=Literal(target), keep=Literal(keep))


def text_array(values: Iterable[str]) -> Composed:
    items = [Literal(v) for v in values]
    if not items:
        return SQL("'{{}}'::text[]").format()
    return SQL("ARRAY[{}]::text[]").format(SQL(", ").join(items))
