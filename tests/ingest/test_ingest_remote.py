"""`sre-agent ingest --url`: files sent to a real `sre-agent serve` over OTLP/HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from otlp_builders import T0, VLLM_V1, metrics_request, otlp_json, trace_request

from sre_agent.errors import RemoteError
from sre_agent.ingest.remote import send_files

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receiver"))

from receiver_harness import count_rows, start_serve


def _files(folder: Path) -> tuple[Path, Path]:
    jsonl = folder / "export.jsonl"
    traces = trace_request([{"attributes": VLLM_V1, "start": T0 + i} for i in range(3)])
    bad_span = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "b7ad6b7169203331"}]}]}]}
    jsonl.write_text("\n".join([json.dumps(otlp_json(traces)), "not json", json.dumps(bad_span)]) + "\n")
    pb = folder / "export.pb"
    messages = [
        trace_request([{"attributes": VLLM_V1, "start": T0 + 100 + i} for i in range(4)]).SerializeToString(),
        metrics_request(
            [{"name": "vllm:num_requests_running", "kind": "gauge", "points": [{"time": T0, "value": 1.0}]}]
        ).SerializeToString(),
    ]
    pb.write_bytes(b"".join(len(m).to_bytes(4, "big") + m for m in messages))
    return jsonl, pb


def test_send_files_to_a_running_server(tmp_path: Path) -> None:
    jsonl, pb = _files(tmp_path)
    db = tmp_path / "served.duckdb"
    server = start_serve(db, grpc=False)
    try:
        with httpx.Client(base_url=server.http_url, timeout=60) as client:
            text_result, binary_result = send_files([jsonl, pb], client)
        # the store is locked by the server: local ingest says so and points at --url
        locked = subprocess.run(
            [sys.executable, "-m", "sre_agent", "ingest", "--db", str(db), str(jsonl)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        via_cli = subprocess.run(
            [sys.executable, "-m", "sre_agent", "ingest", "--url", server.http_url, "--format", "json", str(pb)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        assert server.stop() == 0
    assert text_result.spans == 3
    assert [n for n, _ in text_result.bad_lines] == [2, 3]
    assert "rejected by the server" in text_result.bad_lines[1][1]
    assert (binary_result.spans, binary_result.points, binary_result.ok) == (4, 1, True)
    assert locked.returncode == 1
    assert "--url" in locked.stderr
    assert via_cli.returncode == 0, via_cli.stderr
    assert json.loads(via_cli.stdout)["totals"]["spans"] == 4
    assert "accepted by the server" in via_cli.stderr
    assert count_rows(db) == 7  # the CLI resend of export.pb stored nothing twice
    assert count_rows(db, "metric_points") == 1


def test_retries_on_429_then_gives_up_on_500(tmp_path: Path) -> None:
    jsonl, _ = _files(tmp_path)
    calls: list[int] = []
    waits: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(429, headers={"Retry-After": "2"})
        return httpx.Response(200, json={})

    with httpx.Client(base_url="http://test", transport=httpx.MockTransport(handler)) as client:
        (result,) = send_files([jsonl], client, sleep=waits.append)
    assert waits == [2.0]
    assert result.spans == 4  # this server accepts even the span with the bad id

    failing = httpx.MockTransport(lambda request: httpx.Response(500, text="boom"))
    with httpx.Client(base_url="http://test", transport=failing) as client, pytest.raises(RemoteError, match="500"):
        send_files([jsonl], client, sleep=waits.append)
