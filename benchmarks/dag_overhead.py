"""Where an Airflow DAG run's time goes, task by task: the demo's DAG (workload A, small) under
a real scheduler (``AirflowStandalone``: LocalExecutor, SQLite metadata), against the same load
in one process.

Each task instance is cut into phases from its own records: the metadata database's queued,
start and end times and the task log's timestamps (Airflow 3.3's task runner logs
``::group::Pre Execute`` when the task process is up, ``DAG bundles loaded`` once the supervisor
has marked it running through the Task Execution API and sent it the start-up message,
``Worker startup parse complete`` with the DAG file's parse time, ``::endgroup::`` after the
templates are rendered and the rendered fields sent, ``::group::Post Execute`` when
``execute()`` returned); the task instance ends when the task runner sends its final state,
after the XCom push. Everything but ``execute`` is Airflow's; ``execute`` is the provider's
(its imports, connection and step). The phases add up to queued -> end.

    python -m benchmarks.dag_overhead --conn postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

GROUP = "load_readings"
SCHEMA = "bulk_overhead"
STAGES = ("prepare", "copy", "finalize", "cleanup")
TARGET_SECONDS = 4.0  # issue 11: a DAG run within the in-process load + 4 s, 4 partitions

# (phase, who pays it, what it is): the columns of the per-task table
PHASES = (
    ("queue", "Airflow", "queued -> started: the executor picks it up, forks the task process"),
    (
        "start",
        "Airflow",
        "started -> DAG bundles loaded: the supervisor marks it running (Task Execution API)"
        " and sends the start-up message",
    ),
    ("parse", "both", "the task runner parses the DAG file (the provider's imports)"),
    ("render", "Airflow", "parse done -> execute: templates rendered, rendered fields sent"),
    ("execute", "provider", "execute(): the provider's imports, connection and step"),
    (
        "wrap-up",
        "Airflow",
        "execute returned -> the task instance's end: XCom pushed, final state sent",
    ),
)


@dataclass(frozen=True)
class TaskPhases:
    """One task instance's phases in seconds (``None``: a mark missing from its log)."""

    label: str
    queued: datetime | None
    start: datetime | None
    end: datetime | None
    seconds: dict[str, float | None]

    @property
    def total(self) -> float | None:
        """Queued to end."""
        if self.queued is None or self.end is None:
            return None
        return (self.end - self.queued).total_seconds()


def _ts(value: str | None) -> datetime | None:
    if not value:
        return None
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def log_marks(lines: list[str]) -> dict[str, Any]:
    """The task runner's marks in an Airflow 3.3 JSON-lines task log (their first
    timestamps) and the DAG file's parse milliseconds."""
    marks: dict[str, Any] = {}
    endgroups: list[datetime] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        event, moment = str(record.get("event", "")), _ts(record.get("timestamp"))
        if moment is None:
            continue
        if event == "::group::Pre Execute":
            marks.setdefault("pre_execute", moment)
        elif event.startswith("DAG bundles loaded"):
            marks.setdefault("bundles", moment)
        elif event == "Worker startup parse complete":
            marks.setdefault("parsed", moment)
            marks.setdefault("parse_ms", record.get("dag_file_parse_ms"))
        elif event == "::group::Post Execute":
            marks.setdefault("post_execute", moment)
        elif event == "::endgroup::":
            endgroups.append(moment)
    if endgroups:
        marks["executing"] = endgroups[0]
    return marks


def task_phases(
    label: str,
    queued: datetime | None,
    start: datetime | None,
    end: datetime | None,
    marks: dict[str, Any],
) -> TaskPhases:
    """Cut one task instance into the phases of :data:`PHASES`."""

    def span(a: datetime | None, b: datetime | None) -> float | None:
        return None if a is None or b is None else (b - a).total_seconds()

    parse = marks.get("parse_ms")
    seconds = {
        "queue": span(queued, start),
        "start": span(start, marks.get("bundles")),
        "parse": span(marks.get("bundles"), marks.get("parsed")),
        "render": span(marks.get("parsed"), marks.get("executing")),
        "execute": span(marks.get("executing"), marks.get("post_execute")),
        "wrap-up": span(marks.get("post_execute"), end),
        "parse_file": None if parse is None else float(parse) / 1000,
    }
    return TaskPhases(label, queued, start, end, seconds)


def _log_path(home: Path, run_id: str, task_id: str, map_index: int, try_number: int) -> Path:
    base = home / "logs" / "dag_id=pg_bulk_smart_meter" / f"run_id={run_id}" / f"task_id={task_id}"
    if map_index >= 0:
        base = base / f"map_index={map_index}"
    return base / f"attempt={try_number}.log"


