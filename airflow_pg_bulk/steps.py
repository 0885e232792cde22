"""The four steps of a load: prepare, copy one partition, finalize, cleanup.

Each takes an open DB-API connection (psycopg 3 or psycopg2) and plain data, and knows nothing
of Airflow: the operators, the in-process runner and the tests all call these functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from airflow_pg_bulk import accounting, catalog, naming, records, rejects, sources, sql
from airflow_pg_bulk.driver import (
    copy_in,
    execute,
    execute_count,
    is_connection_lost,
    is_database_error,
    scalar,
    server_error,
    server_version,
)
from airflow_pg_bulk.errors import (
    TRANSIENT_SQLSTATES,
    BadDataError,
    ConstraintViolationError,
    IncompleteLoadError,
    LoadRefusedError,
    TransientLoadError,
    is_data_sqlstate,
    parse_copy_context,
)
from airflow_pg_bulk.figures import LoadSummary, PartitionResult, PhaseClock
from airflow_pg_bulk.plan import (
    DEFAULT_REJECT_TABLE,
    ConstraintDef,
    LoadPlan,
    LoadRequest,
    Piece,
    TargetDefinition,
)

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]  # (bytes so far, bytes expected or 0)

_VALUE_LIMIT = 80


# --- prepare ---------------------------------------------------------------------------------


def prepare(conn: Any, request: LoadRequest, load_id: str) -> LoadPlan:
    """Validate the target, the source and the columns; create staging and the ledger.

    Re-runnable: a previous attempt's leftovers for the same ``load_id`` are dropped first.
    Nothing is changed on the target. Returns the plan for the other steps."""
    naming.check_load_id(load_id)
    schema, table = catalog.split_name(request.table)
    try:
        target = catalog.capture(conn, schema, table)
        catalog.refuse_unsupported(target, request.mode)
        catalog.refuse_without_privileges(conn, target, request.mode)
        conn.rollback()
        files = sources.resolve(request.source)
        loadable = [c.name for c in target.columns if not c.generated]
        header_lengths: dict[str, int] = {}
        if request.copy.header:
            columns, header_lengths = sources.map_header(files, request.copy, loadable)
            columns = columns or loadable
        else:
            columns = list(request.columns or loadable)
            unknown = [c for c in columns if c not in loadable]
            if unknown:
                raise LoadRefusedError(
                    f"columns {unknown} are not loadable columns of {target.qualified} "
                    f"(loadable: {loadable})"
                )
        reject_table = None
        if request.errors.rejecting:
            reject_table = (
                catalog.split_name(request.errors.reject_table)
                if request.errors.reject_table
                else (schema, DEFAULT_REJECT_TABLE)
            )
        total = sum(f.size for f in files)
        partitions = sources.plan_partitions(
            files, request.copy, request.partition_count(total), header_lengths
        )
        plan = LoadPlan(
            load_id=load_id,
            mode=request.mode,
            target=target,
            staging_table=naming.staging_table(load_id),
            ledger_table=naming.ledger_table(load_id),
            # an unlogged target stays unlogged: its replacement is staged unlogged
            staging_logged=request.staging_is_logged()
            and not (request.mode == "replace" and target.persistence == "u"),
            columns=tuple(columns),
            copy=request.copy,
            partitions=tuple(partitions),
            settings=request.settings,
            source_bytes=total,
            errors=request.errors,
            reject_table=reject_table,
        )
        _drop_run_tables(conn, schema, load_id)
        _create_staging(conn, plan)
        execute(conn, sql.create_ledger(schema, plan.ledger_table))
        if reject_table and not scalar(conn, sql.relation_exists(*reject_table)):
            # (CREATE ... IF NOT EXISTS would need CREATE on the schema every time)
            execute(conn, sql.create_reject_table(*reject_table))
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    log.info(
        "Prepared load %s into %s (%s): %d files, %.1f MB in %d partitions, staging %s (%s)",
        load_id,
        target.qualified,
        request.mode,
        len(files),
        total / 1e6,
        len(partitions),
        plan.staging_table,
        "logged" if plan.staging_logged else "unlogged",
    )
    return plan


def _create_staging(conn: Any, plan: LoadPlan) -> None:
    t = plan.target
    if plan.mode == "replace":
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
    else:
        execute(
            conn,
            sql.create_staging_columns(
                t.schema, plan.staging_table, t.table, plan.columns, logged=plan.staging_logged
            ),
        )


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
        statement = sql.copy_from_stdin(t.schema, plan.staging_table, plan.columns, plan.copy)
        rule = records.marker_rule(plan.copy.format, server_version(conn))
        for piece in part.pieces:
            if plan.errors.rejecting:
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
                loaded = copy_in(conn, statement, counted)
            except Exception as exc:
                raise _copy_error(exc, plan, piece) from exc
            accounting.check_rows(counter, piece, plan.copy, t.qualified, loaded)
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
    except BaseException:
        _safe_rollback(conn)
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


def _safe_rollback(conn: Any) -> None:
    try:
        conn.rollback()
    except Exception:  # the connection may be gone; the server rolls back on its own
        log.debug("rollback failed", exc_info=True)


def _copy_error(exc: Exception, plan: LoadPlan, piece: Piece) -> Exception:
    if is_connection_lost(exc):
        return TransientLoadError(
            f"loading {piece.path} into {plan.target.qualified}: the connection to the server "
            f"was lost ({str(exc).strip()}); nothing of this partition was committed"
        )
    if not is_database_error(exc):
        return exc
    err = server_error(exc)
    if err.sqlstate in TRANSIENT_SQLSTATES:
        return TransientLoadError(
            f"loading {piece.path} into {plan.target.qualified}: {err.message} (SQLSTATE "
            f"{err.sqlstate}); nothing of this partition was committed and a retry may succeed",
            sqlstate=err.sqlstate,
        )
    if not is_data_sqlstate(err.sqlstate):
        return exc
    record, column, quoted = parse_copy_context(err.context)
    where = piece.path
    line = None
    if record is not None:
        try:
            first, last = sources.locate(piece, record, plan.copy)
        except ValueError:  # the file's bytes cannot be read the way the server read them
            where += f" (record {record} of the part starting at line {piece.first_line})"
        else:
            line = first
            where += f" line {first}" if first == last else f" lines {first}-{last}"
    if column:
        where += f", column {column}"
    value = _truncate(quoted) if quoted is not None else None
    message = f"{where}: {_truncate(err.message, 300)}"
    if value is not None and value not in err.message:
        message += f" (value {value!r})"
    if err.detail:
        message += f"; {err.detail.rstrip('.')}"
    message = naming.original_names(plan, message)
    message += f". Nothing of this load reached {plan.target.qualified}."
    return BadDataError(message, path=piece.path, line=line, column=column, value=value)


def _truncate(value: str, limit: int = _VALUE_LIMIT) -> str:
    return value if len(value) <= limit else value[:limit] + "..."


# --- finalize --------------------------------------------------------------------------------


def finalize(conn: Any, plan: LoadPlan) -> LoadSummary:
    """Check every partition is in the ledger, then make the staged rows the target's.

    replace: build the captured indexes and constraints on staging, restore triggers, grants,
    owner and comments, ANALYZE, and swap it in for the target in one short transaction.
    append: insert the staged rows into the target in one transaction."""
    clock = PhaseClock()
    t = plan.target
    locked = False
    try:
        with clock.phase("check"):
            execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True))
            execute(conn, sql.load_lock(plan.load_id))
            conn.commit()
            locked = True
            rows, nbytes, rejected, finalized = _check_ledger(conn, plan)
        if finalized:
            log.info(
                "Load %s was finalized before (the last attempt's commit went through): "
                "%d rows are in %s; nothing to do",
                plan.load_id,
                rows,
                t.qualified,
            )
        elif plan.mode == "replace":
            _finalize_replace(conn, plan, clock, rows, nbytes, rejected)
        else:
            _finalize_append(conn, plan, clock, rows, nbytes, rejected)
    except BaseException as exc:
        _safe_rollback(conn)
        raise _finalize_error(exc, plan) from exc
    finally:
        if locked:
            _release_load_lock(conn, plan)
    summary = LoadSummary(
        t.qualified,
        plan.mode,
        rows,
        nbytes,
        len(plan.partitions),
        clock.seconds,
        rejected,
        records=rows + rejected,  # each partition's accounting checked rows + rejects = records
    )
    log.info(
        "Finalized load %s: %d rows now in %s (%s); finalize phases: %s",
        plan.load_id,
        rows,
        t.qualified,
        plan.mode,
        ", ".join(f"{name} {secs:.2f} s" for name, secs in clock.seconds.items()),
    )
    return summary


def _release_load_lock(conn: Any, plan: LoadPlan) -> None:
    try:
        execute(conn, sql.load_lock(plan.load_id, release=True))
        conn.commit()
    except Exception:  # the connection may be gone: the session's end released the lock
        log.debug("releasing the finalize lock failed", exc_info=True)


def _check_ledger(conn: Any, plan: LoadPlan) -> tuple[int, int, int, bool]:
    """Rows, bytes and rejects of the committed partitions, and whether the load was made
    visible before (a retry after a commit whose acknowledgement was lost)."""
    t = plan.target
    ledger = execute(conn, sql.ledger_rows(t.schema, plan.ledger_table))
    for row in ledger:
        if row[0] == sql.FINALIZED:
            conn.commit()
            return row[1], row[2], row[4], True
    done = {row[0] for row in ledger}
    missing = sorted(p.index for p in plan.partitions if p.index not in done)
    if missing:
        raise IncompleteLoadError(
            f"load {plan.load_id} into {t.qualified}: partitions {missing} are not in the ledger "
            "(their COPY tasks did not commit); run them before finalize"
        )
    rows = sum(row[1] for row in ledger)
    nbytes = sum(row[2] for row in ledger)
    rejected = sum(row[4] for row in ledger)
    if rejected > plan.errors.max_rejects:
        raise BadDataError(
            f"{rejected} rows of the source were rejected, more than max_rejects="
            f"{plan.errors.max_rejects}; nothing of this load reached {t.qualified}. "
            f"See {'.'.join(plan.reject_table or ())} for load {plan.load_id}"
        )
    if not plan.staging_logged and rows:
        size = scalar(conn, sql.relation_size(t.schema, plan.staging_table))
        if not size:
            raise IncompleteLoadError(
                f"load {plan.load_id}: the unlogged staging table {plan.staging_table} is empty "
                f"although the ledger records {rows} rows: a server crash emptied it. "
                "Nothing reached the target; run the load again"
            )
    conn.commit()
    return rows, nbytes, rejected, False


def _staging_lost(plan: LoadPlan, staged: int, rows: int) -> IncompleteLoadError:
    return IncompleteLoadError(
        f"load {plan.load_id}: the unlogged staging table {plan.staging_table} holds {staged} "
        f"rows but the ledger records {rows}: a server crash emptied it after some partitions "
        f"had committed. Nothing reached {plan.target.qualified}; run the whole load again "
        "(clear its prepare task)"
    )


def _finalize_append(
    conn: Any, plan: LoadPlan, clock: PhaseClock, rows: int, nbytes: int, rejected: int
) -> None:
    t = plan.target
    with clock.phase("insert"):
        execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True))
        execute(conn, sql.advisory_xact_lock(t.oid))
        inserted = execute_count(
            conn,
            sql.insert_from_staging(
                t.schema,
                t.table,
                plan.staging_table,
                plan.columns,
                override_identity=any(
                    c.identity == "a" and c.name in plan.columns for c in t.columns
                ),
            ),
        )
        if inserted != rows:
            conn.rollback()
            raise _staging_lost(plan, inserted, rows)
        execute(conn, sql.mark_finalized(t.schema, plan.ledger_table, rows, nbytes, rejected))
        conn.commit()
    if plan.settings.analyze:
        with clock.phase("analyze"):
            execute(conn, sql.analyze(t.schema, t.table))
            conn.commit()


def _finalize_replace(
    conn: Any, plan: LoadPlan, clock: PhaseClock, rows: int, nbytes: int, rejected: int
) -> None:
    """Build on staging what the target has; steps already done by an earlier attempt of this
    finalize are skipped, so a retry goes on where the last one stopped."""
    t = plan.target
    stage = plan.staging_table
    built = _staging_state(conn, plan)
    execute(conn, sql.set_config("maintenance_work_mem", plan.settings.maintenance_work_mem))
    if ("persistence", "u") in built:
        if t.persistence == "p":
            with clock.phase("set_logged"):
                execute(conn, sql.set_logged(t.schema, stage))
                conn.commit()
        # Logged now (or never: an unlogged target): check no crash emptied staging before.
        staged = scalar(conn, sql.count_rows(t.schema, stage))
        conn.commit()
        if staged != rows:
            raise _staging_lost(plan, staged, rows)
    index_names, constraint_names = naming.temp_names(plan)
    with clock.phase("indexes"):
        for index in t.indexes:
            name = index_names[index.name]
            done_as_key = (
                index.constraint and ("constraint", constraint_names[index.constraint]) in built
            )
            if built.get(("index", name)) or done_as_key:
                continue
            if ("index", name) in built:  # an invalid leftover of an interrupted build
                execute(conn, sql.drop_index(t.schema, name))
            execute(
                conn, sql.create_index(t.schema, stage, name, unique=index.unique, tail=index.tail)
            )
            conn.commit()
    with clock.phase("constraints"):
        for con in t.constraints:
            _add_constraint(conn, plan, con, constraint_names[con.name], index_names, built)
    if plan.settings.analyze:
        with clock.phase("analyze"):
            execute(conn, sql.analyze(t.schema, stage))
            conn.commit()
    with clock.phase("swap"):
        _swap(conn, plan, index_names, constraint_names)
        execute(conn, sql.mark_finalized(t.schema, plan.ledger_table, rows, nbytes, rejected))
        conn.commit()


def _staging_state(conn: Any, plan: LoadPlan) -> dict[tuple[str, str], bool | None]:
    rows = execute(conn, sql.staging_state(plan.target.schema, plan.staging_table))
    conn.commit()
    return {(kind, name): flag for kind, name, flag in rows}


def _add_constraint(
    conn: Any,
    plan: LoadPlan,
    con: ConstraintDef,
    name: str,
    index_names: dict[str, str],
    built: dict[tuple[str, str], bool | None],
) -> None:
    t = plan.target
    stage = plan.staging_table
    exists = ("constraint", name) in built
    if con.kind in ("p", "u"):
        if not exists:
            execute(
                conn,
                sql.add_key_using_index(
                    t.schema,
                    stage,
                    name,
                    kind=con.kind,
                    index=index_names[con.index or ""],
                    deferrable=con.deferrable,
                    deferred=con.deferred,
                ),
            )
    elif con.kind in ("c", "f"):
        if not exists:
            execute(conn, sql.add_constraint(t.schema, stage, name, con.definition, not_valid=True))
            conn.commit()
        if con.validated and not built.get(("constraint", name)):
            execute(conn, sql.validate_constraint(t.schema, stage, name))
    elif not exists:
        execute(conn, sql.add_constraint(t.schema, stage, name, con.definition))
    conn.commit()


def _swap(
    conn: Any, plan: LoadPlan, index_names: dict[str, str], constraint_names: dict[str, str]
) -> None:
    """One transaction: the staging table takes the target's place, with everything of it."""
    t = plan.target
    schema, table = t.schema, t.table
    retired = naming.retired_table(plan.load_id)
    execute(conn, sql.set_config("lock_timeout", plan.settings.lock_timeout, local=True))
    execute(conn, sql.advisory_xact_lock(t.oid))
    execute(conn, sql.lock_exclusive(schema, table))
    now = catalog.capture(conn, schema, table)  # pins search_path for the rest of the swap
    if now.fingerprint() != t.fingerprint():
        raise LoadRefusedError(
            f"the definition of {t.qualified} changed between prepare and finalize "
            "(columns, indexes, constraints, triggers, grants, owner or comments); "
            "nothing was swapped. Run the load again"
        )
    views = execute(conn, sql.dependent_views(now.oid))
    identity_positions = {}
    for seq in t.sequences:
        if seq.kind == "identity":
            identity_positions[seq.column] = (
                seq.name,
                *execute(conn, sql.sequence_state(seq.schema, seq.name))[0],
            )
    for key in t.referencing_keys:
        execute(conn, sql.drop_constraint(key.schema, key.table, key.name))
    execute(conn, sql.rename_table(schema, table, retired))
    execute(conn, sql.rename_table(schema, plan.staging_table, table))
    if t.owner != scalar(conn, sql.current_user()):
        # first: a serial sequence (the target owner's) can only be owned by a table of the
        # same owner
        execute(conn, sql.set_owner(schema, table, t.owner))
    for view_schema, view_name, _kind, body, options in views:
        execute(conn, sql.create_or_replace_view(view_schema, view_name, options, body))
    for seq in t.sequences:
        if seq.kind == "serial":
            execute(conn, sql.sequence_owned_by(seq.schema, seq.name, table, seq.column))
    execute(conn, sql.drop_table(schema, retired))
    for original, temp in constraint_names.items():
        execute(conn, sql.rename_constraint(schema, table, temp, original))
    for index in t.indexes:
        if index.constraint is None:
            execute(conn, sql.rename_index(schema, index_names[index.name], index.name))
    for column, (name, last_value, is_called, _increment) in identity_positions.items():
        new_schema, new_name = execute(conn, sql.identity_sequence(schema, table, column))[0]
        staged_last, staged_called, increment = execute(
            conn, sql.sequence_state(new_schema, new_name)
        )[0]
        execute(conn, sql.rename_sequence(new_schema, new_name, name))
        # Rows loaded without the key took values from staging's own sequence: never go back
        # behind them (an INSERT would collide); otherwise keep the old table's position.
        if not (staged_called and (not is_called or (staged_last - last_value) * increment > 0)):
            execute(conn, sql.set_sequence(new_schema, name, last_value, is_called))
    _restore_properties(conn, t)
    for key in t.referencing_keys:
        execute(
            conn,
            sql.add_constraint(
                key.schema, key.table, key.name, key.definition, not_valid=not key.validated
            ),
        )
    # (the caller notes the load as finalized in the same transaction, then commits)


