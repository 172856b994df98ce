"""Replay telemetry: span shapes and ids, vLLM attribute sets, OTLP JSON encoding, and round trips
through `sre-agent ingest`, the store output and the SDK exporters into a running `sre-agent serve`."""

from __future__ import annotations

import base64
import dataclasses
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from sre_agent.cli import main
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import spans_from_proto
from sre_agent.replays.engine import Seq
from sre_agent.replays.gateway import Attempt, RequestRecord
from sre_agent.replays.outputs import (
    MemoryOutput,
    OtlpEndpointOutput,
    StoreOutput,
    metrics_to_otlp_json,
    spans_to_otlp_json,
)
from sre_agent.replays.replay import replay
from sre_agent.replays.scenario import load_scenario
from sre_agent.replays.telemetry import SpanBuilder
from sre_agent.replays.workload import WorkloadRequest
from sre_agent.store.embedded import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receiver"))
from receiver_harness import start_serve

V1_LATENCIES = {
    "gen_ai.latency.time_in_queue",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.e2e",
    "gen_ai.latency.time_in_model_prefill",
    "gen_ai.latency.time_in_model_decode",
    "gen_ai.latency.time_in_model_inference",
}


@pytest.fixture(scope="module")
def flaky() -> tuple[Any, MemoryOutput]:
    """A small replay with retries and errors (replica-2 answers 503 after the deploy)."""
    scenario = load_scenario("retry_amplification_flaky_replica").scaled(0.15)
    out = MemoryOutput()
    return replay(scenario, out), out


def test_every_trace_has_the_gateway_dependency_attempt_engine_shape(flaky: tuple[Any, MemoryOutput]) -> None:
    result, out = flaky
    by_trace: dict[int, list[ReadableSpan]] = {}
    for span in out.spans:
        assert span.context is not None
        by_trace.setdefault(span.context.trace_id, []).append(span)
    assert len(by_trace) == len(result.records)
    retried = 0
    for spans in by_trace.values():
        ids = {s.context.span_id: s for s in spans if s.context is not None}
        assert len(ids) == len(spans)
        roots = [s for s in spans if s.parent is None]
        assert len(roots) == 1
        root = roots[0]
        assert root.kind is SpanKind.SERVER
        assert root.resource.attributes["service.name"] == "llm-gateway"
        assert {"tenant.id", "http.route", "gen_ai.request.model"} <= set(root.attributes or {})
        attempts = [s for s in spans if s.kind is SpanKind.CLIENT and s.name == "POST"]
        engines = [s for s in spans if s.name == "llm_request"]
        deps = [s for s in spans if s.kind is SpanKind.CLIENT and s not in attempts]
        assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in attempts + deps)
        for i, attempt in enumerate(sorted(attempts, key=lambda s: s.start_time or 0)):
            attrs = attempt.attributes or {}
            assert attrs.get("http.request.resend_count") == (i if i else None)
            failed = attempt.status.status_code is StatusCode.ERROR
            assert failed == ("error.type" in attrs)
            children = [e for e in engines if e.parent is not None and e.parent.span_id == attempt.context.span_id]
            assert len(children) == (0 if failed else 1)  # no llm_request for rejected or aborted attempts
        retried += len(attempts) > 1
        for engine in engines:
            assert engine.kind is SpanKind.SERVER
            assert engine.instrumentation_scope is not None
            assert engine.instrumentation_scope.name == "vllm.llm_engine"
            res = engine.resource.attributes
            assert res["service.name"] == "vllm"
            assert res["host.name"] == res["service.instance.id"]
            attrs = dict(engine.attributes or {})
            assert set(attrs) >= V1_LATENCIES
            assert "gen_ai.response.model" not in attrs
            assert "gen_ai.latency.time_in_scheduler" not in attrs
            e2e_ns = (engine.end_time or 0) - (engine.start_time or 0)
            assert attrs["gen_ai.latency.e2e"] == pytest.approx(e2e_ns / 1e9, abs=2e-9)
            assert attrs["gen_ai.latency.time_in_queue"] + attrs["gen_ai.latency.time_in_model_prefill"] == (
                pytest.approx(attrs["gen_ai.latency.time_to_first_token"])
            )
            assert attrs["gen_ai.latency.time_in_model_inference"] <= attrs["gen_ai.latency.e2e"] + 1e-9
            assert attrs["gen_ai.usage.completion_tokens"] >= 1
    assert retried > 10


