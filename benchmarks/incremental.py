"""Incremental loads beside the hand-written way, in the same run (issue 7's targets).

    python -m benchmarks.incremental --conn DSN [--meters 15000] [--scenarios a,b] [--json F]

Workload A's shape (``readings``: id PK, meter_id FK to ``meters``, reading, date), one reading
per meter and day, ``id = (meter - 1) * 100000 + day + 1`` so that a day's rows have the same
keys whenever they are generated (an upsert re-sends them with new readings).

Each scenario starts from a base table (the target before the load: built once per base size,
logged, PK + FK, vacuumed and analyzed, not timed) cloned for every method with
``CREATE DATABASE ... TEMPLATE ... STRATEGY FILE_COPY``, so that the project and the hand-written
way start from byte-identical targets. Before each timed load: CHECKPOINT. After it: the row
count and an order-independent checksum of the result, which must equal the other method's.

The figures go to stdout, ``--json`` and ``--out`` (markdown). Only psycopg and the package's
in-process runner are needed (no Airflow), so it runs on a bare machine given a server.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python benchmarks/incremental.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_pg_bulk import runner
from airflow_pg_bulk.demo import workload as demo_workload
from benchmarks.server import postmaster_of, server_processes

REPO = Path(__file__).resolve().parent.parent
SCHEMA = "bench_inc"
TABLE = "readings"
DAYS_PER_YEAR = 365
log = logging.getLogger("benchmarks.incremental")


@dataclass(frozen=True)
class Scenario:
    """One incremental load: the target holds ``base_days`` days, the load brings
    ``load_days`` (first, last) days; ``project`` and ``hand`` are compared by ``target``."""

    name: str
    title: str
    base_days: int  # days 0..base_days-1 in the target before the load
    load_days: tuple[int, int]  # first, last day (inclusive) of the loaded files
    files: int
    project: dict[str, Any]  # runner.load options
    hand: str  # plain_copy | on_conflict | project_replace
    target: str  # "faster:2.0" (hand / project >= 2) or "within:1.1" (project / hand <= 1.1)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "append_year_empty",
        "append a year into an empty table, vs a replace of the same rows",
        0,
        (0, DAYS_PER_YEAR - 1),
        8,
        {"mode": "append"},
        "project_replace",
        "within:1.15",
    ),
    Scenario(
        "append_6_on_6",
        "append 6 months onto 6 months, vs one plain COPY into the target",
        182,
        (182, 363),
        8,
        {"mode": "append"},
        "plain_copy",
        "faster:2.0",
    ),
    Scenario(
        "append_day_on_5y",
        "append one day onto 5 years, vs one plain COPY into the target",
        5 * DAYS_PER_YEAR,
        (5 * DAYS_PER_YEAR, 5 * DAYS_PER_YEAR),
        2,
        {"mode": "append"},
        "plain_copy",
        "within:1.1",
    ),
    Scenario(
        "upsert_12_on_12",
        "upsert 12 months (6 overlapping) onto 12 months, vs COPY to temp + ON CONFLICT",
        DAYS_PER_YEAR,
        (182, 182 + DAYS_PER_YEAR - 1),
        8,
        {"mode": "upsert"},
        "on_conflict",
        "faster:2.0",
    ),
    Scenario(
        "upsert_day_on_5y",
        "upsert one day (its rows re-sent, changed) onto 5 years, vs COPY to temp + ON CONFLICT",
        5 * DAYS_PER_YEAR,
        (5 * DAYS_PER_YEAR - 1, 5 * DAYS_PER_YEAR - 1),
        2,
        {"mode": "upsert"},
        "on_conflict",
        "within:1.1",
    ),
)


@dataclass
class Result:
    """One scenario's figures."""

    name: str
    title: str
    rows_before: int
    rows_loaded: int
    rows_after: int
    project_s: float
    hand_s: float
    hand: str
    target: str
    ratio: float  # project / hand
    met: bool
    same_result: bool
    project_phases: dict[str, float] = field(default_factory=dict)
    strategy: str | None = None


# --- SQL of the benchmark's own (data generation, hand-written loads) -------------------------

