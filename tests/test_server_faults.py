"""Faults that PostgreSQL itself raises in the middle of a load, each followed by the rerun that
must complete: a statement_timeout or lock_timeout hit by a finalize statement, a backend
terminated (``pg_terminate_backend``) at a chosen statement, a function, trigger or constraint
that raises, and the server stopped with ``pg_ctl -m immediate`` during a COPY, an index build,
a VALIDATE and the swap.

Nothing is patched in Python to make a statement fail: the failure happens on the server, in a
real transaction that the server aborts, and reaches the load through the driver. To catch a
statement while it runs, the target carries a *trap*: ``trap(site, value)``, an IMMUTABLE
plpgsql function used in an expression index, a CHECK constraint and an insert trigger of the
target, that sleeps (``pg_sleep``) or raises when the test's ``fault`` table says so for that
site and value; the swap's DDL statements are caught the same way by an event trigger
(:class:`DdlTrap`) that sleeps or raises when the statement's text holds a given string.
The test then finds the statement in ``pg_stat_activity`` (waiting in ``PgSleep``) and
terminates its backend or crashes the server.

Every test checks the target before the load (it holds old rows), after the failure (exactly
the old rows, by count and order-independent checksum, and the same catalog definition) and
after the rerun (exactly the new rows, same definition), and that cleanup leaves nothing of the
run. The rerun is what the Airflow task group would do: a failed finalize is retried alone with
the same plan (and goes on from what the failed attempt built), a failed COPY task is retried,
and a terminal failure (bad data, a broken constraint) is followed by a new run of the whole
group with corrected data (same load id: clearing the DAG run).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Database
from helpers import (
    catalog_snapshot,
    error_chain,
    leftovers,
    plain_copy_checksum,
    sqlstate_of,
    write_csv,
)
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_pg_bulk import naming, steps
from airflow_pg_bulk import sql as bulk_sql
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.errors import (
    BadDataError,
    ConstraintViolationError,
    IncompleteLoadError,
    LoadRefusedError,
    TransientLoadError,
)
from airflow_pg_bulk.loading import copy as copy_step
from airflow_pg_bulk.plan import LoadPlan, LoadRequest, Settings

APPLICATION = "airflow-pg-bulk"
TERMINAL = (BadDataError, ConstraintViolationError, IncompleteLoadError, LoadRefusedError)
COLUMNS = ("id", "name", "amount", "gid", "day", "note")
NEW_ROWS = 3000
MARK = 2500  # the position in the new data of the row at which a trap fires
LONG = 60  # seconds a trap sleeps: far longer than any test waits for it


# --- the target and its traps ----------------------------------------------------------------


def build_target(db: Database) -> None:
    """``items`` with old rows, indexes (one on ``trap('index', id)``, named to be built last),
    PK, CHECK, a foreign key to ``groups``, a CHECK calling ``trap('check', id)``, an insert
    trigger calling ``trap('trigger', id)``, a view, and ``orders`` referencing it."""
    s = sql.Identifier(db.schema)
    for statement in [
        "CREATE TABLE {s}.fault (site text NOT NULL, at integer NOT NULL, action text NOT NULL,"
        " secs float8 NOT NULL DEFAULT 0)",
        "CREATE FUNCTION {s}.trap(p_site text, p_value integer) RETURNS integer"
        " LANGUAGE plpgsql IMMUTABLE AS $$"
        " DECLARE f record;"
        " BEGIN"
        "  FOR f IN SELECT action, secs FROM {s}.fault WHERE site = p_site AND at = p_value LOOP"
        "   IF f.action = 'raise' THEN"
        "    RAISE EXCEPTION 'trap % at %', p_site, p_value;"
        "   END IF;"
        "   PERFORM pg_catalog.pg_sleep(f.secs);"
        "  END LOOP;"
        "  RETURN p_value;"
        " END $$",
        "CREATE TABLE {s}.groups (gid integer PRIMARY KEY)",
        "INSERT INTO {s}.groups SELECT g FROM generate_series(0, 9) g",
        "CREATE TABLE {s}.items (id integer CONSTRAINT items_pkey PRIMARY KEY,"
        " name text NOT NULL,"
        " amount numeric(12,2) CONSTRAINT items_amount_ok CHECK (amount >= 0),"
        " gid integer CONSTRAINT items_gid_fk REFERENCES {s}.groups (gid),"
        " day date, note text,"
        " CONSTRAINT items_trap_ok CHECK ({s}.trap('check', id) = id))",
        "CREATE INDEX a_items_name ON {s}.items (name)",
        "CREATE UNIQUE INDEX m_items_day_id ON {s}.items (day, id)",
        "CREATE INDEX z_items_trap ON {s}.items ({s}.trap('index', id))",
        "CREATE FUNCTION {s}.on_insert() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN PERFORM {s}.trap('trigger', NEW.id); RETURN NEW; END$$",
        "CREATE TRIGGER items_on_insert BEFORE INSERT ON {s}.items FOR EACH ROW"
        " EXECUTE FUNCTION {s}.on_insert()",
        "CREATE VIEW {s}.items_view AS SELECT id, name FROM {s}.items WHERE amount > 10",
        "CREATE TABLE {s}.orders (oid integer PRIMARY KEY,"
        " item integer CONSTRAINT orders_item_fk REFERENCES {s}.items (id))",
        "INSERT INTO {s}.items SELECT g, 'old ' || g, g, g % 10, date '2020-01-01' + g, NULL"
        " FROM generate_series(1, 60) g",
        "INSERT INTO {s}.orders VALUES (1, 1), (2, 2)",
    ]:
        db.run(sql.SQL(statement).format(s=s))


def arm(db: Database, site: str, at: int, action: str = "sleep", secs: float = LONG) -> None:
    """Make ``trap(site, at)`` sleep ``secs`` or raise, from the next call on."""
    db.run(
        sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s)").format(db.ident("fault")),
        site,
        at,
        action,
        secs,
    )


def disarm(db: Database) -> None:
    db.run(sql.SQL("DELETE FROM {}").format(db.ident("fault")))


class DdlTrap:
    """An event trigger (ddl_command_end: the statement has run, its transaction is open) that
    sleeps or raises in every DDL statement whose text holds ``needle`` and the test's schema.
    Event triggers are database-wide, hence the schema in the condition; the trigger goes with
    the schema (its function lives there) and is dropped explicitly too. Needs a superuser."""

    def __init__(self, db: Database) -> None:
        if not db.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"):
            pytest.fail("event triggers need a superuser: run the tests as one", pytrace=False)
        self.db = db
        self.name = f"pgbulk_trap_{db.schema}"
        s = sql.Identifier(db.schema)
        db.run(
            sql.SQL(
                "CREATE TABLE {s}.ddl_fault (needle text NOT NULL, action text NOT NULL,"
                " secs float8 NOT NULL DEFAULT 0)"
            ).format(s=s)
        )
        db.run(
            sql.SQL(
                "CREATE FUNCTION {s}.ddl_trap() RETURNS event_trigger LANGUAGE plpgsql AS $$"
                " DECLARE f record; q text := pg_catalog.current_query();"
                " BEGIN"
                "  IF pg_catalog.strpos(q, {schema}) = 0 THEN RETURN; END IF;"
                "  FOR f IN SELECT action, secs FROM {s}.ddl_fault"
                "   WHERE pg_catalog.strpos(q, needle) > 0 LOOP"
                "   IF f.action = 'raise' THEN"
                "    RAISE EXCEPTION 'ddl trap in: %', q;"
                "   END IF;"
                "   PERFORM pg_catalog.pg_sleep(f.secs);"
                "  END LOOP;"
                " END $$"
            ).format(s=s, schema=sql.Literal(db.schema))
        )
        db.run(
            sql.SQL(
                "CREATE EVENT TRIGGER {} ON ddl_command_end EXECUTE FUNCTION {}.ddl_trap()"
            ).format(sql.Identifier(self.name), s)
        )

    def arm(self, needle: str, action: str = "sleep", secs: float = LONG) -> None:
        self.db.run(
            sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(self.db.ident("ddl_fault")),
            needle,
            action,
            secs,
        )

    def disarm(self) -> None:
        self.db.run(sql.SQL("DELETE FROM {}").format(self.db.ident("ddl_fault")))

    def drop(self) -> None:
        self.db.run(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(self.name)))


@pytest.fixture
def ddl_trap(db: Database) -> Iterator[DdlTrap]:
    trap = DdlTrap(db)
    try:
        yield trap
    finally:
        trap.drop()


# --- data, loads and checks ------------------------------------------------------------------


def first_new_id(mode: str) -> int:
    """Replace loads ids 1.. (so the orders' references still hold); append loads ids after
    the old rows' (so nothing collides)."""
    return 1 if mode == "replace" else 1001


def new_rows(mode: str, count: int = NEW_ROWS) -> list[tuple[Any, ...]]:
    start = first_new_id(mode)
    return [
        (
            i,
            f"new {i}",
            f"{i % 500}.25",
            i % 10,
            f"2024-02-{1 + i % 28:02d}",
            None if i % 3 else "n",
        )
        for i in range(start, start + count)
    ]


def mark_id(mode: str) -> int:
    """The id of the new row at which a trap fires."""
    return first_new_id(mode) + MARK


def write_source(tmp_path: Path, data: list[tuple[Any, ...]], name: str = "items.csv") -> Path:
    return write_csv(tmp_path / name, data)


def expected_checksum(db: Database, path: Path, mode: str, name: str = "expected") -> tuple:
    """What the target must hold after the load of ``path``: its rows (replace) or the target's
    current rows plus them (append)."""
    db.run(sql.SQL("DROP TABLE IF EXISTS {}").format(db.ident(name)))
    plain_copy_checksum(db, path, "FORMAT csv", name=name, like="items")
    if mode == "append":
        db.run(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(db.ident(name), db.ident("items")))
    return db.checksum(name)


def request(db: Database, path: Path, mode: str, **kwargs: Any) -> LoadRequest:
    return LoadRequest(
        table=db.table("items"),
        source=(str(path),),
        mode=mode,
        partitions=2,
        columns=COLUMNS,
        **kwargs,
    )


def prepare(db: Database, req: LoadRequest, load_id: str | None = None, **options: Any) -> LoadPlan:
    conn = open_connection(db.dsn)
    try:
        return steps.prepare(conn, req, load_id or naming.new_load_id(), **options)
    finally:
        conn.close()


def copy(db: Database, plan: LoadPlan, indexes: Iterable[int] | None = None) -> None:
    """The COPY tasks, each on a connection of its own."""
    for index in [p.index for p in plan.partitions] if indexes is None else indexes:
        conn = open_connection(db.dsn)
        try:
            steps.copy_partition(conn, plan, index)
        finally:
            conn.close()


def finalize(db: Database, plan: LoadPlan, dsn: str | None = None, driver: str = "psycopg"):
    """A finalize task on a new connection; returns its summary."""
    conn = open_connection(dsn or db.dsn, driver)
    try:
        return steps.finalize(conn, plan)
    finally:
        conn.close()


def cleanup(db: Database, plan: LoadPlan) -> None:
    conn = open_connection(db.dsn)
    try:
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()


class Background:
    """A step running in a thread, so the test can act on the server while it runs."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.error: BaseException | None = None
        self.result: Any = None

        def run() -> None:
            try:
                self.result = work()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 60) -> BaseException | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the step did not end after its fault"
        return self.error


def caught(
    db: Database,
    needle: str,
    *,
    waiting: str = "PgSleep",
    step: Background | None = None,
    timeout: float = 30,
    application: str = APPLICATION,
) -> int:
    """The pid of this test's load backend (the session named ``application``, or one of its
    extra sessions, ``application+<n>``: finalize's index builds) running a statement that
    holds ``needle`` while it waits on ``waiting`` (a wait event: ``PgSleep`` in a trap, or
    ``relation`` for a lock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = db.scalar(
            "SELECT pid FROM pg_stat_activity WHERE (application_name = %s"
            " OR starts_with(application_name, %s || '+')) AND state = 'active'"
            " AND strpos(query, %s) > 0 AND strpos(query, %s) > 0 AND wait_event = %s",
            application,
            application,
            db.schema,
            needle,
            waiting,
        )
        if pid:
            return pid
        if step is not None and not step.thread.is_alive():
            raise AssertionError(f"the step ended before reaching {needle!r}: {step.error!r}")
        time.sleep(0.02)
    raise AssertionError(f"no statement with {needle!r} waiting on {waiting} after {timeout} s")


def terminate(db: Database, pid: int) -> None:
    assert db.scalar("SELECT pg_terminate_backend(%s)", pid)
    deadline = time.monotonic() + 30
    while db.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid):
        assert time.monotonic() < deadline, f"backend {pid} still there"
        time.sleep(0.02)


def built_on_staging(db: Database, plan: LoadPlan) -> dict[str, bool | None]:
    """What finalize has built on staging so far, by the target's names: ``{"index <name>":
    valid, "constraint <name>": validated}``."""
    back = {naming.temp_index(plan.load_id, n): i.name for n, i in enumerate(plan.target.indexes)}
    back.update(
        {
            naming.temp_constraint(plan.load_id, n): c.name
            for n, c in enumerate(plan.target.constraints)
        }
    )
    return {
        f"{kind} {back.get(name, name)}": flag
        for kind, name, flag in db.run(bulk_sql.staging_state(db.schema, plan.staging_table))
        if kind not in ("persistence", "analyzed")
    }


class Target:
    """The target's data and definition before the load, and the checks against them."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.old = db.checksum("items")
        self.definition = catalog_snapshot(db, "items")
        self.orders = db.checksum("orders")
        assert self.old[0] == 60

    def untouched(self) -> None:
        """Exactly the old rows, the same definition, the referencing rows and key intact."""
        assert self.db.checksum("items") == self.old
        assert catalog_snapshot(self.db, "items") == self.definition
        assert self.db.checksum("orders") == self.orders

    def loaded(self, new: tuple[int, str]) -> None:
        """Exactly the new rows (each once), the same definition, nothing of the run left."""
        assert self.db.checksum("items") == new
        assert (
            self.db.scalar(
                sql.SQL("SELECT count(*) - count(DISTINCT id) FROM {}").format(
                    self.db.ident("items")
                )
            )
            == 0
        )
        assert catalog_snapshot(self.db, "items") == self.definition
        assert self.db.checksum("orders") == self.orders
        assert leftovers(self.db) == []


def loaded_and_traps_live(db: Database, target: Target, new: tuple[int, str]) -> None:
    """The new data is in, and the target's own index, check and trigger are live on it."""
    target.loaded(new)
    db.run(
        sql.SQL("INSERT INTO {} (id, name, amount, gid) VALUES (-1, 'probe', 1, 1)").format(
            db.ident("items")
        )
    )
    arm(db, "trigger", -2, "raise")
    with pytest.raises(psycopg.errors.RaiseException, match="trap trigger at -2"):
        db.run(sql.SQL("INSERT INTO {} (id, name) VALUES (-2, 'x')").format(db.ident("items")))
    with pytest.raises(psycopg.errors.CheckViolation, match="items_amount_ok"):
        db.run(
            sql.SQL("INSERT INTO {} (id, name, amount) VALUES (-3, 'x', -1)").format(
                db.ident("items")
            )
        )


# --- 1. statement_timeout and lock_timeout hit by finalize -----------------------------------


def test_statement_timeout_at_validate_then_retried_finalize_resumes(db, tmp_path):
    """The load's role runs with a statement_timeout (here through the connection's options,
    as ``ALTER ROLE ... SET statement_timeout`` would give it): VALIDATE of the trap's CHECK
    runs past it. The retry goes on from the built indexes and the NOT VALID constraint."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    arm(db, "check", mark_id("replace"), secs=3)
    timed = make_conninfo(db.dsn, options="-c statement_timeout=1000")

    started = time.monotonic()
    with pytest.raises(Exception) as info:
        finalize(db, plan, dsn=timed)
    assert time.monotonic() - started < 10

    assert sqlstate_of(info.value) == "57014", list(error_chain(info.value))
    assert not isinstance(info.value, TERMINAL), repr(info.value)
    target.untouched()
    built = built_on_staging(db, plan)
    assert built["constraint items_amount_ok"] is True
    assert built["constraint items_gid_fk"] is True
    assert built["constraint items_trap_ok"] is False  # added NOT VALID, validation cancelled
    assert "index z_items_trap" in built

    disarm(db)
    summary = finalize(db, plan, dsn=timed)  # the retried task, same role settings
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_lock_timeout_mid_finalize_then_retry_completes(db, tmp_path, mode):
    """replace: a report reads ``orders`` (which references the target) in a long transaction;
    the swap has already locked the target when it must drop ``orders``' foreign key, and
    waits for ``orders`` at most lock_timeout. append: a transaction holding SHARE on the
    target (as CREATE INDEX would) blocks the INSERT. Either way the transaction is aborted
    by the server, the target is untouched, and the retried finalize completes."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows(mode))
    new = expected_checksum(db, path, mode)
    plan = prepare(db, request(db, path, mode, settings=Settings(lock_timeout="300ms")))
    copy(db, plan)
    blocker = psycopg.connect(db.dsn)
    try:
        if mode == "replace":
            blocker.execute(sql.SQL("SELECT count(*) FROM {}").format(db.ident("orders")))
        else:
            blocker.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(db.ident("items")))
        started = time.monotonic()
        with pytest.raises(TransientLoadError, match="lock timeout") as info:
            finalize(db, plan)
        assert time.monotonic() - started < 10
        assert sqlstate_of(info.value) == "55P03"
        target.untouched()
    finally:
        blocker.close()

    summary = finalize(db, plan)
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


