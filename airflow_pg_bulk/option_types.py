"""The load options as a ``TypedDict``, for ``**options: Unpack[LoadOptions]``.

Generated from :data:`airflow_pg_bulk.options.OPTIONS` by ``python -m
airflow_pg_bulk.options``: do not edit (tests/unit/test_option_types.py checks that it is
current)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict


class LoadOptions(TypedDict, total=False):
    """Every load option by name; see :mod:`airflow_pg_bulk.options` for each."""

    mode: str | None
    source_conn_id: str | None
    source_url: str | None
    query: str | None
    source_table: str | None
    split_by: str | None
    create_target: bool
    format: str
    header: bool
    delimiter: str | None
    null: str | None
    quote: str
    escape: str | None
    encoding: str
    partitions: int | None
    partition_size: int
    columns: Sequence[str] | None
    key: Sequence[str] | None
    on_duplicate_key: str
    strategy: str
    staging_logged: bool | None
    lock_timeout: str
    abandoned_after: str
    maintenance_work_mem: str
    index_workers: int | None
    synchronous_commit: str
    analyze: bool
    allow_older_run: bool
    history_keep: int
    on_error: str
    max_rejects: int
    reject_table: str | None
