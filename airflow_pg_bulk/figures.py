"""The figures a load reports: rows, bytes, seconds per phase, throughput."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from airflow_pg_bulk.plan import PlainData


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


@dataclass(frozen=True)
class LoadSummary(PlainData):
    """A whole load's figures.

    ``records`` is what the COPY tasks read from the source and sent; every one of them was
    accounted for (``rows`` loaded + ``rejects`` set aside), or the load failed."""

    table: str
    mode: str
    rows: int
    bytes: int
    partitions: int
    seconds: dict[str, float]
    rejects: int = 0
    records: int = 0

    @property
    def total_seconds(self) -> float:
        """Wall seconds of all phases."""
        return sum(self.seconds.values())

    @property
    def rows_per_second(self) -> float:
        """Rows loaded per wall second, end to end."""
        return self.rows / self.total_seconds if self.total_seconds else 0.0

    @property
    def megabytes_per_second(self) -> float:
        """Source megabytes (10^6 bytes) loaded per wall second, end to end."""
        return self.bytes / 1e6 / self.total_seconds if self.total_seconds else 0.0

    def describe(self) -> str:
        """A short human-readable report."""
        mb = self.bytes / 1e6
        lines = [
            f"Loaded {self.rows:,} rows ({mb:,.1f} MB, {self.partitions} partitions) into "
            f"{self.table} ({self.mode}) in {self.total_seconds:.2f} s: "
            f"{self.rows_per_second:,.0f} rows/s, {self.megabytes_per_second:,.1f} MB/s",
        ]
        lines.append(
            f"  {self.records:,} records read from the source: {self.rows:,} loaded, "
            f"{self.rejects:,} rejected" + (" (see the reject table)" if self.rejects else "")
        )
        lines += [f"  {name:<12} {secs:8.2f} s" for name, secs in self.seconds.items()]
        return "\n".join(lines)

    def with_seconds(self, more: dict[str, float]) -> LoadSummary:
        """A copy with phases added in front (prepare, copy) of the finalize phases."""
        merged: dict[str, Any] = {**more, **self.seconds}
        return dataclasses.replace(self, seconds=merged)
