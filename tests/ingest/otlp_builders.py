"""Builders for OTLP requests shaped like real engines (telemetry.md §1.3, §3.1, §4)."""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

T0 = 1_760_000_000_000_000_000  # 2025-10-09, Unix ns

VLLM_V0 = {
    "gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct",
    "gen_ai.request.id": "cmpl-v0-1",
    "gen_ai.request.temperature": 0.7,
    "gen_ai.request.top_p": 0.9,
    "gen_ai.request.max_tokens": 256,
    "gen_ai.request.n": 1,
    "gen_ai.usage.num_sequences": 1,
    "gen_ai.usage.prompt_tokens": 812,
    "gen_ai.usage.completion_tokens": 101,
    "gen_ai.latency.time_in_queue": 0.012,
    "gen_ai.latency.time_to_first_token": 0.25,
    "gen_ai.latency.e2e": 2.25,
    "gen_ai.latency.time_in_scheduler": 0.003,
    "gen_ai.latency.time_in_model_forward": 1.5,
    "gen_ai.latency.time_in_model_execute": 1.9,
}

VLLM_V1 = {
    "gen_ai.request.id": "chatcmpl-v1-1",
    "gen_ai.request.max_tokens": 512,
    "gen_ai.usage.prompt_tokens": 1024,
    "gen_ai.usage.completion_tokens": 201,
    "gen_ai.latency.time_in_queue": 0.02,
    "gen_ai.latency.time_to_first_token": 0.3,
    "gen_ai.latency.e2e": 4.3,
    "gen_ai.latency.time_in_model_prefill": 0.28,
    "gen_ai.latency.time_in_model_decode": 4.0,
    "gen_ai.latency.time_in_model_inference": 4.28,
}

SGLANG = {
    "rid": "a1b2c3d4e5f6",
    "module": "sglang::request",
    "gen_ai.usage.prompt_tokens": 300,
    "gen_ai.usage.completion_tokens": 11,
    "gen_ai.usage.cached_tokens": 256,
    "gen_ai.request.id": "a1b2c3d4e5f6",
    "gen_ai.request.max_tokens": 128,
    "gen_ai.request.top_k": 20,
    "gen_ai.response.model": "qwen2.5-7b",
    "gen_ai.response.finish_reasons": '["length"]',
    "gen_ai.latency.time_to_first_token": 0.05,
    "gen_ai.latency.e2e": 0.55,
    "gen_ai.latency.time_in_model_prefill": 0.04,
    "gen_ai.latency.time_in_model_decode": 0.5,
    "gen_ai.latency.time_in_model_inference": 0.54,
}

SEMCONV_NEW = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.response.model": "gpt-4o-2024-08-06",
    "gen_ai.usage.input_tokens": 50,
    "gen_ai.usage.output_tokens": 20,
    "gen_ai.usage.cache_read.input_tokens": 32,
    "gen_ai.response.finish_reasons": ["stop", "length"],
    "http.request.resend_count": 2,
    "error.type": "timeout",
}

SEMCONV_OLD = {
    "gen_ai.system": "openai",
    "gen_ai.request.model": "gpt-4",
    "gen_ai.usage.prompt_tokens": 40,
    "gen_ai.usage.completion_tokens": 10,
    "gen_ai.response.finish_reasons": ["stop"],
}


def any_value(value: Any) -> AnyValue:
    """An OTLP AnyValue holding a Python value."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    return AnyValue(string_value=str(value))


def key_values(attributes: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


def trace_request(
    spans: list[dict[str, Any]],
    resource: dict[str, Any] | None = None,
    scope: str = "vllm.llm_engine",
) -> ExportTraceServiceRequest:
    """One resource, one scope, the given spans (dicts of Span fields + ``attributes``)."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(key_values(resource or {"service.name": "vllm-server"}))
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = scope
    for i, given in enumerate(spans):
        spec = dict(given)
        attributes = spec.pop("attributes", {})
        events = spec.pop("events", [])
        status = spec.pop("status", None)
        span = scope_spans.spans.add(
            trace_id=spec.pop("trace_id", os.urandom(16)),
            span_id=spec.pop("span_id", os.urandom(8)),
            name=spec.pop("name", "llm_request"),
            kind=spec.pop("kind", 2),
            start_time_unix_nano=spec.pop("start", T0 + i * 1_000_000),
            end_time_unix_nano=spec.pop("end", T0 + i * 1_000_000 + 2_000_000_000),
            **spec,
        )
        span.attributes.extend(key_values(attributes))
        for name, attrs in events:
            event = span.events.add(name=name, time_unix_nano=T0)
            event.attributes.extend(key_values(attrs))
        if status is not None:
            span.status.code = status[0]
            span.status.message = status[1]
    return request


def metrics_request(
    metrics: list[dict[str, Any]], resource: dict[str, Any] | None = None
) -> ExportMetricsServiceRequest:
    """Metrics from dicts: name, kind (gauge|sum|histogram), points (list of dicts)."""
    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    resource_metrics.resource.attributes.extend(key_values(resource or {"service.name": "vllm-server"}))
    scope_metrics = resource_metrics.scope_metrics.add()
    for spec in metrics:
        metric = scope_metrics.metrics.add(name=spec["name"], unit=spec.get("unit", ""))
        kind = spec["kind"]
        data = getattr(metric, kind)
        if kind in ("sum", "histogram"):
            data.aggregation_temporality = spec.get("temporality", 2)
        if kind == "sum":
            data.is_monotonic = spec.get("monotonic", True)
        for point_spec in spec["points"]:
            point = data.data_points.add()
            point.time_unix_nano = point_spec["time"]
            point.start_time_unix_nano = point_spec.get("start", 0)
            point.attributes.extend(key_values(point_spec.get("attributes", {})))
            if kind == "histogram":
                point.count = point_spec["count"]
                point.sum = point_spec["sum"]
                point.explicit_bounds.extend(point_spec["bounds"])
                point.bucket_counts.extend(point_spec["bucket_counts"])
            elif isinstance(point_spec["value"], int):
                point.as_int = point_spec["value"]
            else:
                point.as_double = point_spec["value"]
    return request


def otlp_json(request: Any, *, upper_ids: bool = False) -> dict[str, Any]:
    """The OTLP/JSON form of a request: camelCase, hex ids, int64 as strings, enums as ints."""
    import base64

    from google.protobuf import json_format

    document: dict[str, Any] = json_format.MessageToDict(request, use_integers_for_enums=True)

    def fix(obj: Any) -> None:
        if isinstance(obj, dict):
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in obj:
                    text = base64.b64decode(obj[key]).hex()
                    obj[key] = text.upper() if upper_ids else text
            for value in obj.values():
                fix(value)
        elif isinstance(obj, list):
            for value in obj:
                fix(value)

    fix(document)
    return document
