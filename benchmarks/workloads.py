"""The three workloads: schema, CSV files and fresh targets of the same definition.

A: smart-meter readings (``airflow_pg_bulk.demo.workload``): ``readings`` with PK + FK.
B: ``t_sample(a varchar(50), b int, c varchar(50), d int)``, no index (the PostgreSQL post).
C: a wide table, 15 columns of text, numeric, timestamptz, jsonb, uuid ..., PK + 3 indexes.

Every file is a CSV with a header line, written by the server (``COPY (SELECT ...) TO STDOUT``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

from airflow_pg_bulk.demo import workload as demo_workload


@dataclass
class Dataset:
    """One workload's data, loaded by every method."""

    key: str
    title: str
    schema: str
    template: str  # the table whose definition every target copies
    columns: list[str]
    files: list[Path]
    rows: int
    description: str
    tsv: Path | None = None  # the same rows, tab-delimited text, for PostgresHook.bulk_load
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        """Size of the CSV files."""
        return sum(p.stat().st_size for p in self.files)

    def qualified(self, table: str) -> str:
        """``schema.table`` as runner.load takes it."""
        return f"{self.schema}.{table}"

    def ident(self, table: str) -> sql.Identifier:
        """The qualified identifier for SQL."""
        return sql.Identifier(self.schema, table)


def _export(conn: Any, query: sql.Composable, path: Path) -> None:
    statement = sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv, HEADER true)").format(query)
    with conn.cursor() as cur, cur.copy(statement) as copy, open(path, "wb") as out:
        for block in copy:
            out.write(block)


def _ranges(total: int, parts: int) -> list[tuple[int, int]]:
    per = -(-total // parts)
    return [(n * per + 1, min(total, (n + 1) * per)) for n in range(parts) if n * per < total]


def _reset_schema(conn: Any, schema: str) -> None:
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))


# --- A ---------------------------------------------------------------------------------------


def create_a(conn: Any, schema: str, meters: int) -> None:
    """Workload A's tables: ``meters`` (filled) and ``readings`` (empty), the demo's schema."""
    demo_workload.drop_schema(conn, schema)
    demo_workload.create_schema(conn, schema, readings_tables=("readings",))
    demo_workload.fill_meters(conn, schema, meters)


def setup_a(conn: Any, directory: Path, *, meters: int, days: int, files: int = 8) -> Dataset:
    """Workload A, with the demo's own schema and file writer."""
    schema = "bench_a"
    create_a(conn, schema, meters)
    size = demo_workload.Workload(meters=meters, days=days, files=files)
    paths = demo_workload.write_readings(conn, size, directory)
    return Dataset(
        key="A",
        title=f"A: smart-meter readings, {meters:,} meters x {days} days",
        schema=schema,
        template="readings",
        columns=["id", "meter_id", "reading", "date"],
        files=paths,
        rows=size.rows,
        description=(
            "`readings(id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, meter_id bigint "
            "REFERENCES meters, reading float8, date date)`; "
            f"{meters:,} meters in `meters(id PK)`; {len(paths)} CSV files with a header"
        ),
        extra={"meters": meters, "days": days},
    )


def write_more_readings(conn: Any, directory: Path, *, meters: int, days: int) -> list[Path]:
    """Another size of workload A's files (for the memory comparison)."""
    size = demo_workload.Workload(meters=meters, days=days, files=8)
    return demo_workload.write_readings(conn, size, directory)


# --- B ---------------------------------------------------------------------------------------


def create_b(conn: Any, schema: str) -> None:
    """Workload B's table."""
    _reset_schema(conn, schema)
    conn.execute(
        sql.SQL("CREATE TABLE {} (a varchar(50), b int, c varchar(50), d int)").format(
            sql.Identifier(schema, "t_sample")
        )
    )


