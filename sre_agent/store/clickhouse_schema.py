"""The OTel Collector ClickHouse exporter's ``otel_traces`` read as sre-agent's canonical spans.

At fleet scale spans are where OTel Collectors already write them: the contrib
``clickhouseexporter``'s ``otel_traces`` table (docs/reference/telemetry.md 5.5:
``Timestamp DateTime64(9)``, hex ``TraceId``/``SpanId``/``ParentSpanId`` with ``''``
for none, ``SpanKind``/``StatusCode`` as ``Server``/``Error`` or, from older exporters,
``SPAN_KIND_SERVER``/``STATUS_CODE_ERROR``, ``Duration`` in ns, every attribute value
as a string in ``SpanAttributes``/``ResourceAttributes``). Nothing is copied and no
schema of ours is required: :func:`spans_select` is a ClickHouse ``SELECT`` that
spells the canonical span columns (:data:`sre_agent.store.schema.SPAN_COLUMNS`) as
expressions over that table, from the same declarative attribute table the
receiver's normaliser uses (:data:`~sre_agent.store.schema.SPAN_ATTRIBUTE_SOURCES`,
:data:`~sre_agent.store.schema.RESOURCE_FIRST_COLUMNS`), so a span reads the same whether
sre-agent received it or a Collector wrote it.

The rules the decoder applies, restated for the maps:

* per side (span attributes, resource attributes) the first *present* key of a
  column's sources is chosen, then typed (a value that does not parse is NULL and
  does not fall through to the next key); the span's side wins, except for the
  resource-first columns (service, version, instance, host);
* integer columns take integral spellings and truncate decimal ones (``"12.7"`` is
  12, as ``int(float(v))``); a map lookup of an absent key is ``''`` in ClickHouse,
  so presence is tested with ``mapContains``;
* ``finish_reason`` is the first element of a JSON array (SGLang's ``'["stop"]'``,
  the exporter's spelling of a string array) or the string itself;
* ``error_type`` falls back to the ``exception.type`` of the first ``exception``
  event, then to ``'error'`` for an ERROR status; ``queue_s`` to SGLang's
  ``ttft - prefill`` (clamped at 0, NULL when clearly negative); ``tpot_s`` is
  ``decode_s / (output_tokens - 1)``.

``resource_attributes``/``attributes`` are the maps themselves (ClickHouse
``Map``), read as ``attributes['k']`` like the embedded store's. One difference is
the writer's, not ours: a double under a text key (a tenant id sent as 5e-05) is
spelled by whoever wrote it, Arrow's shortest form in the embedded store and Go's in
the exporter (``0.00005``); numeric columns parse both to the same number.

The analysis reads these relations through :mod:`sre_agent.store.clickhouse`.
"""

from __future__ import annotations

from typing import Final

from sre_agent.ingest.normalise import FLOAT_COLUMNS, INT_COLUMNS
from sre_agent.store.schema import (
    ENGINE_SPAN_NAMES,
    INT32_BOUND,
    METRIC_MODEL_KEYS,
    METRIC_NAME_ALIASES,
    METRIC_RESOURCE_SOURCES,
    QUEUE_TOLERANCE_S,
    RESOURCE_FIRST_COLUMNS,
    SPAN_ATTRIBUTE_SOURCES,
    SPAN_COLUMNS,
)
from sre_agent.store.sql_text import literal

__all__ = [
    "ACCELERATED_PREFIX",
    "DEFAULT_METRIC_TABLES",
    "DEFAULT_TRACES_TABLE",
    "acceleration_ddl",
    "metric_points_select",
    "metric_sources",
    "spans_select",
]

#: The exporter's default traces table (its ``traces_table_name``).
DEFAULT_TRACES_TABLE: Final[str] = "otel_traces"
#: The exporter's default metric tables by OTLP kind (``otel_metrics`` + ``_gauge`` etc.).
DEFAULT_METRIC_TABLES: Final[dict[str, str]] = {
    "gauge": "otel_metrics_gauge",
    "sum": "otel_metrics_sum",
    "histogram": "otel_metrics_histogram",
}


