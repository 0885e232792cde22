"""The figures a load reports: rows, bytes, seconds per phase, throughput."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from airflow_pg_bulk.plan.load_plan import LoadPlan
from airflow_pg_bulk.plan.plain import PlainData


@dataclass
class PhaseClock:
    """Seconds spent in named phases, in the order they ran."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block and add it to ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


@dataclass(frozen=True)
class PartitionResult(PlainData):
    """One COPY task's outcome. ``skipped``: it had been committed before (a retry)."""

    index: int
    rows: int
    bytes: int
    seconds: float
    skipped: bool = False
    rejects: int = 0


#: Phases between the steps of a load, named in the figures; in a DAG they are the scheduler's
#: and the task runner's time (queueing, task start-up), in one process connecting and threads.
WAIT_PHASES = {
    "wait_copy": "prepare's end to the first COPY's start",
    "wait_finalize": "the last COPY's end to finalize's first step",
}


#: The phases before finalize's own in a whole load's figures.
BEFORE_FINALIZE = ("prepare", "wait_copy", "copy", "wait_finalize")


def finalize_seconds(seconds: dict[str, float]) -> float:
    """Seconds of finalize's own phases among a load's ``seconds`` (the runner's cleanup too)."""
    return sum(value for name, value in seconds.items() if name not in BEFORE_FINALIZE)


@dataclass(frozen=True)
class TableChange(PlainData):
    """What a load did to one table, or one table partition, of its target.

    :param table: ``schema.name``.
    :param action: ``replaced``, ``appended to``, ``upserted into`` or ``emptied``.
    :param rows_before: the rows it held before the load; the catalog's estimate
        (``pg_class.reltuples``, no scan) when ``before_estimated``; None: unknown (never
        analyzed).
    :param rows_after: the rows it holds after the load; None: unknown.
    :param before_estimated: ``rows_before`` is an estimate.
    :param after_estimated: ``rows_after`` is an estimate (the estimate before plus the rows
        added).
    """

    table: str
    action: str
    rows_before: int | None
    rows_after: int | None
    before_estimated: bool = True
    after_estimated: bool = False

    def describe(self) -> str:
        """``replaced s.t_2024_01: about 800,000 -> 200,000 rows``."""
        before = rows_in_words(self.rows_before, self.before_estimated)
        after = rows_in_words(self.rows_after, self.after_estimated)
        return f"{self.action} {self.table}: {before} -> {after} rows"


def rows_in_words(rows: int | None, estimated: bool) -> str:
    """``1,000``, ``about 1,000`` (the catalog's estimate) or ``unknown (never analyzed)``."""
    if rows is None:
        return "unknown (never analyzed)"
    return f"about {rows:,}" if estimated else f"{rows:,}"


