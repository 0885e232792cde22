"""A year of readings into a table partitioned by month: the project beside the other ways.

    python -m benchmarks.partitioned --conn DSN [--scenario year|one_month|one_day]
        [--meters 15000] [--partitions N] [--pin 0,1] [--json F]

``--partitions``: the project's COPY streams; default 2 for ``year``, and for a reload the
project's own default (one stream per ``partition_size`` of input: one for a day or a month).
A reload's base holds the load history (``pgbulk_loads``) a target loaded daily has after its
first load, so that its one-time creation is not timed.

Scenario ``year`` (the default). The target: ``readings`` (id, meter_id FK to ``meters``,
reading, date), PRIMARY KEY (id, date), ``PARTITION BY RANGE (date)`` into 12 monthly
partitions, empty; the load: a year of readings (one per meter and day, from 2019-02-01), one
CSV file per month. Methods, each on its own ``FILE_COPY`` clone of the same base database,
CHECKPOINT before, count and checksum after (they must be equal):

- ``copy_parent``: one COPY per file into the partitioned parent, one transaction (its
  indexes and foreign key checked row by row);
- ``project``: ``mode="replace_partitions"`` through the in-process runner (staging
  partitioned like the target, each month built standalone and attached);
- ``by_hand``: each month a standalone table (COPY, ADD PRIMARY KEY, a CHECK of its bounds,
  FK NOT VALID + VALIDATE, ANALYZE), then DETACH/DROP of the empty partitions and ATTACH x 12
  in one transaction: what the project automates.

Scenario ``one_month``: the target holds 5 years (60 monthly partitions from 2019-02-01, filled,
PK + FK, VACUUM ANALYZE; built untimed), and the load is its last month (2024-01) re-sent with
new readings for the same keys, one file. Methods: ``floor`` (that month's rows COPYed into an
UNLOGGED table with no index), ``project`` and ``by_hand`` (as above, one month: the standalone
table, then DETACH + DROP of the old month and ATTACH of the new in one transaction).
``project`` and ``by_hand`` must leave the same target (count and checksum); the month's
partition must hold the floor table's rows. The ratio to the floor depends on the month's rows,
not on the 59 partitions that are not touched.

Scenario ``one_day`` (issue 17's daily reload): the same with ``--days`` daily partitions
(1,826 by default: five years) and the last day re-sent; methods as ``one_month``, plus
``delete_copy`` (DELETE of the day and COPY into the parent, one transaction) and
``split_floor``: a yardstick, the least any load split into prepare, COPY and finalize tasks
(staging, a ledger, the load history) must do, each step in as few round trips as it allows
(see :func:`split_floor`); the project's distance to it is its own statements. For either
reload, ``--reload N`` re-sends the partition of index N (0: the first) instead of the last:
an older one, as a backfill's, which the project finds by partition pruning rather than
among the newest partitions.

The project's phases (``LoadSummary.seconds``) are printed and written to ``--json``; for a
reload, each method's CPU too (medians of the runs): the client's (this thread's: a reload's
one COPY stream runs on it) and its server backends' (``/proc/<pid>/schedstat``, read when
the server runs on this machine), steadier than the wall time on a busy machine.

Needs only psycopg and the package (no Airflow). Do not run it at full size on a shared
machine: ``--meters 200`` checks that it works in seconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python benchmarks/partitioned.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from airflow_pg_bulk import runner
from airflow_pg_bulk.demo import workload as demo_workload
from airflow_pg_bulk.plan import LOAD_HISTORY_TABLE
from airflow_pg_bulk.plan.figures import LoadSummary
from airflow_pg_bulk.target import history
from benchmarks.incremental import (
    SCHEMA,
    TABLE,
    Pinning,
    _admin,
    _checkpoint,
    _rows,
    _timed,
    clone,
    result_of,
)

log = logging.getLogger("benchmarks.partitioned")

#: CPU seconds of each server backend a method's connections used (see _Counted)
SERVER_CPU: list[float] = []


class _Counted(psycopg.Connection):
    """A connection that, as it closes, adds its backend's CPU time to SERVER_CPU: the
    process's ``/proc/<pid>/schedstat`` (time on a CPU, in ns), read only when the server
    runs on this machine (Linux) and the process is a PostgreSQL backend; else nothing. A
    load's CPU, client and server, is steady where its wall time is not (a busy machine,
    a neighbour on the host)."""

    def close(self) -> None:
        if not self.closed:
            seconds = backend_cpu(self.info.backend_pid)
            if seconds is not None:
                SERVER_CPU.append(seconds)
        super().close()


def backend_cpu(pid: int) -> float | None:
    """CPU seconds the PostgreSQL backend ``pid`` has used (``/proc/<pid>/schedstat``);
    None when no such process runs on this machine (a server elsewhere)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"postgres" not in f.read():
                return None
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return None


