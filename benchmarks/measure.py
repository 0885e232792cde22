"""Run a process and measure it: wall seconds, its peak RSS and CPU time (``os.wait4``), the
server's CPU time and the machine's busy CPU time meanwhile (to see other load: noise)."""

from __future__ import annotations

import os
import subprocess
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
    started = time.perf_counter()
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
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
        peak_rss_kb=int(usage.ru_maxrss),
        client_cpu=client,
        server_cpu=server,
        other_cpu=other,
        load_before=load_before,
        load_after=loadavg(),
    )
