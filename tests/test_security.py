"""Security: hostile names inject nothing, COPY reads only FROM STDIN, a non-superuser role with
the README's privileges can load, and passwords never reach logs, XCom or error messages."""

from __future__ import annotations

import ast
import json
import logging
import re
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import leftovers
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import airflow_pg_bulk
from airflow_pg_bulk import cli, naming, runner, steps
from airflow_pg_bulk import sql as bulk_sql
from airflow_pg_bulk.db import driver as driver_module
from airflow_pg_bulk.db.driver import connect as open_connection
from airflow_pg_bulk.errors import BadDataError, LoadRefusedError
from airflow_pg_bulk.plan import CopyOptions, LoadRequest

PACKAGE = Path(airflow_pg_bulk.__file__).parent


# --- helpers ---------------------------------------------------------------------------------


def checksum(db: Any, schema: str, table: str) -> tuple[int, str | None]:
    """Row count and order-independent checksum of any table, whatever its name."""
    return db.run(
        sql.SQL(
            "SELECT count(*), md5(string_agg(md5(t::text), '' ORDER BY md5(t::text))) FROM {} t"
        ).format(sql.Identifier(schema, table))
    )[0]


def run_tables(db: Any, schema: str) -> list[str]:
    """``_pgbulk_*`` tables left in a schema."""
    return [
        r[0]
        for r in db.run(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname LIKE '\\_pgbulk\\_%%'",
            schema,
        )
    ]