def test_role_lock_timeout_at_foreign_key_on_staging_then_retry_resumes(db, tmp_path):
    """Adding the target's foreign key to staging takes SHARE ROW EXCLUSIVE on ``groups``; a
    transaction writing to ``groups`` holds it off. The ADD CONSTRAINT fails on the server
    after the load's lock_timeout (finalize sets it for its whole session, over the role's,
    here the connection's options); the retry goes on from the indexes already built."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace", settings=Settings(lock_timeout="300ms")))
    copy(db, plan)
    role_dsn = make_conninfo(db.dsn, options="-c lock_timeout=300")
    writer = psycopg.connect(db.dsn)
    try:
        writer.execute(sql.SQL("UPDATE {} SET gid = gid WHERE gid = 0").format(db.ident("groups")))
        with pytest.raises(TransientLoadError, match="lock timeout") as info:
            finalize(db, plan, dsn=role_dsn)
        assert sqlstate_of(info.value) == "55P03"
        target.untouched()
        built = built_on_staging(db, plan)
        assert built["index z_items_trap"] is True
        assert built["constraint items_amount_ok"] is True
        assert "constraint items_gid_fk" not in built
    finally:
        writer.close()

    finalize(db, plan, dsn=role_dsn)
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


# --- 2. a finalize backend terminated at a chosen statement ----------------------------------


def run_finalize_until(
    db: Database, plan: LoadPlan, needle: str, *, waiting: str = "PgSleep", driver: str = "psycopg"
) -> tuple[Background, int]:
    step = Background(lambda: finalize(db, plan, driver=driver))
    return step, caught(db, needle, waiting=waiting, step=step)


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_terminated_during_index_build_then_retried_finalize_resumes(db, tmp_path, driver):
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    arm(db, "index", mark_id("replace"))

    step, pid = run_finalize_until(db, plan, "CREATE INDEX", driver=driver)
    terminate(db, pid)
    error = step.join()

    assert isinstance(error, TransientLoadError), repr(error)
    target.untouched()
    built = built_on_staging(db, plan)
    # the three indexes named before it were built and committed; the interrupted build left
    # nothing (a non-concurrent CREATE INDEX is transactional)
    assert {k: v for k, v in built.items() if k.startswith("index")} == {
        "index a_items_name": True,
        "index items_pkey": True,
        "index m_items_day_id": True,
    }

    disarm(db)
    summary = finalize(db, plan, driver=driver)
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


def test_terminated_during_validate_then_retried_finalize_resumes(db, tmp_path):
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    arm(db, "check", mark_id("replace"))

    step, pid = run_finalize_until(db, plan, "VALIDATE CONSTRAINT")
    terminate(db, pid)
    error = step.join()

    assert isinstance(error, TransientLoadError), repr(error)
    target.untouched()
    assert built_on_staging(db, plan)["constraint items_trap_ok"] is False

    disarm(db)
    finalize(db, plan)
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


def test_terminated_during_analyze_then_retried_finalize_goes_on_to_the_swap(
    db, tmp_path, ddl_trap
):
    """ANALYZE evaluates the expression index's ``trap('index', id)`` on its sample: armed
    once the last constraint is validated (the event trigger holds finalize there), so the
    index builds before it are not caught. Terminated in ANALYZE, the retry finds every
    index and constraint built and validated, and goes on to ANALYZE and the swap."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    last = naming.temp_constraint(plan.load_id, len(plan.target.constraints) - 1)
    ddl_trap.arm(f'VALIDATE CONSTRAINT "{last}"', secs=1)

    step, _ = run_finalize_until(db, plan, "VALIDATE CONSTRAINT")
    arm(db, "index", mark_id("replace"))
    pid = caught(db, "ANALYZE", step=step)
    terminate(db, pid)
    error = step.join()
    ddl_trap.disarm()

    assert isinstance(error, TransientLoadError), repr(error)
    target.untouched()
    built = built_on_staging(db, plan)
    assert len(built) == len(plan.target.indexes) + len(plan.target.constraints)
    assert all(built.values()), built
    disarm(db)
    finalize(db, plan)
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


