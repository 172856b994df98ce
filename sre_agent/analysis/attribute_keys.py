"""Attribute keys as the analysis reads them: one SQL spelling per key, and which keys are dimensions.

:func:`key_sql` spells the value of a key on a span (a canonical column or an
attribute key), :func:`metric_key_sql` on a metric point, :func:`filter_sql`
the ``--service`` and ``--where`` filter made of them; :func:`discover_dimensions`
finds the low-cardinality keys a set of spans carries. Apart from
:mod:`sre_agent.analysis.compare` because the console (:mod:`sre_agent.analysis.explore`) and the
canary store spell keys the same way without a comparison.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from sre_agent.analysis.metric_view import fetch_one
from sre_agent.analysis.resolve import Filters, service_sql
from sre_agent.store.attribute_sql import entries_sql, lookup_sql
from sre_agent.store.schema import SPAN_ATTRIBUTE_SOURCES, SPAN_COLUMNS
from sre_agent.store.sql_text import literal

if TYPE_CHECKING:
    import duckdb


__all__ = [
    "MAX_DIMENSION_VALUES",
    "NOT_DIMENSION_PREFIXES",
    "discover_dimensions",
    "filter_sql",
    "key_sql",
    "metric_key_sql",
]

#: Most distinct values an attribute may have to count as a localisation dimension.
MAX_DIMENSION_VALUES = 64
# Attributes that are never localisation dimensions: identifiers, token counts, latencies, content.
NOT_DIMENSION_PREFIXES: tuple[str, ...] = (
    "gen_ai.latency.",
    "gen_ai.usage.",
    "gen_ai.request.id",
    "gen_ai.response.id",
    "gen_ai.input",
    "gen_ai.output",
    "gen_ai.prompt",
    "gen_ai.completion",
    "http.request.resend_count",
    "process.pid",
    "telemetry.",
)

_MAP_COLUMNS = {"attributes", "resource_attributes"}
_CANONICAL = {c.name for c in SPAN_COLUMNS} - _MAP_COLUMNS
# attribute key -> canonical column that also carries it
_ATTRIBUTE_COLUMN = {key: col for col, keys in SPAN_ATTRIBUTE_SOURCES.items() for key in keys}
# Canonical columns offered as dimensions under their attribute name when the maps lack them.
_DIMENSION_COLUMNS: Final[dict[str, str]] = {
    "host.name": "host_name",
    "service.instance.id": "service_instance",
    "gen_ai.request.model": "model",
    "tenant.id": "tenant_id",
    "service.version": "service_version",
    "service.name": "service_name",
}


def key_sql(key: str, maps: tuple[str, ...] = ("attributes", "resource_attributes")) -> str:
    """SQL for the value of ``key`` on a span, as VARCHAR: a canonical column or an attribute key.

    The one spelling behind ``--where`` filters, the diagnosis's slice
    dimensions and the console's, so a slice shown anywhere can be filtered
    on. Keys ingest resolved into a canonical column (``host.name``,
    ``gen_ai.request.model``, ...) read the column, which is far cheaper than
    two map lookups per row; other keys are looked up in ``maps`` in order,
    then in the canonical column they feed, if any.
    """
    if key in _CANONICAL:
        return f'CAST("{key}" AS VARCHAR)'
    if key in _DIMENSION_COLUMNS:
        return f'CAST("{_DIMENSION_COLUMNS[key]}" AS VARCHAR)'
    sources = [lookup_sql(key, m) for m in maps]
    if key in _ATTRIBUTE_COLUMN:
        sources.append(f'CAST("{_ATTRIBUTE_COLUMN[key]}" AS VARCHAR)')
    return sources[0] if len(sources) == 1 else f"coalesce({', '.join(sources)})"


def filter_sql(selection: Filters, params: dict[str, Any] | None = None) -> str:
    """The WHERE fragment for ``--service`` and ``--where`` (always a valid boolean expression).

    Values are literals, or with ``params`` named parameters added to it (``$service``, ``$w0``, ...).
    """
    parts = [service_sql(selection, params)]
    for i, (key, value) in enumerate(selection.where):
        if params is None:
            parts.append(f"{key_sql(key)} = {literal(value)}")
        else:
            params[f"w{i}"] = value
            parts.append(f"{key_sql(key)} = $w{i}")
    return " AND ".join(parts)


#: metric_points columns that carry an attribute key; other keys are read from the point's attribute maps.
_METRIC_KEY_COLUMNS: Final[dict[str, str]] = {
    "service.name": "service_name",
    "service.version": "service_version",
    "service.instance.id": "service_instance",
    "host.name": "host_name",
    "gen_ai.request.model": "model",
    "model_name": "model",
    **{c: c for c in ("service_name", "service_version", "service_instance", "host_name", "model")},
}


def metric_key_sql(key: str) -> str:
    """SQL for the value of ``key`` on a metric point, as VARCHAR (the metric twin of :func:`key_sql`)."""
    if key in _METRIC_KEY_COLUMNS:
        return f'CAST("{_METRIC_KEY_COLUMNS[key]}" AS VARCHAR)'
    return f"coalesce(attributes[{literal(key)}], resource_attributes[{literal(key)}])"


def discover_dimensions(
    con: duckdb.DuckDBPyConnection, heads: str, temp: str
) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """Attribute keys with 2..64 distinct values among the spans ``heads`` selects, and the maps each was seen in.

    ``heads`` is a query over spans, held in the temp table ``temp`` while it is
    read (dropped after). The maps: per key, which of ``attributes`` and
    ``resource_attributes`` carry it, so that :func:`key_sql` need look in those only.
    """
    con.execute(f"CREATE OR REPLACE TEMP TABLE {temp} AS {heads}")
    try:
        rows = con.sql(
            f"""
            WITH kv AS (
              {entries_sql(temp, "attributes", ", true AS span_side")}
              UNION ALL
              {entries_sql(temp, "resource_attributes", ", false AS span_side")}
            )
            SELECT key, count(DISTINCT value) AS n_values, bool_or(span_side) AS in_span,
              bool_or(NOT span_side) AS in_resource FROM kv GROUP BY key
            """
        ).fetchall()
        found = {str(k): int(v) for k, v, _, _ in rows}
        maps = {
            str(k): tuple(m for m, present in (("attributes", a), ("resource_attributes", r)) if present)
            for k, _, a, r in rows
        }
        for key, col in _DIMENSION_COLUMNS.items():
            if key not in found:
                row = fetch_one(con.execute(f'SELECT count(DISTINCT "{col}") FROM {temp}'))
                found[key] = int(row[0]) if row else 0
    finally:
        con.execute(f"DROP TABLE IF EXISTS {temp}")
    dimensions = sorted(
        key for key, n in found.items() if 2 <= n <= MAX_DIMENSION_VALUES and not key.startswith(NOT_DIMENSION_PREFIXES)
    )
    return dimensions, maps