def copy_into(db: Any, schema: str, table: str, columns: list[str], data: bytes, opts: str):
    """One plain COPY FROM STDIN: the reference the load is compared with."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (" + opts + ")").format(
        sql.Identifier(schema, table), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    with db.conn.cursor() as cur, cur.copy(statement) as copy:
        copy.write(data)


def csv_line(values: list[Any]) -> str:
    out = []
    for v in values:
        if v is None:
            out.append("")
        else:
            text = str(v)
            out.append('"' + text.replace('"', '""') + '"')
    return ",".join(out) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- hostile names ---------------------------------------------------------------------------


@pytest.fixture
def hostile(db) -> Iterator[dict[str, Any]]:
    """A schema, table, columns, index, constraints, comment and grantee whose names are
    hostile; a sentinel table that an injection would drop."""
    tag = uuid.uuid4().hex[:6]
    drop = f"DROP TABLE {db.schema}.sentinel; --"
    names = {
        "schema": f'My.Schema "{tag}" ü',
        "table": f'Ta.ble"; {drop}',
        "columns": [
            'Id "pk"',
            "Mixed Case",
            "ünï cødé",
            "a.b",
            f'x"; {drop}',
            "select",
            "it's",
        ],
        "index": f'idx USING btree ("x"); {drop}',
        "check": f'chk"; {drop}',
        "pk": 'pk "of" it',
        "role": f'r"; {drop[:-4]} {tag}',
        "comment": f"it's'; {drop}",
    }
    for key in ("schema", "table", "index", "check", "role", *names["columns"]):
        value = names.get(key, key)
        assert len(value.encode()) < 64, value  # no silent truncation of identifiers
    s, t = names["schema"], names["table"]
    c = [sql.Identifier(n) for n in names["columns"]]
    db.run(sql.SQL("CREATE TABLE {} (x integer)").format(db.ident("sentinel")))
    db.run(sql.SQL("INSERT INTO {} VALUES (1)").format(db.ident("sentinel")))
    db.run(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(s)))
    db.run(sql.SQL("CREATE ROLE {}").format(sql.Identifier(names["role"])))
    db.run(
        sql.SQL(
            "CREATE TABLE {t} ({c0} integer CONSTRAINT {pk} PRIMARY KEY, {c1} text NOT NULL,"
            " {c2} text, {c3} numeric(10,2) CONSTRAINT {chk} CHECK ({c3} >= 0), {c4} text,"
            " {c5} date, {c6} text)"
        ).format(
            t=sql.Identifier(s, t),
            pk=sql.Identifier(names["pk"]),
            chk=sql.Identifier(names["check"]),
            **{f"c{i}": col for i, col in enumerate(c)},
        )
    )
    db.run(
        sql.SQL("CREATE INDEX {} ON {} ({}, lower({})) WHERE {} > 0").format(
            sql.Identifier(names["index"]), sql.Identifier(s, t), c[1], c[2], c[3]
        )
    )
    db.run(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(
            sql.Identifier(s, t), sql.Literal(names["comment"])
        )
    )
    db.run(
        sql.SQL("COMMENT ON COLUMN {} IS {}").format(
            sql.Identifier(s, t, names["columns"][4]), sql.Literal(names["comment"])
        )
    )
    db.run(
        sql.SQL("GRANT SELECT ({}) ON {} TO {}").format(
            c[6], sql.Identifier(s, t), sql.Identifier(names["role"])
        )
    )
    db.run(
        sql.SQL("GRANT SELECT ON {} TO {}").format(
            sql.Identifier(s, t), sql.Identifier(names["role"])
        )
    )
    db.run(
        sql.SQL("INSERT INTO {} VALUES (-1, 'old', 'ö', 1, 'x', '2000-01-01', 'y')").format(
            sql.Identifier(s, t)
        )
    )
    try:
        yield names
    finally:
        db.run(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))
        db.run(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(names["role"])))
        db.run(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(names["role"])))


def hostile_rows(count: int) -> list[list[Any]]:
    values = ['a"; DROP TABLE x; --', "it's", "new\nline", "Robert'); --", "ünï", "", "a,b"]
    return [
        [
            i,
            values[i % 7] + str(i),
            values[(i + 3) % 7],
            f"{i}.25",
            values[(i + 1) % 7],
            f"2024-01-{1 + i % 28:02d}",
            None if i % 5 == 0 else values[(i + 2) % 7],
        ]
        for i in range(1, count + 1)
    ]


def table_catalog(db: Any, schema: str, table: str) -> dict[str, Any]:
    oid = db.scalar("SELECT %s::regclass::oid", sql.Identifier(schema, table).as_string())
    return {
        "indexes": db.run(
            "SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
            " WHERE i.indrelid = %s ORDER BY 1",
            oid,
        ),
        "constraints": db.run(
            "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s AND contype <> 'n' ORDER BY 1",
            oid,
        ),
        "comments": db.run(
            "SELECT obj_description(%s, 'pg_class'), col_description(%s, 5)", oid, oid
        ),
        "grants": db.run(
            "SELECT relacl::text, (SELECT array_agg(attacl::text ORDER BY attnum)"
            " FROM pg_attribute WHERE attrelid = %s AND attnum > 0) FROM pg_class"
            " WHERE oid = %s",
            oid,
            oid,
        ),
        "columns": db.run(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
            " AND NOT attisdropped ORDER BY attnum",
            oid,
        ),
    }


@pytest.mark.parametrize("header", [False, True], ids=["columns-in-order", "header-mapping"])
@pytest.mark.parametrize("mode", ["replace", "append"])
def test_hostile_names_load_correctly_and_inject_nothing(
    db, connect, tmp_path, hostile, mode, header
):
    s, t, cols = hostile["schema"], hostile["table"], hostile["columns"]
    data = hostile_rows(300)
    if header:
        order = [6, 3, 0, 5, 2, 4, 1]  # another order, and one name in another case
        names = [cols[i] for i in order]
        names[names.index("Mixed Case")] = "MIXED CASE"
        text = csv_line(names) + "".join(csv_line([row[i] for i in order]) for row in data)
        file_columns = [cols[i] for i in order]
    else:
        text = "".join(csv_line(row) for row in data)
        file_columns = cols
    path = tmp_path / "hostile.csv"
    path.write_text(text, encoding="utf-8", newline="")
    db.run(
        sql.SQL("CREATE TABLE {} AS TABLE {} WITH NO DATA").format(
            sql.Identifier(s, "reference"), sql.Identifier(s, t)
        )
    )
    if mode == "append":
        db.run(
            sql.SQL("INSERT INTO {} TABLE {}").format(
                sql.Identifier(s, "reference"), sql.Identifier(s, t)
            )
        )
    copy_into(
        db,
        s,
        "reference",
        file_columns,
        text.encode(),
        "FORMAT csv" + (", HEADER" if header else ""),
    )
    before = table_catalog(db, s, t)
    table = sql.Identifier(s, t).as_string()  # '"My.Schema ""…"" ü"."Ta.ble""; DROP …"'

    summary = runner.load(connect, table, str(path), mode=mode, header=header, partitions=3)

    assert summary.rows == 300
    assert checksum(db, s, t) == checksum(db, s, "reference")
    assert table_catalog(db, s, t) == before  # names, comments and grants carried over
    assert db.scalar(sql.SQL("SELECT x FROM {}").format(db.ident("sentinel"))) == 1
    tables = db.run(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 1",
        s,
    )
    assert tables == sorted([("pgbulk_loads",), ("reference",), (t,)])  # + the load history
    assert run_tables(db, s) == []
    assert leftovers(db) == []


def test_hostile_names_in_error_messages_are_reported_not_executed(db, connect, tmp_path, hostile):
    s, t = hostile["schema"], hostile["table"]
    before = checksum(db, s, t)
    path = tmp_path / "bad.csv"
    path.write_text('1,a,b,1.00,x,2024-01-01,y\n2,a,b,"1.0\'; DROP TABLE y; --",x,,\n')

    with pytest.raises(BadDataError) as info:
        runner.load(
            connect, sql.Identifier(s, t).as_string(), str(path), mode="replace", partitions=1
        )

    assert info.value.line == 2
    assert info.value.column == "a.b"
    assert checksum(db, s, t) == before
    assert db.scalar(sql.SQL("SELECT x FROM {}").format(db.ident("sentinel"))) == 1
    assert run_tables(db, s) == []


# --- COPY only FROM STDIN --------------------------------------------------------------------

_COPY = re.compile(r"\bCOPY\b")
_SERVER_FILE = re.compile(
    r"\b(FROM|TO)\s+(PROGRAM\b|'|E')|\bPROGRAM\b|pg_read_(binary_)?file|lo_import|lo_export",
    re.I,
)


def _string_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(v.value for v in node.values if isinstance(v, ast.Constant)))
    return out


def test_sql_module_builds_copy_only_from_stdin():
    """Every COPY the package composes reads from the client (``FROM STDIN``), or, on a
    database source, writes to the client (``TO STDOUT``): never a server file or program."""
    texts = [t for m in sorted((PACKAGE / "sql").glob("*.py")) for t in _string_constants(m)]
    statements = [t for t in texts if t.lstrip().startswith("COPY")]
    assert statements, "sql.py builds no COPY statement at all?"
    assert any("FROM STDIN" in text for text in statements)
    for text in statements:
        assert "FROM STDIN" in text or text.rstrip().endswith("TO STDOUT"), text
    for text in texts:
        assert not _SERVER_FILE.search(text), f"server-side file access in sql.py: {text!r}"
    # nothing else in the package composes a COPY from a server file or program either
    for module in sorted(PACKAGE.rglob("*.py")):
        for text in _string_constants(module):
            for hit in re.finditer(r"\bCOPY\b[^\n]*", text):
                assert not re.search(r"\b(FROM|TO)\s+(PROGRAM\b|')", hit.group(0), re.I), (
                    f"{module}: {hit.group(0)!r}"
                )


@pytest.mark.parametrize(
    "options",
    [
        CopyOptions(),
        CopyOptions(format="text", null="') TO PROGRAM 'id' --", encoding="UTF8"),
        CopyOptions(
            header=True,
            delimiter="'",
            null="x' ; COPY t FROM PROGRAM 'id'",
            quote="\\",
            escape='"',
            encoding="LATIN1') FROM PROGRAM ('id",
        ),
    ],
    ids=["defaults", "hostile-null", "hostile-everything"],
)
def test_copy_statement_reads_stdin_whatever_the_names_and_options(options):
    statement = bulk_sql.copy_from_stdin(
        "sch\"; COPY x FROM PROGRAM 'id' --",
        "stage",
        ["a", "b\") FROM PROGRAM 'id' --", "c'd"],
        options,
    ).as_string()
    # take out every quoted identifier and string literal: what is left is the statement's
    # own keywords, which must read from STDIN and nothing else
    skeleton = re.sub(r'"(?:[^"]|"")*"', "<id>", statement)
    skeleton = re.sub(r" ?(?:E'(?:[^'\\]|''|\\.)*'|'(?:[^']|'')*')", " <lit>", skeleton)
    skeleton = re.sub(r"\s+", " ", skeleton)
    assert re.fullmatch(
        r"COPY <id>\.<id> \(<id>(, <id>)*\) FROM STDIN WITH \(FORMAT (csv|text)"
        r"(, [A-Z]+ <lit>)*\)",
        skeleton,
    ), skeleton
    assert "PROGRAM" not in skeleton


def test_copy_format_cannot_smuggle_sql():
    with pytest.raises(ValueError):
        CopyOptions(format="csv) TO PROGRAM 'id' --")


class _SpyCursor(psycopg.Cursor):
    """Records every statement psycopg 3 sends; the server still runs each one."""

    sent: list[str]

    def _record(self, query: Any) -> None:
        if isinstance(query, sql.Composable):
            query = query.as_string(self)
        elif isinstance(query, bytes):
            query = query.decode()
        self.connection.sent.append(str(query))  # type: ignore[attr-defined]

    def execute(self, query, params=None, **kwargs):  # type: ignore[override]
        self._record(query)
        return super().execute(query, params, **kwargs)

    def copy(self, statement, params=None, **kwargs):  # type: ignore[override]
        self._record(statement)
        return super().copy(statement, params, **kwargs)


def test_every_statement_sent_during_a_load_reads_copy_from_stdin(
    db, driver, pg_dsn, tmp_path, monkeypatch
):
    db.run(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, txt text)").format(db.ident("items")))
    path = tmp_path / "items.csv"
    path.write_text("".join(f"{i},row {i}\n" for i in range(1, 3001)))

    # 1. every statement the package hands to the driver layer
    composed: list[str] = []
    copies: list[str] = []
    real_execute, real_copy_in = driver_module.execute, driver_module.copy_in

    def spy_execute(conn, statement):
        composed.append(statement.as_string())
        return real_execute(conn, statement)

    def spy_copy_in(conn, statement, chunks):
        copies.append(statement.as_string())
        return real_copy_in(conn, statement, chunks)

    for name, module in list(sys.modules.items()):
        if name == "airflow_pg_bulk" or name.startswith("airflow_pg_bulk."):
            if getattr(module, "execute", None) is real_execute:
                monkeypatch.setattr(module, "execute", spy_execute)
            if getattr(module, "copy_in", None) is real_copy_in:
                monkeypatch.setattr(module, "copy_in", spy_copy_in)

    # 2. with psycopg 3, also every statement that reaches a cursor, whatever the route
    wire: list[str] = []

    def factory():
        conn = open_connection(pg_dsn, driver)
        if driver == "psycopg":
            conn.sent = wire
            conn.cursor_factory = _SpyCursor
        return conn

    summary = runner.load(factory, db.table("items"), str(path), mode="replace", partitions=4)

    assert summary.rows == 3000
    assert len(copies) == 4  # one COPY per piece
    for text in copies:
        assert re.match(r"COPY \S+ \(.*\) FROM STDIN WITH \(", text), text
    for text in [*composed, *copies, *wire]:
        if _COPY.search(text):
            assert re.match(r"COPY .* FROM STDIN WITH \(", text, re.S), text
        assert not _SERVER_FILE.search(text), text
    if driver == "psycopg":
        wire_copies = [w for w in wire if w.startswith("COPY")]
        assert wire_copies == copies


# --- a non-superuser role --------------------------------------------------------------------


@pytest.fixture
def role(db, pg_dsn) -> Iterator[dict[str, str]]:
    """A LOGIN role with a password and no privileges yet; dropped (with what it owns) after."""
    name = f"pgbulk_user_{uuid.uuid4().hex[:10]}"
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


def _items(db: Any, rows: int = 2) -> None:
    db.run(
        sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, name text NOT NULL, day date)").format(
            db.ident("items")
        )
    )
    db.run(sql.SQL("CREATE INDEX items_day ON {} (day)").format(db.ident("items")))
    db.run(
        sql.SQL("INSERT INTO {} SELECT -g, 'old', NULL FROM generate_series(1, %s) g").format(
            db.ident("items")
        ),
        rows,
    )


def _file(tmp_path: Path, count: int = 2000) -> Path:
    path = tmp_path / "items.csv"
    path.write_text(
        "".join(f"{i},name {i},2024-01-{1 + i % 28:02d}\n" for i in range(1, count + 1))
    )
    return path


# "readme": exactly what the README's privileges table lists (USAGE and CREATE on the schema).
SCHEMA_PRIVILEGES = {"readme": "USAGE, CREATE"}


@pytest.mark.parametrize("privileges", list(SCHEMA_PRIVILEGES))
def test_non_superuser_owner_can_replace(db, role, driver, tmp_path, privileges):
    _items(db)
    # the README's privileges for replace: CREATE on the schema, ownership of the target
    db.run(
        sql.SQL("GRANT " + SCHEMA_PRIVILEGES[privileges] + " ON SCHEMA {} TO {}").format(
            sql.Identifier(db.schema), sql.Identifier(role["name"])
        )
    )
    db.run(
        sql.SQL("ALTER TABLE {} OWNER TO {}").format(
            db.ident("items"), sql.Identifier(role["name"])
        )
    )
    assert not db.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = %s", role["name"])

    summary = runner.load(
        role["dsn"],
        db.table("items"),
        str(_file(tmp_path)),
        mode="replace",
        partitions=3,
        driver=driver,
    )

    assert summary.rows == 2000
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("items"))) == 2000
    assert (
        db.scalar(
            "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = %s::regclass",
            f"{db.schema}.items",
        )
        == role["name"]
    )
    assert leftovers(db) == []


@pytest.mark.parametrize("privileges", list(SCHEMA_PRIVILEGES))
def test_non_superuser_with_insert_and_select_can_append(db, role, driver, tmp_path, privileges):
    _items(db)
    # the README's privileges for append: CREATE on the schema, INSERT and SELECT on the target
    db.run(
        sql.SQL("GRANT " + SCHEMA_PRIVILEGES[privileges] + " ON SCHEMA {} TO {}").format(
            sql.Identifier(db.schema), sql.Identifier(role["name"])
        )
    )
    db.run(
        sql.SQL("GRANT INSERT, SELECT ON {} TO {}").format(
            db.ident("items"), sql.Identifier(role["name"])
        )
    )

    summary = runner.load(
        role["dsn"],
        db.table("items"),
        str(_file(tmp_path)),
        mode="append",
        partitions=3,
        driver=driver,
    )

    assert summary.rows == 2000
    assert db.scalar(sql.SQL("SELECT count(*) FROM {}").format(db.ident("items"))) == 2002
    assert leftovers(db) == []


def test_replace_by_a_role_that_does_not_own_the_target_fails_clearly(db, role, tmp_path):
    _items(db, rows=5)
    db.run(
        sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(
            sql.Identifier(db.schema), sql.Identifier(role["name"])
        )
    )
    db.run(
        sql.SQL("GRANT INSERT, SELECT ON {} TO {}").format(
            db.ident("items"), sql.Identifier(role["name"])
        )
    )
    before = db.checksum("items")
    copies: list[int] = []
    real_copy = steps.copy_partition

    def counting_copy(conn, plan, index, progress=None):
        copies.append(index)
        return real_copy(conn, plan, index, progress)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(steps, "copy_partition", counting_copy)
        with pytest.raises(Exception) as info:
            runner.load(
                role["dsn"], db.table("items"), str(_file(tmp_path)), mode="replace", partitions=2
            )

    message = str(info.value)
    assert isinstance(info.value, LoadRefusedError), f"{type(info.value).__name__}: {message}"
    assert "owner" in message
    assert f"{db.schema}.items" in message
    assert copies == [], "the refusal should come before any data is copied"
    assert db.checksum("items") == before
    assert leftovers(db) == []


# --- passwords -------------------------------------------------------------------------------

SECRET = "S3cr3t-pa55"


def _with_password(pg_dsn: str, **extra: Any) -> str:
    return make_conninfo(pg_dsn, password=SECRET, **extra)


def _as_uri(dsn: str, password: str = SECRET, **extra: Any) -> str:
    parts = {**conninfo_to_dict(dsn), **extra}
    host = parts.pop("host", "")
    port = parts.pop("port", None)
    user = parts.pop("user", "postgres")
    dbname = parts.pop("dbname", "postgres")
    parts.pop("password", None)
    netloc = f"{user}:{password}@"
    query = []
    if host.startswith("/"):
        query.append(f"host={host}")
    else:
        netloc += host
    if port:
        if host.startswith("/"):
            query.append(f"port={port}")
        else:
            netloc += f":{port}"
    query += [f"{k}={v}" for k, v in parts.items()]
    return f"postgresql://{netloc}/{dbname}" + ("?" + "&".join(query) if query else "")


def _exception_text(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


def _assert_clean(*texts: str, secret: str = SECRET) -> None:
    for text in texts:
        assert secret not in text


@pytest.mark.parametrize("form", ["key-value", "uri"])
def test_password_not_in_logs_plan_summary_or_errors(db, pg_dsn, tmp_path, caplog, form):
    caplog.set_level(logging.DEBUG)
    dsn = _with_password(pg_dsn) if form == "key-value" else _as_uri(pg_dsn)
    assert SECRET in dsn
    _items(db)
    good = _file(tmp_path, 500)

    # a good load
    summary = runner.load(dsn, db.table("items"), str(good), mode="replace", partitions=2)
    assert summary.rows == 500
    _assert_clean(caplog.text, json.dumps(summary.to_dict()), summary.describe())

    # the plan that travels through XCom
    conn = open_connection(dsn)
    try:
        request = LoadRequest(
            mode="replace", table=db.table("items"), source=(str(good),), partitions=2
        )
        plan = steps.prepare(conn, request, naming.new_load_id())
        _assert_clean(json.dumps(plan.to_dict()), repr(plan))
        steps.cleanup(conn, db.schema, plan.load_id)
    finally:
        conn.close()

    # a load that fails on bad data
    bad = tmp_path / "bad.csv"
    bad.write_text("1,a,2024-01-01\n2,b,not a date\n")
    with pytest.raises(BadDataError) as info:
        runner.load(dsn, db.table("items"), str(bad), mode="replace")
    _assert_clean(_exception_text(info.value), caplog.text)

    # a load that cannot connect at all
    port = free_port()
    if form == "key-value":
        unreachable = _with_password(pg_dsn, host="127.0.0.1", port=port)
    else:
        unreachable = _as_uri(pg_dsn, host="127.0.0.1", port=str(port))
    with pytest.raises(Exception) as info:
        runner.load(unreachable, db.table("items"), str(good), mode="replace")
    _assert_clean(_exception_text(info.value), caplog.text)
    assert leftovers(db) == []


def test_password_not_printed_by_the_cli(db, pg_dsn, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    _items(db)
    good = _file(tmp_path, 300)
    bad = tmp_path / "bad.csv"
    bad.write_text("1,a,2024-01-01\n2,b,2024-13-01\n")
    table = db.table("items")
    base = ["load", "--table", table, "--partitions", "2", "--mode", "replace"]
    dsn = _with_password(pg_dsn)
    unreachable = _with_password(pg_dsn, host="127.0.0.1", port=free_port())

    assert cli.main([*base, "--conn", dsn, "--source", str(good), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["rows"] == 300
    _assert_clean(out.out, out.err, caplog.text)

    assert cli.main([*base, "--conn", _as_uri(pg_dsn), "--source", str(good)]) == 0
    out = capsys.readouterr()
    _assert_clean(out.out, out.err, caplog.text)

    assert cli.main([*base, "--conn", dsn, "--source", str(bad)]) == 1
    out = capsys.readouterr()
    assert "bad.csv line 2" in out.err
    _assert_clean(out.out, out.err, caplog.text)

    assert cli.main([*base, "--conn", unreachable, "--source", str(good)]) == 1
    out = capsys.readouterr()
    assert "error" in out.err
    _assert_clean(out.out, out.err, caplog.text)

    assert cli.main([*base, "--conn", dsn, "--source", str(good), "--driver", "psycopg2"]) == 0
    out = capsys.readouterr()
    _assert_clean(out.out, out.err, caplog.text)
    assert leftovers(db) == []


@pytest.mark.parametrize("driver_name", ["psycopg", "psycopg2"])
def test_password_not_echoed_from_a_malformed_connection_uri(
    db, pg_dsn, tmp_path, capsys, caplog, driver_name
):
    """A password with a stray '%' makes libpq reject the URI, quoting the bad token — which
    is the password. The load must not pass that text on to logs, stderr or the exception."""
    caplog.set_level(logging.DEBUG)
    secret = "S3cr3t%zz-pa55"
    _items(db)
    uri = _as_uri(pg_dsn, password=secret)
    good = _file(tmp_path, 10)

    with pytest.raises(Exception) as info:
        runner.load(uri, db.table("items"), str(good), mode="replace", driver=driver_name)
    _assert_clean(_exception_text(info.value), caplog.text, secret=secret)

    code = cli.main(
        [
            "load",
            "--conn",
            uri,
            "--table",
            db.table("items"),
            "--source",
            str(good),
            "--driver",
            driver_name,
            "--mode",
            "replace",
        ]
    )
    out = capsys.readouterr()
    assert code == 1
    _assert_clean(out.out, out.err, caplog.text, secret=secret)
