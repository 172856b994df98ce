"""Canonical schema of the store, and the declarative attribute mapping.

This module is the contract between ingest (which fills these columns), the
store (which keeps them in DuckDB) and everything that reads them (rules,
canary, TUI). It holds data only: no I/O, no DuckDB connection.

Tables
------
``spans``
    One row per span, keyed by ``(trace_id, span_id)``. Engine request
    spans (vLLM ``llm_request``, SGLang ``"... Req ..."``) have
    ``is_engine = true`` and carry the latency columns; every span keeps all
    its resource and span attributes in two ``MAP(VARCHAR, VARCHAR)``
    columns so that any attribute can become a localisation dimension.
    ``spans`` is a view over the stored table ``span_rows`` (see
    "Stored layout" below); readers only ever see ``spans``.
``metric_points``
    One row per OTLP data point (gauge, sum, histogram), with the metric name
    normalised (see :func:`canonical_metric_name`).
``deploys``
    Deploy markers, explicit or detected from ``service.version`` changes.

Resolution order
----------------
For each canonical column, :data:`SPAN_ATTRIBUTE_SOURCES` lists attribute
keys in priority order; the first key present on the span wins, span
attributes before resource attributes. Newer names come before older ones
(``gen_ai.usage.input_tokens`` before ``gen_ai.usage.prompt_tokens``),
and engine-reported latencies before anything derived. ``tpot_s`` is
always derived: ``decode_s / (output_tokens - 1)`` when ``output_tokens > 1``.
``queue_s``, when no source reports it (SGLang), is ``ttft_s - prefill_s``
(arrival to scheduling) when both are present and the difference is not
negative.

Stored layout
-------------
An engine span carries about a dozen attributes that a canonical column
also holds (tokens, latencies, model, service, ...). Kept in the maps as
well, they made DuckDB's MAP append the largest cost of ingest (issue 18:
~15 of ~18 us per span). ``span_rows`` therefore stores each such entry
once: an attribute in :data:`PROMOTED_KEYS` whose value is spelled exactly
as DuckDB spells its column (``CAST(column AS VARCHAR)``) is left out of
``extra_attributes`` / ``extra_resource_attributes`` and its bit is set in
``promoted`` / ``promoted_resource``; the ``spans`` view puts it back. Every
other entry, and every entry of rows stored before this layout (bits 0),
stays in the maps as received, so ``attributes['k']`` reads exactly what it
always did. Schema 3 gave the resource map its own bit column (schema 2 kept
its bits at 32 and up in ``promoted``) so that more keys fit, and promoted
the request parameters (``max_tokens``, ``temperature``, ``top_p``,
``choice_count``), which were most of what an engine span still kept in its
map: each MAP entry costs DuckDB ~0.8 us to append.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

__all__ = [
    "CONTENT_ATTRIBUTES",
    "DEPLOYS_DDL",
    "ENGINE_SPAN_NAMES",
    "INT32_BOUND",
    "LATENCY_COLUMNS",
    "METRIC_MODEL_KEYS",
    "METRIC_NAME_ALIASES",
    "METRIC_POINTS_DDL",
    "METRIC_POINT_COLUMNS",
    "METRIC_RESOURCE_SOURCES",
    "METRIC_SIGNALS",
    "MAP_PARTS",
    "PROMOTED_KEYS",
    "QUEUE_TOLERANCE_S",
    "MAX_PROMOTED_KEYS",
    "RESOURCE_FIRST_COLUMNS",
    "SPANS_DDL",
    "SPANS_VIEW_DDL",
    "SPAN_ROWS_DDL",
    "SPAN_ATTRIBUTE_SOURCES",
    "SPAN_COLUMNS",
    "Column",
    "canonical_metric_name",
    "metric_points_arrow_schema",
    "promoted_sql",
    "spans_arrow_schema",
]


class Column:
    """One canonical column: its name, Arrow type, DuckDB type and meaning."""

    __slots__ = ("arrow", "doc", "duckdb", "name")

    def __init__(self, name: str, arrow: pa.DataType, duckdb: str, doc: str) -> None:
        self.name = name
        self.arrow = arrow
        self.duckdb = duckdb
        self.doc = doc

    def __repr__(self) -> str:
        return f"Column({self.name!r}, {self.duckdb})"


_MAP = pa.map_(pa.string(), pa.string())
_MAP_SQL = "MAP(VARCHAR, VARCHAR)"

SPAN_COLUMNS: Final[tuple[Column, ...]] = (
    Column("trace_id", pa.string(), "VARCHAR NOT NULL", "32 lowercase hex digits"),
    Column("span_id", pa.string(), "VARCHAR NOT NULL", "16 lowercase hex digits"),
    Column("parent_span_id", pa.string(), "VARCHAR", "16 lowercase hex digits; NULL for a root span"),
    Column("name", pa.string(), "VARCHAR", "span name as received"),
    Column("kind", pa.string(), "VARCHAR", "unspecified|internal|server|client|producer|consumer"),
    Column("start_ns", pa.int64(), "BIGINT NOT NULL", "start, Unix epoch nanoseconds"),
    Column("end_ns", pa.int64(), "BIGINT", "end, Unix epoch nanoseconds"),
    Column("duration_s", pa.float64(), "DOUBLE", "(end_ns - start_ns) / 1e9, seconds"),
    Column("status_code", pa.string(), "VARCHAR", "unset|ok|error"),
    Column("status_message", pa.string(), "VARCHAR", "status description, if any"),
    Column("service_name", pa.string(), "VARCHAR", "resource service.name"),
    Column("service_version", pa.string(), "VARCHAR", "resource service.version"),
    Column("service_instance", pa.string(), "VARCHAR", "resource service.instance.id (or pod name)"),
    Column("host_name", pa.string(), "VARCHAR", "host.name (or k8s.node.name)"),
    Column("tenant_id", pa.string(), "VARCHAR", "tenant.id; used for tenant-scoped tokens"),
    Column("scope_name", pa.string(), "VARCHAR", "instrumentation scope name"),
    Column("is_engine", pa.bool_(), "BOOLEAN", "true for engine request spans (llm_request, SGLang Req)"),
    Column("model", pa.string(), "VARCHAR", "model name (request model, else response model)"),
    Column("request_id", pa.string(), "VARCHAR", "gen_ai.request.id"),
    Column("input_tokens", pa.int64(), "BIGINT", "prompt tokens"),
    Column("output_tokens", pa.int64(), "BIGINT", "generated tokens"),
    Column("cached_tokens", pa.int64(), "BIGINT", "prompt tokens served from the prefix cache"),
    Column("queue_s", pa.float64(), "DOUBLE", "time waiting in the engine queue, seconds"),
    Column("ttft_s", pa.float64(), "DOUBLE", "time to first token, seconds"),
    Column("prefill_s", pa.float64(), "DOUBLE", "scheduled to first token, seconds"),
    Column("decode_s", pa.float64(), "DOUBLE", "first to last token, seconds"),
    Column("inference_s", pa.float64(), "DOUBLE", "scheduled to last token, seconds"),
    Column("e2e_s", pa.float64(), "DOUBLE", "arrival to finish as the engine reports it, seconds"),
    Column("tpot_s", pa.float64(), "DOUBLE", "decode_s / (output_tokens - 1), seconds per token"),
    Column("finish_reason", pa.string(), "VARCHAR", "first finish reason (stop, length, abort, ...)"),
    Column("attempt", pa.int32(), "INTEGER", "http.request.resend_count (0 = first attempt)"),
    Column("error_type", pa.string(), "VARCHAR", "error.type, else exception type, when the span failed"),
    Column("max_tokens", pa.int64(), "BIGINT", "the request's cap on generated tokens (gen_ai.request.max_tokens)"),
    Column("temperature", pa.float64(), "DOUBLE", "sampling temperature requested (gen_ai.request.temperature)"),
    Column("top_p", pa.float64(), "DOUBLE", "nucleus sampling p requested (gen_ai.request.top_p)"),
    Column("choice_count", pa.int64(), "BIGINT", "completions requested (gen_ai.request.choice.count; vLLM: .n)"),
    Column("resource_attributes", _MAP, _MAP_SQL, "every resource attribute, values as strings"),
    Column("attributes", _MAP, _MAP_SQL, "every span attribute, values as strings"),
)

LATENCY_COLUMNS: Final[tuple[str, ...]] = (
    "queue_s",
    "ttft_s",
    "prefill_s",
    "decode_s",
    "inference_s",
    "e2e_s",
    "tpot_s",
)

# Canonical column -> attribute keys in priority order (first present wins).
# Span attributes are searched before resource attributes, except for the
# columns in RESOURCE_FIRST_COLUMNS.
SPAN_ATTRIBUTE_SOURCES: Final[dict[str, tuple[str, ...]]] = {
    "service_name": ("service.name",),
    "service_version": ("service.version",),
    "service_instance": ("service.instance.id", "k8s.pod.name"),
    "host_name": ("host.name", "k8s.node.name"),
    "tenant_id": ("tenant.id",),
    "model": ("gen_ai.request.model", "gen_ai.response.model"),
    "request_id": ("gen_ai.request.id", "rid"),
    "input_tokens": ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
    "output_tokens": ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
    "cached_tokens": ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cached_tokens"),
    "queue_s": ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_scheduler"),
    "ttft_s": ("gen_ai.latency.time_to_first_token",),
    "prefill_s": ("gen_ai.latency.time_in_model_prefill",),
    "decode_s": ("gen_ai.latency.time_in_model_decode",),
    # V0 detailed traces report model-execute time; it is the closest V0 analogue.
    "inference_s": ("gen_ai.latency.time_in_model_inference", "gen_ai.latency.time_in_model_execute"),
    "e2e_s": ("gen_ai.latency.e2e",),
    "finish_reason": ("gen_ai.response.finish_reasons", "finish_reason"),
    "attempt": ("http.request.resend_count",),
    "error_type": ("error.type", "exception.type"),
    # Schema 3: the request parameters vLLM (V1 always; V0 and SGLang when truthy) puts on every
    # request span. In the maps they were most of what an engine span kept there, and DuckDB
    # appends a MAP entry at ~0.8 us (issue 18); as columns they cost a few ns and can be sliced on.
    "max_tokens": ("gen_ai.request.max_tokens",),
    "temperature": ("gen_ai.request.temperature",),
    "top_p": ("gen_ai.request.top_p",),
    "choice_count": ("gen_ai.request.choice.count", "gen_ai.request.n"),
}

RESOURCE_FIRST_COLUMNS: Final[frozenset[str]] = frozenset(
    {"service_name", "service_version", "service_instance", "host_name"}
)

#: Metric points' identity columns: resource attributes, first present key wins.
METRIC_RESOURCE_SOURCES: Final[dict[str, tuple[str, ...]]] = {
    "service_name": ("service.name",),
    "service_version": ("service.version",),
    "service_instance": ("service.instance.id", "k8s.pod.name"),
    "host_name": ("host.name", "k8s.node.name"),
}
#: A metric point's ``model``: the first of these among its labels, then its resource's attributes.
METRIC_MODEL_KEYS: Final[tuple[str, ...]] = ("model_name", "gen_ai.request.model", "gen_ai.response.model", "model")
#: An INTEGER (int32) canonical column keeps values strictly inside (-bound, bound); others are NULL.
INT32_BOUND: Final[int] = 2**31
#: ``ttft - prefill`` (SGLang's time before the model worked on a request) may fall this far below 0
#: by rounding of float seconds and still be a queue of 0; further below it is malformed (NULL).
QUEUE_TOLERANCE_S: Final[float] = 1e-6

# Span names that mark an engine request span; SGLang's root span is
# "{role} Req {rid8}" and is matched by the substring " Req " or prefix "Req ".
ENGINE_SPAN_NAMES: Final[frozenset[str]] = frozenset({"llm_request"})

# Attributes that carry prompt or completion content. Stored only as
# length + keyed hash unless the operator opts in with --keep-content.
CONTENT_ATTRIBUTES: Final[frozenset[str]] = frozenset(
    {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.definitions",
        "gen_ai.prompt",
        "gen_ai.completion",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
)


def spans_arrow_schema() -> pa.Schema:
    """The Arrow schema of a batch handed to ``Store.append_spans``."""
    return pa.schema([pa.field(c.name, c.arrow) for c in SPAN_COLUMNS])


# (trace_id, span_id) and (series_key, time_ns) are unique, but enforced by
# Store's append (an anti-join over the batch's time range), not by a
# PRIMARY KEY: DuckDB's ART index for it made the file ~4x larger (about
# 100 bytes per row) and must be maintained on every insert.

#: Attribute keys a canonical column is read from, as ``(key, column)`` in the order of
#: :data:`SPAN_ATTRIBUTE_SOURCES`: bit ``i`` of ``span_rows.promoted`` stands for
#: ``PROMOTED_KEYS[i]`` in the span's attributes, bit ``i`` of ``promoted_resource`` for it in
#: the resource's. Stored rows depend on this order, so a new source is appended at the end of
#: SPAN_ATTRIBUTE_SOURCES (tests/core/test_schema.py pins the order).
PROMOTED_KEYS: Final[tuple[tuple[str, str], ...]] = tuple(
    (key, column) for column, keys in SPAN_ATTRIBUTE_SOURCES.items() for key in keys
)
#: Bits a promoted mask can hold (BIGINT, sign bit unused).
MAX_PROMOTED_KEYS: Final[int] = 63

_CANONICAL_SPAN_COLUMNS = [c for c in SPAN_COLUMNS if c.name not in ("attributes", "resource_attributes")]

#: The stored span table: the canonical columns, the attributes no column reproduces, and
#: which promoted attributes the ``spans`` view re-adds.
SPAN_ROWS_DDL: Final[str] = (
    "CREATE TABLE IF NOT EXISTS span_rows (\n    "
    + ",\n    ".join(f"{c.name} {c.duckdb}" for c in _CANONICAL_SPAN_COLUMNS)
    + f",\n    extra_resource_attributes {_MAP_SQL},\n    extra_attributes {_MAP_SQL},"
    + "\n    promoted BIGINT DEFAULT 0,\n    promoted_resource BIGINT DEFAULT 0\n)"
)


#: Each whole map of the ``spans`` view -> (its stored part, the column holding its promoted bits).
MAP_PARTS: Final[dict[str, tuple[str, str]]] = {
    "resource_attributes": ("extra_resource_attributes", "promoted_resource"),
    "attributes": ("extra_attributes", "promoted"),
}


_DOUBLE_COLUMNS = frozenset(c.name for c in SPAN_COLUMNS if c.duckdb == "DOUBLE")


def promoted_sql(index: int, bits: str) -> tuple[str, str]:
    """``(is it promoted, its value)`` in SQL for ``PROMOTED_KEYS[index]`` in the map whose bits are column ``bits``.

    The value is spelled as ingest (Arrow) spelled the attribute: DuckDB's ``CAST(x AS VARCHAR)``,
    except that an integral double below 1e9 is spelled as the integer (``1``, not ``1.0``).
    Only values both spell alike are ever promoted (``sre_agent.store.span_rows.safe_doubles``).
    """
    column = PROMOTED_KEYS[index][1]
    value = f"CAST({column} AS VARCHAR)"
    if column in _DOUBLE_COLUMNS:
        integral = f"{column} = trunc({column}) AND abs({column}) < 1e9"
        value = f"CASE WHEN {integral} THEN CAST(CAST({column} AS BIGINT) AS VARCHAR) ELSE {value} END"
    return f"({bits} >> {index}) & 1 = 1", value


def _map_view_sql(whole_map: str) -> str:
    """The whole map: the stored part, plus the promoted entries rebuilt from their columns."""
    stored, bit_column = MAP_PARTS[whole_map]
    bits, values = zip(*(promoted_sql(i, bit_column) for i in range(len(PROMOTED_KEYS))), strict=True)
    keys = ", ".join(f"'{key}'" for key, _ in PROMOTED_KEYS)
    mask = ", ".join(bits)
    lazy = ", ".join(f"CASE WHEN {bit} THEN {value} END" for bit, value in zip(bits, values, strict=True))
    every = (1 << len(PROMOTED_KEYS)) - 1
    return (
        f"CASE WHEN {bit_column} & {every} = 0 THEN {stored} "
        f"ELSE map_concat({stored}, MAP(list_where([{keys}], [{mask}]), list_where([{lazy}], [{mask}]))) END"
    )


#: ``spans`` as every reader sees it: the canonical columns and both attribute maps whole.
#: The stored parts stay visible too: rebuilding a map costs ~10 us a row, so the query
#: code reads one key from them (:mod:`sre_agent.store.attribute_sql`) without building any map.
SPANS_VIEW_DDL: Final[str] = (
    "CREATE OR REPLACE VIEW spans AS SELECT\n    "
    + ",\n    ".join(c.name for c in _CANONICAL_SPAN_COLUMNS)
    + "".join(f",\n    {_map_view_sql(name)} AS {name}" for name in MAP_PARTS)
    + ",\n    extra_resource_attributes, extra_attributes, promoted, promoted_resource\nFROM span_rows"
)

#: Everything that creates the spans relation: the table, then the view over it (two statements).
SPANS_DDL: Final[str] = f"{SPAN_ROWS_DDL};\n{SPANS_VIEW_DDL}"


METRIC_POINT_COLUMNS: Final[tuple[Column, ...]] = (
    Column("name", pa.string(), "VARCHAR NOT NULL", "canonical metric name (see canonical_metric_name)"),
    Column("source_name", pa.string(), "VARCHAR", "metric name as received"),
    Column("kind", pa.string(), "VARCHAR", "gauge|sum|histogram|exponential_histogram|summary"),
    Column("unit", pa.string(), "VARCHAR", "unit as received"),
    Column("time_ns", pa.int64(), "BIGINT NOT NULL", "sample time, Unix epoch nanoseconds"),
    Column("start_time_ns", pa.int64(), "BIGINT", "start of a cumulative series, Unix epoch ns"),
    Column("value", pa.float64(), "DOUBLE", "gauge or sum value; NULL for histograms"),
    Column("is_monotonic", pa.bool_(), "BOOLEAN", "sums only: monotonic counter"),
    Column("temporality", pa.string(), "VARCHAR", "cumulative|delta for sums and histograms"),
    Column("count", pa.int64(), "BIGINT", "histogram observation count"),
    Column("sum", pa.float64(), "DOUBLE", "histogram sum of observations"),
    Column("bounds", pa.list_(pa.float64()), "DOUBLE[]", "histogram explicit bucket upper bounds"),
    Column("bucket_counts", pa.list_(pa.int64()), "BIGINT[]", "histogram counts, len(bounds) + 1"),
    Column("service_name", pa.string(), "VARCHAR", "resource service.name"),
    Column("service_version", pa.string(), "VARCHAR", "resource service.version"),
    Column("service_instance", pa.string(), "VARCHAR", "service.instance.id (or pod name)"),
    Column("host_name", pa.string(), "VARCHAR", "host.name"),
    Column("model", pa.string(), "VARCHAR", "label model_name, else gen_ai.request.model"),
    Column("series_key", pa.string(), "VARCHAR NOT NULL", "stable hash of name + all attributes"),
    Column("resource_attributes", _MAP, _MAP_SQL, "every resource attribute"),
    Column("attributes", _MAP, _MAP_SQL, "every point attribute (labels)"),
)


def metric_points_arrow_schema() -> pa.Schema:
    """The Arrow schema of a batch handed to ``Store.append_metric_points``."""
    return pa.schema([pa.field(c.name, c.arrow) for c in METRIC_POINT_COLUMNS])


METRIC_POINTS_DDL: Final[str] = (
    "CREATE TABLE IF NOT EXISTS metric_points (\n    "
    + ",\n    ".join(f"{c.name} {c.duckdb}" for c in METRIC_POINT_COLUMNS)
    + "\n)"
)

DEPLOYS_DDL: Final[str] = """CREATE TABLE IF NOT EXISTS deploys (
    time_ns BIGINT NOT NULL,
    service_name VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    previous_version VARCHAR,
    source VARCHAR NOT NULL,
    note VARCHAR,
    PRIMARY KEY (service_name, version, time_ns)
)"""

# Old or vendor spellings -> canonical name (after the `_total` suffix is
# trimmed). Counters are stored under their declared name without `_total`.
METRIC_NAME_ALIASES: Final[dict[str, str]] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}

# Engine-neutral signal -> canonical metric names that carry it. Rules ask
# for a signal; the first name with data wins.
METRIC_SIGNALS: Final[dict[str, tuple[str, ...]]] = {
    "running_requests": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting_requests": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "sglang:token_usage"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "sglang:cached_tokens"),
    "prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
    "preemptions": ("vllm:num_preemptions", "sglang:num_retracted_requests"),
    "iteration_tokens": ("vllm:iteration_tokens",),
    "prompt_tokens": ("vllm:prompt_tokens", "sglang:prompt_tokens"),
    "generation_tokens": ("vllm:generation_tokens", "sglang:generation_tokens"),
    "ttft_seconds": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "itl_seconds": ("vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds"),
    "e2e_seconds": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
    "queue_seconds": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
}


def canonical_metric_name(name: str) -> str:
    """Normalise a received metric name so that every spelling meets.

    Trims a trailing ``_total`` (Prometheus adds it to counters; a
    collector may keep or trim it; ``vllm:iteration_tokens_total`` is a
    histogram whose declared name already ends in it, so it is trimmed too)
    and maps old vLLM names onto current ones.

    >>> canonical_metric_name("vllm:prefix_cache_hits_total")
    'vllm:prefix_cache_hits'
    >>> canonical_metric_name("vllm:gpu_cache_usage_perc")
    'vllm:kv_cache_usage_perc'
    """
    if name.endswith("_total"):
        name = name[: -len("_total")]
    return METRIC_NAME_ALIASES.get(name, name)
