"""StoreSpanExporter / StoreMetricExporter with the real OTel SDK."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import Status, StatusCode

from sre_agent.ingest.exporter import StoreMetricExporter, StoreSpanExporter
from sre_agent.ingest.normalise import Normaliser
from sre_agent.store.embedded import Store

RESOURCE = Resource.create({"service.name": "gateway", "service.version": "1.2.3"})


def _emit(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("sre-agent-test")
    with tracer.start_as_current_span("gateway request") as parent:
        parent.set_attribute("tenant.id", "acme")
        with tracer.start_as_current_span("llm_request") as span:
            span.set_attribute("gen_ai.usage.prompt_tokens", 100)
            span.set_attribute("gen_ai.usage.completion_tokens", 21)
            span.set_attribute("gen_ai.latency.time_in_model_decode", 2.0)
            span.set_attribute("gen_ai.latency.e2e", 2.5)
            span.set_attribute("gen_ai.input.messages", "top secret prompt")
        with tracer.start_as_current_span("retry") as failed:
            failed.set_attribute("http.request.resend_count", 1)
            failed.set_status(Status(StatusCode.ERROR, "503"))


@pytest.mark.parametrize("processor", [SimpleSpanProcessor, BatchSpanProcessor])
def test_tracer_provider_writes_spans_to_a_real_file(processor: type, tmp_path: Path) -> None:
    path = tmp_path / "exported.duckdb"
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(processor(StoreSpanExporter(path)))
    _emit(provider)
    provider.shutdown()  # flushes the batch processor and closes the store the exporter opened
    with Store.open(path, read_only=True) as store:
        rows = store.connection.execute(
            "SELECT name, parent_span_id IS NULL, is_engine, output_tokens, tpot_s, attempt, error_type, "
            "service_version, attributes['gen_ai.input.messages'] FROM spans ORDER BY name"
        ).fetchall()
    assert [r[0] for r in rows] == ["gateway request", "llm_request", "retry"]
    gateway, engine, retry = rows
    assert gateway[1] is True
    assert engine[1] is False
    assert engine[2:5] == (True, 21, 0.1)
    assert retry[5:7] == (1, "error")
    assert {r[7] for r in rows} == {"1.2.3"}
    assert engine[8].startswith("redacted:len=17:")


def test_borrowed_store_stays_open_and_lifecycle(tmp_path: Path) -> None:
    with Store.open(tmp_path / "borrowed.duckdb") as store:
        exporter = StoreSpanExporter(store, normaliser=Normaliser(keep_content=True, hash_key=b"k"))
        provider = TracerProvider(resource=RESOURCE)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        _emit(provider)
        assert exporter.force_flush(1000) is True
        exporter.shutdown()
        exporter.shutdown()  # safe twice
        assert exporter.export([]) is SpanExportResult.FAILURE
        value = store.connection.execute(
            "SELECT attributes['gen_ai.input.messages'] FROM spans WHERE name = 'llm_request'"
        ).fetchone()
        assert value == ("top secret prompt",)  # keep_content honoured
        assert store.counts()["spans"] == 3  # still usable: the exporter did not close it


def test_export_failure_is_reported_not_raised(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "closed.duckdb")
    exporter = StoreSpanExporter(store)
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store.close()
    with provider.get_tracer("t").start_as_current_span("x"):
        pass  # the processor calls export; it must not raise
    span = provider.get_tracer("t").start_span("y")
    span.end()
    assert exporter.export([span]) is SpanExportResult.FAILURE  # type: ignore[list-item]


def test_metric_exporter_writes_points(tmp_path: Path) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("m")
    counter = meter.create_counter("gateway.prompt_tokens_total")
    counter.add(10, {"model_name": "llama"})
    meter.create_histogram("gen_ai.server.request.duration", unit="s").record(1.2, {"model_name": "llama"})
    data = reader.get_metrics_data()
    assert data is not None
    path = tmp_path / "metrics.duckdb"
    exporter = StoreMetricExporter(path)
    assert exporter.export(data) is MetricExportResult.SUCCESS
    exporter.shutdown()
    exporter.shutdown()
    assert exporter.export(data) is MetricExportResult.FAILURE
    provider.shutdown()
    with Store.open(path, read_only=True) as store:
        rows = dict(store.connection.execute("SELECT name, kind FROM metric_points").fetchall())
    assert rows == {"gateway.prompt_tokens": "sum", "gen_ai.server.request.duration": "histogram"}