def _connect(dsn: str, **kwargs: Any) -> psycopg.Connection:
    """A connection of a timed method (its backend's CPU counted)."""
    return _Counted.connect(dsn, **kwargs)


BASE = "part_base"
START = date.fromisoformat(demo_workload.START_DATE)  # 2019-02-01
MONTHS = 12
METHODS = ("floor", "copy_parent", "project", "by_hand")
FLOOR_TABLE = "floor_copy"
FIVE_YEARS = 60  # monthly partitions of the one_month scenario's target
ONE_MONTH = FIVE_YEARS - 1  # the month it re-sends: the last (2024-01)
FIVE_YEARS_OF_DAYS = 1826  # daily partitions of the one_day scenario's target (--days)
RELOAD = ("floor", "project", "by_hand", "delete_copy")
SCENARIOS = {"year": METHODS, "one_month": RELOAD, "one_day": (*RELOAD, "split_floor")}


# the partitions' span: a month, or a day for the one_day scenario (set by main)
_DAILY = {"on": False}


def _month(n: int) -> tuple[date, date]:
    """The first day of the ``n``-th month from START, and of the next (with daily
    partitions: the ``n``-th day from START, and the next)."""
    if _DAILY["on"]:
        first = START + timedelta(days=n)
        return first, first + timedelta(days=1)
    y, m = divmod(START.month - 1 + n, 12)
    y2, m2 = divmod(START.month + n, 12)
    return date(START.year + y, m + 1, 1), date(START.year + y2, m2 + 1, 1)


def _partition(n: int) -> str:
    return f"{TABLE}_{_month(n)[0]:{'%Y_%m_%d' if _DAILY['on'] else '%Y_%m'}}"


def build_base(dsn: str, meters: int, months: int = MONTHS, jobs: int = 0) -> None:
    """meters, and the partitioned target with ``months`` monthly partitions: empty, or with
    ``jobs`` > 0 filled (one reading per meter and day) on ``jobs`` connections at once, each
    partition's PK and FK built on them before the parent's (which adopt them), then VACUUM
    ANALYZE (the target of a load into a table that has lived a while; none of it timed)."""
    _admin(dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BASE)))
    _admin(dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BASE)))
    params = psycopg.conninfo.conninfo_to_dict(dsn) | {"dbname": BASE}
    with psycopg.connect(psycopg.conninfo.make_conninfo(**params)) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(
                sql.Identifier(SCHEMA, "meters")
            )
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint NOT NULL, meter_id bigint, reading double precision,"
                " date date NOT NULL) PARTITION BY RANGE (date)"
            ).format(sql.Identifier(SCHEMA, TABLE))
        )
        for n in range(months):
            first, after = _month(n)
            conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                    sql.Identifier(SCHEMA, _partition(n)),
                    sql.Identifier(SCHEMA, TABLE),
                    sql.Literal(first),
                    sql.Literal(after),
                )
            )
        conn.commit()
    base = psycopg.conninfo.make_conninfo(**params)
    with psycopg.connect(base) as conn:
        demo_workload.fill_meters(conn, SCHEMA, meters)
    if jobs:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(lambda n: _fill_partition(base, meters, n), range(months)))
    with psycopg.connect(base, autocommit=True) as conn:
        for statement in _KEYS:
            conn.execute(statement.format(sql.Identifier(SCHEMA, TABLE), _METERS))
        if jobs:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(SCHEMA, TABLE)))
    if jobs:  # a target loaded daily has the load history its first load made (untimed)
        with psycopg.connect(base) as conn:
            history.ensure(conn, (SCHEMA, LOAD_HISTORY_TABLE))
            conn.commit()


