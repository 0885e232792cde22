"""The processes of one Airflow home: find them (environment, command line, process group,
descendants) and stop them all, SIGTERM then SIGKILL."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def free_port() -> int:
    """Return a currently unused TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _proc_read(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of ``pid`` from /proc, or ``None`` if it is gone."""
    raw = _proc_read(pid, "stat").decode("ascii", "replace")
    if not raw:
        return None
    # comm may contain spaces/parens: split after the last ')'
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None


def _describe_pid(pid: int) -> str:
    """Short command line of ``pid`` for log messages."""
    cmd = _proc_read(pid, "cmdline").replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return (cmd or "?")[:80]


def _all_pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def find_home_processes(
    home: Path, *, pgid: int | None = None, root_pid: int | None = None
) -> set[int]:
    """Live (non-zombie) processes belonging to an Airflow home.

    A process belongs if its environment has ``AIRFLOW_HOME=<home>``, its command line
    mentions ``home``, it is in process group ``pgid``, or it descends from ``root_pid``.
    The calling process is never included.
    """
    me = os.getpid()
    home_b = os.fsencode(str(home))
    env_marker = b"AIRFLOW_HOME=" + home_b
    stats: dict[int, tuple[str, int, int]] = {}
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st is not None:
            stats[pid] = st
    found: set[int] = set()
    for pid, (state, _ppid, group) in stats.items():
        if pid == me or state in ("Z", "X"):
            continue
        if pgid is not None and group == pgid:
            found.add(pid)
            continue
        if env_marker in _proc_read(pid, "environ").split(b"\0"):
            found.add(pid)
            continue
        if home_b in _proc_read(pid, "cmdline"):
            found.add(pid)
    if root_pid is not None:
        children: dict[int, list[int]] = {}
        for pid, (_state, ppid, _group) in stats.items():
            children.setdefault(ppid, []).append(pid)
        stack = [root_pid]
        while stack:
            for child in children.get(stack.pop(), []):
                if child != me and stats[child][0] not in ("Z", "X") and child not in found:
                    found.add(child)
                    stack.append(child)
        if root_pid in stats and stats[root_pid][0] not in ("Z", "X") and root_pid != me:
            found.add(root_pid)
    return found


def stop_home_processes(proc: subprocess.Popen[bytes], home: Path, stop_timeout: float) -> None:
    """Stop all processes of ``home``: SIGTERM to all of them, then SIGKILL.

    SIGTERM goes to the standalone process group *and* to every process whose
    environment has this ``AIRFLOW_HOME`` (task supervisors call ``setpgid``, so
    they are outside the group).  Survivors get a second SIGTERM after 40 % of
    ``stop_timeout`` (the scheduler's LocalExecutor waits for its workers unless
    signalled again) and SIGKILL after ``stop_timeout`` (seen: dag-processor or
    triggerer ignoring SIGTERM).  A graceful SIGINT to the standalone parent was
    tried and is slower: its triggerer then takes > 5 s to stop.
    """
    pgid = proc.pid
    t0 = time.monotonic()

    def survivors() -> set[int]:
        proc.poll()  # reap our direct child so it does not linger as a zombie
        return find_home_processes(home, pgid=pgid, root_pid=proc.pid)

    def signal_all(sig: signal.Signals, pids: set[int]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def wait_gone(seconds: float) -> set[int]:
        deadline = time.monotonic() + seconds
        alive = survivors()
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = survivors()
        return alive

    alive = survivors()
    log.info("stopping airflow standalone (%d processes)", len(alive))
    signal_all(signal.SIGTERM, alive)
    alive = wait_gone(stop_timeout * 0.4)
    if alive:
        # "Shutting down LocalExecutor; waiting for running tasks to finish.
        # Signal again if you don't want to wait." -- so signal again.
        log.info(
            "second SIGTERM to %d airflow processes: %s",
            len(alive),
            "; ".join(f"{pid} {_describe_pid(pid)}" for pid in sorted(alive)),
        )
        signal_all(signal.SIGTERM, alive)
        alive = wait_gone(stop_timeout * 0.6)
    for _ in range(10):
        if not alive:
            break
        log.info(
            "SIGKILL to %d airflow processes that survived SIGTERM: %s",
            len(alive),
            "; ".join(f"{pid} {_describe_pid(pid)}" for pid in sorted(alive)),
        )
        signal_all(signal.SIGKILL, alive)
        time.sleep(0.2)
        alive = survivors()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    if alive:
        log.warning("could not stop airflow processes %s", sorted(alive))
    log.info("airflow standalone stopped in %.1f s", time.monotonic() - t0)
