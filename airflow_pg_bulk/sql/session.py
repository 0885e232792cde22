"""SQL of a load's sessions: settings, locks, search_path."""

from __future__ import annotations

from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

# --- session ---------------------------------------------------------------------------------


def set_config(name: str, value: str, *, local: bool = False) -> Composed:
    """``set_config(name, value, local)``: a session (or transaction) setting."""
    return SQL("SELECT {}").format(_set_config_call(name, value, local))


def _set_config_call(name: str, value: str, local: bool = False) -> Composed:
    return SQL("set_config({}, {}, {})").format(Literal(name), Literal(value), Literal(local))


def session_setup(application_name: str, client_check_interval: str | None) -> Composed:
    """Name the session (``pg_stat_activity.application_name``) and, where given (PostgreSQL
    14+), have the server check every ``client_check_interval`` during a long statement that
    its client is still there, and abort the statement if not (a worker killed with SIGKILL)."""
    calls = [_set_config_call("application_name", application_name)]
    if client_check_interval is not None:
        calls.append(_set_config_call("client_connection_check_interval", client_check_interval))
    return SQL("SELECT {}").format(SQL(", ").join(calls))


def pin_search_path() -> Composed:
    """Pin ``search_path`` for this transaction so catalog-rendered SQL is fully qualified."""
    return set_config("search_path", "pg_catalog, pg_temp", local=True)


def server_version() -> Composed:
    """The server's version number (e.g. 150020)."""
    return SQL("SELECT current_setting('server_version_num')::int").format()


def current_user() -> Composed:
    """The role the session runs as."""
    return SQL("SELECT current_user").format()


def advisory_xact_lock(oid: int) -> Composed:
    """Serialise finalizes of the same target (one pair of keys per table)."""
    return SQL("SELECT pg_advisory_xact_lock(hashtext('airflow_pg_bulk'), {}::oid::int4)").format(
        Literal(oid)
    )


def creation_lock(schema: str, name: str) -> Composed:
    """Serialise the creation of a shared table (the reject table, the load history) by
    concurrent loads, until the transaction ends."""
    return SQL(
        "SELECT pg_advisory_xact_lock(hashtext('airflow_pg_bulk_create'), hashtext({}))"
    ).format(Literal(Identifier(schema, name).as_string()))


def load_lock(load_id: str, *, release: bool = False) -> Composed:
    """Take (or release) the session-level lock that one finalize of a load holds throughout,
    so a retry started while a stalled attempt still works waits for it (under lock_timeout)
    instead of racing it."""
    function = SQL("pg_advisory_unlock" if release else "pg_advisory_lock")
    return SQL("SELECT {}(hashtext('airflow_pg_bulk_finalize'), hashtext({}))").format(
        function, Literal(load_id)
    )


def prepare_named(name: str, statement: Composable) -> Composed:
    """Prepare ``statement`` (no parameters) as the session's statement ``name``: planned at
    its first EXECUTE, that plan kept for the session."""
    return SQL("PREPARE {} AS {}").format(Identifier(name), statement)


def execute_named(name: str) -> Composed:
    """Run the session's prepared statement ``name``."""
    return SQL("EXECUTE {}").format(Identifier(name))
