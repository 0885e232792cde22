"""The catalog's letter codes, named: what the captured definition's one-letter fields mean; and
the load mode (:class:`Mode`), whose properties answer what the load does with the target.

The plan keeps them as plain strings (JSON through XCom); a ``StrEnum`` member equals its code,
so ``con.kind == ConstraintKind.UNIQUE`` reads a plan as it is, and a definition built with the
members round-trips through ``to_dict``/``from_dict`` and JSON unchanged.
"""

from __future__ import annotations

import enum


class Persistence(enum.StrEnum):
    """``pg_class.relpersistence`` of a table (:attr:`TargetDefinition.persistence`)."""

    PERMANENT = "p"
    UNLOGGED = "u"
    TEMPORARY = "t"


class RelKind(enum.StrEnum):
    """``pg_class.relkind`` values the load tells apart."""

    TABLE = "r"
    PARTITIONED = "p"
    VIEW = "v"
    MATERIALIZED_VIEW = "m"
    FOREIGN_TABLE = "f"


class PartitionStrategy(enum.StrEnum):
    """``pg_partitioned_table.partstrat`` of a partitioned target
    (:attr:`Partitioning.strategy`)."""

    RANGE = "r"
    LIST = "l"
    HASH = "h"

    @property
    def takes_default(self) -> bool:
        """A DEFAULT partition can take the rows no other partition takes (not for HASH:
        there every row has a partition when the remainders are all there)."""
        return self is not PartitionStrategy.HASH


class ConstraintKind(enum.StrEnum):
    """``pg_constraint.contype`` (:attr:`ConstraintDef.kind`)."""

    PRIMARY_KEY = "p"
    UNIQUE = "u"
    CHECK = "c"
    FOREIGN_KEY = "f"
    EXCLUSION = "x"


class TriggerState(enum.StrEnum):
    """``pg_trigger.tgenabled`` (:attr:`TriggerDef.enabled`)."""

    ORIGIN = "O"  # fires in origin and local sessions (ENABLE, the default)
    DISABLED = "D"
    REPLICA = "R"  # fires only in replica sessions (ENABLE REPLICA)
    ALWAYS = "A"  # fires always (ENABLE ALWAYS)


class Identity(enum.StrEnum):
    """``pg_attribute.attidentity`` (:attr:`Column.identity`)."""

    NONE = ""
    ALWAYS = "a"
    BY_DEFAULT = "d"


class SequenceKind(enum.StrEnum):
    """How a sequence is tied to a target column (:attr:`OwnedSequence.kind`), as
    :func:`airflow_pg_bulk.sql.catalog.owned_sequences` names the ``pg_depend.deptype``."""

    IDENTITY = "identity"  # deptype 'i': internal to an identity column
    SERIAL = "serial"  # deptype 'a': OWNED BY a column (serial, or set by hand)

    @property
    def of_identity_column(self) -> bool:
        """The sequence of an identity column: staging draws from it where the column is not
        loaded, and a swap renames the old one and carries its position to the new table's."""
        return self is SequenceKind.IDENTITY

    @property
    def owned_by_column(self) -> bool:
        """A sequence OWNED BY a column (``serial``): a swap makes the new table's column its
        owner."""
        return self is SequenceKind.SERIAL


class CopyFormat(enum.StrEnum):
    """The source files' format (``format=``; declared in :data:`airflow_pg_bulk.options.FORMATS`);
    what each means for prepare and the COPY task is its class in
    :mod:`airflow_pg_bulk.source.formats`, chosen from it by
    :func:`airflow_pg_bulk.source.formats.for_copy`."""

    CSV = "csv"
    TEXT = "text"  # PostgreSQL's text format
    PARQUET = "parquet"

    @property
    def delimited(self) -> bool:
        """Records of delimited fields, sent to COPY as they are: ``header``, ``delimiter``,
        ``null`` and ``encoding`` apply (csv and text)."""
        return self is not CopyFormat.PARQUET

    @property
    def is_csv(self) -> bool:
        """COPY's CSV: quoted fields (``quote``, ``escape``), ``,`` the default delimiter, and
        its own end-of-data rule (:func:`airflow_pg_bulk.source.records.marker_rule`)."""
        return self is CopyFormat.CSV

    @property
    def names_types(self) -> bool:
        """The files name their columns' types (Parquet): ``create_target`` can create the
        table from them."""
        return self is CopyFormat.PARQUET


