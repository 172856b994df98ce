"""Bearer-token auth and tenant scoping, through the ASGI app and over real gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult
from receiver_harness import start_serve, trace_hex, vllm_request
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sre_agent.api.server import ApiContext, build_app, open_context
from sre_agent.config import Config
from sre_agent.errors import StoreError

ADMIN = "admin-secret"
TENANTS = {"acme-token": "acme", "globex-token": "globex"}
PROTOBUF = {"content-type": "application/x-protobuf"}


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _metrics_request(tenant: str) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    kv = resource_metrics.resource.attributes.add(key="tenant.id")
    kv.value.string_value = tenant
    metric = resource_metrics.scope_metrics.add().metrics.add(name="vllm:num_requests_running")
    point = metric.gauge.data_points.add(time_unix_nano=1_700_000_000_000_000_000, as_double=2.0)
    point.attributes.add(key="model_name").value.string_value = "llama"
    return request


# An extra route module, as other features will add them: it never mentions tenants.
_LEAKY_SQL = "SELECT count(*) FROM spans"


def routes(ctx: ApiContext) -> list[Route]:
    def count_everything(request: Request) -> JSONResponse:
        with ctx.read_cursor() as cur:
            row = cur.execute(_LEAKY_SQL).fetchone()
            main_row = cur.execute("SELECT count(*) FROM main.spans").fetchone()
            # The stored table the diagnosis scans read (resolve.SCAN) is scoped as well.
            stored_row = cur.execute("SELECT count(*) FROM span_rows").fetchone()
        return JSONResponse(
            {
                "spans": row[0] if row else None,
                "main": main_row[0] if main_row else None,
                "span_rows": stored_row[0] if stored_row else None,
            }
        )

    return [Route("/api/v1/test-count", count_everything)]


@pytest.fixture
def context(tmp_path: Path) -> Iterator[ApiContext]:
    config = Config(db=str(tmp_path / "auth.duckdb"), token=ADMIN, tenant_tokens=TENANTS)
    with open_context(config) as ctx:
        yield ctx


@pytest.fixture
async def client(context: ApiContext) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(context, ("sre_agent.api.routes", __name__))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        yield http


async def _ingest_two_tenants(client: httpx.AsyncClient) -> None:
    for first, tenant in ((0, "acme"), (100, "globex")):
        body = vllm_request(10 + first // 10, first_index=first, tenant=tenant).SerializeToString()
        response = await client.post("/v1/traces", content=body, headers={**PROTOBUF, **_bearer(ADMIN)})
        assert response.status_code == 200
        metrics = _metrics_request(tenant).SerializeToString()
        response = await client.post("/v1/metrics", content=metrics, headers={**PROTOBUF, **_bearer(ADMIN)})
        assert response.status_code == 200


async def test_missing_or_wrong_token_is_401(client: httpx.AsyncClient) -> None:
    body = vllm_request(1).SerializeToString()
    for headers in ({}, _bearer("nope"), {"authorization": f"Basic {ADMIN}"}):
        response = await client.post("/v1/traces", content=body, headers={**PROTOBUF, **headers})
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.headers["content-type"] == "application/x-protobuf"
        for path in ("/api/v1/status", "/api/v1/deploys", "/metrics"):
            assert (await client.get(path, headers=headers)).status_code == 401
    assert (await client.get("/healthz")).status_code == 200


async def test_tenant_token_reads_only_its_tenant(client: httpx.AsyncClient) -> None:
    await _ingest_two_tenants(client)
    admin = (await client.get("/api/v1/status", headers=_bearer(ADMIN))).json()
    assert (admin["spans"], admin["metric_points"]) == (30, 2)
    acme = (await client.get("/api/v1/status", headers=_bearer("acme-token"))).json()
    assert (acme["spans"], acme["metric_points"]) == (10, 1)
    globex_trace = {"trace_id": trace_hex(100)}
    spans = await client.get("/api/v1/spans", params=globex_trace, headers=_bearer("acme-token"))
    assert spans.status_code == 200
    assert spans.json()["spans"] == []
    own = await client.get("/api/v1/spans", params={"trace_id": trace_hex(0)}, headers=_bearer("acme-token"))
    assert [s["tenant_id"] for s in own.json()["spans"]] == ["acme"]
    by_admin = await client.get("/api/v1/spans", params=globex_trace, headers=_bearer(ADMIN))
    assert [s["tenant_id"] for s in by_admin.json()["spans"]] == ["globex"]
    # A route module that forgets about tenants is still scoped, even via `main.spans`.
    leaky = (await client.get("/api/v1/test-count", headers=_bearer("globex-token"))).json()
    assert leaky == {"spans": 20, "main": 20, "span_rows": 20}


async def test_tenant_token_cannot_write(client: httpx.AsyncClient) -> None:
    body = vllm_request(1).SerializeToString()
    response = await client.post("/v1/traces", content=body, headers={**PROTOBUF, **_bearer("acme-token")})
    assert response.status_code == 403
    marker = {"service": "vllm-server", "version": "v2"}
    assert (await client.post("/api/v1/deploys", json=marker, headers=_bearer("acme-token"))).status_code == 403
    created = await client.post("/api/v1/deploys", json=marker, headers=_bearer(ADMIN))
    assert created.status_code == 201
    listed = (await client.get("/api/v1/deploys", headers=_bearer("acme-token"))).json()["deploys"]
    assert [(d["service"], d["version"], d["source"]) for d in listed] == [("vllm-server", "v2", "mark")]


def test_read_cursor_outside_a_request_must_name_the_tenant(context: ApiContext) -> None:
    with pytest.raises(StoreError, match="must name the tenant"), context.read_cursor():
        pass
    with context.read_cursor("acme") as cur:
        assert cur.execute("SELECT count(*) FROM spans").fetchone() == (0,)


def test_grpc_requires_the_bearer_token(tmp_path: Path) -> None:
    server = start_serve(tmp_path / "grpc-auth.duckdb", "--token", ADMIN)
    try:
        assert server.grpc_target is not None
        with grpc.insecure_channel(server.grpc_target) as channel:
            export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=ExportTraceServiceRequest.SerializeToString,
                response_deserializer=lambda raw: raw,
            )
            with pytest.raises(grpc.RpcError) as refused:
                export(vllm_request(3), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as garbage:
                channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")(
                    b"\x0a\xff\xff", metadata=(("authorization", f"Bearer {ADMIN}"),), timeout=10
                )
            assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        exporter = OTLPSpanExporter(
            endpoint=server.grpc_target, insecure=True, headers={"authorization": f"Bearer {ADMIN}"}
        )
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        with provider.get_tracer("t").start_as_current_span("llm_request"):
            pass
        assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
        exporter.shutdown()
        status = httpx.get(f"{server.http_url}/api/v1/status", headers=_bearer(ADMIN)).json()
        assert status["spans"] == 1
    finally:
        assert server.stop() == 0
