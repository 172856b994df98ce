"""sre_agent.api.client: the --url helper sends the bearer token and turns failures into
RemoteError messages a user can act on."""

from __future__ import annotations

import json

import httpx
import pytest

from sre_agent.api.client import get_json, post_json
from sre_agent.config import Config
from sre_agent.errors import RemoteError

CONFIG = Config(url="http://sre-agent.test:4318/", token="s3cret")


def _client(handler: object) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


def test_get_and_post_send_token_and_return_the_object() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(201, json={"echo": json.loads(request.content)})
        return httpx.Response(200, json={"spans": 3, "q": request.url.params.get("trace_id")})

    with _client(handler) as client:
        assert get_json(CONFIG, "/api/v1/spans", {"trace_id": "ab"}, client=client) == {"spans": 3, "q": "ab"}
        assert post_json(CONFIG, "api/v1/deploys", {"version": "v2"}, client=client) == {"echo": {"version": "v2"}}
    assert [str(r.url) for r in seen] == [
        "http://sre-agent.test:4318/api/v1/spans?trace_id=ab",
        "http://sre-agent.test:4318/api/v1/deploys",
    ]
    assert all(r.headers["authorization"] == "Bearer s3cret" for r in seen)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(401, json={"error": "missing or invalid bearer token"}), "needs a valid token"),
        (httpx.Response(503, json={"error": "the server is shutting down"}), "HTTP 503: the server is shutting down"),
        (httpx.Response(500, text="Internal Server Error"), "HTTP 500: Internal Server Error"),
        (httpx.Response(200, text="<html>"), "not JSON"),
        (httpx.Response(200, json=[1, 2]), "expected a JSON object"),
    ],
)
def test_error_answers_become_readable_remote_errors(response: httpx.Response, message: str) -> None:
    with _client(lambda request: response) as client, pytest.raises(RemoteError, match=message):
        get_json(CONFIG, "/api/v1/status", client=client)


def test_unreachable_server_and_missing_url() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with (
        _client(refuse) as client,
        pytest.raises(RemoteError, match=r"cannot reach sre-agent at http://sre-agent\.test"),
    ):
        get_json(CONFIG, "/api/v1/status", client=client)
    with pytest.raises(RemoteError, match="--url"):
        get_json(Config(), "/api/v1/status")
