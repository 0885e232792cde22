"""A year of readings into a table partitioned by month: the project beside the other ways.

    python -m benchmarks.partitioned --conn DSN [--meters 15000] [--partitions 2] [--json F]

The target: ``readings`` (id, meter_id FK to ``meters``, reading, date), PRIMARY KEY (id, date),
``PARTITION BY RANGE (date)`` into 12 monthly partitions, empty; the load: a year of readings
(one per meter and day, from 2019-02-01), one CSV file per month. Methods, each on its own
``FILE_COPY`` clone of the same base database, CHECKPOINT before, count and checksum after
(they must be equal):

- ``copy_parent``: one COPY per file into the partitioned parent, one transaction (its
  indexes and foreign key checked row by row);
- ``project``: ``mode="replace_partitions"`` through the in-process runner (staging
  partitioned like the target, each month built standalone and attached);
- ``by_hand``: each month a standalone table (COPY, ADD PRIMARY KEY, a CHECK of its bounds,
  FK NOT VALID + VALIDATE, ANALYZE), then DETACH/DROP of the empty partitions and ATTACH x 12
  in one transaction: what the project automates.

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
import time
from datetime import UTC, date, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/partitioned.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from airflow_pg_bulk import runner
from airflow_pg_bulk.demo import workload as demo_workload
from benchmarks.incremental import (
    SCHEMA,
    TABLE,
    _admin,
    _checkpoint,
    _rows,
    _timed,
    clone,
    result_of,
)

log = logging.getLogger("benchmarks.partitioned")
BASE = "part_base"
START = date.fromisoformat(demo_workload.START_DATE)  # 2019-02-01
MONTHS = 12
METHODS = ("floor", "copy_parent", "project", "by_hand")
FLOOR_TABLE = "floor_copy"


def _month(n: int) -> tuple[date, date]:
    """The first day of the ``n``-th month from START, and of the next."""
    y, m = divmod(START.month - 1 + n, 12)
    y2, m2 = divmod(START.month + n, 12)
    return date(START.year + y, m + 1, 1), date(START.year + y2, m2 + 1, 1)


def _partition(n: int) -> str:
    return f"{TABLE}_{_month(n)[0]:%Y_%m}"


def build_base(dsn: str, meters: int) -> None:
    """meters, and the empty partitioned target with its 12 monthly partitions."""
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
                " date date NOT NULL, PRIMARY KEY (id, date), CONSTRAINT fk_readings_meters"
                " FOREIGN KEY (meter_id) REFERENCES {}) PARTITION BY RANGE (date)"
            ).format(sql.Identifier(SCHEMA, TABLE), sql.Identifier(SCHEMA, "meters"))
        )
        for n in range(MONTHS):
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
    with psycopg.connect(psycopg.conninfo.make_conninfo(**params)) as conn:
        demo_workload.fill_meters(conn, SCHEMA, meters)


def write_files(dsn: str, directory: Path, meters: int) -> list[Path]:
    """One CSV file (header line) per month, all meters, written by the server."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    with psycopg.connect(dsn) as conn:
        for n in range(MONTHS):
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
    with psycopg.connect(dsn) as conn:
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
    with psycopg.connect(dsn) as conn:
        for path in files:
            _copy_file(conn, TABLE, path)
        conn.commit()


def project(dsn: str, files: list[Path], partitions: int) -> None:
    """The project: replace_partitions, in process."""
    runner.load(
        dsn,
        f"{SCHEMA}.{TABLE}",
        [str(p) for p in files],
        mode="replace_partitions",
        header=True,
        partitions=partitions,
    )


def by_hand(dsn: str, files: list[Path], _partitions: int) -> None:
    """Each month standalone, then ATTACH x 12 in one transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for n, path in enumerate(files):
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
            for n in range(len(files)):
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


def main(argv: list[str] | None = None) -> int:
    """Run each method against ``--conn``; exit 1 when their results differ."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conn", required=True, help="libpq DSN of the server (a superuser)")
    p.add_argument("--meters", type=int, default=15_000)
    p.add_argument("--partitions", type=int, default=2, help="the project's COPY partitions")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if argv is None:  # the command line (a caller such as the tests keeps its own logging)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    wanted = args.methods.split(",")
    if set(wanted) - set(METHODS):
        p.error(f"methods are {', '.join(METHODS)}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pgbulk-part-"))
    started = time.perf_counter()
    build_base(args.conn, args.meters)
    files = write_files(args.conn, workdir, args.meters)
    with psycopg.connect(args.conn) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    results = {}
    for name in wanted:
        dsn = clone(args.conn, BASE, f"part_{name}")
        _checkpoint(dsn)
        method = {
            "floor": floor,
            "copy_parent": copy_parent,
            "project": project,
            "by_hand": by_hand,
        }[name]
        seconds, _ = _timed(lambda: method(dsn, files, args.partitions))  # noqa: B023
        count, checksum = result_of(dsn, FLOOR_TABLE if name == "floor" else TABLE)
        results[name] = {"seconds": round(seconds, 2), "rows": count, "checksum": checksum}
        log.info("%s: %.2f s, %d rows", name, seconds, count)
        _admin(
            args.conn,
            sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(f"part_{name}")),
        )
    _admin(args.conn, sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(BASE)))
    same = len({(r["rows"], r["checksum"]) for r in results.values()}) == 1
    if "project" in results:
        for other in ("floor", "copy_parent", "by_hand"):
            if other in results:
                results["project"][f"ratio_to_{other}"] = round(
                    results["project"]["seconds"] / results[other]["seconds"], 3
                )
    expected = args.meters * (_month(MONTHS)[0] - START).days
    header = {
        "command": "python -m benchmarks.partitioned " + " ".join(argv or sys.argv[1:]),
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"nproc {os.cpu_count()}, {platform.machine()}",
        "server": f"PostgreSQL {version}",
        "run took": f"{time.perf_counter() - started:.0f} s; one run per method",
    }
    print(f"A year ({expected:,} rows) into 12 monthly partitions, PK (id, date) + FK")
    for key, value in header.items():
        print(f"  {key}: {value}")
    print("| method | seconds | rows | same result |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| `{name}` | {r['seconds']:.2f} | {r['rows']:,} | {'yes' if same else 'NO'} |")
    ratios = results.get("project", {})
    for key, value in ratios.items():
        if key.startswith("ratio_to_"):
            print(f"  project / {key.removeprefix('ratio_to_')}: {value:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "results": results}, indent=2))
    return 0 if same and all(r["rows"] == expected for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
