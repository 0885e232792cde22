"""The peer tools, from Debian packages: pgloader (CSV files -> table) and pgcopydb (a DB->DB
clone of the loaded table). Each returns the command it ran and writes a command/filter file
into the work directory; the caller runs and measures it."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from benchmarks.workloads import Dataset


@dataclass(frozen=True)
class PgloaderConfig:
    """One set of pgloader options."""

    key: str
    label: str
    with_options: tuple[str, ...] = ()
    set_options: tuple[str, ...] = ()
    note: str = ""


PGLOADER_CONFIGS = [
    PgloaderConfig("pgloader_default", "pgloader, default options (workers 8, concurrency 2)"),
    PgloaderConfig(
        "pgloader_tuned",
        "pgloader, workers 4, concurrency 2, batch rows 50,000, prefetch 200,000, "
        "drop indexes, maintenance_work_mem 512MB, synchronous_commit off",
        (
            "workers = 4",
            "concurrency = 2",
            "batch rows = 50000",
            "prefetch rows = 200000",
            "drop indexes",
        ),
        ("maintenance_work_mem to '512MB'", "synchronous_commit to 'off'"),
    ),
    PgloaderConfig(
        "pgloader_unsafe",
        "pgloader, as tuned + disable triggers (FKs never checked: unsafe)",
        (
            "workers = 4",
            "concurrency = 2",
            "batch rows = 50000",
            "prefetch rows = 200000",
            "drop indexes",
            "disable triggers",
        ),
        ("maintenance_work_mem to '512MB'", "synchronous_commit to 'off'"),
        note="FK not checked",
    ),
]


def available(tool: str) -> str | None:
    """The tool's path, if installed."""
    return shutil.which(tool)


def pgloader_uri(dsn: str) -> str:
    """pgloader's connection string for a libpq DSN (TCP, or ``unix:`` for a socket dir)."""
    params = conninfo_to_dict(dsn)
    user = params.get("user", "postgres")
    password = params.get("password")
    auth = f"{user}:{password}" if password else user
    host = params.get("host", "localhost")
    port = params.get("port", "5432")
    dbname = params.get("dbname", "postgres")
    if host.startswith("/"):
        return f"postgresql://{auth}@unix:{host}:{port}/{dbname}"
    return f"postgresql://{auth}@{host}:{port}/{dbname}"


def pgloader_command(
    ds: Dataset, table: str, config: PgloaderConfig, dsn: str, workdir: Path
) -> tuple[list[str], Path]:
    """The ``pgloader`` command and its load file for loading all of ``ds``'s CSV files."""
    directory = ds.files[0].parent
    suffix = re.escape(ds.files[0].suffix)
    fields = ", ".join(f"{c} [null if blanks]" for c in ds.columns)
    with_clause = ", ".join(
        [
            "skip header = 1",
            "fields terminated by ','",
            "fields optionally enclosed by '\"'",
            "fields escaped by double-quote",
            *config.with_options,
        ]
    )
    text = (
        "LOAD CSV\n"
        f"   FROM ALL FILENAMES MATCHING ~/{suffix}$/ IN DIRECTORY '{directory}'\n"
        f"   HAVING FIELDS ({fields})\n"
        f"INTO {pgloader_uri(dsn)}\n"
        f"   TARGET TABLE {ds.schema}.{table}\n"
        f"   TARGET COLUMNS ({', '.join(ds.columns)})\n"
        f"WITH {with_clause}\n"
    )
    if config.set_options:
        text += f"SET {', '.join(config.set_options)}\n"
    text += ";\n"
    path = workdir / f"{ds.key}-{config.key}.load"
    path.write_text(text)
    return ["pgloader", "--no-ssl-cert-verification", str(path)], path


@dataclass
class PgcopydbJob:
    """A pgcopydb clone of one table (and the tables it references) into another database."""

    command: list[str]
    source_db: str
    target_db: str
    directory: Path
    options: list[str] = field(default_factory=list)


def with_dbname(dsn: str, dbname: str) -> str:
    """The DSN with another database."""
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return " ".join(f"{k}='{v}'" for k, v in params.items())


def pgcopydb_uri(dsn: str) -> str:
    """pgcopydb wants a URI; socket directories go in the ``host`` query parameter."""
    params = conninfo_to_dict(dsn)
    user = params.get("user", "postgres")
    host = params.get("host", "localhost")
    port = params.get("port", "5432")
    dbname = params.get("dbname", "postgres")
    if host.startswith("/"):
        return f"postgresql://{user}@/{dbname}?host={host}&port={port}"
    return f"postgresql://{user}@{host}:{port}/{dbname}"


def pgcopydb_job(ds: Dataset, dsn: str, workdir: Path, *, jobs: int, split: str) -> PgcopydbJob:
    """``pgcopydb clone`` of a source database holding only the workload's loaded tables into
    a fresh database on the same server.

    (pgcopydb 0.10 with ``--filters [include-only-table]`` still restores the identity
    sequence of a table it filtered out and fails; a database of its own avoids filters.)"""
    source_db = f"bench_pgcopydb_src_{ds.key.lower()}"
    target_db = f"bench_pgcopydb_dst_{ds.key.lower()}"
    directory = workdir / f"pgcopydb-{ds.key}"
    shutil.rmtree(directory, ignore_errors=True)
    options = [
        f"--table-jobs {jobs}",
        f"--index-jobs {jobs}",
        f"--split-tables-larger-than {split}",
        "--no-owner",
        "--no-acl",
        "--skip-extensions",
    ]
    command = [
        "pgcopydb",
        "clone",
        "--source",
        pgcopydb_uri(with_dbname(dsn, source_db)),
        "--target",
        pgcopydb_uri(with_dbname(dsn, target_db)),
        "--dir",
        str(directory),
        "--table-jobs",
        str(jobs),
        "--index-jobs",
        str(jobs),
        "--split-tables-larger-than",
        split,
        "--no-owner",
        "--no-acl",
        "--skip-extensions",
    ]
    return PgcopydbJob(command, source_db, target_db, directory, options)
