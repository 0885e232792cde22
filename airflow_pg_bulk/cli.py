"""``airflow-pg-bulk``: load files without a scheduler, or run the demo.

    airflow-pg-bulk [-q] load --conn DSN --table SCHEMA.TABLE --source PATH_OR_GLOB
        --mode replace|append|upsert|replace_partitions [--source ...] [one flag per load option]
        [--jobs N] [--json]
    airflow-pg-bulk [-q] demo [--conn DSN] [--days D] [--meters M] [--partitions N] [--no-airflow]
                              [--executor {local,celery}] [--broker-url URL]

The load flags are generated from :mod:`airflow_pg_bulk.options` (``--help`` lists them with
their defaults); ``--mode`` is required. Exit status 0 on success; on failure the error goes to
stderr and the status is 1 (2 for bad arguments: then nothing was touched).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

from airflow_pg_bulk import options
from airflow_pg_bulk.errors import PgBulkError
from airflow_pg_bulk.options import MODE_HELP
from airflow_pg_bulk.plan import request_from_options


def _load_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "load",
        parents=[common],
        help="load files into a table: prepare, parallel COPY, finalize",
        description="Load files into a table: prepare, parallel COPY, finalize, cleanup. "
        "--mode is required: " + ", or ".join(f"{m}: {w}" for m, w in MODE_HELP.items()) + ".",
    )
    p.add_argument("--conn", required=True, help="libpq connection string or URI (required)")
    p.add_argument(
        "--table", required=True, help="target table, schema.table; must exist (required)"
    )
    p.add_argument(
        "--source",
        action="append",
        default=[],
        help="file or glob, repeatable; .gz files are decompressed; - reads standard input "
        "and a named pipe works too (one COPY stream, read once) (required, unless a database "
        "is the source: --source-url with --query or --source-table)",
    )
    options.add_cli_flags(p)
    p.add_argument(
        "--jobs",
        type=options.whole_number_parser(1),
        metavar="N",
        help="COPY connections at once (default: min(COPY streams, 4))",
    )
    p.add_argument(
        "--driver",
        choices=["psycopg", "psycopg2"],
        default="psycopg",
        help="database driver (default: psycopg)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the summary as JSON (default: as text)"
    )


def _demo_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo",
        parents=[common],
        help="load the smart-meter workload end to end, with Airflow",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--conn", help="use this database instead of a throwaway server")
    p.add_argument("--meters", type=int, default=15_000, help="smart meters in the workload")
    p.add_argument("--days", type=int, default=200, help="days of readings per meter")
    p.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="COPY streams each load is cut into (not table partitions)",
    )
    p.add_argument(
        "--no-airflow",
        action="store_true",
        help="skip the run under a real Airflow scheduler (in-process load only)",
    )
    p.add_argument(
        "--executor",
        choices=("local", "celery"),
        default="local",
        help="the DAG run's executor: LocalExecutor, or CeleryExecutor with two workers",
    )
    p.add_argument(
        "--broker-url",
        help="with --executor celery: Celery's broker (redis://...); default a throwaway "
        "valkey/redis server",
    )
    p.add_argument("--workdir", help="keep data files and Airflow's home here")


def _common_flags(default: Any) -> argparse.ArgumentParser:
    """The global flags, accepted before and after the subcommand (``default``: the value
    when not given; ``SUPPRESS`` in subcommands so they do not override the global one)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="only errors and the summary (default: progress is logged too)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    """The command line parser."""
    parser = argparse.ArgumentParser(
        prog="airflow-pg-bulk", description=__doc__.split("\n")[0], parents=[_common_flags(False)]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{load,demo}")
    common = _common_flags(argparse.SUPPRESS)
    _load_parser(sub, common)
    _demo_parser(sub, common)
    return parser


def _run_load(args: argparse.Namespace) -> int:
    from airflow_pg_bulk.runner import load

    given = {name: getattr(args, name) for name in options.NAMES}
    _check_options(args.table, args.source, given)
    summary = load(args.conn, args.table, args.source, jobs=args.jobs, driver=args.driver, **given)
    if args.json:
        print(json.dumps({**summary.to_dict(), "rows_per_second": summary.rows_per_second}))
    else:
        print(summary.describe())
    return 0


class UsageError(Exception):
    """The arguments do not make a load; nothing was touched."""


def _check_options(table: str, source: Sequence[str], given: dict[str, Any]) -> None:
    """Refuse bad combinations before anything connects, in the command line's words."""
    if given["mode"] is None:
        raise UsageError(options.mode_required_message(lambda m: f"--mode {m}"))
    columns = given["columns"]
    flat = {k: v for k, v in given.items() if k != "columns"}
    try:
        request_from_options(table, source, columns, **flat)
    except (ValueError, TypeError) as exc:
        raise UsageError(_in_flags(str(exc))) from None


def _in_flags(message: str) -> str:
    """An option error with option names spelled as flags (``max_rejects`` → ``--max-rejects``)."""
    for opt in sorted(options.OPTIONS, key=lambda o: -len(o.name)):
        message = re.sub(rf"(?<![-\w]){opt.name}(?![-\w])", opt.flag, message)
    return message.replace("header=True", "--header").replace("='", " '")


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
    except UsageError as exc:
        print(f"airflow-pg-bulk {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except PgBulkError as exc:
        print(f"airflow-pg-bulk: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("airflow-pg-bulk: interrupted; the target is unchanged", file=sys.stderr)
        return 130
    except Exception as exc:
        logging.getLogger(__name__).debug("unexpected error", exc_info=True)
        print(f"airflow-pg-bulk: error: {_describe(exc)}", file=sys.stderr)
        return 1


def _describe(exc: BaseException) -> str:
    """An unexpected error in words, without Python's type names or traceback."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    text = str(exc).strip()
    if type(exc).__module__.split(".")[0] in ("psycopg", "psycopg2"):
        return f"the database said: {text}" if text else "a database error without a message"
    return text or "an unexpected failure without a message (a bug: please report it)"


if __name__ == "__main__":
    sys.exit(main())