def _record(temperature: float) -> RequestRecord:
    req = WorkloadRequest(7, 1.0, "acme", "/v1/chat/completions", 100, 20, 256, temperature, 0.0, [("x", 100)], 7)
    seq = Seq(7, req.chain, 100, 20, max_tokens=256, arrival_s=1.01)
    seq.scheduled_s, seq.first_token_s, seq.last_token_s, seq.finish_s, seq.generated = 1.02, 1.05, 1.3, 1.3, 20
    seq.finish_reason = "stop"
    attempt = Attempt(0, "replica-1", "v1", 1.0, 1.31, "ok", None, 200, seq)
    return RequestRecord(req, "m", "gw", 0.99, 1.32, [], [attempt], "ok")


def test_v1_sets_sampling_params_only_when_truthy_and_v0_always() -> None:
    v1 = SpanBuilder(0, seed=1, attribute_set="v1").build(_record(temperature=0.0))[-1].attributes or {}
    assert "gen_ai.request.temperature" not in v1
    assert "gen_ai.request.top_p" not in v1
    assert v1["gen_ai.request.max_tokens"] == 256
    assert v1["gen_ai.request.n"] == 1
    v0 = SpanBuilder(0, seed=1, attribute_set="v0").build(_record(temperature=0.0))[-1].attributes or {}
    assert v0["gen_ai.request.temperature"] == 0.0
    assert v0["gen_ai.response.model"] == "m"
    assert "gen_ai.latency.time_in_scheduler" in v0
    assert not V1_LATENCIES - {
        "gen_ai.latency.time_in_queue",
        "gen_ai.latency.time_to_first_token",
        "gen_ai.latency.e2e",
    } & set(v0)


def test_sglang_set_is_the_root_request_span_and_normalises_with_a_derived_queue() -> None:
    span = SpanBuilder(0, seed=1, attribute_set="sglang").build(_record(temperature=0.0))[-1]
    attrs = span.attributes or {}
    assert span.name.startswith(" Req ")  # unified mode: the role is empty
    assert span.kind is SpanKind.INTERNAL
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "sglang server"
    assert span.resource.attributes["service.name"] == "sglang"
    assert attrs["rid"] == attrs["gen_ai.request.id"]
    assert attrs["gen_ai.response.finish_reasons"] == '["stop"]'
    assert "gen_ai.latency.time_in_queue" not in attrs
    assert "gen_ai.request.temperature" not in attrs  # only when truthy
    request = ExportTraceServiceRequest.FromString(encode_spans([span]).SerializeToString())
    (row,) = spans_from_proto(request, normaliser=Normaliser(hash_key=b"k")).table.to_pylist()
    assert row["is_engine"]
    assert row["finish_reason"] == "stop"
    assert row["queue_s"] == pytest.approx(1.02 - 1.01)  # arrival to scheduling, from ttft - prefill
    assert row["ttft_s"] == pytest.approx(1.05 - 1.01)


