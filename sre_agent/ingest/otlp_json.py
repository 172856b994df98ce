"""OTLP/JSON traces straight into the lite protobuf message the span decoder reads.

``google.protobuf.json_format.ParseDict`` walks every field by reflection in
Python and managed about a thousand spans per second here, too slow for a
collector file of a few million spans. This module builds the lite
``ExportTraceServiceRequest`` (see :func:`sre_agent.ingest.otlp._lite_request_class`)
directly: span fields are copied, and each span attribute is serialized by
hand into the ``KeyValue`` bytes the vectorised decoder expects. Rare shapes
(array, key-value list and bytes values, resources, scopes and events) still
go through ``ParseDict``, so the OTLP/JSON quirks are honoured exactly as
before: hex ids in any case (base64 ids are tolerated), 64-bit integers as
strings or numbers, enums as integers, camelCase or snake_case keys, unknown
fields ignored.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from sre_agent.errors import BadPayloadError

__all__ = ["fill_traces_request", "items"]

_DOUBLE = struct.Struct("<d")
_SPECIAL_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_MASK64 = (1 << 64) - 1


def items(obj: Any, *keys: str) -> list[Any]:
    """The list under the first of ``keys`` present in ``obj`` (``[]`` when none is)."""
    if not isinstance(obj, dict):
        raise BadPayloadError(f"invalid OTLP JSON: expected an object, got {type(obj).__name__}")
    for key in keys:
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise BadPayloadError(f"invalid OTLP JSON: {key} must be a list, not {type(value).__name__}")
        return value
    return []


def _field(obj: dict[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _integer(value: Any, name: str) -> int:
    """A (u)int64 written as a number or a decimal string."""
    if isinstance(value, bool):
        raise BadPayloadError(f"invalid OTLP JSON: {name} must be an integer, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise BadPayloadError(f"invalid OTLP JSON: {name} {value!r} is not an integer")


def _span_id(value: Any) -> bytes:
    """Hex (any case) per OTLP; base64 as proto3 JSON writes it is tolerated; else empty (rejected)."""
    if not isinstance(value, str):
        return b""
    try:
        return bytes.fromhex(value)
    except ValueError:
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return b""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key_value(attribute: Any) -> bytes:
    """One attribute as serialized ``KeyValue`` bytes."""
    if not isinstance(attribute, dict):
        raise BadPayloadError("invalid OTLP JSON: an attribute must be an object")
    key = attribute.get("key")
    value = attribute.get("value")
    if not isinstance(key, str):
        raise BadPayloadError("invalid OTLP JSON: an attribute key must be a string")
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise BadPayloadError(f"invalid OTLP JSON: the value of attribute {key!r} must be an object")
    payload = _scalar(value) if len(value) == 1 else None
    if payload is None:
        message = common_pb2.KeyValue()
        try:
            json_format.ParseDict({"key": key, "value": value}, message, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            raise BadPayloadError(f"invalid OTLP JSON in attribute {key!r}: {exc}") from exc
        serialized: bytes = message.SerializeToString()
        return serialized
    key_bytes = key.encode("utf-8", "surrogatepass")
    return b"\x0a" + _varint(len(key_bytes)) + key_bytes + b"\x12" + _varint(len(payload)) + payload


def _scalar(value: dict[str, Any]) -> bytes | None:
    """Serialized ``AnyValue`` for a string/int/double/bool value; None for anything else."""
    ((kind, data),) = value.items()
    if kind in ("stringValue", "string_value") and isinstance(data, str):
        text = data.encode("utf-8", "surrogatepass")
        return b"\x0a" + _varint(len(text)) + text
    if kind in ("intValue", "int_value"):
        number = _integer(data, "intValue")
        if not -(1 << 63) <= number < (1 << 63):
            raise BadPayloadError(f"invalid OTLP JSON: intValue {number} out of range")
        return b"\x18" + _varint(number & _MASK64)
    if kind in ("doubleValue", "double_value"):
        if isinstance(data, str):
            data = _SPECIAL_DOUBLES.get(data, data)
            if isinstance(data, str):
                try:
                    data = float(data)
                except ValueError:
                    raise BadPayloadError(f"invalid OTLP JSON: doubleValue {data!r}") from None
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise BadPayloadError(f"invalid OTLP JSON: doubleValue {data!r}")
        return b"\x21" + _DOUBLE.pack(float(data))
    if kind in ("boolValue", "bool_value") and isinstance(data, bool):
        return b"\x10\x01" if data else b"\x10\x00"
    return None


def _parse_into(obj: Any, message: Message, what: str) -> None:
    try:
        json_format.ParseDict(obj, message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        raise BadPayloadError(f"invalid OTLP JSON in {what}: {exc}") from exc


def _fill_span(span: Any, obj: Any) -> None:
    if not isinstance(obj, dict):
        raise BadPayloadError("invalid OTLP JSON: a span must be an object")
    span.trace_id = _span_id(_field(obj, "traceId", "trace_id"))
    span.span_id = _span_id(_field(obj, "spanId", "span_id"))
    parent = _field(obj, "parentSpanId", "parent_span_id")
    if parent:
        span.parent_span_id = _span_id(parent) or b"\0"  # bad hex: a wrong-length id rejects the span
    name = obj.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise BadPayloadError("invalid OTLP JSON: a span name must be a string")
        span.name = name
    kind = obj.get("kind")
    if kind is not None and not isinstance(kind, str):  # enum names are not OTLP; ParseDict ignored them too
        # An enum is an int32 on the wire: wrap into its signed range (-1 stays -1, an unknown kind).
        span.kind = ((_integer(kind, "kind") + 2**31) & 0xFFFFFFFF) - 2**31
    for camel, snake, attribute in (
        ("startTimeUnixNano", "start_time_unix_nano", "start_time_unix_nano"),
        ("endTimeUnixNano", "end_time_unix_nano", "end_time_unix_nano"),
    ):
        value = _field(obj, camel, snake)
        if value is not None:
            number = _integer(value, camel)
            if not 0 <= number <= _MASK64:
                raise BadPayloadError(f"invalid OTLP JSON: {camel} {number} out of range")
            setattr(span, attribute, number)
    span.attributes.extend(_key_value(a) for a in items(obj, "attributes"))
    # The lite class keeps status and events as raw bytes (sre_agent.ingest.otlp): fill real messages, serialize.
    status = obj.get("status")
    if status is not None:
        parsed = trace_pb2.Status()
        _parse_into(status, parsed, "span status")
        span.status = parsed.SerializeToString()
    for event in items(obj, "events"):
        parsed_event = trace_pb2.Span.Event()
        _parse_into(event, parsed_event, "span event")
        span.events.append(parsed_event.SerializeToString())


def fill_traces_request(document: dict[str, Any], request: Any) -> None:
    """Fill a (lite) ``ExportTraceServiceRequest`` from an OTLP/JSON traces document."""
    for resource_spans in items(document, "resourceSpans", "resource_spans"):
        scopes = items(resource_spans, "scopeSpans", "scope_spans", "instrumentationLibrarySpans")
        out = request.resource_spans.add()
        resource = resource_spans.get("resource")
        if resource is not None:
            _parse_into(resource, out.resource, "resource")
        for scope_spans in scopes:
            spans = items(scope_spans, "spans")
            scope_out = out.scope_spans.add()
            scope = scope_spans.get("scope")
            if scope is not None:
                _parse_into(scope, scope_out.scope, "scope")
            for span in spans:
                _fill_span(scope_out.spans.add(), span)
