"""The load plan: the complete description of one load, made by prepare, and its parts
(partitions of pieces of source files, the upsert's key, the run it belongs to)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pg_bulk.plan.codes import Mode, OnDuplicateKey, RowStrategy
from airflow_pg_bulk.plan.definition import TargetDefinition
from airflow_pg_bulk.plan.plain import PlainData
from airflow_pg_bulk.plan.request import CopyOptions, DatabaseSource, ErrorPolicy, Settings

LOAD_HISTORY_TABLE = "pgbulk_loads"  # in the target's schema: one row per finalized load


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
        (csv: see :mod:`~airflow_pg_bulk.source.window`); its COPY task checks that its last record
        ends at ``end``, and finalize repairs the file's pieces from the first that did not.
        ``first_line`` is then 0 (not counted; counted when an error needs it) past piece 0.
    :param key_range: a database source split by a column: ``(low, high)``, the rows with
        ``low <= key < high``; a None low also takes the NULL keys and every key below high,
        a None high every key from low (see :func:`airflow_pg_bulk.plan.planning.quantile_ranges`).
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
    key_range: tuple[int | str | None, ...] = ()

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
    on_duplicate_key: OnDuplicateKey = OnDuplicateKey.LAST
    key_may_be_null: bool = False
    override_identity: bool = False

    def __post_init__(self) -> None:
        # a plain str from to_dict / XCom
        object.__setattr__(self, "on_duplicate_key", OnDuplicateKey(self.on_duplicate_key))


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
class StagingLayout(PlainData):
    """How a partitioned target's load is staged, chosen once by prepare
    (:func:`airflow_pg_bulk.plan.planning.choose_staging_layout`) and followed by every step.

    :param by_partition: staging is partitioned like the target (one staging partition per
        leaf, made by prepare; the COPY tasks' rows are routed by PostgreSQL as they are
        written, and finalize detaches the staging partitions that received rows); False:
        ONE plain staging table, whose rows finalize routes (rewrites) into a new table per
        partition they go to. Always False for a plain target and for an upsert.
    :param why: the reason, for the log.
    """

    by_partition: bool = False
    why: str = ""


@dataclass(frozen=True)
class LoadPlan(PlainData):
    """The complete, self-contained description of one load, made by prepare."""

    load_id: str
    mode: Mode
    target: TargetDefinition
    staging_table: str
    ledger_table: str
    staging_logged: bool
    columns: tuple[str, ...]
    copy: CopyOptions
    partitions: tuple[Partition, ...]
    settings: Settings = Settings()  # noqa: RUF009 (frozen: one shared default is safe)
    source_bytes: int = 0
    errors: ErrorPolicy = ErrorPolicy()  # noqa: RUF009 (frozen)
    reject_table: tuple[str, ...] | None = None  # (schema, table) when rejecting
    # when prepare started and ended (epoch seconds, prepare's clock): the load's figures
    # span from prepare's start to the swap or insert (0: not known)
    started_at: float = 0.0
    prepared_at: float = 0.0
    # the DAG run's logical date (ISO 8601) under Airflow: a replace refuses to overwrite the
    # rows of a load with a later one (see LOAD_HISTORY_TABLE); None in-process
    logical_date: str | None = None

    upsert: UpsertSpec | None = None  # mode "upsert" only
    # append and upsert: in place or a rebuild, resolved by prepare (planning.choose_strategy)
    strategy: RowStrategy = RowStrategy.IN_PLACE
    # planning.plan_digest of the whole plan, made with it: a COPY task holding only its own
    # partition's pieces checks the ledger against it ("": compute it from the plan)
    digest: str = ""
    # the DAG run and data interval under Airflow (the ordering rule); None in-process
    run: RunOrder | None = None
    # a query or table on another database as the source (None: files)
    database: DatabaseSource | None = None
    # a partitioned target's staging: one plain table routed in finalize, or partitioned
    # like the target and routed by COPY (planning.choose_staging_layout)
    staging_layout: StagingLayout = StagingLayout()

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))  # a plain str from to_dict / XCom
        object.__setattr__(self, "strategy", RowStrategy(self.strategy))

    @property
    def history_table(self) -> tuple[str, str]:
        """``(schema, table)`` of the load history the load is recorded in when finalized."""
        return (self.target.schema, LOAD_HISTORY_TABLE)

    @property
    def rebuilds(self) -> bool:
        """An append or upsert that builds a new table and swaps it in."""
        return self.mode.takes_strategy and self.strategy.rebuilds

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
        raise KeyError(f"load {self.load_id} has no COPY stream {index}")
