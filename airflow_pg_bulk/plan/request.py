"""What the user asked for: LoadRequest and its parts (CopyOptions, Settings, ErrorPolicy), made
from flat keyword options by :func:`request_from_options`.

Every default is read from :data:`airflow_pg_bulk.options.OPTIONS`, the one declaration of the
load options; nothing here talks to a database or reads a file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_pg_bulk import options as load_options
from airflow_pg_bulk.options import default
from airflow_pg_bulk.plan.codes import CopyFormat, Mode, OnDuplicateKey, OnError, RowStrategy
from airflow_pg_bulk.plan.plain import PlainData

DEFAULT_REJECT_TABLE = "pgbulk_rejects"


@dataclass(frozen=True)
class CopyOptions(PlainData):
    """How the source bytes are read by ``COPY ... FROM STDIN``.

    :param format: ``"csv"``, ``"text"`` (PostgreSQL's text format) or ``"parquet"`` (files
        that name their columns and types themselves: see :mod:`airflow_pg_bulk.source.parquet`).
    :param header: the first line of every file names the columns; they are matched to the
        target's columns by name, and the header line is not loaded.
    :param delimiter: field separator; default ``,`` for csv and a tab for text.
    :param null: the string that stands for NULL; default: an unquoted empty field for csv,
        ``\\N`` for text.
    :param quote: csv quote character.
    :param escape: csv escape character inside quotes; default: the quote character (``""``).
    :param encoding: the files' encoding, as PostgreSQL names it (``UTF8``, ``LATIN1``, ...).
    """

    # (the declared default, a str; made the member in __post_init__)
    format: CopyFormat = default("format")  # noqa: RUF009
    header: bool = default("header")
    delimiter: str | None = default("delimiter")
    null: str | None = default("null")
    quote: str = default("quote")
    escape: str | None = default("escape")
    encoding: str = default("encoding")

    def __post_init__(self) -> None:
        formats = load_options.BY_NAME["format"].choices
        if self.format not in formats:  # type: ignore[operator]
            raise ValueError(f"format must be one of {formats}, not {self.format!r}")
        object.__setattr__(self, "format", CopyFormat(self.format))
        for name in ("delimiter", "quote", "escape"):
            value = getattr(self, name)
            if value is not None and len(value.encode()) != 1:
                raise ValueError(f"{name} must be a single one-byte character, not {value!r}")
        csv_only = (self.header, self.delimiter, self.null, self.quote, self.escape, self.encoding)
        if not self.format.delimited and csv_only != (False, None, None, '"', None, "UTF8"):
            raise ValueError(
                "header, delimiter, null, quote, escape and encoding apply to csv and text: a "
                "Parquet file names its columns (matched to the table's by name) and types"
            )
        if not self.format.is_csv and (self.quote != '"' or self.escape is not None):
            raise ValueError("quote and escape apply to format='csv' only")

    @property
    def effective_delimiter(self) -> str:
        """The delimiter COPY will use."""
        return self.delimiter or ("," if self.format.is_csv else "\t")

    @property
    def effective_escape(self) -> str:
        """The csv escape character COPY will use."""
        return self.escape or self.quote


@dataclass(frozen=True)
class Settings(PlainData):
    """Tuning and safety settings of a load; every field has a measured default.

    :param lock_timeout: how long any step waits for a lock: the target's in finalize, the
        load's own tables in prepare, finalize and cleanup (PostgreSQL interval).
    :param maintenance_work_mem: for index builds and constraint validation in finalize.
    :param synchronous_commit: ``off`` in COPY sessions: a server crash can lose a committed
        partition, which the ledger check in finalize then reports; it never corrupts.
    :param analyze: ANALYZE the new rows (see :mod:`airflow_pg_bulk.target.statistics` for when an
        in-place load does).
    :param index_workers: parallel maintenance workers per index build in finalize; None:
        sized from the server (:func:`airflow_pg_bulk.target.parallel_builds.size_builds`).
    :param allow_older_run: let a run replace the rows of a load whose data interval is later
        (the ordering rule, see :class:`RunOrder`), for a deliberate reload of the past.
    :param history_keep: the loads kept per target in the load history (older ones are
        deleted after a finalize; the newest of each DAG task and partition always stays).
    :param abandoned_after: how long another load into the same target may go without a sign
        of life before prepare drops its tables (PostgreSQL interval; see
        :func:`airflow_pg_bulk.steps.drop_abandoned`).
    """

    lock_timeout: str = default("lock_timeout")
    maintenance_work_mem: str = default("maintenance_work_mem")
    synchronous_commit: str = default("synchronous_commit")
    analyze: bool = default("analyze")
    index_workers: int | None = default("index_workers")
    allow_older_run: bool = default("allow_older_run")
    history_keep: int = default("history_keep")
    abandoned_after: str = default("abandoned_after")

    def __post_init__(self) -> None:
        if self.history_keep < 1:
            raise ValueError(f"history_keep must be 1 or more, not {self.history_keep!r}")


@dataclass(frozen=True)
class ErrorPolicy(PlainData):
    """What a row that PostgreSQL cannot parse or convert does to the load.

    :param on_error: ``"fail"`` (default): the first bad row fails the load, naming file, line,
        column and value. ``"reject"``: bad rows are recorded in ``reject_table`` and the rest
        load; more than ``max_rejects`` of them fail the load, and then nothing reaches the
        target.
    :param max_rejects: the most rejected rows a load may have (all partitions together).
    :param reject_table: where rejected rows go, ``schema.table``; created if missing; default
        ``pgbulk_rejects`` in the target's schema. Rows there outlive the load (cleanup keeps
        them); each says its load id, source file, line, raw line and error.
    """

    # (the declared default, a str; made the member in __post_init__)
    on_error: OnError = default("on_error")  # noqa: RUF009
    max_rejects: int = default("max_rejects")
    reject_table: str | None = default("reject_table")

    def __post_init__(self) -> None:
        choices = load_options.BY_NAME["on_error"].choices
        if self.on_error not in choices:  # type: ignore[operator]
            raise ValueError(f"on_error must be one of {choices}, not {self.on_error!r}")
        object.__setattr__(self, "on_error", OnError(self.on_error))
        if self.max_rejects < 0:
            raise ValueError("max_rejects must be 0 or more")
        if not self.on_error.rejects and self.max_rejects:
            raise ValueError("max_rejects needs on_error='reject'")

    @property
    def rejecting(self) -> bool:
        """Bad rows are set aside rather than failing the load."""
        return self.on_error.rejects


#: ``split_by`` for ranges of a PostgreSQL ``source_table``'s blocks: its row locator
#: (PostgreSQL 14+ reads a range of it by a TID range scan)
BLOCKS = "ctid"


@dataclass(frozen=True)
class DatabaseSource(PlainData):
    """A database source as the plan carries it (through XCom): what to read, and where the
    COPY task finds the connection, never a secret.

    :param name: an Airflow connection id, or the source URL with its password masked (the
        URL itself stays in the process it was given to: see
        :mod:`airflow_pg_bulk.loading.database.urls`).
    :param postgres: the source is PostgreSQL: ``COPY (query) TO STDOUT`` streams its bytes;
        otherwise rows are read through SQLAlchemy and encoded as COPY text.
    :param query: the SELECT whose rows are loaded (as the user wrote it, templates rendered).
    :param table: ``schema.table`` or ``table`` whose rows are all loaded, in place of a query.
    :param columns: the source's column names, in its order (matched to the target's by name).
    :param split_by: the column whose ranges are the COPY streams (None: one COPY stream);
        :data:`BLOCKS` for ranges of a PostgreSQL table's blocks (:attr:`by_blocks`).
    :param snapshot: a PostgreSQL source split by a column: the snapshot prepare exported
        and holds (``pg_export_snapshot``), which every range read in the same process
        imports, so all of them read the source as of one instant.
    :param types: a PostgreSQL source's column types, in its order, as ``format_type``
        renders them with their modifiers (``numeric(12,2)``); ``""`` for a type of the
        source database's own (an enum, a domain). Empty: not known.
    :param arrow: another database's rows are read as Arrow record batches by this reader
        (:data:`airflow_pg_bulk.loading.database.arrow_readers.READERS`: ``adbc_sqlite``),
        chosen by prepare where it reads every value exactly; None: the rows path (a
        DB-API cursor's tuples).
    """

    name: str
    postgres: bool
    query: str | None = None
    table: str | None = None
    columns: tuple[str, ...] = ()
    split_by: str | None = None
    snapshot: str | None = None
    types: tuple[str, ...] = ()
    arrow: str | None = None

    @property
    def by_blocks(self) -> bool:
        """Whether the COPY streams are ranges of a PostgreSQL table's blocks (``split_by``
        :data:`BLOCKS`), not of a column's values."""
        return self.split_by == BLOCKS

    def binary_into(self, target_types: Sequence[str]) -> bool:
        """Whether the rows may move in PostgreSQL's binary format into columns of these
        types (``format_type``'s, in the source's column order): a PostgreSQL source whose
        every column has exactly the target column's type, one that every server has under
        the same oid (so each value's bytes are read as they were written, and none can
        break a type modifier that the source's value already met)."""
        return (
            self.postgres
            and bool(self.types)
            and all(self.types)
            and tuple(target_types) == self.types
        )

    def describe(self) -> str:
        """What is read, in words: the query or the table, and where (the connection id, or
        the URL with its password masked), and the column it is split by."""
        what = f"the query {self.query!r}" if self.query else f"the table {self.table}"
        split = f", split by {self.split_by}" if self.split_by else ""
        return f"{what} on {self.name}{split}"