def read_run(home: Path, run_id: str) -> tuple[dict[str, Any], list[TaskPhases]]:
    """The run's start/end and every task instance's phases, from ``home``'s SQLite metadata
    database and task logs."""
    import sqlite3

    conn = sqlite3.connect(f"file:{home / 'airflow.db'}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        run = conn.execute(
            "SELECT start_date, end_date FROM dag_run WHERE run_id = ?", (run_id,)
        ).fetchone()
        rows = conn.execute(
            "SELECT task_id, map_index, try_number, queued_dttm, start_date, end_date"
            " FROM task_instance WHERE run_id = ? ORDER BY queued_dttm, map_index",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()
    tasks = []
    for row in rows:
        path = _log_path(home, run_id, row["task_id"], row["map_index"], row["try_number"])
        lines = path.read_text().splitlines() if path.exists() else []
        label = row["task_id"].removeprefix(f"{GROUP}.")
        if row["map_index"] >= 0:
            label += f"[{row['map_index']}]"
        tasks.append(
            task_phases(
                label,
                _ts(row["queued_dttm"]),
                _ts(row["start_date"]),
                _ts(row["end_date"]),
                log_marks(lines),
            )
        )
    return {"start": _ts(run["start_date"]), "end": _ts(run["end_date"])}, tasks


def critical_path(
    triggered_at: datetime, run_end: datetime, tasks: list[TaskPhases]
) -> list[tuple[str, float]]:
    """The run's wall time as a sum: the scheduler's gaps before each stage (the trigger or the
    previous stage's last end to the stage's first queued) and each stage (first queued to
    last end; for the COPY stage, the longest COPY task and the rest, waiting for a core or a
    slot). Adds up to trigger -> the run's end."""
    parts: list[tuple[str, float]] = []
    last = triggered_at
    for stage in STAGES:
        group = [t for t in tasks if t.label.split("[")[0] == stage and t.queued and t.end]
        if not group:
            continue
        first = min(t.queued for t in group if t.queued)
        end = max(t.end for t in group if t.end)
        parts.append((f"scheduler: -> {stage} queued", (first - last).total_seconds()))
        parts.append((f"{stage} (first queued -> last end)", (end - first).total_seconds()))
        last = end
    parts.append(("scheduler: -> run marked done", (run_end - last).total_seconds()))
    return parts


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def phase_table(runs: list[list[TaskPhases]]) -> str:
    """Markdown: per task, the median of each phase over ``runs`` (one run: its phases, which
    add up to queued -> end)."""
    labels = [t.label for t in runs[0]]
    head = ["task", *(name for name, _, _ in PHASES), "of which DAG file", "queued -> end"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in labels:
        same = [t for run in runs for t in run if t.label == label]
        cells = [_fmt(_median([t.seconds[name] for t in same])) for name, _, _ in PHASES]
        cells.append(_fmt(_median([t.seconds["parse_file"] for t in same])))
        cells.append(_fmt(_median([t.total for t in same])))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def path_table(paths: list[list[tuple[str, float]]], in_process: float) -> str:
    """Markdown: the critical path's parts, median over the runs, and the total."""
    head = "seconds" if len(paths) == 1 else f"seconds (median of {len(paths)})"
    lines = [f"| part | {head} | who |", "|---|---|---|"]
    for i, (name, _) in enumerate(paths[0]):
        who = "Airflow (scheduler loop)" if name.startswith("scheduler") else "tasks (below)"
        lines.append(f"| {name} | {_fmt(_median([p[i][1] for p in paths]))} | {who} |")
    totals = [sum(v for _, v in p) for p in paths]
    lines.append(f"| **trigger -> run done** | **{_fmt(_median(totals))}** | |")
    lines.append(f"| in-process load (same files) | {_fmt(in_process)} | |")
    return "\n".join(lines)


BEGIN, END = "<!-- dag-overhead: begin -->", "<!-- dag-overhead: end -->"


def section_of(text: str) -> str:
    """The section this script wrote into a RESULTS file ('' if none)."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] if 0 <= start < end else ""


def with_section(text: str, section: str) -> str:
    """``text`` with ``section`` in place of its own (appended when it has none): a full
    benchmark run rewrites RESULTS.md and keeps this section."""
    if not section:
        return text
    old = section_of(text)
    if old:
        return text.replace(old, section)
    return text.rstrip("\n") + "\n\n" + section + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conn", required=True, help="PostgreSQL to load into")
    p.add_argument("--meters", type=int, default=1500)
    p.add_argument("--days", type=int, default=100)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None, help="write the measurements here")
    p.add_argument(
        "--results",
        default=None,
        help="write the tables as the section 'Airflow's own overhead' of this file"
        " (e.g. benchmarks/RESULTS.md; the rest of the file is kept)",
    )
    p.add_argument(
        "--airflow-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an Airflow setting for the run,"
        " e.g. AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=0.2",
    )
    args = p.parse_args(argv)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pgbulk-dag-overhead-")).resolve()
    try:
        return _measure(args, argv, workdir)
    finally:
        if not args.workdir:  # data files and Airflow's home
            shutil.rmtree(workdir, ignore_errors=True)


def _measure(args: argparse.Namespace, argv: list[str] | None, workdir: Path) -> int:
    import psycopg

    from airflow_pg_bulk import runner
    from airflow_pg_bulk.demo import workload
    from benchmarks import dag

    size = workload.Workload(meters=args.meters, days=args.days, files=8)
    conn = psycopg.connect(args.conn, autocommit=True)
    workload.drop_schema(conn, SCHEMA)
    workload.create_schema(conn, SCHEMA, readings_tables=("readings",))
    workload.fill_meters(conn, SCHEMA, size.meters)
    workload.write_readings(conn, size, workdir / "data")
    glob = str(workdir / "data" / "readings-*.csv")
    table = f"{SCHEMA}.readings"
    out: dict[str, Any] = {"load_average": os.getloadavg(), "rows": size.rows}
    out["server_version"] = conn.execute("SHOW server_version").fetchone()[0]
    try:
        in_process = []
        for _ in range(args.runs):
            summary = runner.load(
                args.conn, table, glob, mode="replace", header=True, partitions=args.partitions
            )
            in_process.append(summary.total_seconds)
        infos: list[dict[str, Any]] = []
        home = workdir / "airflow"
        started = time.perf_counter()
        airflow = dag.run_dag_loads(
            args.conn,
            glob=glob,
            table=table,
            partitions=args.partitions,
            runs=args.runs,
            before_run=lambda: None,
            after_run=infos.append,
            home=home,
            airflow_env=dict(item.split("=", 1) for item in args.airflow_env),
        )
        out["airflow_seconds"] = time.perf_counter() - started
    finally:
        workload.drop_schema(conn, SCHEMA)
        conn.close()
    out["load_average_after"] = os.getloadavg()
    out["in_process"] = in_process
    out["execution_api_warmup_seconds"] = airflow.get("execution_api_warmup_seconds")
    runs, paths, walls = [], [], []
    for info in infos:
        if info.get("state") != "success":
            raise SystemExit(f"DAG run failed: {info.get('error')}")
        run, tasks = read_run(home, info["run_id"])
        triggered = datetime.fromisoformat(info["triggered_at"])
        runs.append(tasks)
        paths.append(critical_path(triggered, run["end"], tasks))
        walls.append(info["wall"])
    out["dag_walls"] = walls
    out["runs"] = [
        {"tasks": [{"label": t.label, **t.seconds} for t in run], "path": path}
        for run, path in zip(runs, paths, strict=True)
    ]
    ip = statistics.median(in_process)
    text = [
        f"in-process: {', '.join(f'{s:.2f}' for s in in_process)} s (median {ip:.2f});"
        f" DAG runs: {', '.join(f'{w:.2f}' for w in walls)} s (median"
        f" {statistics.median(walls):.2f}); overhead (median DAG - median in-process)"
        f" {statistics.median(walls) - ip:.2f} s; execution API warm-up"
        f" {_fmt(out['execution_api_warmup_seconds'])} s; load average before"
        f" {out['load_average'][0]:.2f}, after {out['load_average_after'][0]:.2f};"
        f" PostgreSQL {out['server_version']}",
    ]
    # the run of the median wall time, whole: its parts add up (medians of parts would not)
    middle = sorted(range(len(walls)), key=walls.__getitem__)[len(walls) // 2]
    overhead = statistics.median(walls) - ip
    gaps = sum(v for name, v in paths[middle] if name.startswith("scheduler"))
    missed = overhead - TARGET_SECONDS
    verdict = "met" if missed <= 0 else f"missed by {missed:.2f} s"
    text += [
        "",
        f"Target, a DAG run within the in-process load + {TARGET_SECONDS:.0f} s: **{verdict}**"
        f" (median DAG run - median in-process = {overhead:.2f} s; of the median run, the"
        f" scheduler's gaps {gaps:.2f} s).",
    ]
    text += [
        "",
        f"The run of the median wall time (run {middle + 1} of {len(walls)}):",
        "",
        path_table([paths[middle]], ip),
        "",
        phase_table([runs[middle]]),
        "",
        "Medians over all runs:",
        "",
        path_table(paths, ip),
    ]
    print("\n".join(text))
    if args.results:
        _write_section(Path(args.results), text, args, argv)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


def _write_section(path: Path, body: list[str], args: argparse.Namespace, argv: Any) -> None:
    import shlex
    import sys

    from benchmarks.report import _machine

    command = "python -m benchmarks.dag_overhead " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    conn = args.conn.rsplit("@", 1)[-1]  # no user or password in the file
    section = [
        BEGIN,
        "## Airflow's own overhead, task by task",
        "",
        f"Written by `{command.replace(args.conn, '…@' + conn)}` on"
        f" {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; workload A at {args.meters:,} meters x"
        f" {args.days} days (8 CSV files), replace, {args.partitions} partitions; the demo's DAG"
        " under `AirflowStandalone` (LocalExecutor, SQLite metadata, Airflow's defaults but"
        " `parallelism`), the execution API warmed up and the provider compiled to `.pyc` before"
        " the first trigger. Phases: "
        + "; ".join(f"*{name}* ({who}): {what}" for name, who, what in PHASES)
        + ". The machine is shared: the load average is the noise.",
        "",
        *_machine(),
        "",
        *body,
        END,
    ]
    old = path.read_text() if path.exists() else ""
    path.write_text(with_section(old, "\n".join(section)))


if __name__ == "__main__":
    raise SystemExit(main())
