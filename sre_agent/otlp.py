"""Decode OTLP traces and metrics (protobuf or JSON) into canonical Arrow batches.

Public entry points:

* :func:`decode_traces` / :func:`decode_metrics` take a request body (already
  decompressed) and its content type and return a :class:`DecodedSpans` /
  :class:`DecodedMetrics` whose ``table`` has the schema of
  :func:`sre_agent.schema.spans_arrow_schema` /
  :func:`~sre_agent.schema.metric_points_arrow_schema`. Items that are bad on
  their own (a span with a malformed id, a histogram whose bucket counts do
  not match its bounds) are counted in ``rejected``; a body that cannot be
  parsed at all raises :class:`~sre_agent.errors.BadPayloadError`.
* :func:`spans_from_proto` / :func:`metrics_from_proto` do the same for an
  already parsed ``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest``.

Why span attributes are parsed as raw bytes: with upb, reading one
``KeyValue`` through the message API (``kv.key``, ``kv.value``,
``WhichOneof``) costs about a microsecond, which made attribute flattening
the whole ingest budget. Spans are therefore parsed with a wire-compatible
copy of ``trace.proto`` whose ``Span.attributes`` is ``repeated bytes``, and
the attributes of a whole request are decoded at once with array operations
(:mod:`sre_agent._attrs`); anything unusual falls back to the real
``KeyValue`` parser, with identical results. JSON bodies are converted to the
protobuf message first, so every transport yields the same rows.
"""

from __future__ import annotations

import base64
import binascii
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

from sre_agent._otlp_metrics import flatten_metrics
from sre_agent._spans import flatten_spans
from sre_agent.errors import BadPayloadError
from sre_agent.normalise import Normaliser
from sre_agent.schema import metric_points_arrow_schema

__all__ = [
    "DecodedMetrics",
    "DecodedSpans",
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
        table: canonical spans, schema :func:`sre_agent.schema.spans_arrow_schema`.
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
        table: canonical points, schema :func:`sre_agent.schema.metric_points_arrow_schema`.
        rejected: data points rejected one by one; not in ``table``.
        errors: the first few rejection reasons.
    """

    table: pa.Table
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- lite messages


@cache
def _lite_request_class() -> type[Message]:
    """ExportTraceServiceRequest whose Span.attributes is ``repeated bytes``.

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
                        if fld.name == "attributes":
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
        request = _json_request(body, trace_service_pb2.ExportTraceServiceRequest, _fix_trace_ids)
        return spans_from_proto(request, normaliser)
    try:
        lite = _lite_request_class().FromString(body)
    except DecodeError as exc:
        raise _proto_error(exc) from exc
    table, rejected, errors = flatten_spans(lite, normaliser)
    return DecodedSpans(table, rejected, errors)


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


def _json_request(body: bytes, message_class: type[Message], fix_ids: Any) -> Message:
    """Parse an OTLP/JSON body into the protobuf message (ids fixed first)."""
    try:
        text = body.decode("utf-8")
        document = json.loads(text)
    except UnicodeDecodeError as exc:
        raise BadPayloadError(f"OTLP JSON is not valid UTF-8: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise BadPayloadError(f"invalid JSON: {exc}") from exc
    return parse_json_document(document, message_class, fix_ids)


def parse_json_document(document: Any, message_class: type[Message], fix_ids: Any) -> Message:
    """Turn a decoded OTLP/JSON document into its protobuf message.

    OTLP/JSON writes trace and span ids as hex, where proto3 JSON expects
    base64; ``fix_ids`` rewrites them in place before ``ParseDict``.
    """
    if not isinstance(document, dict):
        raise BadPayloadError(f"OTLP JSON must be an object, not {type(document).__name__}")
    try:
        fix_ids(document)
        message = message_class()
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
            request = parse_json_document(document, trace_service_pb2.ExportTraceServiceRequest, _fix_trace_ids)
            return spans_from_proto(request, normaliser)
        if "resourceMetrics" in document or "resource_metrics" in document:
            request = parse_json_document(document, metrics_service_pb2.ExportMetricsServiceRequest, _fix_metric_ids)
            return metrics_from_proto(request, normaliser)
        if "resourceLogs" in document or "resource_logs" in document:
            raise BadPayloadError("OTLP logs are not ingested (only traces and metrics)")
        keys = ", ".join(sorted(str(k) for k in document)[:5]) or "none"
        raise BadPayloadError(f"not an OTLP traces or metrics document (top-level keys: {keys})")
    raise BadPayloadError(f"OTLP JSON must be an object, not {type(document).__name__}")


def _hex_id_to_base64(value: Any) -> Any:
    """Hex id (any case) -> base64 for ParseDict; invalid hex becomes empty (rejected later)."""
    if not isinstance(value, str):
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        # Some exporters write proto3 JSON base64 ids; keep those if they decode cleanly.
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return ""
        return value
    return base64.b64encode(raw).decode("ascii")


_ID_KEYS = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")


def _fix_ids_in(obj: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        if key in obj:
            obj[key] = _hex_id_to_base64(obj[key])


def _items(obj: Any, *keys: str) -> list[Any]:
    for key in keys:
        value = obj.get(key) if isinstance(obj, dict) else None
        if isinstance(value, list):
            return value
    return []


def _fix_trace_ids(document: dict[str, Any]) -> None:
    for resource_spans in _items(document, "resourceSpans", "resource_spans"):
        for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans", "instrumentationLibrarySpans"):
            for span in _items(scope_spans, "spans"):
                if isinstance(span, dict):
                    _fix_ids_in(span)
                    for link in _items(span, "links"):
                        if isinstance(link, dict):
                            _fix_ids_in(link)


def _fix_metric_ids(document: dict[str, Any]) -> None:
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
        request = _json_request(body, metrics_service_pb2.ExportMetricsServiceRequest, _fix_metric_ids)
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
