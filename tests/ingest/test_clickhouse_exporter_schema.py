"""The ClickHouse exporter's ``otel_traces`` read as canonical spans, in ClickHouse itself (chdb).

The table is created from the exporter's documented columns (docs/reference/telemetry.md 5.5,
in both the current and the older spellings of kinds and status codes), filled as the exporter
lays spans out (lowercase hex ids, ``''`` for no parent, every attribute value as a string,
``Duration`` in ns, exception events in the ``Events`` nested columns), and read through
:func:`sre_agent.store.clickhouse_schema.spans_select`. Each canonical column must equal what
sre-agent's own receiver decodes from the same OTLP request.

Opt-in (``-m clickhouse``): chdb is ClickHouse in-process, ~0.5 GB, installed by
``pip install -e '.[clickhouse]'``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from exporter_layout import create_tables, exporter_metric_rows, exporter_rows, insert_metric_rows, insert_spans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_builders import SEMCONV_NEW, SEMCONV_OLD, SGLANG, T0, VLLM_V0, VLLM_V1, metrics_request, trace_request

from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_metrics, decode_traces
from sre_agent.store.clickhouse_schema import acceleration_ddl, metric_points_select, spans_select
from sre_agent.store.schema import METRIC_POINT_COLUMNS, SPAN_ATTRIBUTE_SOURCES, SPAN_COLUMNS

pytestmark = pytest.mark.clickhouse

NORM = Normaliser(hash_key=b"clickhouse", keep_content=True)


def _chdb_spans(tmp_path: Path, request: Any, *, old_spelling: bool) -> list[dict[str, Any]]:
    """The canonical spans read back, the same with and without the acceleration columns."""
    from chdb import session

    db = session.Session(str(tmp_path / "chdb"))
    try:
        create_tables(db)
        insert_spans(db, exporter_rows(request, old_spelling=old_spelling), tmp_path)
        table = db.query(f"SELECT * FROM ({spans_select()}) ORDER BY span_id", "ArrowTable")
        for statement in acceleration_ddl():
            db.query(statement + (" SETTINGS mutations_sync = 1" if "MATERIALIZE" in statement.split()[3] else ""))
        accelerated = frozenset(SPAN_ATTRIBUTE_SOURCES)
        kept = db.query(f"SELECT * FROM ({spans_select(accelerated=accelerated)}) ORDER BY span_id", "ArrowTable")
    finally:
        db.close()
    rows: list[dict[str, Any]] = table.to_pylist()
    assert kept.to_pylist() == rows  # the materialized columns hold what the maps give
    return rows


def _request() -> Any:
    """Engine spans of vLLM V0/V1 and SGLang, GenAI client spans, a gateway span with an exception."""
    resource = {"service.name": "vllm", "service.version": "v2", "host.name": "gpu-1", "service.instance.id": "pod-1"}
    spans = [
        {"attributes": {**VLLM_V1, "gen_ai.request.id": "v1-a", "tenant.id": "acme"}},
        {"attributes": {**VLLM_V0, "gen_ai.request.id": "v0-a"}, "start": T0 + 5_000},
        {"attributes": SGLANG, "name": "Req a1b2c3d4", "kind": 1},
        {"attributes": SEMCONV_NEW, "name": "chat gpt-4o", "kind": 3, "status": (2, "deadline")},
        {"attributes": SEMCONV_OLD, "name": "chat gpt-4", "kind": 3, "parent_span_id": b"\x01" * 8},
        {"attributes": {"http.route": "/v1/chat", "host.name": "gw-override", "gen_ai.usage.input_tokens": "12.7"},
         "name": "POST /v1/chat", "kind": 2, "status": (2, ""),
         "events": [("log", {"k": "v"}), ("exception", {"exception.type": "TimeoutError"})]},
        {"attributes": {"http.route": "/v1/chat", "http.request.resend_count": 2**40}, "name": "POST", "kind": 3,
         "status": (2, "")},
    ]  # fmt: skip
    return trace_request(spans, resource=resource)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    return bool(a == b)


@pytest.mark.parametrize("old_spelling", [False, True])
def test_exported_spans_read_as_the_receiver_decodes_them(tmp_path: Path, old_spelling: bool) -> None:
    request = _request()
    decoded = decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    expected = sorted(decoded.to_pylist(), key=lambda row: row["span_id"])
    got = _chdb_spans(tmp_path, request, old_spelling=old_spelling)
    assert len(got) == len(expected) == 7
    columns = [c.name for c in SPAN_COLUMNS if c.name not in ("attributes", "resource_attributes")]
    mismatches = [
        (row["name"], column, row[column], mine[column])
        for row, mine in zip(expected, got, strict=True)
        for column in columns
        if not _same(row[column], mine[column])
    ]
    assert mismatches == []


def test_the_maps_are_the_exporters_maps(tmp_path: Path) -> None:
    got = _chdb_spans(tmp_path, _request(), old_spelling=False)
    gateway = next(row for row in got if row["name"] == "POST /v1/chat")
    assert dict(gateway["attributes"])["http.route"] == "/v1/chat"
    assert dict(gateway["resource_attributes"])["host.name"] == "gpu-1"
    # host.name is resource-first: the span attribute does not override the resource's.
    assert gateway["host_name"] == "gpu-1"


_NUMERIC_KEYS = [
    "gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens", "gen_ai.usage.completion_tokens",
    "gen_ai.latency.time_to_first_token", "gen_ai.latency.time_in_model_prefill", "gen_ai.latency.e2e",
    "http.request.resend_count",
]  # fmt: skip
_TEXT_KEYS = ["gen_ai.response.finish_reasons", "tenant.id"]
_NOT_DOUBLES = st.one_of(
    st.integers(min_value=-(2**62), max_value=2**62),
    st.booleans(),
    st.from_regex(r"-?[0-9]{1,6}(\.[0-9]{1,4})?", fullmatch=True),
    st.lists(st.sampled_from(["stop", "length"]), max_size=2),
    st.sampled_from(["", "x", '["stop"]', "[]"]),
)
_DOUBLES = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False).filter(lambda x: x == 0 or abs(x) > 1e-9)
# A double under a text key is spelled by whoever wrote it (Arrow's shortest form here, Go's
# in the exporter: 5e-05 against 0.00005), so text keys get every kind but doubles.
_ATTRIBUTES = st.fixed_dictionaries(
    {},
    optional={
        **{key: st.one_of(_NOT_DOUBLES, _DOUBLES) for key in _NUMERIC_KEYS},
        **dict.fromkeys(_TEXT_KEYS, _NOT_DOUBLES),
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spans=st.lists(_ATTRIBUTES, min_size=1, max_size=4))
def test_attribute_values_of_every_kind_type_alike(
    tmp_path_factory: pytest.TempPathFactory, spans: list[dict[str, Any]]
) -> None:
    # Any AnyValue kind under a canonical key (an int, a double, a bool, a numeric string, an
    # array) types to the same canonical value in ClickHouse as in the receiver.
    request = trace_request([{"attributes": attributes} for attributes in spans])
    decoded = decode_traces(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    expected = sorted(decoded.to_pylist(), key=lambda row: row["span_id"])
    got = _chdb_spans(tmp_path_factory.mktemp("fuzz"), request, old_spelling=False)
    columns = ["input_tokens", "output_tokens", "ttft_s", "prefill_s", "e2e_s", "queue_s", "attempt",
               "finish_reason", "tenant_id", "is_engine", "tpot_s"]  # fmt: skip
    for row, mine in zip(expected, got, strict=True):
        assert [(c, mine[c]) for c in columns if not _same(row[c], mine[c])] == [], (row, mine)


def test_exported_metric_points_read_as_the_receiver_decodes_them(tmp_path: Path) -> None:
    from chdb import session

    resource = {"service.name": "vllm", "service.version": "v2", "host.name": "gpu-1", "k8s.pod.name": "pod-1"}
    labels = {"model_name": "llama", "engine": "0"}
    request = metrics_request(
        [
            {"name": "vllm:num_requests_running", "kind": "gauge",
             "points": [{"time": T0 + i * 10**9, "value": 3 + i, "attributes": labels} for i in range(3)]},
            {"name": "vllm:prompt_tokens_total", "kind": "sum", "unit": "tokens",
             "points": [{"time": T0 + i * 10**9, "start": T0 - 10**9, "value": 100 * i, "attributes": labels}
                        for i in range(3)]},
            {"name": "vllm:gpu_cache_usage_perc", "kind": "gauge", "points": [{"time": T0, "value": 0.5}]},
            {"name": "vllm:e2e_request_latency_seconds", "kind": "histogram", "temporality": 1, "unit": "s",
             "points": [{"time": T0 + i * 10**9, "count": 4 * i, "sum": 1.5 * i, "bounds": [0.1, 1.0],
                         "bucket_counts": [i, 2 * i, i], "attributes": labels} for i in range(3)]},
        ],
        resource=resource,
    )  # fmt: skip
    decoded = decode_metrics(request.SerializeToString(), "application/x-protobuf", normaliser=NORM).table
    db = session.Session(str(tmp_path / "chdb"))
    try:
        create_tables(db)
        insert_metric_rows(db, exporter_metric_rows(request), tmp_path)
        got = db.query(f"SELECT * FROM ({metric_points_select()}) ORDER BY name, time_ns", "ArrowTable").to_pylist()
    finally:
        db.close()
    expected = sorted(decoded.to_pylist(), key=lambda row: (row["name"], row["time_ns"]))
    assert len(got) == len(expected) == 10
    columns = [
        c.name for c in METRIC_POINT_COLUMNS if c.name not in ("series_key", "resource_attributes", "attributes")
    ]
    mismatches = [
        (row["name"], column, row[column], mine[column])
        for row, mine in zip(expected, got, strict=True)
        for column in columns
        if not _same(row[column], mine[column]) and not (row[column] is None and mine[column] == [])
    ]
    assert mismatches == []
    # series_key is this store's own identity: it groups the points as the receiver's does.
    assert len({r["series_key"] for r in got}) == len({r["series_key"] for r in expected}) == 4
