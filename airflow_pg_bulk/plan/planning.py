"""The plan, built by a pure function: request, captured definition and source listing in, plan out.

:func:`airflow_pg_bulk.steps.prepare` does the I/O around it (capture the target, list and
split the files, create the tables); everything decided from what it read is decided here, so
it can be tested without a server or a file.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_pg_bulk import naming
from airflow_pg_bulk.errors import BadArgumentError, LoadRefusedError
from airflow_pg_bulk.naming import split_name
from airflow_pg_bulk.plan.codes import Identity, Mode, Persistence, RowStrategy
from airflow_pg_bulk.plan.definition import TargetDefinition
from airflow_pg_bulk.plan.load_plan import (
    LoadPlan,
    Partition,
    RunOrder,
    StagingLayout,
    UpsertSpec,
)
from airflow_pg_bulk.plan.request import DEFAULT_REJECT_TABLE, DatabaseSource, LoadRequest


def loadable_columns(target: TargetDefinition) -> list[str]:
    """The target's columns a COPY can fill: every column that is not generated."""
    return [c.name for c in target.columns if not c.generated]


def plan_columns(
    request: LoadRequest, target: TargetDefinition, header_columns: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The target columns the fields fill, in file order.

    ``header_columns``: the columns the files' header names matched (``header=True``); empty
    or None means every loadable column. Without a header: ``request.columns`` or every
    loadable column; a column that is not loadable is refused."""
    loadable = loadable_columns(target)
    if request.copy.header:
        return tuple(header_columns or loadable)
    columns = list(request.columns or loadable)
    unknown = [c for c in columns if c not in loadable]
    if unknown:
        raise LoadRefusedError(
            f"columns {unknown} are not loadable columns of {target.qualified} "
            f"(loadable: {loadable})"
        )
    return tuple(columns)


def reject_table(request: LoadRequest, schema: str) -> tuple[str, str] | None:
    """``(schema, table)`` where rejected rows go, or None when the load does not reject."""
    if not request.errors.rejecting:
        return None
    if request.errors.reject_table:
        return split_name(request.errors.reject_table)
    return (schema, DEFAULT_REJECT_TABLE)


def staging_logged(
    request: LoadRequest, target: TargetDefinition, strategy: RowStrategy = RowStrategy.IN_PLACE
) -> bool:
    """Whether staging is a logged table; an unlogged target's replacement stays unlogged (an
    append that rebuilds COPYs into the table it swaps in, as a replace does)."""
    swapped_in = request.mode.copies_into_new_table(strategy)
    return request.staging_is_logged(strategy) and not (
        swapped_in and target.persistence == Persistence.UNLOGGED
    )


# --- a partitioned target's staging: one plain table, or partitioned like the target ----------

#: A partitioned target with at most this many leaf partitions may be staged partitioned like
#: it (prepare makes one staging partition per leaf, in one round trip, and cleanup drops them
#: with the staging table); a target with more is always staged in ONE plain table, so that the
#: daily reload of one leaf of a table of years of days makes nothing per leaf.
STAGED_BY_PARTITION_MAX_LEAVES = 64
#: ...and only when the load brings at least this many source bytes per leaf of the target.
#: Staging partitioned like the target costs about half a millisecond per leaf (its staging
#: partition made, its CHECK added, its comment; 0.3-0.5 ms measured on PostgreSQL 15, 2 busy
#: cores), whether or not rows go there; one plain staging table costs, when the rows go to
#: more than one partition, a second write of every row (finalize's route: about 20 ms per MB
#: of workload A's CSV, 1.3 s for 63 MB; benchmarks/RESULTS-incremental.md), and nothing when
#: they all go to one (staging becomes its table). At 1 MB per leaf a load into one leaf pays
#: at most a few percent for the layout, and a load spread over the leaves saves ~40x its cost.
STAGED_BY_PARTITION_BYTES_PER_LEAF = 1 << 20


def choose_staging_layout(
    request: LoadRequest, target: TargetDefinition, leaves: int, source_bytes: int
) -> StagingLayout:
    """How a load is staged (:class:`StagingLayout`): partitioned like a partitioned target
    (COPY routes the rows; nothing is written twice) when it has at most
    :data:`STAGED_BY_PARTITION_MAX_LEAVES` leaves and the load brings at least
    :data:`STAGED_BY_PARTITION_BYTES_PER_LEAF` per leaf; else one plain staging table, its rows
    routed in finalize. ``leaves``: the target's leaf partitions (0 for a plain target).
    Never for an upsert (it merges through the partitions in place) nor with
    ``on_error="reject"`` (a row of no partition is set aside by a CHECK on the one plain
    staging table as COPY goes)."""
    if target.partitioning is None or request.mode.keyed:
        return StagingLayout()
    if request.errors.rejecting:
        return StagingLayout(False, "on_error='reject' sets aside a row of no partition")
    if leaves > STAGED_BY_PARTITION_MAX_LEAVES:
        return StagingLayout(
            False, f"{leaves} table partitions, over {STAGED_BY_PARTITION_MAX_LEAVES}"
        )
    if source_bytes < leaves * STAGED_BY_PARTITION_BYTES_PER_LEAF:
        return StagingLayout(
            False,
            f"{source_bytes} source bytes, under {STAGED_BY_PARTITION_BYTES_PER_LEAF} for each "
            f"of the {leaves} table partitions",
        )
    return StagingLayout(
        True,
        f"{leaves} table partitions, at most {STAGED_BY_PARTITION_MAX_LEAVES}, and "
        f"{source_bytes} source bytes, at least {STAGED_BY_PARTITION_BYTES_PER_LEAF} for each",
    )


# --- strategy="auto": the cost model (docs/design.md, "append and upsert: in place or rebuild")

#: A rebuild pays for every row of the result (the target's rows read and written again, every
#: index built, every foreign key validated); in place pays per loaded row (index entries
#: inserted one by one, a foreign key looked up per row; an upsert also finds and replaces the
#: old version). Both grow linearly, so the choice is a ratio: rebuild while the target's heap
#: is at most BREAK_EVEN[mode] times the load's source bytes. Fitted from the measurements in
#: docs/design.md (workload A, 2 cores, PostgreSQL 15).
BREAK_EVEN: dict[str, float] = {Mode.APPEND: 6.0, Mode.UPSERT: 5.0}
#: Without any index or foreign key an in-place append is a plain INSERT … SELECT, which a
#: rebuild (it writes the target's rows again) cannot beat once the target holds rows: only
#: an empty target is rebuilt then. (An upsert's target always has its key's unique index.)
BREAK_EVEN_BARE = 0.0


@dataclass(frozen=True)
class StrategyInputs:
    """What the cost model reads: plain data, gathered by prepare.

    :param mode: ``append`` or ``upsert``.
    :param requested: the ``strategy`` option: ``auto``, ``in_place`` or ``rebuild``.
    :param load_bytes: the source's bytes.
    :param target_bytes: the target's heap bytes (main fork), 0 when empty.
    :param indexes: the target's indexes (its keys' included).
    :param foreign_keys: the target's foreign keys.
    :param triggers: the target has enabled user triggers (an in-place load fires them per
        row; a rebuild does not).
    :param obstacle: why a rebuild is not possible (privileges, dependents), or None.
    """

    mode: str
    requested: RowStrategy
    load_bytes: int
    target_bytes: int
    indexes: int = 0
    foreign_keys: int = 0
    triggers: bool = False
    obstacle: str | None = None


@dataclass(frozen=True)
class StrategyChoice:
    """What :func:`choose_strategy` decided, and why.

    :param strategy: ``IN_PLACE`` or ``REBUILD`` (never ``AUTO``).
    :param why: the reason, for the log and the preview.
    :param rebuild_blocked: ``auto`` went in place because a rebuild is not possible (the
        obstacle is in ``why``): worth a warning where the user can act on it.
    """

    strategy: RowStrategy
    why: str
    rebuild_blocked: bool = False


def choose_strategy(inputs: StrategyInputs) -> StrategyChoice:
    """In place or a rebuild for an append or upsert, and why; an explicit ``rebuild`` that
    cannot be done is refused (:class:`LoadRefusedError`), ``auto`` then goes in place."""
    in_place, rebuild = RowStrategy.IN_PLACE, RowStrategy.REBUILD
    requested = RowStrategy(inputs.requested)
    if requested is in_place:
        return StrategyChoice(in_place, "strategy='in_place' was asked for")
    if requested is rebuild:
        if inputs.obstacle:
            raise LoadRefusedError(
                f"strategy='rebuild' refused before anything was loaded: {inputs.obstacle}. "
                "Use strategy='in_place' (or 'auto')"
            )
        return StrategyChoice(rebuild, "strategy='rebuild' was asked for")
    if inputs.obstacle:
        return StrategyChoice(
            in_place, f"a rebuild is not possible ({inputs.obstacle})", rebuild_blocked=True
        )
    if inputs.triggers:
        return StrategyChoice(
            in_place, "the target has triggers, which an in-place load fires per row"
        )
    if inputs.target_bytes == 0:
        return StrategyChoice(rebuild, "the target is empty")
    bare = not inputs.indexes and not inputs.foreign_keys
    limit = BREAK_EVEN_BARE if bare else BREAK_EVEN[inputs.mode]
    ratio = inputs.target_bytes / max(inputs.load_bytes, 1)
    sizes = f"the target's {inputs.target_bytes} bytes are {ratio:.2f}x the load's "
    if ratio <= limit:
        return StrategyChoice(
            rebuild, f"{sizes}{inputs.load_bytes}, at most {limit}x: rebuilding is cheaper"
        )
    return StrategyChoice(
        in_place, f"{sizes}{inputs.load_bytes}, over {limit}x: inserting in place is cheaper"
    )


@dataclass(frozen=True)
class UniqueIndex:
    """A unique index of the target, as an upsert's key may match it (read by prepare).

    :param columns: its key columns in index order; empty when it has an expression.
    :param constraint: the PK or UNIQUE constraint it backs, if any.
    """

    name: str
    columns: tuple[str, ...]
    primary: bool = False
    constraint: str | None = None
    deferrable: bool = False
    partial: bool = False
    nulls_not_distinct: bool = False

    def describe(self) -> str:
        """``primary key (id)``, ``unique constraint u (a, b)`` or ``unique index i (a)``."""
        what = (
            "primary key"
            if self.primary
            else f"unique constraint {self.constraint}"
            if self.constraint
            else f"unique index {self.name}"
        )
        return f"{what} ({', '.join(self.columns) or 'an expression'})"


def _did_you_mean(unknown: Sequence[str], names: Sequence[str]) -> str:
    """`` (did you mean 'id'?)`` for the names closest to the unknown ones; empty if none."""
    close = [m for u in unknown for m in difflib.get_close_matches(u, names, n=1)]
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


def upsert_spec(
    request: LoadRequest,
    target: TargetDefinition,
    columns: Sequence[str],
    unique_indexes: Sequence[UniqueIndex],
) -> UpsertSpec:
    """The upsert's key: ``request.key`` or the primary key, matched to exactly one unique
    index of the target (``ON CONFLICT`` needs one to infer); refused in words otherwise."""
    name = target.qualified
    usable = [u for u in unique_indexes if u.columns and not u.partial]
    keys = "; ".join(u.describe() for u in usable) or "none"
    if request.key is None:
        index = next((u for u in usable if u.primary), None)
        if index is None:
            raise LoadRefusedError(
                f"upsert into {name} needs a key: the table has no primary key. Name the "
                f"columns of a unique constraint or unique index with key=[...] (its unique "
                f"keys: {keys})"
            )
        key = index.columns
    else:
        key = tuple(request.key)
        repeated = sorted({c for c in key if key.count(c) > 1})
        unknown = [c for c in key if c not in {col.name for col in target.columns}]
        if repeated or unknown:
            raise BadArgumentError(
                f"upsert key {list(key)} of {name}: "
                + (f"{unknown} are not columns of the table" if unknown else "")
                + _did_you_mean(unknown, [col.name for col in target.columns])
                + ("; " if repeated and unknown else "")
                + (f"{repeated} named twice" if repeated else "")
            )
        matches = [u for u in usable if set(u.columns) == set(key)]
        if not matches:
            raise LoadRefusedError(
                f"upsert key {list(key)} of {name} is not unique: it is not exactly the columns "
                "of the primary key or of a unique constraint or unique index (not a partial "
                f"one) of the table, so a loaded row could match several rows. Its unique keys: "
                f"{keys}"
            )
        index = next((u for u in matches if not u.deferrable), matches[0])
    if index.deferrable:
        raise LoadRefusedError(
            f"upsert key {list(key)} of {name}: its {index.describe()} is DEFERRABLE, which "
            "INSERT ... ON CONFLICT cannot use; make it NOT DEFERRABLE or use another key"
        )
    missing = [c for c in key if c not in columns]
    if missing:
        raise LoadRefusedError(
            f"upsert into {name}: key columns {missing} are not loaded (the loaded columns: "
            f"{list(columns)}); the key must come from the files"
        )
    by_name = {c.name: c for c in target.columns}
    always = [c for c in columns if by_name[c].identity == Identity.ALWAYS and c not in key]
    if always:
        raise LoadRefusedError(
            f"upsert into {name}: {always} are GENERATED ALWAYS AS IDENTITY and not part of the "
            "key, so an upsert cannot set them on rows it updates; leave them out of the loaded "
            "columns (they keep their values, new rows get new ones)"
        )
    return UpsertSpec(
        key=key,
        index=index.name,
        on_duplicate_key=request.on_duplicate_key,
        key_may_be_null=not index.nulls_not_distinct and any(not by_name[c].not_null for c in key),
        override_identity=any(by_name[c].identity == Identity.ALWAYS for c in key),
    )


KeyValue = int | str | None


def quantile_ranges(first: object, cuts: Sequence[object]) -> list[tuple[KeyValue, KeyValue]]:
    """The ranges a database source split by a column is read in, from the key's quantiles:
    ``first`` its smallest value, ``cuts`` the values that start each later range (the
    source's quantiles of the key, in order), so a skewed key still gives ranges of about
    equal row counts. Cuts repeated (one value holding several quantiles) or not above
    ``first`` are dropped: fewer ranges, none empty by construction. The first range has no
    low (it also takes the NULL keys), the last no high, so every row falls in exactly one,
    whatever changed since the quantiles were read. Values: integers, dates or timestamps,
    or their ISO texts; returned as JSON values (a date or timestamp as its ISO text)."""
    if first is None:  # no rows, or only NULL keys: one range takes them all
        return [(None, None)]
    to_number, from_number = _key_scale(first)
    floor = to_number(first)
    numbers = sorted({n for n in (to_number(c) for c in cuts if c is not None) if n > floor})
    bounds: list[KeyValue] = [None, *(from_number(n) for n in numbers), None]
    return list(itertools.pairwise(bounds))


_EPOCH = datetime.datetime(1970, 1, 1)
_MICROSECOND = datetime.timedelta(microseconds=1)


def _key_scale(value: object) -> tuple[Callable[[object], int], Callable[[int], KeyValue]]:
    """How a split key's values map to integers and back: an integer as itself, a date as its
    day number, a timestamp (with or without a time zone) as microseconds."""
    if isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None and len(value) == 10:  # a date
            return _days(lambda v: datetime.date.fromisoformat(str(v)))
        if parsed is not None:
            return _micros(lambda v: datetime.datetime.fromisoformat(str(v)), parsed.tzinfo)
    elif isinstance(value, int) and not isinstance(value, bool):
        return (lambda v: int(v)), (lambda n: n)  # type: ignore[call-overload]
    elif isinstance(value, datetime.datetime):
        return _micros(lambda v: v, value.tzinfo)  # type: ignore[arg-type,return-value]
    elif isinstance(value, datetime.date):
        return _days(lambda v: v)  # type: ignore[arg-type,return-value]
    raise LoadRefusedError(
        f"split_by: the column's values ({value!r}) are not integers, dates or timestamps; "
        "nothing was changed. Split by another column, or leave split_by out"
    )


def _days(
    read: Callable[[object], datetime.date],
) -> tuple[Callable[[object], int], Callable[[int], KeyValue]]:
    return (lambda v: read(v).toordinal()), (lambda n: datetime.date.fromordinal(n).isoformat())


def _micros(
    read: Callable[[object], datetime.datetime], tz: datetime.tzinfo | None
) -> tuple[Callable[[object], int], Callable[[int], KeyValue]]:
    epoch = _EPOCH.replace(tzinfo=tz) if tz else _EPOCH

    def to_number(v: object) -> int:
        return (read(v) - epoch) // _MICROSECOND

    def from_number(n: int) -> KeyValue:
        return (epoch + n * _MICROSECOND).isoformat()

    return to_number, from_number


def number_pieces(partitions: Sequence[Partition], file_order: Sequence[str]) -> list[Partition]:
    """The partitions with every piece's :attr:`~airflow_pg_bulk.plan.Piece.ordinal` set: its
    place in source order (files in ``file_order``, then byte order within a file), whatever
    partition it was packed into."""
    rank = {path: n for n, path in enumerate(file_order)}
    pieces = sorted(
        (rank.get(piece.path, len(rank)), piece.path, piece.start, part.index, n)
        for part in partitions
        for n, piece in enumerate(part.pieces)
    )
    ordinal = {(index, n): k for k, (*_, index, n) in enumerate(pieces)}
    return [
        dataclasses.replace(
            part,
            pieces=tuple(
                dataclasses.replace(piece, ordinal=ordinal[(part.index, n)])
                for n, piece in enumerate(part.pieces)
            ),
        )
        for part in partitions
    ]


def build_plan(
    request: LoadRequest,
    target: TargetDefinition,
    load_id: str,
    *,
    columns: Sequence[str],
    partitions: Sequence[Partition],
    source_bytes: int,
    logical_date: str | None = None,
    upsert: UpsertSpec | None = None,
    file_order: Sequence[str] = (),
    strategy: RowStrategy = RowStrategy.IN_PLACE,
    run: RunOrder | None = None,
    database: DatabaseSource | None = None,
    staging_layout: StagingLayout | None = None,
) -> LoadPlan:
    """The load's plan from what prepare read: the request, the target's captured definition,
    the columns (:func:`plan_columns`) and the source cut into partitions; for an upsert its
    key (:func:`upsert_spec`), and the pieces numbered in source order (``file_order``);
    ``strategy``: an append's or upsert's, as :func:`choose_strategy` resolved it;
    ``database``: a database source (None: files); ``staging_layout``: a partitioned
    target's, as :func:`choose_staging_layout` chose it (None: one plain staging table)."""
    if request.mode.keyed:
        if upsert is None:
            raise ValueError("an upsert's plan needs its key (planning.upsert_spec)")
        partitions = number_pieces(partitions, file_order)
    plan = LoadPlan(
        load_id=naming.check_load_id(load_id),
        mode=request.mode,
        target=target,
        staging_table=naming.staging_table(load_id),
        ledger_table=naming.ledger_table(load_id),
        staging_logged=staging_logged(request, target, strategy),
        columns=tuple(columns),
        copy=request.copy,
        partitions=tuple(partitions),
        settings=request.settings,
        source_bytes=source_bytes,
        errors=request.errors,
        reject_table=reject_table(request, target.schema),
        logical_date=logical_date,
        upsert=upsert,
        strategy=RowStrategy.IN_PLACE if request.mode.swaps_table else strategy,
        run=run,
        database=database,
        staging_layout=staging_layout or StagingLayout(),
    )
    return dataclasses.replace(plan, digest=plan_digest(plan))


# stamped after the plan is made, or the digest itself
_UNSTABLE = ("started_at", "prepared_at", "digest")


def plan_digest(plan: LoadPlan) -> str:
    """A digest of what the plan loads and how: the same for the same files, cut and target.

    Prepare writes it on the ledger; a prepare run again keeps a ledger with the same digest
    (and the partitions committed in it), and COPY and finalize refuse a ledger made for
    another plan."""
    data = {k: v for k, v in plan.to_dict().items() if k not in _UNSTABLE}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]