def setup_b(conn: Any, directory: Path, *, rows: int, files: int = 4) -> Dataset:
    """Workload B: the post's t_sample, all rows ('abcd', 1, 'abcd', 1), no index."""
    schema = "bench_b"
    create_b(conn, schema)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, (first, last) in enumerate(_ranges(rows, files)):
        path = directory / f"t_sample-{n:03d}.csv"
        _export(
            conn,
            sql.SQL(
                "SELECT 'abcd'::varchar AS a, 1 AS b, 'abcd'::varchar AS c, 1 AS d"
                " FROM generate_series({}, {})"
            ).format(sql.Literal(first), sql.Literal(last)),
            path,
        )
        paths.append(path)
    return Dataset(
        key="B",
        title=f"B: t_sample, {rows:,} rows of ('abcd', 1, 'abcd', 1)",
        schema=schema,
        template="t_sample",
        columns=["a", "b", "c", "d"],
        files=paths,
        rows=rows,
        description=(
            "`t_sample(a varchar(50), b int, c varchar(50), d int)`, no index, no key; "
            f"{len(paths)} CSV files with a header"
        ),
    )


# --- C ---------------------------------------------------------------------------------------

WIDE_COLUMNS = [
    ("id", "bigint PRIMARY KEY"),
    ("account_id", "integer NOT NULL"),
    ("created_at", "timestamptz NOT NULL"),
    ("updated_at", "timestamptz"),
    ("status", "text NOT NULL"),
    ("category", "varchar(32)"),
    ("amount", "numeric(14,2) NOT NULL"),
    ("tax", "numeric(10,2)"),
    ("quantity", "integer"),
    ("ratio", "double precision"),
    ("is_active", "boolean NOT NULL"),
    ("email", "text"),
    ("description", "text"),
    ("attrs", "jsonb"),
    ("ref", "uuid"),
]
WIDE_INDEXES = [("account_id", "created_at"), ("created_at",), ("email",)]

_WIDE_SELECT = """
SELECT g AS id,
       1 + (g * 7919) % 50000 AS account_id,
       timestamptz '2024-01-01 00:00:00+00' + ((g * 104729) % 31536000) * interval '1 second'
           AS created_at,
       CASE WHEN g % 5 = 0 THEN NULL
            ELSE timestamptz '2024-06-01 00:00:00+00' + (g % 100000) * interval '1 minute' END
           AS updated_at,
       (ARRAY['new', 'paid', 'shipped', 'cancelled', 'returned'])[1 + g % 5] AS status,
       'category-' || (g % 97) AS category,
       round(((g * 31) % 1000000) / 7.0, 2) AS amount,
       round((g % 1000) / 13.0, 2) AS tax,
       g % 50 AS quantity,
       ((g * 17) % 1000) / 1000.0::float8 AS ratio,
       g % 3 <> 0 AS is_active,
       'user' || ((g * 31) % 1000003) || '@example.com' AS email,
       'order ' || g || ', "gift" wrap; note ' || md5(g::text) AS description,
       jsonb_build_object('src', 'web', 'n', g % 10, 'tags', jsonb_build_array('a', g % 7))
           AS attrs,
       md5('ref' || g)::uuid AS ref
FROM generate_series({first}::bigint, {last}::bigint) g
"""


def create_c(conn: Any, schema: str) -> None:
    """Workload C's table, its PK and 3 indexes."""
    _reset_schema(conn, schema)
    table = sql.Identifier(schema, "wide")
    conn.execute(
        sql.SQL("CREATE TABLE {} ({})").format(
            table,
            sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
                for name, kind in WIDE_COLUMNS
            ),
        )
    )
    for n, cols in enumerate(WIDE_INDEXES):
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} ({})").format(
                sql.Identifier(f"wide_idx{n}"),
                table,
                sql.SQL(", ").join(map(sql.Identifier, cols)),
            )
        )


