"""Find the source file and line of a row that breaks a constraint of the target.

A constraint found broken in finalize (a duplicate key, a foreign key, NOT NULL, CHECK, an
exclusion) names the constraint and the key, but staging does not keep where its rows came
from: recording it for every row would slow every COPY (the upsert's source order column cost
1.23-1.67x in COPY time). So nothing is recorded on the happy path, and only when finalize
fails on a constraint, :func:`locate` reads the source again:

1. the constraint is read from the catalog (its key columns, referenced table, exclusion
   operators or CHECK expression);
2. the load's pieces are COPYed again, in order, into a TEMP table of the loaded columns with a
   ``bigserial`` that numbers the rows as COPY reads them (row = piece + record in it);
3. after each piece, one query looks for an offending row among the rows read so far: two
   loaded rows with the same key (or conflicting under an exclusion's operators), a loaded row
   whose key is in the target already (append, upsert), a foreign key with no referenced row,
   a NULL, a CHECK expression that is false;
4. the first row found is mapped to its file and physical line
   (:func:`.source.lines.record_lines`, as a COPY error is), and the replay stops there.

Cost: at most one more read of the source, through one COPY session, with no index and no
constraint, plus one query per piece; it stops at the piece holding the first offending row,
and after :data:`BUDGET_SECONDS` whatever is left. It runs after finalize rolled back, in a
transaction of its own that is rolled back too (the temporary table goes with it): the
target is never touched. When a row cannot be found (an expression index, a constraint on a
column that is not loaded, a stream that cannot be read twice, rows ``on_error="reject"`` set
aside, which stop the second reading), the error names the load's files instead.

The same replay, with a condition of its own (:func:`locate_failing`), finds the row of an
upsert into a partitioned target that no partition takes (:mod:`airflow_pg_bulk.target.upsert`).

A duplicate key's rows are those holding the key value the server's error names; on a
partitioned target the constraint named may be a partition's (its share of the parent's key,
or its own, which holds for its rows only). See docs/design.md, "Constraint errors that find
the row".
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    ServerError,
    copy_in,
    execute,
    rollback_quietly,
)
from airflow_pg_bulk.db.translate import truncate
from airflow_pg_bulk.errors import NOT_NULL_VIOLATION, UNIQUE_VIOLATION, BadDataError
from airflow_pg_bulk.plan import LoadPlan, Piece
from airflow_pg_bulk.source import lines, listing, reading
from airflow_pg_bulk.source.listing import SourceKind

log = logging.getLogger(__name__)

BUDGET_SECONDS = 300.0  # the replay stops reading the source after this long
FILES_SHOWN = 5
_NOT_NULL_COLUMN = re.compile(r'null value in column "((?:[^"]|"")+)"')


@dataclasses.dataclass(frozen=True)
class Found:
    """Where the offending rows of a broken constraint are.

    :param rows: (file, line) of each offending row found: two for a duplicate key (or an
        exclusion conflict) whose rows both came from the load, else one.
    :param in_target: the other row of the conflict is one the target already holds.
    :param files: when no row was found, the files the offending rows came from.
    """

    rows: tuple[tuple[str, int], ...] = ()
    in_target: bool = False
    files: tuple[str, ...] = ()

    def describe(self) -> str:
        """The words the error adds, e.g. ``found at /d/a.csv line 3 and /d/b.csv line 7``."""
        if not self.rows:
            shown = ", ".join(self.files[:FILES_SHOWN])
            more = len(self.files) - FILES_SHOWN
            return f"the offending rows came from {shown}" + (
                f" and {more} more files" if more > 0 else ""
            )
        where = " and ".join(f"{path} line {line}" for path, line in self.rows)
        if self.in_target:
            return f"found at {where}, whose key is already in the target"
        return f"found at {where}"


@dataclasses.dataclass(frozen=True)
class _Check:
    """One query shape: ``pair`` (two replayed rows), ``target`` or ``single`` (one row)."""

    shape: str
    build: Any  # (after: int) -> Composed


def locate(conn: DatabaseConnection, plan: LoadPlan, err: ServerError) -> Found | None:
    """The file and line of a row that breaks the constraint ``err`` names (see the module's
    docstring); never raises (a failure to look is logged and the files are named). None: the
    constraint is not the target's (a key of a table referencing it, re-added by the swap,
    that the new rows no longer satisfy): no loaded row breaks it."""
    found = _search(conn, plan, lambda: _checks(conn, plan, err))
    if found is not None and not found.rows and _key_value(err) is not None:
        # no loaded row renders the key as the server did (a type whose text differs): any
        # row that breaks the constraint
        found = _search(conn, plan, lambda: _checks(conn, plan, err, by_value=False))
    return found


def locate_failing(conn: DatabaseConnection, plan: LoadPlan, condition: sql.Composable) -> Found:
    """The file and line of the first loaded row (in the order :func:`_replay` reads the
    pieces: source order for an upsert) for which ``condition`` holds, a condition on the
    replayed row ``r`` (its loaded columns, e.g. :func:`airflow_pg_bulk.sql.in_no_partition`);
    never raises; when no row is found, the load's files."""
    return _search(conn, plan, lambda: [_failing(condition)]) or Found(files=_files(plan))


