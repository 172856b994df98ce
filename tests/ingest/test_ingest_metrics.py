"""Metric points: names normalised, histograms, counters and temporality."""

from __future__ import annotations

import pytest
from otlp_builders import T0, metrics_request

from sre_agent.ingest.normalise import Normaliser
from sre_agent.ingest.otlp import decode_metrics
from sre_agent.store.embedded import Store
from sre_agent.store.schema import metric_points_arrow_schema

PROTOBUF = "application/x-protobuf"
LABELS = {"model_name": "llama-8b", "engine": "0"}


@pytest.fixture
def norm() -> Normaliser:
    return Normaliser(hash_key=b"k")


def _decode(metrics: list[dict], norm: Normaliser, resource: dict | None = None):  # type: ignore[no-untyped-def]
    body = metrics_request(metrics, resource=resource).SerializeToString()
    return decode_metrics(body, PROTOBUF, normaliser=norm)


@pytest.mark.parametrize(
    ("received", "canonical"),
    [
        ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
        ("vllm:prefix_cache_hits", "vllm:prefix_cache_hits"),
        ("vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits"),
        ("vllm:gpu_prefix_cache_queries", "vllm:prefix_cache_queries"),
        ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
        ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        ("sglang:num_retracted_requests_total", "sglang:num_retracted_requests"),
    ],
)
def test_total_suffix_and_old_names_meet(received: str, canonical: str, norm: Normaliser) -> None:
    decoded = _decode(
        [{"name": received, "kind": "sum", "points": [{"time": T0, "value": 5, "attributes": LABELS}]}], norm
    )
    (row,) = decoded.table.to_pylist()
    assert (row["name"], row["source_name"], row["kind"]) == (canonical, received, "sum")
    assert (row["value"], row["is_monotonic"], row["temporality"]) == (5.0, True, "cumulative")
    assert row["model"] == "llama-8b"


def test_same_series_under_both_spellings_has_one_key(norm: Normaliser, tmp_path) -> None:
    point = {"time": T0, "value": 10, "attributes": LABELS}
    with_total = _decode([{"name": "vllm:prompt_tokens_total", "kind": "sum", "points": [point]}], norm).table
    without = _decode([{"name": "vllm:prompt_tokens", "kind": "sum", "points": [point]}], norm).table
    assert with_total["series_key"].to_pylist() == without["series_key"].to_pylist()
    other_labels = _decode(
        [{"name": "vllm:prompt_tokens", "kind": "sum", "points": [{**point, "attributes": {"model_name": "x"}}]}],
        norm,
    ).table
    assert other_labels["series_key"].to_pylist() != without["series_key"].to_pylist()
    with Store.open(tmp_path / "m.duckdb") as store:
        assert store.append_metric_points(with_total) == 1
        assert store.append_metric_points(without) == 0


def test_histogram_bounds_and_counts(norm: Normaliser) -> None:
    histogram = {
        "name": "vllm:time_to_first_token_seconds",
        "kind": "histogram",
        "temporality": 2,
        "unit": "s",
        "points": [
            {
                "time": T0,
                "start": T0 - 10**9,
                "count": 6,
                "sum": 1.7,
                "bounds": [0.1, 0.5, 1.0],
                "bucket_counts": [1, 2, 3, 0],
                "attributes": LABELS,
            },
        ],
    }
    (row,) = _decode([histogram], norm).table.to_pylist()
    assert row["kind"] == "histogram"
    assert (row["count"], row["sum"], row["value"]) == (6, 1.7, None)
    assert row["bounds"] == [0.1, 0.5, 1.0]
    assert row["bucket_counts"] == [1, 2, 3, 0]
    assert (row["temporality"], row["unit"], row["start_time_ns"]) == ("cumulative", "s", T0 - 10**9)