def setup_c(conn: Any, directory: Path, *, rows: int, files: int = 4) -> Dataset:
    """Workload C: a wide table with a PK and 3 secondary indexes."""
    schema = "bench_c"
    create_c(conn, schema)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, (first, last) in enumerate(_ranges(rows, files)):
        path = directory / f"wide-{n:03d}.csv"
        _export(
            conn,
            sql.SQL(_WIDE_SELECT).format(first=sql.Literal(first), last=sql.Literal(last)),
            path,
        )
        paths.append(path)
    return Dataset(
        key="C",
        title=f"C: wide table, {rows:,} rows x {len(WIDE_COLUMNS)} columns, PK + 3 indexes",
        schema=schema,
        template="wide",
        columns=[name for name, _ in WIDE_COLUMNS],
        files=paths,
        rows=rows,
        description=(
            "`wide` (" + ", ".join(f"{n} {k.split()[0]}" for n, k in WIDE_COLUMNS) + "), "
            "PK (id) + indexes on (account_id, created_at), (created_at), (email); "
            f"{len(paths)} CSV files with a header, quoted text with commas and quotes"
        ),
    )


def create_tables(conn: Any, ds: Dataset) -> None:
    """The workload's tables (empty, but ``meters`` filled) in another database."""
    if ds.key == "A":
        create_a(conn, ds.schema, ds.extra["meters"])
    elif ds.key == "B":
        create_b(conn, ds.schema)
    else:
        create_c(conn, ds.schema)


# --- targets ---------------------------------------------------------------------------------


def create_target(conn: Any, ds: Dataset, name: str, kind: str = "indexed") -> None:
    """A fresh, empty target of the template's definition.

    ``indexed``: every column property, index and constraint of the template, its foreign keys
    included (``LIKE ... INCLUDING ALL`` + the FKs); ``bare_unlogged``: an UNLOGGED table with
    the columns only (the floor: no index, no constraint, no WAL)."""
    drop_table(conn, ds, name)
    if kind == "indexed":
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                ds.ident(name), ds.ident(ds.template)
            )
        )
        fks = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'f' ORDER BY conname",
            (f'"{ds.schema}"."{ds.template}"',),
        ).fetchall()
        for n, (_conname, definition) in enumerate(fks):
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                    ds.ident(name), sql.Identifier(f"{name}_fk{n}"), sql.SQL(definition)
                )
            )
    elif kind == "bare_unlogged":
        conn.execute(
            sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {})").format(
                ds.ident(name), ds.ident(ds.template)
            )
        )
    else:
        raise ValueError(f"unknown target kind {kind!r}")


def drop_table(conn: Any, ds: Dataset, name: str) -> None:
    """Drop a target if it exists."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ds.ident(name)))


def make_tsv(conn: Any, ds: Dataset, path: Path) -> Path:
    """The dataset as one tab-delimited text file (PostgreSQL's text format) for
    ``PostgresHook.bulk_load``: loaded once into a scratch table and dumped (not timed)."""
    scratch = "_tsv_scratch"
    create_target(conn, ds, scratch, "bare_unlogged")
    columns = sql.SQL(", ").join(map(sql.Identifier, ds.columns))
    statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv, HEADER true)").format(
        ds.ident(scratch), columns
    )
    with conn.cursor() as cur:
        for file in ds.files:
            with cur.copy(statement) as copy, open(file, "rb") as f:
                while block := f.read(1 << 20):
                    copy.write(block)
    with (
        conn.cursor() as cur,
        open(path, "wb") as out,
        cur.copy(sql.SQL("COPY {} ({}) TO STDOUT").format(ds.ident(scratch), columns)) as copy,
    ):
        for block in copy:
            out.write(block)
    drop_table(conn, ds, scratch)
    ds.tsv = path
    return path


def sizes(conn: Any, ds: Dataset, name: str) -> tuple[int, int, int]:
    """(row count, table bytes, index bytes) of a target."""
    ident = ds.ident(name)
    count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(ident)).fetchone()[0]
    regclass = f'"{ds.schema}"."{name}"'
    table_bytes, index_bytes = conn.execute(
        "SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)", (regclass, regclass)
    ).fetchone()
    return int(count), int(table_bytes), int(index_bytes)
