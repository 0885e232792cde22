"""What a finished load tells Airflow about its data: an Asset event for the target, and
OpenLineage facets (when the openlineage provider is installed).

The target's Asset URI is PostgreSQL's in Airflow, ``postgres://host:port/database/schema/
table`` (the postgres provider's ``create_asset``). The host comes from the connection, known
only when the task runs, so ``pg_bulk_load`` declares an :class:`~airflow.sdk.AssetAlias` as
finalize's outlet and finalize attaches the target's Asset to it: DAGs scheduled on that Asset
run after each load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from airflow_pg_bulk.plan import LoadPlan
    from airflow_pg_bulk.plan.figures import LoadSummary

DEFAULT_PORT = 5432


def alias_name(dag_id: str | None, group_id: str) -> str:
    """The name of the AssetAlias finalize attaches the target's Asset to."""
    return f"pg_bulk_load:{dag_id}.{group_id}" if dag_id else f"pg_bulk_load:{group_id}"


def asset_uri(connection: Any, schema: str, table: str) -> str:
    """``postgres://host:port/database/schema/table`` of the target, from the Airflow
    connection (a socket directory as host is percent-encoded)."""
    host = quote(connection.host or "localhost", safe="")
    port = connection.port or DEFAULT_PORT
    database = quote(connection.schema or "postgres", safe="")
    return f"postgres://{host}:{port}/{database}/{quote(schema, safe='')}/{quote(table, safe='')}"


def asset_extra(plan: LoadPlan, summary: LoadSummary) -> dict[str, Any]:
    """What the Asset event says of the load."""
    return {
        "load_id": plan.load_id,
        "mode": plan.mode.value,  # a plain text in the event's JSON
        "rows": summary.rows,
        "bytes": summary.bytes,
        "rejects": summary.rejects,
    }


def operator_lineage(plan: LoadPlan, summary: LoadSummary, uri: str) -> Any:
    """OpenLineage facets of a finished load: the source files in, the target out with its
    schema, output statistics (rows, bytes) and, for a replace, lifecycle OVERWRITE."""
    from urllib.parse import unquote, urlsplit

    from airflow.providers.common.compat.openlineage.facet import (
        InputDataset,
        LifecycleStateChange,
        LifecycleStateChangeDatasetFacet,
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
    )
    from airflow.providers.openlineage.extractors import OperatorLineage

    # not at DAG-parse time: alias_name is all it needs
    from airflow_pg_bulk.source import listing, objects

    parsed = urlsplit(uri)
    _, database, schema, table = (unquote(part) for part in parsed.path.split("/"))
    facets: dict[str, Any] = {
        "schema": SchemaDatasetFacet(
            fields=[SchemaDatasetFacetFields(name=c.name, type=c.type) for c in plan.target.columns]
        ),
    }
    if plan.mode.whole_target:
        facets["lifecycleStateChange"] = LifecycleStateChangeDatasetFacet(
            lifecycleStateChange=LifecycleStateChange.OVERWRITE
        )
    output = OutputDataset(
        namespace=f"postgres://{parsed.netloc}",
        name=f"{database}.{schema}.{table}",
        facets=facets,
        outputFacets={
            "outputStatistics": OutputStatisticsOutputDatasetFacet(
                rowCount=summary.rows, size=summary.bytes
            )
        },
    )
    pieces = {piece.path: piece for part in plan.partitions for piece in part.pieces}
    inputs = [
        InputDataset(*objects.lineage_name(path))
        if listing.piece_kind(pieces[path]) is listing.SourceKind.OBJECT
        else InputDataset(namespace="file", name=path)
        for path in sorted(pieces)
    ]
    return OperatorLineage(inputs=inputs, outputs=[output])
