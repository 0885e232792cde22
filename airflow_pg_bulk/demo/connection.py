"""Turn a libpq connection string into an Airflow ``postgres`` connection (JSON form)."""

from __future__ import annotations

import json

from psycopg.conninfo import conninfo_to_dict

_FIELDS = {
    "host": "host",
    "port": "port",
    "user": "login",
    "password": "password",
    "dbname": "schema",
}


def airflow_connection_json(dsn: str) -> str:
    """The value for an ``AIRFLOW_CONN_<ID>`` environment variable pointing at ``dsn``.

    libpq keywords other than host, port, user, password and dbname (sslmode, options, ...)
    become the connection's extras, which the postgres hook passes on to the driver."""
    params = conninfo_to_dict(dsn)
    conn: dict[str, object] = {"conn_type": "postgres"}
    extra = {}
    for key, value in params.items():
        if key in _FIELDS:
            conn[_FIELDS[key]] = int(value) if key == "port" and value else value
        else:
            extra[key] = value
    if extra:
        conn["extra"] = extra
    return json.dumps(conn)
