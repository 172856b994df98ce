"""Shared fixtures for the policy tests: the fault server with the module's scripts, an in-memory span sink."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sre_agent.replays.fault_server import create_app, serve_in_thread


@pytest.fixture(scope="module")
def base_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The fault server on 127.0.0.1 serving the test module's ``SCRIPTS`` (scenario -> steps)."""
    with serve_in_thread(create_app(request.module.SCRIPTS)) as url:
        yield url


@pytest.fixture
def spans() -> tuple[InMemorySpanExporter, TracerProvider]:
    """A tracer provider whose finished spans land in the returned in-memory exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider
