"""A database as the source: a query or a table on another database, read by the COPY step
straight into staging, behind the same :class:`~airflow_pg_bulk.source.formats.Format` the
steps use for files (chosen once by :mod:`airflow_pg_bulk.loading.sources`).

Two readers, chosen once per source from its URL's backend (:attr:`DatabaseSource.postgres`):

- **PostgreSQL** moves bytes, not rows: ``COPY (query) TO STDOUT`` on the source connection
  (psycopg2's ``copy_expert``, its per-row loop in C, writing into an OS pipe from a thread:
  :class:`airflow_pg_bulk.db.copy_out.CopyOut`) is streamed into ``COPY staging (...) FROM
  STDIN`` on the target connection (either driver, through
  :func:`airflow_pg_bulk.db.driver.copy_in`), both in PostgreSQL's text format: no value is
  parsed in Python and memory stays flat (one chunk at a time). The PostgreSQL path does not
  import SQLAlchemy (its URL is read by :func:`_pg_url`).
- **Any other database** (SQLite, MariaDB/MySQL, and whatever SQLAlchemy dialect is installed)
  streams rows from a server-side cursor (``stream_results``), fetched in batches straight
  from the DB-API cursor (``fetchmany``: the driver's tuples, no SQLAlchemy ``Row``:
  :class:`_Batches`) and sent through :func:`airflow_pg_bulk.db.driver.copy_rows`: a psycopg 3
  target encodes them in C (``Copy.write_row``: 0.5 µs per row of four columns, against 0.7
  for the column-wise Python encoder and 1.2 for the row-wise one,
  benchmarks/RESULTS-db-source.md), a psycopg2 target, which has no row writer, gets them
  encoded as COPY text column by column (:func:`airflow_pg_bulk.source.copy_text.batch`).
  Rows are counted per batch as they are read, for the row accounting.

What each COPY stream sees: without ``split_by`` one COPY stream reads the whole source in one
statement, so it sees one snapshot of the source. With ``split_by`` each range of the key
(:func:`airflow_pg_bulk.plan.planning.quantile_ranges`: cut at the key's quantiles, so a
skewed key still gives ranges of about equal row counts) is a statement of its own, in a
session of its own:

- **In one process** (the CLI, :func:`airflow_pg_bulk.runner.load`, ``dag.test()``), a
  PostgreSQL source's ranges all read one snapshot, as pgcopydb does: prepare opens a
  REPEATABLE READ session on the source, exports its snapshot (``pg_export_snapshot``), reads
  the key's quantiles in it, and holds it in this process (:func:`_export`); each range's
  session imports it (``SET TRANSACTION SNAPSHOT``); the holding session ends after the last
  range is read (or when the process exits: :func:`release_snapshots`).
- **As separate Airflow COPY tasks** (other processes, later), the prepare task's session has
  ended, so each range reads the source as of its own start: a row written on the source in
  between may be seen by one range and not another (or, its key moved across ranges, twice
  or never). The guarantee offered there is the query's own bound: a query bounded by the
  data interval (``updated_at < '{{ data_interval_end }}'``) leaves later writes outside every
  range. Other databases (SQLAlchemy) read each range in its own transaction, in-process too.

The rows read from the source must equal the rows COPY loaded, or the COPY stream fails; a
source that fails midway (a query error on a later row, a lost connection) fails the COPY
stream and its transaction is rolled back: staging keeps nothing of it and the target is
untouched.

The source URL may carry a password: it stays in this process (:func:`hold`); the plan (what
travels through XCom) names it masked, or by its Airflow connection id (resolved by the
operator in each task: :func:`hold_connection`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, quote_plus, unquote

from airflow_pg_bulk import sql
from airflow_pg_bulk.db import driver, source_driver, translate
from airflow_pg_bulk.db.copy_out import SOURCE_DRIVER, CopyOut
from airflow_pg_bulk.errors import (
    BadDataError,
    LoadRefusedError,
    PgBulkError,
    TransientLoadError,
    is_data_sqlstate,
    parse_copy_context,
)
from airflow_pg_bulk.plan import (
    BLOCKS,
    CopyOptions,
    DatabaseSource,
    LoadPlan,
    LoadRequest,
    Partition,
    Piece,
    TargetDefinition,
    planning,
)
from airflow_pg_bulk.source import copy_text, header, records
from airflow_pg_bulk.source.formats import Matched
from airflow_pg_bulk.source.listing import SourceFile
from airflow_pg_bulk.sql import source as source_sql

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: what the COPY into staging is given: PostgreSQL's text format, UTF-8
TEXT = CopyOptions(format="text")
#: rows fetched from the source's DB-API cursor at a time (one batch, one COPY chunk)
YIELD_PER = 10_000

# name (masked URL or Airflow connection id) -> the URL itself, in this process only
_HELD: dict[str, str] = {}


class SourceReadError(PgBulkError):
    """The source database failed while a COPY stream read it (or gave other rows than COPY
    loaded); nothing of the COPY stream was committed."""


def hold(url: str) -> str:
    """Keep ``url`` in this process for the COPY streams; return the name the plan carries
    (the URL with its password masked)."""
    name = masked(url)
    _HELD[name] = url
    return name


def hold_connection(conn_id: str, url: str) -> None:
    """Keep the URL an Airflow connection resolved to (in the operator's task), under its id."""
    _HELD[conn_id] = url


def masked(url: str) -> str:
    """``url`` with its password masked, as it may be logged and put in the plan (as
    SQLAlchemy renders it; a PostgreSQL URL without importing SQLAlchemy: :func:`_pg_url`)."""
    parts = _pg_url(url)
    if parts is not None:
        return _render(parts, hide_password=True)
    import sqlalchemy.engine

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        raise LoadRefusedError(
            "source_url must be a URL such as postgresql://user@host/db or sqlite:///path.db "
            f"(the URL given could not be read: {driver.redact(url, url)!r}); nothing was changed"
        ) from None


def _url(name: str) -> str:
    url = _HELD.get(name)
    if url is None:
        raise LoadRefusedError(
            f"the source database {name!r} is not known to this process: give source_url to "
            "this process, or, under Airflow, source_conn_id (its URL is resolved in each task)"
        )
    return url


def is_postgres(url: str) -> bool:
    """The URL names a PostgreSQL database (``postgresql://``, ``postgres://``,
    ``postgresql+psycopg://``, ...): read by COPY."""
    return _pg_url(url) is not None


def _libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as libpq reads it (the ``+driver`` part dropped)."""
    parts = _pg_url(url)
    assert parts is not None, "a PostgreSQL URL"
    return _render({**parts, "name": "postgresql"}, hide_password=False)


#: a SQLAlchemy URL's parts, as ``sqlalchemy.engine.url._parse_url`` reads them (its pattern)
_URL = re.compile(
    r"""
        (?P<name>[\w\+]+)://
        (?:
            (?P<username>[^:/]*)
            (?::(?P<password>[^@]*))?
        @)?
        (?:
            (?:
                \[(?P<ipv6host>[^/\?]+)\] |
                (?P<ipv4host>[^/:\?]+)
            )?
            (?::(?P<port>[^/\?]*))?
        )?
        (?:/(?P<database>[^\?]*))?
        (?:\?(?P<query>.*))?
    """,
    re.X,
)


def _pg_url(url: str) -> dict[str, Any] | None:
    """A PostgreSQL URL's parts read as SQLAlchemy reads them (``make_url``), without importing
    SQLAlchemy (0.12 s, which the PostgreSQL path needs for nothing else); None for a URL of
    another database, or not a URL."""
    found = _URL.match(url)
    if found is None or found["name"].split("+")[0] not in ("postgresql", "postgres"):
        return None
    parts: dict[str, Any] = found.groupdict()
    for key in ("username", "password", "database"):
        if parts[key] is not None:
            parts[key] = unquote(parts[key])
    parts["host"] = parts.pop("ipv4host") or parts.pop("ipv6host")
    parts.pop("ipv6host", None)
    query: dict[str, list[str]] = {}
    for key, value in parse_qsl(parts["query"] or ""):
        query.setdefault(key, []).append(value)
    parts["query"] = query
    return parts


def _render(parts: dict[str, Any], hide_password: bool) -> str:
    """:func:`_pg_url`'s parts as SQLAlchemy's ``URL.render_as_string`` writes them."""
    text = parts["name"] + "://"
    if parts["username"] is not None:
        text += quote(parts["username"], safe=" +")
        if parts["password"] is not None:
            text += ":" + ("***" if hide_password else quote(parts["password"], safe=" +"))
        text += "@"
    host = parts["host"]
    if host is not None:
        text += f"[{host}]" if ":" in host else host
    if parts["port"]:
        text += ":" + str(int(parts["port"]))
    if parts["database"] is not None:
        text += "/" + quote(parts["database"], safe=" +/")
    if parts["query"]:
        text += "?" + "&".join(
            f"{quote_plus(key)}={quote_plus(value)}"
            for key in sorted(parts["query"])
            for value in parts["query"][key]
        )
    return text


# --- connections ------------------------------------------------------------------------------


@contextlib.contextmanager
def _postgres(
    name: str, snapshot: str | None = None, driver_name: str = "psycopg"
) -> Iterator[Any]:
    """A read-only session on a PostgreSQL source (psycopg 3's, or ``driver_name``'s), in
    UTF-8; its transaction in ``snapshot`` (exported by the session :func:`_export` holds)
    when one is given."""
    conn = _open_postgres(name, driver_name)
    try:
        if snapshot is not None:
            driver.execute(conn, source_sql.repeatable_read())
            driver.execute(conn, source_sql.set_snapshot(snapshot))
        yield conn
    finally:
        driver.close_cancelling(conn)


def _open_postgres(name: str, driver_name: str = "psycopg") -> Any:
    url = _url(name)
    try:
        conn = driver.connect(
            _libpq_url(url), driver_name, application_name="airflow-pg-bulk source"
        )
    except PgBulkError as exc:
        raise type(exc)(f"source {name}: {exc}; nothing was changed") from None
    try:
        driver.execute(conn, sql.set_config("default_transaction_read_only", "on"))
        driver.execute(conn, sql.set_config("client_encoding", "UTF8"))
        conn.commit()  # a snapshot is set only as a transaction's first statement
    except BaseException:
        driver.close_cancelling(conn)
        raise
    return conn


@dataclass
class _Held:
    """A source session holding an exported snapshot, until its ranges are all read."""

    conn: Any
    ranges: int = 0


# snapshot id -> the session that exported it, in this process only
_SNAPSHOTS: dict[str, _Held] = {}
_SNAPSHOTS_LOCK = threading.Lock()


def _export(source: DatabaseSource, count: int) -> tuple[str, tuple[Any, ...]]:
    """Open a session on a PostgreSQL source, export its snapshot and hold it in this process;
    the split key's quantiles read in that snapshot (:func:`_postgres_quantiles`). Returns
    ``(snapshot, (min, cut, cut, ...))``."""
    assert source.split_by is not None
    conn = _open_postgres(source.name)
    try:
        driver.execute(conn, source_sql.repeatable_read())
        snapshot = driver.execute(conn, source_sql.export_snapshot())[0][0]
        quantiles = _postgres_quantiles(conn, source, count)
    except BaseException:
        driver.close_cancelling(conn)
        raise
    with _SNAPSHOTS_LOCK:
        _SNAPSHOTS[snapshot] = _Held(conn)
    exported = getattr(_PREPARING, "exported", None)
    if exported is not None:
        exported.append(snapshot)
    return snapshot, quantiles


#: the snapshots a prepare running in this thread exported (:func:`snapshots_released`)
_PREPARING = threading.local()


@contextlib.contextmanager
def snapshots_released(*, unless_prepared: bool) -> Iterator[None]:
    """Around a prepare or a preview: a snapshot it exported in this thread is released when
    it ends, or, ``unless_prepared``, only when it fails (a refusal after the source was read,
    such as an upsert key that is not unique), since a prepared plan's COPY streams read it.
    The session holding it would otherwise stay open until the process ends, holding back
    vacuum on the source."""
    outer = getattr(_PREPARING, "exported", None)
    mine: list[str] = []
    _PREPARING.exported = mine
    prepared = False
    try:
        yield
        prepared = unless_prepared
    finally:
        _PREPARING.exported = outer
        if not prepared:
            for snapshot in mine:
                _release(snapshot)


def _postgres_quantiles(conn: Any, source: DatabaseSource, count: int) -> tuple[Any, ...]:
    """A PostgreSQL source's split key cut into ``count`` ranges of about equal row counts:
    ``(min, cut, ...)``. For a table whose column ANALYZE gave a histogram covering every
    row, its bounds (no row read: the ranges as even as the statistics are fresh); otherwise
    ``ntile`` over the rows (:func:`airflow_pg_bulk.sql.source.key_quantiles`)."""
    assert source.split_by is not None
    if source.by_blocks:
        assert source.table is not None  # (match refused a query)
        if driver.server_version(conn) < 140000:
            raise LoadRefusedError(
                f"split_by={BLOCKS!r} reads ranges of a table's blocks by TID range scans, "
                f"which need PostgreSQL 14 or later; the source {source.name} is older. Split "
                "by a column instead; nothing was changed"
            )
        blocks = int(driver.scalar(conn, source_sql.block_count(source.table)))
        return (0, *(blocks * i // count for i in range(1, count)))
    if source.table is not None and count > 1:
        found = driver.execute(conn, source_sql.key_histogram(source.table, source.split_by))
        bounds = [_statistic_value(v) for v in found[0][0]] if found else []
        if len(bounds) >= count:
            last = len(bounds) - 1
            return (bounds[0], *(bounds[i * last // count] for i in range(1, count)))
    select = source_sql.source_select(source.query, source.table)
    firsts = driver.execute(conn, source_sql.key_quantiles(select, source.split_by, count))
    return tuple(row[0] for row in firsts) or (None,)


def _statistic_value(text: str) -> Any:
    """A histogram bound (text) as the key's value: an integer, or the date's or timestamp's
    ISO text (:func:`airflow_pg_bulk.plan.planning.quantile_ranges` reads both)."""
    try:
        return int(text)
    except ValueError:
        return text


def _held(snapshot: str | None) -> str | None:
    """``snapshot`` if this process holds it (in-process ranges); else None: an Airflow COPY
    task in another process reads in a snapshot of its own (see the module's docstring)."""
    with _SNAPSHOTS_LOCK:
        return snapshot if snapshot in _SNAPSHOTS else None


def _range_done(snapshot: str | None) -> None:
    """One range of ``snapshot`` read (or failed): after the last, the holding session ends."""
    with _SNAPSHOTS_LOCK:
        held = _SNAPSHOTS.get(snapshot) if snapshot else None
        if held is None:
            return
        held.ranges -= 1
        if held.ranges > 0:
            return
        del _SNAPSHOTS[snapshot]  # type: ignore[arg-type]
    driver.close_cancelling(held.conn)


def release_snapshot(source: DatabaseSource | None) -> None:
    """End the session holding the snapshot of ``source`` (a load's database source, or
    None), if this process still holds it: a load whose ranges were not all read (one failed
    and the others never started) would otherwise keep it, and with it the source's oldest
    snapshot (no vacuum behind it), until the process ends."""
    if source is not None and source.snapshot:
        _release(source.snapshot)


def _release(snapshot: str) -> None:
    with _SNAPSHOTS_LOCK:
        held = _SNAPSHOTS.pop(snapshot, None)
    if held is not None:
        driver.close_cancelling(held.conn)


@atexit.register
def release_snapshots() -> None:
    """End every session still holding a snapshot (a load that stopped before its ranges
    were all read)."""
    with _SNAPSHOTS_LOCK:
        held = list(_SNAPSHOTS.values())
        _SNAPSHOTS.clear()
    for each in held:
        driver.close_cancelling(each.conn)


@contextlib.contextmanager
def _alchemy(name: str, copy: bool = False) -> Iterator[Any]:
    """A SQLAlchemy connection to another database; for the COPY step's reading (``copy``),
    its driver asked for values as the server's text where that is COPY's text
    (:func:`airflow_pg_bulk.db.source_driver.copy_connect_args`)."""
    import sqlalchemy

    url = _url(name)
    try:
        driver_name = sqlalchemy.engine.make_url(url).get_driver_name()
        connect_args = source_driver.copy_connect_args(driver_name) if copy else {}
        engine = sqlalchemy.create_engine(url, connect_args=connect_args)
    except Exception as exc:
        raise LoadRefusedError(
            f"source {name}: cannot use the URL ({driver.redact(str(exc), url)}); "
            "nothing was changed"
        ) from None
    try:
        try:
            conn = engine.connect()
        except Exception as exc:
            raise TransientLoadError(
                f"source {name}: cannot connect to the database: {_reason(exc, url)}; "
                "nothing was changed"
            ) from None
        with conn:
            yield conn
    finally:
        engine.dispose()


def _reason(exc: BaseException, url: str) -> str:
    """A source driver's error in words: its first line, the password masked."""
    cause = getattr(exc, "orig", None) or exc
    text = str(cause).strip().split("\n")[0] or type(cause).__name__
    return driver.redact(text, url)


# --- the format -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatabaseFormat:
    """A query or table on another database, as prepare and the COPY step use it (the
    :class:`~airflow_pg_bulk.source.formats.Format` protocol).

    :param source: what is read, and where (its columns unknown until :meth:`match`).
    :param ranges: with ``split_by``, how many ranges to cut its key into (``partitions``)."""

    source: DatabaseSource
    ranges: int = 1

    @classmethod
    def of_request(cls, request: LoadRequest) -> DatabaseFormat:
        """The database source a request names (its URL held in this process, or its Airflow
        connection id, whose URL the operator holds)."""
        if request.source_url:
            name = hold(request.source_url)
        else:
            assert request.source_conn_id is not None  # the request checked it
            name = request.source_conn_id
        postgres = is_postgres(_url(name))
        return cls(
            DatabaseSource(
                name,
                postgres,
                request.query,
                request.source_table,
                split_by=request.split_by or None,
            ),
            ranges=request.partitions or 1,
        )

    @property
    def copy(self) -> CopyOptions:
        """What COPY into staging is given: text."""
        return TEXT

    def refuse_unsupported(self, request: LoadRequest) -> None:
        """Nothing more: the request refused what files alone take."""

    def list_files(self, request: LoadRequest) -> list[SourceFile]:
        """No files."""
        return []

    def match(self, files: Sequence[SourceFile], loadable: Sequence[str]) -> Matched:
        """The source's column names (its query run with ``LIMIT 0``, or SQLAlchemy's result
        keys), each matched to one of the table's ``loadable`` columns by name (exactly, then
        case-insensitively). A query that fails, or a column that matches none, is refused
        here, before anything is made."""
        names, types = source_description(self.source)
        matched = match_names(names, loadable, self.source.name)
        if self.source.by_blocks and not (self.source.postgres and self.source.table):
            raise LoadRefusedError(
                f"split_by={BLOCKS!r} cuts a PostgreSQL table into ranges of its blocks: it "
                f"needs source_table on a PostgreSQL source, not {self.source.describe()}; "
                "nothing was changed"
            )
        if self.source.split_by and not self.source.by_blocks and self.source.split_by not in names:
            raise LoadRefusedError(
                f"split_by {self.source.split_by!r} is not a column of the source "
                f"{self.source.name} (its columns: {list(names)}); nothing was changed"
            )
        source = dataclasses.replace(self.source, columns=names, types=types)
        quantiles = None
        if source.split_by and source.postgres:
            snapshot, quantiles = _export(source, self.ranges)
            source = dataclasses.replace(source, snapshot=snapshot)
        elif source.split_by:
            quantiles = key_quantiles(source, self.ranges)
        return Matched(tuple(matched), database=source, key_bounds=quantiles)

    def columns(
        self, request: LoadRequest, target: TargetDefinition, matched: Matched
    ) -> tuple[str, ...]:
        """The target columns the source's columns matched, in the source's order."""
        return matched.names

    def cut(
        self, files: Sequence[SourceFile], partitions: int, matched: Matched
    ) -> list[Partition]:
        """One COPY stream: the whole query, read in one statement (one snapshot); split by a
        column, one per range of it between its quantiles
        (:func:`airflow_pg_bulk.plan.planning.quantile_ranges`: about equal row counts, a
        skewed key too), each read in a statement of its own."""
        ranges: list[tuple[Any, Any]] = [(None, None)]
        if matched.key_bounds is not None:
            ranges = planning.quantile_ranges(matched.key_bounds[0], matched.key_bounds[1:])
        source = matched.database
        if source is not None and source.snapshot in _SNAPSHOTS:
            _SNAPSHOTS[source.snapshot].ranges = len(ranges)  # type: ignore[index]
        return [
            Partition(i, (Piece(self.source.name, key_range=bounds),), 0)
            for i, bounds in enumerate(ranges)
        ]

    @property
    def copy_options(self) -> CopyOptions:
        """Text: what ``COPY ... TO STDOUT`` writes and :mod:`.copy_text` encodes."""
        return TEXT

    @property
    def sends_bytes(self) -> bool:
        """False: the COPY step calls :func:`copy_piece`."""
        return False

    def marker_rule(self, server_version: int) -> records.MarkerRule | None:
        """None: every value's backslash is escaped, so no marker can occur."""
        return None


def source_columns(source: DatabaseSource) -> tuple[str, ...]:
    """The source's column names, in its order; its query is run without rows first, so one
    that cannot run fails before anything is made."""
    return source_description(source)[0]


def source_description(source: DatabaseSource) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The source's column names, in its order, and for a PostgreSQL source their exact types
    (:attr:`DatabaseSource.types`; another database's: empty). Its query is run without rows
    first, so one that cannot run fails before anything is made."""
    if source.postgres:
        with _postgres(source.name) as conn:  # (psycopg 3: its result's type modifiers)
            statement = source_sql.no_rows(source_sql.source_select(source.query, source.table))
            try:
                with driver.plain_cursor(conn) as cur:
                    cur.execute(statement)
                    names = tuple(d.name for d in cur.description)
                    result = cur.pgresult
                    oids = [result.ftype(i) for i in range(len(names))]
                    modifiers = [result.fmod(i) for i in range(len(names))]
                types = driver.scalar(conn, source_sql.exact_types(oids, modifiers))
                return names, tuple(types)
            except Exception as exc:
                raise _query_refused(source, _reason(exc, _url(source.name))) from None
    with _alchemy(source.name) as conn:
        try:
            result = conn.execute(source_sql.alchemy_no_rows(source.query, source.table))
            try:
                return tuple(result.keys()), ()
            finally:
                result.close()
        except Exception as exc:
            raise _query_refused(source, _reason(exc, _url(source.name))) from None


def key_quantiles(source: DatabaseSource, count: int) -> tuple[Any, ...]:
    """The split key of a source read through SQLAlchemy cut into ``count`` ranges of about
    equal row counts: ``(min, cut, ...)``, the smallest key of each ``ntile`` bucket (a
    PostgreSQL source's are read in its exported snapshot: :func:`_export`)."""
    assert source.split_by is not None
    try:
        with _alchemy(source.name) as conn:
            statement = source_sql.alchemy_key_quantiles(
                source.query, source.table, source.split_by, count
            )
            firsts = tuple(row[0] for row in conn.execute(statement))
    except PgBulkError:
        raise
    except Exception as exc:
        raise _query_refused(source, _reason(exc, _url(source.name))) from None
    return firsts or (None,)


def _query_refused(source: DatabaseSource, reason: str) -> LoadRefusedError:
    what = f"table {source.table}" if source.table else "query"
    return LoadRefusedError(
        f"the source {what} on {source.name} cannot be read: {reason}. Nothing was changed; "
        f"fix the {'source_table' if source.table else 'query'} and run the load again"
    )


def match_names(names: Sequence[str], loadable: Sequence[str], where: str) -> list[str]:
    """Each source column's target column, by name (:func:`.header.match_columns`: exactly,
    else case-insensitively when that names one column); refused in the query's words."""
    try:
        return header.match_columns(names, loadable, what=f"the source {where}:")
    except LoadRefusedError as exc:
        raise LoadRefusedError(
            f"{exc}. Nothing was changed; rename the source's columns in the query "
            "(SELECT x AS y) or leave them out"
        ) from None


# --- the COPY step ----------------------------------------------------------------------------


def copy_piece(
    conn: Any,
    plan: LoadPlan,
    piece: Piece,
    progress: Any = None,
    done: int = 0,
    expected: int = 0,
) -> tuple[int, int]:
    """COPY the source's rows into staging, in the caller's transaction (the signature of
    :func:`airflow_pg_bulk.loading.parquet_copy.copy_piece`). Returns ``(rows, bytes)``.

    :raises SourceReadError: the source failed midway, or its row count is not COPY's.
    :raises BadDataError: a value the target's column does not take."""
    source = plan.database
    assert source is not None
    bounds = (piece.key_range or (None, None))[:2]
    t = plan.target
    statement = sql.copy_from_stdin(t.schema, plan.staging_table, plan.columns, TEXT)
    how = "a server-side cursor"
    if source.postgres:
        try:
            moved = _copy_postgres_binary(conn, plan, bounds) if _moves_binary(plan) else None
            how = "binary COPY TO STDOUT"
            if moved is None:  # (not binary, or its rows refused: read again as text)
                moved = _copy_postgres(conn, plan, bounds, statement)
                how = "COPY TO STDOUT"
            loaded, read, sent = moved
        finally:
            _range_done(source.snapshot)
    else:
        with _alchemy(source.name, copy=True) as src:
            result = src.execution_options(stream_results=True).execute(
                source_sql.alchemy_key_range(
                    source.query, source.table, source.split_by or "", *bounds
                )
            )
            batches = _Batches(result)
            loaded, sent = _copy_in(
                plan,
                lambda rows: driver.copy_rows(conn, statement, rows, copy_text.of_batches),
                batches,
                bounds,
            )
            read = batches.rows
    if read != loaded:
        raise SourceReadError(
            f"Load {plan.load_id}: the source {source.name} gave {read} rows but COPY "
            f"loaded {loaded} into {t.qualified}; nothing of this COPY stream was committed"
        )
    log.info(
        "Load %s: read %d rows (%.1f MB) from %s%s by %s",
        plan.load_id,
        loaded,
        sent / 1e6,
        source.name,
        _range_text(source, bounds),
        how,
    )
    return loaded, sent


def _moves_binary(plan: LoadPlan) -> bool:
    """Whether a PostgreSQL source's rows move in the binary format
    (:meth:`DatabaseSource.binary_into` the loaded columns' types): no value is printed as
    text by the source and parsed again by the target (a float's shortest exact text is
    the costliest: 2.2x the time of the whole COPY pair for workload A, see
    benchmarks/RESULTS-db-source.md)."""
    source = plan.database
    assert source is not None
    by_name = {c.name: c.type for c in plan.target.columns}
    return source.binary_into([by_name.get(name, "") for name in plan.columns])


def _copy_postgres(
    conn: Any, plan: LoadPlan, bounds: tuple[Any, Any], statement: Any, binary: bool = False
) -> tuple[int, int | None, int]:
    """A PostgreSQL source's range read by ``COPY ... TO STDOUT`` and its bytes streamed into
    ``statement`` on ``conn``; (rows loaded, rows the source sent, bytes)."""
    source = plan.database
    assert source is not None
    if source.by_blocks:
        assert source.table is not None
        select = source_sql.block_range(source.table, *bounds)
    else:
        select = source_sql.key_range(
            source_sql.source_select(source.query, source.table), source.split_by or "", *bounds
        )
    with (
        _postgres(source.name, _held(source.snapshot), SOURCE_DRIVER) as src,
        CopyOut(src, source_sql.copy_out(select, binary=binary)) as reader,
    ):
        loaded = _copy_in(
            plan, lambda chunks: driver.copy_in(conn, statement, chunks), reader, bounds
        )
    return loaded, reader.rows, reader.bytes


_BINARY = "pgbulk_binary"


def _copy_postgres_binary(
    conn: Any, plan: LoadPlan, bounds: tuple[Any, Any]
) -> tuple[int, int | None, int] | None:
    """:func:`_copy_postgres` in the binary format, under a savepoint. None when the target
    refused a value (the savepoint undoes the rows): the caller reads the range again as
    text, whose error names the row, the column and the value (binary COPY's names no
    value), or which loads it after all."""
    t = plan.target
    statement = source_sql.copy_binary_in(t.schema, plan.staging_table, plan.columns)
    driver.execute(conn, sql.savepoint(_BINARY))
    try:
        moved = _copy_postgres(conn, plan, bounds, statement, binary=True)
    except BadDataError as exc:
        driver.execute(conn, sql.rollback_to(_BINARY))
        log.info(
            "Load %s: the binary COPY was refused (%s); the rows are read again as text",
            plan.load_id,
            exc,
        )
        return None
    driver.execute(conn, sql.release(_BINARY))
    return moved


class _Batches:
    """A SQLAlchemy result's rows in batches of :data:`YIELD_PER`, counted as they go
    (:attr:`rows`), read from its DB-API cursor (``fetchmany``: the driver's own tuples), not
    through SQLAlchemy's ``Row`` objects: the statement is compiled, bound and executed by
    SQLAlchemy (the dialect's server-side cursor included), only the fetching bypasses it.
    1,000,000 SQLite rows of four columns took 0.76 s to fetch and 0.35 s more to become
    ``Row`` objects (benchmarks/RESULTS-db-source.md). The result's statements are ``text()``
    or ``SELECT *`` of no typed column, so SQLAlchemy had no value to convert.

    The first row is taken through SQLAlchemy: a server-side cursor's result buffers one row
    ahead when it is made (``BufferedRowCursorFetchStrategy``, "fetches only one row
    initially"); ``fetchmany(1)`` hands that row over, and leaves nothing buffered."""

    def __init__(self, result: Any) -> None:
        self._result = result
        self.rows = 0

    def __iter__(self) -> Iterator[Sequence[Sequence[Any]]]:
        first = self._result.fetchmany(1)
        if not first:
            return
        fetch = self._result.cursor.fetchmany
        batch = [tuple(first[0]), *fetch(YIELD_PER - 1)]
        while batch:
            self.rows += len(batch)
            yield batch
            batch = fetch(YIELD_PER)
        self._result.close()


def _range_text(source: DatabaseSource, bounds: tuple[Any, Any]) -> str:
    """``, day in [2026-01-01, 2026-01-02)`` for a split source's range (the first:
    ``day < 2026-01-02 or NULL``, the last: ``day >= 2026-01-02``); empty otherwise."""
    key = "blocks" if source.by_blocks else source.split_by
    low, high = bounds
    if not key or (low is None and high is None):
        return ""
    if source.by_blocks:
        return (
            f", blocks {'0' if low is None else low} to {'the last' if high is None else high - 1}"
        )
    if low is None:
        return f", {key} < {high} or NULL"
    if high is None:
        return f", {key} >= {low}"
    return f", {key} in [{low}, {high})"


def _copy_in(
    plan: LoadPlan,
    copy: Callable[[Iterable[Any]], _T],
    data: Iterable[Any],
    bounds: tuple[Any, Any] = (None, None),
) -> _T:
    """``copy(data)`` (the source's chunks or batches of rows into the target's COPY); a
    failure of the source named as one."""
    source = plan.database
    assert source is not None
    failed: list[BaseException] = []

    def guarded() -> Iterator[Any]:
        try:
            yield from data
        except Exception as exc:
            failed.append(exc)
            raise

    try:
        return copy(guarded())
    except Exception as exc:
        if failed:
            raise SourceReadError(
                f"Load {plan.load_id}: the source {source.name}{_range_text(source, bounds)} "
                "failed while it was read: "
                f"{_reason(failed[0], _url(source.name))}. Nothing of this COPY stream was "
                f"committed; {plan.target.qualified} is unchanged"
            ) from None
        if isinstance(exc, driver.RowNotEncoded):  # refused by the driver, not the server
            column = plan.columns[exc.column] if exc.column is not None else None
            shown = None if exc.column is None else copy_text.field(exc.value)
            where = f"source {source.name}{_range_text(source, bounds)}"
            where += f", row {exc.row} of its COPY stream"
            where += _rejected_key(plan, bounds, exc.row, column, shown)
            err = driver.ServerError(None, str(exc), None, None, None)
            raise translate.bad_value(
                err, plan, source.name, where, column, shown, exc.row
            ) from None
        if driver.is_database_error(exc):
            err = driver.server_error(exc)
            if is_data_sqlstate(err.sqlstate):  # a value the target's column does not take
                row, column, value = parse_copy_context(err.context)
                where = f"source {source.name}{_range_text(source, bounds)}"
                where += f", row {row} of its COPY stream" if row is not None else ""
                where += _rejected_key(plan, bounds, row, column, value)
                raise translate.bad_value(
                    err, plan, source.name, where, column, value, row
                ) from None
        raise


def _rejected_key(
    plan: LoadPlan,
    bounds: tuple[Any, Any],
    row: int | None,
    column: str | None,
    value: str | None,
) -> str:
    """``", id = 2998"``: the split key of the row COPY rejected, re-read from the source (its
    row ``row`` of the range, in the order the source returns it; in the held snapshot for a
    PostgreSQL source read in-process). Said only when the re-read row's value in the
    rejected column is the one COPY rejected (a source whose order changed in between gives
    nothing rather than a wrong key); empty without a split key, or when it cannot be read."""
    source = plan.database
    assert source is not None
    if not source.split_by or source.by_blocks or row is None or value is None:
        return ""
    if column not in plan.columns:
        return ""
    name = source.columns[plan.columns.index(column)] if source.columns else column
    try:
        if source.postgres:
            select = source_sql.key_range(
                source_sql.source_select(source.query, source.table), source.split_by, *bounds
            )
            with _postgres(source.name, _held(source.snapshot)) as src:
                found = driver.execute(
                    src, source_sql.row_at(select, source.split_by, name, row - 1)
                )
            key, text = found[0] if found else (None, None)
        else:
            statement = source_sql.alchemy_row_at(
                source.query, source.table, source.split_by, name, bounds, row - 1
            )
            with _alchemy(source.name) as src:
                key, got = src.execute(statement).one()
            text = got if isinstance(got, str) else copy_text.field(got)
    except Exception as exc:
        log.info("Load %s: the rejected row's key could not be re-read: %s", plan.load_id, exc)
        return ""
    shown = value[:-3] if value.endswith("...") else value  # the server truncates long values
    if text is None or not text.startswith(shown) or (shown == value and text != value):
        return ""
    return f", {source.split_by} = {key}"


# --- create_target ----------------------------------------------------------------------------


#: a source's schema as create_target takes it: ``(name, PostgreSQL type text, NOT NULL)`` per
#: column, and the primary key's columns in key order (may be empty)
Schema = tuple[list[tuple[str, str, bool]], list[str]]


def source_schema(source: DatabaseSource, table: str) -> tuple[Schema, str]:
    """``create_target``'s columns and key from a database source, for the missing target
    ``table``, and the source in words: a PostgreSQL source's exact types (``format_type`` of
    each result column's type and modifier: numeric precision, arrays, json, timestamptz), an
    enum as ``text`` (its type is not on the target); another database's ``source_table`` as
    SQLAlchemy reflects it (:func:`_alchemy_schema`); for ``source_table`` also its NOT NULL
    columns and primary key."""
    if not source.postgres and source.table is None:
        raise LoadRefusedError(
            f"target table {table} does not exist, and create_target takes the types "
            f"of a query's columns from a PostgreSQL source only (the source {source.name} is "
            "not PostgreSQL); nothing was changed. Give source_table (its declared types are "
            "mapped through SQLAlchemy), or create the table first"
        )
    schema = _source_schema(source) if source.postgres else _alchemy_schema(source)
    return schema, source.describe()


def _source_schema(source: DatabaseSource) -> Schema:
    """The source's result columns (name, type text, NOT NULL) and primary key columns."""
    select = source_sql.source_select(source.query, source.table)
    with _postgres(source.name) as conn:
        try:
            with driver.plain_cursor(conn) as cur:
                cur.execute(source_sql.no_rows(select))
                result = cur.pgresult
                names = [d.name for d in cur.description]
                oids = [result.ftype(i) for i in range(len(names))]
                mods = [result.fmod(i) for i in range(len(names))]
            rendered = driver.execute(conn, source_sql.column_types(oids, mods))
            keys = driver.execute(conn, source_sql.table_keys(source.table)) if source.table else []
        except Exception as exc:
            raise _query_refused(source, _reason(exc, _url(source.name))) from None
    not_null = {name for name, nn, _ in keys if nn}
    key = [name for name, _, _ in sorted((k for k in keys if k[2] is not None), key=lambda k: k[2])]
    columns = [
        (
            name,
            ("text[]" if enum_array else "text") if enum or enum_array else text,
            name in not_null,
        )
        for name, (text, enum, enum_array) in zip(names, rendered, strict=True)
    ]
    return columns, key


def _postgres_type(declared: Any) -> Any:
    """A reflected column type as the generic SQLAlchemy type PostgreSQL's dialect renders:
    its ``as_generic()``, except where that would lose values or not be PostgreSQL: an
    unsigned integer (MySQL) one size wider (``int unsigned`` -> ``bigint``, ``bigint
    unsigned`` -> ``numeric(20)``), an enum as ``text`` (its type is not on the target, as for
    a PostgreSQL source), a string without the source's collation (``utf8mb4_bin``)."""
    import sqlalchemy

    generic = declared.as_generic()
    if isinstance(generic, sqlalchemy.Enum):
        return sqlalchemy.Text()
    if getattr(declared, "unsigned", False) and isinstance(generic, sqlalchemy.Integer):
        if isinstance(generic, sqlalchemy.BigInteger):
            return sqlalchemy.Numeric(20, 0)
        if isinstance(generic, sqlalchemy.SmallInteger):
            return sqlalchemy.Integer()
        return sqlalchemy.BigInteger()
    if getattr(generic, "collation", None):
        generic.collation = None
    return generic


def _alchemy_schema(source: DatabaseSource) -> Schema:
    """Another database's table, as SQLAlchemy reflects it: each column's declared type made
    generic (``BLOB`` -> ``LargeBinary``: :func:`_postgres_type`) and rendered by
    SQLAlchemy's PostgreSQL dialect (``bytea``, ``NUMERIC(10, 2)``, ``VARCHAR(20)``,
    ``TIMESTAMP WITHOUT TIME ZONE``); a column with no type SQLAlchemy knows is refused, not
    guessed. NOT NULL and the primary key from the reflection."""
    import sqlalchemy
    from sqlalchemy.dialects import postgresql

    assert source.table is not None
    schema, _, name = source.table.rpartition(".")
    with _alchemy(source.name) as conn:
        try:
            found = sqlalchemy.inspect(conn)
            reflected = found.get_columns(name, schema=schema or None)
            key = list(found.get_pk_constraint(name, schema=schema or None)["constrained_columns"])
        except Exception as exc:
            raise _query_refused(source, _reason(exc, _url(source.name))) from None
    dialect = postgresql.dialect()
    columns = []
    for column in reflected:
        try:
            rendered = _postgres_type(column["type"]).compile(dialect=dialect)
        except Exception:
            raise LoadRefusedError(
                f"create_target: the source column {column['name']} of {source.table} has a "
                f"type ({column['type']!r}) with no PostgreSQL equivalent SQLAlchemy knows; "
                "nothing was changed. Create the target table first"
            ) from None
        columns.append((column["name"], rendered, not column["nullable"] or column["name"] in key))
    return columns, key