_METERS = sql.Identifier(SCHEMA, "meters")
_KEYS = (  # the target's PK and FK, for the parent and (adopted by it) each partition
    sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id, date)"),
    sql.SQL(
        "ALTER TABLE {} ADD CONSTRAINT fk_readings_meters FOREIGN KEY (meter_id) REFERENCES {}"
    ),
)


def _fill_partition(dsn: str, meters: int, n: int) -> None:
    """Month ``n``'s readings into its partition, then its PK and FK (the base, untimed)."""
    first, after = _month(n)
    days = ((first - START).days, (after - START).days - 1)
    partition = sql.Identifier(SCHEMA, _partition(n))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {} {}").format(partition, _rows((1, meters), days)))
        for statement in _KEYS:
            conn.execute(statement.format(partition, _METERS))


def write_files(
    dsn: str, directory: Path, meters: int, months: Sequence[int] = range(MONTHS)
) -> list[Path]:
    """One CSV file (header line) per month of ``months`` (indexes from START), all meters,
    written by the server (new random readings: a month of the base re-sent, changed)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    with psycopg.connect(dsn) as conn:
        for n in months:
            first, after = _month(n)
            days = ((first - START).days, (after - START).days - 1)
            path = directory / f"readings-{first:%Y-%m}.csv"
            query = sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv, HEADER true)").format(
                _rows((1, meters), days)
            )
            with conn.cursor() as cur, cur.copy(query) as copy, open(path, "wb") as out:
                for block in copy:
                    out.write(block)
            paths.append(path)
    return paths


def _copy_file(conn: psycopg.Connection, table: str, path: Path) -> None:
    statement = sql.SQL(
        "COPY {} (id, meter_id, reading, date) FROM STDIN WITH (FORMAT csv, HEADER true)"
    ).format(sql.Identifier(SCHEMA, table))
    with conn.cursor() as cur, cur.copy(statement) as copy, open(path, "rb") as f:
        while block := f.read(1 << 20):
            copy.write(block)


def floor(dsn: str, files: list[Path], _partitions: int) -> None:
    """The floor: one COPY per file into an UNLOGGED table with no index, constraint or
    partitioning, one transaction (not a usable result; the speed limit of one stream)."""
    with _connect(dsn) as conn:
        conn.execute(
            sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {})").format(
                sql.Identifier(SCHEMA, FLOOR_TABLE), sql.Identifier(SCHEMA, TABLE)
            )
        )
        for path in files:
            _copy_file(conn, FLOOR_TABLE, path)
        conn.commit()


def copy_parent(dsn: str, files: list[Path], _partitions: int) -> None:
    """One COPY per file into the partitioned parent, in one transaction."""
    with _connect(dsn) as conn:
        for path in files:
            _copy_file(conn, TABLE, path)
        conn.commit()


def project(dsn: str, files: list[Path], partitions: int | None) -> LoadSummary:
    """The project: replace_partitions, in process; its figures (phases in ``.seconds``);
    ``partitions`` None: as many COPY streams as the project's default cuts the files into."""
    return runner.load(
        lambda: _connect(dsn, application_name="airflow-pg-bulk"),
        f"{SCHEMA}.{TABLE}",
        [str(p) for p in files],
        mode="replace_partitions",
        header=True,
        partitions=partitions,
    )


