"""OTLP transport helpers shared by the HTTP and gRPC receivers.

What both transports do the same way around the writer (:mod:`sre_agent.ingest.receiver`):
recognise the media type, decode a body into what the writer queues
(:func:`decode_payload`), inflate gzip with a size bound (:class:`GzipInflater`),
and spell the OTLP responses (``Export*ServiceResponse`` with ``partial_success``,
``google.rpc.Status`` errors) in protobuf or JSON.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from sre_agent.errors import BadPayloadError, PayloadTooLargeError

if TYPE_CHECKING:
    from sre_agent.ingest.normalise import Normaliser
    from sre_agent.ingest.otlp import CollectedSpans

__all__ = [
    "JSON",
    "PROTOBUF",
    "CollectedRequest",
    "GzipInflater",
    "TableKind",
    "decode_payload",
    "export_response_bytes",
    "media_type_of",
    "status_bytes",
    "table_for_signal",
]

#: The store table a submission goes to.
TableKind = Literal["spans", "metric_points"]

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
_MEDIA_TYPES: Final[dict[str, str]] = {PROTOBUF: PROTOBUF, "application/protobuf": PROTOBUF, JSON: JSON}


def media_type_of(value: str | None) -> str | None:
    """The OTLP media type named by a Content-Type header value, None when unsupported."""
    if not value:
        return None
    return _MEDIA_TYPES.get(value.split(";", 1)[0].strip().lower())


def status_bytes(rpc_code: int, message: str, media_type: str, *, bad_request: bool = False) -> bytes:
    """A serialised ``google.rpc.Status`` (protobuf or JSON); ``bad_request`` adds a BadRequest detail."""
    from google.protobuf import json_format
    from google.rpc import error_details_pb2, status_pb2

    status = status_pb2.Status(code=rpc_code, message=message)
    if bad_request:
        detail = error_details_pb2.BadRequest()
        detail.field_violations.add(field="body", description=message[:1000])
        status.details.add().Pack(detail)
    if media_type == PROTOBUF:
        return bytes(status.SerializeToString())
    return str(json_format.MessageToJson(status, indent=None)).encode()


_SIGNALS: Final[dict[str, tuple[str, str, str]]] = {
    # signal -> (store table, stats prefix, partial-success count field)
    "traces": ("spans", "spans", "rejected_spans"),
    "metrics": ("metric_points", "metric_points", "rejected_data_points"),
}


def export_response_bytes(signal: str, media_type: str, rejected: int, errors: list[str]) -> bytes:
    """Serialised Export*ServiceResponse; ``partial_success`` only when something was rejected."""
    message = "; ".join(errors[:5])[:2000]
    field = _SIGNALS[signal][2]
    if media_type == JSON:
        import json

        if not rejected and not message:
            return b"{}"
        camel = "rejectedSpans" if field == "rejected_spans" else "rejectedDataPoints"
        return json.dumps({"partialSuccess": {camel: str(rejected), "errorMessage": message}}).encode()
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    response: Any = (
        trace_service_pb2.ExportTraceServiceResponse()
        if signal == "traces"
        else metrics_service_pb2.ExportMetricsServiceResponse()
    )
    if rejected or message:
        setattr(response.partial_success, field, rejected)
        response.partial_success.error_message = message
    return bytes(response.SerializeToString())


def table_for_signal(signal: str) -> TableKind:
    """The store table an OTLP signal ("traces" or "metrics") is appended to."""
    return "spans" if signal == "traces" else "metric_points"


@dataclass(frozen=True)
class _NothingDecoded:
    """What an empty protobuf body decodes to: no rows, nothing rejected."""

    table: Any
    rejected: int = 0
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class CollectedRequest:
    """A traces request parsed and checked; the writer builds ``table``'s columns when it commits.

    Shaped like ``DecodedSpans`` (``table.num_rows``, ``rejected``, ``errors``) for the transports.
    """

    table: CollectedSpans

    @property
    def rejected(self) -> int:
        return self.table.rejected

    @property
    def errors(self) -> list[str]:
        return self.table.errors


def decode_payload(
    signal: str,
    body: bytes,
    media_type: str,
    normaliser: Normaliser,
    *,
    defer_columns: bool = False,
    stored: bool = False,
) -> Any:
    """Decode one OTLP body with the ingest layer (``DecodedSpans``/``DecodedMetrics``).

    With ``defer_columns``, a traces body is only collected
    (:class:`CollectedRequest`; same ``table.num_rows``, ``rejected`` and
    ``errors``) and :class:`Writer` builds its columns with its batch.
    An empty protobuf body is a valid empty request (answered with success,
    per the OTLP specification) and skips the decoder entirely.
    """
    if not body and media_type == PROTOBUF:
        import pyarrow as pa

        return _NothingDecoded(table=pa.table({}))
    from sre_agent.ingest.otlp import collect_traces, decode_metrics, decode_traces

    if signal == "traces" and defer_columns:
        return CollectedRequest(collect_traces(body, media_type, normaliser=normaliser))
    if signal == "traces" and stored:
        from sre_agent.ingest.otlp import DecodedSpans, build_spans

        collected = collect_traces(body, media_type, normaliser=normaliser)
        return DecodedSpans(build_spans([collected], stored=True), collected.rejected, collected.errors)
    if signal == "traces":
        return decode_traces(body, media_type, normaliser=normaliser)
    return decode_metrics(body, media_type, normaliser=normaliser)


class GzipInflater:
    """Incremental gzip decoding (multi-member too) that never produces more than ``max_bytes``."""

    def __init__(self, max_bytes: int, too_large: PayloadTooLargeError) -> None:
        self._max_bytes = max_bytes
        self._too_large = too_large
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._out: list[bytes] = []
        self._size = 0

    def _keep(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > self._max_bytes:
            raise self._too_large
        self._out.append(piece)

    def feed(self, data: bytes) -> None:
        try:
            while data:
                if self._inflater.eof:  # another gzip member follows
                    self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._keep(self._inflater.decompress(data, self._max_bytes - self._size + 1))
                data = self._inflater.unconsumed_tail or self._inflater.unused_data
        except zlib.error as exc:
            raise BadPayloadError(f"corrupt gzip body: {exc}") from exc

    def finish(self) -> bytes:
        try:
            self._keep(self._inflater.flush())
        except zlib.error as exc:
            raise BadPayloadError(f"corrupt gzip body: {exc}") from exc
        if not self._inflater.eof:
            raise BadPayloadError("truncated gzip body")
        return b"".join(self._out)