def test_terminated_mid_swap_waiting_for_a_referencing_table_then_retry_swaps(db, tmp_path):
    """The swap locks the target and ``orders`` (whose foreign key it drops and re-adds)
    together, in short tries: while a report reads ``orders`` it keeps trying and holds no
    ACCESS EXCLUSIVE lock on the target meanwhile (readers of the target go on). Terminated
    there, the server rolls the swap back; the retry swaps."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    report = psycopg.connect(db.dsn)
    try:
        report.execute(sql.SQL("SELECT count(*) FROM {}").format(db.ident("orders")))
        step, pid = run_finalize_until(db, plan, "ACCESS EXCLUSIVE", waiting="relation")
        time.sleep(0.5)  # several tries
        assert step.thread.is_alive()
        # a reader of the target waits at most one try (it holds the target while it waits
        # for orders, then lets go): never until the report ends
        for _ in range(10):
            started = time.monotonic()
            assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("items")))
            assert time.monotonic() - started < 1.0
        terminate(db, pid)
        error = step.join()
    finally:
        report.close()

    assert isinstance(error, TransientLoadError), repr(error)
    target.untouched()
    finalize(db, plan)
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


@pytest.mark.parametrize("needle", ['" RENAME TO "items"', "CREATE OR REPLACE VIEW", "GRANT "])
def test_terminated_inside_the_swap_after_the_renames_then_retry_swaps(
    db, tmp_path, ddl_trap, needle
):
    """Caught by the event trigger right after staging took the target's name (and later):
    the old table is renamed away and the new one is in place, uncommitted; terminated there,
    the server rolls the whole swap back."""
    build_target(db)
    db.create_role(f"{db.schema}_reader")
    db.run(
        sql.SQL("GRANT SELECT ON {} TO {}").format(
            db.ident("items"), sql.Identifier(f"{db.schema}_reader")
        )
    )
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    ddl_trap.arm(needle)

    step, pid = run_finalize_until(db, plan, needle)
    terminate(db, pid)
    error = step.join()

    assert isinstance(error, TransientLoadError), repr(error)
    target.untouched()
    ddl_trap.disarm()
    finalize(db, plan)
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


@pytest.mark.parametrize("staging_logged", [False, True], ids=["unlogged", "logged"])
def test_append_terminated_during_insert_select_then_retry_appends_once(
    db, tmp_path, staging_logged
):
    """The INSERT ... SELECT into the target is caught in the target's own index expression,
    most of the rows already inserted in its transaction; terminated, none of them stays."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("append"))
    new = expected_checksum(db, path, "append")
    plan = prepare(db, request(db, path, "append", staging_logged=staging_logged))
    copy(db, plan)
    arm(db, "index", mark_id("append"))

    step, pid = run_finalize_until(db, plan, "INSERT INTO")
    terminate(db, pid)
    error = step.join()

    assert isinstance(error, TransientLoadError), repr(error)
    target.untouched()
    disarm(db)
    summary = finalize(db, plan)
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