def by_hand(
    dsn: str, files: list[Path], _partitions: int, months: Sequence[int] | None = None
) -> None:
    """Each month standalone, then DETACH + DROP of the old partitions and ATTACH of the new
    in one transaction; ``months``: the month (index from START) of each file, default 0, 1…"""
    months = list(range(len(files)) if months is None else months)
    with _connect(dsn, autocommit=True) as conn:
        for n, path in zip(months, files, strict=True):
            first, after = _month(n)
            new = sql.Identifier(SCHEMA, f"new_{n}")
            conn.execute(
                sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(
                    new, sql.Identifier(SCHEMA, TABLE)
                )
            )
            _copy_file(conn, f"new_{n}", path)
            conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id, date)").format(new))
            conn.execute(
                sql.SQL(
                    "ALTER TABLE {} ADD CONSTRAINT bounds CHECK (date >= {} AND date < {})"
                ).format(new, sql.Literal(first), sql.Literal(after))
            )
            conn.execute(
                sql.SQL(
                    "ALTER TABLE {} ADD CONSTRAINT fk_readings_meters FOREIGN KEY (meter_id)"
                    " REFERENCES {} NOT VALID"
                ).format(new, sql.Identifier(SCHEMA, "meters"))
            )
            conn.execute(
                sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT fk_readings_meters").format(new)
            )
            conn.execute(sql.SQL("ANALYZE {}").format(new))
        with conn.transaction():
            for n in months:
                first, after = _month(n)
                old = sql.Identifier(SCHEMA, _partition(n))
                conn.execute(
                    sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                        sql.Identifier(SCHEMA, TABLE), old
                    )
                )
                conn.execute(sql.SQL("DROP TABLE {}").format(old))
                conn.execute(
                    sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                        sql.Identifier(SCHEMA, f"new_{n}"), sql.Identifier(_partition(n))
                    )
                )
                conn.execute(
                    sql.SQL(
                        "ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})"
                    ).format(
                        sql.Identifier(SCHEMA, TABLE), old, sql.Literal(first), sql.Literal(after)
                    )
                )


def delete_copy(
    dsn: str, files: list[Path], _partitions: int, months: Sequence[int] | None = None
) -> None:
    """The other hand-written way: DELETE the period's rows and COPY the file into the parent,
    in one transaction (its PK and FK checked row by row)."""
    months = list(range(len(files)) if months is None else months)
    with _connect(dsn) as conn:
        for n, path in zip(months, files, strict=True):
            first, after = _month(n)
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE date >= {} AND date < {}").format(
                    sql.Identifier(SCHEMA, TABLE), sql.Literal(first), sql.Literal(after)
                )
            )
            _copy_file(conn, TABLE, path)
        conn.commit()


