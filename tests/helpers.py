"""Test data and catalog snapshots shared by the test modules."""

from __future__ import annotations

import csv
import gzip
import io
import logging
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from psycopg import sql

from airflow_pg_bulk import runner
from airflow_pg_bulk.loading.database import arrow_readers

NASTY = [
    "plain",
    'with "quotes"',
    "comma, inside",
    "new\nline",
    "crlf\r\ninside",
    'both "\n" here',
    "",
    "  spaced  ",
    "unicodé ✓",
    "tab\tinside",
    "back\\slash",
    '""',
    "\\N",
    "NULL",
]


def rows(count: int, seed: int = 7) -> list[tuple[Any, ...]]:
    """``count`` rows of (id, name, amount, day, note) with awkward text in them."""
    rnd = random.Random(seed)
    out = []
    for i in range(1, count + 1):
        name = rnd.choice(NASTY) + f" #{i}"
        note = None if i % 7 == 0 else rnd.choice(NASTY)
        out.append(
            (i, name, f"{rnd.randint(0, 10**6) / 100:.2f}", f"2024-01-{1 + i % 28:02d}", note)
        )
    return out


def write_csv(
    path: Path,
    data: list[tuple[Any, ...]],
    *,
    header: list[str] | None = None,
    lineterminator: str = "\n",
) -> Path:
    """Write rows as PostgreSQL-compatible CSV (None → empty unquoted field)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator=lineterminator)
    if header:
        writer.writerow(header)
    for row in data:
        # csv.writer writes None and "" both as empty; PostgreSQL reads unquoted empty as NULL,
        # so quote empty strings explicitly.
        fields = ['""' if v == "" else ("" if v is None else _quote(str(v))) for v in row]
        buf.write(",".join(fields) + lineterminator)
    path.write_text(buf.getvalue(), encoding="utf-8", newline="")
    return path


def write_parts(
    directory: Path,
    stem: str,
    parts: int,
    per_part: int,
    *,
    header: list[str] | None = None,
    id_step: int = 10_000,
) -> Path:
    """Write ``parts`` CSV files ``<stem>-<n>.csv`` of ``per_part`` rows each (ids kept apart by
    ``id_step``), each with ``header`` if given; return one headerless file holding all their
    rows, for the reference COPY."""
    whole = directory / f"{stem}-all.data"
    with open(whole, "wb") as out:
        for n in range(parts):
            data = [(r[0] + id_step * n, *r[1:]) for r in rows(per_part, seed=n)]
            path = write_csv(directory / f"{stem}-{n}.csv", data, header=header)
            content = path.read_bytes()
            out.write(content.split(b"\n", 1)[1] if header else content)
    return whole


def _quote(value: str) -> str:
    if any(c in value for c in ',"\r\n') or value.strip() != value or value == "\\.":
        return '"' + value.replace('"', '""') + '"'
    return value


def write_text_format(path: Path, data: list[tuple[Any, ...]]) -> Path:
    """Write rows in PostgreSQL's text format (tab-separated, backslash escapes, \\N)."""

    def esc(v: Any) -> str:
        if v is None:
            return "\\N"
        s = str(v)
        return (
            s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
        )

    path.write_text(
        "".join("\t".join(esc(v) for v in row) + "\n" for row in data), encoding="utf-8", newline=""
    )
    return path


def gzip_file(path: Path) -> Path:
    """Compress ``path`` to ``path.gz``."""
    out = path.with_name(path.name + ".gz")
    out.write_bytes(gzip.compress(path.read_bytes()))
    return out


def create_items(db: Any, name: str = "items") -> None:
    """The test target: (id PK, name, amount numeric CHECK, day date, note)."""
    db.run(
        sql.SQL(
            "CREATE TABLE {} (id integer PRIMARY KEY, name text NOT NULL,"
            " amount numeric(12,2) CHECK (amount >= 0), day date, note text)"
        ).format(db.ident(name))
    )


