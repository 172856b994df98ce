"""The canonical schema: DDL and Arrow schemas agree; metric names meet."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from sre_agent import schema


def test_ddl_creates_the_declared_columns(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    for ddl in (schema.SPANS_DDL, schema.METRIC_POINTS_DDL, schema.DEPLOYS_DDL):
        con.execute(ddl)
    stored = ["extra_resource_attributes", "extra_attributes", "promoted"]  # span_rows' own, seen through the view
    for table, columns, extra in (
        ("spans", schema.SPAN_COLUMNS, stored),
        ("metric_points", schema.METRIC_POINT_COLUMNS, []),
    ):
        got = [row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()]
        assert got == [c.name for c in columns] + extra
    # An Arrow batch with the declared schema appends without casts, in its stored form.
    from sre_agent._span_rows import to_span_rows

    con.register("batch", to_span_rows(schema.spans_arrow_schema().empty_table()))
    con.execute("INSERT INTO span_rows SELECT * FROM batch")


def test_promoted_keys_are_exactly_the_attribute_sources() -> None:
    # The stored bits index PROMOTED_KEYS, so it is kept by hand in a fixed order; a source
    # added to SPAN_ATTRIBUTE_SOURCES without a promoted key would simply stay in the maps,
    # a new key must be appended here too.
    sources = {(key, column) for column, keys in schema.SPAN_ATTRIBUTE_SOURCES.items() for key in keys}
    assert set(schema.PROMOTED_KEYS) == sources
    assert len(schema.PROMOTED_KEYS) == len(sources) <= schema.RESOURCE_BIT_OFFSET


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
