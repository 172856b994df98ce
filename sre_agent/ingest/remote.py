"""Send telemetry files to a running ``sre-agent serve`` over OTLP/HTTP.

``sre-agent ingest --url URL`` uses this when the server owns the store file
(DuckDB allows one writing process). The files are read exactly as for local
ingest (:func:`sre_agent.ingest.files.read_files`); each JSON document is POSTed as
``application/json`` and each length-prefixed message as
``application/x-protobuf`` to ``/v1/traces`` or ``/v1/metrics``. The server
answers with OTLP partial success, which is reported per line; 429 and 503
are retried after ``Retry-After``, as any OTLP client does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from sre_agent.errors import RemoteError
from sre_agent.ingest.files import FileResult, ProgressCallback, read_files
from sre_agent.ingest.otlp import _lite_request_class

__all__ = ["send_files"]

MiB = 1024 * 1024
_JSON = "application/json"
_PROTOBUF = "application/x-protobuf"
_DATA_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "exponential_histogram", "summary")


def send_files(
    paths: Iterable[str | Path],
    client: httpx.Client,
    progress: ProgressCallback | None = None,
    *,
    max_body_bytes: int = 64 * MiB,
    retries: int = 5,
    sleep: Callable[[float], None] = time.sleep,
) -> list[FileResult]:
    """POST the contents of telemetry files to the server ``client`` points at.

    Args:
        paths: files, in any format :func:`sre_agent.ingest.files.ingest_files` reads.
        client: an ``httpx.Client`` whose ``base_url`` is the server (and auth headers set).
        progress: as for :func:`~sre_agent.ingest.files.ingest_files`.
        max_body_bytes: cap on one line, document or message.
        retries: attempts after a 429/503 before giving up on a request.
        sleep: waits between retries (injected by tests).

    ``FileResult.spans``/``points`` count what the server accepted; it does
    not say which were duplicates, so ``inserted``/``duplicates`` stay 0.

    Raises:
        RemoteError: the server cannot be reached or answers an unexpected status.
    """
    sink = _ServerSink(client, retries, sleep)
    return read_files(paths, lambda: sink, progress, max_body_bytes=max_body_bytes)


class _ServerSink:
    def __init__(self, client: httpx.Client, retries: int, sleep: Callable[[float], None]) -> None:
        self.client = client
        self.retries = retries
        self.sleep = sleep

    def document(self, document: Any, number: int, result: FileResult) -> None:
        if isinstance(document, dict) and ("resourceSpans" in document or "resource_spans" in document):
            signal, count = "traces", _count(document, "resourceSpans", "scopeSpans", "spans")
        elif isinstance(document, dict) and ("resourceMetrics" in document or "resource_metrics" in document):
            signal, count = "metrics", _count_points(document)
        else:
            result.bad(number, "not an OTLP traces or metrics document")
            return
        self._post(signal, json.dumps(document).encode(), _JSON, number=number, count=count, result=result)

    def message(self, payload: bytes, number: int, result: FileResult) -> None:
        signal, count = _sniff(payload)
        self._post(signal, payload, _PROTOBUF, number=number, count=count, result=result)

    def flush(self, result: FileResult) -> None:
        """Nothing is buffered: every document is sent as it is read."""

    def _post(
        self, signal: str, body: bytes, content_type: str, *, number: int, count: int, result: FileResult
    ) -> None:
        path = f"/v1/{signal}"
        for attempt in range(self.retries + 1):
            try:
                response = self.client.post(path, content=body, headers={"Content-Type": content_type})
            except httpx.HTTPError as exc:
                raise RemoteError(f"cannot send to {self.client.base_url}{path}: {exc}") from exc
            if response.status_code in (429, 503) and attempt < self.retries:
                self.sleep(_retry_after(response))
                continue
            break
        if response.status_code in (400, 413):
            result.bad(
                number, f"server rejected it ({response.status_code}): {_message(response)}", count=max(count, 1)
            )
            return
        if response.status_code != 200:
            raise RemoteError(f"{self.client.base_url}{path} answered {response.status_code}: {_message(response)}")
        rejected, reason = _partial_success(response, signal, content_type)
        accepted = max(count - rejected, 0)
        if signal == "traces":
            result.spans += accepted
        else:
            result.points += accepted
        if rejected:
            result.bad(number, f"{rejected} rejected by the server: {reason}", count=rejected)


def _count(document: dict[str, Any], outer: str, middle: str, inner: str) -> int:
    snake = {"resourceSpans": "resource_spans", "scopeSpans": "scope_spans", "spans": "spans"}
    total = 0
    for resource in document.get(outer) or document.get(snake[outer]) or []:
        for scope in (resource.get(middle) or resource.get(snake[middle]) or []) if isinstance(resource, dict) else []:
            if isinstance(scope, dict):
                total += len(scope.get(inner) or [])
    return total


def _count_points(document: dict[str, Any]) -> int:
    total = 0
    for resource in document.get("resourceMetrics") or document.get("resource_metrics") or []:
        scopes = (
            (resource.get("scopeMetrics") or resource.get("scope_metrics") or []) if isinstance(resource, dict) else []
        )
        for scope in scopes:
            for metric in (scope.get("metrics") or []) if isinstance(scope, dict) else []:
                for kind in _DATA_KINDS:
                    data = metric.get(kind) if isinstance(metric, dict) else None
                    if isinstance(data, dict):
                        total += len(data.get("dataPoints") or data.get("data_points") or [])
    return total


def _sniff(payload: bytes) -> tuple[str, int]:
    """Traces or metrics, and how many spans/points, for a length-prefixed message."""
    try:
        traces = _lite_request_class().FromString(payload)
        spans = [s for r in traces.resource_spans for sc in r.scope_spans for s in sc.spans]
        if any(len(s.trace_id) == 16 and len(s.span_id) == 8 for s in spans):
            return "traces", len(spans)
    except DecodeError:  # not traces; try metrics, and in the end let the server decide
        pass
    try:
        metrics = metrics_service_pb2.ExportMetricsServiceRequest.FromString(payload)
    except DecodeError:  # the server reports the bad message
        return "traces", 0
    points = 0
    for resource in metrics.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                points += len(getattr(metric, kind).data_points) if kind else 0
    return "metrics", points


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(max(float(response.headers.get("Retry-After", "1")), 0.0), 30.0)
    except ValueError:
        return 1.0


def _message(response: httpx.Response) -> str:
    text = response.text if "json" in response.headers.get("Content-Type", "") else ""
    return text[:200] or response.reason_phrase


def _partial_success(response: httpx.Response, signal: str, content_type: str) -> tuple[int, str]:
    """(rejected count, error message) from an OTLP export response."""
    if not response.content:
        return 0, ""
    if content_type == _JSON:
        try:
            partial = json.loads(response.content).get("partialSuccess") or {}
        except (ValueError, AttributeError):
            return 0, ""
        rejected = partial.get("rejectedSpans" if signal == "traces" else "rejectedDataPoints", 0)
        return int(rejected or 0), str(partial.get("errorMessage", ""))
    message_class: Any = (
        trace_service_pb2.ExportTraceServiceResponse
        if signal == "traces"
        else metrics_service_pb2.ExportMetricsServiceResponse
    )
    try:
        parsed = message_class.FromString(response.content)
    except DecodeError:  # an unreadable success body is still a success
        return 0, ""
    partial = parsed.partial_success
    rejected = partial.rejected_spans if signal == "traces" else partial.rejected_data_points
    return int(rejected), partial.error_message
