"""A load's preview (``--dry-run``): what prepare would check and plan, and what finalize would
replace or add to, without keeping or changing anything: prepare's reads (the target's
definition and privileges, the source's listing and cut, the strategy's cost model), the
catalog's row estimates, and, for a partitioned target, the partitions the rows go to: the
source COPYed once into a staging table in a transaction that is rolled back (nothing of it
stays; the source is read once more than by the load itself, a stream never)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pg_bulk import naming, sql
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, rollback_quietly
from airflow_pg_bulk.loading import sources, survey
from airflow_pg_bulk.loading.copy import PartitionCopy
from airflow_pg_bulk.plan import (
    LoadPlan,
    LoadRequest,
    PlainData,
    TargetDefinition,
    UpsertSpec,
    planning,
)
from airflow_pg_bulk.plan.codes import Mode
from airflow_pg_bulk.plan.figures import rows_in_words
from airflow_pg_bulk.source import formats
from airflow_pg_bulk.source.listing import SourceFile, SourceKind
from airflow_pg_bulk.sql.summary import row_estimates
from airflow_pg_bulk.target import catalog, rebuild, strategies

SHOWN_FILES = 20  # files listed by name in the text; the rest counted


@dataclass(frozen=True)
class PreviewTable(PlainData):
    """The target, or one of its table partitions, as it is now.

    :param table: ``schema.name``.
    :param rows: the rows it holds now, the catalog's estimate (``pg_class.reltuples``;
        None: never analyzed).
    """

    table: str
    rows: int | None


@dataclass(frozen=True)
class Preview(PlainData):
    """What a load would do, nothing created or changed (see the module's docstring).

    :param table: the target, ``schema.table``.
    :param mode: the load mode.
    :param files: each file or object, with its size in bytes.
    :param source_bytes: their total.
    :param copy_streams: the bytes of each COPY stream the source would be cut into.
    :param strategy: how the rows would become visible (append and upsert: ``in_place`` or
        ``rebuild``, as ``strategy=auto`` picks; replace: a swap).
    :param why: why that strategy.
    :param checks: the checks passed (definition, privileges, columns, key).
    :param tables: the target (plain) or each of its partitions, with the rows it holds now.
    :param effect: what the load does to them, in words.
    :param receiving: the table partitions the rows go to (``schema.name``), found by reading
        the source once into a table that is rolled back; None: not read (a plain target, a
        stream, which is read once, or ``on_error="reject"``).
    :param database: a database source: what is read and where (its URL's password masked);
        None: files.
    """

    table: str
    mode: str
    files: tuple[tuple[str, int], ...]
    source_bytes: int
    copy_streams: tuple[int, ...]
    strategy: str
    why: str
    checks: tuple[str, ...]
    tables: tuple[PreviewTable, ...]
    effect: str
    receiving: tuple[str, ...] | None = None
    database: str | None = None

    def describe(self, heading: str | None = None) -> str:
        """The preview in words.

        :param heading: the first line (default: a dry run's, which says nothing was kept or
            changed)."""
        lines = [
            heading
            or "Dry run: nothing was kept or changed. "
            f"This load ({self.mode}) into {self.table} would:",
            f"  read {self.database}"
            if self.database
            else f"  read {len(self.files)} files, {self.source_bytes / 1e6:,.1f} MB:",
        ]
        lines += [f"    {path} ({size:,} bytes)" for path, size in self.files[:SHOWN_FILES]]
        if len(self.files) > SHOWN_FILES:
            lines.append(f"    ... and {len(self.files) - SHOWN_FILES} more")
        streams = ", ".join(f"{b / 1e6:,.1f}" for b in self.copy_streams[:8])
        more = ", ..." if len(self.copy_streams) > 8 else ""
        sizes = "" if self.database else f" (MB: {streams}{more})"
        lines.append(f"  COPY it in {len(self.copy_streams)} COPY streams{sizes}")
        lines.append(f"  make the rows visible: {self.strategy} ({self.why})")
        lines.append(f"  {self.effect}; rows now (the catalog's estimates):")
        got = set(self.receiving or ())
        lines += [
            f"    {t.table}: {rows_in_words(t.rows, True)}"
            + ("  <- receives rows" if t.table in got else "")
            for t in self.tables
        ]
        if self.receiving is not None:
            lines.append(
                f"  the rows go to {len(got)} of the {len(self.tables)} table partitions "
                "(the source read once, into a table rolled back)"
            )
        lines.append("  checks passed: " + "; ".join(self.checks))
        return "\n".join(lines)


def _effect(mode: Mode, partitioned: bool) -> str:
    if not partitioned:
        if mode.keyed:
            return "merge the rows into the table by the key (rows with a loaded key updated)"
        return "replace every row of the table" if mode.replaces_rows else "add the rows"
    if mode.whole_target:
        return "replace every table partition: those receiving no row are emptied"
    if mode.replaces_loaded_partitions:
        return (
            "replace each table partition that receives a row by exactly the rows loaded into "
            "it (a partition of a month loaded with a day's rows ends with that day's rows); "
            "the others are untouched"
        )
    if mode.keyed:
        return "merge the rows into the table partitions they go to, by the key"
    return "add the rows to the table partitions they go to"


def preview(conn: DatabaseConnection, request: LoadRequest) -> Preview:
    """What a load of ``request`` would do; raises what prepare would refuse. Reads only (each
    read transaction rolled back)."""
    schema, table = naming.split_name(request.table)
    try:
        found = survey.survey(conn, request, schema, table)
        target, files, total = found.target, found.files, found.total_bytes
        parts = (  # (a partitioned target's indexes and constraints are its partitions')
            f"partitioned by {target.partitioning.key}"
            if target.partitioning
            else f"{len(target.indexes)} indexes, {len(target.constraints)} constraints"
        )
        checks = [
            f"the definition of {target.qualified} ({len(target.columns)} columns, {parts})",
            f"the privileges {request.mode} needs",
            f"the columns loaded: {', '.join(found.columns)}",
        ]
        if found.key is not None:
            checks.append(f"the key: {', '.join(found.key.key)}")
        if request.mode.takes_strategy:
            choice = rebuild.choose(conn, request, target, total)
            strategy, why = str(choice.strategy), choice.why
        else:
            strategy, why = "swap", "a replace builds the new rows beside the target"
        streams = found.source.format.cut(files, request.partition_count(total), found.matched)
        estimates = execute(conn, row_estimates(target.oid))
        conn.rollback()
        receiving = _receiving(
            conn,
            request,
            target,
            (found.source.format, files, found.matched),
            found.columns,
            found.key,
        )
    finally:
        rollback_quietly(conn)
    return Preview(
        table=target.qualified,
        mode=str(request.mode),
        files=tuple((f.path, f.size) for f in files),
        source_bytes=total,
        copy_streams=tuple(p.bytes for p in streams),
        strategy=strategy,
        why=why,
        checks=tuple(checks),
        tables=tuple(PreviewTable(f"{s}.{n}", None if r < 0 else int(r)) for s, n, r in estimates),
        effect=_effect(request.mode, target.partitioning is not None),
        receiving=receiving,
        database=found.source.shown,
    )


def _receiving(
    conn: DatabaseConnection,
    request: LoadRequest,
    target: TargetDefinition,
    source: tuple[formats.Format, Sequence[SourceFile], formats.Matched],
    columns: Sequence[str],
    spec: UpsertSpec | None,
) -> tuple[str, ...] | None:
    """The table partitions the rows go to: the source COPYed once, as one COPY stream, into
    a staging table made as prepare makes it, the partitions found as finalize finds them
    (:func:`airflow_pg_bulk.target.catalog.partitions_of_rows`), all in one transaction the
    caller rolls back. None where it is not read (see :attr:`Preview.receiving`) or the key
    has an expression."""
    if target.partitioning is None or request.errors.rejecting:
        return None
    source_format, files, matched = source
    if any(f.kind is SourceKind.STREAM for f in files):
        return None
    whole = source_format.cut(files, 1, matched)  # whole files (no guessed record start)
    plan = planning.build_plan(
        request,
        target,
        naming.new_load_id(),
        columns=columns,
        partitions=whole,
        source_bytes=sum(f.size for f in files),
        upsert=spec,
        file_order=[f.path for f in files],
        database=matched.database,
    )
    execute(conn, sql.set_config("lock_timeout", request.settings.lock_timeout, local=True))
    strategies.for_plan(plan).create_staging(conn, plan)
    for part in plan.partitions:
        copying = PartitionCopy(conn, plan, part, None)
        try:
            for piece in part.pieces:
                copying.copy(piece)
        finally:
            copying.close()
    found = catalog.partitions_of_rows(conn, target, plan.staging_table, list(plan.columns))
    return None if found is None else tuple(f"{s}.{n}" for s, n in found)


def of_plan(conn: DatabaseConnection, plan: LoadPlan) -> Preview:
    """What a prepared load will do, from its plan: what prepare logs under Airflow before any
    row is copied and before the target is touched. One read of the catalog (the row
    estimates), rolled back; the partitions that receive rows are known only once the rows
    are staged (see :func:`preview` for a dry run that finds them)."""
    t = plan.target
    try:
        estimates = execute(conn, row_estimates(t.oid))
    finally:
        rollback_quietly(conn)
    files: dict[str, int] = {}
    for part in plan.partitions:
        for piece in part.pieces:
            files.setdefault(piece.path, piece.source_size or 0)
    swap = not plan.mode.takes_strategy
    return Preview(
        table=t.qualified,
        mode=str(plan.mode),
        files=tuple(files.items()),
        source_bytes=plan.source_bytes,
        copy_streams=tuple(p.bytes for p in plan.partitions),
        strategy="swap" if swap else plan.strategy,
        why="a replace builds the new rows beside the target" if swap else "chosen in prepare",
        checks=(
            f"the definition of {t.qualified}",
            f"the privileges {plan.mode} needs",
            f"the columns loaded: {', '.join(plan.columns)}",
        ),
        tables=tuple(PreviewTable(f"{s}.{n}", None if r < 0 else int(r)) for s, n, r in estimates),
        effect=_effect(plan.mode, t.partitioning is not None),
        database=sources.for_plan(plan).shown,
    )
