"""Run a process and measure it: wall seconds, its peak RSS and CPU time (``os.wait4``), the
server's CPU time and the machine's busy CPU time meanwhile (to see other load: noise).

The peak RSS is measured through a small launcher (:data:`LAUNCHER`) between this process and
the command: Linux carries a process's RSS high-water mark over exec (the memory it had when
it was forked from us counts), so a command started straight from a benchmark holding 70-300
MiB reported at least that (``/bin/true`` started from a process of 300 MiB: 311 MiB). The
launcher, ``python -S``, is about 9 MiB: the floor of a peak measured now."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.server import machine_busy_seconds, server_cpu_seconds


@dataclass
class Measured:
    """What one measured process did."""

    returncode: int
    wall: float
    peak_rss_kb: int
    client_cpu: float
    server_cpu: float | None
    other_cpu: float | None  # busy CPU seconds of the machine not used by client or server
    load_before: float
    load_after: float


#: forks and execs the command, waits for it, writes the peak RSS (KiB) of it and its
#: descendants to the file named first, and exits with the command's exit status
LAUNCHER = """
import os, resource, sys
out, argv = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    os.execvp(argv[0], argv)
_, status = os.waitpid(pid, 0)
with open(out, "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def launched(command: Sequence[str], rss_file: Path) -> list[str]:
    """``command`` started through :data:`LAUNCHER`, which writes its peak RSS (KiB, the
    largest of it and its descendants) to ``rss_file``."""
    return [sys.executable, "-S", "-c", LAUNCHER, str(rss_file), *command]


def loadavg() -> float:
    """The 1-minute load average."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_measured(
    cmd: Sequence[str],
    *,
    log_path: Path,
    postmaster: int | None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    new_session: bool = False,
) -> Measured:
    """Run ``cmd`` to its end, output to ``log_path``; measure it.

    ``new_session``: run it in a session (and process group) of its own; pgcopydb, on a
    failure, signals its whole process group, which would otherwise include us."""
    load_before = loadavg()
    server_before = server_cpu_seconds(postmaster)
    busy_before = machine_busy_seconds()
    rss_fd, rss_name = tempfile.mkstemp(prefix="pgbulk-rss-")
    os.close(rss_fd)
    rss_file = Path(rss_name)
    started = time.perf_counter()
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            launched(cmd, rss_file),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env else None,
            cwd=cwd,
            start_new_session=new_session,
        )
        deadline = None if timeout is None else started + timeout
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if deadline is not None and time.perf_counter() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.02)
        except BaseException:
            proc.kill()
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            raise
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    server_after = server_cpu_seconds(postmaster)
    busy = machine_busy_seconds() - busy_before
    client = usage.ru_utime + usage.ru_stime
    server = None if server_before is None or server_after is None else server_after - server_before
    other = None if server is None else max(0.0, busy - client - server)
    return Measured(
        returncode=proc.returncode,
        wall=wall,
        peak_rss_kb=_peak_rss(rss_file, int(usage.ru_maxrss)),
        client_cpu=client,
        server_cpu=server,
        other_cpu=other,
        load_before=load_before,
        load_after=loadavg(),
    )


def _peak_rss(rss_file: Path, launcher_kb: int) -> int:
    """The command's peak RSS as the launcher wrote it; the launcher's own (which floors it at
    this process's size) when the launcher was killed before writing it."""
    try:
        text = rss_file.read_text().strip()
    finally:
        rss_file.unlink(missing_ok=True)
    return int(text) if text else launcher_kb
