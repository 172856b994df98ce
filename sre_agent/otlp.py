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
copy of ``trace.proto`` whose ``Span.attributes`` is ``repeated bytes``; each
attribute's bytes are decoded by a small hand-written reader with caches keyed
by the bytes themselves (models, token counts and keys repeat across spans).
Anything unusual falls back to the real ``KeyValue`` parser, so the result is
identical.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
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
from sre_agent.errors import BadPayloadError
from sre_agent.normalise import (
    CANONICAL_COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    Normaliser,
    any_value_to_python,
    first_finish_reason,
)
from sre_agent.schema import ENGINE_SPAN_NAMES, metric_points_arrow_schema, spans_arrow_schema

__all__ = [
    "DecodedMetrics",
    "DecodedSpans",
    "decode_json_document",
    "decode_metrics",
    "decode_traces",
    "metrics_from_proto",
    "spans_from_proto",
]

MAX_ERRORS = 5  # reasons kept per batch; the count is always exact

_SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
_STATUS_CODES = ("unset", "ok", "error")
_SLOT = {name: i for i, name in enumerate(CANONICAL_COLUMNS)}
_TTFT, _E2E = _SLOT["ttft_s"], _SLOT["e2e_s"]
_DECODE, _OUTPUT = _SLOT["decode_s"], _SLOT["output_tokens"]
_FINISH, _ERROR = _SLOT["finish_reason"], _SLOT["error_type"]
_DOUBLE = struct.Struct("<d")


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
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """Read a protobuf varint at ``pos``; returns (value, next position)."""
    result = 0
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint too long")


_KIND_DOUBLE, _KIND_INT, _KIND_STRING = 1, 2, 3
_KINDS = {0x21: _KIND_DOUBLE, 0x18: _KIND_INT, 0x0A: _KIND_STRING}


def _kv_entry(data: bytes, norm: Normaliser) -> tuple[str, str, Any, int, int]:
    """Decode one serialized ``KeyValue`` into a Normaliser entry.

    Scalars written in the usual field order take the fast path; anything
    else (bools, arrays, long or content values, unusual layouts) goes
    through the real ``KeyValue`` parser, so both give the same entry.
    """
    try:
        entry = _fast_entry(data, norm)
    except UnicodeDecodeError as exc:
        raise BadPayloadError(f"span attribute is not valid UTF-8: {exc}") from exc
    if entry is not None:
        return entry
    try:
        kv = common_pb2.KeyValue.FromString(data)
    except DecodeError as exc:
        raise BadPayloadError(f"malformed span attribute: {exc}") from exc
    entry = norm.entry(kv.key, any_value_to_python(kv.value))
    if len(data) <= 256:
        _remember(norm, data, entry)
    return entry


def _head_info(data: bytes, value_at: int, norm: Normaliser) -> tuple[int, int, str, int, int] | None:
    """Describe a KeyValue prefix ``0A klen key 12 vlen tag``; None when not a fast-path scalar."""
    kind = _KINDS.get(data[value_at - 1])
    if kind is None or data[value_at - 3] != 0x12 or data[value_at - 2] >= 0x80:
        return None
    key = data[2 : value_at - 3].decode("utf-8")
    if norm.is_content(key):
        return None
    mapped = norm.key_columns.get(key)
    column, prio = (mapped[0], mapped[1]) if mapped else (-1, 1_000_000)
    info = (kind, value_at, key, column, prio)
    heads = norm.head_cache
    if len(heads) >= 50_000:  # bounded: attribute keys are few, but a hostile client may vary them
        heads.clear()
    heads[data[:value_at]] = info
    return info


