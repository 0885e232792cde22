"""What one DAG run under the harness did: its state and every task instance's timings."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

#: Terminal states of a DAG run.
DAG_RUN_FINISHED_STATES = frozenset({"success", "failed"})
#: Task-instance states whose log tail is attached to the result.
TASK_FAILED_STATES = frozenset({"failed", "upstream_failed"})


class AirflowRunnerError(RuntimeError):
    """Base class for errors raised by :class:`AirflowStandalone`."""


class AirflowStartupError(AirflowRunnerError):
    """The standalone Airflow did not come up (process died or readiness timed out)."""


class DagImportError(AirflowRunnerError):
    """The dag-processor recorded an import error for the file defining the DAG."""


class DagRunFailedError(AirflowRunnerError):
    """A DAG run finished in a state other than ``success``; carries the result."""

    def __init__(self, result: DagRunResult) -> None:
        super().__init__(
            f"DAG run {result.dag_id}/{result.run_id} ended in state {result.state!r}\n"
            f"{result.describe()}"
        )
        self.result = result


@dataclass(frozen=True)
class TaskRun:
    """One task instance of a DAG run (one element of a mapped task, or map_index -1)."""

    task_id: str
    map_index: int
    state: str
    start: datetime | None
    end: datetime | None
    pid: int | None
    try_number: int = 0
    log_tail: str | None = None
    hostname: str | None = None  # where it ran (a Celery worker's name under the harness)
    queue: str | None = None

    @property
    def duration(self) -> float | None:
        """Seconds between start and end, or ``None`` if the task did not finish."""
        if self.start is None or self.end is None:
            return None
        return (self.end - self.start).total_seconds()

    @property
    def label(self) -> str:
        """``task_id`` or ``task_id[map_index]`` for mapped instances."""
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"


@dataclass(frozen=True)
class DagRunResult:
    """Outcome and timings of one DAG run triggered by :meth:`AirflowStandalone.run_dag`."""

    dag_id: str
    run_id: str
    state: str
    triggered_at: datetime
    queued_at: datetime | None
    start: datetime | None
    end: datetime | None
    tasks: list[TaskRun] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        """Whether the run finished in state ``success``."""
        return self.state == "success"

    @property
    def wall_seconds(self) -> float | None:
        """Seconds from the trigger request until the run ended (``None`` if it did not)."""
        if self.end is None:
            return None
        return (self.end - self.triggered_at).total_seconds()

    @property
    def scheduling_latency(self) -> float | None:
        """Seconds from the trigger request until the first task instance started."""
        starts = [t.start for t in self.tasks if t.start is not None]
        if not starts:
            return None
        return (min(starts) - self.triggered_at).total_seconds()

    @property
    def failed_tasks(self) -> list[TaskRun]:
        """Task instances in a failed state (``failed`` / ``upstream_failed``)."""
        return [t for t in self.tasks if t.state in TASK_FAILED_STATES]

    def task_runs(self, task_id: str) -> list[TaskRun]:
        """All instances of ``task_id`` ordered by map index."""
        return sorted((t for t in self.tasks if t.task_id == task_id), key=lambda t: t.map_index)

    def max_concurrency(self, task_id: str | None = None) -> int:
        """Largest number of task instances (optionally of one task) running at the same instant."""
        events: list[tuple[datetime, int]] = []
        for t in self.tasks:
            if (
                (task_id is None or t.task_id == task_id)
                and t.start is not None
                and t.end is not None
            ):
                events.append((t.start, 1))
                events.append((t.end, -1))
        # Ends sort before starts at the same instant: touching intervals do not overlap.
        events.sort(key=lambda e: (e[0], e[1]))
        best = current = 0
        for _, delta in events:
            current += delta
            best = max(best, current)
        return best

    def offset(self, moment: datetime | None) -> float | None:
        """Seconds between the trigger request and ``moment``."""
        return None if moment is None else (moment - self.triggered_at).total_seconds()

    def describe(self) -> str:
        """Multi-line text table of the task instances, times relative to the trigger."""

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:8.2f}"

        wall = self.wall_seconds
        latency = self.scheduling_latency
        lines = [
            f"DAG run {self.dag_id} / {self.run_id}: {self.state}"
            f" (wall {fmt(wall).strip()} s from trigger, first task after {fmt(latency).strip()} s,"
            f" max concurrency {self.max_concurrency()})",
        ]
        rows = [("task", "state", "start+s", "end+s", "dur s", "pid")]
        for t in sorted(
            self.tasks, key=lambda t: (t.start or datetime.max.replace(tzinfo=UTC), t.label)
        ):
            rows.append(
                (
                    t.label,
                    t.state,
                    fmt(self.offset(t.start)),
                    fmt(self.offset(t.end)),
                    fmt(t.duration),
                    "-" if t.pid is None else str(t.pid),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for i, row in enumerate(rows):
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
            lines.append("  " + "  ".join(cells).rstrip())
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        for t in self.tasks:
            if t.log_tail:
                lines.append(f"--- log tail of {t.label} ({t.state}) ---")
                lines.extend("  " + line for line in t.log_tail.splitlines())
        return "\n".join(lines)