def test_no_deadlock_in_the_swap_with_a_writer_of_a_referencing_table(db, tmp_path):
    """Another session updates ``orders`` and then reads the target while the swap waits for
    ``orders``. The swap used to hold the target then and the server aborted it as a deadlock
    (40P01); it now locks the target and ``orders`` together in short tries, so the reader goes
    on, and once the other session commits the swap goes through."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    other = psycopg.connect(db.dsn)
    try:
        other.execute(sql.SQL("UPDATE {} SET oid = oid").format(db.ident("orders")))
        step, _pid = run_finalize_until(db, plan, "ACCESS EXCLUSIVE", waiting="relation")
        reader = Background(
            lambda: other.execute(sql.SQL("SELECT count(*) FROM {}").format(db.ident("items")))
        )
        assert reader.join(timeout=5) is None  # not blocked by the waiting swap
        time.sleep(0.3)
        assert step.thread.is_alive()  # still trying
        target.untouched()
        other.commit()
        error = step.join()
    finally:
        other.close()

    assert error is None, repr(error)
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


def test_finalize_retried_while_the_stalled_first_attempt_still_runs(db, tmp_path):
    """Airflow retries finalize while the first attempt's worker is stalled (a zombie): its
    backend is still building an index on staging when the retry builds the same one. The
    retry must wait and go on, or fail in a way worth retrying (never as bad data); in the
    end the target holds the new data once."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    arm(db, "index", mark_id("replace"), secs=2)

    zombie, _pid = run_finalize_until(db, plan, "CREATE INDEX")
    retry_error = None
    try:
        finalize(db, plan)
    except Exception as exc:
        retry_error = exc
    zombie_error = zombie.join()
    disarm(db)

    assert not isinstance(retry_error, TERMINAL), (
        f"a retried finalize racing its stalled first attempt failed as terminal: {retry_error!r}"
    )
    if retry_error is not None and zombie_error is not None:
        finalize(db, plan)  # one more retry
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