class OnError(enum.StrEnum):
    """What a row PostgreSQL cannot parse or convert does to the load (``on_error=``; declared
    in :data:`airflow_pg_bulk.options.ON_ERROR`)."""

    FAIL = "fail"
    REJECT = "reject"

    @property
    def rejects(self) -> bool:
        """Bad rows are set aside in the reject table and the rest load (up to
        ``max_rejects``), rather than the first one failing the load."""
        return self is OnError.REJECT


class OnDuplicateKey(enum.StrEnum):
    """What an upsert does with a key loaded more than once (``on_duplicate_key=``; declared
    in :data:`airflow_pg_bulk.options.ON_DUPLICATE_KEY`)."""

    LAST = "last"
    FAIL = "fail"

    @property
    def latest_wins(self) -> bool:
        """The row latest in source order is the one merged."""
        return self is OnDuplicateKey.LAST

    @property
    def refuses_duplicates(self) -> bool:
        """A key loaded more than once fails the load, naming it, before any row is merged."""
        return self is OnDuplicateKey.FAIL


class RowStrategy(enum.StrEnum):
    """How an append or upsert adds its rows to the target (``strategy=``; declared with its
    help in :data:`airflow_pg_bulk.options.STRATEGIES`). A request may ask for ``AUTO``; a
    plan holds what prepare resolved it to, ``IN_PLACE`` or ``REBUILD``
    (:func:`airflow_pg_bulk.plan.planning.choose_strategy`)."""

    AUTO = "auto"
    IN_PLACE = "in_place"
    REBUILD = "rebuild"

    @property
    def rebuilds(self) -> bool:
        """A new table = the target's rows + the loaded rows, indexed, then swapped in."""
        return self is RowStrategy.REBUILD

    @property
    def asked_for(self) -> bool:
        """The user chose it (not ``AUTO``): prepare follows it or refuses the load."""
        return self is not RowStrategy.AUTO


class Mode(enum.StrEnum):
    """The load mode (``mode=``; declared with its help in :data:`airflow_pg_bulk.options.MODES`).

    Each property answers one question the load asks of the mode, so that no module compares
    the mode with a string.
    """

    REPLACE = "replace"
    APPEND = "append"
    UPSERT = "upsert"
    REPLACE_PARTITIONS = "replace_partitions"

    @property
    def swaps_table(self) -> bool:
        """The loaded rows are built into a table of their own that is swapped in for the target
        (replace) or for its partitions (replace_partitions); ``strategy`` does not apply."""
        return self in (Mode.REPLACE, Mode.REPLACE_PARTITIONS)

    @property
    def takes_strategy(self) -> bool:
        """The rows are added to the target's (append, upsert): in place, or by a rebuild."""
        return not self.swaps_table

    @property
    def keyed(self) -> bool:
        """Loaded rows are matched to the target's by a key (upsert)."""
        return self is Mode.UPSERT

    @property
    def replaces_rows(self) -> bool:
        """Rows the target holds can be removed or overwritten (every mode but append)."""
        return self is not Mode.APPEND

    @property
    def ordered_by_run(self) -> bool:
        """The ordering rule applies: a run never replaces the rows of a later run's load (the
        modes that replace rows; ``allow_older_run`` lifts it)."""
        return self.replaces_rows

    @property
    def whole_target(self) -> bool:
        """The load's outcome is the whole target's rows (replace): every partition of a
        partitioned target is swapped or emptied."""
        return self is Mode.REPLACE

    @property
    def replaces_loaded_partitions(self) -> bool:
        """Only the partitions that receive rows are replaced (replace_partitions): it needs a
        partitioned target, and its ordering rule and history name those partitions."""
        return self is Mode.REPLACE_PARTITIONS

    @property
    def ordered_over_whole_target(self) -> bool:
        """The ordering rule weighs every later load into the target, so prepare checks it
        before any work (replace, upsert); a replace_partitions is checked in finalize, once
        the partitions it replaces are known."""
        return self.ordered_by_run and not self.replaces_loaded_partitions

    def copies_into_new_table(self, strategy: RowStrategy) -> bool:
        """COPY writes the table that will become the target's (or its partitions') rows, so
        that staging is logged by default: a replace, or an append that rebuilds."""
        return self.swaps_table or (self is Mode.APPEND and RowStrategy(strategy).rebuilds)
