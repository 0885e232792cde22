"""Replace carries over what it promises (owner, sequences, exclusion and deferrable
constraints, persistence), and refuses clearly, before anything changes, what it cannot."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import catalog_snapshot, leftovers
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_pg_bulk import runner, steps
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.errors import ConstraintViolationError, LoadRefusedError
from airflow_pg_bulk.plan import LoadRequest


def _run(db: Any, *statements: str, **names: Any) -> None:
    """Run statements with ``{s}`` (the test schema) and other identifiers filled in."""
    idents = {k: sql.Identifier(v) for k, v in names.items()}
    for statement in statements:
        db.run(sql.SQL(statement).format(s=sql.Identifier(db.schema), **idents))


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _state(db: Any, table: str) -> tuple[dict[str, Any], tuple[int, str | None]]:
    return catalog_snapshot(db, table), db.checksum(table)


# --- the definition changed between prepare and finalize ---------------------------------------

CHANGES = {
    "column-added": "ALTER TABLE {s}.items ADD COLUMN extra text",
    "index-added": "CREATE INDEX items_note ON {s}.items (note)",
    "check-added": "ALTER TABLE {s}.items ADD CONSTRAINT items_id_pos CHECK (id > -100)",
    "comment-changed": "COMMENT ON TABLE {s}.items IS 'changed'",
    "trigger-disabled": "ALTER TABLE {s}.items DISABLE TRIGGER items_touch",
    "grant-added": "GRANT SELECT ON {s}.items TO PUBLIC",
    "referencing-key-added": "CREATE TABLE {s}.orders (item integer REFERENCES {s}.items)",
    "materialized-view-added": "CREATE MATERIALIZED VIEW {s}.items_mv AS SELECT id FROM {s}.items",
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_definition_changed_after_prepare_is_refused_and_target_unchanged(
    db, pg_dsn, driver, tmp_path, change
):
    _run(
        db,
        "CREATE TABLE {s}.items (id integer PRIMARY KEY, name text NOT NULL, note text)",
        "CREATE FUNCTION {s}.touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$",
        "CREATE TRIGGER items_touch BEFORE INSERT ON {s}.items FOR EACH ROW"
        " EXECUTE FUNCTION {s}.touch()",
        "INSERT INTO {s}.items SELECT -g, 'old ' || g, NULL FROM generate_series(1, 20) g",
    )
    path = _write(tmp_path, "items.csv", [f"{i},new {i},n" for i in range(1, 501)])
    columns = ("id", "name", "note")
    request = LoadRequest(
        mode="replace", table=db.table("items"), source=(str(path),), partitions=3, columns=columns
    )
    conn = open_connection(pg_dsn, driver)
    try:
        plan = steps.prepare(conn, request, "cccccccccccc")
        for part in plan.partitions:
            steps.copy_partition(conn, plan, part.index)
        _run(db, CHANGES[change])
        before = _state(db, "items")

        with pytest.raises(LoadRefusedError) as info:
            steps.finalize(conn, plan)

        message = str(info.value)
        assert f"the definition of {db.schema}.items changed between prepare and finalize" in (
            message
        )
        assert "nothing was swapped" in message
        assert _state(db, "items") == before
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()
    assert leftovers(db) == []
    # run again, as the message says: now it goes through
    if change == "materialized-view-added":  # that one a replace refuses from the start
        _run(db, "DROP MATERIALIZED VIEW {s}.items_mv")
    runner.load(
        pg_dsn,
        db.table("items"),
        str(path),
        mode="replace",
        partitions=3,
        driver=driver,
        columns=columns,
    )
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 500


# --- the owner -----------------------------------------------------------------------------------


@pytest.fixture
def login_role(db: Any, pg_dsn: str) -> Iterator[dict[str, str]]:
    """A LOGIN role without superuser and without privileges; dropped after the test."""
    name = f"pgbulk_loader_{uuid.uuid4().hex[:8]}"
    password = f"pw-{uuid.uuid4().hex}"
    db.run(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE").format(
            sql.Identifier(name), sql.Literal(password)
        )
    )
    try:
        yield {"name": name, "dsn": make_conninfo(pg_dsn, user=name, password=password)}
    finally:
        db.run(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
        db.run(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _owned_items(db: Any, owner: str, serial: bool) -> None:
    _run(
        db,
        "CREATE TABLE {s}.items (id integer PRIMARY KEY, name text NOT NULL"
        + (", n serial)" if serial else ")"),
        "INSERT INTO {s}.items (id, name) SELECT -g, 'old' FROM generate_series(1, 10) g",
        "GRANT USAGE, CREATE ON SCHEMA {s} TO {o}",
        "ALTER TABLE {s}.items OWNER TO {o}",
        o=owner,
    )


def _owner(db: Any, table: str) -> str:
    return db.scalar(
        "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = %s::regclass",
        f"{db.schema}.{table}",
    )


@pytest.mark.parametrize("serial", [False, True], ids=["plain", "with-serial-column"])
@pytest.mark.parametrize("loader", ["superuser", "member-of-owner"])
def test_replace_hands_the_new_table_to_the_targets_owner(
    db, pg_dsn, login_role, driver, tmp_path, loader, serial
):
    """The README: a replace restores the owner; a loader that is not the owner needs
    membership in the owner role. A serial column's sequence (owned by the same role) must
    follow the new table."""
    owner = f"{db.schema}_owner"
    db.create_role(owner)
    _owned_items(db, owner, serial)
    dsn = pg_dsn
    if loader == "member-of-owner":
        _run(
            db,
            "GRANT {o} TO {r}",
            "GRANT USAGE, CREATE ON SCHEMA {s} TO {r}",
            o=owner,
            r=login_role["name"],
        )
        dsn = login_role["dsn"]
    before = catalog_snapshot(db, "items")
    path = _write(tmp_path, "items.csv", [f"{i},new {i}" for i in range(1, 301)])

    data_before = db.checksum("items")
    try:
        runner.load(
            dsn,
            db.table("items"),
            str(path),
            mode="replace",
            columns=["id", "name"],
            partitions=2,
            driver=driver,
        )
    except Exception:
        # a failed replace at least leaves the target as it was
        assert (catalog_snapshot(db, "items"), db.checksum("items")) == (before, data_before)
        assert leftovers(db) == []
        raise

    assert _owner(db, "items") == owner
    assert catalog_snapshot(db, "items") == before
    if serial:
        sequence = db.scalar("SELECT pg_get_serial_sequence(%s, 'n')", db.table("items"))
        assert _owner(db, sequence.split(".", 1)[1]) == owner
        assert db.scalar(f"SELECT max(n) FROM {db.schema}.items") == 310
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items WHERE name LIKE 'new %%'") == 300
    # the owner can do what an owner does with its table
    _run(db, "SET ROLE {o}", "ALTER TABLE {s}.items ADD COLUMN extra text", "RESET ROLE", o=owner)
    assert leftovers(db) == []


# --- identity and serial sequences ---------------------------------------------------------------


def test_identity_position_is_carried_over_with_ids_from_the_file(db, connect, tmp_path):
    """The file supplies the ids (identity BY DEFAULT): the sequence keeps its position (the
    README: "serial/identity sequence positions"), its name and options."""
    _run(
        db,
        "CREATE TABLE {s}.items (id bigint GENERATED BY DEFAULT AS IDENTITY"
        " (INCREMENT BY 2 START WITH 1) PRIMARY KEY, name text)",
        "INSERT INTO {s}.items (name) SELECT 'old' FROM generate_series(1, 50)",  # ids 1..99
    )
    sequence = db.scalar("SELECT pg_get_serial_sequence(%s, 'id')", db.table("items"))
    seq_before = db.run(f"SELECT last_value, is_called FROM {sequence}")
    options_before = db.run(
        "SELECT seqincrement, seqstart FROM pg_sequence WHERE seqrelid = %s::regclass", sequence
    )
    before = catalog_snapshot(db, "items")
    path = _write(tmp_path, "items.csv", [f"{i},new {i}" for i in range(1001, 1401)])

    runner.load(connect, db.table("items"), str(path), mode="replace", partitions=2)

    assert catalog_snapshot(db, "items") == before
    assert db.scalar("SELECT pg_get_serial_sequence(%s, 'id')", db.table("items")) == sequence
    assert db.run(f"SELECT last_value, is_called FROM {sequence}") == seq_before == [(99, True)]
    assert (
        db.run(
            "SELECT seqincrement, seqstart FROM pg_sequence WHERE seqrelid = %s::regclass",
            sequence,
        )
        == options_before
    )
    new_id = db.scalar(f"INSERT INTO {db.schema}.items (name) VALUES ('after') RETURNING id")
    assert new_id == 101
    assert leftovers(db) == []


GENERATED_KEYS = {
    "serial": "serial PRIMARY KEY",
    "identity-by-default": "bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    "identity-always": "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
}


@pytest.mark.parametrize("kind", list(GENERATED_KEYS))
def test_generated_keys_loaded_then_an_insert_does_not_collide(db, connect, tmp_path, kind):
    """The file leaves the key out: the load generates the ids, and the next INSERT after the
    load gets an id none of the loaded or old rows has."""
    _run(
        db,
        "CREATE TABLE {s}.items (id " + GENERATED_KEYS[kind] + ", name text)",
        "INSERT INTO {s}.items (name) SELECT 'old' FROM generate_series(1, 50)",
    )
    path = _write(tmp_path, "items.csv", [f"new {i}" for i in range(1, 401)])

    runner.load(
        connect, db.table("items"), str(path), mode="replace", columns=["name"], partitions=2
    )

    ids = db.run(f"SELECT min(id), max(id), count(DISTINCT id) FROM {db.schema}.items")
    assert ids[0][2] == 400
    new_id = db.scalar(f"INSERT INTO {db.schema}.items (name) VALUES ('after') RETURNING id")
    assert new_id > ids[0][1]
    assert leftovers(db) == []


# --- exclusion and deferrable constraints ------------------------------------------------------


def test_exclusion_constraint_is_carried_over_and_enforced(db, connect, tmp_path):
    _run(
        db,
        "CREATE TABLE {s}.booking (id integer PRIMARY KEY, during int4range NOT NULL,"
        " CONSTRAINT booking_no_overlap EXCLUDE USING gist (during WITH &&))",
        "INSERT INTO {s}.booking VALUES (-1, '[-100,-90)'), (-2, '[-90,-80)')",
    )
    before = catalog_snapshot(db, "booking")
    good = _write(tmp_path, "good.csv", [f'{i},"[{10 * i},{10 * i + 10})"' for i in range(200)])

    runner.load(connect, db.table("booking"), str(good), mode="replace", partitions=3)

    assert catalog_snapshot(db, "booking") == before
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.booking") == 200
    with pytest.raises(psycopg.errors.ExclusionViolation, match="booking_no_overlap"):
        db.run(f"INSERT INTO {db.schema}.booking VALUES (9999, '[15,16)')")
    # overlapping rows in the file: finalize names the constraint, the target is unchanged
    data_before = db.checksum("booking")
    bad = _write(tmp_path, "bad.csv", ['1,"[0,10)"', '2,"[5,15)"'])
    with pytest.raises(ConstraintViolationError, match="booking_no_overlap"):
        runner.load(connect, db.table("booking"), str(bad), mode="replace")
    assert db.checksum("booking") == data_before
    assert catalog_snapshot(db, "booking") == before
    assert leftovers(db) == []


def test_deferrable_constraints_are_carried_over_and_enforced_at_commit(db, connect, tmp_path):
    _run(
        db,
        "CREATE TABLE {s}.parent (id integer PRIMARY KEY)",
        "INSERT INTO {s}.parent SELECT g FROM generate_series(1, 10) g",
        "CREATE TABLE {s}.child (id integer, pid integer, code integer,"
        " CONSTRAINT child_pk PRIMARY KEY (id) DEFERRABLE,"
        " CONSTRAINT child_code_key UNIQUE (code) DEFERRABLE INITIALLY DEFERRED,"
        " CONSTRAINT child_parent_fk FOREIGN KEY (pid) REFERENCES {s}.parent (id)"
        "   DEFERRABLE INITIALLY DEFERRED)",
        "INSERT INTO {s}.child VALUES (-1, 1, -1)",
    )
    timing = (
        "SELECT conname, condeferrable, condeferred FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'f') ORDER BY 1"
    )
    before = catalog_snapshot(db, "child")
    assert db.run(timing, db.table("child")) == [
        ("child_code_key", True, True),
        ("child_parent_fk", True, True),
        ("child_pk", True, False),
    ]
    path = _write(tmp_path, "child.csv", [f"{i},{1 + i % 10},{i}" for i in range(1, 501)])

    runner.load(connect, db.table("child"), str(path), mode="replace", partitions=3)

    assert catalog_snapshot(db, "child") == before
    assert db.run(timing, db.table("child")) == [
        ("child_code_key", True, True),
        ("child_parent_fk", True, True),
        ("child_pk", True, False),
    ]
    t = f"{db.schema}.child"
    # deferred: a transient duplicate / orphan inside a transaction is fine if fixed by commit
    with psycopg.connect(db.dsn) as conn:
        conn.execute(f"INSERT INTO {t} VALUES (1001, 11, 1)")  # code 1 taken, parent 11 missing
        conn.execute(f"UPDATE {t} SET code = 1001 WHERE id = 1001")
        conn.execute(f"INSERT INTO {db.schema}.parent VALUES (11)")
    # ...and enforced at commit
    for statement, constraint in [
        (f"INSERT INTO {t} VALUES (1002, 1, 2)", "child_code_key"),
        (f"INSERT INTO {t} VALUES (1003, 999, 1003)", "child_parent_fk"),
    ]:
        conn = psycopg.connect(db.dsn)
        try:
            conn.execute(statement)  # no error yet: deferred
            with pytest.raises(psycopg.errors.IntegrityError, match=constraint):
                conn.commit()
        finally:
            conn.close()
    # the primary key is deferrable but not deferred: checked at once, unless deferred
    with pytest.raises(psycopg.errors.UniqueViolation, match="child_pk"):
        db.run(f"INSERT INTO {t} VALUES (1, 1, 5000)")
    with psycopg.connect(db.dsn) as conn:
        conn.execute("SET CONSTRAINTS ALL DEFERRED")
        conn.execute(f"INSERT INTO {t} VALUES (1, 1, 5001)")
        conn.execute(f"UPDATE {t} SET id = 5001 WHERE code = 5001")
    assert db.scalar(f"SELECT count(*) FROM {t}") == 502
    # replacing the referenced table keeps the child's deferrable foreign key as it was
    parent_path = _write(tmp_path, "parent.csv", [str(i) for i in range(1, 21)])
    runner.load(connect, db.table("parent"), str(parent_path), mode="replace")
    assert catalog_snapshot(db, "child")["constraints"] == before["constraints"]
    assert db.run(timing, db.table("child"))[1] == ("child_parent_fk", True, True)
    conn = psycopg.connect(db.dsn)
    try:
        conn.execute(f"INSERT INTO {t} VALUES (1004, 999, 1004)")
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="child_parent_fk"):
            conn.commit()
    finally:
        conn.close()
    assert leftovers(db) == []


# --- an UNLOGGED target ------------------------------------------------------------------------


@pytest.mark.parametrize("staging_logged", [None, False], ids=["default", "unlogged-staging"])
def test_unlogged_target_stays_unlogged(db, connect, tmp_path, staging_logged):
    """An unlogged target is part of its definition (helpers.catalog_snapshot compares
    relpersistence): after a replace it is still unlogged, whatever staging was."""
    _run(
        db,
        "CREATE UNLOGGED TABLE {s}.items (id integer PRIMARY KEY, name text)",
        "CREATE INDEX items_name ON {s}.items (name)",
        "INSERT INTO {s}.items VALUES (-1, 'old')",
    )
    before = catalog_snapshot(db, "items")
    path = _write(tmp_path, "items.csv", [f"{i},new {i}" for i in range(1, 301)])

    runner.load(
        connect,
        db.table("items"),
        str(path),
        mode="replace",
        partitions=2,
        staging_logged=staging_logged,
    )

    assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 300
    persistence = db.run(
        "SELECT c.relname, c.relpersistence FROM pg_class c JOIN pg_index i"
        " ON c.oid IN (i.indrelid, i.indexrelid) WHERE i.indrelid = %s::regclass ORDER BY 1",
        db.table("items"),
    )
    assert persistence == [("items", "u"), ("items", "u"), ("items_name", "u"), ("items_pkey", "u")]
    assert catalog_snapshot(db, "items") == before
    assert leftovers(db) == []


# --- refused before anything changes ---------------------------------------------------------


def _items_with_rows(db: Any) -> None:
    _run(
        db,
        "CREATE TABLE {s}.items (id integer PRIMARY KEY, name text)",
        "INSERT INTO {s}.items SELECT -g, 'old ' || g FROM generate_series(1, 20) g",
    )


def _publication(db: Any) -> str:
    """The test's publication, named after its schema: publications are the database's, and
    tests of other schemas (another driver's run of the same test under pytest-xdist) must
    not meet it."""
    return f"pub_{db.schema}"


# name → (setup statements, text the refusal must hold, table to load)
UNSUPPORTED = {
    "partition": (
        [
            "CREATE TABLE {s}.whole (id integer, name text) PARTITION BY RANGE (id)",
            "CREATE TABLE {s}.items PARTITION OF {s}.whole FOR VALUES FROM (-1000) TO (100000)",
            "INSERT INTO {s}.items SELECT -g, 'old ' || g FROM generate_series(1, 20) g",
        ],
        "it is a table partition of a partitioned table",
    ),
    "inheritance-child": (
        [
            "CREATE TABLE {s}.base (id integer, name text)",
            "CREATE TABLE {s}.items () INHERITS ({s}.base)",
            "INSERT INTO {s}.items SELECT -g, 'old ' || g FROM generate_series(1, 20) g",
        ],
        "it takes part in table inheritance",
    ),
    "inheritance-parent": (
        [
            "CREATE TABLE {s}.items (id integer, name text)",
            "CREATE TABLE {s}.items_child () INHERITS ({s}.items)",
            "INSERT INTO {s}.items SELECT -g, 'old ' || g FROM generate_series(1, 20) g",
        ],
        "it takes part in table inheritance",
    ),
    "row-level-security": (
        ["ALTER TABLE {s}.items ENABLE ROW LEVEL SECURITY"],
        "it has row-level security enabled",
    ),
    "policy": (
        ["CREATE POLICY items_mine ON {s}.items USING (id < 0)"],
        "policy items_mine on table {schema}.items depends on it",
    ),
    "rule": (
        ["CREATE RULE items_no_delete AS ON DELETE TO {s}.items DO INSTEAD NOTHING"],
        "rule items_no_delete on table {schema}.items depends on it",
    ),
    "publication": (
        ["CREATE PUBLICATION {pub} FOR TABLE {s}.items"],
        "publication of table {schema}.items in publication {pub} depends on it",
    ),
    "statistics": (
        ["CREATE STATISTICS {s}.items_stats (dependencies) ON id, name FROM {s}.items"],
        "statistics object {schema}.items_stats depends on it",
    ),
    "materialized-view": (
        ["CREATE MATERIALIZED VIEW {s}.items_mv AS SELECT id FROM {s}.items"],
        "materialized view {schema}.items_mv reads it",
    ),
    "sql-function-body": (
        [
            "CREATE FUNCTION {s}.items_count() RETURNS bigint LANGUAGE sql"
            " BEGIN ATOMIC SELECT count(*) FROM {s}.items; END"
        ],
        "function {schema}.items_count() depends on it",
    ),
}


def _refusal_setup(db: Any, name: str) -> str:
    statements, text = UNSUPPORTED[name]
    if not statements[0].startswith("CREATE TABLE {s}."):
        _items_with_rows(db)
    _run(db, *statements, pub=_publication(db))
    return text.format(schema=db.schema, pub=_publication(db))


@pytest.fixture
def no_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The partitions whose COPY step was called."""
    copies: list[int] = []
    real_copy = steps.copy_partition

    def counting_copy(conn, plan, index, progress=None):
        copies.append(index)
        return real_copy(conn, plan, index, progress)

    monkeypatch.setattr(steps, "copy_partition", counting_copy)
    return copies


@pytest.mark.parametrize("name", list(UNSUPPORTED))
def test_replace_refuses_what_it_cannot_carry_over_before_anything_changes(
    db, connect, tmp_path, no_copies, name
):
    try:
        text = _refusal_setup(db, name)
        before = _state(db, "items")
        tables_before = _relations(db)
        path = _write(tmp_path, "items.csv", [f"{i},new {i}" for i in range(1, 101)])

        with pytest.raises(LoadRefusedError) as info:
            runner.load(
                connect,
                db.table("items"),
                str(path),
                mode="replace",
                partitions=2,
                on_error="reject",
            )

        message = str(info.value)
        assert message.startswith(
            f"replace of {db.schema}.items refused before anything changed: "
        ), message
        assert text in message
        assert "use mode='append' or remove them first" in message
        assert no_copies == []
        assert _state(db, "items") == before
        assert _relations(db) == tables_before  # no staging, ledger or reject table
        # what the message advises works
        summary = runner.load(connect, db.table("items"), str(path), mode="append", partitions=2)
        assert summary.rows == 100
        assert db.scalar(f"SELECT count(*) FROM {db.schema}.items") == 120
        assert leftovers(db) == []
    finally:
        db.run(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(_publication(db))))