# --- 3. functions, triggers and constraints that raise ---------------------------------------


@pytest.mark.parametrize(
    ("mode", "site"),
    [("replace", "index"), ("replace", "check"), ("append", "index"), ("append", "trigger")],
)
def test_function_raising_in_finalize_then_retry_completes_once_it_stops(db, tmp_path, mode, site):
    """The trap raises (SQLSTATE P0001) for one loaded value: in an index expression being
    built on staging, in a CHECK being validated, in the target's index or trigger during the
    append's INSERT. The target is untouched; a retry while it still raises fails the same
    way and changes nothing; once it no longer raises, the retry completes."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows(mode))
    new = expected_checksum(db, path, mode)
    plan = prepare(db, request(db, path, mode))
    copy(db, plan)
    arm(db, site, mark_id(mode), "raise")

    for _attempt in range(2):
        with pytest.raises(Exception) as info:
            finalize(db, plan)
        assert sqlstate_of(info.value) == "P0001", list(error_chain(info.value))
        assert f"trap {site} at {mark_id(mode)}" in str(info.value)
        target.untouched()

    disarm(db)
    summary = finalize(db, plan)
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


def break_row(mode: str, how: str) -> tuple[Any, ...]:
    i = mark_id(mode)
    if how == "check":
        return (i, f"new {i}", "-1.00", 1, "2024-02-01", None)
    return (i, f"new {i}", "1.00", 99, "2024-02-01", None)  # group 99 does not exist


@pytest.mark.parametrize(
    ("mode", "how", "constraint"),
    [
        ("replace", "check", "items_amount_ok"),
        ("replace", "fk", "items_gid_fk"),
        ("replace", "referenced", "orders_item_fk"),
        ("append", "check", "items_amount_ok"),
        ("append", "fk", "items_gid_fk"),
    ],
)
def test_constraint_failing_in_finalize_then_corrected_rerun_completes(
    db, tmp_path, mode, how, constraint
):
    """A loaded row breaks a CHECK or the target's foreign key (at VALIDATE on staging, or at
    the append's INSERT), or the new rows no longer hold a row ``orders`` references (when the
    swap re-adds ``orders``' key). Terminal: the target is untouched, cleanup leaves nothing;
    the whole load is run again (same load id, as when the DAG run is cleared) with corrected
    data and completes."""
    build_target(db)
    target = Target(db)
    data = new_rows(mode)
    if how == "referenced":
        bad = [row for row in data if row[0] != 2]
    else:
        bad = [break_row(mode, how) if row[0] == mark_id(mode) else row for row in data]
    bad_path = write_source(tmp_path, bad, "bad.csv")
    load_id = naming.new_load_id()
    plan = prepare(db, request(db, bad_path, mode), load_id)
    copy(db, plan)

    with pytest.raises(ConstraintViolationError, match=constraint) as info:
        finalize(db, plan)
    assert "_pgbulk_" not in str(info.value)  # staging's temporary names mapped back
    target.untouched()
    cleanup(db, plan)
    assert leftovers(db) == []

    good_path = write_source(tmp_path, data, "good.csv")
    new = expected_checksum(db, good_path, mode)
    plan = prepare(db, request(db, good_path, mode), load_id)
    copy(db, plan)
    summary = finalize(db, plan)
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


@pytest.mark.parametrize("needle", ['" RENAME TO "items"', "DROP TABLE", 'ADD CONSTRAINT "orders'])
def test_ddl_raising_inside_the_swap_then_retry_swaps(db, tmp_path, ddl_trap, needle):
    """An event trigger raises inside the swap's transaction, after the statement ran: the
    server aborts the transaction with the renames (or the drop of the old table, or most of
    the swap) done; the target is untouched and the retried finalize swaps."""
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    ddl_trap.arm(needle, "raise")

    with pytest.raises(Exception) as info:
        finalize(db, plan)
    assert sqlstate_of(info.value) == "P0001", list(error_chain(info.value))
    assert needle in str(info.value)
    target.untouched()

    ddl_trap.disarm()
    finalize(db, plan)
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


# --- 4. the server stopped (pg_ctl -m immediate) ---------------------------------------------


def reconnect(db: Database) -> None:
    """The test's own session died with the server: open a new one."""
    db.conn.close()
    db.conn = psycopg.connect(db.dsn, autocommit=True)


