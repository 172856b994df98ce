"""OTLP/JSON quirks (telemetry.md 5.2) and the examples/trace.json shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sre_agent.errors import BadPayloadError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_metrics, decode_traces

FIXTURES = Path(__file__).parent / "fixtures"
JSON = "application/json; charset=utf-8"


@pytest.fixture
def norm() -> Normaliser:
    return Normaliser(hash_key=b"k")


def _doc(span: dict[str, Any], resource_key: str = "resourceSpans", scope_key: str = "scopeSpans") -> bytes:
    return json.dumps({resource_key: [{scope_key: [{"spans": [span]}]}]}).encode()


def test_example_trace_json_ingests(norm: Normaliser) -> None:
    decoded = decode_traces((FIXTURES / "trace.json").read_bytes(), JSON, normaliser=norm)
    assert decoded.rejected == 0
    (row,) = decoded.table.to_pylist()
    assert row["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert row["span_id"] == "eee19b7ec3c1b174"
    assert row["parent_span_id"] == "eee19b7ec3c1b173"
    assert row["name"] == "I'm a server span"
    assert row["kind"] == "server"
    assert row["start_ns"] == 1544712660000000000
    assert row["end_ns"] == 1544712661000000000
    assert row["duration_s"] == 1.0
    assert row["service_name"] == "my.service"
    assert row["scope_name"] == "my.library"
    assert dict(row["attributes"]) == {"my.span.attr": "some value"}
    assert row["is_engine"] is False


def test_int64_as_number_or_string_and_enums_as_ints(norm: Normaliser) -> None:
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "B7AD6B7169203331",
        "name": "n",
        "kind": 3,
        "startTimeUnixNano": 1700000000000000000,
        "endTimeUnixNano": "1700000001500000000",
        "status": {"code": 2, "message": "bad"},
        "attributes": [
            {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "12"}},
            {"key": "gen_ai.usage.output_tokens", "value": {"intValue": 30}},
            {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 1.25}},
        ],
    }
    (row,) = decode_traces(_doc(span), JSON, normaliser=norm).table.to_pylist()
    assert row["span_id"] == "b7ad6b7169203331"
    assert (row["kind"], row["status_code"], row["error_type"]) == ("client", "error", "error")
    assert row["duration_s"] == 1.5
    assert (row["input_tokens"], row["output_tokens"], row["e2e_s"]) == (12, 30, 1.25)


def test_snake_case_keys_and_unknown_fields(norm: Normaliser) -> None:
    span = {
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
        "parent_span_id": "00f067aa0ba902b7",
        "name": "n",
        "start_time_unix_nano": "1",
        "some_future_field": {"nested": [1, 2, 3]},
        "attributes": [{"key": "k", "value": {"string_value": "v"}, "unknownKey": 1}],
    }
    body = json.dumps({"resource_spans": [{"scope_spans": [{"spans": [span]}], "extra": True}]}).encode()
    (row,) = decode_traces(body, JSON, normaliser=norm).table.to_pylist()
    assert row["parent_span_id"] == "00f067aa0ba902b7"
    assert dict(row["attributes"]) == {"k": "v"}


def test_bytes_value_base64_and_special_doubles(norm: Normaliser) -> None:
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": "n",
        "attributes": [
            {"key": "raw", "value": {"bytesValue": "AP8="}},
            {"key": "nan", "value": {"doubleValue": "NaN"}},
            {"key": "inf", "value": {"doubleValue": "Infinity"}},
            {"key": "arr", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "2"}]}}},
            {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "x", "value": {"boolValue": False}}]}}},
        ],
    }
    (row,) = decode_traces(_doc(span), JSON, normaliser=norm).table.to_pylist()
    assert dict(row["attributes"]) == {
        "raw": "AP8=",
        "nan": "NaN",
        "inf": "Infinity",
        "arr": '["a",2]',
        "kv": '{"x":false}',
    }


def test_invalid_hex_id_rejects_only_that_span(norm: Normaliser) -> None:
    good = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "good"}
    bad = {"traceId": "zz-not-hex", "spanId": "b7ad6b7169203332", "name": "bad"}
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [bad, good]}]}]}).encode()
    decoded = decode_traces(body, JSON, normaliser=norm)
    assert decoded.rejected == 1
    assert decoded.table.column("name").to_pylist() == ["good"]


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b'"just a string"',
        b'{"resourceSpans": 5}',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": "x"}]}]}',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
        '{"resourceSpans": [], "x": "\u00e9"}'.encode("latin-1"),
        b"[" * 100_000,
    ],
    ids=["syntax", "array", "string", "wrong-type", "spans-not-list", "bad-int64", "latin1", "deep"],
)
def test_unparseable_json_is_bad_payload(body: bytes, norm: Normaliser) -> None:
    with pytest.raises(BadPayloadError):
        decode_traces(body, JSON, normaliser=norm)


def test_metrics_json_with_exemplars_and_string_ints(norm: Normaliser) -> None:
    body = {
        "resourceMetrics": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
                "scopeMetrics": [
                    {
                        "metrics": [
                            {
                                "name": "vllm:prompt_tokens_total",
                                "sum": {
                                    "aggregationTemporality": 2,
                                    "isMonotonic": True,
                                    "dataPoints": [
                                        {
                                            "asInt": "1200",
                                            "timeUnixNano": "1700000000000000000",
                                            "startTimeUnixNano": "1690000000000000000",
                                            "exemplars": [
                                                {"traceId": "0AF7651916CD43DD8448EB211C80319C", "asInt": "1"}
                                            ],
                                        }
                                    ],
                                },
                            }
                        ]
                    }
                ],
            }
        ]
    }
    decoded = decode_metrics(json.dumps(body).encode(), JSON, normaliser=norm)
    (row,) = decoded.table.to_pylist()
    assert (row["name"], row["source_name"], row["value"]) == ("vllm:prompt_tokens", "vllm:prompt_tokens_total", 1200.0)
    assert (row["is_monotonic"], row["temporality"], row["service_name"]) == (True, "cumulative", "vllm")


def test_proto3_json_base64_ids_are_tolerated(norm: Normaliser) -> None:
    """Some exporters run a generic proto3 JSON encoder, which writes bytes as base64."""
    from google.protobuf import json_format
    from otlp_builders import trace_request

    request = trace_request([{"trace_id": bytes(range(16)), "span_id": bytes(range(8)), "name": "b64"}])
    body = json.dumps(json_format.MessageToDict(request)).encode()
    (row,) = decode_traces(body, JSON, normaliser=norm).table.to_pylist()
    assert (row["trace_id"], row["span_id"]) == ("000102030405060708090a0b0c0d0e0f", "0001020304050607")


def test_enum_names_and_unknown_value_kinds_do_not_fail_the_request(norm: Normaliser) -> None:
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": "n",
        "kind": "SPAN_KIND_SERVER",
        "attributes": [{"key": "future", "value": {"someNewValue": 1}}, {"key": "empty", "value": {}}],
    }
    (row,) = decode_traces(_doc(span), JSON, normaliser=norm).table.to_pylist()
    assert row["kind"] == "unspecified"
    assert dict(row["attributes"]) == {"future": "", "empty": ""}