_ROWS = sql.SQL(
    "SELECT (m - 1) * 100000 + d + 1 AS id, m AS meter_id,"
    " round(random()::numeric, 6)::float8 AS reading, {start}::date + d AS date"
    " FROM generate_series({m0}, {m1}) m, generate_series({d0}, {d1}) d ORDER BY m, d"
)


def _rows(meters: tuple[int, int], days: tuple[int, int]) -> sql.Composed:
    return _ROWS.format(
        start=sql.Literal(demo_workload.START_DATE),
        m0=sql.Literal(meters[0]),
        m1=sql.Literal(meters[1]),
        d0=sql.Literal(days[0]),
        d1=sql.Literal(days[1]),
    )


def write_files(
    dsn: str, directory: Path, meters: int, days: tuple[int, int], files: int
) -> list[Path]:
    """The loaded CSV files (header line), meters split evenly, written by the server."""
    directory.mkdir(parents=True, exist_ok=True)
    per = -(-meters // files)
    paths = []
    with psycopg.connect(dsn) as conn:
        for n in range(files):
            first, last = n * per + 1, min(meters, (n + 1) * per)
            if first > last:
                break
            path = directory / f"readings-{n:03d}.csv"
            query = sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv, HEADER true)").format(
                _rows((first, last), days)
            )
            with conn.cursor() as cur, cur.copy(query) as copy, open(path, "wb") as out:
                for block in copy:
                    out.write(block)
            paths.append(path)
    return paths


def _dsn_for(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def _admin(dsn: str, statement: sql.Composable) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def build_base(dsn: str, dbname: str, meters: int, days: int, jobs: int = 1) -> None:
    """A database holding the target before the load: meters, and ``days`` days of readings
    (logged, PK + FK, vacuumed and analyzed, as a table that has lived a while). The rows go
    in on ``jobs`` connections at once, before the PK and FK are added (none of it timed)."""
    _admin(dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
    _admin(dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    base = _dsn_for(dsn, dbname)
    target = sql.Identifier(SCHEMA, TABLE)
    with psycopg.connect(base) as conn:
        demo_workload.create_schema(conn, SCHEMA, readings_tables=(TABLE,))
        demo_workload.fill_meters(conn, SCHEMA, meters)
        names = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype IN ('p', 'f') ORDER BY contype DESC",
            (f"{SCHEMA}.{TABLE}",),
        ).fetchall()  # p before f
        for name, _ in names:
            conn.execute(
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(target, sql.Identifier(name))
            )
        conn.commit()
    if days:
        per = -(-meters // jobs)
        ranges = [
            (n * per + 1, min(meters, (n + 1) * per)) for n in range(jobs) if n * per < meters
        ]

        def fill(first_last: tuple[int, int]) -> None:
            with psycopg.connect(base) as conn:
                conn.execute(
                    sql.SQL("INSERT INTO {} OVERRIDING SYSTEM VALUE {}").format(
                        target, _rows(first_last, (0, days - 1))
                    )
                )

        with ThreadPoolExecutor(max_workers=len(ranges)) as pool:
            list(pool.map(fill, ranges))
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("SET max_parallel_maintenance_workers = 8"))
        for name, definition in names:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                    target, sql.Identifier(name), sql.SQL(definition)
                )
            )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(target))


def clone(dsn: str, base: str, dbname: str) -> str:
    """A copy of the base database, file by file; returns its DSN."""
    _admin(dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
    _admin(
        dsn,
        sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
            sql.Identifier(dbname), sql.Identifier(base)
        ),
    )
    return _dsn_for(dsn, dbname)


def result_of(dsn: str, table: str = TABLE) -> tuple[int, int]:
    """Row count and an order-independent checksum (sum of row hashes) of ``table``."""
    with psycopg.connect(dsn) as conn:
        count, total = conn.execute(
            sql.SQL(
                "SELECT count(*), coalesce(sum(hashtextextended(t::text, 0)), 0) FROM {} t"
            ).format(sql.Identifier(SCHEMA, table))
        ).fetchone()
    return count, int(total)


def _checkpoint(dsn: str) -> None:
    _admin(dsn, sql.SQL("CHECKPOINT"))


