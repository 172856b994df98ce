"""Receiving telemetry: OTLP over gRPC and HTTP, files, Prometheus scrapes, into canonical batches.

Owns decoding (``otlp``, ``otlp_json``, ``otlp_metrics``, ``spans``, ``attrs``), the
normaliser's attribute table (``normalise``), the receivers (``receiver``, ``grpc_server``,
``otlp_transport``, ``remote``), file ingest (``files``, ``decode_pool``), the scraper
(``scrape``) and the in-process SDK exporters (``exporter``). May import ``store`` (to
write) and ``errors``/``config``; never ``analysis`` or ``canary``.
"""