def _restore_properties(conn: Any, t: TargetDefinition) -> None:
    schema, table = t.schema, t.table
    for trigger in t.triggers:
        execute(conn, sql.execute_definition(trigger.definition))
        if trigger.enabled != "O":
            execute(conn, sql.set_trigger_state(schema, table, trigger.name, trigger.enabled))
    execute(conn, sql.reset_autovacuum(schema, table))
    if t.reloptions:
        execute(conn, sql.set_reloptions(schema, table, t.reloptions))
    for g in t.grants:
        execute(
            conn,
            sql.grant(
                schema, table, g.privilege, g.grantee, grantable=g.grantable, column=g.column
            ),
        )
    if t.comment is not None:
        execute(conn, sql.comment_on("TABLE", sql.qualified(schema, table), t.comment))
    for column, text in t.column_comments.items():
        execute(conn, sql.comment_on("COLUMN", sql.qualified(schema, table, column), text))
    for index in t.indexes:
        if index.comment is not None:
            execute(conn, sql.comment_on("INDEX", sql.qualified(schema, index.name), index.comment))
    for con in t.constraints:
        if con.comment is not None:
            execute(conn, sql.comment_on_constraint(schema, table, con.name, con.comment))


def _finalize_error(exc: BaseException, plan: LoadPlan) -> BaseException:
    t = plan.target
    if is_connection_lost(exc):
        return TransientLoadError(
            f"finalize of {t.qualified}: the connection to the server was lost "
            f"({str(exc).strip()}); the target is unchanged unless the swap had committed, "
            "and a retry goes on where this attempt stopped"
        )
    if not isinstance(exc, Exception) or not is_database_error(exc):
        return exc
    err = server_error(exc)
    if err.sqlstate in TRANSIENT_SQLSTATES:
        waited = (
            f", lock_timeout is {plan.settings.lock_timeout}" if err.sqlstate == "55P03" else ""
        )
        return TransientLoadError(
            f"finalize of {t.qualified}: {err.message} (SQLSTATE {err.sqlstate}{waited}); "
            "the target is unchanged and a retry may succeed",
            sqlstate=err.sqlstate,
        )
    if is_data_sqlstate(err.sqlstate) and (err.constraint or "").startswith("pg_"):
        return TransientLoadError(  # a system catalog's unique index: a race on a name
            f"finalize of {t.qualified}: {err.message} (SQLSTATE {err.sqlstate}): another "
            "session created the same object at the same time; a retry may succeed",
            sqlstate=err.sqlstate,
        )
    if is_data_sqlstate(err.sqlstate):
        constraint = f" ({err.constraint})" if err.constraint else ""
        detail = f": {err.detail.rstrip('.')}" if err.detail else ""
        return ConstraintViolationError(
            naming.original_names(
                plan,
                f"the loaded rows break a constraint of {t.qualified}{constraint}: "
                f"{_truncate(err.message, 300)}{_truncate(detail, 300)}. The target is unchanged",
            )
        )
    return exc


# --- cleanup ---------------------------------------------------------------------------------


def cleanup(conn: Any, schema: str, load_id: str) -> list[str]:
    """Drop every table this load created (staging, ledger); never the target. Idempotent."""
    try:
        dropped = _drop_run_tables(conn, schema, load_id)
        conn.commit()
    except BaseException:
        _safe_rollback(conn)
        raise
    if dropped:
        log.info("Cleanup of load %s dropped %s", load_id, ", ".join(dropped))
    return dropped
