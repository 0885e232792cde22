"""Task logs of a run: the tail of a file, Airflow 3's JSON-lines records made readable."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 40


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of a text file ('' if missing)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            start = max(0, size - 256 * 1024)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return ""
    if start > 0:  # drop the partial first line
        data = data.partition(b"\n")[2]
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def format_task_log(text: str) -> str:
    """Make Airflow 3 JSON-lines task logs readable (plain lines are passed through)."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if not isinstance(record, dict):
            out.append(line)
            continue
        parts = [
            str(record.get("timestamp", "")),
            str(record.get("level", "")).upper(),
            str(record.get("event", "")),
        ]
        msg = " ".join(p for p in parts if p)
        out.append(msg)
        out.extend(format_error_detail(record.get("error_detail")))
    return "\n".join(out)


def format_error_detail(detail: Any, max_frames: int = 6) -> list[str]:
    """Render the structured ``error_detail`` of an Airflow 3 log record like a traceback."""
    if not isinstance(detail, list):
        return [] if detail is None else [f"  {detail}"]
    lines = []
    for exc in detail:
        if not isinstance(exc, dict):
            lines.append(f"  {exc}")
            continue
        frames = exc.get("frames") or []
        if len(frames) > max_frames:
            lines.append(f"  ... {len(frames) - max_frames} frames omitted")
        for frame in frames[-max_frames:]:
            if isinstance(frame, dict):
                lines.append(
                    f'  File "{frame.get("filename")}", line {frame.get("lineno")},'
                    f" in {frame.get('name')}"
                )
        lines.append(f"  {exc.get('exc_type', 'Exception')}: {exc.get('exc_value', '')}")
    return lines


def task_log_tail(
    home: Path, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int
) -> str:
    """Tail of the newest task log under ``<home>/logs`` for one task instance."""
    base = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    if map_index >= 0:
        base = base / f"map_index={map_index}"
    candidates = [base / f"attempt={try_number}.log"] if try_number > 0 else []
    if not candidates or not candidates[0].exists():
        candidates = sorted(base.glob("attempt=*.log"), key=lambda p: p.stat().st_mtime)[-1:]
    if not candidates or not candidates[0].exists():
        return f"(no log file under {base})"
    text = format_task_log(tail(candidates[0], 400))
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