def wait_wal_flushed(db: Database, timeout: float = 10) -> None:
    """Wait until the WAL written so far is on disk (asynchronous commits included)."""
    written = db.scalar("SELECT pg_current_wal_insert_lsn()")
    deadline = time.monotonic() + timeout
    while not db.scalar("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", str(written)):
        assert time.monotonic() < deadline, "WAL not flushed"
        time.sleep(0.05)


def crash_during_finalize(own_server: Any, db: Database, plan: LoadPlan, needle: str) -> None:
    """Run finalize until it waits in ``needle``'s statement, crash the server there, and
    check finalize reported a retryable error."""
    step, _pid = run_finalize_until(db, plan, needle)
    own_server.crash_restart()
    error = step.join()
    reconnect(db)
    assert isinstance(error, TransientLoadError), repr(error)


@pytest.mark.parametrize("staging_logged", [True, False], ids=["logged", "unlogged"])
def test_crash_during_index_build_then_retried_finalize_resumes(
    own_server, own_db, tmp_path, staging_logged
):
    db = own_db
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace", staging_logged=staging_logged))
    copy(db, plan)
    arm(db, "index", mark_id("replace"))

    crash_during_finalize(own_server, db, plan, "CREATE INDEX")

    target.untouched()
    built = built_on_staging(db, plan)
    assert "index a_items_name" in built and "index z_items_trap" not in built
    disarm(db)
    summary = finalize(db, plan)
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


