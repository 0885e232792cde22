"""The four steps of a load: prepare, copy one partition, finalize, cleanup.

Each takes an open DB-API connection (psycopg 3 or psycopg2) and plain data, and knows nothing
of Airflow: the operators, the in-process runner and the tests all call these functions.
prepare does the I/O around :func:`airflow_pg_bulk.plan.planning.build_plan`; finalize lives in
:mod:`airflow_pg_bulk.finalize` and is re-exported here; driver errors are translated by
:mod:`airflow_pg_bulk.translate`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from airflow_pg_bulk import (
    accounting,
    catalog,
    fanout,
    history,
    naming,
    parquet,
    partitioned,
    realign,
    rebuild,
    records,
    rejects,
    sources,
    sql,
    translate,
    upsert,
)
from airflow_pg_bulk.driver import (
    copy_in,
    execute,
    is_database_error,
    rollback_quietly,
    scalar,
    server_error,
    server_version,
)
from airflow_pg_bulk.errors import (
    BadDataError,
    IncompleteLoadError,
    LoadRefusedError,
    TransientLoadError,
)
from airflow_pg_bulk.finalize import check_ledger_plan, finalize, missing_partitions
from airflow_pg_bulk.plan import (
    LoadPlan,
    LoadRequest,
    Partition,
    Piece,
    RunOrder,
    Settings,
    planning,
)
from airflow_pg_bulk.plan.figures import LoadSummary, PartitionResult

__all__ = [
    "LoadRefusedError",
    "cleanup",
    "complete_and_finalize",
    "copy_partition",
    "finalize",
    "prepare",
    "read_pieces",
    "start_session",
]

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]  # (bytes so far, bytes expected or 0)

CLIENT_CHECK_INTERVAL = "10s"  # a backend whose client died stops its statement within this
CLEANUP_ATTEMPTS = 3  # cleanup's tries at a drop that meets lock_timeout
CLEANUP_BACKOFF = 1.0  # seconds before the second try, doubled before each next one


# --- every step ------------------------------------------------------------------------------


def start_session(conn: Any, application_name: str) -> None:
    """Prepare a step's new session: name it (see :func:`airflow_pg_bulk.naming.application_name`:
    a DBA sees the load, DAG, task and map index in ``pg_stat_activity``) and, on PostgreSQL 14+,
    set ``client_connection_check_interval`` so that a statement whose client was killed
    (SIGKILL: no cancel could be sent) stops within seconds instead of running to its end.
    Commits (a session setting set in a transaction that rolls back would be undone)."""
    check = CLIENT_CHECK_INTERVAL if server_version(conn) >= 140000 else None
    try:
        execute(conn, sql.session_setup(application_name, check))
        conn.commit()
    except BaseException:
        rollback_quietly(conn)
        raise


# --- prepare ---------------------------------------------------------------------------------


def prepare(
    conn: Any,
    request: LoadRequest,
    load_id: str,
    *,
    logical_date: str | None = None,
    run: RunOrder | None = None,
    store_pieces: bool = False,
) -> LoadPlan:
    """Validate the target, the source and the columns; create staging and the ledger.

    Re-runnable: when an earlier attempt for the same ``load_id`` made a ledger for the same
    plan (same files, cut and target) and the load is not finalized, staging and the ledger
    are kept, with every partition committed in them; otherwise that attempt's tables are
    dropped and made anew. An append this ``load_id`` finalized before is refused with
    :class:`AlreadyLoadedError` (its rows would be added twice). Nothing is changed on the
    target. Returns the plan for the other steps.

    :param logical_date: the DAG run's logical date (ISO 8601), recorded with the load.
    :param run: the DAG run and its data interval (under Airflow): a replace, replace_partitions
        or upsert refuses to replace rows a later run of the same DAG task loaded (a replace or
        upsert here already, before anything is made; see :mod:`airflow_pg_bulk.history`).
    :param store_pieces: also write each partition's pieces into the load's pieces table
        (:func:`read_pieces`), in the transaction that makes the ledger: for steps that run
        in other processes and get only the plan without pieces (Airflow's COPY and finalize
        tasks). The in-process runner keeps the whole plan in memory and needs none."""
    naming.check_load_id(load_id)
    schema, table = catalog.split_name(request.table)
    resumed = False
    try:
        target = catalog.capture(conn, schema, table)
        catalog.refuse_unsupported(target, request.mode)
        catalog.refuse_without_privileges(conn, target, request.mode)
        history.refuse_without_access(conn, schema)
        _seconds(conn, "abandoned_after", request.settings.abandoned_after)  # a valid interval
        if request.mode == "append":
            history.refuse_appending_twice(conn, schema, load_id, target.qualified)
        conn.rollback()
        if request.copy.format == "parquet":
            parquet.refuse_unsupported(request)
        files = sources.resolve(request.source, request.source_conn_id)
        header_columns: list[str] = []
        header_lengths: dict[str, int] = {}
        layout = None
        if request.copy.format == "parquet":  # columns matched by name, as a header's are
            layout = parquet.inspect(files)
            columns = tuple(parquet.match_columns(layout, planning.loadable_columns(target)))
        else:
            if request.copy.header:
                header_columns, header_lengths = sources.map_header(
                    files, request.copy, planning.loadable_columns(target)
                )
            columns = planning.plan_columns(request, target, header_columns)
        key = None
        if request.mode == "upsert":
            indexes = upsert.unique_indexes(conn, target)
            conn.rollback()
            key = planning.upsert_spec(request, target, columns, indexes)
        total = sum(f.size for f in files)
        strategy = rebuild.resolve(conn, request, target, total)
        conn.rollback()
        if layout is not None:
            partitions = parquet.plan_partitions(layout, request.partition_count(total))
        else:
            partitions = sources.plan_partitions(
                files, request.copy, request.partition_count(total), header_lengths
            )
        plan = planning.build_plan(
            request,
            target,
            load_id,
            columns=columns,
            partitions=partitions,
            source_bytes=total,
            logical_date=logical_date,
            upsert=key,
            file_order=[f.path for f in files],
            strategy=strategy,
            run=run,
        )
        if plan.mode in ("replace", "upsert"):  # the whole target: refused before any work
            history.refuse_overwriting_newer(conn, plan)
        digest = plan.digest
        # its DDL locks the target (LIKE) and any leftovers: wait no longer than lock_timeout
        execute(conn, sql.set_config("lock_timeout", request.settings.lock_timeout, local=True))
        resumed = _can_resume(conn, plan, digest)
        if not resumed:
            _drop_run_tables(conn, schema, load_id)
            _create_staging(conn, plan)
            execute(conn, sql.create_ledger(schema, plan.ledger_table))
            comment = ledger_comment(digest, target.qualified, scalar(conn, sql.now_epoch()))
            ledger = sql.qualified(schema, plan.ledger_table)
            execute(conn, sql.comment_on("TABLE", ledger, comment))
        if store_pieces:
            _store_pieces(conn, plan, digest)
        if plan.reject_table:
            catalog.create_if_missing(conn, plan.reject_table, sql.create_reject_table)
        history.ensure(conn, plan.history_table)
        conn.commit()
    except BaseException:
        rollback_quietly(conn)
        raise
    drop_abandoned(conn, plan)
    log.info(
        "Prepared load %s into %s (%s%s): %d files, %.1f MB in %d partitions, staging %s (%s)%s",
        load_id,
        target.qualified,
        request.mode,
        ", rebuild" if plan.rebuilds else "",
        len(files),
        total / 1e6,
        len(partitions),
        plan.staging_table,
        "logged" if plan.staging_logged else "unlogged",
        "; kept from an earlier attempt, with its committed partitions" if resumed else "",
    )
    return plan


def _seconds(conn: Any, name: str, interval: str) -> float:
    """A PostgreSQL interval option in seconds; refused when it is not an interval."""
    try:
        seconds = float(scalar(conn, sql.interval_seconds(interval)))
    except Exception as exc:
        rollback_quietly(conn)
        if not is_database_error(exc):
            raise
        raise LoadRefusedError(
            f"{name}={interval!r} is not a PostgreSQL interval (e.g. '1d', '12h', '30 min'): "
            f"{server_error(exc).message}"
        ) from None
    if seconds < 0:
        raise LoadRefusedError(f"{name}={interval!r} is negative")
    return seconds


def ledger_comment(digest: str, target: str, prepared_at: float) -> str:
    """The ledger's comment: the plan's digest on its first line (what a step checks its plan
    against), then what the next loads read to tell a live load from an abandoned one: the
    target and prepare's time (the server's clock, epoch seconds)."""
    return digest + "\n" + json.dumps({"target": target, "prepared_at": prepared_at})


def _comment_record(comment: str | None) -> dict[str, Any] | None:
    """What :func:`ledger_comment` wrote after the digest; None for a ledger without it."""
    _digest, _, record = (comment or "").partition("\n")
    try:
        found = json.loads(record)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


LEFTOVER_LOCK_TIMEOUT = "100ms"  # a leftover locked that long is in use: left alone


def drop_abandoned(conn: Any, plan: LoadPlan) -> list[str]:
    """Drop the tables other loads into the same target left behind (a crashed load's staging,
    a finalized load whose cleanup failed), never those of a load that may still be running.
    Returns the names dropped. Runs at the end of prepare, in transactions of its own.

    Another load's tables (found by its ledger, which names the target: cleanup drops the
    ledger last) are dropped when **none** of its sessions is connected
    (``application_name`` ``pgbulk:<its load id>:…``), **no** session holds a lock on its
    ledger (a COPY holds one until it commits; waited for :data:`LEFTOVER_LOCK_TIMEOUT`), and
    it is **finalized** (its rows are in, what is left is what its cleanup did not drop) or
    has shown **no sign of life for** ``abandoned_after`` (neither its prepare nor any COPY
    committed since). Its ledger is locked first and everything is dropped in one transaction,
    so a step of that load starting meanwhile waits and then finds no ledger: it fails saying
    so (the target untouched), it never loads into half-dropped tables. A load whose tables
    cannot be dropped (locked, another role's) is skipped with a warning."""
    t = plan.target
    dropped: list[str] = []
    try:
        ledgers = execute(conn, sql.load_ledgers(t.schema, naming.LEDGER_PATTERN))
        conn.commit()
    except Exception as exc:
        rollback_quietly(conn)
        if not is_database_error(exc):
            raise
        log.warning("Load %s: could not look for abandoned loads: %s", plan.load_id, exc)
        return dropped
    max_age = None
    for ledger, comment in ledgers:
        other = naming.load_of_ledger(ledger)
        record = _comment_record(comment)
        if other in (None, plan.load_id) or record is None or record.get("target") != t.qualified:
            continue
        try:
            if max_age is None:
                max_age = _seconds(conn, "abandoned_after", plan.settings.abandoned_after)
            # first without a lock (a live load is not touched at all), then again under it
            execute(conn, sql.set_config("lock_timeout", LEFTOVER_LOCK_TIMEOUT, local=True))
            why = _abandoned(conn, t.schema, ledger, other, record, max_age)
            conn.rollback()
            if why is None:
                continue
            execute(conn, sql.set_config("lock_timeout", LEFTOVER_LOCK_TIMEOUT, local=True))
            execute(conn, sql.lock_tables([(t.schema, ledger)], "ACCESS EXCLUSIVE"))
            why = _abandoned(conn, t.schema, ledger, other, record, max_age)
            if why is None:
                conn.rollback()
                continue
            names = _drop_run_tables(conn, t.schema, other)
            conn.commit()
        except Exception as exc:
            rollback_quietly(conn)
            if not is_database_error(exc):
                raise
            locked = server_error(exc).sqlstate == "55P03"  # in use: a COPY of it, a reader
            log.log(
                logging.INFO if locked else logging.WARNING,
                "Load %s: left the tables of load %s into %s: %s",
                plan.load_id,
                other,
                t.qualified,
                server_error(exc).message,
            )
            continue
        dropped.extend(names)
        log.warning(
            "Load %s: dropped the tables load %s into %s left behind (%s; its cleanup did not "
            "run or failed): %s",
            plan.load_id,
            other,
            t.qualified,
            why,
            ", ".join(names),
        )
    return dropped


def _abandoned(
    conn: Any, schema: str, ledger: str, load_id: str, record: dict[str, Any], max_age: float
) -> str | None:
    """Why the load whose ledger this is may be dropped (finalized, or no sign of life for
    ``max_age`` seconds, and none of its sessions connected); None: it may be running."""
    if scalar(conn, sql.load_sessions(naming.application_name(load_id, ""))):
        return None
    finalized, copied, now = execute(conn, sql.ledger_activity(schema, ledger))[0]
    if finalized:
        return "finalized"
    quiet = now - max(float(record.get("prepared_at") or 0), float(copied or 0))
    return f"no sign of life for {quiet:.0f} s" if quiet > max_age else None


def _can_resume(conn: Any, plan: LoadPlan, digest: str) -> bool:
    """An earlier attempt made staging and a ledger for this very plan, not finalized: keep
    them, and the partitions committed in them."""
    schema = plan.target.schema
    if scalar(conn, sql.ledger_digest(schema, plan.ledger_table)) != digest:
        return False
    if not scalar(conn, sql.relation_exists(schema, plan.staging_table)):
        return False
    ledger = execute(conn, sql.ledger_rows(schema, plan.ledger_table))
    return all(row[0] != sql.FINALIZED for row in ledger)


def _store_pieces(conn: Any, plan: LoadPlan, digest: str) -> None:
    """Write each partition's pieces into the load's pieces table, its comment the plan's
    digest (as the ledger's); kept as it is when prepare runs again for the same plan."""
    schema = plan.target.schema
    name = naming.pieces_table(plan.load_id)
    if scalar(conn, sql.ledger_digest(schema, name)) == digest:
        return
    if scalar(conn, sql.relation_exists(schema, name)):  # (no DDL when there is none)
        execute(conn, sql.drop_table(schema, name))
    execute(conn, sql.create_pieces(schema, name))
    execute(conn, sql.comment_on("TABLE", sql.qualified(schema, name), digest))
    rows = [  # ensure_ascii (json's default): any database encoding stores the text as is
        (p.index, json.dumps([x.to_dict() for x in p.pieces], ensure_ascii=True))
        for p in plan.partitions
    ]
    if rows:
        execute(conn, sql.insert_pieces(schema, name, rows))


def read_pieces(conn: Any, plan: LoadPlan, partitions: Sequence[int]) -> list[Partition]:
    """The partitions of ``plan`` with these numbers, with the pieces prepare stored for them
    (``store_pieces``): what a COPY task holding only the plan without pieces (a few KB,
    from XCom) copies. Refused when the pieces were stored for another plan (prepare ran
    again for changed files) or are gone (cleanup ran)."""
    t = plan.target
    name = naming.pieces_table(plan.load_id)
    digest = plan.digest or planning.plan_digest(plan)
    try:
        found = scalar(conn, sql.ledger_digest(t.schema, name))
        rows = execute(conn, sql.select_pieces(t.schema, name, partitions)) if found else []
        conn.commit()
    except BaseException:
        rollback_quietly(conn)
        raise
    if found is None:
        raise IncompleteLoadError(
            f"load {plan.load_id} into {t.qualified} has no pieces table ({name}): its "
            "cleanup ran, or its prepare did not. Run the load again from prepare"
        )
    if found != digest:
        raise LoadRefusedError(
            f"the pieces of load {plan.load_id} were stored for another plan: prepare ran "
            "again after this task read its plan (did the source files change?). Nothing was "
            "loaded by this task; clear it (or the whole load) to run with the new plan"
        )
    stored = {index: text for index, text in rows}
    missing = sorted(set(partitions) - stored.keys())
    if missing:
        raise IncompleteLoadError(
            f"load {plan.load_id} into {t.qualified}: no pieces stored for partitions {missing}"
        )
    sizes = {p.index: p.bytes for p in plan.partitions}
    return [
        Partition(index, tuple(Piece.from_dict(p) for p in json.loads(stored[index])), sizes[index])
        for index in partitions
    ]


def _create_staging(conn: Any, plan: LoadPlan) -> None:
    t = plan.target
    if partitioned.partitioned_staging(plan):
        partitioned.create_staging(conn, plan)
    elif plan.mode == "replace" or (plan.mode == "append" and plan.rebuilds):
        # an append that rebuilds COPYs into the table it swaps in (see rebuild.py)
        version = scalar(conn, sql.server_version())
        execute(
            conn,
            sql.create_staging_like(
                t.schema,
                plan.staging_table,
                t.table,
                logged=plan.staging_logged,
                server_version=version,
            ),
        )
        for seq in t.sequences:
            if seq.kind == "identity" and seq.column not in plan.columns:
                # numbered from the target's own sequence, as an INSERT into the target
                # would be (no value it handed out is used again); the swap makes the
                # column an identity again (finalize._restore_identity)
                execute(conn, sql.drop_identity(t.schema, plan.staging_table, seq.column))
                execute(
                    conn,
                    sql.default_from_sequence(
                        t.schema, plan.staging_table, seq.column, (seq.schema, seq.name)
                    ),
                )
    else:
        execute(
            conn,
            sql.create_staging_columns(
                t.schema, plan.staging_table, t.table, plan.columns, logged=plan.staging_logged
            ),
        )
        if plan.upsert:
            upsert.add_source_order(conn, plan)


def _drop_run_tables(conn: Any, schema: str, load_id: str) -> list[str]:
    names = [
        row[0] for row in execute(conn, sql.run_tables(schema, naming.run_objects_pattern(load_id)))
    ]
    for name in names:
        execute(conn, sql.drop_table(schema, name, if_exists=True))
    return names


# --- copy ------------------------------------------------------------------------------------


class _Counted:
    """Pass chunks through, counting bytes and reporting progress now and then."""

    def __init__(
        self, chunks: Iterable[bytes], progress: ProgressCallback | None, done: int, expected: int
    ) -> None:
        self._chunks = chunks
        self._progress = progress
        self.bytes = 0
        self._done = done
        self._expected = expected

    def __iter__(self) -> Iterator[bytes]:
        last = time.monotonic()
        for chunk in self._chunks:
            self.bytes += len(chunk)
            yield chunk
            now = time.monotonic()
            if self._progress and now - last >= 5:
                last = now
                self._progress(self._done + self.bytes, self._expected)


def copy_partition(
    conn: Any, plan: LoadPlan, index: int, progress: ProgressCallback | None = None
) -> PartitionResult:
    """Load one partition into staging, exactly once.

    The partition's ledger row is inserted first (a concurrent duplicate attempt waits on it)
    and committed in the same transaction as the rows: a retry after a commit is a no-op, a
    retry after a failure starts clean."""
    part = plan.partition(index)
    t = plan.target
    started = time.perf_counter()
    try:
        execute(
            conn, sql.set_config("synchronous_commit", plan.settings.synchronous_commit, local=True)
        )
        check_ledger_plan(conn, plan)
        if not execute(conn, sql.claim_partition(t.schema, plan.ledger_table, index)):
            rows, nbytes, seconds, rejected = execute(
                conn, sql.partition_figures(t.schema, plan.ledger_table, index)
            )[0]
            conn.rollback()
            log.info(
                "Partition %d of load %s was committed before (%d rows): nothing to do",
                index,
                plan.load_id,
                rows,
            )
            return PartitionResult(index, rows, nbytes, seconds, skipped=True, rejects=rejected)
        rows = nbytes = rejected = 0
        statement = rule = None
        if plan.copy.format != "parquet":  # parquet.copy_piece makes its own
            statement = sql.copy_from_stdin(t.schema, plan.staging_table, plan.columns, plan.copy)
            rule = records.marker_rule(plan.copy.format, server_version(conn))
        for piece in part.pieces:
            if plan.upsert:  # read by staging's source order column (see upsert.py)
                execute(conn, sql.set_config(sql.PIECE_SETTING, str(piece.ordinal), local=True))
            if plan.copy.format == "parquet":
                loaded, sent = parquet.copy_piece(conn, plan, piece, progress, nbytes, part.bytes)
                rows, nbytes = rows + loaded, nbytes + sent
                continue
            if plan.errors.rejecting:
                # a row set aside must be a real record: check the guessed bounds first
                if piece.speculative and not realign.aligned(piece, plan.copy):
                    raise realign.Misaligned(piece)
                outcome = rejects.copy_rejecting(
                    conn,
                    plan,
                    piece,
                    statement,
                    rejected,
                    lambda chunks, done=nbytes: _Counted(chunks, progress, done, part.bytes),
                    rule,
                )
                rows, nbytes, rejected = (
                    rows + outcome.rows,
                    nbytes + outcome.bytes,
                    rejected + outcome.rejects,
                )
                continue
            counter, chunks = accounting.counted_chunks(piece, plan.copy, rule, t.qualified)
            counted = _Counted(chunks, progress, nbytes, part.bytes)
            try:
                try:
                    loaded = copy_in(conn, statement, counted)
                except Exception as exc:
                    raise translate.copy_error(exc, plan, piece) from exc
                realign.check_end(counter, piece)
                accounting.check_rows(counter, piece, plan.copy, t.qualified, loaded)
            except BadDataError as exc:
                # bad data, or bytes cut at a wrongly guessed record start?
                if piece.speculative and not realign.aligned(piece, plan.copy):
                    raise realign.Misaligned(piece) from exc
                raise
            rows += loaded
            nbytes += counted.bytes
        seconds = time.perf_counter() - started
        execute(
            conn,
            sql.record_partition(
                t.schema, plan.ledger_table, index, rows, nbytes, seconds, rejected
            ),
        )
        conn.commit()
    except realign.Misaligned as exc:
        rollback_quietly(conn)
        return realign.record_misaligned(conn, plan, index, exc, time.perf_counter() - started)
    except BaseException:
        rollback_quietly(conn)
        raise
    log.info(
        "Partition %d of load %s: %d rows, %.1f MB in %.2f s (%.0f rows/s)",
        index,
        plan.load_id,
        rows,
        nbytes / 1e6,
        seconds,
        rows / seconds if seconds else 0,
    )
    return PartitionResult(index, rows, nbytes, seconds, rejects=rejected)


# --- finalize, completing what is missing ------------------------------------------------------


def complete_and_finalize(
    conn: Any,
    plan: LoadPlan,
    progress: ProgressCallback | None = None,
    sessions: fanout.Sessions | None = None,
) -> LoadSummary:
    """COPY the partitions the ledger lacks, then :func:`finalize`.

    The COPY tasks normally leave nothing to do here. A partition is missing when prepare ran
    again after they committed — the run's tasks were cleared in part (clearing finalize
    clears its setup, prepare, and its teardown, cleanup, but not the COPY tasks) — and the
    staging those COPY tasks filled was dropped. Each missing partition is loaded here,
    exactly once (the ledger's claim), before anything becomes visible.

    :param sessions: extra sessions for building several indexes at once (see
        :func:`airflow_pg_bulk.finalize.finalize`)."""
    for index in missing_partitions(conn, plan):
        log.warning(
            "Load %s: partition %d is not in the ledger (prepare ran again since its COPY "
            "task committed); loading it in finalize",
            plan.load_id,
            index,
        )
        copy_partition(conn, plan, index, progress)
    return finalize(conn, plan, sessions)


# --- cleanup ---------------------------------------------------------------------------------


def cleanup(
    conn: Any,
    schema: str,
    load_id: str,
    *,
    lock_timeout: str = Settings.lock_timeout,
    attempts: int = CLEANUP_ATTEMPTS,
    backoff: float = CLEANUP_BACKOFF,
) -> list[str]:
    """Drop every table this load created (staging, ledger); never the target. Idempotent.
    The ledger goes last (see :func:`drop_abandoned`).

    The tables are dropped in one transaction under ``lock_timeout``; when that meets it, each
    in its own transaction; a drop that meets it
    (another session still holds a lock on the table: a killed task's backend that has not
    ended yet, a report reading staging) is tried again after ``backoff`` seconds, doubled
    each time, ``attempts`` times in all. Then :class:`TransientLoadError` names the tables
    left. So cleanup waits at most about ``attempts * lock_timeout`` per table plus the
    pauses. Returns the names dropped."""
    dropped: list[str] = []
    for attempt in range(1, attempts + 1):
        try:
            left = _drop_each(conn, schema, load_id, lock_timeout, dropped)
        except BaseException:
            rollback_quietly(conn)
            raise
        if not left:
            break
        if attempt == attempts:
            raise TransientLoadError(
                f"cleanup of load {load_id}: could not drop {', '.join(left)} in schema "
                f"{schema}: another session held a lock on it past lock_timeout "
                f"({lock_timeout}) {attempts} times. Retry the cleanup task, or drop them by "
                "hand once that session has ended (see pg_locks)",
                sqlstate="55P03",
            )
        pause = backoff * 2 ** (attempt - 1)
        log.warning(
            "Cleanup of load %s: %s locked by another session; trying again in %.1f s",
            load_id,
            ", ".join(left),
            pause,
        )
        time.sleep(pause)
    if dropped:
        log.info("Cleanup of load %s dropped %s", load_id, ", ".join(dropped))
    return dropped


def _drop_each(
    conn: Any, schema: str, load_id: str, lock_timeout: str, dropped: list[str]
) -> list[str]:
    """Drop the run's tables, appending to ``dropped``; return those a lock timeout left.
    All in one transaction (one commit whatever their number); when that meets
    ``lock_timeout``, one transaction each, so that a locked table keeps no other."""
    left = []
    ledger = naming.ledger_table(load_id)
    names = [
        row[0] for row in execute(conn, sql.run_tables(schema, naming.run_objects_pattern(load_id)))
    ]
    conn.commit()
    if not names:
        return left
    try:
        execute(conn, sql.set_config("lock_timeout", lock_timeout, local=True))
        execute(conn, sql.drop_tables(schema, names))
        conn.commit()
    except Exception as exc:
        if not (is_database_error(exc) and server_error(exc).sqlstate == "55P03"):
            raise
        rollback_quietly(conn)
    else:
        dropped.extend(names)
        return left
    # one at a time: the ledger last; as long as any of the load's tables is left, its
    # ledger says whose they are, for the next load into the target (see drop_abandoned)
    names.sort(key=lambda name: name == ledger)
    for name in names:
        try:
            execute(conn, sql.set_config("lock_timeout", lock_timeout, local=True))
            execute(conn, sql.drop_table(schema, name, if_exists=True))
            conn.commit()
        except Exception as exc:
            if not (is_database_error(exc) and server_error(exc).sqlstate == "55P03"):
                raise
            rollback_quietly(conn)
            left.append(name)
            continue
        dropped.append(name)
    return left
