"""The OTel SDK's own OTLP exporters (HTTP and gRPC, traces and metrics) against a real
`sre-agent serve` subprocess; the data must then be in the DuckDB file with canonical columns."""

from __future__ import annotations

from pathlib import Path

import duckdb
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from receiver_harness import start_serve

RESOURCE = {"service.name": "vllm-server", "service.version": "0.11.0", "tenant.id": "acme", "host.name": "gpu-7"}


def _vllm_spans(count: int, transport: str) -> list[ReadableSpan]:
    """``count`` llm_request spans recorded by a real SDK tracer."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("vllm.llm_engine")
    for i in range(count):
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER) as span:
            span.set_attributes(
                {
                    "gen_ai.request.id": f"{transport}-{i}",
                    "gen_ai.usage.prompt_tokens": 100 + i,
                    "gen_ai.usage.completion_tokens": 11,
                    "gen_ai.latency.time_in_queue": 0.01,
                    "gen_ai.latency.time_to_first_token": 0.2,
                    "gen_ai.latency.e2e": 1.2,
                    "gen_ai.latency.time_in_model_prefill": 0.15,
                    "gen_ai.latency.time_in_model_decode": 1.0,
                }
            )
    provider.shutdown()
    return list(memory.get_finished_spans())


def _vllm_metrics(engine: str) -> MetricsData:
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        resource=Resource.create({**RESOURCE, "service.instance.id": engine}), metric_readers=[reader]
    )
    meter = provider.get_meter("vllm")
    meter.create_counter("vllm_prefix_cache_hits_total").add(42, {"model_name": "llama", "engine": engine})
    meter.create_histogram("vllm_time_to_first_token_seconds", unit="s").record(0.25, {"model_name": "llama"})
    meter.create_up_down_counter("vllm_num_requests_running").add(3, {"model_name": "llama"})
    data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    return data


def test_sdk_exporters_over_http_and_grpc_land_in_duckdb(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    server = start_serve(db)
    try:
        assert server.grpc_target is not None
        http_spans, grpc_spans = _vllm_spans(30, "http"), _vllm_spans(20, "grpc")
        http_exporter = HttpSpanExporter(endpoint=f"{server.http_url}/v1/traces", timeout=10)
        # The form vLLM documents: --otlp-traces-endpoint grpc://HOST:4317 (passed unchanged to the exporter).
        grpc_exporter = GrpcSpanExporter(endpoint=f"grpc://{server.grpc_target}", insecure=True, timeout=10)
        assert http_exporter.export(http_spans) == SpanExportResult.SUCCESS
        assert grpc_exporter.export(grpc_spans) == SpanExportResult.SUCCESS
        http_metrics = HttpMetricExporter(endpoint=f"{server.http_url}/v1/metrics", timeout=10)
        grpc_metrics = GrpcMetricExporter(endpoint=server.grpc_target, insecure=True, timeout=10)
        assert http_metrics.export(_vllm_metrics("http")) == MetricExportResult.SUCCESS
        assert grpc_metrics.export(_vllm_metrics("grpc")) == MetricExportResult.SUCCESS
        for exporter in (http_exporter, grpc_exporter, http_metrics, grpc_metrics):
            exporter.shutdown()
    finally:
        assert server.stop() == 0, server.stderr

    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT attributes['gen_ai.request.id'], name, kind, is_engine, service_name, service_version, tenant_id, "
        "host_name, scope_name, input_tokens, output_tokens, queue_s, ttft_s, prefill_s, decode_s, e2e_s, tpot_s, "
        "duration_s FROM spans ORDER BY 1"
    ).fetchall()
    assert len(rows) == 50
    sent = {f"http-{i}" for i in range(30)} | {f"grpc-{i}" for i in range(20)}
    assert {r[0] for r in rows} == sent
    for row in rows:
        assert row[1:9] == ("llm_request", "server", True, "vllm-server", "0.11.0", "acme", "gpu-7", "vllm.llm_engine")
        assert row[9] >= 100
        assert row[10:16] == (11, 0.01, 0.2, 0.15, 1.0, 1.2)
        assert abs(row[16] - 0.1) < 1e-9  # tpot = decode / (output_tokens - 1)
        assert row[17] is not None
        assert row[17] >= 0
    names = con.execute(
        "SELECT name, kind, service_instance, count(*) FROM metric_points GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    con.close()
    # The SDK forbids ':' in instrument names; the Prometheus-style `_total` suffix is trimmed.
    expected = []
    for engine in ("grpc", "http"):
        expected += [
            ("vllm_num_requests_running", "sum", engine, 1),
            ("vllm_prefix_cache_hits", "sum", engine, 1),
            ("vllm_time_to_first_token_seconds", "histogram", engine, 1),
        ]
    assert sorted(names) == sorted(expected)