def _fast_entry(data: bytes, norm: Normaliser) -> tuple[str, str, Any, int, int] | None:
    n = len(data)
    if n < 5 or data[0] != 0x0A or data[1] >= 0x80:
        return None
    value_at = data[1] + 5  # after the key, 0x12, the value length and the AnyValue tag
    if value_at > n or data[value_at - 2] != n - value_at + 1:
        return None
    info = norm.head_cache.get(data[:value_at]) or _head_info(data, value_at, norm)
    if info is None:
        return None
    kind, _, key, column, prio = info
    value: Any
    if kind == _KIND_DOUBLE:
        if n != value_at + 8:
            return None
        value = _DOUBLE.unpack_from(data, value_at)[0]
        if value - value != 0.0:  # NaN or infinity: the slow path spells them
            return None
        return (key, repr(value), value, column, prio)
    if kind == _KIND_INT:
        try:
            value, end = _varint(data, value_at)
        except (IndexError, DecodeError):
            return None
        if end != n:
            return None
        if value >= 1 << 63:
            value -= 1 << 64
        entry = (key, str(value), value, column, prio)
    else:
        if n > norm.max_attribute_bytes or value_at >= n or data[value_at] != n - value_at - 1:
            return None  # long (maybe redacted) or multi-byte length: slow path
        value = data[value_at + 1 :].decode("utf-8")
        entry = (key, value, value, column, prio)
    _remember(norm, data, entry)
    return entry


def _remember(norm: Normaliser, data: bytes, entry: tuple[str, str, Any, int, int]) -> None:
    cache_ = norm.kv_cache
    if len(cache_) >= 200_000:  # bounded: high-cardinality values must not grow memory
        cache_.clear()
    cache_[data] = entry


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
    return _flatten_spans(lite, normaliser)


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
    return _flatten_spans(request, normaliser)


class _SpanColumns:
    """Column data for one batch: one tuple of plain fields per span, plus the MAP parts."""

    def __init__(self) -> None:
        # (trace_id, span_id, parent, name, kind, start, end, status, message, scope)
        self.rows: list[tuple[Any, ...]] = []
        self.slots: list[list[Any]] = []
        self.res_keys: list[str] = []
        self.res_values: list[str] = []
        self.res_offsets: list[int] = [0]
        self.keys: list[str] = []
        self.values: list[str] = []
        self.offsets: list[int] = [0]


def _flatten_spans(request: Any, norm: Normaliser) -> DecodedSpans:
    """The hot loop: every statement here runs once per span or per attribute."""
    out = _SpanColumns()
    rejected = 0
    errors: list[str] = []
    kv_get = norm.kv_cache.get
    head_get = norm.head_cache.get
    unpack_double = _DOUBLE.unpack_from
    keys, values, offsets = out.keys, out.values, out.offsets
    keys_append, values_append, offsets_append = keys.append, values.append, offsets.append
    rows_append, slots_append = out.rows.append, out.slots.append
    res_keys_extend, res_values_extend = out.res_keys.extend, out.res_values.extend
    res_offsets = out.res_offsets
    for resource_spans in request.resource_spans:
        res_keys, res_values, res_slot, res_prio = norm.resource_entries(resource_spans.resource.attributes)
        n_res = len(res_keys)
        for scope_spans in resource_spans.scope_spans:
            scope_name = scope_spans.scope.name or None
            for span in scope_spans.spans:
                trace_id = span.trace_id
                span_id = span.span_id
                parent = span.parent_span_id
                if len(trace_id) != 16 or len(span_id) != 8 or (parent and len(parent) != 8):
                    rejected += 1
                    if len(errors) < MAX_ERRORS:
                        errors.append(
                            f"span {span.name!r}: bad id lengths (trace_id {len(trace_id)} bytes, "
                            f"span_id {len(span_id)} bytes, parent_span_id {len(parent)} bytes)"
                        )
                    continue
                slot = res_slot.copy()
                prio = res_prio.copy()
                for data in span.attributes:
                    entry = kv_get(data)
                    if entry is None:
                        # Inline fast path for doubles (latencies: distinct on every span, never cached).
                        try:
                            head = head_get(data[: data[1] + 5])
                        except IndexError:
                            head = None
                        if head is not None and head[0] == _KIND_DOUBLE and len(data) == head[1] + 8:
                            value = unpack_double(data, head[1])[0]
                            if value - value == 0.0:
                                keys_append(head[2])
                                values_append(repr(value))
                                column = head[3]
                                if column >= 0 and head[4] < prio[column]:
                                    slot[column] = value
                                    prio[column] = head[4]
                                continue
                        entry = _kv_entry(data, norm)
                    keys_append(entry[0])
                    values_append(entry[1])
                    column = entry[3]
                    if column >= 0 and entry[4] < prio[column]:
                        slot[column] = entry[2]
                        prio[column] = entry[4]
                offsets_append(len(keys))
                status = span.status
                code = status.code
                if slot[_ERROR] is None and (code == 2 or len(span.events)):
                    slot[_ERROR] = _event_error_type(span.events) or ("error" if code == 2 else None)
                kind = span.kind
                rows_append(
                    (
                        trace_id.hex(),
                        span_id.hex(),
                        parent.hex() if parent else None,
                        span.name,
                        _SPAN_KINDS[kind] if 0 <= kind < 6 else "unspecified",
                        span.start_time_unix_nano,
                        span.end_time_unix_nano or None,
                        _STATUS_CODES[code] if 0 <= code < 3 else "unset",
                        status.message or None,
                        scope_name,
                    )
                )
                slots_append(slot)
                if n_res:
                    res_keys_extend(res_keys)
                    res_values_extend(res_values)
                res_offsets.append(res_offsets[-1] + n_res)
    return DecodedSpans(_spans_table(out), rejected, errors)