def _relations(db: Any) -> list[str]:
    return [
        r[0]
        for r in db.run(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE nspname = %s ORDER BY 1",
            db.schema,
        )
    ]


def _tree(db: Any) -> None:
    _run(
        db,
        "CREATE TABLE {s}.tree (id integer PRIMARY KEY,"
        " parent integer CONSTRAINT tree_parent_fk REFERENCES {s}.tree (id))",
        "INSERT INTO {s}.tree VALUES (-1, NULL), (-2, -1)",
    )


def test_replace_of_a_table_with_a_foreign_key_to_itself_is_refused(
    db, connect, tmp_path, no_copies
):
    _tree(db)
    before = _state(db, "tree")
    path = _write(tmp_path, "tree.csv", ["1,", "2,1"])

    with pytest.raises(LoadRefusedError) as info:
        runner.load(connect, db.table("tree"), str(path), mode="replace")

    assert (
        f"replace of {db.schema}.tree refused before anything changed: it has a foreign key "
        "to itself (tree_parent_fk)" in str(info.value)
    )
    assert "use mode='append'" in str(info.value)
    assert no_copies == []
    assert _state(db, "tree") == before
    assert leftovers(db) == []


def test_append_to_a_table_with_a_foreign_key_to_itself_works(db, connect, tmp_path):
    """The README lists "a foreign key of the table to itself" among what a replace refuses,
    and says "Use append (or remove the object) for those"."""
    _tree(db)
    path = _write(tmp_path, "tree.csv", ["1,", "2,1"])

    summary = runner.load(connect, db.table("tree"), str(path), mode="append")

    assert summary.rows == 2
    assert db.scalar(f"SELECT count(*) FROM {db.schema}.tree") == 4
    assert leftovers(db) == []


