"""In-process OTel SDK exporters that write straight into a store.

Gateway middleware (or a test) can point an OTel ``TracerProvider`` at a
local store without running a receiver::

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from sre_agent.ingest.exporter import StoreSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(StoreSpanExporter("./sre-agent.duckdb")))

Spans go through the OTLP encoder of the SDK and then the same decoder the
receivers use (:func:`sre_agent.ingest.otlp.spans_from_proto`), so a span lands in
the store exactly as it would over OTLP/gRPC. The lifecycle is the SDK's:
``export`` returns SUCCESS or FAILURE, ``force_flush`` has nothing buffered
and returns True, ``shutdown`` is safe to call twice and later exports fail.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from sre_agent.errors import SreAgentError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import metrics_from_proto, spans_from_proto
from sre_agent.store.embedded import Store

__all__ = ["StoreMetricExporter", "StoreSpanExporter"]

logger = logging.getLogger(__name__)


class _StoreSink:
    """Shared by both exporters: owns (or borrows) a store and a normaliser."""

    def __init__(self, store_or_path: Store | str | Path, normaliser: Normaliser | None) -> None:
        if isinstance(store_or_path, Store):
            self.store = store_or_path
            self.owns_store = False  # the caller closes it
        else:
            self.store = Store.open(store_or_path)
            self.owns_store = True
        self.normaliser = normaliser or Normaliser(hash_key=self.store.hash_key)
        self.lock = threading.Lock()
        self.shut_down = False

    def shutdown(self) -> None:
        with self.lock:
            if self.shut_down:
                return
            self.shut_down = True
            if self.owns_store:
                self.store.close()


class StoreSpanExporter(SpanExporter):
    """An OTel SDK ``SpanExporter`` appending spans to a :class:`~sre_agent.store.embedded.Store`.

    Args:
        store_or_path: an open store (left open at shutdown) or a path to
            open for writing (closed at shutdown).
        normaliser: attribute mapping and privacy; ``None`` = defaults with
            the store's hash key (content redacted).
    """

    def __init__(self, store_or_path: Store | str | Path, *, normaliser: Normaliser | None = None) -> None:
        self._sink = _StoreSink(store_or_path, normaliser)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Encode, normalise and append ``spans``; FAILURE after shutdown or on a store error."""
        sink = self._sink
        with sink.lock:
            if sink.shut_down:
                logger.warning("StoreSpanExporter: export called after shutdown")
                return SpanExportResult.FAILURE
            if not spans:
                return SpanExportResult.SUCCESS
            try:
                decoded = spans_from_proto(encode_spans(spans), sink.normaliser)
                sink.store.append_spans(decoded.table)
            except SreAgentError:
                logger.exception("StoreSpanExporter: cannot store %d spans", len(spans))
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here (the span processor batches): always True."""
        return True

    def shutdown(self) -> None:
        """Stop exporting and close the store if this exporter opened it (idempotent)."""
        self._sink.shutdown()


class StoreMetricExporter(MetricExporter):
    """An OTel SDK ``MetricExporter`` appending data points to a store.

    Same arguments as :class:`StoreSpanExporter`, plus the SDK's
    ``preferred_temporality`` / ``preferred_aggregation`` (cumulative by default,
    as the store expects for counters).
    """

    def __init__(
        self,
        store_or_path: Store | str | Path,
        *,
        normaliser: Normaliser | None = None,
        preferred_temporality: dict[type, Any] | None = None,
        preferred_aggregation: dict[type, Any] | None = None,
    ) -> None:
        super().__init__(preferred_temporality=preferred_temporality, preferred_aggregation=preferred_aggregation)
        self._sink = _StoreSink(store_or_path, normaliser)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        """Encode, normalise and append the data points; FAILURE after shutdown or on a store error."""
        sink = self._sink
        with sink.lock:
            if sink.shut_down:
                logger.warning("StoreMetricExporter: export called after shutdown")
                return MetricExportResult.FAILURE
            try:
                decoded = metrics_from_proto(encode_metrics(metrics_data), sink.normaliser)
                sink.store.append_metric_points(decoded.table)
            except SreAgentError:
                logger.exception("StoreMetricExporter: cannot store metric points")
                return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Nothing is buffered here: always True."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Stop exporting and close the store if this exporter opened it (idempotent)."""
        self._sink.shutdown()
