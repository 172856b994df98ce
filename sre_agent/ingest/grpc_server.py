"""OTLP/gRPC receiver: ``TraceService/Export`` and ``MetricsService/Export``.

Same semantics as the HTTP receiver, mapped onto gRPC status codes
(OTLP specification, "OTLP/gRPC Response"):

- bad data: ``INVALID_ARGUMENT`` (never retried);
- larger than ``max_body_bytes``: ``RESOURCE_EXHAUSTED`` (grpc's own
  ``max_receive_message_length`` check, no RetryInfo, so not retried);
- queue full or commit failed: ``UNAVAILABLE`` with a ``google.rpc.RetryInfo``
  detail in the ``grpc-status-details-bin`` trailer;
- missing/wrong ``authorization: Bearer`` metadata: ``UNAUTHENTICATED``;
- partial success: an OK response carrying ``partial_success``.

The handlers take the raw request bytes (no generated deserializer) so that
an unparseable message is answered with ``INVALID_ARGUMENT`` by our decoder
rather than grpc's generic ``INTERNAL`` "Exception deserializing request".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

import grpc

from sre_agent.api.auth import authenticate, bearer_token
from sre_agent.errors import BadPayloadError, OverloadedError, StoreError
from sre_agent.ingest.otlp_transport import PROTOBUF, decode_payload, export_response_bytes, table_for_signal

if TYPE_CHECKING:
    from sre_agent.api.server import ApiContext

__all__ = ["start_grpc_server"]

log = logging.getLogger(__name__)

TRACE_SERVICE: Final = "opentelemetry.proto.collector.trace.v1.TraceService"
METRICS_SERVICE: Final = "opentelemetry.proto.collector.metrics.v1.MetricsService"
_UNAVAILABLE_DETAILS_KEY: Final = "grpc-status-details-bin"


def _abort_unavailable(context: grpc.ServicerContext, message: str, retry_after_s: float) -> None:
    """Abort with UNAVAILABLE and a RetryInfo detail telling the client when to retry."""
    from google.protobuf import duration_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2

    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message)
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=max(1, round(retry_after_s))))
    status.details.add().Pack(retry)
    context.set_trailing_metadata(((_UNAVAILABLE_DETAILS_KEY, status.SerializeToString()),))
    context.abort(grpc.StatusCode.UNAVAILABLE, message)


def _export_handler(ctx: ApiContext, signal: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    table_kind = table_for_signal(signal)
    stats_prefix = table_kind

    def export(request: bytes, context: grpc.ServicerContext) -> bytes:
        code = "UNKNOWN"
        try:
            response = _export(request, context)
            code = "OK"
            return response
        except Exception:  # context.abort raises a bare Exception; record the code it set
            status_code = context.code()
            code = status_code.name if isinstance(status_code, grpc.StatusCode) else "UNKNOWN"
            raise
        finally:
            ctx.stats.count_request("grpc", signal, code)

    def _export(request: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = {key.lower(): value for key, value in context.invocation_metadata() if isinstance(value, str)}
        principal = authenticate(ctx.config, bearer_token(metadata))
        if principal is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
        elif principal.tenant is not None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "a tenant-scoped token cannot send telemetry")
        with ctx.writer.pending():
            decoded = _decode(request, context)
            future = None
            if decoded.table.num_rows:
                try:
                    future = ctx.writer.submit(table_kind, decoded.table)
                except OverloadedError as exc:
                    _abort_unavailable(context, str(exc), exc.retry_after_s)
        if future is not None:
            try:
                future.result()  # acknowledge only what is committed
            except BadPayloadError as exc:  # found when the writer built the columns
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except StoreError as exc:
                _abort_unavailable(context, f"not stored, retry: {exc}", 5)
        table = decoded.table
        ctx.stats.add(**{f"{stats_prefix}_accepted": table.num_rows, f"{stats_prefix}_rejected": decoded.rejected})
        return export_response_bytes(signal, PROTOBUF, decoded.rejected, list(decoded.errors))

    def _decode(request: bytes, context: grpc.ServicerContext) -> Any:
        try:
            ctx.writer.check_capacity()
            if ctx.decode_pool is not None and request:
                return ctx.decode_pool.submit(signal, request, PROTOBUF).result()
            return decode_payload(signal, request, PROTOBUF, ctx.normaliser, defer_columns=True)
        except OverloadedError as exc:
            _abort_unavailable(context, str(exc), exc.retry_after_s)
            raise AssertionError("unreachable") from exc
        except BadPayloadError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from exc
        except Exception as exc:  # boundary: a decoder crash on client bytes is logged, answered as bad data
            log.exception("decoder crashed on a %d-byte gRPC message", len(request))
            ctx.stats.add(decoder_crashes=1)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable payload ({type(exc).__name__})")
            raise AssertionError("unreachable") from exc

    return export


def _identity(payload: bytes) -> bytes:
    return payload


def start_grpc_server(ctx: ApiContext, host: str, port: int, *, max_workers: int = 16) -> tuple[Any, int]:
    """Start the OTLP/gRPC server on ``host:port`` (0 = ephemeral); returns (server, bound port).

    Raises:
        ConfigError: the port cannot be bound.
    """
    from sre_agent.errors import ConfigError

    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="otlp-grpc"),
        options=[
            ("grpc.max_receive_message_length", ctx.config.max_body_bytes),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ],
    )
    for service, signal in ((TRACE_SERVICE, "traces"), (METRICS_SERVICE, "metrics")):
        handler = grpc.unary_unary_rpc_method_handler(
            _export_handler(ctx, signal), request_deserializer=_identity, response_serializer=_identity
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {"Export": handler}),))
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen for gRPC on {target}: {exc}") from exc
    if bound == 0:
        raise ConfigError(f"cannot listen for gRPC on {target}")
    server.start()
    return server, bound
