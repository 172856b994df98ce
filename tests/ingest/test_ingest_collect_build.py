"""Decoding in two halves (issue 18): collect one request now, build many requests' columns later.

The receivers collect a request (parse, check, count) when it arrives and
the writer builds the columns of a whole commit at once. The rows must be
exactly those of decoding each request alone: these tests build random
groups of requests (several resources and scopes, rejected spans, exception
events, resource-first columns) both ways and compare every column, and
check that a bad attribute found while building fails only its own request.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_builders import T0, VLLM_V1, key_values

from sre_agent.errors import BadPayloadError
from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import build_spans, collect_traces, decode_traces
from sre_agent.ingest.receiver import Writer
from sre_agent.store.embedded import Store

NORM = Normaliser(hash_key=b"collect")
_ALIASES = [
    ("gen_ai.usage.input_tokens", 77),
    ("gen_ai.usage.prompt_tokens", 78),
    ("gen_ai.usage.completion_tokens", 12.0),
    ("gen_ai.usage.cached_tokens", "5"),
    ("gen_ai.latency.time_in_scheduler", 0.125),
    ("gen_ai.latency.time_in_queue", 0.25),
    ("gen_ai.latency.e2e", 3),
    ("gen_ai.latency.time_to_first_token", 2.5e-05),
    ("gen_ai.response.model", "other-model"),
    ("gen_ai.response.finish_reasons", '["length"]'),
    ("finish_reason", "stop"),
    ("service.name", "span-level-name"),
    ("http.request.resend_count", 2),
    ("error.type", "timeout"),
]
PROTOBUF = "application/x-protobuf"


def _request(draw: Any, index: int) -> bytes:
    request = ExportTraceServiceRequest()
    for r in range(draw(st.integers(1, 3))):
        resource = request.resource_spans.add()
        attributes: dict[str, Any] = {"service.name": f"svc-{index}-{r}"}
        if draw(st.booleans()):
            attributes["service.version"] = f"v{draw(st.integers(0, 3))}"
        if draw(st.booleans()):
            attributes["tenant.id"] = draw(st.sampled_from(["acme", "stark"]))
        resource.resource.attributes.extend(key_values(attributes))
        for s in range(draw(st.integers(0, 2))):
            scope = resource.scope_spans.add()
            scope.scope.name = draw(st.sampled_from(["", "vllm.llm_engine", "gateway"]))
            for i in range(draw(st.integers(0, 4))):
                valid = draw(st.integers(0, 5)) > 0
                span = scope.spans.add(
                    trace_id=os.urandom(16 if valid else 3),
                    span_id=os.urandom(8),
                    parent_span_id=os.urandom(8) if draw(st.booleans()) else b"",
                    name=draw(st.sampled_from(["llm_request", "POST /v1/chat/completions", "redis GET"])),
                    kind=draw(st.integers(0, 5)),
                    start_time_unix_nano=T0 + 1_000_000 * (index * 100 + r * 10 + s + i),
                    end_time_unix_nano=T0 + 1_000_000 * (index * 100 + r * 10 + s + i) + draw(st.integers(0, 10**9)),
                )
                span_attributes = dict(VLLM_V1) if draw(st.booleans()) else {"http.route": "/v1/chat/completions"}
                if draw(st.booleans()):
                    span_attributes["gen_ai.usage.completion_tokens"] = draw(st.integers(0, 4096))
                if draw(st.booleans()):
                    span_attributes["tenant.id"] = "from-span"
                # Aliases of one column with other values, and numbers in the other numeric type:
                # only the entry a column is read from, spelled the same, may leave the map.
                for key, value in draw(st.lists(st.sampled_from(_ALIASES), max_size=4)):
                    span_attributes[key] = value
                span.attributes.extend(key_values(span_attributes))
                if draw(st.booleans()):
                    event = span.events.add(name="exception", time_unix_nano=T0)
                    event.attributes.extend(key_values({"exception.type": "TimeoutError"}))
                    span.status.code = 2
    return request.SerializeToString()


@st.composite
def bodies(draw: Any) -> list[bytes]:
    return [_request(draw, index) for index in range(draw(st.integers(1, 5)))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_building_collected_requests_together_gives_the_rows_of_decoding_each(group: list[bytes]) -> None:
    alone = [decode_traces(body, PROTOBUF, normaliser=NORM) for body in group]
    collected = [collect_traces(body, PROTOBUF, normaliser=NORM) for body in group]
    assert [c.num_rows for c in collected] == [d.table.num_rows for d in alone]
    assert [c.rejected for c in collected] == [d.rejected for d in alone]
    assert [c.errors for c in collected] == [d.errors for d in alone]
    together = build_spans(collected)
    expected = pa.concat_tables([d.table for d in alone])
    assert together.schema == expected.schema
    for name in expected.column_names:
        assert together[name].to_pylist() == expected[name].to_pylist(), name


def _with_bad_attribute(first_index: int) -> bytes:
    """A one-span request whose attribute value is not UTF-8: it parses, and fails only when built."""
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    span = scope.spans.add(
        trace_id=first_index.to_bytes(16, "big"), span_id=b"\x01" * 8, name="llm_request", start_time_unix_nano=T0
    )
    span.attributes.extend(key_values({"tenant.id": "PATCHME"}))
    body = request.SerializeToString().replace(b"PATCHME", b"PAT\xff\xfeME")
    assert b"\xff\xfe" in body
    return body


def _good(first_index: int, spans: int = 3) -> bytes:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(spans):
        span = scope.spans.add(
            trace_id=(first_index + i).to_bytes(16, "big"),
            span_id=b"\x02" * 8,
            name="llm_request",
            start_time_unix_nano=T0 + i,
        )
        span.attributes.extend(key_values(VLLM_V1))
    return request.SerializeToString()


def test_a_bad_attribute_found_while_building_fails_only_its_request(tmp_path: Path) -> None:
    bad = collect_traces(_with_bad_attribute(1000), PROTOBUF, normaliser=NORM)
    assert bad.num_rows == 1  # collecting does not look inside attributes
    with pytest.raises(BadPayloadError, match="UTF-8"):
        build_spans([bad])
    with Store.open(tmp_path / "store.duckdb") as store:
        writer = Writer(store, queue_max_rows=1000, batch_max_rows=1000, flush_interval_s=0)
        # Queued before the thread starts, so all three share one batch.
        futures = [
            writer.submit("spans", collect_traces(_good(1), PROTOBUF, normaliser=NORM)),
            writer.submit("spans", bad),
            writer.submit("spans", collect_traces(_good(2000), PROTOBUF, normaliser=NORM)),
        ]
        writer.start()
        concurrent.futures.wait(futures, timeout=60)
        writer.close(timeout_s=30)
        assert futures[0].result() == 3
        assert futures[2].result() == 3
        with pytest.raises(BadPayloadError, match="UTF-8"):
            futures[1].result()
        assert writer.stats.commit_failures == 0  # the client's bytes, not the store's failure
        assert store.connection.execute("SELECT count(*) FROM spans").fetchone() == (6,)


_SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@settings(max_examples=40, deadline=None, suppress_health_check=_SLOW_OK)
@given(group=bodies())
def test_the_stored_form_built_at_once_reads_back_as_the_canonical_rows(tmp_path: Path, group: list[bytes]) -> None:
    """Rows built in ``span_rows`` form (what the receivers append) read back through ``spans`` exactly as
    the canonical rows do, maps included, whatever aliases and number types the attributes use."""
    collected = [collect_traces(body, PROTOBUF, normaliser=NORM) for body in group]
    canonical = pa.concat_tables([decode_traces(body, PROTOBUF, normaliser=NORM).table for body in group])
    stored = build_spans(collected, stored=True)
    assert "promoted" in stored.column_names
    assert "attributes" not in stored.column_names
    folder = tmp_path / os.urandom(4).hex()
    folder.mkdir()
    with Store.open(folder / "a.duckdb") as a, Store.open(folder / "b.duckdb") as b:
        assert a.append_spans(canonical) == b.append_spans(stored)
        read = "SELECT * EXCLUDE (extra_attributes, extra_resource_attributes, promoted) FROM spans ORDER BY 1, 2"
        assert b.connection.execute(read).fetchall() == a.connection.execute(read).fetchall()


def test_the_stored_form_keeps_an_engine_span_as_compact_as_the_general_conversion(tmp_path: Path) -> None:
    """On what vLLM sends (integers as integers, latencies as doubles) every promoted entry leaves the maps."""
    from sre_agent.store.span_rows import to_span_rows

    body = _good(1, spans=50)
    converted = to_span_rows(decode_traces(body, PROTOBUF, normaliser=NORM).table)
    built = build_spans([collect_traces(body, PROTOBUF, normaliser=NORM)], stored=True)
    assert built.schema == converted.schema
    assert built["promoted"].to_pylist() == converted["promoted"].to_pylist()
    assert all(bits > 0 for bits in built["promoted"].to_pylist())
    assert built["extra_attributes"].to_pylist() == converted["extra_attributes"].to_pylist()


def test_an_int32_column_out_of_range_on_the_resource_is_null_not_a_failed_request() -> None:
    """Found by the layout property test: ``http.request.resend_count`` = 2**31 on a resource failed the
    whole request (ArrowInvalid); on a span it was already dropped. The map keeps the value either way."""
    from otlp_builders import trace_request

    for value in (2.0**31, 2**31, -(2**31)):
        body = trace_request([{}], resource={"http.request.resend_count": value}).SerializeToString()
        table = decode_traces(body, PROTOBUF, normaliser=NORM).table
        assert table["attempt"].to_pylist() == [None]
        assert table["resource_attributes"].to_pylist()[0] == [("http.request.resend_count", str(int(value)))]
    body = trace_request([{}], resource={"http.request.resend_count": 3}).SerializeToString()
    assert decode_traces(body, PROTOBUF, normaliser=NORM).table["attempt"].to_pylist() == [3]


def test_the_next_batch_is_built_while_the_previous_one_commits(tmp_path: Path) -> None:
    """Building (Python, GIL) and committing (DuckDB) are two threads: while one batch sits in DuckDB the
    next is built, and neither is acknowledged before its own commit."""
    with Store.open(tmp_path / "store.duckdb") as store:
        append = store.append_spans
        in_commit, release = threading.Event(), threading.Event()

        def held_append(table: pa.Table) -> int:
            in_commit.set()
            assert release.wait(30)
            return append(table)

        store.append_spans = held_append  # type: ignore[method-assign]
        writer = Writer(store, queue_max_rows=1000, batch_max_rows=3, flush_interval_s=0)
        writer.start()
        try:
            first = writer.submit("spans", collect_traces(_good(1), PROTOBUF, normaliser=NORM))
            assert in_commit.wait(30)
            second = writer.submit("spans", collect_traces(_good(2000), PROTOBUF, normaliser=NORM))
            deadline = time.monotonic() + 30
            # The second batch leaves the queue for the build thread and is built (it then waits for
            # the commit thread) while the first is still held inside its commit.
            while writer._built.empty() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert writer._built.full()
            assert not first.done()
            assert not second.done()
        finally:
            release.set()
        assert first.result(30) == 3
        assert second.result(30) == 3
        writer.close(timeout_s=30)
        assert store.connection.execute("SELECT count(*) FROM spans").fetchone() == (6,)


def test_one_batch_of_stored_and_canonical_parts_reads_back_as_each_decoded_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit may hold requests collected here, tables a decode worker built in the stored form and
    canonical tables (files, the API); they are appended together (no one-by-one retry) and read back
    as decoding each body alone."""
    bodies = [_good(1), _good(1000), _good(2000), _good(3000)]
    parts: list[Any] = [
        collect_traces(bodies[0], PROTOBUF, normaliser=NORM),
        build_spans([collect_traces(bodies[1], PROTOBUF, normaliser=NORM)], stored=True),
        decode_traces(bodies[2], PROTOBUF, normaliser=NORM).table,
        collect_traces(bodies[3], PROTOBUF, normaliser=NORM),
    ]
    expected = pa.concat_tables([decode_traces(body, PROTOBUF, normaliser=NORM).table for body in bodies])
    with Store.open(tmp_path / "batched.duckdb") as batched, Store.open(tmp_path / "alone.duckdb") as alone:
        writer = Writer(batched, queue_max_rows=1000, batch_max_rows=1000, flush_interval_s=0)
        futures = [writer.submit("spans", part) for part in parts]  # queued before start: one batch
        writer.start()
        assert [future.result(60) for future in futures] == [3, 3, 3, 3]
        writer.close(timeout_s=30)
        assert writer.stats.commits == 1
        assert not [r for r in caplog.records if "retrying one by one" in r.getMessage()]
        alone.append_spans(expected)
        read = "SELECT * EXCLUDE (extra_attributes, extra_resource_attributes, promoted) FROM spans ORDER BY 1, 2"
        assert batched.connection.execute(read).fetchall() == alone.connection.execute(read).fetchall()