def plain_copy_checksum(
    db: Any, path: Path, copy_options: str, name: str = "reference", like: str = "items"
) -> tuple[int, str]:
    """Load ``path`` with one plain COPY into a fresh table and return its checksum."""
    db.run(sql.SQL("CREATE TABLE {} (LIKE {})").format(db.ident(name), db.ident(like)))
    opener = gzip.open if path.suffix == ".gz" else open
    with (
        db.conn.cursor() as cur,
        opener(path, "rb") as f,
        cur.copy(
            sql.SQL("COPY {} FROM STDIN WITH (" + copy_options + ")").format(db.ident(name))
        ) as copy,
    ):
        while chunk := f.read(1 << 16):
            copy.write(chunk)
    return db.checksum(name)


def catalog_snapshot(db: Any, name: str) -> dict[str, Any]:
    """What a replace must preserve, read from the catalog in comparable form."""
    oid = db.scalar("SELECT %s::regclass::oid", f'"{db.schema}"."{name}"')
    q = {
        "columns": "SELECT attname, format_type(atttypid, atttypmod), attnotnull,"
        " pg_get_expr(d.adbin, d.adrelid), attidentity, col_description(attrelid, attnum),"
        " attacl::text FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid"
        " AND d.adnum = a.attnum WHERE attrelid = %s AND attnum > 0"
        " AND NOT attisdropped ORDER BY attnum",
        "indexes": "SELECT ic.relname, obj_description(ic.oid, 'pg_class'),"
        " regexp_replace(pg_get_indexdef(i.indexrelid), ' ON .* USING ', ' ON t USING ')"
        " FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
        " WHERE i.indrelid = %s ORDER BY 1",
        "constraints": "SELECT conname, contype, pg_get_constraintdef(oid), convalidated,"
        " obj_description(oid, 'pg_constraint') FROM pg_constraint"
        " WHERE conrelid = %s AND contype <> 'n' ORDER BY 1",
        "triggers": "SELECT tgname, tgenabled,"
        " regexp_replace(pg_get_triggerdef(oid), ' ON \\S+ ', ' ON t ')"
        " FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal ORDER BY 1",
        "grants": "SELECT coalesce(r.rolname, 'PUBLIC'), a.privilege_type, a.is_grantable"
        " FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee"
        " WHERE c.oid = %s ORDER BY 1, 2",
        "table": "SELECT pg_get_userbyid(relowner), relpersistence,"
        " obj_description(oid, 'pg_class'), relname FROM pg_class WHERE oid = %s",
        "referencing": "SELECT conrelid::regclass::text, conname, convalidated FROM pg_constraint"
        " WHERE confrelid = %s AND contype = 'f' ORDER BY 1, 2",
    }
    return {key: db.run(query, oid) for key, query in q.items()}


def repaired_partitions(caplog: Any) -> list[int]:
    """The COPY streams finalize loaded again from exact record starts (a wrong range guess
    repaired: :func:`airflow_pg_bulk.loading.repair.repair` logs them), from a test's ``caplog``."""
    found: list[int] = []
    for record in caplog.records:
        if record.name == "airflow_pg_bulk.loading.repair" and "loading COPY streams" in record.msg:
            found += record.args[-1]
    return found


def leftovers(db: Any) -> list[str]:
    """Tables or sequences a load left behind in the test schema."""
    return [
        r[0]
        for r in db.run(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname LIKE '\\_pgbulk\\_%%'",
            db.schema,
        )
    ]


def error_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """An exception and its causes (``raise … from``) and contexts, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def sqlstate_of(exc: BaseException) -> str | None:
    """The first SQLSTATE found along the exception's chain (the package's or the driver's)."""
    for item in error_chain(exc):
        code = getattr(item, "sqlstate", None) or getattr(item, "pgcode", None)
        if code:
            return code
    return None


