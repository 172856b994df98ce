"""Bad input over real HTTP: every malformed request gets the right status and a
google.rpc.Status body, and nothing already accepted is lost."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from receiver_harness import ServeProcess, count_rows, start_serve, vllm_request

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY = 4 * 1024 * 1024
GOOD_SPANS = 100


@dataclass
class Running:
    server: ServeProcess
    client: httpx.Client
    db: Path

    def spans(self) -> int:
        return int(self.client.get("/api/v1/status").json()["spans"])


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    db = tmp_path_factory.mktemp("bad_input") / "store.duckdb"
    # Decoding in a worker process here (the other suites decode in-process): errors must cross it intact.
    server = start_serve(db, "--decode-workers", "1", env={"SRE_AGENT_MAX_BODY_BYTES": str(MAX_BODY)}, grpc=False)
    client = httpx.Client(base_url=server.http_url, timeout=30)
    try:
        good = client.post("/v1/traces", content=vllm_request(GOOD_SPANS).SerializeToString(), headers=_ct(PROTOBUF))
        assert good.status_code == 200
        assert good.headers["content-type"] == PROTOBUF
        assert not ExportTraceServiceResponse.FromString(good.content).HasField("partial_success")
        yield Running(server, client, db)
    finally:
        client.close()
        if server.proc.poll() is None:
            server.stop()


def _ct(media_type: str, **extra: str) -> dict[str, str]:
    return {"content-type": media_type, **extra}


def _json_doc(
    kind: object = 2,
    start: object = "1700000000000000000",
    trace_id: str = "5B8EFFF798038103D269B633813FC60C",
    span_id: str = "EEE19B7EC3C1B174",
    attrs: list[object] | None = None,
) -> bytes:
    span = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": "llm_request",
        "kind": kind,
        "startTimeUnixNano": start,
        "endTimeUnixNano": "1700000001000000000",
        "attributes": attrs or [],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "json-client"}}]}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}).encode()


def _status(response: httpx.Response) -> status_pb2.Status:
    """The google.rpc.Status body, decoded in the response's own content type."""
    if response.headers["content-type"].startswith(PROTOBUF):
        return status_pb2.Status.FromString(response.content)
    body = response.json()
    return status_pb2.Status(code=body["code"], message=body["message"])


_VALID = vllm_request(20, first_index=10_000).SerializeToString()

