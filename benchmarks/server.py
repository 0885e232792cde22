"""A throwaway PostgreSQL cluster for the benchmarks, and probes of the server's CPU time.

Debian's PostgreSQL binaries (``/usr/lib/postgresql/<major>/bin``) run as the ``postgres`` OS
user when we are root, with initdb defaults except ``shared_buffers``; the cluster listens on
127.0.0.1 only (and on a Unix socket in its data directory) and is deleted when the context
exits, also on an error or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PG_ROOT = Path("/usr/lib/postgresql")
DEFAULT_PORT = 55433
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Cluster:
    """A running throwaway cluster."""

    dsn: str
    bindir: Path
    datadir: Path
    port: int
    shared_buffers: str


def find_bindir(major: int | None = None) -> Path | None:
    """The newest (or the given) major version's bin directory with initdb and pg_ctl."""
    if not PG_ROOT.is_dir():
        return None
    majors = sorted((int(p.name) for p in PG_ROOT.iterdir() if p.name.isdigit()), reverse=True)
    for m in majors:
        if major is not None and m != major:
            continue
        bindir = PG_ROOT / str(m) / "bin"
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int = DEFAULT_PORT) -> int:
    """``preferred`` if free, else the next free port above it."""
    for port in range(preferred, preferred + 100):
        if _port_free(port):
            return port
    raise RuntimeError(f"no free TCP port in {preferred}..{preferred + 99}")


def shared_buffers_for_machine(wanted_mb: int = 2048) -> str:
    """2GB as in the anchor measurements, or a quarter of the memory when that is less."""
    try:
        with open("/proc/meminfo") as f:
            total_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
    except (OSError, StopIteration, ValueError):
        return f"{wanted_mb}MB"
    return f"{min(wanted_mb, total_kb // 1024 // 4)}MB"


def _as_postgres(cmd: list[str]) -> list[str]:
    """Run as the ``postgres`` OS user when we are root (PostgreSQL refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def initdb_command(bindir: Path, datadir: Path, locale: str = "C.UTF-8") -> list[str]:
    """initdb of a trust-auth UTF8 cluster with a ``postgres`` superuser."""
    return [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", f"--locale={locale}"]  # fmt: skip


def pg_ctl_start_command(bindir: Path, datadir: Path) -> list[str]:
    """pg_ctl start, waiting up to 120 s, logging to ``server.log`` in the data directory."""
    return [str(bindir / "pg_ctl"), "-D", str(datadir), "-l", str(datadir / "server.log"),
            "-w", "-t", "120", "start"]  # fmt: skip


@contextlib.contextmanager
def throwaway_cluster(
    *, port: int | None = None, shared_buffers: str | None = None, major: int | None = None
) -> Iterator[Cluster]:
    """initdb + start a cluster under /tmp; yield it; stop it and delete its data directory."""
    bindir = find_bindir(major)
    if bindir is None:
        raise RuntimeError(
            f"no PostgreSQL binaries under {PG_ROOT}: apt-get install postgresql, "
            "or pass --conn DSN"
        )
    port = port or pick_port()
    shared_buffers = shared_buffers or shared_buffers_for_machine()
    datadir = Path(tempfile.mkdtemp(prefix="pgbulk-bench-pg-", dir="/tmp"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(datadir, user.pw_uid, user.pw_gid)
    started = False
    try:
        subprocess.run(
            _as_postgres(initdb_command(bindir, datadir)),
            check=True,
            capture_output=True,
            text=True,
        )
        with open(datadir / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# airflow-pg-bulk benchmarks: initdb defaults except these\n"
                f"port = {port}\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{datadir}'\n"
                f"shared_buffers = '{shared_buffers}'\n"
            )
        subprocess.run(
            _as_postgres(pg_ctl_start_command(bindir, datadir)),
            check=True,
            capture_output=True,
            text=True,
        )
        started = True
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        log.info("started PostgreSQL (%s) in %s on port %d", bindir, datadir, port)
        yield Cluster(dsn, bindir, datadir, port, shared_buffers)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(
            f"{' '.join(exc.cmd)} failed ({exc.returncode}): {exc.stderr or exc.stdout}"
        ) from exc
    finally:
        if started:
            subprocess.run(
                _as_postgres(
                    [str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "fast", "-w", "stop"]
                ),
                capture_output=True,
                check=False,
            )
        shutil.rmtree(datadir, ignore_errors=True)
        log.info("stopped PostgreSQL and deleted %s", datadir)


# --- CPU probes ------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def postmaster_of(backend_pid: int) -> int | None:
    """The postmaster's pid (the parent of a backend), when the server runs on this machine."""
    fields = _stat_fields(backend_pid)
    if fields is None:
        return None
    ppid = int(fields[1])
    try:
        comm = Path(f"/proc/{ppid}/comm").read_text().strip()
    except OSError:
        return None
    return ppid if comm.startswith("postgres") else None


def server_processes(postmaster: int) -> list[int]:
    """The postmaster and its children (backends, workers) running now."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[1] == str(postmaster):
                children.append(int(entry))
    return [postmaster, *children]


def server_cpu_seconds(postmaster: int | None) -> float | None:
    """CPU seconds used so far by the postmaster and all its children, ended ones included
    (their time is in the postmaster's cutime/cstime once reaped)."""
    if postmaster is None:
        return None
    own = _stat_fields(postmaster)
    if own is None:
        return None
    ticks = sum(int(v) for v in own[11:15])  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and fields[1] == str(postmaster):
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / _CLK_TCK