def split_floor(
    dsn: str, files: list[Path], _partitions: int, months: Sequence[int] | None = None
) -> None:
    """A yardstick, not a way to load: the least that any load split into Airflow's prepare,
    COPY and finalize tasks must do beyond the hand-written way, each step in as few round
    trips as it allows: prepare reads the parent's columns, key and triggers and makes a
    staging table and a ledger (one transaction); the COPY task claims its ledger row, COPYs
    and records its count (one); finalize takes an advisory lock, adds up the ledger, finds
    the partition (the planner's partition descriptor, which the INSERT reuses), empties it
    and inserts the staged rows through the parent, and records the load in the history (one);
    then ANALYZE of the partition and DROP of staging and ledger. One period, at most
    IN_PLACE_ROWS rows (the one_day scenario): in place, as the project loads it."""
    (n,) = months if months is not None else [0]
    (path,) = files
    first, _after = _month(n)
    parent = sql.Identifier(SCHEMA, TABLE)
    stage, ledger = sql.Identifier(SCHEMA, "floor_stage"), sql.Identifier(SCHEMA, "floor_ledger")
    with _connect(dsn) as conn:
        conn.execute(
            sql.SQL(
                "SELECT (SELECT json_agg(a) FROM (SELECT attname, format_type(atttypid,"
                " atttypmod), attnotnull FROM pg_attribute WHERE attrelid = {r}::regclass"
                " AND attnum > 0 AND NOT attisdropped) a), pg_get_partkeydef({r}::regclass),"
                " (SELECT count(*) FROM pg_trigger WHERE tgrelid = {r}::regclass"
                " AND NOT tgisinternal)"
            ).format(r=sql.Literal(f"{SCHEMA}.{TABLE}"))
        ).fetchall()
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS);"
                " CREATE TABLE {} (partition int PRIMARY KEY, rows bigint)"
            ).format(stage, parent, ledger)
        )
        conn.commit()
        conn.execute(sql.SQL("INSERT INTO {} VALUES (0, NULL)").format(ledger))
        _copy_file(conn, "floor_stage", path)
        conn.execute(sql.SQL("UPDATE {} SET rows = 1 WHERE partition = 0").format(ledger))
        conn.commit()
        conn.execute(
            sql.SQL("SELECT pg_advisory_xact_lock(1); SELECT sum(rows) FROM {}").format(ledger)
        ).fetchall()
        conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON, COSTS OFF) SELECT 1 FROM {} WHERE date = {}").format(
                parent, sql.Literal(first)
            )
        ).fetchall()
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(SCHEMA, _partition(n))))
        conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(parent, stage))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (load_id, target, mode, rows)"
                " VALUES ({}, {}, 'replace_partitions', 0)"
            ).format(
                sql.Identifier(SCHEMA, LOAD_HISTORY_TABLE),
                sql.Literal(f"floor{time.time_ns()}"),
                sql.Literal(f"{SCHEMA}.{TABLE}"),
            )
        )
        conn.commit()
        conn.autocommit = True
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(SCHEMA, _partition(n))))
        conn.execute(sql.SQL("DROP TABLE {}, {}").format(stage, ledger))


class Reader:
    """Reads one row of another partition than the loaded one every ``pause`` seconds on a
    session of its own while a method runs; ``worst``: the longest read (seconds, as the
    server saw it)."""

    def __init__(self, dsn: str, n: int, pause: float = 0.01) -> None:
        self._query = sql.SQL(
            "SELECT extract(epoch FROM clock_timestamp() - statement_timestamp()), reading"
            " FROM {} WHERE meter_id = 5 AND date = {}"
        ).format(sql.Identifier(SCHEMA, TABLE), sql.Literal(_month(n)[0]))
        self._dsn, self._pause = dsn, pause
        self._stop = threading.Event()
        self.waits: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # each wait as the server saw it, from the statement's arrival (simple query protocol)
        # to its row: its lock waits included, this process's own delays (the GIL it shares
        # with the load) not
        with psycopg.connect(
            self._dsn, autocommit=True, cursor_factory=psycopg.ClientCursor
        ) as conn:
            conn.execute(self._query)  # (the session's first read builds its caches)
            while not self._stop.is_set():
                self.waits.append(float(conn.execute(self._query).fetchone()[0]))
                time.sleep(self._pause)

    def __enter__(self) -> Reader:
        self._thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=60)

    @property
    def worst(self) -> float:
        return max(self.waits, default=0.0)


def _days(months: int) -> int:
    """Days in the first ``months`` months from START."""
    return (_month(months)[0] - START).days


def _phases(summary: LoadSummary) -> dict[str, float]:
    return {k: round(v, 3) for k, v in summary.seconds.items()}


