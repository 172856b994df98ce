"""Where a replay's telemetry goes: OTLP endpoint, collector-style JSON lines, a store, or memory.

Every output takes SDK objects (``ReadableSpan`` lists, ``MetricsData``) and
has the SDK exporter lifecycle: ``export_spans``, ``export_metrics``,
``shutdown`` (safe to call twice).

The JSON-lines file is what an OTel Collector's file exporter writes: one
``ExportTraceServiceRequest`` or ``ExportMetricsServiceRequest`` per line in
OTLP/JSON (hex ids, 64-bit integers as strings, enums as integers). The
encoder below writes that JSON directly from the SDK objects; a test checks
that every line parses with ``google.protobuf.json_format`` into exactly the
message the SDK's own OTLP encoder produces. It exists because the protobuf
route (encode, then ``MessageToDict``) costs about 0.4 ms per span here,
several times the simulation itself.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import socket
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from opentelemetry.sdk.metrics.export import Gauge, Histogram, MetricsData, Sum
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import StatusCode

from sre_agent.errors import RemoteError, SreAgentError

__all__ = [
    "JsonLinesOutput",
    "MemoryOutput",
    "OtlpEndpointOutput",
    "StoreOutput",
    "TelemetryOutput",
    "metrics_to_otlp_json",
    "spans_to_otlp_json",
    "spans_to_otlp_json_text",
]

log = logging.getLogger(__name__)


class TelemetryOutput(Protocol):
    """A destination for replay telemetry (SDK exporter lifecycle)."""

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Deliver finished spans."""

    def export_metrics(self, data: MetricsData) -> None:
        """Deliver one scrape's metric points."""

    def shutdown(self) -> None:
        """Flush and release resources; safe to call twice."""


# ----------------------------------------------------------------------------- OTLP/JSON


def _any_value(value: object) -> dict[str, Any]:
    kind = type(value)
    if kind is float:
        return {"doubleValue": value}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        return {"intValue": str(value)}
    return {"stringValue": str(value)}


# Non-float attributes repeat endlessly (tenant, route, model, token counts); their encoded
# KeyValue objects are shared. json.dumps serialises a shared object like any other.
_KV_CACHE: dict[tuple[str, object], dict[str, Any]] = {}


def _attributes(attrs: Any) -> list[dict[str, Any]]:
    out = []
    cache = _KV_CACHE
    for k, v in attrs.items():
        if type(v) is float:
            out.append({"key": k, "value": {"doubleValue": v}})
            continue
        kv = cache.get((k, v))
        if kv is None:
            kv = {"key": k, "value": _any_value(v)}
            if len(cache) < 100_000:
                cache[(k, v)] = kv
        out.append(kv)
    return out


def _resource(res: Resource) -> dict[str, Any]:
    return {"attributes": _attributes(res.attributes)}