def test_crash_during_validate_then_retried_finalize_resumes(own_server, own_db, tmp_path):
    db = own_db
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("replace"))
    new = expected_checksum(db, path, "replace")
    plan = prepare(db, request(db, path, "replace"))
    copy(db, plan)
    arm(db, "check", mark_id("replace"))

    crash_during_finalize(own_server, db, plan, "VALIDATE CONSTRAINT")

    target.untouched()
    assert built_on_staging(db, plan)["constraint items_trap_ok"] is False
    disarm(db)
    finalize(db, plan)
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)


def test_crash_during_set_logged_then_finalize_refuses_and_rerun_completes(
    own_server, own_db, tmp_path
):
    """Unlogged staging (replace, staging_logged=False): the crash comes while SET LOGGED has
    rewritten staging but not committed; crash recovery empties the still unlogged staging.
    The retried finalize must notice (terminal, target untouched); the rerun completes."""
    db = own_db
    build_target(db)
    target = Target(db)
    trap = DdlTrap(db)
    try:
        path = write_source(tmp_path, new_rows("replace"))
        new = expected_checksum(db, path, "replace")
        req = request(db, path, "replace", staging_logged=False)
        plan = prepare(db, req)
        copy(db, plan)
        trap.arm("SET LOGGED")

        crash_during_finalize(own_server, db, plan, "SET LOGGED")

        target.untouched()
        trap.disarm()
        with pytest.raises(IncompleteLoadError, match="crash"):
            finalize(db, plan)
        target.untouched()
        cleanup(db, plan)
        plan = prepare(db, req, plan.load_id)
        copy(db, plan)
        finalize(db, plan)
        cleanup(db, plan)
        loaded_and_traps_live(db, target, new)
    finally:
        trap.drop()


@pytest.mark.parametrize("needle", ['" RENAME TO "items"', "DROP TABLE"])
def test_crash_during_the_swap_then_retried_finalize_swaps(own_server, own_db, tmp_path, needle):
    db = own_db
    build_target(db)
    target = Target(db)
    trap = DdlTrap(db)
    try:
        path = write_source(tmp_path, new_rows("replace"))
        new = expected_checksum(db, path, "replace")
        plan = prepare(db, request(db, path, "replace"))
        copy(db, plan)
        trap.arm(needle)

        crash_during_finalize(own_server, db, plan, needle)

        target.untouched()
        trap.disarm()
        finalize(db, plan)
        cleanup(db, plan)
        loaded_and_traps_live(db, target, new)
    finally:
        trap.drop()


@pytest.mark.parametrize("staging_logged", [True, False], ids=["logged", "unlogged"])
def test_crash_during_append_insert_then_rerun_appends_once(
    own_server, own_db, tmp_path, staging_logged
):
    """Logged staging survives the crash: the retried finalize appends. Unlogged staging (the
    append default) is emptied by crash recovery: the retried finalize refuses (terminal, the
    target untouched) and the whole load runs again with the same load id."""
    db = own_db
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows("append"))
    new = expected_checksum(db, path, "append")
    req = request(db, path, "append", staging_logged=staging_logged)
    plan = prepare(db, req)
    copy(db, plan)
    arm(db, "index", mark_id("append"))

    crash_during_finalize(own_server, db, plan, "INSERT INTO")

    target.untouched()
    disarm(db)
    if not staging_logged:
        with pytest.raises(IncompleteLoadError, match="crash"):
            finalize(db, plan)
        target.untouched()
        cleanup(db, plan)
        plan = prepare(db, req, plan.load_id)
        copy(db, plan)
    summary = finalize(db, plan)
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