def _run_method(
    args: argparse.Namespace,
    name: str,
    months: list[int],
    files: list[Path],
    one_month: bool,
    leaves: int,
    pinning: Pinning,
) -> dict:
    """One timed run of method ``name`` on a fresh clone of the base; its figures."""
    dsn = clone(args.conn, BASE, f"part_{name}")
    _checkpoint(dsn)
    method = {
        "floor": floor,
        "copy_parent": copy_parent,
        "project": project,
        "by_hand": lambda dsn, files, partitions: by_hand(dsn, files, partitions, months),
        "delete_copy": lambda dsn, files, p: delete_copy(dsn, files, p, months),
        "split_floor": lambda dsn, files, p: split_floor(dsn, files, p, months),
    }[name]
    reader = Reader(dsn, leaves // 2) if one_month and name != "floor" else None
    pinning.narrow()
    SERVER_CPU.clear()
    try:
        if reader is None:
            seconds, out = _timed(lambda: method(dsn, files, args.partitions))
            client = None
        else:
            with reader:
                started = time.thread_time()
                seconds, out = _timed(lambda: method(dsn, files, args.partitions))
                client = time.thread_time() - started
    finally:
        pinning.widen()
    count, checksum = result_of(dsn, FLOOR_TABLE if name == "floor" else TABLE)
    result: dict = {"seconds": round(seconds, 3), "rows": count, "checksum": checksum}
    if reader is not None:
        result["reader_worst_ms"] = round(reader.worst * 1000, 1)
        result["reads"] = len(reader.waits)
    if client is not None and SERVER_CPU:  # (a reload: one COPY stream, on this thread)
        result["cpu_ms"] = {
            "client": round(client * 1000, 1),
            "server": round(sum(SERVER_CPU) * 1000, 1),
        }
    if one_month and name != "floor":  # the period re-sent: the floor table's rows?
        result["month"] = list(result_of(dsn, _partition(months[0])))
    if name == "project":
        result["phases"] = _phases(out)
    log.info("%s: %.3f s, %d rows", name, seconds, count)
    _admin(
        args.conn, sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(f"part_{name}"))
    )
    return result