def _with_raw_span_field(field: str, raw: bytes) -> bytes:
    """A one-span request whose ``status`` or one ``events`` entry is the serialized bytes ``raw``."""
    request = ExportTraceServiceRequest()
    span = (
        request.resource_spans.add()
        .scope_spans.add()
        .spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="llm_request", start_time_unix_nano=T0)
    )
    # Span is field 2 of ScopeSpans, ScopeSpans field 2 of ResourceSpans, ResourceSpans field 1 of the request:
    # rebuild the three length prefixes around the span with the raw field appended (status 15, events 11).
    tag = {"status": 15, "events": 11}[field] << 3 | 2
    span_bytes = span.SerializeToString() + bytes([tag, len(raw)]) + raw
    scope = bytes([0x12, len(span_bytes)]) + span_bytes
    resource = bytes([0x12, len(scope)]) + scope
    return bytes([0x0A, len(resource)]) + resource


@pytest.mark.parametrize("field", ["status", "events"])
def test_a_malformed_status_or_event_fails_the_request_as_the_full_parser_does(field: str) -> None:
    """Status and events are kept as raw bytes by the lite class and parsed only when read; a malformed
    one still fails the request with a clear error (the full parser rejected it at parse time)."""
    good = _with_raw_span_field(field, trace_pb2.Status(code=2).SerializeToString() if field == "status" else b"")
    assert collect_traces(good, PROTOBUF, normaliser=NORM).num_rows == 1
    truncated = b"\x12\x05ab"  # a length-delimited field (status message / event name) cut short
    bad = _with_raw_span_field(field, truncated)
    with pytest.raises(BadPayloadError, match="cannot parse OTLP protobuf"):
        collect_traces(bad, PROTOBUF, normaliser=NORM)
    with pytest.raises(DecodeError):
        ExportTraceServiceRequest.FromString(bad)  # what the full parser said of the same bytes


