"""Span shapes of every known generation normalise onto the canonical columns."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from otlp_builders import VLLM_V1, otlp_json, trace_request

from sre_agent.errors import BadPayloadError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_traces
from sre_agent.store.schema import spans_arrow_schema

FIXTURES = Path(__file__).parent / "fixtures"
SHAPES = sorted((FIXTURES / "span_shapes").glob("*.json"))
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


@pytest.fixture
def norm() -> Normaliser:
    return Normaliser(hash_key=b"test-key")


def _request_for(case: dict[str, Any]) -> Any:
    span = dict(case["span"])
    if "status" in span:
        span["status"] = tuple(span["status"])
    return trace_request([span], resource=case["resource"], scope=case["scope"])


def _close(actual: Any, expected: Any) -> bool:
    if isinstance(expected, float) and actual is not None:
        return math.isclose(actual, expected, rel_tol=1e-12)
    return bool(actual == expected)


@pytest.mark.parametrize("path", SHAPES, ids=[p.stem for p in SHAPES])
def test_span_shape_normalises(path: Path, norm: Normaliser) -> None:
    case = json.loads(path.read_text())
    request = _request_for(case)
    decoded = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm)
    assert decoded.rejected == 0
    assert decoded.table.schema == spans_arrow_schema()
    (row,) = decoded.table.to_pylist()
    wrong = {k: (row[k], v) for k, v in case["expect"].items() if not _close(row[k], v)}
    assert not wrong, f"{path.stem}: column -> (got, expected): {wrong}"
    # every span attribute is kept in the MAP, stringified
    assert [k for k, _ in row["attributes"]] == list(case["span"]["attributes"])
    assert dict(row["resource_attributes"])["service.name"] == case["resource"]["service.name"]


@pytest.mark.parametrize("path", SHAPES, ids=[p.stem for p in SHAPES])
def test_json_and_protobuf_give_identical_rows(path: Path, norm: Normaliser) -> None:
    request = _request_for(json.loads(path.read_text()))
    from_proto = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm).table
    from_json = decode_traces(json.dumps(otlp_json(request, upper_ids=True)).encode(), JSON, normaliser=norm).table
    assert from_json.equals(from_proto)


def test_stringified_attribute_values(norm: Normaliser) -> None:
    attributes = {"s": "text", "i": -42, "d": 0.1, "b": True, "arr": ["a", 1, 2.5], "raw": b"\x00\xff"}
    request = trace_request([{"name": "x", "attributes": attributes}])
    (row,) = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm).table.to_pylist()
    assert dict(row["attributes"]) == {
        "s": "text",
        "i": "-42",
        "d": "0.1",
        "b": "true",
        "arr": '["a",1,2.5]',
        "raw": "AP8=",
    }


def test_ids_are_lowercase_hex_and_parent_null_for_roots(norm: Normaliser) -> None:
    request = trace_request(
        [
            {"trace_id": bytes(range(16)), "span_id": bytes(range(8)), "name": "root"},
            {"trace_id": bytes(range(16)), "span_id": b"\xab" * 8, "parent_span_id": bytes(range(8)), "name": "child"},
        ]
    )
    rows = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm).table.to_pylist()
    assert rows[0]["trace_id"] == "000102030405060708090a0b0c0d0e0f"
    assert rows[0]["parent_span_id"] is None
    assert rows[1]["span_id"] == "abababababababab"
    assert rows[1]["parent_span_id"] == "0001020304050607"


def test_bad_ids_reject_the_span_not_the_request(norm: Normaliser) -> None:
    request = trace_request(
        [
            {"trace_id": b"short", "name": "bad trace id"},
            {"span_id": b"", "name": "empty span id"},
            {"parent_span_id": b"\x01\x02", "name": "bad parent"},
            {"name": "good", "attributes": VLLM_V1},
        ]
    )
    decoded = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm)
    assert decoded.rejected == 3
    assert decoded.table.column("name").to_pylist() == ["good"]
    assert len(decoded.errors) == 3
    assert "bad trace id" in decoded.errors[0]


def test_a_rejected_span_does_not_shift_the_resource_scope_or_errors_of_later_spans(norm: Normaliser) -> None:
    # Columns are built for the whole batch after the span loop; a rejected span must not move
    # the resource, scope, attributes or event error of the spans received after it.
    request = trace_request(
        [
            {"name": "a", "attributes": {"tenant.id": "t-a"}},
            {"trace_id": b"short", "name": "bad", "attributes": {"tenant.id": "t-bad"}},
            {"name": "b", "attributes": {"tenant.id": "t-b"}, "events": [("exception", {"exception.type": "OOM"})]},
        ],
        resource={"service.name": "first"},
        scope="scope-1",
    )
    second = trace_request(
        [{"start": 1 << 63, "name": "too late"}, {"name": "c", "status": (2, "boom")}],
        resource={"service.name": "second"},
        scope="scope-2",
    )
    request.resource_spans.extend(second.resource_spans)
    decoded = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm)
    rows = decoded.table.to_pylist()
    assert decoded.rejected == 2
    assert [r["name"] for r in rows] == ["a", "b", "c"]
    assert [r["service_name"] for r in rows] == ["first", "first", "second"]
    assert [r["scope_name"] for r in rows] == ["scope-1", "scope-1", "scope-2"]
    assert [r["tenant_id"] for r in rows] == ["t-a", "t-b", None]
    assert [r["error_type"] for r in rows] == [None, "OOM", "error"]
    assert [r["status_code"] for r in rows] == ["unset", "unset", "error"]
    assert rows[2]["status_message"] == "boom"
    assert rows[0]["status_message"] is None
    assert [dict(r["resource_attributes"])["service.name"] for r in rows] == ["first", "first", "second"]


def test_tokens_sent_as_doubles_or_strings_still_fill_int_columns(norm: Normaliser) -> None:
    attributes = {"gen_ai.usage.input_tokens": 12.0, "gen_ai.usage.output_tokens": "7", "gen_ai.latency.e2e": "1.5"}
    request = trace_request([{"attributes": attributes}])
    (row,) = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm).table.to_pylist()
    assert (row["input_tokens"], row["output_tokens"], row["e2e_s"]) == (12, 7, 1.5)


def test_garbage_in_a_numeric_column_becomes_null_not_an_error(norm: Normaliser) -> None:
    attributes = {"gen_ai.usage.input_tokens": "many", "gen_ai.latency.e2e": [1, 2], "http.request.resend_count": True}
    request = trace_request([{"attributes": attributes}])
    (row,) = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm).table.to_pylist()
    assert row["input_tokens"] is None
    assert row["e2e_s"] is None


def test_empty_request_gives_empty_table(norm: Normaliser) -> None:
    decoded = decode_traces(b"", PROTOBUF, normaliser=norm)
    assert decoded.table.num_rows == 0
    assert decoded.table.schema == spans_arrow_schema()
    assert decode_traces(b"{}", JSON, normaliser=norm).table.num_rows == 0


def test_unsupported_content_type_is_bad_payload(norm: Normaliser) -> None:
    with pytest.raises(BadPayloadError, match="content type"):
        decode_traces(b"", "text/plain", normaliser=norm)


def test_queue_is_derived_only_when_no_source_reports_it(norm: Normaliser) -> None:
    def queue(attributes: dict[str, Any]) -> Any:
        span = {"name": " Req 00000001", "kind": 1, "attributes": attributes}
        request = trace_request([span], resource={"service.name": "sglang"}, scope="sglang server")
        (row,) = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=norm).table.to_pylist()
        return row["queue_s"]

    ttft, prefill = "gen_ai.latency.time_to_first_token", "gen_ai.latency.time_in_model_prefill"
    assert queue({ttft: 0.5, prefill: 0.2}) == pytest.approx(0.3)
    assert queue({ttft: 0.2, prefill: 0.2}) == 0.0
    assert queue({ttft: 0.1, prefill: 0.2}) is None  # prefill longer than TTFT: malformed, not a queue
    assert queue({ttft: 0.5}) is None
    # A reported queue time wins, even when it disagrees with the difference.
    assert queue({ttft: 0.5, prefill: 0.2, "gen_ai.latency.time_in_queue": 0.1}) == pytest.approx(0.1)