@pytest.mark.parametrize(
    ("ddl", "kind"),
    [
        ("CREATE VIEW {s}.items AS SELECT 1 AS id, 'x'::text AS name", "a view"),
        (
            "CREATE MATERIALIZED VIEW {s}.items AS SELECT 1 AS id, 'x'::text AS name",
            "a materialized view",
        ),
    ],
    ids=["view", "materialized-view"],  # (partitioned tables: tests/test_partitioned.py)
)
@pytest.mark.parametrize("mode", ["replace", "append"])
def test_a_target_that_is_not_a_plain_table_is_refused(
    db, connect, tmp_path, no_copies, ddl, kind, mode
):
    _run(db, ddl)
    relations = _relations(db)
    path = _write(tmp_path, "items.csv", ["1,a"])

    with pytest.raises(LoadRefusedError) as info:
        runner.load(connect, db.table("items"), str(path), mode=mode)

    assert str(info.value) == (
        f"target {db.schema}.items is {kind}; only plain tables are supported as targets"
    )
    assert no_copies == []
    assert _relations(db) == relations


# --- refused for want of privileges ------------------------------------------------------------

PRIVILEGE_CASES = {
    "replace-not-owner": (
        "replace",
        ["GRANT USAGE, CREATE ON SCHEMA {s} TO {r}", "GRANT INSERT, SELECT ON {s}.items TO {r}"],
        "replace of {table} needs the role {role} to own it (its owner is {owner}; "
        "e.g. GRANT {owner} TO {role}); or use mode='append'",
    ),
    "append-without-insert": (
        "append",
        ["GRANT USAGE, CREATE ON SCHEMA {s} TO {r}", "GRANT SELECT, UPDATE ON {s}.items TO {r}"],
        "append to {table} needs INSERT on it for the role {role}",
    ),
    "replace-without-create-on-schema": (
        "replace",
        ["GRANT USAGE ON SCHEMA {s} TO {r}", "ALTER TABLE {s}.items OWNER TO {r}"],
        "the load needs CREATE on schema {schema} for the role {role}: its staging "
        "and ledger tables are created there",
    ),
    "append-without-create-on-schema": (
        "append",
        ["GRANT USAGE ON SCHEMA {s} TO {r}", "GRANT INSERT, SELECT ON {s}.items TO {r}"],
        "the load needs CREATE on schema {schema} for the role {role}: its staging "
        "and ledger tables are created there",
    ),
}