def in_no_partition(
    conn: DatabaseConnection,
    plan: LoadPlan,
    constraints: list[str],
    row: str,
    *,
    context: str = "",
    named: str | None = None,
) -> BadDataError:
    """The error for a loaded ``row`` (as text) that no table partition of the target takes
    (``constraints``: the partitions' own, one of which it fails each), naming it and, read
    again from the source, its file and line. ``context`` opens the message; ``named``: how
    it names the target ("no table partition of <named>"; default its name). The caller's
    transaction was rolled back."""
    t = plan.target
    found = locate_failing(conn, plan, sql.in_no_partition(constraints))
    path, line = found.rows[0] if found.rows else (None, None)
    return BadDataError(
        f"{context}no table partition of {named or t.qualified} takes the loaded row {row} "
        f"({', '.join(plan.columns)}), {found.describe()}. Nothing of this load reached "
        f"{t.qualified}",
        path=path,
        line=line,
        value=truncate(row),
    )


def locate_repeated_key(conn: DatabaseConnection, plan: LoadPlan, key: list[str]) -> Found:
    """The file and line of the two loaded rows of the first ``key`` repeated within the load,
    in the order :func:`_replay` reads the pieces (source order for an upsert): for
    ``on_duplicate_key="fail"``; never raises; when no pair is found, the load's files."""
    pair = _Check(
        "pair",
        lambda after: sql.replay_conflicting_pair(key, [None] * len(key), after=after, same=[]),
    )
    return _search(conn, plan, lambda: [pair]) or Found(files=_files(plan))


def _files(plan: LoadPlan) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.path for part in plan.partitions for p in part.pieces))


def _search(
    conn: DatabaseConnection, plan: LoadPlan, make: Callable[[], list[_Check] | None]
) -> Found | None:
    """Replay the source with the checks ``make`` gives ([]: none can find the row, None: no
    row of the load is to blame), in a transaction rolled back after; see :func:`locate`."""
    files = _files(plan)
    try:
        checks = make()
        conn.rollback()
        if checks is None:
            return None
        if checks:
            found = _replay(conn, plan, checks)
            if found is not None:
                return found
    except Exception:
        log.warning("Load %s: could not find the offending rows", plan.load_id, exc_info=True)
    finally:
        rollback_quietly(conn)
    return Found(files=files)


def _checks(
    conn: DatabaseConnection, plan: LoadPlan, err: ServerError, *, by_value: bool = True
) -> list[_Check] | None:
    """The queries that find an offending row of the constraint ``err`` names; [] when none
    can; None when it is no constraint of the target. ``by_value``: a duplicate key's rows
    are those with the key value the server names (``Key (id)=(1) already exists``; another
    key loaded twice is not the one the error is about)."""
    t = plan.target
    if err.sqlstate == NOT_NULL_VIOLATION:
        match = _NOT_NULL_COLUMN.search(err.message)
        column = match.group(1).replace('""', '"') if match else None
        if column not in plan.columns:
            return []
        return [_failing(sql.is_null(column))]
    if not err.constraint:
        return None
    name = naming.original_names(plan, err.constraint)
    found = execute(conn, sql.violated_constraint(t.oid, name))
    # a partitioned target: the server names a partition's constraint (pq_p0_pkey: its share
    # of the parent's key; a CHECK or foreign key of the partition alone)
    # (looked up in the catalog, not among the captured partitions: a partition loaded in
    # place is not captured)
    leaf: tuple[int, str, str | None] | None = None
    if not found and t.partitioning is not None:
        owner = execute(conn, sql.partition_with_constraint(t.oid, name))
        if owner:
            leaf = owner[0]
            found = execute(conn, sql.violated_constraint(leaf[0], name))
    if not found:
        return None
    kind, key, ref_schema, ref_table, ref_key, op_schemas, op_names, expression, shared = found[0]
    key = list(key)
    # a constraint of one partition alone holds for the rows routed to it only
    only = leaf[2] if leaf is not None and not shared else None
    within: list[sql.Composable] = [sql.in_partition(only)] if only else []
    if kind == "c":
        return [_failing(_within(sql.check_fails(expression), within))]
    if not key or not set(key) <= set(plan.columns):
        return []
    if kind == "f":
        # a key of the table to itself (append and upsert in place: a replace or a rebuild
        # refuses one) is matched by the target's rows and by the loaded ones, all in staging
        to_itself = (ref_schema, ref_table) == (t.schema, t.table)
        also = (t.schema, plan.staging_table) if to_itself else None
        unreferenced = sql.unreferenced(key, ref_schema, ref_table, list(ref_key), also=also)
        return [_failing(_within(unreferenced, within))]
    if kind not in ("p", "u", "i", "x"):
        return []
    ops: list[tuple[str, str] | None] = (
        list(zip(op_schemas, op_names, strict=True)) if kind == "x" else [None] * len(key)
    )
    same: list[str] = []
    if plan.mode.keyed and plan.upsert is not None:
        same = list(plan.upsert.key)
        if kind != "x" and set(key) == set(same):
            return []  # the upsert's own key: a repeated key is an update, never a violation
    value = _key_value(err) if by_value and kind != "x" else None
    if value is not None:
        within.append(sql.key_rendered_as(key, value))
    checks = [
        _Check(
            "pair",
            lambda after: sql.replay_conflicting_pair(
                key, ops, after=after, same=same, within=sql.all_of(within)
            ),
        )
    ]
    # (a replace_partitions replaces whole partitions, and a key of a partitioned table holds
    # within each: the loaded rows never meet the target's)
    if not plan.mode.swaps_table:
        table = leaf[1] if only and leaf is not None else t.table
        target = sql.conflicts_with_target(t.schema, table, key, ops, same=same)
        checks.append(dataclasses.replace(_failing(_within(target, within)), shape="target"))
    return checks