def plain_copy(dsn: str, files: list[Path]) -> None:
    """The hand-written append: one COPY per file into the indexed target, one transaction."""
    with psycopg.connect(dsn) as conn:
        demo_workload.naive_copy(conn, SCHEMA, TABLE, files)


def on_conflict(dsn: str, files: list[Path]) -> None:
    """The hand-written upsert: COPY into a temp table, then INSERT ... ON CONFLICT DO UPDATE."""
    target = sql.Identifier(SCHEMA, TABLE)
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("CREATE TEMP TABLE batch (LIKE {} ) ON COMMIT DROP").format(target))
        copy_sql = sql.SQL(
            "COPY batch (id, meter_id, reading, date) FROM STDIN WITH (FORMAT csv, HEADER true)"
        )
        with conn.cursor() as cur:
            for path in files:
                with cur.copy(copy_sql) as copy, open(path, "rb") as f:
                    while block := f.read(1 << 20):
                        copy.write(block)
        conn.execute(
            sql.SQL(
                "INSERT INTO {} OVERRIDING SYSTEM VALUE SELECT * FROM batch ON CONFLICT (id) DO"
                " UPDATE SET meter_id = EXCLUDED.meter_id, reading = EXCLUDED.reading,"
                " date = EXCLUDED.date"
            ).format(target)
        )
        conn.commit()


def project(dsn: str, files: list[Path], options: dict[str, Any], partitions: int) -> Any:
    """The project's in-process load."""
    return runner.load(
        dsn,
        f"{SCHEMA}.{TABLE}",
        [str(p) for p in files],
        header=True,
        partitions=partitions,
        **options,
    )


class Pinning:
    """Emulate a smaller machine on a bigger one: the timed loads run with the server's
    processes (its postmaster and children: the server at ``dsn`` must run on this machine;
    other servers are left alone) and this one on ``cpus`` (``taskset``), the untimed base
    builds on all cores. New backends inherit the postmaster's affinity."""

    def __init__(self, cpus: str | None, dsn: str) -> None:
        self.cpus = cpus
        self.dsn = dsn

    def _set(self, cpus: str) -> None:
        with psycopg.connect(self.dsn) as conn:
            postmaster = postmaster_of(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        if postmaster is None:
            raise RuntimeError(f"--pin: the server at {self.dsn} does not run on this machine")
        for pid in server_processes(postmaster):
            subprocess.run(["taskset", "-a", "-cp", cpus, str(pid)], capture_output=True)
        wanted = set()
        for part in cpus.split(","):
            first, _, last = part.partition("-")
            wanted.update(range(int(first), int(last or first) + 1))
        os.sched_setaffinity(0, wanted)

    def narrow(self) -> None:
        """Timed work from here: on ``cpus`` only."""
        if self.cpus:
            self._set(self.cpus)

    def widen(self) -> None:
        """Untimed work from here: on every core."""
        if self.cpus:
            self._set(f"0-{(os.cpu_count() or 1) - 1}")


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def run_scenario(
    dsn: str,
    scenario: Scenario,
    meters: int,
    workdir: Path,
    partitions: int,
    bases: set[int],
    pinning: Pinning,
) -> Result:
    """Build (or reuse) the base, then the project's load and the hand-written one, each on
    its own clone; check both give the same rows."""
    base = f"inc_base_{scenario.base_days}"
    if scenario.base_days not in bases:
        log.info("building the base: %d days x %d meters", scenario.base_days, meters)
        pinning.widen()
        build_base(dsn, base, meters, scenario.base_days, jobs=os.cpu_count() or 1)
        pinning.narrow()
        bases.add(scenario.base_days)
    files = write_files(dsn, workdir / scenario.name, meters, scenario.load_days, scenario.files)
    rows_before = meters * scenario.base_days
    loaded = meters * (scenario.load_days[1] - scenario.load_days[0] + 1)

    ours = clone(dsn, base, f"inc_{scenario.name}_project")
    _checkpoint(dsn)
    project_s, summary = _timed(lambda: project(ours, files, scenario.project, partitions))
    ours_result = result_of(ours)

    theirs = clone(dsn, base, f"inc_{scenario.name}_hand")
    _checkpoint(dsn)
    if scenario.hand == "plain_copy":
        hand_s, _ = _timed(lambda: plain_copy(theirs, files))
    elif scenario.hand == "on_conflict":
        hand_s, _ = _timed(lambda: on_conflict(theirs, files))
    else:  # project_replace
        hand_s, _ = _timed(
            lambda: project(theirs, files, {**scenario.project, "mode": "replace"}, partitions)
        )
    theirs_result = result_of(theirs)
    for db in (f"inc_{scenario.name}_project", f"inc_{scenario.name}_hand"):
        _admin(dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))

    kind, bound = scenario.target.split(":")
    ratio = project_s / hand_s
    met = (hand_s / project_s >= float(bound)) if kind == "faster" else (ratio <= float(bound))
    phases = dict(getattr(summary, "seconds", {}) or {})
    return Result(
        scenario.name,
        scenario.title,
        rows_before,
        loaded,
        ours_result[0],
        round(project_s, 3),
        round(hand_s, 3),
        scenario.hand,
        scenario.target,
        round(ratio, 3),
        met,
        ours_result == theirs_result,
        {k: round(v, 3) for k, v in phases.items()},
        getattr(summary, "strategy", None),
    )


