"""The OTel Collector ClickHouse exporter's tables, filled as the exporter fills them (a test double).

No Collector binary can run here (it is a Go program, not on PyPI), so this module
stands in for the contrib ``clickhouseexporter``: its documented DDL
(docs/reference/telemetry.md 5.5; indexes, TTL and exemplars left out, they do not
change what a query reads) and its row layout from OTLP requests (lowercase hex
ids, ``''`` for no parent, every attribute value as pdata's ``AsString``,
``Duration`` in ns, exception events in the ``Events`` nested columns, one row per
metric data point). :class:`ExporterTables` is a replay output, so a scenario's
telemetry lands in chdb exactly as a Collector would write it.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan

from sre_agent.store.clickhouse_schema import DEFAULT_METRIC_TABLES

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

KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
CODES = ("Unset", "Ok", "Error")


def as_string(value: Any) -> str:
    """An attribute value as the exporter writes it (pdata ``AsString``)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return str(value.string_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return go_float(value.double_value)
    if kind == "array_value":
        return json.dumps([as_python(v) for v in value.array_value.values], separators=(",", ":"))
    return ""


def go_float(number: float) -> str:
    """pdata's spelling of a double: shortest round trip, positional unless below 1e-6 or from 1e21."""
    magnitude = abs(number)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        return str(np.format_float_scientific(number, trim="-", exp_digits=1))
    return str(np.format_float_positional(number, trim="-"))


def as_python(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [as_python(v) for v in value.array_value.values]
    return None if kind is None else getattr(value, kind)


def exporter_rows(request: Any, *, old_spelling: bool) -> pa.Table:
    """The rows the exporter inserts for ``request`` (one per span), as Arrow columns."""
    rows: dict[str, list[Any]] = {name: [] for name in (
        "ts", "trace", "span", "parent", "name", "kind", "service", "resource", "scope", "attributes", "duration",
        "code", "message", "event_ts", "event_names", "event_attributes")}  # fmt: skip
    for resource_spans in request.resource_spans:
        resource = {kv.key: as_string(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                kind, code = KINDS[span.kind], CODES[span.status.code]
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
                rows["attributes"].append([(kv.key, as_string(kv.value)) for kv in span.attributes])
                rows["duration"].append(span.end_time_unix_nano - span.start_time_unix_nano)
                rows["code"].append(code)
                rows["message"].append(span.status.message)
                rows["event_ts"].append([e.time_unix_nano for e in span.events])
                rows["event_names"].append([e.name for e in span.events])
                rows["event_attributes"].append(
                    [[(kv.key, as_string(kv.value)) for kv in e.attributes] for e in span.events]
                )
    string_map = pa.map_(pa.string(), pa.string())
    types = {"resource": string_map, "attributes": string_map, "event_attributes": pa.list_(string_map),
             "ts": pa.int64(), "duration": pa.uint64(), "event_ts": pa.list_(pa.int64())}  # fmt: skip
    return pa.table({name: pa.array(values, types.get(name)) for name, values in rows.items()})


METRIC_COLUMNS = """
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
    "gauge": f"CREATE TABLE otel_metrics_gauge ({METRIC_COLUMNS} Value Float64, Flags UInt32)",
    "sum": f"CREATE TABLE otel_metrics_sum ({METRIC_COLUMNS} Value Float64, Flags UInt32, "
    "AggregationTemporality Int32, IsMonotonic Boolean)",
    "histogram": f"CREATE TABLE otel_metrics_histogram ({METRIC_COLUMNS} Count UInt64, Sum Float64, "
    "BucketCounts Array(UInt64), ExplicitBounds Array(Float64), Flags UInt32, Min Float64, Max Float64, "
    "AggregationTemporality Int32)",
}


def exporter_metric_rows(request: Any) -> dict[str, pa.Table]:
    """Per exporter table, the rows it inserts for ``request`` (one per data point)."""
    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in OTEL_METRICS_DDL}
    for resource_metrics in request.resource_metrics:
        resource = [(kv.key, as_string(kv.value)) for kv in resource_metrics.resource.attributes]
        service = dict(resource).get("service.name", "")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                data = getattr(metric, kind)
                for point in data.data_points:
                    row = {"resource": resource, "service": service, "name": metric.name, "unit": metric.unit,
                           "attributes": [(kv.key, as_string(kv.value)) for kv in point.attributes],
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


_SPAN_INSERT = """INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
      ResourceAttributes, ScopeName, SpanAttributes, Duration, StatusCode, StatusMessage,
      `Events.Timestamp`, `Events.Name`, `Events.Attributes`)
    SELECT fromUnixTimestamp64Nano(ts), trace, span, parent, name, kind, service, resource, scope,
      attributes, duration, code, message, arrayMap(t -> fromUnixTimestamp64Nano(t), event_ts),
      event_names, event_attributes
    FROM file('{path}', Parquet)"""
_METRIC_EXTRA = {
    "gauge": ("Value", "value"),
    "sum": ("Value, AggregationTemporality, IsMonotonic", "value, temporality, monotonic"),
    "histogram": ("Count, Sum, BucketCounts, ExplicitBounds, AggregationTemporality",
                  "count, sum, buckets, bounds, temporality"),
}  # fmt: skip
_METRIC_INSERT = """INSERT INTO {table} (ResourceAttributes, ServiceName, MetricName, MetricUnit,
      Attributes, StartTimeUnix, TimeUnix, {columns})
    SELECT resource, service, name, unit, attributes, fromUnixTimestamp64Nano(start),
      fromUnixTimestamp64Nano(time), {values} FROM file('{path}', Parquet)"""


def create_tables(db: Any) -> None:
    """The exporter's four tables in chdb session ``db``."""
    db.query(OTEL_TRACES_DDL)
    for ddl in OTEL_METRICS_DDL.values():
        db.query(ddl + " ENGINE = MergeTree ORDER BY (ServiceName, MetricName, TimeUnix)")


def insert_spans(db: Any, table: pa.Table, scratch: Path) -> None:
    """Insert exporter span rows (:func:`exporter_rows`) through a Parquet file in ``scratch``."""
    path = scratch / "spans.parquet"
    pq.write_table(table, path)
    db.query(_SPAN_INSERT.format(path=path))
    path.unlink()


def insert_metric_rows(db: Any, tables: dict[str, pa.Table], scratch: Path) -> None:
    """Insert exporter metric rows (:func:`exporter_metric_rows`) per kind."""
    for kind, table in tables.items():
        path = scratch / f"{kind}.parquet"
        pq.write_table(table, path)
        columns, values = _METRIC_EXTRA[kind]
        db.query(_METRIC_INSERT.format(table=DEFAULT_METRIC_TABLES[kind], columns=columns, values=values, path=path))
        path.unlink()


class ExporterTables:
    """A replay output (``TelemetryOutput``) writing into chdb as the exporter would.

    Spans and scrapes are encoded to OTLP requests by the SDK's own encoders (what
    the Collector receives), laid out as exporter rows and inserted at
    :meth:`shutdown` in one batch per table.
    """

    def __init__(self, db: Any, scratch: Path) -> None:
        self.db = db
        self.scratch = scratch
        self._spans: list[pa.Table] = []
        self._metrics: dict[str, list[pa.Table]] = {kind: [] for kind in OTEL_METRICS_DDL}
        create_tables(db)

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Lay out one export batch of spans."""
        if spans:
            self._spans.append(exporter_rows(encode_spans(spans), old_spelling=False))

    def export_metrics(self, data: MetricsData) -> None:
        """Lay out one scrape."""
        if data.resource_metrics:
            for kind, table in exporter_metric_rows(encode_metrics(data)).items():
                self._metrics[kind].append(table)

    def shutdown(self) -> None:
        """Insert what was laid out."""
        if self._spans:
            insert_spans(self.db, pa.concat_tables(self._spans), self.scratch)
            self._spans = []
        tables = {k: pa.concat_tables(v, promote_options="permissive") for k, v in self._metrics.items() if v}
        insert_metric_rows(self.db, tables, self.scratch)
        self._metrics = {kind: [] for kind in OTEL_METRICS_DDL}


def _hex_ids_to_base64(node: Any) -> Any:
    """OTLP/JSON spells ids in hex; protobuf's JSON mapping wants bytes in base64."""
    if isinstance(node, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode()
            if k in _ID_KEYS and isinstance(v, str)
            else _hex_ids_to_base64(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def load_otlp_json_lines(db: Any, path: Path, scratch: Path) -> None:
    """Insert a Collector file-exporter file (OTLP/JSON lines, gzip or not) as the ClickHouse exporter would."""
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    opener = gzip.open if path.suffix == ".gz" else open
    spans: list[pa.Table] = []
    metrics: dict[str, list[pa.Table]] = {kind: [] for kind in OTEL_METRICS_DDL}
    with opener(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            document = json.loads(line)
            if "resourceSpans" in document:
                request = ParseDict(_hex_ids_to_base64(document), ExportTraceServiceRequest())
                spans.append(exporter_rows(request, old_spelling=False))
            elif "resourceMetrics" in document:
                request = ParseDict(document, ExportMetricsServiceRequest())
                for kind, table in exporter_metric_rows(request).items():
                    metrics[kind].append(table)
    create_tables(db)
    if spans:
        insert_spans(db, pa.concat_tables(spans), scratch)
    insert_metric_rows(
        db, {k: pa.concat_tables(v, promote_options="permissive") for k, v in metrics.items() if v}, scratch
    )


class Tee:
    """One replay into several outputs."""

    def __init__(self, *outputs: Any) -> None:
        self.outputs = outputs

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        for output in self.outputs:
            output.export_spans(spans)

    def export_metrics(self, data: MetricsData) -> None:
        for output in self.outputs:
            output.export_metrics(data)

    def shutdown(self) -> None:
        for output in self.outputs:
            output.shutdown()


#: Keys whose values are wall-clock measurements, not results.
TIMINGS = frozenset({"elapsed_s", "timings", "seconds", "rule_seconds"})


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where two JSON-like values differ (floats to 1e-9 relative), timings left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(set(a) | set(b))
            if k not in TIMINGS
            for d in differences(a.get(k), b.get(k), f"{path}.{k}")
        ]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [(path, len(a), len(b))]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        same = math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
        return [] if same else [(path, a, b)]
    return [] if a == b else [(path, a, b)]


if __name__ == "__main__":
    # python tests/exporter_layout.py TELEMETRY.jsonl.gz CHDB_DIR: a file exporter's output into new exporter tables.
    import sys

    from chdb import session

    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    chdb_session = session.Session(str(target))
    try:
        load_otlp_json_lines(chdb_session, source, target.parent)
    finally:
        chdb_session.close()


def duckdb_to_exporter(store: Path, target: Path) -> None:
    """An sre-agent DuckDB store's spans and metric points laid out in new exporter tables in chdb at ``target``.

    For stores built straight in DuckDB (synthetic tests, benchmarks), which have no OTLP
    to replay: every canonical span column is written back as the attribute it is read
    from first (``SPAN_ATTRIBUTE_SOURCES``), over the span's own attributes; kinds and
    status codes in the exporter's spelling; metric identity columns as resource attributes.
    """
    import duckdb
    from chdb import session

    from sre_agent.store.schema import SPAN_ATTRIBUTE_SOURCES

    scratch = target.with_name(target.name + ".scratch")
    scratch.mkdir(exist_ok=True)
    columns = [c for c in SPAN_ATTRIBUTE_SOURCES if c not in RESOURCE_COLUMNS]
    keys = ", ".join(f"'{SPAN_ATTRIBUTE_SOURCES[c][0]}'" for c in columns)
    values = ", ".join(f"CAST({c} AS VARCHAR)" for c in columns)
    resource_keys = ", ".join(f"'{SPAN_ATTRIBUTE_SOURCES[c][0]}'" for c in RESOURCE_COLUMNS)
    resource_values = ", ".join(RESOURCE_COLUMNS)
    con = duckdb.connect(str(store), read_only=True)
    try:
        con.execute(
            f"""COPY (SELECT start_ns AS ts, trace_id AS trace, span_id AS span, coalesce(parent_span_id, '') AS parent,
                  name, upper(kind[1]) || kind[2:] AS kind, coalesce(service_name, '') AS service,
                  map_concat(resource_attributes, map_from_entries(list_filter(
                    list_zip([{resource_keys}], [{resource_values}]), lambda e: e[2] IS NOT NULL))) AS resource,
                  coalesce(scope_name, '') AS scope,
                  map_concat(attributes, map_from_entries(list_filter(
                    list_zip([{keys}], [{values}]), lambda e: e[2] IS NOT NULL))) AS attributes,
                  CAST(greatest(end_ns - start_ns, 0) AS UBIGINT) AS duration,
                  upper(coalesce(status_code, 'unset')[1]) || coalesce(status_code, 'unset')[2:] AS code,
                  coalesce(status_message, '') AS message,
                  CAST([] AS BIGINT[]) AS event_ts, CAST([] AS VARCHAR[]) AS event_names,
                  CAST([] AS MAP(VARCHAR, VARCHAR)[]) AS event_attributes
                FROM spans) TO '{scratch}/spans.parquet' (FORMAT parquet)"""
        )
        identity = (
            "map_concat(resource_attributes, map_from_entries(list_filter(list_zip(['service.name', "
            "'service.version', 'service.instance.id', 'host.name'], [service_name, service_version, "
            "service_instance, host_name]), lambda e: e[2] IS NOT NULL)))"
        )
        temporality = "CAST(CASE temporality WHEN 'delta' THEN 1 WHEN 'cumulative' THEN 2 ELSE 0 END AS INTEGER)"
        tables: dict[str, pa.Table] = {}
        for kind in OTEL_METRICS_DDL:
            tables[kind] = con.sql(
                f"""SELECT {identity} AS resource, coalesce(service_name, '') AS service, source_name AS name,
                      coalesce(unit, '') AS unit, attributes, coalesce(start_time_ns, 0) AS start, time_ns AS time,
                      value, {temporality} AS temporality, coalesce(is_monotonic, false) AS monotonic,
                      CAST(count AS UBIGINT) AS count, sum, bounds, CAST(bucket_counts AS UBIGINT[]) AS buckets
                    FROM metric_points WHERE kind = '{kind}'"""
            ).to_arrow_table()
    finally:
        con.close()
    db = session.Session(str(target))
    try:
        create_tables(db)
        db.query(_SPAN_INSERT.format(path=scratch / "spans.parquet"))
        insert_metric_rows(db, {k: t for k, t in tables.items() if t.num_rows}, scratch)
    finally:
        db.close()
        for part in scratch.iterdir():
            part.unlink()
        scratch.rmdir()


#: Canonical columns the exporter holds as resource attributes.
RESOURCE_COLUMNS = ("service_name", "service_version", "service_instance", "host_name")
