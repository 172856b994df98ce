"""Property: whatever a client sends, the receiver never crashes and never answers 5xx.

Most examples go through the ASGI app in-process (fast); a smaller run hits a real
`sre-agent serve` over a socket, where framing and uvicorn are involved too.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from receiver_harness import start_serve, vllm_request

from sre_agent.api.server import build_app, open_context
from sre_agent.config import Config

VALID_PROTOBUF = vllm_request(8, first_index=500).SerializeToString()
VALID_JSON = json.dumps(
    {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "fuzz"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "llm_request",
                                "kind": 2,
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000001000000000",
                                "attributes": [{"key": "gen_ai.latency.e2e", "value": {"doubleValue": 1.5}}],
                            }
                        ]
                    }
                ],
            }
        ]
    }
)
ALLOWED = {200, 400, 401, 405, 413, 415}

content_types = st.sampled_from(
    ["application/x-protobuf", "application/json", "application/json; charset=utf-8", "text/plain", "", "\x7f"]
)
encodings = st.sampled_from([None, "gzip", "identity", "deflate", "GZIP", "x-gzip"])


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    """A valid body with a few random byte flips, cuts and insertions."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
        if action == "flip":
            data[pos] = draw(st.integers(0, 255))
        elif action == "cut":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif action == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[pos:]
    return bytes(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=30,
)
otlp_keys = st.sampled_from(
    ["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "kind", "startTimeUnixNano", "attributes", "value"]
)
otlp_shaped = st.recursive(
    json_values, lambda children: st.dictionaries(otlp_keys, children, max_size=4) | st.lists(children, max_size=3)
)


def _json_mutation(draw: st.DrawFn) -> bytes:
    document = json.loads(VALID_JSON)
    span = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span[draw(st.sampled_from(sorted(span)))] = draw(json_values)
    return json.dumps(document).encode()


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "protobuf", "json-text", "json-value", "otlp-shaped", "json-field"]))
    if kind == "random":
        return draw(st.binary(max_size=512))
    if kind == "protobuf":
        return draw(mutated(VALID_PROTOBUF))
    if kind == "json-text":
        return draw(mutated(VALID_JSON.encode()))
    if kind == "json-field":
        return _json_mutation(draw)
    value = draw(json_values if kind == "json-value" else otlp_shaped)
    return json.dumps(value).encode()


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    path = draw(st.sampled_from(["/v1/traces", "/v1/metrics"]))
    body = draw(bodies())
    headers = {"content-type": draw(content_types)}
    encoding = draw(encodings)
    if encoding is not None:
        headers["content-encoding"] = encoding
        if encoding.lower() in ("gzip", "x-gzip") and draw(st.booleans()):
            body = gzip.compress(body)
    if draw(st.booleans()):
        headers[draw(st.sampled_from(["x-junk", "accept", "content-length"]))] = draw(
            # A header value may not begin or end with whitespace (RFC 9110 field-value); clients refuse
            # to send one, so such values would test httpx, not the server.
            st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20).map(str.strip)
        )
    return path, body, headers


def _decoder_crashes(metrics_text: str) -> int:
    match = re.search(r"^sre_agent_receiver_decoder_crashes_total (\d+)", metrics_text, re.MULTILINE)
    assert match is not None
    return int(match.group(1))


class _SyncAsgiClient:
    """Drives httpx.ASGITransport from synchronous hypothesis examples on one private event loop."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fuzz")

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self._loop.run_until_complete(self._client.post(path, **kwargs))

    def get(self, path: str) -> httpx.Response:
        return self._loop.run_until_complete(self._client.get(path))

    def close(self) -> None:
        self._loop.run_until_complete(self._client.aclose())


@contextmanager
def _app_client(tmp_path: Path) -> Iterator[_SyncAsgiClient]:
    config = Config(db=str(tmp_path / "fuzz.duckdb"), max_body_bytes=1 << 20)
    loop = asyncio.new_event_loop()
    try:
        with open_context(config) as ctx:
            client = _SyncAsgiClient(build_app(ctx), loop)
            try:
                yield client
            finally:
                client.close()
    finally:
        loop.close()


def _post(client: Any, path: str, body: bytes, headers: dict[str, str]) -> int:
    headers = {k: v for k, v in headers.items() if k != "content-length"}  # keep framing honest
    return int(client.post(path, content=body, headers=headers).status_code)


def test_asgi_app_never_5xx_on_garbage(tmp_path: Path) -> None:
    with _app_client(tmp_path) as client:

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(requests())
        def check(request: tuple[str, bytes, dict[str, str]]) -> None:
            path, body, headers = request
            assert _post(client, path, body, headers) in ALLOWED

        check()
        assert _decoder_crashes(client.get("/metrics").text) == 0
        assert client.get("/healthz").status_code == 200


def test_real_server_never_5xx_on_garbage(tmp_path: Path) -> None:
    server = start_serve(tmp_path / "fuzz-real.duckdb", grpc=False)
    try:
        with httpx.Client(base_url=server.http_url, timeout=30) as client:

            @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(requests())
            def check(request: tuple[str, bytes, dict[str, str]]) -> None:
                path, body, headers = request
                assert _post(client, path, body, headers) in ALLOWED

            check()
            assert _decoder_crashes(client.get("/metrics").text) == 0
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.stderr
