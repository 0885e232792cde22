"""mysql-connector-python's C extension module, ``_mysql_connector``, driven directly for one
job: a query's one-value rows (COPY text lines the server makes) fetched as bytes, in
batches, without importing the ``mysql.connector`` package. Used by the C extension's reader
of COPY lines (:mod:`airflow_pg_bulk.loading.database.row_readers`); knows the driver, not
plans.

Why, though ``_mysql_connector`` is a private module of a dependency: ``import
mysql.connector`` alone took 0.135 s of a 2.1 s CLI load of 1,000,000 MariaDB rows (its
``__init__`` imports its OpenTelemetry constants, pooling and abstracts), and its cursor's
``fetchmany`` runs a Python loop per row around ``fetch_row()`` (``CMySQLConnection.get_rows``).
Here the rows come through ``iter(fetch_row, None)`` sliced in C (``itertools.islice``,
``operator.itemgetter``): no Python bytecode per row.

Guarded: the module must import and the installed mysql-connector-python be in the range of
the ``mysql`` extra (:data:`VERSIONS`, setup.cfg), whose ``connection_cext.py`` was read for
what is mirrored here: ``MySQL(buffered=, raw=, charset_name=, connection_timeout=,
use_unicode=, auth_plugin=, plugin_dir=)`` (the plugin directory the package computes, next
to the module), ``connect(host=, user=, password=, database=, port=, unix_socket=,
ssl_disabled=False)`` (TLS where the server offers it, as the package's default), then
``SET NAMES`` with the charset's collation and autocommit off, as the package's
``_post_connection`` does; ``fetch_fields()`` for the description (the package's
``fetch_eof_columns``), ``query(..., raw=True, buffered=False)``, ``fetch_row()``,
``free_result()``, ``close()``. The caller keeps the package's path for whatever fails
before the first line (:class:`airflow_pg_bulk.loading.database.row_readers.ConnectorReader`).

The package's other defaults left out: its client flags add ``MULTI_STATEMENTS`` (one
statement is sent here) and its connection attributes name the package (the library's own
are sent)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import os
from collections.abc import Iterator
from typing import Any

#: the releases of mysql-connector-python whose ``_mysql_connector`` is driven here: the
#: ``mysql`` extra's range (setup.cfg), ``>=9.1,<26``
VERSIONS = ((9, 1), (26,))

#: the statement that sets each charset the reader takes, with the collation the package
#: sets for it (its ``charsets.py`` default: ``set_charset_collation``)
SET_NAMES = {"utf8mb4": b"SET NAMES 'utf8mb4' COLLATE 'utf8mb4_general_ci'"}

#: the NOT NULL bit of a field's flags (``FieldFlag.NOT_NULL``)
_NOT_NULL = 1

_first = operator.itemgetter(0)


@functools.cache
def extension() -> Any | str:
    """The module ``_mysql_connector``, or why it is not used: it does not import, or the
    installed mysql-connector-python is outside :data:`VERSIONS`."""
    from importlib import metadata

    try:
        import _mysql_connector
    except ImportError as exc:
        return f"its C extension does not load ({exc})"
    try:
        version = metadata.version("mysql-connector-python")
        release = tuple(int(part) for part in version.split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError) as exc:
        return f"its version is not known ({exc})"
    low, high = VERSIONS
    if not low <= release < high:
        return f"its version {version} is outside >=9.1,<26"
    return _mysql_connector


class Connection:
    """A connection of ``_mysql_connector.MySQL`` (raw: values as the server's bytes)."""

    def __init__(self, module: Any, arguments: dict[str, Any]) -> None:
        charset = arguments["charset"]
        if charset not in SET_NAMES:
            raise ValueError(f"the charset {charset} is not one of {', '.join(SET_NAMES)}")
        plugins = os.path.join(os.path.dirname(os.path.abspath(module.__file__)), "mysql",
                               "vendor", "plugin")  # fmt: skip
        if not os.path.exists(plugins):  # (the package's fallback on Linux)
            plugins = next(
                (p for p in ("/usr/lib64/mysql/plugin",) if os.path.exists(p)),
                "/usr/lib/mysql/plugin",
            )
        self._conn = module.MySQL(buffered=False, raw=True, charset_name=charset,
                                  connection_timeout=0, use_unicode=True, auth_plugin="",
                                  plugin_dir=plugins)  # fmt: skip
        where = (
            {"unix_socket": arguments["unix_socket"]}
            if "unix_socket" in arguments
            else {"host": arguments["host"], "port": arguments["port"]}
        )
        self._conn.connect(user=arguments["user"], password=arguments["password"],
                           database=arguments["database"], ssl_disabled=False,
                           **where)  # fmt: skip
        self._conn.query(SET_NAMES[charset])
        self._conn.free_result()
        self._conn.autocommit(False)

    def close(self) -> None:
        """Closes it; raises nothing."""
        with contextlib.suppress(Exception):
            self._conn.free_result()
            self._conn.close()

    @property
    def server(self) -> str:
        """The server's version text (``10.11.6-MariaDB...``)."""
        return str(self._conn.get_server_info())

    def description(self, text: str) -> list[tuple[Any, ...]]:
        """The DB-API description of the rows of query ``text`` (the package's:
        ``name, type, None x4, null_ok, flags, charset``), its rows read and dropped."""
        self._conn.query(text.encode("utf-8"), raw=True, buffered=False)
        try:
            fields = self._conn.fetch_fields()
            return [
                (f[4], int(f[8]), *(None,) * 4, ~int(f[9]) & _NOT_NULL, int(f[9]), int(f[6]))
                for f in fields
            ]
        finally:
            while self._conn.fetch_row() is not None:
                pass
            self._conn.free_result()

    def first_values(self, text: str, size: int) -> Iterator[list[Any]]:
        """The first value of each row of query ``text``, in lists of ``size`` (the last
        shorter), None for NULL; the query is sent when this is called."""
        self._conn.query(text.encode("utf-8"), raw=True, buffered=False)
        return self._batches(size)

    def _batches(self, size: int) -> Iterator[list[Any]]:
        rows = iter(self._conn.fetch_row, None)
        while batch := list(map(_first, itertools.islice(rows, size))):
            yield batch
        self._conn.free_result()


@contextlib.contextmanager
def connected(module: Any, arguments: dict[str, Any]) -> Iterator[Connection]:
    """A :class:`Connection` for the connector's ``arguments``
    (:func:`airflow_pg_bulk.db.mysql_connector.connector_arguments`), closed after."""
    conn = Connection(module, arguments)
    try:
        yield conn
    finally:
        conn.close()
