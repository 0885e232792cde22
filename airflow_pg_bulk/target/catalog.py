"""Capture the target's definition from the catalog, and refuse what a load cannot carry over."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from psycopg.sql import Composable

from airflow_pg_bulk import sql
from airflow_pg_bulk.db.driver import (
    DatabaseConnection,
    execute,
    execute_each,
    is_database_error,
    is_psycopg2,
    json_rows,
    read_each,
    read_prepared,
    rows_of_each,
    scalar,
    server_error,
)
from airflow_pg_bulk.errors import DUPLICATE_TABLE, UNIQUE_VIOLATION, LoadRefusedError
from airflow_pg_bulk.plan import (
    Column,
    ConstraintDef,
    Grant,
    IndexDef,
    LeafPartition,
    OwnedSequence,
    Partitioning,
    ReferencingKey,
    TargetDefinition,
    TriggerDef,
)
from airflow_pg_bulk.plan.codes import ConstraintKind, Mode, RelKind

#: reads to make with a capture, in its round trip: the queries for the table's oid (a number,
#: or an expression that finds it) and whether it is partitioned (see :func:`capture_with`)
AlsoRead = Callable[[sql.OidRef, bool], Sequence[Composable]]


def capture(
    conn: DatabaseConnection,
    schema: str,
    table: str,
    *,
    as_partition: bool = False,
    partitioned: bool | None = None,
) -> TargetDefinition:
    """Read the target's definition in the current transaction (search_path pinned).

    A partitioned target (one level of declarative partitioning) is captured with its key
    only (see :func:`_partitioning`: the cost does not grow with its number of
    partitions), and without its grants, dependent views and other dependents (no load
    swaps a partitioned table itself) or its own indexes and constraints (its partitions
    have them; a partition swapped is captured in full); ``as_partition``: the table is a
    leaf partition, captured as a part of its parent's definition (:func:`capture_leaves`);
    ``partitioned``: whether it is partitioned, when the caller knows (one round trip fewer:
    see :func:`capture_with`)."""
    return capture_with(conn, schema, table, as_partition=as_partition, partitioned=partitioned)[0]


def capture_with(
    conn: DatabaseConnection,
    schema: str,
    table: str,
    also: AlsoRead | None = None,
    *,
    as_partition: bool = False,
    partitioned: bool | None = None,
) -> tuple[TargetDefinition, list[list[tuple]]]:
    """:func:`capture`, and the rows of the reads ``also`` gives for the table (SELECTs that
    cannot fail), read in the capture's own round trip.

    :param partitioned: whether the table is a partitioned one, when the caller knows (a
        partition, captured ``as_partition``, is taken as a plain table): then, on psycopg 3,
        its queries go in the same round trip as the search for the table, and read its oid
        from where that round trip keeps it (:func:`airflow_pg_bulk.sql.remember_oids`): one
        round trip in all, where it takes two otherwise (should the table turn out to be of
        another kind, it is read again, as when not known)."""
    if as_partition:
        partitioned = False
    if partitioned is not None and not is_psycopg2(conn):
        ref = sql.remembered_oid(0)
        queries = _queries(ref, partitioned)
        extra = list(also(ref, partitioned)) if also is not None else []
        rows, found = _find_and_read(conn, schema, table, [*queries, *extra])
        if rows and _is_partitioned(rows[0], as_partition) == partitioned:
            definition = _definition(schema, table, rows[0], found[: len(queries)], as_partition)
            return definition, found[len(queries) :]
    # psycopg 3: each read pinned in its own string (_pinned_reads); psycopg2, one statement
    # at a time: in a transaction, pinned once
    psycopg2 = is_psycopg2(conn)
    if psycopg2:
        _pinned, rows = execute_each(conn, [sql.pin_search_path(), sql.find_table(schema, table)])
    else:
        (rows,) = _pinned_reads(conn, [sql.find_table(schema, table)])
    if not rows:
        raise LoadRefusedError(f"target table {schema}.{table} does not exist; create it first")
    oid = rows[0][0]
    kind = _is_partitioned(rows[0], as_partition)
    queries = _queries(oid, kind)
    extra = list(also(oid, kind)) if also is not None else []
    # one round trip for all of them (they were one each: 11 statements per capture)
    if psycopg2:
        found = rows_of_each(conn, [*queries, *extra])
    else:
        (((text,),),) = _pinned_reads(conn, [sql.rows_of_each([*queries, *extra])])
        found = json_rows(text)
    definition = _definition(schema, table, rows[0], found[: len(queries)], as_partition)
    return definition, found[len(queries) :]


def _find_and_read(
    conn: DatabaseConnection, schema: str, table: str, queries: list[Composable]
) -> tuple[list[tuple], list[list[tuple]]]:
    """One statement string, under search_path pinned: ``schema.table`` found (its row of
    ``sql.find_table``: none when it does not exist), its oid kept
    (``sql.remembered_oid(0)``), and ``queries``, which may read it: the table's row and
    each query's rows. In the open transaction, or, with none open, in autocommit: reads
    only, and a BEGIN and a ROLLBACK fewer (prepare's capture)."""
    rows, _kept, ((text,),) = _pinned_reads(
        conn,
        [
            sql.find_table(schema, table),
            sql.remember_oids([(schema, table)]),
            sql.rows_of_each(queries),
        ],
    )
    return rows, json_rows(text)


def _pinned_reads(conn: DatabaseConnection, statements: Sequence[Composable]) -> list[list[tuple]]:
    """Each of ``statements``' rows, read under search_path pinned, in one string on psycopg
    3: in the open transaction, or, with none open, in autocommit (the string is then one
    implicit transaction, the pin in force to its end)."""
    _pinned, *rows = read_each(conn, [sql.pin_search_path(), *statements])
    return rows


def _is_partitioned(row: tuple, as_partition: bool) -> bool:
    """Whether a table, by its row of :func:`airflow_pg_bulk.sql.find_table`, is captured as a
    partitioned one."""
    return row[1] == RelKind.PARTITIONED and not as_partition


def _queries(oid: sql.OidRef, partitioned: bool) -> list[Composable]:
    """The queries of a capture, in the order :func:`_definition` reads their rows."""
    queries = [
        sql.table_columns(oid),
        sql.table_triggers(oid),
        sql.referencing_keys(oid),
        sql.owned_sequences(oid),
    ]
    if partitioned:
        # a partitioned target stays in place (its partitions are loaded, swapped or
        # emptied): its grants, the views that read it and the other objects that depend
        # on it are what a swap of the whole table would have to carry over, and no load
        # swaps it. Not read: in the dependency catalog each partition is one of its
        # dependents, which made this capture grow with their number. Nor its own indexes
        # and constraints: each partition has them (PostgreSQL makes them on every
        # partition, and on a partition attached), a partition swapped is built from its
        # own definition, captured in full, and that definition is checked again under the
        # swap's lock; a load into the parent in place goes through whatever indexes and
        # constraints it has when it inserts. (Read, they were 4 of the ~12 ms this capture
        # took in a new session at 1,826 partitions: RESULTS-incremental, sixth pass.)
        return [*queries, sql.partition_key(oid), sql.unsupported_partition(oid)]
    return [
        *queries,
        sql.table_indexes(oid),
        sql.table_constraints(oid),
        sql.table_grants(oid),
        sql.dependent_views(oid),
        sql.unsupported_dependents(oid),
    ]


def _definition(
    schema: str, table: str, row: tuple, found: list[list[tuple]], as_partition: bool
) -> TargetDefinition:
    """The definition from the table's row of :func:`airflow_pg_bulk.sql.find_table` and the
    rows of its :func:`_queries`; refuses a table of a kind no load goes into."""
    oid, relkind, persistence, owner, reloptions, is_partition, rls, comment, inherits = row
    partitioned = _is_partitioned(row, as_partition)
    if partitioned and is_partition:
        raise LoadRefusedError(
            f"target {schema}.{table} is itself a table partition of a partitioned table; "
            "load into its top-level parent (multi-level partitioning is not supported)"
        )
    if relkind != RelKind.TABLE and not partitioned:
        kinds = {
            RelKind.PARTITIONED: "a partitioned table",
            RelKind.VIEW: "a view",
            RelKind.MATERIALIZED_VIEW: "a materialized view",
            RelKind.FOREIGN_TABLE: "a foreign table",
        }
        raise LoadRefusedError(
            f"target {schema}.{table} is {kinds.get(relkind, 'not a plain table')}; "
            "only plain tables are supported as targets"
        )
    column_rows, trigger_rows, referencing_rows, sequence_rows, *rest = found
    index_rows: list[tuple] = []
    constraint_rows: list[tuple] = []
    grant_rows: list[tuple] = []
    view_rows: list[tuple] = []
    blocker_rows: list[tuple] = []
    partition_rows: list[list[tuple]] = []
    if partitioned:
        partition_rows = rest
    else:
        index_rows, constraint_rows, grant_rows, view_rows, blocker_rows = rest
    columns = []
    column_comments = {}
    for name, type_, not_null, generated, identity, col_comment in column_rows:
        columns.append(Column(name, type_, not_null, generated, identity))
        if col_comment is not None:
            column_comments[name] = col_comment
    indexes = []
    for name, unique, definition, prefix, con_name, con_kind, idx_comment in index_rows:
        if con_kind == ConstraintKind.EXCLUSION:
            continue  # an exclusion constraint builds its own index
        if not definition.startswith(prefix):
            raise LoadRefusedError(
                f"cannot read the definition of index {name} on {schema}.{table}: {definition}"
            )
        indexes.append(IndexDef(name, unique, definition[len(prefix) :], con_name, idx_comment))
    constraints = []
    problems = []
    for (
        name,
        kind,
        definition,
        validated,
        index,
        con_comment,
        self_ref,
        deferrable,
        deferred,
    ) in constraint_rows:
        if self_ref:
            problems.append(f"it has a foreign key to itself ({name})")
        constraints.append(
            ConstraintDef(
                name, kind, definition, validated, index, con_comment, deferrable, deferred
            )
        )
    triggers = tuple(
        TriggerDef(name, definition, enabled) for name, definition, enabled in trigger_rows
    )
    grants = tuple(
        Grant(grantee, privilege, grantable, column)
        for grantee, privilege, grantable, column in grant_rows
    )
    referencing = tuple(ReferencingKey(*row) for row in referencing_rows)
    sequences = tuple(OwnedSequence(*row) for row in sequence_rows)
    views = []
    for view_schema, view_name, view_kind, _body, _options in view_rows:
        if view_kind == RelKind.VIEW:
            views.append(f"{view_schema}.{view_name}")
        else:
            problems.append(
                f"materialized view {view_schema}.{view_name} reads it (a replace "
                "would have to drop it; refresh it after an append instead)"
            )
    blockers = [row[0] for row in blocker_rows]
    if is_partition and not as_partition:
        problems.append("it is a table partition of a partitioned table")
    if inherits and not partitioned and not as_partition:
        problems.append("it takes part in table inheritance")
    if rls:
        problems.append("it has row-level security enabled")
    problems.extend(f"{b} depends on it" for b in blockers)
    definition = TargetDefinition(
        schema=schema,
        table=table,
        oid=oid,
        owner=owner,
        persistence=persistence,
        columns=tuple(columns),
        indexes=tuple(indexes),
        constraints=tuple(constraints),
        triggers=triggers,
        grants=grants,
        referencing_keys=referencing,
        dependent_views=tuple(views),
        sequences=sequences,
        reloptions=tuple(reloptions),
        comment=comment,
        column_comments=column_comments,
        unsupported=tuple(problems),
        partitioning=_partitioning(schema, table, *partition_rows) if partitioned else None,
    )
    return definition


def _partitioning(schema: str, table: str, key: list[tuple], odd: list[tuple]) -> Partitioning:
    """The key and strategy of a partitioned target (its row of ``sql.partition_key``); its leaves
    are not captured here (a load captures the partitions its rows go to, when it knows
    them: :func:`capture_leaves`), but a sub-partitioned (multi-level) target and a
    foreign-table partition (``odd``: the rows of ``sql.unsupported_partition``, one
    catalog query whatever the number of partitions) are refused."""
    if odd:
        leaf_schema, name, relkind = odd[0]
        if relkind == RelKind.PARTITIONED:
            raise LoadRefusedError(
                f"target {schema}.{table} is partitioned on more than one level (its table "
                f"partition {leaf_schema}.{name} is partitioned too); multi-level partitioning is "
                "not supported: load each sub-partitioned table partition as its own target"
            )
        raise LoadRefusedError(
            f"table partition {leaf_schema}.{name} of {schema}.{table} is not a plain table "
            "(a foreign table?); only plain tables are supported as table partitions"
        )
    (text, strategy, columns), *_ = key
    return Partitioning(text, strategy, columns=tuple(tuple(c) for c in columns))


def capture_leaves(
    conn: DatabaseConnection,
    target: TargetDefinition,
    names: list[tuple[str, str]],
    *,
    found: list[tuple] | None = None,
    read: list[list[tuple]] | None = None,
) -> Partitioning:
    """The target's partitioning with the leaves ``names`` ((schema, name) pairs) captured in
    full (each one's own definition), and what a partition-wise load cannot carry over for
    them, in words. A name that is no longer a partition of the target is left out. Each
    one's definition is read by the session's prepared statement (:func:`_read_leaf`).

    :param found: their rows of ``sql.leaf_partitions``, read already with ``read``, their
        rows of :func:`leaf_queries` (the check under the swap's lock); without them, each
        partition is found and read in one round trip of its own (search_path pinned)."""
    parts = target.partitioning
    if parts is None:
        raise ValueError(f"{target.qualified} is not partitioned")
    leaves = []
    if found is not None and read is not None:
        rows_of = dict(zip(names, read, strict=True))
        for leaf_schema, name, relkind, bound, constraint in found:
            _refuse_odd_leaf(target, leaf_schema, name, relkind)
            (row,) = rows_of[leaf_schema, name]
            (_chosen, definition) = _read_leaf(
                conn, [sql.choose_leaf(sql.leaf_oid_of(leaf_schema, name))]
            )
            leaves.append(
                LeafPartition(
                    bound,
                    constraint,
                    _definition(leaf_schema, name, row, definition, as_partition=True),
                )
            )
    else:
        for leaf_schema, name in names:
            leaf = _capture_leaf(conn, target, leaf_schema, name)
            if leaf is not None:
                leaves.append(leaf)
        if not leaves:  # (the capture of a leaf pins it; callers go on under the pin)
            execute(conn, sql.pin_search_path())
    return dataclasses.replace(
        parts, leaves=tuple(leaves), unsupported=leaf_problems(target, leaves)
    )


def leaf_queries(names: Sequence[tuple[str, str]]) -> list[Composable]:
    """The reads that begin the capture of the partitions ``names``, for a round trip of
    the caller's (with ``sql.leaf_partitions`` of the same names; :func:`capture_leaves`
    reads the rest, each partition's definition, in a prepared statement): for each, its
    row of ``sql.find_table``."""
    return [sql.find_table(leaf_schema, name) for leaf_schema, name in names]


def _read_leaf(
    conn: DatabaseConnection, before: Sequence[Composable]
) -> tuple[list[list[tuple]], list[list[tuple]]]:
    """``before`` (statements that end with ``sql.choose_leaf``, in the current transaction,
    search_path pinned) and the rows of the capture's queries of the partition chosen: the
    rows of each of ``before``, and of each query. One statement text for every partition,
    prepared (:func:`airflow_pg_bulk.db.driver.read_prepared`): planned once per session,
    where planning is most of its cost (about 2.8 of 3.9 ms warm for a partition's 10
    queries, PostgreSQL 15): finalize captures each partition it swaps when it routes the
    rows, and again under the swap's lock, with the plan made the first time."""
    name, query = _leaf_capture()
    *first, ((text,),) = read_prepared(conn, name, query, before=before)
    return first, json_rows(text)


@functools.cache
def _leaf_capture() -> tuple[str, Composable]:
    """A partition's capture as one statement, and the name it is prepared under: a hash of
    its text (a server session that a pooler kept from another version of this package
    holds another text under another name)."""
    query = sql.rows_of_each(_queries(sql.leaf_oid(), partitioned=False))
    digest = hashlib.sha1(query.as_string(None).encode()).hexdigest()[:16]
    return "pgbulk_leaf_" + digest, query


def _capture_leaf(
    conn: DatabaseConnection, target: TargetDefinition, leaf_schema: str, name: str
) -> LeafPartition | None:
    """The partition ``leaf_schema.name`` of ``target`` captured in full, with its bound, in
    one round trip on psycopg 3 (in a transaction): search_path pinned, its row, its row of
    ``sql.leaf_partitions``, and its definition (:func:`_read_leaf`). None when it is no
    partition of ``target`` (any more)."""
    (_pinned, rows, partition_rows, _chosen), found = _read_leaf(
        conn,
        [
            sql.pin_search_path(),
            sql.find_table(leaf_schema, name),
            sql.leaf_partitions(target.oid, [(leaf_schema, name)]),
            sql.choose_leaf(sql.leaf_oid_of(leaf_schema, name)),
        ],
    )
    if not partition_rows or not rows:
        return None
    ((_schema, _name, relkind, bound, constraint),) = partition_rows
    _refuse_odd_leaf(target, leaf_schema, name, relkind)
    definition = _definition(leaf_schema, name, rows[0], found, as_partition=True)
    return LeafPartition(bound, constraint, definition)


def _refuse_odd_leaf(target: TargetDefinition, leaf_schema: str, name: str, relkind: str) -> None:
    if relkind != RelKind.TABLE:
        raise LoadRefusedError(
            f"table partition {leaf_schema}.{name} of {target.qualified} is not a plain table; "
            "only plain-table leaf partitions of one level are supported"
        )


def leaf_problems(target: TargetDefinition, leaves: Sequence[LeafPartition]) -> tuple[str, ...]:
    """What a partition-wise load cannot carry over for these partitions of ``target``."""
    problems = []
    inherited_triggers = {trigger.name for trigger in target.triggers}
    for partition in leaves:
        leaf = partition.definition
        where = f"its table partition {leaf.qualified}"
        if leaf.schema != target.schema:
            problems.append(f"{where} is in another schema")
        problems.extend(f"{where}: {problem}" for problem in leaf.unsupported)
        problems.extend(f"view {view} reads {where}" for view in leaf.dependent_views)
        problems.extend(
            f"{where} has a trigger of its own ({trigger.name})"
            for trigger in leaf.triggers
            if trigger.name not in inherited_triggers
        )
        if leaf.referencing_keys:
            problems.append(f"foreign keys reference {where}")
    return tuple(problems)


#: at most this many distinct partition-key values are routed by the planner's partition
#: pruning (:func:`partitions_of_rows`); with more, every partition is a candidate
MAX_ROUTED_KEYS = 1000


def partitions_of_rows(
    conn: DatabaseConnection, target: TargetDefinition, staging: str, staged: Sequence[str]
) -> list[tuple[str, str]] | None:
    """The partitions of ``target`` that the rows of the table ``staging`` (in the target's
    schema, with the columns ``staged``) go to, as (schema, name), found without reading
    the catalog of every partition: the distinct values of the partition key in staging,
    and the partitions the planner's partition pruning keeps for a query on the target for
    exactly those values (EXPLAIN: nothing is read from the target, and only those
    partitions are opened). A value that no partition takes prunes every one: such a row
    is found when the rows are routed or checked against the partitions' bounds.

    None: every partition is a candidate (the key has an expression or a column that is
    not staged, or the rows have more than :data:`MAX_ROUTED_KEYS` distinct key values)."""
    key = _staged_key(conn, target, staged)
    if key is None:
        return None
    names = [name for name, _type in key]
    values = execute(conn, sql.distinct_keys(target.schema, staging, names, MAX_ROUTED_KEYS + 1))
    if len(values) > MAX_ROUTED_KEYS:
        return None
    if not values:
        return []
    return _pruned(conn, target, key, values)


#: a direct partition of a partitioned table as :func:`sql.leaf_partitions` and
#: :func:`sql.newest_leaves` read it: schema, name, relkind, bound, partition constraint (None
#: for a lone DEFAULT partition)
PartitionRow = tuple[str, str, str, str, str | None]

#: a load into one partition looks first among the target's newest partitions, this many
#: (:func:`newest_partition_of_a_row`): a daily load's, with up to 7 made ahead of it
NEWEST_PARTITIONS = 8


def newest_partition_of_a_row(
    conn: DatabaseConnection, target: TargetDefinition, staging: str
) -> PartitionRow | None:
    """The partition of ``target`` whose constraint the first row of the table ``staging``
    satisfies, among the :data:`NEWEST_PARTITIONS` made last, as :func:`sql.leaf_partitions`
    describes it; None: none of them takes it (or no row). Two small reads, without the
    parent's partition descriptor that :func:`partition_of_a_row` has the planner build:
    with 1,826 daily partitions that build was 17-23 ms of a day's 0.1 s reload (the load
    by hand builds it twice, for DETACH and ATTACH). Partitions do not overlap: the one
    this row satisfies is the only one it can go to, and a CHECK of its constraint then
    confirms it for every row."""
    candidates = execute(conn, sql.newest_leaves(target.oid, NEWEST_PARTITIONS))
    if not candidates:
        return None
    found = execute(
        conn,
        sql.constraint_of_first_row(
            target.schema, staging, [constraint for *_leaf, constraint in candidates]
        ),
    )
    if not found or found[0][0] is None:
        return None
    return candidates[found[0][0]]


def partition_of_a_row(
    conn: DatabaseConnection, target: TargetDefinition, staging: str, staged: Sequence[str]
) -> tuple[str, str] | None:
    """The partition of ``target`` that one row of the table ``staging`` (the first one read)
    goes to, as (schema, name), by partition pruning as :func:`partitions_of_rows` finds
    them, without reading the other rows: the likely partition of every row when a load
    goes to one (a daily or monthly reload), for a CHECK of its bound to confirm. None: no
    row, a key with an expression or a column not staged, or no single partition takes it."""
    key = _staged_key(conn, target, staged)
    if key is None:
        return None
    names = [name for name, _type in key]
    values = execute(conn, sql.distinct_keys(target.schema, staging, names, 1, distinct=False))
    found = _pruned(conn, target, key, values) if values else []
    return found[0] if len(found) == 1 else None


def _staged_key(
    conn: DatabaseConnection, target: TargetDefinition, staged: Sequence[str]
) -> list[tuple[str, str]] | None:
    """The partition key's (column, type), or None when it has an expression or a column
    that is not staged: as prepare captured it (a plan made before it did: read now)."""
    parts = target.partitioning
    key = list(parts.columns) if parts is not None and parts.columns else []
    if not key:
        key = execute(conn, sql.partition_key_columns(target.oid))
    if not key or any(name is None or name not in staged for name, _type in key):
        return None
    return [(name, type_) for name, type_ in key]


def _pruned(
    conn: DatabaseConnection,
    target: TargetDefinition,
    key: list[tuple[str, str]],
    values: list[tuple[Any, ...]],
) -> list[tuple[str, str]]:
    """The partitions the planner's partition pruning keeps for these key values (EXPLAIN)."""
    _set, ((found,),) = execute_each(
        conn,
        [
            sql.set_config("enable_partition_pruning", "on", local=True),
            sql.partitions_for_keys(target.schema, target.table, key, values),
        ],
    )
    return sorted(_scanned(json.loads(found) if isinstance(found, str) else found))


def _scanned(node: Any) -> set[tuple[str, str]]:
    """Every (schema, relation) an EXPLAIN (FORMAT JSON, VERBOSE) plan scans."""
    found: set[tuple[str, str]] = set()
    if isinstance(node, list):
        for item in node:
            found |= _scanned(item)
    elif isinstance(node, dict):
        if "Relation Name" in node:
            found.add((node["Schema"], node["Relation Name"]))
        for value in node.values():
            if isinstance(value, (list, dict)):
                found |= _scanned(value)
    return found


def refuse_without_privileges(
    conn: DatabaseConnection,
    target: TargetDefinition,
    mode: Mode,
    *,
    privileges: Sequence[Any] | None = None,
) -> None:
    """Raise :class:`LoadRefusedError` before anything is loaded when the session's role lacks
    a privilege the load needs (see the README's privileges table). ``privileges``: the row of
    ``sql.loader_privileges`` when the caller read it already (with its other reads)."""
    if privileges is None:
        privileges = execute(conn, sql.loader_privileges(target.oid))[0]
    owner, insert, create, role, update = privileges
    name = target.qualified
    if mode.swaps_table and not owner:
        raise LoadRefusedError(
            f"replace of {name} needs the role {role} to own it (its owner is {target.owner}; "
            f"e.g. GRANT {target.owner} TO {role}); or use mode='append'"
        )
    if mode is Mode.APPEND and not insert:
        raise LoadRefusedError(f"append to {name} needs INSERT on it for the role {role}")
    if mode.keyed and not (insert and update):
        raise LoadRefusedError(
            f"upsert into {name} needs INSERT and UPDATE on it for the role {role}"
        )
    if not create:
        raise LoadRefusedError(
            f"the load needs CREATE on schema {target.schema} for the role {role}: its staging "
            "and ledger tables are created there"
        )


def refuse_unsupported(target: TargetDefinition, mode: Mode) -> None:
    """Raise :class:`LoadRefusedError` when ``mode`` cannot keep the target intact."""
    parts = target.partitioning
    if mode.replaces_loaded_partitions and parts is None:
        raise LoadRefusedError(
            f"replace_partitions needs a partitioned target; {target.qualified} is a plain "
            "table (use mode='replace')"
        )
    if parts is not None:
        problems = list(parts.unsupported)
        if target.referencing_keys:
            problems.append("foreign keys reference it")
        if mode.swaps_table and problems:
            raise LoadRefusedError(
                f"{mode} of the partitioned {target.qualified} refused before anything "
                "changed: " + "; ".join(problems) + ". Its table partitions are replaced by "
                "tables built beside them, which cannot carry these over"
            )
        return
    if mode.swaps_table and target.unsupported:
        raise LoadRefusedError(
            f"replace of {target.qualified} refused before anything changed: "
            + "; ".join(target.unsupported)
            + ". A replace swaps in a new table and cannot carry these over; "
            "use mode='append' or remove them first"
        )


def create_if_missing(
    conn: DatabaseConnection, table: tuple[str, ...], create: Callable[..., Any]
) -> None:
    """Create a table loads share unless it exists, safe against concurrent loads.

    (CREATE ... IF NOT EXISTS would need CREATE on the schema every time, and can still
    collide in the catalog with a concurrent CREATE. After waiting for the creation lock this
    transaction's catalog view may predate the other load's commit, so a collision is caught
    at a savepoint and taken as "it exists".)"""
    if scalar(conn, sql.relation_exists(*table)):
        return
    execute(conn, sql.creation_lock(*table))
    execute(conn, sql.savepoint("pgbulk_create"))
    try:
        execute(conn, create(*table))
    except Exception as exc:
        if not is_database_error(exc) or server_error(exc).sqlstate not in _ALREADY_THERE:
            raise
        execute(conn, sql.rollback_to("pgbulk_create"))
    execute(conn, sql.release("pgbulk_create"))


_ALREADY_THERE = {DUPLICATE_TABLE, UNIQUE_VIOLATION}  # the latter in pg_type/pg_class
