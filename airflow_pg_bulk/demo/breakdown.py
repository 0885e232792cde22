"""Where a DAG run's time went: the load itself (finalize's figures, prepare's start to the
swap) and the rest, from the run's own records in Airflow's metadata database (SQLite or
PostgreSQL): the task instances' scheduled, queued, start and end times and finalize's XCom.

The parts listed add up to the run's wall time, trigger to the run's end:

- before the load: the trigger to prepare's queueing (the scheduler), prepare's process
  start-up (queued to started), and the task runner's work before prepare's first step
  (parsing the DAG file, rendering templates);
- the load: its phases, ``wait_copy`` and ``wait_finalize`` being the same kind of time
  between tasks inside it;
- after the load: finalize's wrap-up (its XCom, its state), cleanup (queued, started, ran), and
  the scheduler marking the run done.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_pg_bulk.demo.harness.metadata import MetadataDb


@dataclass(frozen=True)
class TaskTimes:
    """One task instance's times (UTC), as the metadata database has them."""

    task_id: str
    map_index: int
    state: str
    scheduled: datetime | None
    queued: datetime | None
    start: datetime | None
    end: datetime | None

    @property
    def label(self) -> str:
        """``task_id`` or ``task_id[map_index]``."""
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"


@dataclass(frozen=True)
class RunTimes:
    """A DAG run's times, its task instances' and finalize's figures (``None``: no XCom)."""

    triggered_at: datetime
    start: datetime | None
    end: datetime | None
    tasks: list[TaskTimes]
    figures: dict[str, Any] | None


def _ts(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, datetime):  # PostgreSQL: timestamptz
        moment = value
    else:  # SQLite: text
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _xcom(raw: Any) -> Any:
    value = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    return json.loads(value) if isinstance(value, str) else value


def read_run(
    db: MetadataDb, dag_id: str, run_id: str, triggered_at: datetime, finalize_task: str
) -> RunTimes:
    """The run's times from the harness's metadata database (SQLite or PostgreSQL)."""
    runs = db.query(
        "SELECT start_date, end_date FROM dag_run WHERE dag_id = ? AND run_id = ?",
        (dag_id, run_id),
    )
    start, end = (runs[0]["start_date"], runs[0]["end_date"]) if runs else (None, None)
    tasks = [
        TaskTimes(
            str(row["task_id"]),
            int(row["map_index"]),
            str(row["state"]),
            *(
                _ts(row[name])
                for name in ("scheduled_dttm", "queued_dttm", "start_date", "end_date")
            ),
        )
        for row in db.query(
            "SELECT task_id, map_index, state, scheduled_dttm, queued_dttm, start_date,"
            " end_date FROM task_instance WHERE dag_id = ? AND run_id = ?",
            (dag_id, run_id),
        )
    ]
    rows = db.query(
        "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ?"
        " AND key = 'return_value'",
        (dag_id, run_id, finalize_task),
    )
    figures = _xcom(rows[0]["value"]) if rows else None
    return RunTimes(triggered_at, _ts(start), _ts(end), tasks, figures)


#: the load's steps in the order they run: the task instances are listed in it, whatever
#: the order their times came in (a Celery worker queues mapped COPY tasks in any order)
STEPS = ("prepare", "copy", "finalize", "cleanup")


def _step_order(t: TaskTimes) -> tuple[int, str, int]:
    step = t.task_id.rsplit(".", 1)[-1]
    return (STEPS.index(step) if step in STEPS else len(STEPS), t.task_id, t.map_index)


def describe(run: RunTimes, group: str) -> str:
    """The task instances' times, then where the run's wall time went."""
    zero = run.triggered_at

    def at(moment: datetime | None) -> str:
        return "-" if moment is None else f"{(moment - zero).total_seconds():+8.2f}"

    def span(a: datetime | None, b: datetime | None) -> str:
        return "-" if a is None or b is None else f"{(b - a).total_seconds():6.2f}"

    tasks = sorted(run.tasks, key=_step_order)
    rows = [("task", "state", "scheduled", "queued", "started", "ended", "start-up", "ran")]
    rows += [
        (
            t.label,
            t.state,
            at(t.scheduled),
            at(t.queued),
            at(t.start),
            at(t.end),
            span(t.queued, t.start),
            span(t.start, t.end),
        )
        for t in tasks
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["      Task instances (seconds after the trigger; start-up: queued to started):"]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
        lines.append("        " + "  ".join(cells).rstrip())
    lines += ["", *_where_time_went(run, group)]
    return "\n".join(lines)


def _where_time_went(run: RunTimes, group: str) -> list[str]:
    by_id = {t.task_id: t for t in run.tasks if t.map_index < 0}
    prepare, finalize = by_id.get(f"{group}.prepare"), by_id.get(f"{group}.finalize")
    cleanup = by_id.get(f"{group}.cleanup")
    figures = run.figures or {}
    if not (run.end and prepare and finalize and cleanup and figures.get("started_at")):
        return ["      (the run did not finish the load: no breakdown)"]
    began = datetime.fromtimestamp(figures["started_at"], UTC)
    ended = datetime.fromtimestamp(figures["ended_at"], UTC)

    def secs(a: datetime | None, b: datetime | None) -> float:
        return 0.0 if a is None or b is None else (b - a).total_seconds()

    wall = secs(run.triggered_at, run.end)
    seconds = figures.get("seconds", {})
    between = seconds.get("wait_copy", 0.0) + seconds.get("wait_finalize", 0.0)
    parts = [
        ("before the load", secs(run.triggered_at, began), None),
        ("  scheduler: trigger to prepare queued", secs(run.triggered_at, prepare.queued), 1),
        ("  prepare's process start-up: queued to started", secs(prepare.queued, prepare.start), 1),
        (
            "  task runner: started to prepare's first step (imports, DAG file)",
            secs(prepare.start, began),
            1,
        ),
        ("the load itself (finalize's figures)", secs(began, ended), None),
        ("  of which between tasks: wait_copy + wait_finalize", between, 1),
        ("after the load", secs(ended, run.end), None),
        ("  finalize's wrap-up (XCom, state)", secs(ended, finalize.end), 1),
        ("  cleanup: queued, started, ran", secs(finalize.end, cleanup.end), 1),
        ("  scheduler: cleanup's end to the run's end", secs(cleanup.end, run.end), 1),
    ]
    outside = wall - secs(began, ended) + between
    lines = [
        f"      Where the run's {wall:.2f} s went, trigger to the run's end ({outside:.2f} s of"
        " it Airflow's: scheduling, task start-up and wrap-up):"
    ]
    width = max(len(name) for name, _, _ in parts)
    for name, value, _ in parts:
        lines.append(f"        {name:<{width}} {value:7.2f} s ({100 * value / wall:4.1f} %)")
    return lines