def _chosen(map_column: str, keys: tuple[str, ...]) -> str:
    """The value of the first of ``keys`` present in ``map_column``, else NULL (a String expression)."""
    branches = ", ".join(f"mapContains({map_column}, {literal(k)}), {map_column}[{literal(k)}]" for k in keys)
    return f"multiIf({branches}, NULL)"


def _typed(name: str, value: str) -> str:
    """``value`` (a String or NULL) as canonical column ``name``'s type; unparseable values are NULL."""
    if name in FLOAT_COLUMNS:
        return f"toFloat64OrNull({value})"
    if name in INT_COLUMNS:
        # int(float(v)) in the decoder: "12" and "12.7" are 12; beyond Int64 is NULL.
        number = f"toFloat64OrNull({value})"
        integral = f"coalesce(toInt64OrNull({value}), if(abs({number}) < 9.2e18, toInt64({number}), NULL))"
        if name == "attempt":
            return f"if(abs({integral}) < {INT32_BOUND}, toInt32({integral}), NULL)"
        return integral
    if name == "finish_reason":
        return (
            f"if(startsWith(trimLeft({value}), '['), "
            f"nullIf(JSONExtractString(trimLeft({value}), 1), ''), nullIf(trimBoth({value}), ''))"
        )
    return value


def _canonical(name: str) -> str:
    """Canonical column ``name`` from the two maps, with the decoder's precedence."""
    keys = SPAN_ATTRIBUTE_SOURCES[name]
    from_spans = _typed(name, _chosen("SpanAttributes", keys))
    from_resource = _typed(name, _chosen("ResourceAttributes", keys))
    if name in RESOURCE_FIRST_COLUMNS:
        return f"coalesce({from_resource}, {from_spans})"
    return f"coalesce({from_spans}, {from_resource})"


#: Prefix of the optional materialized columns (:func:`acceleration_ddl`).
ACCELERATED_PREFIX: Final[str] = "sre_"


def acceleration_ddl(table: str = DEFAULT_TRACES_TABLE) -> list[str]:
    """Optional ``ALTER TABLE`` statements that keep each canonical span column as a column of ``table``.

    Every query over the exporter's maps reads the whole ``SpanAttributes`` column (about
    1.8 s at 10M spans on a 2-core machine), and a diagnosis makes about a dozen such
    passes. A ``MATERIALIZED`` column holds the same expression :func:`spans_select`
    would compute, written once at insert (the usual ClickHouse answer to hot map keys);
    :func:`spans_select` reads ``sre_<column>`` where it exists. Nothing requires them:
    without them the answers are the same, only slower. The second statement of each
    pair fills the column for parts written before it existed (a mutation).
    """
    out: list[str] = []
    for name in SPAN_ATTRIBUTE_SOURCES:
        kind = "Nullable(String)"
        if name in FLOAT_COLUMNS:
            kind = "Nullable(Float64)"
        elif name in INT_COLUMNS:
            kind = "Nullable(Int32)" if name == "attempt" else "Nullable(Int64)"
        column = ACCELERATED_PREFIX + name
        out.append(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind} MATERIALIZED {_canonical(name)}")
        out.append(f"ALTER TABLE {table} MATERIALIZE COLUMN {column}")
    return out