_KEY_DETAIL = re.compile(r"Key \(.*?\)=\((.*)\) (?:already exists|is duplicated)\.", re.DOTALL)


def _key_value(err: ServerError) -> str | None:
    """The key's value as a duplicate key error's detail renders it (``1, 5`` of ``Key (id,
    n)=(1, 5) already exists.``), or None."""
    match = _KEY_DETAIL.fullmatch(err.detail or "")
    return match.group(1) if match and err.sqlstate == UNIQUE_VIOLATION else None


def _within(condition: sql.Composable, within: list[sql.Composable]) -> sql.Composable:
    """``condition`` on the replayed rows for which every one of ``within`` holds (one
    partition's: its constraint, whose columns name the replayed row's; a key value)."""
    return sql.all_of([*within, condition]) or condition


def _failing(condition: sql.Composable) -> _Check:
    return _Check("single", lambda after: sql.replay_failing(condition, after=after))


def _pieces(plan: LoadPlan) -> list[Piece]:
    """The load's pieces in source order (an upsert numbers them), else by file name, then
    byte order: the earlier row of a pair is named first."""
    pieces = [p for part in plan.partitions for p in part.pieces]
    if plan.upsert is not None:
        return sorted(pieces, key=lambda p: p.ordinal)
    return sorted(pieces, key=lambda p: (p.path, p.start))


def _replay(conn: DatabaseConnection, plan: LoadPlan, checks: list[_Check]) -> Found | None:
    """COPY the pieces again into a numbered TEMP table until a check finds a row."""
    t = plan.target
    for statement in sql.create_replay_table(t.schema, t.table, plan.columns):
        execute(conn, statement)
    copy = sql.copy_from_stdin("pg_temp", sql.REPLAY_TABLE, plan.columns, plan.copy)
    read: list[tuple[Piece, int]] = []  # each piece read, with the rows before it
    total = 0
    started = time.monotonic()
    for piece in _pieces(plan):
        if listing.piece_kind(piece) is SourceKind.STREAM:
            continue  # read once, by the COPY task
        if time.monotonic() - started > BUDGET_SECONDS:
            log.warning(
                "Load %s: stopped looking for the offending row after %.0f s",
                plan.load_id,
                BUDGET_SECONDS,
            )
            return None
        loaded = copy_in(conn, copy, reading.piece_chunks(piece, plan.copy))
        read.append((piece, total))
        before, total = total, total + loaded
        for check in checks:
            hit = execute(conn, check.build(before))
            if hit:
                rows = [n for n in hit[0] if n is not None]
                return Found(
                    rows=tuple(_line(plan, read, n) for n in rows),
                    in_target=check.shape == "target",
                )
    return None


def _line(plan: LoadPlan, read: list[tuple[Piece, int]], row: int) -> tuple[str, int]:
    """The file and first physical line of replayed row number ``row``."""
    piece, before = next((p, b) for p, b in reversed(read) if b < row)
    first, _last = lines.record_lines(piece, row - before, plan.copy, numbering="records")
    return piece.path, first
