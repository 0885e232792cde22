"""``airflow-pg-bulk``: load files without a scheduler, or run the demo.

    airflow-pg-bulk load --conn DSN --table SCHEMA.TABLE --source PATH_OR_GLOB [--source ...]
        [--format csv|text] [--header] [--delimiter C] [--null S] [--quote C] [--escape C]
        [--encoding E] [--mode replace|append] [--partitions N] [--jobs N]
    airflow-pg-bulk demo [--conn DSN] [--days D] [--meters M] [--partitions N] [--no-airflow]

Exit status 0 on success; on failure the error goes to stderr and the status is 1 (2 for bad
arguments).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from airflow_pg_bulk.errors import PgBulkError
from airflow_pg_bulk.plan import Settings


def _load_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("load", help="load files into a table: prepare, parallel COPY, finalize")
    p.add_argument("--conn", required=True, help="libpq connection string or URI")
    p.add_argument("--table", required=True, help="target table, schema.table (must exist)")
    p.add_argument(
        "--source",
        required=True,
        action="append",
        help="file or glob (repeatable); .gz files are decompressed",
    )
    p.add_argument("--format", choices=["csv", "text"], default="csv")
    p.add_argument("--header", action="store_true", help="files have a header line")
    p.add_argument("--delimiter", help="field delimiter (default , for csv, tab for text)")
    p.add_argument("--null", help="NULL marker (default empty for csv, \\N for text)")
    p.add_argument("--quote", default='"', help="csv quote character")
    p.add_argument("--escape", help="csv escape character (default: the quote)")
    p.add_argument("--encoding", default="UTF8", help="file encoding, PostgreSQL name")
    p.add_argument("--mode", choices=["replace", "append"], default="replace")
    p.add_argument("--partitions", type=int, help="number of partitions (default: by size)")
    p.add_argument("--jobs", type=int, help="COPY connections at once (default min(partitions, 4))")
    p.add_argument("--columns", help="comma-separated target columns, for files without header")
    p.add_argument(
        "--staging",
        choices=["logged", "unlogged"],
        help="staging persistence (default: logged for replace, unlogged for append)",
    )
    p.add_argument("--lock-timeout", default=Settings.lock_timeout)
    p.add_argument(
        "--on-error",
        choices=["fail", "reject"],
        default="fail",
        help="reject: bad rows go to the reject table, the rest load",
    )
    p.add_argument(
        "--max-rejects",
        type=int,
        default=0,
        help="most rows that may be rejected (with --on-error reject)",
    )
    p.add_argument(
        "--reject-table",
        help="schema.table for rejected rows (default pgbulk_rejects in the target's schema)",
    )
    p.add_argument("--driver", choices=["psycopg", "psycopg2"], default="psycopg")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="load the smart-meter workload end to end, with Airflow")
    p.add_argument("--conn", help="use this database instead of a throwaway server")
    p.add_argument("--meters", type=int, default=15_000)
    p.add_argument("--days", type=int, default=200, help="days of readings per meter")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument(
        "--no-airflow",
        action="store_true",
        help="skip the run under a real Airflow scheduler (in-process load only)",
    )
    p.add_argument("--workdir", help="keep data files and Airflow's home here")


def build_parser() -> argparse.ArgumentParser:
    """The command line parser."""
    parser = argparse.ArgumentParser(prog="airflow-pg-bulk", description=__doc__.split("\n")[0])
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors and the summary")
    sub = parser.add_subparsers(dest="command", required=True)
    _load_parser(sub)
    _demo_parser(sub)
    return parser


def _run_load(args: argparse.Namespace) -> int:
    from airflow_pg_bulk.runner import load

    summary = load(
        args.conn,
        args.table,
        args.source,
        columns=args.columns.split(",") if args.columns else None,
        jobs=args.jobs,
        driver=args.driver,
        format=args.format,
        header=args.header,
        delimiter=args.delimiter,
        null=args.null,
        quote=args.quote,
        escape=args.escape,
        encoding=args.encoding,
        mode=args.mode,
        partitions=args.partitions,
        staging_logged=None if args.staging is None else args.staging == "logged",
        lock_timeout=args.lock_timeout,
        on_error=args.on_error,
        max_rejects=args.max_rejects,
        reject_table=args.reject_table,
    )
    if args.json:
        print(json.dumps({**summary.to_dict(), "rows_per_second": summary.rows_per_second}))
    else:
        print(summary.describe())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``airflow-pg-bulk`` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("airflow_pg_bulk").setLevel(logging.WARNING if args.quiet else logging.INFO)
    try:
        if args.command == "load":
            return _run_load(args)
        from airflow_pg_bulk.demo.run import run_demo

        return run_demo(args)
    except PgBulkError as exc:
        print(f"airflow-pg-bulk: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("airflow-pg-bulk: interrupted; the target is unchanged", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"airflow-pg-bulk: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