def spans_select(table: str = DEFAULT_TRACES_TABLE, accelerated: frozenset[str] = frozenset()) -> str:
    """A ClickHouse ``SELECT`` over the exporter's traces ``table`` with the canonical span columns.

    ``table`` is spliced in as given (``db.table`` allowed); it must come from the
    configuration, never from a request. ``accelerated`` names the canonical columns
    the table keeps as materialized columns (:func:`acceleration_ddl`), read as they are.
    """
    attributes = {
        name: ACCELERATED_PREFIX + name if name in accelerated else _canonical(name) for name in SPAN_ATTRIBUTE_SOURCES
    }
    engine_names = ", ".join(literal(n) for n in sorted(ENGINE_SPAN_NAMES))
    exception = (
        "arrayFirst((a, n) -> n = 'exception' AND mapContains(a, 'exception.type'), "
        "Events.Attributes, Events.Name)['exception.type']"
    )
    status = "lower(replaceRegexpOne(StatusCode, '^STATUS_CODE_', ''))"
    # The two columns with fallbacks outside the maps are finished in the outer query.
    alias = {"queue_s": "queue_s_attribute", "error_type": "error_type_attribute"}
    inner = ",\n      ".join(f"{expr} AS {alias.get(name, name)}" for name, expr in attributes.items())
    # Columns declared after error_type (schema 3's request parameters) pass through as the inner query spells them.
    names = [c.name for c in SPAN_COLUMNS if c.name not in ("attributes", "resource_attributes")]
    after_error_type = "".join(f"{name}, " for name in names[names.index("error_type") + 1 :])
    return f"""
SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, duration_s, status_code, status_message,
  service_name, service_version, service_instance, host_name, tenant_id, scope_name,
  CAST(name IN ({engine_names}) OR position(name, ' Req ') > 0 OR startsWith(name, 'Req ')
    OR ttft_s IS NOT NULL OR e2e_s IS NOT NULL AS Bool) AS is_engine,
  model, request_id, input_tokens, output_tokens, cached_tokens,
  coalesce(queue_s_attribute, if(ttft_s - prefill_s >= -{QUEUE_TOLERANCE_S}, greatest(ttft_s - prefill_s, 0.0), NULL))
    AS queue_s,
  ttft_s, prefill_s, decode_s, inference_s, e2e_s,
  if(output_tokens > 1, decode_s / toFloat64(output_tokens - 1), NULL) AS tpot_s,
  finish_reason, attempt,
  coalesce(error_type_attribute, nullIf({exception}, ''), if(status_code = 'error', 'error', NULL)) AS error_type,
  {after_error_type}resource_attributes, attributes
FROM (
  SELECT
      lower(TraceId) AS trace_id,
      lower(SpanId) AS span_id,
      nullIf(lower(ParentSpanId), '') AS parent_span_id,
      SpanName AS name,
      lower(replaceRegexpOne(SpanKind, '^SPAN_KIND_', '')) AS kind,
      toUnixTimestamp64Nano(Timestamp) AS start_ns,
      toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) AS end_ns,
      Duration / 1e9 AS duration_s,
      {status} AS status_code,
      nullIf(StatusMessage, '') AS status_message,
      nullIf(ScopeName, '') AS scope_name,
      Events.Name, Events.Attributes,
      ResourceAttributes AS resource_attributes,
      SpanAttributes AS attributes,
      {inner}
  FROM {table}
)"""


