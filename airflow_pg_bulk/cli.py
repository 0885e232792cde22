"""``airflow-pg-bulk``: load files without a scheduler, or run the demo.

    airflow-pg-bulk [-q] load --conn DSN --table SCHEMA.TABLE --source PATH_OR_GLOB
        --mode replace|append|upsert|replace_partitions [--source ...] [one flag per load option]
        [--jobs N] [--json]
    airflow-pg-bulk [-q] cleanup --conn DSN --table SCHEMA.TABLE [--dry-run]
    airflow-pg-bulk [-q] demo [--conn DSN] [--days D] [--meters M] [--partitions N] [--no-airflow]
                              [--executor {local,celery}] [--broker-url URL]

The load flags are generated from :mod:`airflow_pg_bulk.options` (``--help`` lists them with
their defaults); ``--mode`` is required. Exit status 0 on success; on failure the error goes to
stderr and the status is 1 (2 for bad arguments, such as an upsert key that is not a column:
then nothing was touched; 128 + the signal's number when SIGINT, SIGTERM or SIGHUP stopped
the load: 130, 143, 129).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

from airflow_pg_bulk import options
from airflow_pg_bulk.errors import BadArgumentError, PgBulkError
from airflow_pg_bulk.naming import split_name
from airflow_pg_bulk.options import MODE_HELP
from airflow_pg_bulk.plan import request_from_options
from airflow_pg_bulk.plan.codes import OnError
from airflow_pg_bulk.plan.request import DEFAULT_REJECT_TABLE


def _database_command(
    sub: argparse._SubParsersAction, common: argparse.ArgumentParser, name: str, **texts: str
) -> argparse.ArgumentParser:
    """A subcommand working on a database (``--conn``), its ``help`` and ``description``."""
    p = sub.add_parser(name, parents=[common], **texts)
    p.add_argument("--conn", required=True, help="libpq connection string or URI (required)")
    return p


def _load_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = _database_command(
        sub,
        common,
        "load",
        help="load files into a table: prepare, parallel COPY, finalize",
        description="Load files into a table: prepare, parallel COPY, finalize, cleanup. "
        "--mode is required: " + ", or ".join(f"{m}: {w}" for m, w in MODE_HELP.items()) + ".",
    )
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
    _driver_flag(p)
    p.add_argument(
        "--json", action="store_true", help="print the summary as JSON (default: as text)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print what the load would do (files, COPY streams, strategy, checks, the rows "
        "the target or each of its partitions holds now, the partitions the rows go to) and "
        "stop: nothing is kept or changed (default: load)",
    )


def _driver_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--driver",
        choices=["psycopg", "psycopg2"],
        default="psycopg",
        help="database driver (default: psycopg)",
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


def _cleanup_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = _database_command(
        sub,
        common,
        "cleanup",
        help="remove the tables of loads into a table that are not running",
        description="List and remove the tables (_pgbulk_<load id>_*) of loads into TABLE that "
        "are not running: a load killed by SIGKILL or a crash. A load is running while one of its "
        "sessions (application_name pgbulk:<load id>:...) is connected or a session locks its "
        "ledger; its tables are listed, never removed. Under Airflow, a load between two of its "
        "tasks has no session: run this when none of its DAG runs is in flight. The next load "
        "into TABLE removes them too, after abandoned_after (default 1d).",
    )
    p.add_argument("--table", required=True, help="the loads' target, schema.table (required)")
    p.add_argument("--dry-run", action="store_true", help="list only; remove nothing")
    _driver_flag(p)


def _run_cleanup(args: argparse.Namespace) -> int:
    from airflow_pg_bulk.runner import remove_leftovers

    try:
        found = remove_leftovers(args.conn, args.table, dry_run=args.dry_run, driver=args.driver)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for leftover in found:
        verb = "left" if leftover.running else "would remove" if args.dry_run else "removed"
        print(f"{verb} {leftover.describe()}")
    if not found:
        print(f"no tables of loads into {args.table} are left")
    return 0


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
    sub = parser.add_subparsers(dest="command", required=True, metavar="{load,cleanup,demo}")
    common = _common_flags(argparse.SUPPRESS)
    _load_parser(sub, common)
    _cleanup_parser(sub, common)
    _demo_parser(sub, common)
    return parser


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SignalStop:
    """SIGINT, SIGTERM and SIGHUP during a load: the first stops it at once (its running
    statements cancelled on the server, its tables dropped:
    :func:`airflow_pg_bulk.runner.stop_loads`),
    says so on stderr and exits with 128 + the signal's number; a second one exits at once.

    A thread reads the signals from :func:`signal.set_wakeup_fd`'s socket, written by the
    interpreter's C handler the moment a signal arrives: the main thread may be waiting in the
    driver for a statement (psycopg2 does not run Python's handlers before it returns)."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._first: int | None = None
        self._saved = {number: signal.getsignal(number) for number in STOP_SIGNALS}

    def __enter__(self) -> SignalStop:
        self._active = threading.current_thread() is threading.main_thread()
        if not self._active:  # (signals go to the main thread: main() called from another)
            return self
        for number in STOP_SIGNALS:
            signal.signal(number, lambda *_: None)  # the wakeup fd does the work
        self._saved_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="pg-bulk-signals", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._active:
            return
        if self._first is not None:  # the stop's own thread ends the process
            threading.Event().wait()
        signal.set_wakeup_fd(self._saved_fd)
        for number, handler in self._saved.items():
            signal.signal(number, handler)

    def _watch(self) -> None:
        while True:
            data = self._read.recv(64)
            for number in data:
                if number in STOP_SIGNALS:
                    self._received(number)

    def _received(self, number: int) -> None:
        name = signal.Signals(number).name
        if self._first is not None:
            print(
                f"airflow-pg-bulk: {name} again: exiting at once; the load's tables may be "
                "left: airflow-pg-bulk cleanup --conn DSN --table TABLE removes them",
                file=sys.stderr,
                flush=True,
            )
            os._exit(128 + number)
        self._first = number
        threading.Thread(target=self._stop, args=(number,), name="pg-bulk-stop").start()

    def _stop(self, number: int) -> None:
        from airflow_pg_bulk.runner import stop_loads

        name = signal.Signals(number).name
        try:
            reports = stop_loads()
            lines = [f"interrupted by {name} {r.describe()}" for r in reports]
        except BaseException as exc:  # the exit must come whatever happens here
            lines = [f"interrupted by {name}; stopping the load failed: {exc}"]
        for line in lines or [f"interrupted by {name}; no load was running, none was stopped"]:
            print(f"airflow-pg-bulk: {line}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(128 + number)


def _run_load(args: argparse.Namespace) -> int:
    from airflow_pg_bulk.runner import load

    given = {name: getattr(args, name) for name in options.NAMES}
    _check_options(args.table, args.source, given)
    if args.dry_run:
        from airflow_pg_bulk.runner import preview

        shown = preview(args.conn, args.table, args.source, driver=args.driver, **given)
        print(json.dumps(shown.to_dict()) if args.json else shown.describe())
        return 0
    with SignalStop():
        summary = load(
            args.conn, args.table, args.source, jobs=args.jobs, driver=args.driver, **given
        )
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
    rejects = given["on_error"] is not None and OnError(given["on_error"]).rejects
    if rejects and given["max_rejects"] is None:
        # refused rather than given a default: how many bad rows a load may set aside is the
        # user's to say (any default would let that many through unasked), and with none the
        # first bad row fails the load, which is --on-error fail with extra steps
        schema = _schema_or_public(table)
        rejects = given["reject_table"] or f"{schema}.{DEFAULT_REJECT_TABLE}"
        raise UsageError(
            "--on-error reject needs --max-rejects N, the most bad rows the load may set aside "
            f"in the reject table {rejects} (its default, 0, fails the load at the first bad "
            "row); e.g. --max-rejects 100"
        )
    columns = given["columns"]
    flat = {k: v for k, v in given.items() if k != "columns"}
    try:
        request_from_options(table, source, columns, **flat)
    except (ValueError, TypeError) as exc:
        raise UsageError(_in_flags(str(exc))) from None


def _schema_or_public(table: str) -> str:
    try:
        return split_name(table)[0]
    except ValueError:  # refused with its own message by the checks that follow
        return "public"


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
        if args.command == "cleanup":
            return _run_cleanup(args)
        from airflow_pg_bulk.demo.run import run_demo

        return run_demo(args)
    except UsageError as exc:
        print(f"airflow-pg-bulk {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BadArgumentError as exc:
        print(f"airflow-pg-bulk {args.command}: error: {_in_flags(str(exc))}", file=sys.stderr)
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
