"""A load's preview (``--dry-run``): what prepare would check and plan, and what finalize would
replace or add to, read without creating or changing anything (prepare's reads alone: the
target's definition and privileges, the source's listing and cut, the strategy's cost model,
the catalog's row estimates). The partitions a load's rows go to are known only once the rows
are read (finalize routes them): the preview lists each partition with the rows it holds now,
and says what happens to those that receive rows."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_pg_bulk import naming
from airflow_pg_bulk.db.driver import DatabaseConnection, execute, rollback_quietly
from airflow_pg_bulk.plan import LoadRequest, PlainData, planning
from airflow_pg_bulk.plan.figures import rows_in_words
from airflow_pg_bulk.source import formats, listing
from airflow_pg_bulk.sql.summary import row_estimates
from airflow_pg_bulk.target import catalog, history, rebuild, upsert

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

    def describe(self) -> str:
        """The preview in words."""
        lines = [
            "Dry run: nothing was created or changed. "
            f"This load ({self.mode}) into {self.table} would:",
            f"  read {len(self.files)} files, {self.source_bytes / 1e6:,.1f} MB:",
        ]
        lines += [f"    {path} ({size:,} bytes)" for path, size in self.files[:SHOWN_FILES]]
        if len(self.files) > SHOWN_FILES:
            lines.append(f"    ... and {len(self.files) - SHOWN_FILES} more")
        streams = ", ".join(f"{b / 1e6:,.1f}" for b in self.copy_streams[:8])
        more = ", ..." if len(self.copy_streams) > 8 else ""
        lines.append(f"  COPY it in {len(self.copy_streams)} COPY streams (MB: {streams}{more})")
        lines.append(f"  make the rows visible: {self.strategy} ({self.why})")
        lines.append(f"  {self.effect}; rows now (the catalog's estimates):")
        lines += [f"    {t.table}: {rows_in_words(t.rows, True)}" for t in self.tables]
        lines.append("  checks passed: " + "; ".join(self.checks))
        return "\n".join(lines)


def _effect(request: LoadRequest, partitioned: bool) -> str:
    mode = request.mode
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
        target = catalog.capture(conn, schema, table)
        catalog.refuse_unsupported(target, request.mode)
        catalog.refuse_without_privileges(conn, target, request.mode)
        history.refuse_without_access(conn, schema)
        checks = [
            f"the definition of {target.qualified} ({len(target.columns)} columns, "
            f"{len(target.indexes)} indexes, {len(target.constraints)} constraints"
            + (f", partitioned by {target.partitioning.key}" if target.partitioning else "")
            + ")",
            f"the privileges {request.mode} needs",
        ]
        source_format = formats.for_copy(request.copy)
        source_format.refuse_unsupported(request)
        files = listing.list_sources(request.source, request.source_conn_id)
        matched = source_format.match(files, planning.loadable_columns(target))
        columns = source_format.columns(request, target, matched)
        checks.append(f"the columns loaded: {', '.join(columns)}")
        if request.mode.keyed:
            spec = planning.upsert_spec(
                request, target, columns, upsert.unique_indexes(conn, target)
            )
            checks.append(f"the key: {', '.join(spec.key)}")
        total = sum(f.size for f in files)
        if request.mode.takes_strategy:
            strategy, why = rebuild.choose(conn, request, target, total)
        else:
            strategy, why = "swap", "a replace builds the new rows beside the target"
        streams = source_format.cut(files, request.partition_count(total), matched)
        estimates = execute(conn, row_estimates(target.oid))
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
        effect=_effect(request, target.partitioning is not None),
    )
