"""The ClickHouse exporter's ``otel_traces`` read as canonical spans, in ClickHouse itself (chdb).

The table is created from the exporter's documented columns (docs/reference/telemetry.md 5.5,
in both the current and the older spellings of kinds and status codes), filled as the exporter
lays spans out (lowercase hex ids, ``''`` for no parent, every attribute value as a string,
``Duration`` in ns, exception events in the ``Events`` nested columns), and read through
:func:`sre_agent.clickhouse_schema.spans_select`. Each canonical column must equal what
sre-agent's own receiver decodes from the same OTLP request.

Opt-in (``-m clickhouse``): chdb is ClickHouse in-process, ~0.5 GB, installed by
``pip install -e '.[clickhouse]'``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_builders import SEMCONV_NEW, SEMCONV_OLD, SGLANG, T0, VLLM_V0, VLLM_V1, metrics_request, trace_request

from sre_agent.clickhouse_schema import DEFAULT_METRIC_TABLES, metric_points_select, spans_select
from sre_agent.normalise import Normaliser
from sre_agent.otlp import decode_metrics, decode_traces
from sre_agent.schema import METRIC_POINT_COLUMNS, SPAN_COLUMNS

pytestmark = pytest.mark.clickhouse

#: The exporter's traces table, from the documented columns (indexes and TTL left out: they do
#: not change what a query reads).
OTEL_TRACES_DDL = """
CREATE TABLE otel_traces (
    Timestamp DateTime64(9),
    TraceId String,
    SpanId String,
    ParentSpanId String,
    TraceState String,
    SpanName LowCardinality(String),
    SpanKind LowCardinality(String),
    ServiceName LowCardinality(String),
    ResourceAttributes Map(LowCardinality(String), String),
    ScopeName String,
    ScopeVersion String,
    SpanAttributes Map(LowCardinality(String), String),
    Duration UInt64,
    StatusCode LowCardinality(String),
    StatusMessage String,
    Events Nested (
        Timestamp DateTime64(9), Name LowCardinality(String), Attributes Map(LowCardinality(String), String)
    ),
    Links Nested (TraceId String, SpanId String, TraceState String, Attributes Map(LowCardinality(String), String))
) ENGINE = MergeTree PARTITION BY toDate(Timestamp) ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
"""

_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
_CODES = ("Unset", "Ok", "Error")
NORM = Normaliser(hash_key=b"clickhouse", keep_content=True)


def _as_string(value: Any) -> str:
    """An attribute value as the exporter writes it (pdata ``AsString``)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return str(value.string_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return _go_float(value.double_value)
    if kind == "array_value":
        return json.dumps([_as_python(v) for v in value.array_value.values], separators=(",", ":"))
    return ""


def _go_float(number: float) -> str:
    """pdata's spelling of a double: shortest round trip, positional unless below 1e-6 or from 1e21."""
    magnitude = abs(number)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        return str(np.format_float_scientific(number, trim="-", exp_digits=1))
    return str(np.format_float_positional(number, trim="-"))


def _as_python(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_as_python(v) for v in value.array_value.values]
    return None if kind is None else getattr(value, kind)


def _exporter_rows(request: Any, *, old_spelling: bool) -> pa.Table:
    """The rows the exporter inserts for ``request`` (one per span), as Arrow columns."""
    rows: dict[str, list[Any]] = {name: [] for name in (
        "ts", "trace", "span", "parent", "name", "kind", "service", "resource", "scope", "attributes", "duration",
        "code", "message", "event_ts", "event_names", "event_attributes")}  # fmt: skip
    for resource_spans in request.resource_spans:
        resource = {kv.key: _as_string(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                kind, code = _KINDS[span.kind], _CODES[span.status.code]
                if old_spelling:
                    kind, code = f"SPAN_KIND_{kind.upper()}", f"STATUS_CODE_{code.upper()}"
                rows["ts"].append(span.start_time_unix_nano)
                rows["trace"].append(span.trace_id.hex())
                rows["span"].append(span.span_id.hex())
                rows["parent"].append(span.parent_span_id.hex())
                rows["name"].append(span.name)
                rows["kind"].append(kind)
                rows["service"].append(resource.get("service.name", ""))
                rows["resource"].append(list(resource.items()))
                rows["scope"].append(scope_spans.scope.name)
                rows["attributes"].append([(kv.key, _as_string(kv.value)) for kv in span.attributes])
                rows["duration"].append(span.end_time_unix_nano - span.start_time_unix_nano)
                rows["code"].append(code)
                rows["message"].append(span.status.message)
                rows["event_ts"].append([e.time_unix_nano for e in span.events])
                rows["event_names"].append([e.name for e in span.events])
                rows["event_attributes"].append(
                    [[(kv.key, _as_string(kv.value)) for kv in e.attributes] for e in span.events]
                )
    string_map = pa.map_(pa.string(), pa.string())
    types = {"resource": string_map, "attributes": string_map, "event_attributes": pa.list_(string_map),
             "ts": pa.int64(), "duration": pa.uint64(), "event_ts": pa.list_(pa.int64())}  # fmt: skip
    return pa.table({name: pa.array(values, types.get(name)) for name, values in rows.items()})


def _chdb_spans(tmp_path: Path, request: Any, *, old_spelling: bool) -> list[dict[str, Any]]:
    from chdb import session

    path = tmp_path / "exported.parquet"
    pq.write_table(_exporter_rows(request, old_spelling=old_spelling), path)
    db = session.Session(str(tmp_path / "chdb"))
    try:
        db.query(OTEL_TRACES_DDL)
        db.query(
            f"""INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                  ResourceAttributes, ScopeName, SpanAttributes, Duration, StatusCode, StatusMessage,
                  `Events.Timestamp`, `Events.Name`, `Events.Attributes`)
                SELECT fromUnixTimestamp64Nano(ts), trace, span, parent, name, kind, service, resource, scope,
                  attributes, duration, code, message, arrayMap(t -> fromUnixTimestamp64Nano(t), event_ts),
                  event_names, event_attributes
                FROM file('{path}', Parquet)"""
        )
        table = db.query(f"SELECT * FROM ({spans_select()}) ORDER BY span_id", "ArrowTable")
    finally:
        db.close()
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _request() -> Any:
    """Engine spans of vLLM V0/V1 and SGLang, GenAI client spans, a gateway span with an exception."""
    resource = {"service.name": "vllm", "service.version": "v2", "host.name": "gpu-1", "service.instance.id": "pod-1"}
    spans = [
        {"attributes": {**VLLM_V1, "gen_ai.request.id": "v1-a", "tenant.id": "acme"}},
        {"attributes": {**VLLM_V0, "gen_ai.request.id": "v0-a"}, "start": T0 + 5_000},
        {"attributes": SGLANG, "name": "Req a1b2c3d4", "kind": 1},
        {"attributes": SEMCONV_NEW, "name": "chat gpt-4o", "kind": 3, "status": (2, "deadline")},
        {"attributes": SEMCONV_OLD, "name": "chat gpt-4", "kind": 3, "parent_span_id": b"\x01" * 8},
        {"attributes": {"http.route": "/v1/chat", "host.name": "gw-override", "gen_ai.usage.input_tokens": "12.7"},
         "name": "POST /v1/chat", "kind": 2, "status": (2, ""),
         "events": [("log", {"k": "v"}), ("exception", {"exception.type": "TimeoutError"})]},
        {"attributes": {"http.route": "/v1/chat", "http.request.resend_count": 2**40}, "name": "POST", "kind": 3,
         "status": (2, "")},
    ]  # fmt: skip
    return trace_request(spans, resource=resource)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    return bool(a == b)


@pytest.mark.parametrize("old_spelling", [False, True])
def test_exported_spans_read_as_the_receiver_decodes_them(tmp_path: Path, old_spelling: bool) -> None:
    request = _request()
    decoded = decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    expected = sorted(decoded.to_pylist(), key=lambda row: row["span_id"])
    got = _chdb_spans(tmp_path, request, old_spelling=old_spelling)
    assert len(got) == len(expected) == 7
    columns = [c.name for c in SPAN_COLUMNS if c.name not in ("attributes", "resource_attributes")]
    mismatches = [
        (row["name"], column, row[column], mine[column])
        for row, mine in zip(expected, got, strict=True)
        for column in columns
        if not _same(row[column], mine[column])
    ]
    assert mismatches == []


def test_the_maps_are_the_exporters_maps(tmp_path: Path) -> None:
    got = _chdb_spans(tmp_path, _request(), old_spelling=False)
    gateway = next(row for row in got if row["name"] == "POST /v1/chat")
    assert dict(gateway["attributes"])["http.route"] == "/v1/chat"
    assert dict(gateway["resource_attributes"])["host.name"] == "gpu-1"
    # host.name is resource-first: the span attribute does not override the resource's.
    assert gateway["host_name"] == "gpu-1"


_NUMERIC_KEYS = [
    "gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens", "gen_ai.usage.completion_tokens",
    "gen_ai.latency.time_to_first_token", "gen_ai.latency.time_in_model_prefill", "gen_ai.latency.e2e",
    "http.request.resend_count",
]  # fmt: skip
_TEXT_KEYS = ["gen_ai.response.finish_reasons", "tenant.id"]
_NOT_DOUBLES = st.one_of(
    st.integers(min_value=-(2**62), max_value=2**62),
    st.booleans(),
    st.from_regex(r"-?[0-9]{1,6}(\.[0-9]{1,4})?", fullmatch=True),
    st.lists(st.sampled_from(["stop", "length"]), max_size=2),
    st.sampled_from(["", "x", '["stop"]', "[]"]),
)
_DOUBLES = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False).filter(lambda x: x == 0 or abs(x) > 1e-9)
# A double under a text key is spelled by whoever wrote it (Arrow's shortest form here, Go's
# in the exporter: 5e-05 against 0.00005), so text keys get every kind but doubles.
_ATTRIBUTES = st.fixed_dictionaries(
    {},
    optional={
        **{key: st.one_of(_NOT_DOUBLES, _DOUBLES) for key in _NUMERIC_KEYS},
        **dict.fromkeys(_TEXT_KEYS, _NOT_DOUBLES),
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spans=st.lists(_ATTRIBUTES, min_size=1, max_size=4))
def test_attribute_values_of_every_kind_type_alike(
    tmp_path_factory: pytest.TempPathFactory, spans: list[dict[str, Any]]
) -> None:
    # Any AnyValue kind under a canonical key (an int, a double, a bool, a numeric string, an
    # array) types to the same canonical value in ClickHouse as in the receiver.
    request = trace_request([{"attributes": attributes} for attributes in spans])
    decoded = decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    expected = sorted(decoded.to_pylist(), key=lambda row: row["span_id"])
    got = _chdb_spans(tmp_path_factory.mktemp("fuzz"), request, old_spelling=False)
    columns = ["input_tokens", "output_tokens", "ttft_s", "prefill_s", "e2e_s", "queue_s", "attempt",
               "finish_reason", "tenant_id", "is_engine", "tpot_s"]  # fmt: skip
    for row, mine in zip(expected, got, strict=True):
        assert [(c, mine[c]) for c in columns if not _same(row[c], mine[c])] == [], (row, mine)


_METRIC_COLUMNS = """
    ResourceAttributes Map(LowCardinality(String), String),
    ResourceSchemaUrl String,
    ScopeName String,
    ScopeVersion String,
    ScopeAttributes Map(LowCardinality(String), String),
    ScopeDroppedAttrCount UInt32,
    ScopeSchemaUrl String,
    ServiceName LowCardinality(String),
    MetricName String,
    MetricDescription String,
    MetricUnit String,
    Attributes Map(LowCardinality(String), String),
    StartTimeUnix DateTime64(9),
    TimeUnix DateTime64(9),
"""
#: The exporter's metric tables, from its columns (exemplars, indexes and TTL left out).
OTEL_METRICS_DDL = {
    "gauge": f"CREATE TABLE otel_metrics_gauge ({_METRIC_COLUMNS} Value Float64, Flags UInt32)",
    "sum": f"CREATE TABLE otel_metrics_sum ({_METRIC_COLUMNS} Value Float64, Flags UInt32, "
    "AggregationTemporality Int32, IsMonotonic Boolean)",
    "histogram": f"CREATE TABLE otel_metrics_histogram ({_METRIC_COLUMNS} Count UInt64, Sum Float64, "
    "BucketCounts Array(UInt64), ExplicitBounds Array(Float64), Flags UInt32, Min Float64, Max Float64, "
    "AggregationTemporality Int32)",
}


def _exporter_metric_rows(request: Any) -> dict[str, pa.Table]:
    """Per exporter table, the rows it inserts for ``request`` (one per data point)."""
    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in OTEL_METRICS_DDL}
    for resource_metrics in request.resource_metrics:
        resource = [(kv.key, _as_string(kv.value)) for kv in resource_metrics.resource.attributes]
        service = dict(resource).get("service.name", "")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                data = getattr(metric, kind)
                for point in data.data_points:
                    row = {"resource": resource, "service": service, "name": metric.name, "unit": metric.unit,
                           "attributes": [(kv.key, _as_string(kv.value)) for kv in point.attributes],
                           "start": point.start_time_unix_nano, "time": point.time_unix_nano}  # fmt: skip
                    if kind == "histogram":
                        row |= {"count": point.count, "sum": point.sum, "buckets": list(point.bucket_counts),
                                "bounds": list(point.explicit_bounds)}  # fmt: skip
                    else:
                        which = point.WhichOneof("value")
                        row["value"] = float(getattr(point, which))
                    if kind in ("sum", "histogram"):
                        row["temporality"] = data.aggregation_temporality
                    if kind == "sum":
                        row["monotonic"] = data.is_monotonic
                    rows[kind].append(row)
    string_map = pa.map_(pa.string(), pa.string())
    types = {"resource": string_map, "attributes": string_map, "start": pa.int64(), "time": pa.int64(),
             "count": pa.uint64(), "buckets": pa.list_(pa.uint64()), "temporality": pa.int32()}  # fmt: skip
    return {
        kind: pa.table({name: pa.array([r[name] for r in kind_rows], types.get(name)) for name in kind_rows[0]})
        for kind, kind_rows in rows.items()
        if kind_rows
    }


def test_exported_metric_points_read_as_the_receiver_decodes_them(tmp_path: Path) -> None:
    from chdb import session

    resource = {"service.name": "vllm", "service.version": "v2", "host.name": "gpu-1", "k8s.pod.name": "pod-1"}
    labels = {"model_name": "llama", "engine": "0"}
    request = metrics_request(
        [
            {"name": "vllm:num_requests_running", "kind": "gauge",
             "points": [{"time": T0 + i * 10**9, "value": 3 + i, "attributes": labels} for i in range(3)]},
            {"name": "vllm:prompt_tokens_total", "kind": "sum", "unit": "tokens",
             "points": [{"time": T0 + i * 10**9, "start": T0 - 10**9, "value": 100 * i, "attributes": labels}
                        for i in range(3)]},
            {"name": "vllm:gpu_cache_usage_perc", "kind": "gauge", "points": [{"time": T0, "value": 0.5}]},
            {"name": "vllm:e2e_request_latency_seconds", "kind": "histogram", "temporality": 1, "unit": "s",
             "points": [{"time": T0 + i * 10**9, "count": 4 * i, "sum": 1.5 * i, "bounds": [0.1, 1.0],
                         "bucket_counts": [i, 2 * i, i], "attributes": labels} for i in range(3)]},
        ],
        resource=resource,
    )  # fmt: skip
    decoded = decode_metrics(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    db = session.Session(str(tmp_path / "chdb"))
    try:
        for kind, table in _exporter_metric_rows(request).items():
            db.query(OTEL_METRICS_DDL[kind] + " ENGINE = MergeTree ORDER BY (ServiceName, MetricName, TimeUnix)")
            path = tmp_path / f"{kind}.parquet"
            pq.write_table(table, path)
            extra = {"gauge": ("Value", "value"), "sum": ("Value, AggregationTemporality, IsMonotonic",
                     "value, temporality, monotonic"), "histogram": (
                     "Count, Sum, BucketCounts, ExplicitBounds, AggregationTemporality",
                     "count, sum, buckets, bounds, temporality")}[kind]  # fmt: skip
            db.query(
                f"""INSERT INTO {DEFAULT_METRIC_TABLES[kind]} (ResourceAttributes, ServiceName, MetricName, MetricUnit,
                      Attributes, StartTimeUnix, TimeUnix, {extra[0]})
                    SELECT resource, service, name, unit, attributes, fromUnixTimestamp64Nano(start),
                      fromUnixTimestamp64Nano(time), {extra[1]} FROM file('{path}', Parquet)"""
            )
        got = db.query(f"SELECT * FROM ({metric_points_select()}) ORDER BY name, time_ns", "ArrowTable").to_pylist()
    finally:
        db.close()
    expected = sorted(decoded.to_pylist(), key=lambda row: (row["name"], row["time_ns"]))
    assert len(got) == len(expected) == 10
    columns = [
        c.name for c in METRIC_POINT_COLUMNS if c.name not in ("series_key", "resource_attributes", "attributes")
    ]
    mismatches = [
        (row["name"], column, row[column], mine[column])
        for row, mine in zip(expected, got, strict=True)
        for column in columns
        if not _same(row[column], mine[column]) and not (row[column] is None and mine[column] == [])
    ]
    assert mismatches == []
    # series_key is this store's own identity: it groups the points as the receiver's does.
    assert len({r["series_key"] for r in got}) == len({r["series_key"] for r in expected}) == 4
