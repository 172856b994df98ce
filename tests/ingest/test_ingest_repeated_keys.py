"""A key repeated within one attribute list keeps its first value, so the batch still commits.

OTLP requires unique attribute keys but cannot enforce them; DuckDB refuses a
MAP with a repeated key, which used to fail the whole commit (and the client's
retries with it).
"""

from __future__ import annotations

from pathlib import Path

from otlp_builders import T0, key_values, metrics_request, trace_request

from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_metrics, decode_traces
from sre_agent.store.embedded import Store

NORM = Normaliser(hash_key=b"k")
PROTOBUF = "application/x-protobuf"


def test_repeated_span_and_resource_keys_keep_the_first_value(tmp_path: Path) -> None:
    spans = [{"attributes": {"a": "1", "gen_ai.request.model": "m1"}, "start": T0 + i} for i in range(3)]
    request = trace_request(spans, resource={"service.name": "first"})
    span = request.resource_spans[0].scope_spans[0].spans[1]
    span.attributes.extend(key_values({"a": "2", "b": 3, "gen_ai.request.model": "m2"}))
    span.attributes.extend(key_values({"b": 4}))
    request.resource_spans[0].resource.attributes.extend(key_values({"service.name": "second"}))
    table = decode_traces(request.SerializeToString(), PROTOBUF, normaliser=NORM).table

    assert [dict(m) for m in table["attributes"].to_pylist()] == [
        {"a": "1", "gen_ai.request.model": "m1"},
        {"a": "1", "gen_ai.request.model": "m1", "b": "3"},
        {"a": "1", "gen_ai.request.model": "m1"},
    ]
    assert [len(m) for m in table["attributes"].to_pylist()] == [2, 3, 2]
    assert table["resource_attributes"].to_pylist() == [[("service.name", "first")]] * 3
    assert table["model"].to_pylist() == ["m1"] * 3
    assert table["service_name"].to_pylist() == ["first"] * 3
    with Store.open(tmp_path / "s.duckdb") as store:
        assert store.append_spans(table) == 3
        row = store.connection.execute("SELECT attributes['b'] FROM spans WHERE attributes['b'] IS NOT NULL").fetchone()
    assert row == ("3",)


def test_repeated_metric_point_keys_keep_the_first_value(tmp_path: Path) -> None:
    point = {"time": T0, "value": 1.5, "attributes": {"model_name": "llama"}}
    request = metrics_request([{"name": "vllm:num_requests_running", "kind": "gauge", "points": [point]}])
    request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].attributes.extend(
        key_values({"model_name": "other"})
    )
    request.resource_metrics[0].resource.attributes.extend(key_values({"service.name": "again"}))
    table = decode_metrics(request.SerializeToString(), PROTOBUF, normaliser=NORM).table
    assert table["attributes"].to_pylist() == [[("model_name", "llama")]]
    assert table["resource_attributes"].to_pylist() == [[("service.name", "vllm-server")]]
    with Store.open(tmp_path / "m.duckdb") as store:
        assert store.append_metric_points(table) == 1