class SlowChunks:
    """Chunks handed to COPY slowly (the client is slow; the fault is the server's crash)."""

    def __init__(self, chunks: Iterable[bytes], piece: int = 4096, pause: float = 0.05) -> None:
        self.chunks, self.piece, self.pause = chunks, piece, pause

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            for start in range(0, len(chunk), self.piece):
                yield chunk[start : start + self.piece]
                time.sleep(self.pause)


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_crash_during_copy_then_retried_copy_and_finalize_complete(
    own_server, own_db, tmp_path, monkeypatch, mode
):
    db = own_db
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows(mode))
    new = expected_checksum(db, path, mode)
    # logged staging: partition 0, committed before the crash, must survive it
    plan = prepare(db, request(db, path, mode, staging_logged=True))
    copy(db, plan, [0])
    wait_wal_flushed(db)
    real_copy_in = copy_step.copy_in
    monkeypatch.setattr(
        copy_step,
        "copy_in",
        lambda conn, statement, chunks: real_copy_in(conn, statement, SlowChunks(chunks)),
    )
    step = Background(lambda: copy(db, plan, [1]))
    deadline = time.monotonic() + 30
    while not db.scalar(
        "SELECT count(*) FROM pg_stat_progress_copy p JOIN pg_stat_activity a USING (pid)"
        " WHERE a.application_name = %s AND strpos(a.query, %s) > 0 AND p.bytes_processed > 0",
        APPLICATION,
        plan.staging_table,
    ):
        assert time.monotonic() < deadline and step.thread.is_alive(), repr(step.error)
        time.sleep(0.02)
    own_server.crash_restart()
    error = step.join()
    reconnect(db)
    monkeypatch.setattr(copy_step, "copy_in", real_copy_in)

    assert isinstance(error, TransientLoadError), repr(error)
    target.untouched()
    ledger = db.run(
        sql.SQL("SELECT partition FROM {} ORDER BY 1").format(db.ident(plan.ledger_table))
    )
    assert ledger == [(0,)]
    copy(db, plan)  # the retried COPY task (partition 0 is a no-op)
    summary = finalize(db, plan)
    cleanup(db, plan)
    assert summary.rows == NEW_ROWS
    loaded_and_traps_live(db, target, new)


# --- 5. the commit done, its acknowledgement lost --------------------------------------------


def set_standby_names(db: Database, value: str | None) -> None:
    if value is None:
        db.run("ALTER SYSTEM RESET synchronous_standby_names")
    else:
        db.run(
            sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(sql.Literal(value))
        )
    db.run("SELECT pg_reload_conf()")


@pytest.mark.parametrize("mode", ["replace", "append"])
def test_commit_acknowledgement_lost_then_retried_finalize_completes_once(
    own_server, own_db, tmp_path, mode
):
    """Finalize's last transaction (the swap, or the append's INSERT) commits, and the
    connection breaks before the client hears of it: the server waits after its commit
    record for a synchronous standby that never comes, and the backend is terminated there
    (the server then keeps the commit: "The transaction has already committed locally").
    Finalize reports a retryable error; the target holds exactly the new data; Airflow
    retries finalize, which must see that the load is done rather than fail or load again."""
    db = own_db
    build_target(db)
    target = Target(db)
    path = write_source(tmp_path, new_rows(mode))
    new = expected_checksum(db, path, mode)
    plan = prepare(db, request(db, path, mode))
    copy(db, plan)
    trap = DdlTrap(db)
    try:
        if mode == "replace":
            needle = 'ADD CONSTRAINT "orders_item_fk"'  # the swap's last statement
            trap.arm(needle, secs=1.5)
        else:
            needle = "INSERT INTO"
            arm(db, "index", mark_id(mode), secs=1.5)
        step, pid = run_finalize_until(db, plan, needle)
        try:
            set_standby_names(db, "pgbulk_no_such_standby")
            caught_in_commit = time.monotonic() + 30
            while not db.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event = 'SyncRep'",
                pid,
            ):
                assert time.monotonic() < caught_in_commit, "finalize never reached its commit"
                assert step.thread.is_alive(), repr(step.error)
                time.sleep(0.02)
            terminate(db, pid)
        finally:
            set_standby_names(db, None)
        error = step.join()
        trap.disarm()
        disarm(db)
    finally:
        trap.drop()

    assert isinstance(error, TransientLoadError), repr(error)
    assert db.checksum("items") == new  # the commit stood: all new rows, once
    try:
        finalize(db, plan)  # Airflow's retry of the finalize task
    except Exception as exc:
        pytest.fail(
            f"the retried finalize of a load whose {mode} had committed failed: {exc!r}; "
            f"the target now holds {db.checksum('items')[0]} rows "
            f"(the load's {NEW_ROWS} new rows, {target.old[0]} old rows)",
            pytrace=False,
        )
    cleanup(db, plan)
    loaded_and_traps_live(db, target, new)