def multiline_rows(count: int, newline: bytes, long_note_every: int = 0) -> bytes:
    """items rows (csv) whose note is quoted and spans lines, with doubled quotes inside (a
    quote-free run of 20,000 lines every ``long_note_every`` rows: the kind of field a bounded
    window cannot see the start of)."""
    eol = newline.decode()
    out = []
    for i in range(1, count + 1):
        note = f'line one of {i}{eol}line two, ""quoted"" {i}{eol}'
        if long_note_every and i % long_note_every == 0:
            note = eol.join(f"{k},{i}" for k in range(20_000))
        out.append(f'{i},"name {i}",{i % 97}.25,2024-01-{1 + i % 28:02d},"{note}"'.encode())
    return newline.join(out) + newline


def returned_xcom(run: Any, task_id: str) -> Any:
    """What task ``task_id`` (not mapped) of the DAG run ``run`` returned, as Airflow's
    metadata database holds it (its XCom ``return_value``)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(
            run_id=run.run_id, key="return_value", dag_ids=run.dag_id, task_ids=task_id
        )
        return XComModel.deserialize_value(session.scalars(query).one())


def load_both_ways(
    db: Any,
    connect: Callable[[], Any],
    monkeypatch: Any,
    caplog: Any,
    reader: str,
    create: str,
    **source: Any,
) -> tuple[list[str], list[str]]:
    """The source loaded into two tables made by ``create``: by its Arrow ``reader`` (the log
    says it read the rows), then with the Arrow readers left out (the rows path); each
    table's rows as PostgreSQL's text of the whole row (a double in its shortest exact
    form, so equal text is equal bits)."""
    got = []
    for name, arrow in (("by_arrow", True), ("by_rows", False)):
        db.run(sql.SQL(create).format(db.ident(name)))
        with monkeypatch.context() as patched, caplog.at_level(logging.INFO):
            caplog.clear()
            if not arrow:
                patched.setattr(arrow_readers, "choose", lambda *args: None)
            runner.load(connect, db.table(name), mode="replace", **source)
        said = f"by Arrow record batches ({reader})"
        assert (said in caplog.text) is arrow, caplog.text
        assert ("by a server-side cursor" in caplog.text) is not arrow, caplog.text
        got.append(
            db.run(sql.SQL("SELECT t::text FROM {} AS t ORDER BY id").format(db.ident(name)))
        )
    return [r[0] for r in got[0]], [r[0] for r in got[1]]


def daily_target(db: Any, days: int, day0: str) -> None:
    """``meters`` (2,000) and ``readings`` partitioned by day into ``days`` partitions from
    ``day0`` (made by one DO block: one statement), PK (meter_id, day) and FK to meters,
    5 meters' rows a day: the shape of issue 17's daily reload."""
    db.run(sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY)").format(db.ident("meters")))
    db.run(sql.SQL("INSERT INTO {} SELECT generate_series(1, 2000)").format(db.ident("meters")))
    db.run(
        sql.SQL(
            "CREATE TABLE {} (meter_id integer NOT NULL REFERENCES {}, day date NOT NULL,"
            " reading double precision, PRIMARY KEY (meter_id, day)) PARTITION BY RANGE (day)"
        ).format(db.ident("readings"), db.ident("meters"))
    )
    db.run(
        sql.SQL(
            "DO $$ DECLARE s text := {}; d date := {}; BEGIN FOR i IN 0..{} LOOP EXECUTE"
            " format('CREATE TABLE %I.%I PARTITION OF %I.readings FOR VALUES FROM (%L) TO (%L)',"
            " s, 'readings_' || to_char(d + i, 'YYYYMMDD'), s, d + i, d + i + 1); END LOOP;"
            " END $$"
        ).format(sql.Literal(db.schema), sql.Literal(day0), sql.Literal(days - 1))
    )
    db.run(
        sql.SQL(
            "INSERT INTO {} SELECT m, date {} + d, 1 FROM generate_series(1, 5) m,"
            " generate_series(0, {}) d"
        ).format(db.ident("readings"), sql.Literal(day0), sql.Literal(days - 1))
    )
