"""Hostile bodies: decode_traces/decode_metrics return a result or raise BadPayloadError, nothing else."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_builders import SEMCONV_NEW, SGLANG, T0, VLLM_V1, metrics_request, otlp_json, trace_request

from sre_agent.errors import BadPayloadError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_metrics, decode_traces
from sre_agent.store.schema import metric_points_arrow_schema, spans_arrow_schema

NORM = Normaliser(max_attribute_bytes=64, hash_key=b"fuzz")
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
VALID_TRACES = trace_request(
    [{"attributes": VLLM_V1}, {"name": " Req 1", "attributes": SGLANG}, {"name": "c", "attributes": SEMCONV_NEW}],
    resource={"service.name": "s", "service.version": "v"},
).SerializeToString()
VALID_METRICS = metrics_request(
    [
        {"name": "vllm:num_requests_running", "kind": "gauge", "points": [{"time": T0, "value": 1.0}]},
        {
            "name": "h",
            "kind": "histogram",
            "points": [{"time": T0, "count": 1, "sum": 1.0, "bounds": [1.0], "bucket_counts": [1, 0]}],
        },
    ]
).SerializeToString()
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(body: bytes, content_type: str) -> None:
    for decode, schema in ((decode_traces, spans_arrow_schema()), (decode_metrics, metric_points_arrow_schema())):
        try:
            result = decode(body, content_type, normaliser=NORM)
        except BadPayloadError:
            continue
        assert result.table.schema == schema
        assert result.rejected >= 0


@st.composite
def mutated(draw: st.DrawFn, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 8))):
        action = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if action == "flip" and data:
            data[position] = draw(st.integers(0, 255))
        elif action == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete" and data:
            del data[position : position + draw(st.integers(1, 16))]
        elif action == "truncate":
            del data[position:]
    return bytes(data)


@SETTINGS
@given(st.binary(max_size=512))
def test_random_bytes(body: bytes) -> None:
    _check(body, PROTOBUF)
    _check(body, JSON)


@SETTINGS
@given(st.one_of(mutated(VALID_TRACES), mutated(VALID_METRICS)))
def test_mutated_valid_protobuf(body: bytes) -> None:
    _check(body, PROTOBUF)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
OTLP_KEYS = st.sampled_from(
    [
        "resourceSpans",
        "resourceMetrics",
        "scopeSpans",
        "spans",
        "traceId",
        "spanId",
        "attributes",
        "key",
        "value",
        "stringValue",
        "intValue",
        "kind",
        "startTimeUnixNano",
        "dataPoints",
        "gauge",
        "sum",
        "histogram",
        "name",
    ]
)


@st.composite
def otlp_shaped_json(draw: st.DrawFn) -> bytes:
    document = otlp_json(trace_request([{"attributes": VLLM_V1}]))
    span = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    for _ in range(draw(st.integers(1, 4))):
        span[draw(OTLP_KEYS)] = draw(JSON_VALUES)
    if draw(st.booleans()):
        document[draw(OTLP_KEYS)] = draw(JSON_VALUES)
    return json.dumps(document).encode()


@SETTINGS
@given(st.one_of(JSON_VALUES.map(lambda v: json.dumps(v).encode()), otlp_shaped_json()))
def test_random_json(body: bytes) -> None:
    _check(body, JSON)


def test_out_of_range_span_kinds_in_json_are_accepted_as_unknown_kinds() -> None:
    """The fuzzer's find: ``"kind": -1`` crashed the JSON decoder (the enum is a signed int32)."""
    for kind in (-1, 2**31, 2**32 + 9, -(2**40)):
        document = {
            "resourceSpans": [{"scopeSpans": [{"spans": [{
                "traceId": "4a9e4d7c3ed57de8c8c0d5f96bab7cfa", "spanId": "f651713dd836bb61", "name": "llm_request",
                "kind": kind, "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 10**9),
            }]}]}]
        }  # fmt: skip
        result = decode_traces(json.dumps(document).encode(), JSON, normaliser=NORM)
        assert result.rejected == 0
        assert result.table.column("kind").to_pylist() == ["unspecified"]
