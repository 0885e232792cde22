"""The load plan: plain, frozen data that travels between tasks through XCom.

Every class here converts to and from a dict of JSON types (``to_dict`` / ``from_dict``), so the
plan can be returned by the prepare task, fed to ``.expand()`` and read back by the copy and
finalize tasks on any worker. Nothing here talks to a database or reads a file.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from airflow_pg_bulk import options as load_options

Mode = Literal["replace", "append", "upsert", "replace_partitions"]
MODES: tuple[str, ...] = load_options.MODES
ON_DUPLICATE_KEY: tuple[str, ...] = load_options.ON_DUPLICATE_KEY
STRATEGIES: tuple[str, ...] = load_options.STRATEGIES
FORMATS: tuple[str, ...] = ("csv", "text", "parquet")
ON_ERROR: tuple[str, ...] = ("fail", "reject")
DEFAULT_REJECT_TABLE = "pgbulk_rejects"
LOAD_HISTORY_TABLE = "pgbulk_loads"  # in the target's schema: one row per finalized load

T = TypeVar("T", bound="PlainData")


class PlainData:
    """Mixin: a frozen dataclass that round-trips through a dict of JSON types."""

    def to_dict(self) -> dict[str, Any]:
        """This object as a dict of JSON types (tuples become lists)."""
        return _to_plain(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        """Rebuild the object from :meth:`to_dict` output; unknown keys are an error."""
        hints = _hints(cls)
        unknown = set(data) - hints.keys()
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        kwargs = {name: _from_plain(hints[name], value) for name, value in data.items()}
        return cls(**kwargs)


# per class, once: a plan of 100,000 files has 100,000 pieces to convert
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_HINTS: dict[type, dict[str, Any]] = {}
_SCALARS = (str, int, float, bool, type(None))


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        every = typing.get_type_hints(cls)
        hints = _HINTS[cls] = {f.name: every[f.name] for f in dataclasses.fields(cls)}
    return hints


def _to_plain(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    cls = type(value)
    names = _FIELD_NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(cls):
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    if names is not None:
        return {name: _to_plain(getattr(value, name)) for name in names}
    if isinstance(value, (tuple, list)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


def _from_plain(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is not type(None):
                return _from_plain(arg, value)
    if origin is tuple:
        (item,) = typing.get_args(hint)[:1]
        return tuple(_from_plain(item, v) for v in value)
    if origin is dict:
        _key_type, val_t = typing.get_args(hint)
        return {k: _from_plain(val_t, v) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, PlainData):
        return hint.from_dict(value)
    return value


@dataclass(frozen=True)
class CopyOptions(PlainData):
    """How the source bytes are read by ``COPY ... FROM STDIN``.

    :param format: ``"csv"``, ``"text"`` (PostgreSQL's text format) or ``"parquet"`` (files
        that name their columns and types themselves: see :mod:`airflow_pg_bulk.parquet`).
    :param header: the first line of every file names the columns; they are matched to the
        target's columns by name, and the header line is not loaded.
    :param delimiter: field separator; default ``,`` for csv and a tab for text.
    :param null: the string that stands for NULL; default: an unquoted empty field for csv,
        ``\\N`` for text.
    :param quote: csv quote character.
    :param escape: csv escape character inside quotes; default: the quote character (``""``).
    :param encoding: the files' encoding, as PostgreSQL names it (``UTF8``, ``LATIN1``, ...).
    """

    format: str = "csv"
    header: bool = False
    delimiter: str | None = None
    null: str | None = None
    quote: str = '"'
    escape: str | None = None
    encoding: str = "UTF8"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, not {self.format!r}")
        for name in ("delimiter", "quote", "escape"):
            value = getattr(self, name)
            if value is not None and len(value.encode()) != 1:
                raise ValueError(f"{name} must be a single one-byte character, not {value!r}")
        if self.format == "text" and (self.quote != '"' or self.escape is not None):
            raise ValueError("quote and escape apply to format='csv' only")
        csv_only = (self.header, self.delimiter, self.null, self.quote, self.escape, self.encoding)
        if self.format == "parquet" and csv_only != (False, None, None, '"', None, "UTF8"):
            raise ValueError(
                "header, delimiter, null, quote, escape and encoding apply to csv and text: a "
                "Parquet file names its columns (matched to the table's by name) and types"
            )

    @property
    def effective_delimiter(self) -> str:
        """The delimiter COPY will use."""
        return self.delimiter or ("," if self.format == "csv" else "\t")

    @property
    def effective_escape(self) -> str:
        """The csv escape character COPY will use."""
        return self.escape or self.quote


@dataclass(frozen=True)
class Piece(PlainData):
    """A byte range of one source file, beginning at a record start.

    :param path: the file, readable by every worker (a shared or network path).
    :param start: first byte (after the header, if the file has one).
    :param end: one past the last byte; ``None`` reads to the end of the file.
    :param first_line: the physical line number, in the file, of the byte at ``start``.
    :param compression: ``"gzip"`` or ``None``; a compressed file is always one whole piece.
    :param skip_header: the piece's stream starts with a header record to drop (compressed files).
    :param newline: the line ending (``"\\n"``, ``"\\r\\n"`` or ``"\\r"``) of the file's first
        line, when the piece's stream does not start the file: COPY of the whole file takes
        its line ending from its first line and rejects any other, so the piece must too.
    :param ordinal: the piece's place in source order among all pieces of the load (files in
        the order resolved, then byte order); set for upsert, whose rows carry it into
        staging so that the row latest in source order wins a repeated key.
    :param conn_id: an object's Airflow connection (``source_conn_id``); None: the environment.
    :param source_size: an object's size when prepare listed it (checked before it is read).
    :param etag: an object's ETag when prepare listed it (checked before and while it is read).
    :param row_groups: a Parquet piece's row groups (consecutive, by index in the file);
        ``start`` and ``end`` are then the bytes they span, ``source_size`` the file's size.
    :param speculative: its start or its end is a record start guessed from a bounded window
        (csv: see :mod:`~airflow_pg_bulk.ranges`); its COPY task checks that its last record
        ends at ``end``, and finalize repairs the file's pieces from the first that did not.
        ``first_line`` is then 0 (not counted; counted when an error needs it) past piece 0.
    """

    path: str
    start: int = 0
    end: int | None = None
    first_line: int = 1
    compression: str | None = None
    skip_header: bool = False
    newline: str | None = None
    ordinal: int = 0
    conn_id: str | None = None
    source_size: int | None = None
    etag: str | None = None
    row_groups: tuple[int, ...] = ()
    speculative: bool = False

    @property
    def size(self) -> int | None:
        """Bytes in the range, when known without reading the file."""
        return None if self.end is None else self.end - self.start


@dataclass(frozen=True)
class Partition(PlainData):
    """The unit of work of one COPY task: one or more pieces loaded in one transaction."""

    index: int
    pieces: tuple[Piece, ...]
    bytes: int


@dataclass(frozen=True)
class Column(PlainData):
    """A column of the target table as captured by prepare."""

    name: str
    type: str
    not_null: bool
    generated: bool = False
    identity: str = ""  # codes.Identity: "" none, "a" always, "d" by default


@dataclass(frozen=True)
class IndexDef(PlainData):
    """An index of the target, kept as the server rendered it.

    :param tail: what follows ``USING`` in ``pg_get_indexdef``: access method, keys, INCLUDE,
        WITH, WHERE; it names columns only, never the table, so it applies to staging as is.
    :param constraint: the name of the PK/unique constraint this index backs, if any.
    """

    name: str
    unique: bool
    tail: str
    constraint: str | None = None
    comment: str | None = None


@dataclass(frozen=True)
class ConstraintDef(PlainData):
    """A constraint of the target: ``definition`` is ``pg_get_constraintdef`` output."""

    name: str
    kind: str  # codes.ConstraintKind: p u c f x
    definition: str
    validated: bool = True
    index: str | None = None
    comment: str | None = None
    deferrable: bool = False
    deferred: bool = False


@dataclass(frozen=True)
class TriggerDef(PlainData):
    """A user trigger of the target: its full ``CREATE TRIGGER`` text and enabled state."""

    name: str
    definition: str
    enabled: str = "O"  # codes.TriggerState: O origin, D disabled, R replica, A always


@dataclass(frozen=True)
class Grant(PlainData):
    """One privilege on the table (or one column of it) held by ``grantee`` (empty: PUBLIC)."""

    grantee: str
    privilege: str
    grantable: bool = False
    column: str | None = None


@dataclass(frozen=True)
class ReferencingKey(PlainData):
    """A foreign key of another table that references the target."""

    schema: str
    table: str
    name: str
    definition: str
    validated: bool = True


@dataclass(frozen=True)
class OwnedSequence(PlainData):
    """A sequence tied to a target column: ``kind`` ``serial`` (OWNED BY) or ``identity``."""

    schema: str
    name: str
    column: str
    kind: str


@dataclass(frozen=True)
class TargetDefinition(PlainData):
    """Everything about the target that a replace must carry over to the new table."""

    schema: str
    table: str
    oid: int
    owner: str
    persistence: str  # codes.Persistence: p permanent, u unlogged
    columns: tuple[Column, ...]
    indexes: tuple[IndexDef, ...] = ()
    constraints: tuple[ConstraintDef, ...] = ()
    triggers: tuple[TriggerDef, ...] = ()
    grants: tuple[Grant, ...] = ()
    referencing_keys: tuple[ReferencingKey, ...] = ()
    dependent_views: tuple[str, ...] = ()  # "schema.view", for the record; re-read at swap time
    sequences: tuple[OwnedSequence, ...] = ()
    reloptions: tuple[str, ...] = ()
    comment: str | None = None
    column_comments: dict[str, str] = field(default_factory=dict)
    unsupported: tuple[str, ...] = ()  # what a replace cannot carry over, in words
    # a partitioned target: its key and leaf partitions (None: a plain table)
    partitioning: Partitioning | None = None

    @property
    def qualified(self) -> str:
        """``schema.table`` for messages (not for SQL)."""
        return f"{self.schema}.{self.table}"

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between prepare and the swap (the oid excluded)."""
        data = self.to_dict()
        data.pop("oid")
        data.pop("dependent_views")
        return data