BAD_REQUESTS = [
    # (id, body, headers, expected status, expected response media type)
    ("truncated-protobuf", _VALID[: len(_VALID) // 2], _ct(PROTOBUF), 400, PROTOBUF),
    ("invalid-json", b'{"resourceSpans": [', _ct(JSON), 400, JSON),
    ("json-not-an-object", b"[1, 2]", _ct(JSON), 400, JSON),
    ("deeply-nested-json", b"[" * 100_000 + b"]" * 100_000, _ct(JSON), 400, JSON),
    ("int64-not-a-number", _json_doc(start="12x"), _ct(JSON), 400, JSON),
    ("int64-negative", _json_doc(start="-5"), _ct(JSON), 400, JSON),
    ("int-value-fraction", _json_doc(attrs=[{"key": "n", "value": {"intValue": "1.5"}}]), _ct(JSON), 400, JSON),
    ("non-utf8-span-name", _VALID.replace(b"llm_request", b"llm_\xff\xfeuest"), _ct(PROTOBUF), 400, PROTOBUF),
    ("non-utf8-resource", _VALID.replace(b"vllm-server", b"vllm-\xffrver"), _ct(PROTOBUF), 400, PROTOBUF),
    ("wrong-content-type", _VALID, _ct("text/plain"), 415, JSON),
    ("no-content-type", _VALID, {}, 415, JSON),
    ("oversize", b"\x00" * (MAX_BODY + 1), _ct(PROTOBUF), 413, PROTOBUF),
    ("corrupt-gzip", b"\x1f\x8b\x08\x00garbage", _ct(PROTOBUF, **{"content-encoding": "gzip"}), 400, PROTOBUF),
    ("truncated-gzip", gzip.compress(_VALID)[:-20], _ct(PROTOBUF, **{"content-encoding": "gzip"}), 400, PROTOBUF),
    ("unknown-encoding", _VALID, _ct(PROTOBUF, **{"content-encoding": "br"}), 400, PROTOBUF),
]


@pytest.mark.parametrize(
    ("body", "headers", "expected", "media_type"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_request_is_refused_and_loses_nothing(
    running: Running, body: bytes, headers: dict[str, str], expected: int, media_type: str
) -> None:
    before = running.spans()
    response = running.client.post("/v1/traces", content=body, headers=headers)
    assert response.status_code == expected, response.text
    assert response.headers["content-type"].startswith(media_type)
    status = _status(response)
    assert status.message
    assert running.spans() == before


def test_gzip_bomb_is_refused_without_inflating_it(running: Running) -> None:
    # 256 gzip members of 1 MiB of zeros each: 256 MiB once inflated, ~260 kB on the wire.
    bomb = gzip.compress(b"\x00" * (1 << 20), compresslevel=9) * 256
    rss_before = psutil.Process(running.server.proc.pid).memory_info().rss
    response = running.client.post("/v1/traces", content=bomb, headers=_ct(PROTOBUF, **{"content-encoding": "gzip"}))
    assert response.status_code == 413
    assert "after decompression" in _status(response).message
    grown = psutil.Process(running.server.proc.pid).memory_info().rss - rss_before
    assert grown < 3 * MAX_BODY + 64 * 1024 * 1024


def test_gzip_body_within_cap_is_accepted(running: Running) -> None:
    before = running.spans()
    payload = vllm_request(50, first_index=20_000).SerializeToString()
    middle = len(payload) // 2
    body = gzip.compress(payload[:middle]) + gzip.compress(payload[middle:])  # two gzip members
    response = running.client.post("/v1/traces", content=body, headers=_ct(PROTOBUF, **{"content-encoding": "gzip"}))
    assert response.status_code == 200
    assert running.spans() == before + 50


def test_lenient_json_is_accepted_in_json(running: Running) -> None:
    """Enum names and unknown enum values are tolerated (unknown fields must be skipped)."""
    before = running.spans()
    for i, kind in enumerate(("SPAN_KIND_SERVER", 99, "NOT_A_KIND")):
        doc = _json_doc(kind=kind, span_id=f"{i + 1:016X}")
        response = running.client.post("/v1/traces", content=doc, headers=_ct(JSON))
        assert response.status_code == 200
        assert response.headers["content-type"] == JSON
        assert response.json() == {}
    assert running.spans() == before + 3


def test_partial_success_reports_rejected_spans(running: Running) -> None:
    before = running.spans()
    doc = _json_doc(trace_id="zz", span_id="00000000000000AA")
    response = running.client.post("/v1/traces", content=doc, headers=_ct(JSON))
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "id" in partial["errorMessage"]
    assert running.spans() == before


def test_huge_attribute_value_is_stored_bounded(running: Running) -> None:
    request = vllm_request(1, first_index=30_000)
    request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="huge").value.string_value = "x" * 3_000_000
    response = running.client.post("/v1/traces", content=request.SerializeToString(), headers=_ct(PROTOBUF))
    assert response.status_code == 200
    trace = running.client.get("/api/v1/spans", params={"trace_id": f"{30_001:032x}"}).json()["spans"]
    assert len(trace) == 1
    assert len(trace[0]["attributes"]["huge"]) <= 4096


def test_wrong_method_path_and_empty_request(running: Running) -> None:
    assert running.client.get("/v1/traces").status_code == 405
    bare = running.client.post("/", content=_VALID, headers=_ct(PROTOBUF))  # vLLM given http://host:4318
    assert bare.status_code == 404
    assert "/v1/traces" in _status(bare).message
    empty = running.client.post("/v1/traces", content=b"", headers=_ct(PROTOBUF))
    assert empty.status_code == 200


def test_everything_accepted_is_in_the_store_after_shutdown(running: Running) -> None:
    expected = running.spans()
    assert expected == GOOD_SPANS + 50 + 3 + 1
    assert running.server.stop() == 0
    assert count_rows(running.db) == expected
    assert "Traceback" not in running.server.stderr


def test_a_bad_attribute_value_is_400_when_decoded_in_process(tmp_path: Path) -> None:
    """In-process decoding builds columns in the writer: a non-UTF-8 attribute value is found
    there, and must still be the client's 400, with the requests around it stored."""
    import concurrent.futures

    server = start_serve(tmp_path / "in_process.duckdb", grpc=False)
    try:
        bad = vllm_request(1, first_index=50_000)
        bad.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="x").value.string_value = "PATCHME"
        bad_body = bad.SerializeToString().replace(b"PATCHME", b"PAT\xff\xfeME")
        bodies = [vllm_request(20, first_index=1000 * i).SerializeToString() for i in range(1, 7)]
        with httpx.Client(base_url=server.http_url, timeout=30) as client:

            def post(body: bytes) -> httpx.Response:
                return client.post("/v1/traces", content=body, headers=_ct(PROTOBUF))

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                responses = list(pool.map(post, [*bodies[:3], bad_body, *bodies[3:]]))
        assert [r.status_code for r in responses] == [200, 200, 200, 400, 200, 200, 200]
        status = status_pb2.Status.FromString(responses[3].content)
        assert "UTF-8" in status.message
    finally:
        assert server.stop() == 0, server.stderr
    assert count_rows(tmp_path / "in_process.duckdb") == 6 * 20
