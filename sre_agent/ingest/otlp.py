"""Decode OTLP traces and metrics (protobuf or JSON) into canonical Arrow batches.

Public entry points:

* :func:`decode_traces` / :func:`decode_metrics` take a request body (already
  decompressed) and its content type and return a :class:`DecodedSpans` /
  :class:`DecodedMetrics` whose ``table`` has the schema of
  :func:`sre_agent.store.schema.spans_arrow_schema` /
  :func:`~sre_agent.store.schema.metric_points_arrow_schema`. Items that are bad on
  their own (a span with a malformed id, a histogram whose bucket counts do
  not match its bounds) are counted in ``rejected``; a body that cannot be
  parsed at all raises :class:`~sre_agent.errors.BadPayloadError`.
* :func:`spans_from_proto` / :func:`metrics_from_proto` do the same for an
  already parsed ``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest``.
* :func:`collect_traces` / :func:`build_spans` are :func:`decode_traces` in two
  halves, for the receivers: the first parses and checks one request (span
  count, rejections, unparseable bodies), the second builds the columns of
  many collected requests at once. For 512-span requests built 8 at a time,
  collect + build cost 10–13 µs a span against 14–21 µs for decoding each
  (the stage lines of ``tests/benchmarks/ingest.py``).

Why span attributes are parsed as raw bytes: with upb, reading one
``KeyValue`` through the message API (``kv.key``, ``kv.value``,
``WhichOneof``) costs about a microsecond, which made attribute flattening
the whole ingest budget. Spans are therefore parsed with a wire-compatible
copy of ``trace.proto`` whose ``Span.attributes`` is ``repeated bytes``, and
the attributes of a whole request are decoded at once with array operations
(:mod:`sre_agent.ingest.attrs`); anything unusual falls back to the real
``KeyValue`` parser, with identical results. JSON bodies are converted to the
protobuf message first, so every transport yields the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from sre_agent.errors import BadPayloadError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp_json import fill_traces_request
from sre_agent.ingest.otlp_metrics import flatten_metrics
from sre_agent.ingest.spans import CollectedSpans, build_spans, collect_spans, flatten_spans
from sre_agent.store.schema import metric_points_arrow_schema

__all__ = [
    "CollectedSpans",
    "DecodedMetrics",
    "DecodedSpans",
    "build_spans",
    "collect_traces",
    "decode_json_document",
    "decode_metrics",
    "decode_traces",
    "metrics_from_proto",
    "spans_from_proto",
]


@dataclass
class DecodedSpans:
    """Spans decoded from one request.

    Attributes:
        table: canonical spans, schema :func:`sre_agent.store.schema.spans_arrow_schema`.
        rejected: spans rejected one by one (bad ids, ...); not in ``table``.
        errors: the first few rejection reasons, for the partial-success message.
    """

    table: pa.Table
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class DecodedMetrics:
    """Metric data points decoded from one request.

    Attributes:
        table: canonical points, schema :func:`sre_agent.store.schema.metric_points_arrow_schema`.
        rejected: data points rejected one by one; not in ``table``.
        errors: the first few rejection reasons.
    """

    table: pa.Table
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- lite messages


# Span fields the lite class leaves as raw bytes: attributes (decoded in bulk, sre_agent.ingest.attrs),
# status and events (read through a sub-message wrapper they cost ~0.8 us a span in the collect
# loop; raw, an unset status is b"" and the rare set one is parsed with the real Status class).
_RAW_SPAN_FIELDS = frozenset({"attributes", "status", "events"})


@cache
def _lite_request_class() -> type[Message]:
    """ExportTraceServiceRequest whose Span.attributes, Span.events and Span.status are raw bytes.

    Built in a private descriptor pool from the installed opentelemetry-proto
    descriptors, so it follows the installed proto version.
    """
    pool = descriptor_pool.DescriptorPool()
    for module in (common_pb2, resource_pb2, trace_pb2, trace_service_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        if module is trace_pb2:
            for message in proto.message_type:
                if message.name == "Span":
                    for fld in message.field:
                        if fld.name in _RAW_SPAN_FIELDS:
                            fld.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                            fld.ClearField("type_name")
        pool.Add(proto)
    name = "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest"
    lite: type[Message] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    return lite


# ---------------------------------------------------------------- spans


def _proto_error(exc: Exception) -> BadPayloadError:
    return BadPayloadError(f"cannot parse OTLP protobuf: {exc}")


def decode_traces(body: bytes, content_type: str, *, normaliser: Normaliser) -> DecodedSpans:
    """Decode an OTLP ``ExportTraceServiceRequest`` body into canonical spans.

    Args:
        body: the request body, already decompressed.
        content_type: ``application/x-protobuf`` or ``application/json``
            (parameters such as ``charset`` are ignored).
        normaliser: attribute mapping and privacy settings.

    Raises:
        BadPayloadError: the body cannot be parsed at all.
    """
    if _is_json(content_type):
        return _spans_from_document(_load_json(body), normaliser)
    try:
        lite = _lite_request_class().FromString(body)
    except DecodeError as exc:
        raise _proto_error(exc) from exc
    table, rejected, errors = flatten_spans(lite, normaliser)
    return DecodedSpans(table, rejected, errors)


def collect_traces(body: bytes, content_type: str, *, normaliser: Normaliser) -> CollectedSpans:
    """Parse and check an ``ExportTraceServiceRequest`` body, leaving the columns to :func:`build_spans`.

    The receivers' half of :func:`decode_traces`: the span count and the
    rejected spans are known at once (the request can be answered 4xx or
    queued), while the columns are built later for many requests together.

    Raises:
        BadPayloadError: the body cannot be parsed at all.
    """
    if _is_json(content_type):
        return collect_spans(_traces_request_of(_load_json(body)), normaliser)
    try:
        lite = _lite_request_class().FromString(body)
    except DecodeError as exc:
        raise _proto_error(exc) from exc
    return collect_spans(lite, normaliser)


def spans_from_proto(request: Message, normaliser: Normaliser) -> DecodedSpans:
    """Canonical spans from a parsed ``ExportTraceServiceRequest`` (e.g. from gRPC).

    The message is re-read through the fast attribute path so that every
    transport yields identical rows. A gRPC server that can hand over the raw
    bytes should call :func:`decode_traces` instead and skip one parse.
    """
    lite_class = _lite_request_class()
    if not isinstance(request, lite_class):
        try:
            request = lite_class.FromString(request.SerializeToString())
        except DecodeError as exc:
            raise _proto_error(exc) from exc
    table, rejected, errors = flatten_spans(request, normaliser)
    return DecodedSpans(table, rejected, errors)


# ---------------------------------------------------------------- JSON


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    if media in ("application/x-protobuf", "application/protobuf", "application/octet-stream", ""):
        return False
    if media == "application/json" or media.endswith("+json"):
        return True
    raise BadPayloadError(f"unsupported content type {content_type!r}")


def _load_json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadPayloadError(f"OTLP JSON is not valid UTF-8: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise BadPayloadError(f"invalid JSON: {exc}") from exc


def _spans_from_document(document: Any, normaliser: Normaliser) -> DecodedSpans:
    table, rejected, errors = flatten_spans(_traces_request_of(document), normaliser)
    return DecodedSpans(table, rejected, errors)


def _traces_request_of(document: Any) -> Message:
    """The (lite) traces request of an OTLP/JSON document."""
    if not isinstance(document, dict):
        raise BadPayloadError(f"OTLP JSON must be an object, not {type(document).__name__}")
    request = _lite_request_class()()
    try:
        fill_traces_request(document, request)
    except RecursionError as exc:
        raise BadPayloadError("OTLP JSON nested too deeply") from exc
    return request


def _metrics_message(document: Any) -> Message:
    """The metrics request of an OTLP/JSON document (exemplars, with their hex ids, dropped)."""
    if not isinstance(document, dict):
        raise BadPayloadError(f"OTLP JSON must be an object, not {type(document).__name__}")
    try:
        _drop_exemplars(document)
        message = metrics_service_pb2.ExportMetricsServiceRequest()
        json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        raise BadPayloadError(f"invalid OTLP JSON: {exc}") from exc
    return message


def decode_json_document(document: Any, normaliser: Normaliser) -> DecodedSpans | DecodedMetrics:
    """Decode an already parsed OTLP/JSON document, dispatching on its top-level key.

    ``{"resourceSpans": [...]}`` gives spans, ``{"resourceMetrics": [...]}``
    metric points (snake_case keys accepted too), as the collector's file
    exporter writes them.

    Raises:
        BadPayloadError: not an object, another signal (e.g. logs), or invalid OTLP.
    """
    if isinstance(document, dict):
        if "resourceSpans" in document or "resource_spans" in document:
            return _spans_from_document(document, normaliser)
        if "resourceMetrics" in document or "resource_metrics" in document:
            return metrics_from_proto(_metrics_message(document), normaliser)
        if "resourceLogs" in document or "resource_logs" in document:
            raise BadPayloadError("OTLP logs are not ingested (only traces and metrics)")
        keys = ", ".join(sorted(str(k) for k in document)[:5]) or "none"
        raise BadPayloadError(f"not an OTLP traces or metrics document (top-level keys: {keys})")
    raise BadPayloadError(f"OTLP JSON must be an object, not {type(document).__name__}")


def _drop_exemplars(document: dict[str, Any]) -> None:
    """Exemplars carry hex ids too; they are not stored, so drop them."""
    stack: list[Any] = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            item.pop("exemplars", None)
            stack.extend(v for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list))


# ---------------------------------------------------------------- metrics


def decode_metrics(body: bytes, content_type: str, *, normaliser: Normaliser) -> DecodedMetrics:
    """Decode an OTLP ``ExportMetricsServiceRequest`` body into canonical points.

    Same arguments and errors as :func:`decode_traces`.
    """
    request: Message
    if _is_json(content_type):
        request = _metrics_message(_load_json(body))
    else:
        try:
            request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
        except DecodeError as exc:
            raise _proto_error(exc) from exc
    return metrics_from_proto(request, normaliser)


def metrics_from_proto(request: Message, normaliser: Normaliser) -> DecodedMetrics:
    """Canonical metric points from a parsed ``ExportMetricsServiceRequest``."""
    table, rejected, errors = flatten_metrics(request, normaliser, metric_points_arrow_schema())
    return DecodedMetrics(table, rejected, errors)