@dataclass(frozen=True)
class LeafPartition(PlainData):
    """One leaf partition of a partitioned target, as captured by prepare.

    :param bound: its bound as the server renders it (``FOR VALUES FROM (...) TO (...)``,
        ``FOR VALUES IN (...)``, ``FOR VALUES WITH (...)``, ``DEFAULT``).
    :param constraint: its partition constraint (``pg_get_partition_constraintdef``): the
        CHECK that lets ATTACH PARTITION skip its scan; None for a lone DEFAULT partition.
    :param definition: the partition's own definition (indexes, constraints, grants, owner,
        comments), what a table swapped in for it is built with (with ``in_place``: its
        schema and name only).
    :param in_place: a load's rows go into the partition in place rather than by a table
        built beside it and swapped in (few rows: see
        :data:`airflow_pg_bulk.partitioned.IN_PLACE_ROWS`).
    """

    bound: str
    constraint: str | None
    definition: TargetDefinition
    in_place: bool = False


@dataclass(frozen=True)
class Partitioning(PlainData):
    """A partitioned target's key (``pg_get_partkeydef``: ``RANGE (day)``) and leaves, and
    what the partition-wise finalize cannot carry over, in words."""

    key: str
    leaves: tuple[LeafPartition, ...]
    unsupported: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings(PlainData):
    """Tuning and safety settings of a load; every field has a measured default.

    :param lock_timeout: how long any step waits for a lock: the target's in finalize, the
        load's own tables in prepare, finalize and cleanup (PostgreSQL interval).
    :param maintenance_work_mem: for index builds and constraint validation in finalize.
    :param synchronous_commit: ``off`` in COPY sessions: a server crash can lose a committed
        partition, which the ledger check in finalize then reports; it never corrupts.
    :param analyze: ANALYZE the new rows (see :mod:`airflow_pg_bulk.statistics` for when an
        in-place load does).
    :param index_workers: parallel maintenance workers per index build in finalize; None:
        sized from the server (:func:`airflow_pg_bulk.fanout.size_builds`).
    :param allow_older_run: let a run replace the rows of a load whose data interval is later
        (the ordering rule, see :class:`RunOrder`), for a deliberate reload of the past.
    :param history_keep: the loads kept per target in the load history (older ones are
        deleted after a finalize; the newest of each DAG task and partition always stays).
    :param abandoned_after: how long another load into the same target may go without a sign
        of life before prepare drops its tables (PostgreSQL interval; see
        :func:`airflow_pg_bulk.steps.drop_abandoned`).
    """

    lock_timeout: str = "30s"
    maintenance_work_mem: str = "512MB"
    synchronous_commit: str = "off"
    analyze: bool = True
    index_workers: int | None = None
    allow_older_run: bool = False
    history_keep: int = 1000
    abandoned_after: str = "1d"

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

    on_error: str = "fail"
    max_rejects: int = 0
    reject_table: str | None = None

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {self.on_error!r}")
        if self.max_rejects < 0:
            raise ValueError("max_rejects must be 0 or more")
        if self.on_error == "fail" and self.max_rejects:
            raise ValueError("max_rejects needs on_error='reject'")

    @property
    def rejecting(self) -> bool:
        """Bad rows are set aside rather than failing the load."""
        return self.on_error == "reject"


