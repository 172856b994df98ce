"""``--url`` mode: the explore routes on a real ``sre-agent serve``, and the live console over them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from receiver_harness import ServeProcess
from tui_helpers import screen_text, wait_until
from tui_synth import DEPLOY_NS

from sre_agent.analysis import explore
from sre_agent.analysis.selection import Selection
from sre_agent.api import explore_routes as explore_api
from sre_agent.config import Config
from sre_agent.tui.app import IncidentApp
from sre_agent.tui.source import LocalSource, RemoteSource
from sre_agent.tui.widgets import tile_lines

SINCE = Selection(mode="since_last_deploy")


class SwitchableTransport(httpx.HTTPTransport):
    """The real HTTP transport, plus a switch that makes the server look unreachable."""

    def __init__(self) -> None:
        # No keep-alive: a connection never outlives its request, whichever thread closes the client.
        super().__init__(limits=httpx.Limits(max_keepalive_connections=0))
        self.down = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused (test switch)", request=request)
        return super().handle_request(request)


def engine_spans_otlp(count: int, start_ns: int) -> dict[str, Any]:
    """``count`` failed vLLM request spans on gpu-1 at ``start_ns`` (OTLP JSON)."""
    spans = [
        {
            "traceId": f"{0xABC0000 + i:032x}",
            "spanId": f"{0xABC0000 + i:016x}",
            "name": "llm_request",
            "kind": 2,
            "startTimeUnixNano": str(start_ns + i * 1_000_000),
            "endTimeUnixNano": str(start_ns + i * 1_000_000 + 2_000_000_000),
            "status": {"code": 2},
            "attributes": [
                {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 2.0}},
                {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.5}},
                {"key": "error.type", "value": {"stringValue": "EngineDeadError"}},
            ],
        }
        for i in range(count)
    ]
    resource = [
        {"key": k, "value": {"stringValue": v}}
        for k, v in (("service.name", "vllm"), ("service.version", "v2"), ("host.name", "gpu-1"))
    ]
    return {"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [{"spans": spans}]}]}


def test_explore_routes_answer_what_local_queries_answer(served_synth: ServeProcess, synth_db: Path) -> None:
    remote = RemoteSource(Config(url=served_synth.url))
    local = LocalSource(str(synth_db))
    try:
        assert explore_api.to_json_dict(remote.overview(SINCE, {"ttft": 5.0})) == explore_api.to_json_dict(
            local.overview(SINCE, {"ttft": 5.0})
        )
        assert remote.timeline(SINCE, "ttft", 30) == local.timeline(SINCE, "ttft", 30)
        assert remote.stages(SINCE, "e2e") == local.stages(SINCE, "e2e")
        assert remote.slices(SINCE, "e2e") == local.slices(SINCE, "e2e")
        narrowed = Selection(mode="since_last_deploy", where=(("host_name", "gpu-3"),))
        assert remote.slices(narrowed, "e2e") == local.slices(narrowed, "e2e")
        exemplars = remote.exemplars(SINCE, "e2e")
        assert exemplars == local.exemplars(SINCE, "e2e")
        trace = exemplars[-1]
        assert remote.waterfall(trace.trace_id, trace.start_ns) == local.waterfall(trace.trace_id, trace.start_ns)
        assert [(v.service, v.version, v.requests) for v in remote.versions(None)] == [
            (v.service, v.version, v.requests) for v in local.versions(None)
        ]
        assert [v.version for v in remote.versions("vllm")] == ["v1", "v2"]
    finally:
        remote.close()
        local.close()


def test_explore_routes_reject_bad_parameters(served_synth: ServeProcess) -> None:
    base = served_synth.url + "/api/v1/explore"
    with httpx.Client(timeout=30) as client:
        for path, params in (
            ("timeline", {"metric": "nope"}),
            ("timeline", {"buckets": "1"}),
            ("overview", {"slo": "latency=3"}),
            ("overview", {"deploy_at": "not a time"}),
            ("waterfall", {"trace_id": "xyz"}),
        ):
            response = client.get(f"{base}/{path}", params=params)
            assert response.status_code == 400, (path, params, response.text)
            assert response.json()["error"]
        ok = client.get(f"{base}/overview", params=[("where", "host_name=gpu-3"), ("slo", "ttft=20")])
        assert ok.status_code == 200
        body = ok.json()
        assert body["requests_candidate"] == 2500
        assert body["tiles"][0]["status"] == "regressed"  # over the baseline, within the 20 s target


async def test_live_console_refreshes_and_shows_a_banner_when_unreachable(
    served_synth: ServeProcess, synth_db: Path, tmp_path: Path
) -> None:
    transport = SwitchableTransport()
    client = httpx.Client(transport=transport, timeout=30)
    source = RemoteSource(Config(url=served_synth.url), client=client)
    app = IncidentApp(source, refresh_s=1.0, export_dir=tmp_path)
    con = duckdb.connect(str(synth_db), read_only=True)
    expected = explore.overview(con, explore.resolve_scope(con, SINCE))
    con.close()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(
            lambda: app.overview is not None and app.report is not None and app.top_slice != "", 120, pilot.pause
        )
        await pilot.pause()
        text = screen_text(app)
        for tile in expected.tiles:
            assert tile_lines(tile)[1] in text
        assert app.report is not None, app.report_reason  # POST /api/v1/diagnose on the server
        assert app.report["findings"]

        # New data arrives through the receiver; the interval picks it up without a key press.
        with httpx.Client(timeout=30) as otlp:
            sent = otlp.post(served_synth.url + "/v1/traces", json=engine_spans_otlp(40, DEPLOY_NS + 60 * 10**9))
        assert sent.status_code == 200, sent.text
        await wait_until(
            lambda: app.overview is not None and app.overview.requests_candidate == expected.requests_candidate + 40,
            60,
            pilot.pause,
        )

        transport.down = True
        await wait_until(lambda: app.unreachable is not None, 30, pilot.pause)
        await pilot.pause()
        text = screen_text(app)
        assert "unreachable" in text
        assert "press r to retry" in text
        assert tile_lines(expected.tiles[0])[1] in text  # the last figures stay on screen
        await pilot.press("f")  # keys keep working while it is down
        assert app.query_one("#findings-tree").display

        transport.down = False
        await pilot.press("r")
        await wait_until(lambda: app.unreachable is None, 30, pilot.pause)
        await pilot.pause()
        assert "unreachable" not in screen_text(app)
        transport.down = True  # let in-flight requests end before the client closes
        await app.workers.wait_for_complete()
    source.close()
    client.close()


def test_remote_source_reports_an_unreachable_server_as_such() -> None:
    from sre_agent.errors import RemoteError

    source = RemoteSource(Config(url="http://127.0.0.1:9"), timeout_s=2)
    try:
        with pytest.raises(RemoteError, match="cannot reach") as caught:
            source.overview(SINCE, {})
        assert isinstance(caught.value.__cause__, httpx.TransportError)
    finally:
        source.close()