def test_iteration_tokens_total_is_a_histogram_with_trimmed_name(norm: Normaliser) -> None:
    histogram = {
        "name": "vllm:iteration_tokens_total",
        "kind": "histogram",
        "points": [{"time": T0, "count": 1, "sum": 8.0, "bounds": [1, 8], "bucket_counts": [0, 1, 0]}],
    }
    (row,) = _decode([histogram], norm).table.to_pylist()
    assert (row["name"], row["kind"]) == ("vllm:iteration_tokens", "histogram")


def test_histogram_with_mismatched_buckets_is_rejected_alone(norm: Normaliser) -> None:
    bad = {"time": T0, "count": 1, "sum": 1.0, "bounds": [1.0, 2.0], "bucket_counts": [1]}
    good = {"time": T0 + 1, "count": 1, "sum": 1.0, "bounds": [1.0], "bucket_counts": [1, 0]}
    decoded = _decode([{"name": "h", "kind": "histogram", "points": [bad, good]}], norm)
    assert decoded.rejected == 1
    assert decoded.table.num_rows == 1
    assert "bucket counts" in decoded.errors[0]


def test_gauges_delta_sums_and_non_monotonic(norm: Normaliser) -> None:
    decoded = _decode(
        [
            {"name": "vllm:num_requests_running", "kind": "gauge", "points": [{"time": T0, "value": 3}]},
            {"name": "vllm:kv_cache_usage_perc", "kind": "gauge", "points": [{"time": T0, "value": 0.75}]},
            {"name": "requests.delta", "kind": "sum", "temporality": 1, "points": [{"time": T0, "value": 2}]},
            {"name": "queue.updown", "kind": "sum", "monotonic": False, "points": [{"time": T0, "value": -1}]},
        ],
        norm,
        resource={"service.name": "vllm", "service.version": "v2", "k8s.pod.name": "pod-1", "host.name": "h"},
    )
    rows = {r["name"]: r for r in decoded.table.to_pylist()}
    assert rows["vllm:num_requests_running"]["value"] == 3.0
    assert rows["vllm:num_requests_running"]["temporality"] is None
    assert rows["vllm:num_requests_running"]["is_monotonic"] is None
    assert rows["vllm:kv_cache_usage_perc"]["value"] == 0.75
    assert rows["requests.delta"]["temporality"] == "delta"
    assert rows["queue.updown"]["is_monotonic"] is False
    first = rows["vllm:num_requests_running"]
    assert (first["service_name"], first["service_version"], first["service_instance"], first["host_name"]) == (
        "vllm",
        "v2",
        "pod-1",
        "h",
    )


def test_point_without_time_is_rejected(norm: Normaliser) -> None:
    decoded = _decode([{"name": "g", "kind": "gauge", "points": [{"time": 0, "value": 1.0}]}], norm)
    assert (decoded.rejected, decoded.table.num_rows) == (1, 0)
    assert decoded.table.schema == metric_points_arrow_schema()


def test_exponential_histogram_and_summary(norm: Normaliser) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest()
    metrics = request.resource_metrics.add().scope_metrics.add().metrics
    exponential = metrics.add(name="latency.exp").exponential_histogram
    exponential.aggregation_temporality = 1
    point = exponential.data_points.add(time_unix_nano=T0, count=6, sum=9.0, scale=0, zero_count=1)
    point.positive.offset = 1
    point.positive.bucket_counts.extend([2, 3])
    summary = metrics.add(name="latency.summary").summary
    summary.data_points.add(time_unix_nano=T0, count=4, sum=2.0)
    rows = {
        r["name"]: r for r in decode_metrics(request.SerializeToString(), PROTOBUF, normaliser=norm).table.to_pylist()
    }
    exp = rows["latency.exp"]
    # scale 0: base 2, bucket k covers (2**k, 2**(k+1)]; zero and negative counts fold into the first bucket
    assert exp["bounds"] == [2.0, 4.0, 8.0]
    assert exp["bucket_counts"] == [1, 2, 3, 0]
    assert (exp["kind"], exp["temporality"], exp["count"], exp["sum"]) == ("exponential_histogram", "delta", 6, 9.0)
    assert (rows["latency.summary"]["count"], rows["latency.summary"]["sum"]) == (4, 2.0)