@dataclass(frozen=True)
class UpsertSpec(PlainData):
    """How an upsert matches and merges rows, decided by prepare.

    :param key: the key columns, as the user named them (or the primary key's order).
    :param index: the unique index (of the primary key or a unique constraint) the key matches;
        ``ON CONFLICT (key)`` infers it.
    :param on_duplicate_key: ``last`` (the row latest in source order wins) or ``fail``.
    :param key_may_be_null: a key column is nullable and the index treats NULLs as distinct:
        rows with a NULL in the key never match a row and are all inserted.
    :param override_identity: a loaded key column is ``GENERATED ALWAYS AS IDENTITY``.
    """

    key: tuple[str, ...]
    index: str
    on_duplicate_key: str = "last"
    key_may_be_null: bool = False
    override_identity: bool = False


@dataclass(frozen=True)
class RunOrder(PlainData):
    """Which run a load belongs to, for the ordering rule: a load never replaces rows that a
    load of a later run of the same DAG task put in the same target (see docs/design.md,
    "Runs that overlap"). Made by the operators from the Airflow context; None outside Airflow
    (the rule does not apply there).

    :param scope: the DAG and task that load the target (``<dag_id>.<prepare task id>``): only
        loads of the same scope are compared, so another DAG loading the same table is never
        refused because of this one.
    :param run_id: the DAG run's id (named in the refusal).
    :param interval_start: the run's data interval, ISO 8601; a run without one (a manual run
        triggered without a logical date) is the instant it was triggered (``run_after``).
    :param interval_end: loads are ordered by the end of their data interval, then its start.
    """

    scope: str
    run_id: str
    interval_start: str
    interval_end: str

    @property
    def interval(self) -> tuple[str, str]:
        """``(start, end)``."""
        return (self.interval_start, self.interval_end)


