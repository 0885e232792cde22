"""Names of the objects a load creates, derived from its load id alone.

Cleanup can therefore find everything a run created even when prepare failed before it could
return a plan.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_pg_bulk.plan import LoadPlan

PREFIX = "_pgbulk_"
_LOAD_ID = re.compile(r"^[0-9a-f]{12}$")


def new_load_id() -> str:
    """A fresh random load id (12 hex characters)."""
    return uuid.uuid4().hex[:12]


def load_id_for(*parts: str) -> str:
    """A load id that is the same every time for the same parts (DAG id, run id, group id)."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
    return digest[:12]


def check_load_id(load_id: str) -> str:
    """Return ``load_id`` if it is well formed, else raise ValueError."""
    if not _LOAD_ID.match(load_id):
        raise ValueError(f"load id must be 12 lowercase hex characters, not {load_id!r}")
    return load_id


APPLICATION_NAME_BYTES = 63  # what PostgreSQL keeps of application_name (NAMEDATALEN - 1)


def application_name(load_id: str, what: str, index: int | None = None) -> str:
    """The ``application_name`` of a load's session: ``pgbulk:<load_id>:<what>[<index>]``.

    ``what`` is ``<dag_id>.<task_id>`` under Airflow, or the step (``copy``) in one process;
    ``index`` the map index or partition (none or negative: left out). At most 63 bytes, all
    printable ASCII (anything else becomes ``?``); a long ``what`` loses its middle (``..``),
    never the load id or the index."""
    head = f"pgbulk:{check_load_id(load_id)}:"
    tail = f"[{index}]" if index is not None and index >= 0 else ""
    text = "".join(c if " " <= c <= "~" else "?" for c in what)
    room = APPLICATION_NAME_BYTES - len(head) - len(tail)
    if len(text) > room:
        keep = room - 2
        text = text[: keep - keep // 2] + ".." + text[len(text) - keep // 2 :]
    return head + text + tail


def staging_table(load_id: str) -> str:
    """The staging table that the COPY tasks fill."""
    return f"{PREFIX}{check_load_id(load_id)}_stage"


def ledger_table(load_id: str) -> str:
    """The ledger: one row per loaded partition, committed with the partition's rows."""
    return f"{PREFIX}{check_load_id(load_id)}_ledger"


#: a LIKE pattern matching every load's ledger (see :func:`load_of_ledger`)
LEDGER_PATTERN = "\\_pgbulk\\_%\\_ledger"
_LEDGER = re.compile(r"^_pgbulk_([0-9a-f]{12})_ledger$")


def load_of_ledger(name: str) -> str | None:
    """The load id whose ledger is named ``name``; None for another name."""
    found = _LEDGER.match(name)
    return found.group(1) if found else None


def pieces_table(load_id: str) -> str:
    """The pieces of each partition (the byte ranges it copies), written by prepare under
    Airflow and read by each COPY task by its partition number, so that no task receives
    the pieces of the whole load through XCom."""
    return f"{PREFIX}{check_load_id(load_id)}_pieces"


def retired_table(load_id: str) -> str:
    """The name the old target has from the swap until its drop, right after the swap commits
    (cleanup drops it if the process died in between)."""
    return f"{PREFIX}{check_load_id(load_id)}_old"


def retired_index(load_id: str, number: int) -> str:
    """The name the ``number``-th index of the old target takes in the swap, freeing its own
    for the new table's (the old table is dropped after the swap commits)."""
    return f"{PREFIX}{check_load_id(load_id)}_oi{number}"


def retired_constraint(load_id: str, number: int) -> str:
    """The name the ``number``-th exclusion constraint of the old target (and so its index,
    which is not among the captured indexes) takes in the swap."""
    return f"{PREFIX}{check_load_id(load_id)}_ox{number}"


def retired_sequence(load_id: str, number: int) -> str:
    """The name the ``number``-th identity sequence of the old target takes in the swap."""
    return f"{PREFIX}{check_load_id(load_id)}_os{number}"


def helper_session(application_name: str, number: int) -> str:
    """The ``application_name`` of a step's ``number``-th extra session (finalize's index
    builds): the step's own name, its end cut if need be, then ``+<number>``."""
    tail = f"+{number}"
    return application_name[: APPLICATION_NAME_BYTES - len(tail)] + tail


def rebuilt_table(load_id: str) -> str:
    """The new table an upsert with ``strategy="rebuild"`` builds and swaps in."""
    return f"{PREFIX}{check_load_id(load_id)}_new"


def temp_index(load_id: str, number: int) -> str:
    """Name of the ``number``-th index built on staging before it takes the original name."""
    return f"{PREFIX}{check_load_id(load_id)}_i{number}"


def temp_constraint(load_id: str, number: int) -> str:
    """Name of the ``number``-th constraint added to staging before it takes the original name."""
    return f"{PREFIX}{check_load_id(load_id)}_c{number}"


def temp_sequence(load_id: str, number: int) -> str:
    """Name of an identity sequence of staging before it takes the original name."""
    return f"{PREFIX}{check_load_id(load_id)}_s{number}"


def source_order_sequence(load_id: str) -> str:
    """The sequence behind an upsert staging's source order column (owned by the column, so
    it goes with the staging table)."""
    return f"{PREFIX}{check_load_id(load_id)}_order"


def staging_partition(load_id: str, number: int) -> str:
    """The staging partition for the target's ``number``-th leaf partition (by name)."""
    return f"{PREFIX}{check_load_id(load_id)}_p{number}"


def staging_partitions_pattern(load_id: str) -> str:
    """A LIKE pattern matching this load's :func:`staging_partition` tables."""
    return f"\\_pgbulk\\_{check_load_id(load_id)}\\_p%"


def router_table(load_id: str) -> str:
    """The partitioned table finalize routes staged rows through when they go to several
    partitions of the target: one partition for each of those, nothing else."""
    return f"{PREFIX}{check_load_id(load_id)}_route"


def router_partition(load_id: str, number: int) -> str:
    """A partition of :func:`router_table`, named :func:`staging_partition` once it is known
    to hold rows."""
    return f"{PREFIX}{check_load_id(load_id)}_r{number}"


def unrouted_partition(load_id: str) -> str:
    """The DEFAULT partition of a staging partitioned like the target: the rows that no
    partition of the target takes land there (and fail the load in finalize, named)."""
    return f"{PREFIX}{check_load_id(load_id)}_none"


def routed_check(load_id: str) -> str:
    """The CHECK on a partitioned target's staging that sets aside, as a bad row, a row that
    no partition takes (``on_error="reject"``)."""
    return f"{PREFIX}{check_load_id(load_id)}_routed"


def bound_check(load_id: str) -> str:
    """The CHECK implying a staging partition's bound, dropped once it is attached."""
    return f"{PREFIX}{check_load_id(load_id)}_bound"


def owning_load_id(table: str) -> str | None:
    """The load id in the name of a table a load created (``_pgbulk_<load id>_…``), or None.

    A leaf partition's build runs under :func:`leaf_load_id`, but its table is named by the
    load's own id: logs name the load by this, so every line of one load shows one id."""
    head = table[len(PREFIX) : len(PREFIX) + 12]
    if table.startswith(PREFIX) and _LOAD_ID.match(head):
        return head
    return None


def leaf_load_id(load_id: str, number: int) -> str:
    """A load id of its own for the ``number``-th leaf partition's build, so that the
    temporary names of its indexes and constraints differ from the other leaves'."""
    return load_id_for(check_load_id(load_id), "leaf", str(number))


def run_objects_pattern(load_id: str) -> str:
    """A LIKE pattern matching every table this load created."""
    return f"\\_pgbulk\\_{check_load_id(load_id)}\\_%"


def temp_names(plan: LoadPlan) -> tuple[dict[str, str], dict[str, str]]:
    """Original → temporary names of the indexes and constraints built on staging."""
    t = plan.target
    indexes = {idx.name: temp_index(plan.load_id, n) for n, idx in enumerate(t.indexes)}
    constraints = {
        con.name: temp_constraint(plan.load_id, n) for n, con in enumerate(t.constraints)
    }
    return indexes, constraints


def original_names(plan: LoadPlan, text: str) -> str:
    """``text`` with the temporary names of staging objects replaced by the target's own."""
    indexes, constraints = temp_names(plan)
    back = {temp: name for names in (indexes, constraints) for name, temp in names.items()}
    back[plan.staging_table] = plan.target.table
    back[rebuilt_table(plan.load_id)] = plan.target.table
    back[routed_check(plan.load_id)] = f"the table partitions of {plan.target.table}"
    if plan.target.partitioning:  # staging partitions and what is built on them (each
        # with its leaf's own load id: see leaf_load_id) take the target partitions' names
        for number, leaf in enumerate(plan.target.partitioning.leaves):
            back[staging_partition(plan.load_id, number)] = leaf.definition.table
            leaf_id = leaf_load_id(plan.load_id, number)
            for k, index in enumerate(leaf.definition.indexes):
                back[temp_index(leaf_id, k)] = index.name
            for k, con in enumerate(leaf.definition.constraints):
                back[temp_constraint(leaf_id, k)] = con.name
    for temp in sorted(back, key=len, reverse=True):  # _i10 before _i1
        text = text.replace(temp, back[temp])
    # a staging partitioned like the target (COPY writes into its partitions): named as the
    # target, as the one plain staging table is
    return re.sub(re.escape(PREFIX + plan.load_id) + r"_(?:r\d+|none)\b", plan.target.table, text)


def split_name(name: str) -> tuple[str, str]:
    """``"schema.table"`` → (schema, table); a bare name means ``public``.

    Quote a part that contains a dot with double quotes, as in SQL: ``'"my.schema"."t"'``.
    """
    parts: list[str] = []
    current, quoted, i = "", False, 0
    while i < len(name):
        ch = name[i]
        if ch == '"':
            if quoted and name[i + 1 : i + 2] == '"':
                current += '"'
                i += 1
            else:
                quoted = not quoted
        elif ch == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += ch
        i += 1
    parts.append(current)
    if quoted or len(parts) > 2 or not all(parts):
        raise ValueError(f"table must be 'schema.table' or 'table', not {name!r}")
    return (parts[0], parts[1]) if len(parts) == 2 else ("public", parts[0])