def main(argv: list[str] | None = None) -> int:
    """Run each method of ``--scenario`` against ``--conn``; exit 1 when their results differ
    or a count is not the one expected."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conn", required=True, help="libpq DSN of the server (a superuser)")
    p.add_argument("--scenario", choices=tuple(SCENARIOS), default="year")
    p.add_argument("--meters", type=int, default=15_000)
    p.add_argument(
        "--days",
        type=int,
        default=FIVE_YEARS_OF_DAYS,
        help="one_day: the target's daily partitions (the last one is reloaded, or --reload)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="the project's COPY streams; default: 2 for the year, the project's own default"
        " (one per partition_size of input) for a reload",
    )
    p.add_argument(
        "--reload",
        type=int,
        default=None,
        help="one_month/one_day: the partition re-sent, by its index from the first (0);"
        " default the last (the newest, as a daily load's)",
    )
    p.add_argument("--methods", default=None, help="default: all of the scenario's")
    p.add_argument(
        "--repeat", type=int, default=1, help="runs of each method (in turn); the median is shown"
    )
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument(
        "--pin",
        default=None,
        help="cpus (taskset list, e.g. 0,1) for the timed loads: the server's processes (its"
        " postmaster and children) and this one; the base build uses every core",
    )
    args = p.parse_args(argv)
    if args.partitions is None and args.scenario == "year":
        args.partitions = 2
    if argv is None:  # the command line (a caller such as the tests keeps its own logging)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    one_month = args.scenario in ("one_month", "one_day")  # one partition reloaded
    _DAILY["on"] = args.scenario == "one_day"
    leaves = args.days if _DAILY["on"] else FIVE_YEARS
    reloaded = leaves - 1 if args.reload is None else args.reload  # default: the last
    if not 0 <= reloaded < leaves:
        p.error(f"--reload: 0 to {leaves - 1}")
    methods = SCENARIOS[args.scenario]
    wanted = args.methods.split(",") if args.methods else list(methods)
    if set(wanted) - set(methods):
        p.error(f"methods of {args.scenario} are {', '.join(methods)}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pgbulk-part-"))
    pinning = Pinning(args.pin, args.conn)
    started = time.perf_counter()
    if one_month:
        build_base(args.conn, args.meters, leaves, jobs=os.cpu_count() or 1)
        months = [reloaded]
    else:
        build_base(args.conn, args.meters)
        months = list(range(MONTHS))
    log.info("base built in %.0f s", time.perf_counter() - started)
    files = write_files(args.conn, workdir, args.meters, months)
    with psycopg.connect(args.conn) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    runs: dict[str, list[dict]] = {name: [] for name in wanted}
    for _round in range(args.repeat):  # the methods in turn, each on a fresh clone
        for name in wanted:
            runs[name].append(_run_method(args, name, months, files, one_month, leaves, pinning))
    results: dict[str, dict] = {}
    for name, done in runs.items():  # the median run, with every run's seconds
        ordered = sorted(done, key=lambda r: r["seconds"])
        results[name] = dict(ordered[(len(ordered) - 1) // 2])
        results[name]["runs"] = [r["seconds"] for r in done]
        if "reader_worst_ms" in ordered[0]:
            results[name]["reader_worst_ms"] = max(r["reader_worst_ms"] for r in done)
        if all("cpu_ms" in r for r in done):  # each part's median, over the runs
            results[name]["cpu_ms"] = {
                part: sorted(r["cpu_ms"][part] for r in done)[(len(done) - 1) // 2]
                for part in ("client", "server")
            }
    _admin(args.conn, sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(BASE)))
    if "project" in results:
        for other in ("floor", "copy_parent", "by_hand", "delete_copy", "split_floor"):
            if other in results:
                results["project"][f"ratio_to_{other}"] = round(
                    results["project"]["seconds"] / results[other]["seconds"], 3
                )
    loaded = args.meters * (_days(months[-1] + 1) - _days(months[0]))
    expected = args.meters * _days(leaves) if one_month else loaded
    targets = {n: r for n, r in results.items() if not (one_month and n == "floor")}
    same = len({(r["rows"], r["checksum"]) for r in targets.values()}) <= 1
    counted = all(r["rows"] == expected for r in targets.values())
    if one_month:  # the month's partition holds the rows sent, as the floor table does
        floor_result = results.get("floor")
        months_seen = {tuple(r["month"]) for r in targets.values()}
        if floor_result:
            months_seen.add((floor_result["rows"], floor_result["checksum"]))
            counted = counted and floor_result["rows"] == loaded
        same = same and len(months_seen) <= 1 and all(m[0] == loaded for m in months_seen)
    header = {
        "command": "python -m benchmarks.partitioned " + " ".join(argv or sys.argv[1:]),
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"nproc {os.cpu_count()}, {platform.machine()}, load average"
        f" {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end",
        "server": f"PostgreSQL {version}",
        "run took": f"{time.perf_counter() - started:.0f} s; {args.repeat} run(s) of each method,"
        " in turn; the median shown",
    }
    if one_month:
        grain = "day" if _DAILY["on"] else "month"
        print(
            f"One {grain} ({loaded:,} rows, {_month(reloaded)[0]}) re-sent into"
            f" {expected:,} rows in {leaves} partitions by {grain}, PK (id, date) + FK"
        )
    else:
        print(f"A year ({expected:,} rows) into 12 monthly partitions, PK (id, date) + FK")
    for key, value in header.items():
        print(f"  {key}: {value}")
    print(
        "| method | seconds (median) | runs | rows | same result | reader's worst wait (ms)"
        " | CPU ms, client + server (medians) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        worst = r.get("reader_worst_ms", "")
        every = ", ".join(f"{x:.3f}" for x in r["runs"])
        cpu = r.get("cpu_ms")
        spent = f"{cpu['client']} + {cpu['server']}" if cpu else ""
        print(
            f"| `{name}` | {r['seconds']:.3f} | {every} | {r['rows']:,}"
            f" | {'yes' if same else 'NO'} | {worst} | {spent} |"
        )
    ours = results.get("project", {})
    for key, value in ours.items():
        if key.startswith("ratio_to_"):
            print(f"  project / {key.removeprefix('ratio_to_')}: {value:.3f}")
    if "phases" in ours:
        print("  project phases: " + ", ".join(f"{k} {v:.2f}" for k, v in ours["phases"].items()))
    if args.json:
        doc = {"header": header, "scenario": args.scenario, "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0 if same and counted else 1


if __name__ == "__main__":
    sys.exit(main())