@dataclass(frozen=True)
class LoadPlan(PlainData):
    """The complete, self-contained description of one load, made by prepare."""

    load_id: str
    mode: str
    target: TargetDefinition
    staging_table: str
    ledger_table: str
    staging_logged: bool
    columns: tuple[str, ...]
    copy: CopyOptions
    partitions: tuple[Partition, ...]
    settings: Settings = Settings()
    source_bytes: int = 0
    errors: ErrorPolicy = ErrorPolicy()
    reject_table: tuple[str, ...] | None = None  # (schema, table) when rejecting
    # when prepare started and ended (epoch seconds, prepare's clock): the load's figures
    # span from prepare's start to the swap or insert (0: not known)
    started_at: float = 0.0
    prepared_at: float = 0.0
    # the DAG run's logical date (ISO 8601) under Airflow: a replace refuses to overwrite the
    # rows of a load with a later one (see LOAD_HISTORY_TABLE); None in-process
    logical_date: str | None = None

    @property
    def history_table(self) -> tuple[str, str]:
        """``(schema, table)`` of the load history the load is recorded in when finalized."""
        return (self.target.schema, LOAD_HISTORY_TABLE)

    upsert: UpsertSpec | None = None  # mode "upsert" only
    # append and upsert: "in_place" or "rebuild", resolved by prepare (planning.choose_strategy)
    strategy: str = "in_place"
    # planning.plan_digest of the whole plan, made with it: a COPY task holding only its own
    # partition's pieces checks the ledger against it ("": compute it from the plan)
    digest: str = ""
    # the DAG run and data interval under Airflow (the ordering rule); None in-process
    run: RunOrder | None = None

    @property
    def rebuilds(self) -> bool:
        """An append or upsert that builds a new table and swaps it in."""
        return self.mode != "replace" and self.strategy == "rebuild"

    def shared(self) -> LoadPlan:
        """What every task of the load needs: the plan with each partition's pieces left out
        (a few KB whatever the number of files); under Airflow each COPY task reads its own
        pieces from the load's pieces table (:func:`airflow_pg_bulk.steps.read_pieces`)."""
        return dataclasses.replace(
            self, partitions=tuple(Partition(p.index, (), p.bytes) for p in self.partitions)
        )

    def with_partitions(self, partitions: Sequence[Partition]) -> LoadPlan:
        """The plan with these partitions (whole, with their pieces) in place of its own."""
        whole = {p.index: p for p in partitions}
        return dataclasses.replace(
            self, partitions=tuple(whole.get(p.index, p) for p in self.partitions)
        )

    def partition(self, index: int) -> Partition:
        """The partition with that index."""
        for part in self.partitions:
            if part.index == index:
                return part
        raise KeyError(f"load {self.load_id} has no partition {index}")


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
        :func:`airflow_pg_bulk.planning.choose_strategy`).
    :param settings: tuning and safety settings (:class:`Settings`).
    :param errors: what bad rows do (:class:`ErrorPolicy`).
    :param source_conn_id: the Airflow connection object-storage URLs are read with; None:
        the filesystem's standard environment (``AWS_ACCESS_KEY_ID``, ...).
    """

    table: str
    source: tuple[str, ...]
    copy: CopyOptions = CopyOptions()
    mode: str = ""  # required: "" (not given) is refused
    partitions: int | None = None
    partition_size: int = DEFAULT_PARTITION_BYTES
    columns: tuple[str, ...] | None = None
    staging_logged: bool | None = None
    key: tuple[str, ...] | None = None
    on_duplicate_key: str = "last"
    strategy: str = "auto"
    settings: Settings = Settings()
    errors: ErrorPolicy = ErrorPolicy()
    source_conn_id: str | None = None

    def __post_init__(self) -> None:
        if not self.mode:
            raise ValueError(load_options.mode_required_message())
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.partitions is not None and self.partitions < 1:
            raise ValueError("partitions must be at least 1")
        if self.partition_size < 1:
            raise ValueError("partition_size must be positive")
        if not self.source:
            raise ValueError("source must name at least one file or glob")
        if self.columns is not None and self.copy.header:
            raise ValueError("give either header=True (columns matched by name) or columns")
        if self.on_duplicate_key not in ON_DUPLICATE_KEY:
            raise ValueError(
                f"on_duplicate_key must be one of {ON_DUPLICATE_KEY}, not {self.on_duplicate_key!r}"
            )
        if self.mode != "upsert" and (self.key is not None or self.on_duplicate_key != "last"):
            raise ValueError("key and on_duplicate_key apply to mode='upsert' only")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, not {self.strategy!r}")
        if self.mode in ("replace", "replace_partitions") and self.strategy != "auto":
            raise ValueError("strategy applies to mode='append' and mode='upsert' only")
        if self.key is not None and not self.key:
            raise ValueError("key must name at least one column (or be left out: the primary key)")

    def partition_count(self, total_bytes: int) -> int:
        """The number of partitions for ``total_bytes`` of input."""
        if self.partitions is not None:
            return self.partitions
        wanted = -(-total_bytes // self.partition_size)
        return max(1, min(MAX_DEFAULT_PARTITIONS, wanted))

    def staging_is_logged(self, strategy: str = "in_place") -> bool:
        """Whether staging is a logged table for this request (an append that rebuilds COPYs
        into the new table itself, as a replace does)."""
        if self.staging_logged is not None:
            return self.staging_logged
        return self.mode in ("replace", "replace_partitions") or (
            self.mode == "append" and strategy == "rebuild"
        )


_REQUEST_OPTIONS = tuple(n for n in load_options.in_group("request") if n != "columns")
_NESTED_OPTIONS: dict[str, type[PlainData]] = {
    "copy": CopyOptions,
    "settings": Settings,
    "errors": ErrorPolicy,
}
# The flat keyword options (declared in airflow_pg_bulk.options), ``columns`` apart.
LOAD_OPTIONS: frozenset[str] = frozenset(n for n in load_options.NAMES if n != "columns")


def request_from_options(
    table: str, source: str | Sequence[str], columns: Sequence[str] | None = None, **options: Any
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
        source=(source,) if isinstance(source, str) else tuple(source),
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
