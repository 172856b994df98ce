"""OTLP/gRPC status semantics, in-process with a real grpc server on loopback:
UNAVAILABLE + RetryInfo when the queue is full, RESOURCE_EXHAUSTED when oversize,
INVALID_ARGUMENT for garbage, partial success in an OK response."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from receiver_harness import vllm_request

from sre_agent.api.server import ApiContext
from sre_agent.config import Config
from sre_agent.ingest.grpc_server import start_grpc_server
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.receiver import ReceiverStats, Writer
from sre_agent.store.embedded import Store

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[tuple[ApiContext, grpc.Channel]]:
    """A gRPC receiver whose writer is not running yet, with a 1 MiB message cap and a 100-row queue."""
    config = Config(db=str(tmp_path / "grpc.duckdb"), max_body_bytes=1 << 20, queue_max_spans=100)
    store = Store.open(config.db)
    writer = Writer(store, queue_max_rows=100, batch_max_rows=1000, flush_interval_s=0.0)
    ctx = ApiContext(config, store, writer, ReceiverStats(), Normaliser(hash_key=b"k"))
    server, port = start_grpc_server(ctx, "127.0.0.1", 0)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield ctx, channel
    finally:
        channel.close()
        server.stop(grace=None).wait(5)
        writer.close()
        ctx.close()
        store.close()


def _export(channel: grpc.Channel, request: ExportTraceServiceRequest | bytes) -> ExportTraceServiceResponse:
    call = channel.unary_unary(EXPORT, response_deserializer=ExportTraceServiceResponse.FromString)
    payload = request if isinstance(request, bytes) else request.SerializeToString()
    return call(payload, timeout=30)


def test_full_queue_is_unavailable_with_retry_info(stalled: tuple[ApiContext, grpc.Channel]) -> None:
    ctx, channel = stalled
    queued = ctx.writer.submit("spans", _table(100))  # the queue is now full and nothing drains it
    with pytest.raises(grpc.RpcError) as refused:
        _export(channel, vllm_request(5, first_index=1000))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    details = dict(refused.value.trailing_metadata())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    retry = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(retry)
    assert retry.retry_delay.seconds >= 1
    ctx.writer.start()
    assert queued.result(timeout=30) == 100
    response = _export(channel, vllm_request(5, first_index=2000))
    assert not response.HasField("partial_success")
    assert ctx.store.counts()["spans"] == 105


def test_oversize_garbage_and_partial_success(stalled: tuple[ApiContext, grpc.Channel]) -> None:
    ctx, channel = stalled
    ctx.writer.start()
    huge = vllm_request(1)
    huge.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="x").value.string_value = "y" * (2 << 20)
    with pytest.raises(grpc.RpcError) as oversize:
        _export(channel, huge)
    assert oversize.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as garbage:
        _export(channel, b"\x0a\x05\x0a\x03\xff")
    assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Parses (span attributes are bytes to the parser) and fails when the writer builds its columns.
    bad_value = vllm_request(1, first_index=4000)
    bad_value.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="x").value.string_value = "PATCHME"
    with pytest.raises(grpc.RpcError) as undecodable:
        _export(channel, bad_value.SerializeToString().replace(b"PATCHME", b"PAT\xff\xfeME"))
    assert undecodable.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in (undecodable.value.details() or "")
    mixed = vllm_request(3, first_index=3000)
    mixed.resource_spans[0].scope_spans[0].spans[1].trace_id = b"short"
    response = _export(channel, mixed)
    assert response.partial_success.rejected_spans == 1
    assert response.partial_success.error_message
    assert ctx.store.counts()["spans"] == 2


def _table(n: int) -> object:
    from sre_agent.ingest.otlp import decode_traces

    body = vllm_request(n).SerializeToString()
    return decode_traces(body, "application/x-protobuf", normaliser=Normaliser(hash_key=b"k")).table