def _target_words(r: Result) -> str:
    kind, bound = r.target.split(":")
    if kind == "faster":
        return f"project >= {bound}x faster: {r.hand_s / r.project_s:.2f}x"
    return f"project <= {bound}x the hand way: {r.ratio:.2f}x"


def markdown(results: list[Result], header: dict[str, Any]) -> str:
    """The results as a markdown section."""
    lines = [
        "# Incremental loads (issue 7), beside the hand-written way",
        "",
        f"Written by `{header['command']}` on {header['when']}.",
        "",
        *(f"- {k}: {v}" for k, v in header.items() if k not in ("command", "when")),
        "",
        "| scenario | rows before | rows loaded | rows after | project s | hand-written s"
        " | target | met | same rows | project phases |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r.project_phases.items())
        lines.append(
            f"| {r.title} | {r.rows_before:,} | {r.rows_loaded:,} | {r.rows_after:,}"
            f" | {r.project_s:.2f} | {r.hand_s:.2f} ({r.hand}) | {_target_words(r)}"
            f" | {'**met**' if r.met else '**missed**'} | {'yes' if r.same_result else 'NO'}"
            f" | {phases} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios against ``--conn``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conn", required=True, help="libpq DSN of the server (a superuser)")
    p.add_argument("--meters", type=int, default=15_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--out", default=None, help="markdown file to write")
    p.add_argument("--note", default="", help="a line on the machine (cores, pinning)")
    p.add_argument(
        "--pin",
        default=None,
        help="cpus (taskset list, e.g. 0,1) for the timed loads: the server's processes and"
        " this one; base builds use every core",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    wanted = args.scenarios.split(",")
    unknown = set(wanted) - {s.name for s in SCENARIOS}
    if unknown:
        p.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pgbulk-inc-"))
    with psycopg.connect(args.conn) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    started = time.perf_counter()
    results, bases = [], set()
    pinning = Pinning(args.pin, args.conn)
    pinning.narrow()
    try:
        for scenario in SCENARIOS:
            if scenario.name in wanted:
                r = run_scenario(
                    args.conn, scenario, args.meters, workdir, args.partitions, bases, pinning
                )
                log.info("%s", json.dumps(asdict(r)))
                results.append(r)
    finally:
        pinning.widen()  # the server as it was found: on every core
    for days in bases:
        _admin(
            args.conn,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(f"inc_base_{days}")
            ),
        )
    header = {
        "command": "python -m benchmarks.incremental " + " ".join(argv or sys.argv[1:]),
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"nproc {os.cpu_count()}, {platform.machine()}; {args.note}".rstrip("; "),
        "server": f"PostgreSQL {version}",
        "project": f"in-process runner, {args.partitions} partitions, strategy auto",
        "run took": f"{time.perf_counter() - started:.0f} s; one run per method",
    }
    text = markdown(results, header)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"header": header, "results": [asdict(r) for r in results]}, indent=2)
        )
    return 0 if all(r.same_result for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