@pytest.mark.parametrize("name", list(PRIVILEGE_CASES))
def test_load_without_a_needed_privilege_is_refused_before_anything_changes(
    db, login_role, tmp_path, no_copies, name
):
    mode, grants, expected = PRIVILEGE_CASES[name]
    _items_with_rows(db)
    _run(db, *grants, r=login_role["name"])
    owner = _owner(db, "items")
    before = _state(db, "items")
    relations = _relations(db)
    path = _write(tmp_path, "items.csv", [f"{i},new {i}" for i in range(1, 101)])

    with pytest.raises(LoadRefusedError) as info:
        runner.load(login_role["dsn"], db.table("items"), str(path), mode=mode, partitions=2)

    assert str(info.value) == expected.format(
        table=db.table("items"), schema=db.schema, role=login_role["name"], owner=owner
    )
    assert no_copies == []
    assert _state(db, "items") == before
    assert _relations(db) == relations


def test_reject_table_made_before_needs_only_insert_on_it(db, login_role, tmp_path):
    """The README's privileges table: with on_error="reject", CREATE on the reject table's
    schema is needed "the first time" only, then INSERT on the table."""
    _items_with_rows(db)
    rejects_schema = f"{db.schema}_rej"
    _run(
        db,
        "GRANT USAGE, CREATE ON SCHEMA {s} TO {r}",
        "ALTER TABLE {s}.items OWNER TO {r}",
        "CREATE SCHEMA {k}",
        "GRANT USAGE ON SCHEMA {k} TO {r}",
        r=login_role["name"],
        k=rejects_schema,
    )
    try:
        # the first load creates the reject table (run by a role that may)
        first = _write(tmp_path, "first.csv", ["1,a"])
        runner.load(
            db.dsn, db.table("items"), str(first), mode="replace", on_error="reject",
            reject_table=f"{rejects_schema}.rejects",
        )  # fmt: skip
        _run(db, "GRANT INSERT ON {k}.rejects TO {r}", r=login_role["name"], k=rejects_schema)
        before = _state(db, "items")
        path = _write(tmp_path, "items.csv", ["1,a", "x,bad id", "3,c"])
        # the first load also made the load history: another role must be let write it
        with pytest.raises(
            LoadRefusedError, match=r"GRANT SELECT, INSERT, UPDATE, DELETE ON .*pgbulk_loads"
        ):
            runner.load(
                login_role["dsn"], db.table("items"), str(path), mode="replace",
                on_error="reject", max_rejects=1, reject_table=f"{rejects_schema}.rejects",
            )  # fmt: skip
        assert _state(db, "items") == before
        assert leftovers(db) == []
        _run(
            db, "GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.pgbulk_loads TO {r}",
            r=login_role["name"],
        )  # fmt: skip

        try:
            summary = runner.load(
                login_role["dsn"],
                db.table("items"),
                str(path),
                mode="replace",
                on_error="reject",
                max_rejects=1,
                reject_table=f"{rejects_schema}.rejects",
            )
        except Exception:
            assert _state(db, "items") == before
            assert leftovers(db) == []
            raise

        assert (summary.rows, summary.rejects) == (2, 1)
        assert db.scalar(f"SELECT raw_line FROM {rejects_schema}.rejects") == "x,bad id"
    finally:
        _run(db, "DROP SCHEMA {k} CASCADE", k=rejects_schema)