@dataclass(frozen=True)
class LoadSummary(PlainData):
    """A whole load's figures.

    ``seconds`` lists the phases in the order they ran: ``prepare``, ``wait_copy``, ``copy``
    (the first COPY's start to the last COPY's end, from the ledger), ``wait_finalize``, then
    finalize's own (``check``, ``indexes``, ``constraints``, ``analyze``, ``swap`` and
    ``drop_old``, or ``insert``; the in-process runner adds ``cleanup``).
    ``started_at``/``ended_at``: epoch seconds of prepare's start and of the load's end; they
    add up: ``wall_seconds`` is ``ended_at - started_at``, and rows/s and MB/s are over that
    span. Figures of finalize alone (``started_at`` 0) say so.

    ``records`` is what the COPY tasks read from the source and sent; every one of them was
    accounted for (``rows`` loaded + ``rejects`` set aside), or the load failed.

    ``inserted``/``updated``: an upsert's new rows and rows replaced (``None``: not an upsert,
    or a finalize retried after its commit); loaded rows beyond their sum were superseded by a
    later row with the same key.

    ``changes``: what the load did to the target, or to each table partition it touched
    (:class:`TableChange`); ``table_rows``: the rows the target holds after the load (None:
    unknown), an estimate when ``table_rows_estimated`` (the catalog's, for the rows the load
    did not touch: finalize never counts the target); None and not estimated: not summed (a
    load into some of a target's many partitions:
    :data:`airflow_pg_bulk.loading.changes.SUMMED_PARTITIONS`). Both empty for a finalize
    retried after its commit. ``reject_table``: where rejected rows went (``schema.table``;
    None: not rejecting)."""

    table: str
    mode: str
    rows: int
    bytes: int
    partitions: int
    seconds: dict[str, float]
    rejects: int = 0
    records: int = 0
    started_at: float = 0.0
    ended_at: float = 0.0
    inserted: int | None = None
    updated: int | None = None
    changes: tuple[TableChange, ...] = ()
    table_rows: int | None = None
    table_rows_estimated: bool = False
    reject_table: str | None = None

    @property
    def whole(self) -> bool:
        """Whether the figures span the whole load (prepare's start known), not finalize alone."""
        return bool(self.started_at and self.ended_at)

    @property
    def wall_seconds(self) -> float:
        """Wall seconds from prepare's start to the end (the sum of the phases without them)."""
        if self.whole:
            return self.ended_at - self.started_at
        return sum(self.seconds.values())

    @property
    def total_seconds(self) -> float:
        """Wall seconds of the load (:attr:`wall_seconds`)."""
        return self.wall_seconds

    @property
    def rows_per_second(self) -> float:
        """Rows loaded per wall second, end to end."""
        return self.rows / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def megabytes_per_second(self) -> float:
        """Source megabytes (10^6 bytes) loaded per wall second, end to end."""
        return self.bytes / 1e6 / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def superseded(self) -> int | None:
        """An upsert's loaded rows superseded by a later row with the same key (``rows -
        inserted - updated``); None when :attr:`inserted` and :attr:`updated` are."""
        if self.inserted is None or self.updated is None:
            return None
        return self.rows - self.inserted - self.updated

    def to_dict(self) -> dict[str, Any]:
        """The fields, plus ``wall_seconds``, ``rows_per_second``, ``megabytes_per_second``,
        ``superseded`` and ``copy_streams`` (derived: :meth:`from_dict` ignores them).
        ``copy_streams`` is ``partitions`` (the COPY streams the load was cut into, not table
        partitions) under the name the logs and docs use; ``partitions`` stays for readers of
        the old key."""
        return {
            **super().to_dict(),
            "copy_streams": self.partitions,
            "wall_seconds": self.wall_seconds,
            "rows_per_second": self.rows_per_second,
            "megabytes_per_second": self.megabytes_per_second,
            "superseded": self.superseded,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadSummary:  # type: ignore[override]
        """Rebuild from :meth:`to_dict` output (the derived figures are recomputed)."""
        derived = (
            "wall_seconds",
            "rows_per_second",
            "megabytes_per_second",
            "superseded",
            "copy_streams",
        )
        return super().from_dict({k: v for k, v in data.items() if k not in derived})

    def what_changed(self, most: int | None = None) -> list[str]:
        """Each change in words (the first ``most``, then how many more), then the rows the
        target holds; empty when the changes are not known."""
        if not self.changes:
            return []
        shown = self.changes if most is None else self.changes[:most]
        lines = [c.describe() for c in shown]
        if len(shown) < len(self.changes):
            lines.append(f"... and {len(self.changes) - len(shown)} more table partitions")
        if self.table_rows is None and not self.table_rows_estimated:  # not summed
            return lines
        holds = rows_in_words(self.table_rows, self.table_rows_estimated)
        return [*lines, f"{self.table} holds {holds} rows now"]

    def describe(self) -> str:
        """A short human-readable report."""
        mb = self.bytes / 1e6
        span = "" if self.whole else " (finalize alone: prepare and COPY not included)"
        where = f" {self.reject_table}" if self.reject_table else ""
        lines = [
            f"Loaded {self.rows:,} rows ({mb:,.1f} MB, {self.partitions} COPY streams) into "
            f"{self.table} ({self.mode}) in {self.wall_seconds:.2f} s{span}: "
            f"{self.rows_per_second:,.0f} rows/s, {self.megabytes_per_second:,.1f} MB/s",
        ]
        lines.append(
            f"  {self.records:,} records read from the source: {self.rows:,} loaded, "
            f"{self.rejects:,} rejected"
            + (f" (see the reject table{where})" if self.rejects else "")
        )
        if self.superseded is not None:
            lines.append(
                f"  upsert: {self.inserted:,} rows inserted, {self.updated:,} updated, "
                f"{self.superseded:,} superseded by a later row with the same key"
            )
        lines += [f"  {line}" for line in self.what_changed()]
        for name, secs in self.seconds.items():
            note = f"  ({WAIT_PHASES[name]})" if name in WAIT_PHASES else ""
            lines.append(f"  {name:<14} {secs:8.2f} s{note}")
        return "\n".join(lines)


def whole_load(
    finalized: LoadSummary,
    plan: LoadPlan,
    copies: tuple[float, float] | None,
    ended_at: float,
) -> LoadSummary:
    """The load's figures from prepare's start to ``ended_at`` (epoch seconds, after the swap
    or insert), from finalize's figures, the plan's prepare times and the COPY span.

    The phases add up to the wall time: ``wait_copy`` and ``wait_finalize`` are what lies
    between the steps (a negative gap, from clocks of different hosts, counts as 0). Without
    prepare's times in the plan (a plan made by hand) the figures stay finalize's alone."""
    if not plan.started_at or not plan.prepared_at or copies is None:
        return finalized
    first, last = copies
    finalize_work = sum(finalized.seconds.values())
    seconds = {
        "prepare": plan.prepared_at - plan.started_at,
        "wait_copy": max(0.0, first - plan.prepared_at),
        "copy": max(0.0, last - first),
        "wait_finalize": max(0.0, ended_at - finalize_work - last),
        **finalized.seconds,
    }
    return dataclasses.replace(
        finalized, seconds=seconds, started_at=plan.started_at, ended_at=ended_at
    )


def with_phase(summary: LoadSummary, name: str, started_at: float, ended_at: float) -> LoadSummary:
    """The figures with one more phase at the end (the runner's cleanup): whole-load figures
    then end at ``ended_at``, the phase taking all the time since they ended."""
    if not summary.whole:
        return dataclasses.replace(
            summary, seconds={**summary.seconds, name: ended_at - started_at}
        )
    return dataclasses.replace(
        summary, seconds={**summary.seconds, name: ended_at - summary.ended_at}, ended_at=ended_at
    )


def stamp_prepare(plan: LoadPlan, started_at: float, prepared_at: float) -> LoadPlan:
    """The plan carrying prepare's start and end (epoch seconds) to finalize's figures."""
    return dataclasses.replace(plan, started_at=started_at, prepared_at=prepared_at)