DEFAULT_PARTITION_BYTES = load_options.DEFAULT_PARTITION_BYTES
MAX_DEFAULT_PARTITIONS = 16


@dataclass(frozen=True)
class LoadRequest(PlainData):
    """What the user asked for, before prepare looked at the database and the files.

    :param table: the target, ``schema.table`` or ``table`` (then ``public``); it must exist.
    :param source: paths or globs of local/mounted files, or object-storage URLs and globs
        (``s3://bucket/prefix/*.csv.gz``); gzip content is read decompressed.
    :param copy: how the files are parsed (:class:`CopyOptions`).
    :param mode: ``replace`` (the target ends up with exactly the loaded rows), ``append``,
        ``upsert`` or ``replace_partitions`` (a partitioned target); required (no default).
    :param partitions: how many partitions (parallel COPY tasks); default: one per
        ``partition_size`` of input, at most 16.
    :param partition_size: bytes of input per partition when ``partitions`` is not given.
    :param columns: the target columns the fields fill, in file order, when there is no header;
        default: every column that is not generated.
    :param staging_logged: force a logged (True) or unlogged (False) staging table; default:
        logged for replace and replace_partitions, unlogged for append and upsert (see
        docs/tuning.md).
    :param key: upsert: the columns that identify a row (a primary key or unique constraint or
        index of the target, exactly); default: the primary key.
    :param on_duplicate_key: upsert: ``last`` (the row latest in source order wins a key
        loaded more than once) or ``fail``.
    :param strategy: append and upsert: ``in_place``, ``rebuild`` or ``auto`` (see
        :func:`airflow_pg_bulk.plan.planning.choose_strategy`).
    :param settings: tuning and safety settings (:class:`Settings`).
    :param errors: what bad rows do (:class:`ErrorPolicy`).
    :param source_conn_id: the Airflow connection object-storage URLs are read with; None:
        the filesystem's standard environment (``AWS_ACCESS_KEY_ID``, ...). With ``query`` or
        ``source_table``: the Airflow connection of the source database.
    :param source_url: a database as the source (a SQLAlchemy or libpq URL), in place of
        files: for the command line and :func:`airflow_pg_bulk.runner.load`; it may carry a
        password, so it stays in this process (the plan carries it masked).
    :param query: with a database source, the SELECT whose rows are loaded.
    :param source_table: with a database source, the table whose rows are all loaded.
    :param split_by: with a database source and ``partitions``: the column whose range is cut
        into one COPY stream per ``partitions``.
    :param create_target: with a database source or Parquet files: a missing target is
        created from the source's column types (and its NOT NULL and primary key where the
        source has them); an existing target is not altered.
    """

    table: str
    source: tuple[str, ...]
    copy: CopyOptions = CopyOptions()
    mode: Mode = ""  # type: ignore[assignment]  # required: "" (not given) is refused
    partitions: int | None = default("partitions")
    partition_size: int = default("partition_size")
    columns: tuple[str, ...] | None = default("columns")
    staging_logged: bool | None = default("staging_logged")
    key: tuple[str, ...] | None = default("key")
    # (these two: the declared default, a str; made the member in __post_init__)
    on_duplicate_key: OnDuplicateKey = default("on_duplicate_key")  # noqa: RUF009
    strategy: RowStrategy = default("strategy")  # noqa: RUF009
    settings: Settings = Settings()
    errors: ErrorPolicy = ErrorPolicy()
    source_conn_id: str | None = default("source_conn_id")
    source_url: str | None = default("source_url")
    query: str | None = default("query")
    source_table: str | None = default("source_table")
    split_by: str | None = default("split_by")
    create_target: bool = default("create_target")

    def __post_init__(self) -> None:
        if not self.mode:
            raise ValueError(load_options.mode_required_message())
        if self.mode not in load_options.MODES:
            raise ValueError(f"mode must be one of {load_options.MODES}, not {self.mode!r}")
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.partitions is not None and self.partitions < 1:
            raise ValueError("partitions must be at least 1")
        if self.partition_size < 1:
            raise ValueError("partition_size must be positive")
        self._check_source()
        if self.columns is not None and self.copy.header:
            raise ValueError("give either header=True (columns matched by name) or columns")
        if self.on_duplicate_key not in load_options.ON_DUPLICATE_KEY:
            raise ValueError(
                f"on_duplicate_key must be one of {load_options.ON_DUPLICATE_KEY}, "
                f"not {self.on_duplicate_key!r}"
            )
        object.__setattr__(self, "on_duplicate_key", OnDuplicateKey(self.on_duplicate_key))
        if not self.mode.keyed and (
            self.key is not None or self.on_duplicate_key.refuses_duplicates
        ):
            raise ValueError("key and on_duplicate_key apply to mode='upsert' only")
        if self.strategy not in load_options.STRATEGIES:
            raise ValueError(
                f"strategy must be one of {load_options.STRATEGIES}, not {self.strategy!r}"
            )
        object.__setattr__(self, "strategy", RowStrategy(self.strategy))
        if not self.mode.takes_strategy and self.strategy.asked_for:
            raise ValueError("strategy applies to mode='append' and mode='upsert' only")
        if self.key is not None and not self.key:
            raise ValueError("key must name at least one column (or be left out: the primary key)")

    @property
    def from_database(self) -> bool:
        """The source is a query or a table on another database, not files."""
        return bool(self.query or self.source_table or self.source_url)

    def _check_source(self) -> None:
        """Files, or one database query or table, never both; what a database source does
        not take is refused here, before anything connects."""
        if not self.from_database:
            if not self.source:
                raise ValueError("source must name at least one file or glob")
            if self.create_target and not self.copy.format.names_types:
                raise ValueError(
                    "create_target applies to a database source (query or source_table) or to "
                    "Parquet files (whose schema names the types): create the table first for "
                    f"{self.copy.format} files"
                )
            if self.split_by:
                raise ValueError("split_by applies to a database source (query or source_table)")
            return
        if self.split_by and self.partitions is None:
            raise ValueError("split_by needs partitions: the number of ranges of its column")
        if self.source:
            raise ValueError(
                "give either source (files) or a database source (query or source_table), not both"
            )
        if bool(self.query) == bool(self.source_table):
            raise ValueError("a database source needs query or source_table (one of them)")
        if bool(self.source_url) == bool(self.source_conn_id):
            raise ValueError(
                "a database source needs its connection: source_url (a SQLAlchemy or libpq "
                "URL) or, under Airflow, source_conn_id (one of them)"
            )
        if self.copy != CopyOptions() or self.columns is not None:
            raise ValueError(
                "format, header, delimiter, null, quote, escape, encoding and columns apply to "
                "files: a database source's columns are matched to the table's by name "
                "(rename them in the query: SELECT a AS b)"
            )
        if self.errors.rejecting:
            raise ValueError("on_error='reject' applies to files, not to a database source")

    def partition_count(self, total_bytes: int) -> int:
        """The number of partitions for ``total_bytes`` of input."""
        if self.partitions is not None:
            return self.partitions
        wanted = -(-total_bytes // self.partition_size)
        return max(1, min(MAX_DEFAULT_PARTITIONS, wanted))

    def staging_is_logged(self, strategy: RowStrategy = RowStrategy.IN_PLACE) -> bool:
        """Whether staging is a logged table for this request (an append that rebuilds COPYs
        into the new table itself, as a replace does)."""
        if self.staging_logged is not None:
            return self.staging_logged
        return self.mode.copies_into_new_table(strategy)


_REQUEST_OPTIONS = tuple(n for n in load_options.in_group("request") if n != "columns")
_NESTED_OPTIONS: dict[str, type[PlainData]] = {
    "copy": CopyOptions,
    "settings": Settings,
    "errors": ErrorPolicy,
}
# The flat keyword options (declared in airflow_pg_bulk.options), ``columns`` apart.
LOAD_OPTIONS: frozenset[str] = frozenset(n for n in load_options.NAMES if n != "columns")


def request_from_options(
    table: str,
    source: str | Sequence[str] | None,
    columns: Sequence[str] | None = None,
    **options: Any,
) -> LoadRequest:
    """A :class:`LoadRequest` from flat keyword options (``format=``, ``header=``, ``mode=``,
    ``lock_timeout=``, ``on_error=``, ...): the names of the fields of :class:`CopyOptions`,
    :class:`Settings` and :class:`ErrorPolicy`, plus ``mode``, ``partitions``,
    ``partition_size`` and ``staging_logged`` (all declared in :mod:`airflow_pg_bulk.options`).
    ``None`` means the default. Whole objects may be given too (``settings=Settings(...)``,
    ``copy=``, ``errors=``); flat options override their fields.

    ``mode`` has no default: without it this raises ``ValueError`` naming each mode and what it
    does to the target, before anything is touched."""
    bases = {name: options.pop(name) for name in _NESTED_OPTIONS if name in options}
    unknown = sorted(set(options) - LOAD_OPTIONS)
    if unknown:
        raise TypeError(f"unknown load options {unknown}; known: {sorted(LOAD_OPTIONS)}")
    given = {k: v for k, v in options.items() if v is not None}
    if "key" in given:
        given["key"] = column_list(given["key"])
    nested = {}
    for name, cls in _NESTED_OPTIONS.items():
        fields = {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}  # type: ignore[arg-type]
        base = bases.get(name)
        nested[name] = dataclasses.replace(base, **fields) if base else cls(**fields)
    return LoadRequest(
        table=table,
        source=(source,) if isinstance(source, str) else tuple(source or ()),
        columns=column_list(columns) if columns is not None else None,
        **{k: given[k] for k in _REQUEST_OPTIONS if k in given},
        **nested,
    )


def column_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """Column names given as a list, or as one string of comma-separated names (a rendered
    template, a command-line value)."""
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    return tuple(value)
