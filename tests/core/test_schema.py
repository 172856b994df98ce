"""The canonical schema: DDL and Arrow schemas agree; metric names meet."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from sre_agent.store import schema


def test_ddl_creates_the_declared_columns(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    for ddl in (schema.SPANS_DDL, schema.METRIC_POINTS_DDL, schema.DEPLOYS_DDL):
        con.execute(ddl)
    # span_rows' own, seen through the view
    stored = ["extra_resource_attributes", "extra_attributes", "promoted", "promoted_resource"]
    for table, columns, extra in (
        ("spans", schema.SPAN_COLUMNS, stored),
        ("metric_points", schema.METRIC_POINT_COLUMNS, []),
    ):
        got = [row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()]
        assert got == [c.name for c in columns] + extra
    # An Arrow batch with the declared schema appends without casts, in its stored form.
    from sre_agent.store.span_rows import to_span_rows

    con.register("batch", to_span_rows(schema.spans_arrow_schema().empty_table()))
    con.execute("INSERT INTO span_rows SELECT * FROM batch")


# span_rows.promoted stores bit i for PROMOTED_KEYS[i] (schema 2; promoted_resource too since schema 3):
# stores already written depend on this order, so it is pinned here; a new attribute source may only
# be appended.
_STORED_BIT_ORDER = (
    "service.name", "service.version", "service.instance.id", "k8s.pod.name", "host.name", "k8s.node.name",
    "tenant.id", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.request.id", "rid",
    "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens", "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cached_tokens",
    "gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_scheduler", "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.time_in_model_prefill", "gen_ai.latency.time_in_model_decode",
    "gen_ai.latency.time_in_model_inference", "gen_ai.latency.time_in_model_execute", "gen_ai.latency.e2e",
    "gen_ai.response.finish_reasons", "finish_reason", "http.request.resend_count", "error.type", "exception.type",
    # schema 3
    "gen_ai.request.max_tokens", "gen_ai.request.temperature", "gen_ai.request.top_p", "gen_ai.request.choice.count",
    "gen_ai.request.n",
)  # fmt: skip


def test_the_stored_bit_order_only_grows() -> None:
    keys = [key for key, _ in schema.PROMOTED_KEYS]
    assert tuple(keys[: len(_STORED_BIT_ORDER)]) == _STORED_BIT_ORDER
    assert len(keys) == len(set(keys)) <= schema.MAX_PROMOTED_KEYS


@pytest.mark.parametrize(
    ("received", "canonical"),
    [
        ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
        ("vllm:prefix_cache_hits", "vllm:prefix_cache_hits"),
        ("vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits"),
        ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
        ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        ("vllm:iteration_tokens_total", "vllm:iteration_tokens"),
        ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds"),
        ("sglang:num_retracted_requests_total", "sglang:num_retracted_requests"),
    ],
)
def test_metric_names_meet(received: str, canonical: str) -> None:
    assert schema.canonical_metric_name(received) == canonical


def test_every_signal_names_canonical_metrics() -> None:
    for names in schema.METRIC_SIGNALS.values():
        for name in names:
            assert schema.canonical_metric_name(name) == name


def test_attribute_sources_target_real_columns() -> None:
    columns = {c.name for c in schema.SPAN_COLUMNS}
    assert set(schema.SPAN_ATTRIBUTE_SOURCES) <= columns
    assert set(schema.LATENCY_COLUMNS) <= columns