def test_an_error_status_and_an_exception_event_read_from_raw_bytes() -> None:
    request = ExportTraceServiceRequest()
    span = (
        request.resource_spans.add()
        .scope_spans.add()
        .spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="llm_request", start_time_unix_nano=T0)
    )
    span.status.code = 2
    span.status.message = "engine died"
    event = span.events.add(name="exception")
    event.attributes.extend(key_values({"exception.type": "OOMError"}))
    table = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=NORM).table
    row = table.to_pylist()[0]
    assert (row["status_code"], row["status_message"], row["error_type"]) == ("error", "engine died", "OOMError")


def test_a_lone_request_commits_at_once_and_requests_on_their_way_share_a_commit(tmp_path: Path) -> None:
    """Adaptive batching: the writer holds a batch open (up to flush_interval_s) only while other requests
    are being read or decoded, so low load is acknowledged at once and load gets larger commits."""
    with Store.open(tmp_path / "store.duckdb") as store:
        writer = Writer(store, queue_max_rows=1000, batch_max_rows=1000, flush_interval_s=5.0)
        writer.start()
        try:
            started = time.monotonic()
            assert writer.submit("spans", collect_traces(_good(1), PROTOBUF, normaliser=NORM)).result(30) == 3
            assert time.monotonic() - started < 2.5  # nothing on its way: no 5 s linger
            commits = writer.stats.commits
            with writer.pending():  # another request is being read
                first = writer.submit("spans", collect_traces(_good(1000), PROTOBUF, normaliser=NORM))
                time.sleep(0.3)
                assert not first.done()  # held open for the request on its way
                second = writer.submit("spans", collect_traces(_good(2000), PROTOBUF, normaliser=NORM))
            assert first.result(30) == 3
            assert second.result(30) == 3
            assert writer.stats.commits == commits + 1  # one commit for both
        finally:
            writer.close(timeout_s=30)
