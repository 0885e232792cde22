"""The load's ledger: one row per COPY partition committed (its rows, bytes, seconds and
rejects), committed with the partition's rows; its comment holds the plan's digest, the target
and prepare's time. Also the load's pieces table (the pieces of each partition, for steps that
get the plan without them).

Every step checks the ledger was made for its plan (:func:`check_ledger_plan`); a COPY claims
its partition (:func:`claim`) and records it (:func:`record`); finalize adds the partitions up
(:func:`totals`). See docs/design.md, "copy".
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    execute_each,
    execute_each_outside_transaction,
    execute_then_commit,
    is_database_error,
    rollback_quietly,
    rows_of_each,
    scalar,
    server_error,
)
from airflow_pg_bulk.errors import (
    UNDEFINED_TABLE,
    BadDataError,
    IncompleteLoadError,
    LoadRefusedError,
)
from airflow_pg_bulk.plan import LoadPlan, Partition, Piece, planning
from airflow_pg_bulk.target import partitioned
from airflow_pg_bulk.target.history import LedgerTotals


def create(
    conn: DatabaseConnection,
    plan: LoadPlan,
    digest: str,
    *,
    prepared_at: float | None = None,
    commit: bool = False,
) -> None:
    """The ledger table, its comment the plan's digest, the target and prepare's time (the
    server's clock): in prepare's transaction, in one round trip. ``prepared_at``: the
    server's ``now()`` (the transaction's start: ``sql.now_epoch``), when the caller read it
    already in this transaction. ``commit``: the transaction's last statements, sent with
    its COMMIT (:func:`~airflow_pg_bulk.db.driver.execute_then_commit`)."""
    schema = plan.target.schema
    if prepared_at is None:
        prepared_at = scalar(conn, sql.now_epoch())
    comment = ledger_comment(digest, plan.target.qualified, prepared_at)
    ledger = sql.qualified(schema, plan.ledger_table)
    statement = sql.in_one_round_trip(
        sql.create_ledger(schema, plan.ledger_table), sql.comment_on("TABLE", ledger, comment)
    )
    if commit:
        execute_then_commit(conn, statement)
    else:
        execute(conn, statement)


def ledger_comment(digest: str, target: str, prepared_at: float) -> str:
    """The ledger's comment: the plan's digest on its first line (what a step checks its plan
    against), then what the next loads read to tell a live load from an abandoned one: the
    target and prepare's time (the server's clock, epoch seconds)."""
    return digest + "\n" + json.dumps({"target": target, "prepared_at": prepared_at})


def comment_record(comment: str | None) -> dict[str, Any] | None:
    """What :func:`ledger_comment` wrote after the digest; None for a ledger without it."""
    _digest, _, record = (comment or "").partition("\n")
    try:
        found = json.loads(record)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def resume_checks(plan: LoadPlan) -> list[sql.Composable]:
    """The queries :func:`can_resume` starts with (each one row, one value): the digest the
    ledger was made for, and whether staging exists."""
    schema = plan.target.schema
    return [
        sql.ledger_digest(schema, plan.ledger_table),
        sql.relation_exists(schema, plan.staging_table),
    ]


def can_resume(
    conn: DatabaseConnection,
    plan: LoadPlan,
    digest: str,
    *,
    found: tuple[str | None, bool] | None = None,
) -> bool:
    """An earlier attempt made staging and a ledger for this very plan, not finalized: keep
    them, and the partitions committed in them. ``found``: the answers of
    :func:`resume_checks`, when the caller read them already in its transaction."""
    schema = plan.target.schema
    ledger_query, staging_query = resume_checks(plan)
    found_digest = found[0] if found else scalar(conn, ledger_query)
    if found_digest != digest:
        return False
    if not (found[1] if found else scalar(conn, staging_query)):
        return False
    ledger = execute(conn, sql.ledger_rows(schema, plan.ledger_table))
    return all(row[0] != sql.FINALIZED for row in ledger)


def pieces_checks(plan: LoadPlan) -> list[sql.Composable]:
    """The queries :func:`store_pieces` starts with (each one row, one value): the digest the
    pieces table was made for, and whether it exists."""
    schema = plan.target.schema
    name = naming.pieces_table(plan.load_id)
    return [sql.ledger_digest(schema, name), sql.relation_exists(schema, name)]


def store_pieces(
    conn: DatabaseConnection,
    plan: LoadPlan,
    digest: str,
    *,
    found: tuple[str | None, bool] | None = None,
    commit: bool = False,
) -> None:
    """Write each partition's pieces into the load's pieces table, its comment the plan's
    digest (as the ledger's); kept as it is when prepare runs again for the same plan. Made
    in one round trip. ``found``: the answers of :func:`pieces_checks`, when the caller knows
    them already in its transaction. ``commit``: the transaction's last statements, sent
    with its COMMIT when there are any."""
    schema = plan.target.schema
    name = naming.pieces_table(plan.load_id)
    digest_query, exists_query = pieces_checks(plan)
    if (found[0] if found else scalar(conn, digest_query)) == digest:
        return
    making = []
    if found[1] if found else scalar(conn, exists_query):  # (no DDL when there is none)
        making.append(sql.drop_table(schema, name))
    making += [
        sql.create_pieces(schema, name),
        sql.comment_on("TABLE", sql.qualified(schema, name), digest),
    ]
    rows = [  # ensure_ascii (json's default): any database encoding stores the text as is
        (p.index, json.dumps([x.to_dict() for x in p.pieces], ensure_ascii=True))
        for p in plan.partitions
    ]
    if rows:
        making.append(sql.insert_pieces(schema, name, rows))
    if commit:
        execute_then_commit(conn, sql.in_one_round_trip(*making))
    else:
        execute(conn, sql.in_one_round_trip(*making))


def read_pieces(
    conn: DatabaseConnection, plan: LoadPlan, partitions: Sequence[int]
) -> list[Partition]:
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
            f"load {plan.load_id} into {t.qualified}: no pieces stored for COPY streams {missing}"
        )
    sizes = {p.index: p.bytes for p in plan.partitions}
    return [
        Partition(index, tuple(Piece.from_dict(p) for p in json.loads(stored[index])), sizes[index])
        for index in partitions
    ]


def check_and_claim(
    conn: DatabaseConnection,
    plan: LoadPlan,
    index: int,
    *,
    after: Sequence[sql.Composable] = (),
) -> bool:
    """:func:`check_ledger_plan`, then the partition's ledger row inserted in the COPY's
    transaction (a concurrent duplicate attempt waits on it), in one round trip on psycopg 3
    (a COPY task's first statements); False when the partition was committed before. A
    ledger made for another plan raises after the insert, in the transaction, which the
    caller rolls back; no ledger raises as :func:`check_ledger_plan` tells it.

    :param after: statements that the read follows (a transaction's settings)."""
    t = plan.target
    with _told_when_missing(conn, plan):
        *_, ((found,),), claimed = execute_each(
            conn,
            [
                *after,
                sql.ledger_digest(t.schema, plan.ledger_table),
                sql.claim_partition(t.schema, plan.ledger_table, index),
            ],
        )
    _refuse_another_plan(plan, found)
    return bool(claimed)


@contextmanager
def _told_when_missing(conn: DatabaseConnection, plan: LoadPlan) -> Iterator[None]:
    """Around statements that read or write the ledger: when it is missing (they fail with
    UNDEFINED_TABLE), the transaction rolled back and that told as
    :func:`check_ledger_plan` tells it."""
    try:
        yield
    except Exception as exc:
        if not (is_database_error(exc) and server_error(exc).sqlstate == UNDEFINED_TABLE):
            raise
        rollback_quietly(conn)
        check_ledger_plan(conn, plan)
        raise


def committed(conn: DatabaseConnection, plan: LoadPlan, index: int) -> tuple[int, int, float, int]:
    """A committed partition's rows, bytes, seconds and rejects."""
    rows, nbytes, seconds, rejected = execute(
        conn, sql.partition_figures(plan.target.schema, plan.ledger_table, index)
    )[0]
    return rows, nbytes, seconds, rejected


def record(
    conn: DatabaseConnection,
    plan: LoadPlan,
    index: int,
    rows: int,
    nbytes: int,
    seconds: float,
    rejected: int,
    *,
    commit: bool = False,
) -> None:
    """Note the partition's figures in its ledger row, in the transaction of its rows;
    ``commit``: and commit that transaction, in the same round trip."""
    (execute_then_commit if commit else execute)(
        conn,
        sql.record_partition(
            plan.target.schema, plan.ledger_table, index, rows, nbytes, seconds, rejected
        ),
    )


def check_ledger_plan(
    conn: DatabaseConnection, plan: LoadPlan, *, after: Sequence[sql.Composable] = ()
) -> None:
    """Refuse to work with a ledger made for another plan, or with none.

    Prepare run again (a retry, a cleared task) for changed files makes a new ledger for its
    new plan; a COPY or finalize still holding the old plan must not mix the two.

    :param after: statements that the read follows, in the same round trip (a transaction's
        settings; their rows are not read)."""
    t = plan.target
    *_, ((found,),) = execute_each(conn, [*after, sql.ledger_digest(t.schema, plan.ledger_table)])
    _refuse_another_plan(plan, found)


def _refuse_another_plan(plan: LoadPlan, found: str | None) -> None:
    """:func:`check_ledger_plan`'s verdict on the digest ``found`` in the ledger's comment."""
    t = plan.target
    if found == (plan.digest or planning.plan_digest(plan)):
        return
    if found is None:
        raise IncompleteLoadError(
            f"load {plan.load_id} into {t.qualified} has no ledger ({plan.ledger_table}): "
            "its cleanup ran, or its prepare did not. Run the load again from prepare"
        )
    raise LoadRefusedError(
        f"the ledger of load {plan.load_id} was made for another plan: prepare ran again "
        "after this task read its plan (did the source files change?). Nothing was loaded "
        "by this task; clear it (or the whole load) to run with the new plan"
    )


def missing_partitions(conn: DatabaseConnection, plan: LoadPlan) -> list[int]:
    """The partitions not committed in the ledger (none once the load is finalized)."""
    check_ledger_plan(conn, plan)
    done = {row[0] for row in execute(conn, sql.ledger_rows(plan.target.schema, plan.ledger_table))}
    conn.commit()
    if sql.FINALIZED in done:
        return []
    return sorted(p.index for p in plan.partitions if p.index not in done)


def totals(conn: DatabaseConnection, plan: LoadPlan) -> LedgerTotals:
    """Rows, bytes and rejects of the committed partitions, and whether the load was made
    visible before (a retry after a commit whose acknowledgement was lost). Leaves its
    transaction open (its reads take ACCESS SHARE on the ledger and staging only): finalize's
    next step goes on in it, and a COMMIT and a BEGIN are two round trips saved. The ledger's
    digest (:func:`check_ledger_plan`), its rows and whether staging exists are read in one
    round trip."""
    t = plan.target
    with _told_when_missing(conn, plan):
        ((found,),), ledger, ((staged,),) = rows_of_each(
            conn,
            [
                sql.ledger_digest(t.schema, plan.ledger_table),
                sql.ledger_rows(t.schema, plan.ledger_table),
                sql.relation_exists(t.schema, plan.staging_table),
            ],
        )
    _refuse_another_plan(plan, found)
    for row in ledger:
        if row[0] == sql.FINALIZED:
            conn.commit()
            return LedgerTotals(row[1], row[2], row[4], finalized=True)
    done = {row[0] for row in ledger}
    missing = sorted(p.index for p in plan.partitions if p.index not in done)
    if missing:
        raise IncompleteLoadError(
            f"load {plan.load_id} into {t.qualified}: COPY streams {missing} are not in the ledger "
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
    # (a partitioned staging: finalize_partitioned counts each staging partition by its name,
    # also one a failed attempt detached to build on it, which the parent no longer holds)
    if not plan.staging_logged and rows and not partitioned.partitioned_staging(plan):
        size = scalar(conn, sql.relation_size(t.schema, plan.staging_table))
        if not size:
            raise IncompleteLoadError(
                f"load {plan.load_id}: the unlogged staging table {plan.staging_table} is empty "
                f"although the ledger records {rows} rows: a server crash emptied it. "
                "Nothing reached the target; run the load again"
            )
    return LedgerTotals(rows, nbytes, rejected, staging_exists=bool(staged))


def copy_span(
    conn: DatabaseConnection, plan: LoadPlan, *, after: Sequence[sql.Composable] = ()
) -> tuple[float, float] | None:
    """The first COPY's start and the last COPY's end, from the ledger, on this process's
    clock (``time.time()``): the server's clock is read with them and the offset taken off.
    ``None`` when no partition is in the ledger. Outside a transaction.

    :param after: statements that the read follows, in the same round trip on psycopg 3
        (the next step's session setup); their rows are not read."""
    started = time.time()
    *_, rows = execute_each_outside_transaction(
        conn, [*after, sql.copy_span(plan.target.schema, plan.ledger_table)]
    )
    ended = time.time()
    first, last, server_now = rows[0]
    if first is None or last is None:
        return None
    offset = float(server_now) - (started + ended) / 2
    return float(first) - offset, float(last) - offset