def _scope(scope: InstrumentationScope | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if scope is not None:
        out["name"] = scope.name
        if scope.version:
            out["version"] = scope.version
    return out


# Pre-encoded JSON text of repeated pieces: attribute keys, span names, non-float KeyValues.
_TEXT_CACHE: dict[object, str] = {}
_TEXT_CACHE_MAX = 100_000


def _cached_text(key: object, make: Any) -> str:
    text = _TEXT_CACHE.get(key)
    if text is None:
        text = make()
        if len(_TEXT_CACHE) < _TEXT_CACHE_MAX:
            _TEXT_CACHE[key] = text
    return text


def _attributes_text(attrs: Any) -> str:
    parts = []
    for k, v in attrs.items():
        kind = type(v)
        if kind is float or kind is int:  # unique values (latencies, token counts): no caching
            key = _cached_text(("k", k), lambda k=k: json.dumps(k))
            if kind is float:
                parts.append('{"key":' + key + ',"value":{"doubleValue":' + repr(v) + "}}")
            else:
                parts.append('{"key":' + key + ',"value":{"intValue":"' + str(v) + '"}}')
        else:
            parts.append(
                _cached_text(
                    ("kv", k, type(v), v),
                    lambda k=k, v=v: json.dumps({"key": k, "value": _any_value(v)}, separators=(",", ":")),
                )
            )
    return "[" + ",".join(parts) + "]"


def _span_text(span: ReadableSpan) -> str:
    ctx = span.context
    assert ctx is not None
    parent = span.parent
    # SpanFlags as the SDK encoder sets them: "has is_remote" (0x100), "is remote" (0x200) for the parent.
    if parent is not None:
        head = (
            f'{{"traceId":"{ctx.trace_id:032x}","spanId":"{ctx.span_id:016x}",'
            f'"parentSpanId":"{parent.span_id:016x}","flags":{0x300 if parent.is_remote else 0x100}'
        )
    else:
        head = f'{{"traceId":"{ctx.trace_id:032x}","spanId":"{ctx.span_id:016x}","flags":256'
    name = _cached_text(("n", span.name), lambda: json.dumps(span.name))
    # SDK SpanKind starts at INTERNAL=0; OTLP at UNSPECIFIED=0
    text = (
        f'{head},"name":{name},"kind":{span.kind.value + 1},'
        f'"startTimeUnixNano":"{span.start_time}","endTimeUnixNano":"{span.end_time}"'
    )
    if span.attributes:
        text += ',"attributes":' + _attributes_text(span.attributes)
    status: dict[str, Any] = {}
    if span.status.status_code is StatusCode.ERROR:
        status["code"] = 2
    elif span.status.status_code is StatusCode.OK:
        status["code"] = 1
    if span.status.description:
        status["message"] = span.status.description
    return text + ',"status":' + (json.dumps(status, separators=(",", ":")) if status else "{}") + "}"


def spans_to_otlp_json_text(spans: Sequence[ReadableSpan]) -> str:
    """An ``ExportTraceServiceRequest`` as OTLP/JSON text, spans grouped by resource then scope.

    Built as text rather than through ``json.dumps`` of nested dicts: spans are
    the bulk of a replay's output and this is its hot path.
    """
    groups: dict[int, tuple[Resource, dict[str, tuple[InstrumentationScope | None, list[str]]]]] = {}
    for span in spans:
        res = span.resource
        entry = groups.get(id(res))
        if entry is None:
            entry = groups[id(res)] = (res, {})
        scope = span.instrumentation_scope
        key = scope.name if scope is not None else ""
        bucket = entry[1].get(key)
        if bucket is None:
            bucket = entry[1][key] = (scope, [])
        bucket[1].append(_span_text(span))
    compact = (",", ":")
    resource_spans = []
    for res, scopes in groups.values():
        scope_spans = ",".join(
            '{"scope":' + json.dumps(_scope(scope), separators=compact) + ',"spans":[' + ",".join(items) + "]}"
            for scope, items in scopes.values()
        )
        resource_spans.append(
            '{"resource":' + json.dumps(_resource(res), separators=compact) + ',"scopeSpans":[' + scope_spans + "]}"
        )
    return '{"resourceSpans":[' + ",".join(resource_spans) + "]}"


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The same request as a JSON object (parsed from :func:`spans_to_otlp_json_text`)."""
    result: dict[str, Any] = json.loads(spans_to_otlp_json_text(spans))
    return result


def _number_point(point: Any, with_start: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if point.attributes:
        out["attributes"] = _attributes(point.attributes)
    if with_start:  # gauges carry no start time (as the SDK encoder writes them)
        out["startTimeUnixNano"] = str(point.start_time_unix_nano)
    out["timeUnixNano"] = str(point.time_unix_nano)
    if isinstance(point.value, int):
        out["asInt"] = str(point.value)
    else:
        out["asDouble"] = float(point.value)
    return out


def _histogram_point(point: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if point.attributes:
        out["attributes"] = _attributes(point.attributes)
    out["startTimeUnixNano"] = str(point.start_time_unix_nano)
    out["timeUnixNano"] = str(point.time_unix_nano)
    out["count"] = str(point.count)
    out["sum"] = float(point.sum)
    out["bucketCounts"] = [str(c) for c in point.bucket_counts]
    out["explicitBounds"] = [float(b) for b in point.explicit_bounds]
    out["min"] = float(point.min)
    out["max"] = float(point.max)
    return out


def metrics_to_otlp_json(data: MetricsData) -> dict[str, Any]:
    """An ``ExportMetricsServiceRequest`` in OTLP/JSON (cumulative temporality is 2, as in the proto)."""
    resource_metrics = []
    for rm in data.resource_metrics:
        scope_metrics = []
        for sm in rm.scope_metrics:
            metrics = []
            for m in sm.metrics:
                item: dict[str, Any] = {"name": m.name}
                if m.description:
                    item["description"] = m.description
                if m.unit:
                    item["unit"] = m.unit
                d = m.data
                if isinstance(d, Gauge):
                    item["gauge"] = {"dataPoints": [_number_point(p, with_start=False) for p in d.data_points]}
                elif isinstance(d, Sum):
                    item["sum"] = {
                        "dataPoints": [_number_point(p) for p in d.data_points],
                        "aggregationTemporality": int(d.aggregation_temporality),
                        "isMonotonic": d.is_monotonic,
                    }
                elif isinstance(d, Histogram):
                    item["histogram"] = {
                        "dataPoints": [_histogram_point(p) for p in d.data_points],
                        "aggregationTemporality": int(d.aggregation_temporality),
                    }
                metrics.append(item)
            scope_metrics.append({"scope": _scope(sm.scope), "metrics": metrics})
        resource_metrics.append({"resource": _resource(rm.resource), "scopeMetrics": scope_metrics})
    return {"resourceMetrics": resource_metrics}


# ----------------------------------------------------------------------------- outputs


class JsonLinesOutput:
    """Collector file-exporter style JSON lines (``.jsonl``, or gzip when the name ends in ``.gz``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lines = 0
        # The file stays open across export calls until shutdown(), so no with-block.
        gz = self.path.suffix == ".gz"
        try:
            raw: io.BufferedIOBase = gzip.open(self.path, "wb", compresslevel=3) if gz else open(self.path, "wb")  # noqa: SIM115
        except OSError as exc:  # a missing directory, a directory, no permission
            raise SreAgentError(f"cannot write {self.path}: {exc.strerror or exc}") from exc
        self._fh: io.BufferedIOBase | None = raw

    def _write(self, text: str) -> None:
        if self._fh is None:
            raise SreAgentError(f"{self.path}: output already closed")
        self._fh.write(text.encode())
        self._fh.write(b"\n")
        self.lines += 1

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Write one ``{"resourceSpans": ...}`` line."""
        if spans:
            self._write(spans_to_otlp_json_text(spans))

    def export_metrics(self, data: MetricsData) -> None:
        """Write one ``{"resourceMetrics": ...}`` line."""
        if data.resource_metrics:
            self._write(json.dumps(metrics_to_otlp_json(data), separators=(",", ":"), check_circular=False))

    def shutdown(self) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class MemoryOutput:
    """Keeps everything in lists (tests, and the in-process store path)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self.metrics: list[MetricsData] = []

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Append spans."""
        self.spans.extend(spans)

    def export_metrics(self, data: MetricsData) -> None:
        """Append a scrape."""
        self.metrics.append(data)

    def shutdown(self) -> None:
        """Nothing to release."""


class OtlpEndpointOutput:
    """The SDK's OTLP exporters pointed at a collector or ``sre-agent serve``.

    ``http://host:4318`` (paths ``/v1/traces`` and ``/v1/metrics`` are appended, as the
    OTel spec does for a base endpoint) or ``grpc://host:4317`` (insecure gRPC).
    """

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        self._span_ok = SpanExportResult.SUCCESS
        self._metric_ok = MetricExportResult.SUCCESS
        self.url = url
        self._closed = False
        self.spans: SpanExporter
        self.metrics: MetricExporter
        if url.startswith("grpc://"):
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

            target = url[len("grpc://") :].rstrip("/")
            self.spans = GrpcSpans(endpoint=target, insecure=True, timeout=timeout_s)
            self.metrics = GrpcMetrics(endpoint=target, insecure=True, timeout=timeout_s)
        elif url.startswith(("http://", "https://")):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

            base = url.rstrip("/")
            self.spans = HttpSpans(endpoint=f"{base}/v1/traces", timeout=timeout_s)
            self.metrics = HttpMetrics(endpoint=f"{base}/v1/metrics", timeout=timeout_s)
        else:
            raise SreAgentError(f"endpoint {url!r}: use http://HOST:PORT or grpc://HOST:PORT")
        self.failed_batches = 0
        _check_reachable(url, min(timeout_s, 5.0))

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Send spans.

        Raises:
            RemoteError: the batch was not delivered (the SDK exporter already retried
                transient failures); the replay stops rather than lose the rest too.
        """
        if spans and not self.failed_batches and self.spans.export(spans) != self._span_ok:
            self._failed(f"{len(spans)} spans")

    def export_metrics(self, data: MetricsData) -> None:
        """Send one scrape; raises :class:`RemoteError` as :meth:`export_spans` does."""
        if data.resource_metrics and not self.failed_batches and self.metrics.export(data) != self._metric_ok:
            self._failed("a metric scrape")

    def _failed(self, what: str) -> None:
        # Later exports (the emitter's final flush among them) are skipped: one failure is the answer.
        self.failed_batches += 1
        raise RemoteError(f"export of {what} to {self.url} failed (see the exporter's message above); replay stopped")

    def shutdown(self) -> None:
        """Shut both exporters down."""
        if not self._closed:
            self._closed = True
            self.spans.shutdown()
            self.metrics.shutdown()


def _check_reachable(url: str, timeout_s: float) -> None:
    """Connect once to the endpoint's port so that nothing listening fails in milliseconds.

    The SDK exporters would otherwise retry each batch with backoff for their whole
    timeout and log every attempt, for every batch of the replay.

    Raises:
        RemoteError: the host does not resolve or refuses or ignores the connection.
    """
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    default = 443 if parts.scheme == "https" else 4317 if parts.scheme == "grpc" else 80
    try:
        port = parts.port or default
    except ValueError:
        raise RemoteError(f"endpoint {url!r}: the port is not a number from 1 to 65535") from None
    host = parts.hostname or "127.0.0.1"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise RemoteError(
            f"cannot reach the OTLP endpoint {url} ({host}:{port}: {reason}); start `sre-agent serve` "
            "or a collector there, or write to --out FILE or --db PATH instead"
        ) from None


class StoreOutput:
    """Straight into a DuckDB store, through the same decoding path as ``sre-agent ingest``.

    The SDK objects go through the SDK's OTLP protobuf encoder and the
    ingest decoder (``sre_agent.ingest.otlp``), so what lands in the store is exactly
    what a receiver would have stored. ``rejected`` counts items the decoder
    refused (a replay should produce none).
    """

    def __init__(self, store: Any) -> None:
        from sre_agent.ingest.normalise import Normaliser

        self.store = store
        self.normaliser = Normaliser(hash_key=store.hash_key)
        self.rejected = 0
        self.spans_written = 0
        self.points_written = 0
        self._closed = False
        # Scrapes are small; one DuckDB append per scrape would dominate the cost, so they are batched.
        self._metric_tables: list[Any] = []
        self._metric_rows = 0

    @classmethod
    def open(cls, path: str | Path) -> StoreOutput:
        """Open (or create) the store file at ``path``; :meth:`shutdown` closes it."""
        from sre_agent.store.embedded import Store

        out = cls(Store.open(path))
        out._owns = True
        return out

    _owns = False

    def export_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Encode, decode and append a batch of spans."""
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        from sre_agent.ingest.otlp import spans_from_proto

        if not spans:
            return
        decoded = spans_from_proto(encode_spans(spans), self.normaliser)
        self.rejected += decoded.rejected
        self.spans_written += self.store.append_spans(decoded.table)

    def export_metrics(self, data: MetricsData) -> None:
        """Encode, decode and append one scrape."""
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

        from sre_agent.ingest.otlp import metrics_from_proto

        if not data.resource_metrics:
            return
        decoded = metrics_from_proto(encode_metrics(data), self.normaliser)
        self.rejected += decoded.rejected
        self._metric_tables.append(decoded.table)
        self._metric_rows += decoded.table.num_rows
        if self._metric_rows >= self.METRIC_BATCH_ROWS:
            self._flush_metrics()

    METRIC_BATCH_ROWS = 20_000

    def _flush_metrics(self) -> None:
        import pyarrow as pa

        if self._metric_tables:
            table = pa.concat_tables(self._metric_tables)
            self._metric_tables = []
            self._metric_rows = 0
            self.points_written += self.store.append_metric_points(table)

    def shutdown(self) -> None:
        """Write buffered metric points; close the store if this output opened it."""
        if not self._closed:
            self._closed = True
            self._flush_metrics()
            if self._owns:
                self.store.close()