def metric_points_select(tables: dict[str, str] | None = None, names: frozenset[str] | None = None) -> str:
    """A ClickHouse ``SELECT`` of canonical metric points over the exporter's metric tables.

    ``tables`` maps ``gauge``/``sum``/``histogram`` to table names (default
    :data:`DEFAULT_METRIC_TABLES`; configuration only, spliced in as given). Columns as
    :data:`sre_agent.store.schema.METRIC_POINT_COLUMNS`: the canonical name (``_total`` trimmed,
    old vLLM names mapped), the exporter's temporality code (1 delta, 2 cumulative) spelled,
    a ``start_time_ns`` of 0 as NULL, identity columns from the resource attributes, the
    model from the point's labels then the resource's, and ``series_key`` a hash of the
    name and both maps (an identity within this store, not the receiver's spelling of it).
    Exponential histograms and summaries are not read yet. With ``names``, only the rows
    whose ``MetricName`` may carry one of those canonical names are read (a superset:
    the caller still filters on ``name``).
    """
    table_of = {**DEFAULT_METRIC_TABLES, **(tables or {})}
    trimmed = "replaceRegexpOne(MetricName, '_total$', '')"
    aliases = sorted(METRIC_NAME_ALIASES.items())
    old = ", ".join(literal(k) for k, _ in aliases)
    new = ", ".join(literal(v) for _, v in aliases)
    canonical = f"transform({trimmed}, [{old}], [{new}], {trimmed})"
    identity = ",\n  ".join(f"{_chosen('ResourceAttributes', keys)} AS {column}"
                              for column, keys in METRIC_RESOURCE_SOURCES.items())  # fmt: skip
    common = f"""{canonical} AS name, MetricName AS source_name, {{kind}} AS kind, nullIf(MetricUnit, '') AS unit,
  toUnixTimestamp64Nano(TimeUnix) AS time_ns, nullIf(toUnixTimestamp64Nano(StartTimeUnix), 0) AS start_time_ns,
  {{value}} AS value, {{monotonic}} AS is_monotonic, {{temporality}} AS temporality,
  {{count}} AS count, {{sum}} AS sum, {{bounds}} AS bounds, {{buckets}} AS bucket_counts,
  {identity},
  coalesce({_chosen("Attributes", METRIC_MODEL_KEYS)}, {_chosen("ResourceAttributes", METRIC_MODEL_KEYS)}) AS model,
  lower(hex(sipHash128({canonical}, ResourceAttributes, Attributes))) AS series_key,
  ResourceAttributes AS resource_attributes, Attributes AS attributes"""
    temporality = "multiIf(AggregationTemporality = 1, 'delta', AggregationTemporality = 2, 'cumulative', NULL)"
    none = {"count": "CAST(NULL AS Nullable(Int64))", "sum": "CAST(NULL AS Nullable(Float64))",
            "bounds": "CAST([] AS Array(Float64))", "buckets": "CAST([] AS Array(Int64))"}  # fmt: skip
    parts = {
        "gauge": common.format(kind="'gauge'", value="Value", monotonic="CAST(NULL AS Nullable(Bool))",
                               temporality="CAST(NULL AS Nullable(String))", **none),
        "sum": common.format(kind="'sum'", value="Value", monotonic="CAST(IsMonotonic AS Nullable(Bool))",
                             temporality=temporality, **none),
        "histogram": common.format(kind="'histogram'", value="CAST(NULL AS Nullable(Float64))",
                                   monotonic="CAST(NULL AS Nullable(Bool))", temporality=temporality,
                                   count="toInt64(Count)", sum="Sum", bounds="ExplicitBounds",
                                   buckets="arrayMap(c -> toInt64(c), BucketCounts)"),
    }  # fmt: skip
    where = ""
    if names is not None:
        sources = sorted(metric_sources(names))
        where = f"\nWHERE MetricName IN ({', '.join(literal(n) for n in sources)})" if sources else "\nWHERE 0"
    return "\nUNION ALL\n".join(f"SELECT {select}\nFROM {table_of[kind]}{where}" for kind, select in parts.items())


def metric_sources(names: frozenset[str]) -> frozenset[str]:
    """Every exporter ``MetricName`` that :func:`metric_points_select` may read as one of ``names``.

    A canonical name comes from itself (unless it is an old name, which is mapped away)
    or from an old name mapped to it (:data:`METRIC_NAME_ALIASES`), each with or without
    a ``_total`` suffix.
    """
    stems = {old for old, new in METRIC_NAME_ALIASES.items() if new in names}
    stems |= {name for name in names if name not in METRIC_NAME_ALIASES}
    return frozenset(stems | {stem + "_total" for stem in stems})


if __name__ == "__main__":
    # python -m sre_agent.store.clickhouse_schema [TABLE]: print the optional acceleration DDL (acceleration_ddl).
    import sys

    for statement in acceleration_ddl(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_TRACES_TABLE):
        print(statement + ";")
