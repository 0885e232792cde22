"""``[core] hostname_callable`` for the harness's Celery workers.

Two workers on one machine would otherwise record the same host name in every task instance
they run; each worker's environment names it (``PG_BULK_WORKER_NAME``), and its tasks record
``<name>@<host>``, the worker's Celery node name."""

from __future__ import annotations

import os
import socket

WORKER_NAME_VARIABLE = "PG_BULK_WORKER_NAME"


def worker_hostname() -> str:
    """``<worker name>@<host>`` in a harness worker, the host's FQDN elsewhere."""
    name = os.environ.get(WORKER_NAME_VARIABLE)
    return f"{name}@{socket.gethostname()}" if name else socket.getfqdn()