def test_sglang_metrics_carry_sglang_names_and_a_recent_hit_rate(tmp_path: Path) -> None:
    scenario = dataclasses.replace(load_scenario("prefix_cache_disabled").scaled(0.1), attribute_set="sglang")
    out = MemoryOutput()
    replay(scenario, out)
    names = {m.name for batch in out.metrics for rm in batch.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}  # fmt: skip
    expected = {"sglang:num_running_reqs", "sglang:token_usage", "sglang:cached_tokens_total", "sglang:cache_hit_rate"}
    assert expected <= names
    assert not {n for n in names if n.startswith("vllm:")}
    db = tmp_path / "sglang.duckdb"
    replay(scenario, StoreOutput.open(db))
    with Store.open(db, read_only=True) as store:
        rates = store.connection.execute(
            "SELECT time_ns >= (SELECT min(time_ns) FROM deploys) AS after, avg(value) FROM metric_points "
            "WHERE name = 'sglang:cache_hit_rate' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    # Caching is switched off at the deploy: the gauge drops to zero instead of keeping a lifetime mean.
    assert [after for after, _ in rates] == [False, True]
    assert rates[0][1] > 0.1
    assert rates[1][1] == 0.0


def _hex_to_b64(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {
            k: (
                base64.b64encode(bytes.fromhex(v)).decode()
                if k in ("traceId", "spanId", "parentSpanId")
                else _hex_to_b64(v)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_hex_to_b64(v) for v in obj]
    return obj


def test_json_lines_encoding_equals_the_sdk_protobuf_encoding(flaky: tuple[Any, MemoryOutput]) -> None:
    _, out = flaky
    spans = out.spans[:500]
    parsed = json_format.ParseDict(_hex_to_b64(spans_to_otlp_json(spans)), ExportTraceServiceRequest())
    assert parsed == encode_spans(spans)
    for data in out.metrics[:3]:
        parsed_m = json_format.ParseDict(metrics_to_otlp_json(data), ExportMetricsServiceRequest())
        assert parsed_m == encode_metrics(data)


def _store_counts(db: Path) -> dict[str, Any]:
    with Store.open(db, read_only=True) as store:
        con = store.connection
        spans = con.execute("SELECT count(*), count(*) FILTER (WHERE is_engine) FROM spans").fetchone()
        names = dict(con.execute("SELECT name, count(*) FROM metric_points GROUP BY name").fetchall())
        versions = con.execute("SELECT DISTINCT service_name, service_version FROM spans ORDER BY 1, 2").fetchall()
        nulls = con.execute(
            "SELECT count(*) FROM spans WHERE is_engine AND (ttft_s IS NULL OR tpot_s IS NULL)"
        ).fetchone()
    assert spans is not None
    assert nulls is not None
    return {"spans": spans[0], "engine": spans[1], "metrics": names, "versions": versions, "engine_nulls": nulls[0]}


def test_jsonl_round_trips_through_ingest_and_matches_the_store_output(tmp_path: Path) -> None:
    jsonl = tmp_path / "incident.jsonl.gz"
    assert main(["replay", "none_version_bump", "--scale", "0.05", "--out", str(jsonl)]) == 0
    assert main(["ingest", "--db", str(tmp_path / "ingested.duckdb"), str(jsonl)]) == 0
    assert main(["replay", "none_version_bump", "--scale", "0.05", "--db", str(tmp_path / "direct.duckdb")]) == 0
    ingested = _store_counts(tmp_path / "ingested.duckdb")
    direct = _store_counts(tmp_path / "direct.duckdb")
    assert ingested == direct
    assert ingested["engine"] > 150
    assert ingested["spans"] > 4 * ingested["engine"] * 0.9
    assert ingested["versions"] == [("llm-gateway", "gw-1"), ("vllm", "2026.01.14-1"), ("vllm", "2026.01.15-1")]
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:iteration_tokens",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
    ):
        assert ingested["metrics"].get(name, 0) > 0, name
    assert ingested["engine_nulls"] == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sdk_exporters_into_serve_reject_nothing(protocol: str, tmp_path: Path) -> None:
    scenario = load_scenario("errors_http_500").scaled(0.03)
    expected = MemoryOutput()
    replay(scenario, expected)
    server = start_serve(tmp_path / "served.duckdb")
    try:
        url = server.http_url if protocol == "http" else f"grpc://{server.grpc_target}"
        output = OtlpEndpointOutput(url)
        replay(scenario, output)
        assert output.failed_batches == 0
    finally:
        assert server.stop() == 0
    counts = _store_counts(tmp_path / "served.duckdb")
    assert counts["spans"] == len(expected.spans)
    assert counts["engine"] == sum(s.name == "llm_request" for s in expected.spans)
    scrapes = Counter(
        m.name for data in expected.metrics for rm in data.resource_metrics for m in rm.scope_metrics[0].metrics
    )
    assert counts["metrics"]["vllm:kv_cache_usage_perc"] == scrapes["vllm:kv_cache_usage_perc"]


def test_same_seed_same_bytes_other_seed_other_traffic(tmp_path: Path) -> None:
    from sre_agent.replays.outputs import JsonLinesOutput

    scenario = load_scenario("retry_amplification_flaky_replica").scaled(0.03)
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"]
    for path, seed in zip(paths, (5, 5, 6), strict=True):
        replay(dataclasses.replace(scenario, seed=seed), JsonLinesOutput(path))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()