def _event_error_type(events: Any) -> str | None:
    for event in events:
        if event.name == "exception":
            for kv in event.attributes:
                if kv.key == "exception.type":
                    return str(any_value_to_python(kv.value))
    return None


_ROW_FIELDS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "status_code",
    "status_message",
    "scope_name",
)


def _spans_table(out: _SpanColumns) -> pa.Table:
    n = len(out.rows)
    row_columns: list[Any] = list(zip(*out.rows, strict=True)) if n else [()] * len(_ROW_FIELDS)
    slot_columns: list[Any] = list(zip(*out.slots, strict=True)) if n else [()] * len(CANONICAL_COLUMNS)
    columns: dict[str, Any] = dict(zip(_ROW_FIELDS, row_columns, strict=True))
    columns.update((name, _typed_column(name, slot_columns[i])) for i, name in enumerate(CANONICAL_COLUMNS))
    names = columns["name"]
    columns["is_engine"] = [
        name in ENGINE_SPAN_NAMES or " Req " in name or name.startswith("Req ") or t is not None or e is not None
        for name, t, e in zip(names, slot_columns[_TTFT], slot_columns[_E2E], strict=True)
    ]
    columns["tpot_s"] = [
        d / (o - 1) if d is not None and o is not None and o > 1 else None
        for d, o in zip(columns["decode_s"], columns["output_tokens"], strict=True)
    ]
    columns["duration_s"] = [
        (e - s) / 1e9 if e is not None else None for s, e in zip(columns["start_ns"], columns["end_ns"], strict=True)
    ]
    schema = spans_arrow_schema()
    arrays: list[pa.Array] = []
    for fld in schema:
        if fld.name == "resource_attributes":
            arrays.append(_map_array(out.res_offsets, out.res_keys, out.res_values))
        elif fld.name == "attributes":
            arrays.append(_map_array(out.offsets, out.keys, out.values))
        else:
            arrays.append(pa.array(columns[fld.name], type=fld.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _map_array(offsets: list[int], keys: list[str], values: list[str]) -> pa.Array:
    return pa.MapArray.from_arrays(
        pa.array(offsets, type=pa.int32()), pa.array(keys, type=pa.string()), pa.array(values, type=pa.string())
    )


def _typed_column(name: str, values: tuple[Any, ...]) -> list[Any]:
    """Coerce one canonical column; values that do not fit become NULL."""
    if name == "finish_reason":
        return [first_finish_reason(v) if v is not None else None for v in values]
    if name in INT_COLUMNS:
        return [_as_int(v) for v in values]
    if name in FLOAT_COLUMNS:
        return [_as_float(v) for v in values]
    return [_as_str(v) for v in values]


def _as_int(value: Any) -> int | None:
    if value is None or type(value) is int:
        return value  # type: ignore[no-any-return]
    try:
        number = int(float(value)) if not isinstance(value, int) else int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if -(1 << 63) <= number < (1 << 63) else None


def _as_float(value: Any) -> float | None:
    if value is None or type(value) is float:
        return value  # type: ignore[no-any-return]
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _as_str(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value  # type: ignore[no-any-return]
    if isinstance(value, list):
        return _as_str(value[0]) if value else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


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
