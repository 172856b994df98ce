"""Property: whatever Argo Rollouts, Flagger or anyone else sends the API routes, the answer is never 5xx.

The canary verdict routes, the deploy and span routes and the console's explore routes, driven in
process through the ASGI app over a real store with a regression in it (so valid-looking requests
reach the statistics, not only the argument checks).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sre_agent.api.server import build_app, open_context
from sre_agent.config import Config

KEYS = (
    "baseline_version", "candidate_version", "baseline", "candidate", "deploy_at", "window", "since_last_deploy",
    "service", "where", "slo", "max_regression", "dry_run", "format", "metric", "trace_id", "limit", "dimension",
)  # fmt: skip
PLAUSIBLE = st.sampled_from(
    ["v1", "v2", "v9", "ttft_p99=3s", "error_rate=1%", "ttft_p99=fast", "2026-05-28T20:00:00Z", "1780000000",
     "10m", "-5s", "true", "false", "host_name=gpu-1", "e2e", "json", "..", "", "0", "1e400"]
)  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12) | PLAUSIBLE,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
VALID = {"baseline_version": "v1", "candidate_version": "v2", "slo": "ttft_p99=3s"}
# Half the examples start from a valid request with a key or two changed: those get past the
# argument checks and into the windows and the statistics.
near_valid = st.dictionaries(st.sampled_from(KEYS), PLAUSIBLE | st.text(max_size=12), max_size=2).map(
    lambda changes: {**VALID, **changes}
)
params = near_valid | st.dictionaries(
    st.sampled_from(KEYS) | st.text(max_size=6), PLAUSIBLE | st.text(max_size=12), max_size=6
)
bodies = st.one_of(
    st.dictionaries(st.sampled_from(KEYS), json_values, max_size=2).map(lambda changes: {**VALID, **changes}),
    st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6),
    st.fixed_dictionaries(  # a Flagger webhook
        {"name": st.text(max_size=8), "phase": st.sampled_from(["Progressing", "Promoting", "x"]) | json_values},
        optional={"namespace": json_values, "checksum": json_values, "metadata": near_valid | json_values},
    ),
    json_values,
)
ROUTES = (
    ("GET", "/api/v1/canary"),
    ("POST", "/api/v1/canary"),
    ("POST", "/api/v1/canary/webhook"),
    ("POST", "/api/v1/canary/evaluations"),
    ("GET", "/api/v1/canary/evaluations/x"),
    ("GET", "/api/v1/deploys"),
    ("POST", "/api/v1/deploys"),
    ("GET", "/api/v1/spans"),
    ("GET", "/api/v1/status"),
    *(("GET", f"/api/v1/explore/{name}") for name in ("overview", "timeline", "stages", "slices", "exemplars")),
    ("GET", "/api/v1/explore/waterfall"),
)


def test_api_routes_never_5xx(regression_store: Path, tmp_path: Path) -> None:
    db = tmp_path / "api.duckdb"
    shutil.copy(regression_store, db)
    loop = asyncio.new_event_loop()
    with open_context(Config(db=str(db))) as ctx:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(ctx)), base_url="http://fuzz")

        def send(method: str, path: str, query: dict[str, str], body: Any, raw: bool) -> httpx.Response:
            content = json.dumps(body).encode() if not raw else str(body).encode()
            request = client.request(
                method, path, params=query, content=content if method == "POST" else None,
                headers={"content-type": "application/json"},
            )  # fmt: skip
            return loop.run_until_complete(request)

        @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(route=st.sampled_from(ROUTES), query=params, body=bodies, raw=st.booleans())
        def check(route: tuple[str, str], query: dict[str, str], body: Any, raw: bool) -> None:
            response = send(*route, query, body, raw)
            assert response.status_code < 500, (route, query, body, response.text[:300])

        try:
            check()
        finally:
            loop.run_until_complete(client.aclose())
            loop.close()
