"""Prefill time per uncached prompt token rose at a comparable batch size.

Mechanism: prefill cost grows with the prompt tokens actually computed (the
uncached ones) and with what shares the steps (the running batch). When
prefill per uncached token rises at the same batch size and prompt length,
the prefill path itself got slower (attention kernel, structured-output or
multimodal preprocessing, tokenisation moved into the engine clock). A fall
of the prefix-cache hit rate adds uncached tokens but does not change the
cost *per uncached token*, so it stays ``prefix_cache``'s finding.

Signal: ``prefill_s / uncached tokens`` per request, uncached = input -
cached tokens (cached from the span; when spans lack it, input x (1 - the
side's hit rate from the prefix-cache counters); with no cache signal at all
every prompt token counts as uncached and confidence is halved), compared as
a log within buckets of running batch (at the request's scheduling, from span
overlap) x uncached tokens (factor-4 buckets).

``explained`` (0..1): the prefill stage's share of the headline's tail
excess (plus the queue's share at unchanged load per replica without more
preemptions, as in ``decode_slowdown``) times the share of the raw log change
that remains at equal buckets.

``confidence``: as ``decode_slowdown`` (significance x effect size x coverage,
x 0.4 when the step cap moved, x 0.25 when the uncached work per request changed), halved without any
cache signal.

Quiet below a 10 % rise at equal buckets or z < 2.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from sre_agent.compare import Comparison
from sre_agent.decompose import StageDecomposition
from sre_agent.metric_view import MetricView
from sre_agent.rules._mechanism import (
    assess_slowdown,
    batch_shape,
    metric_hit_rate,
    require_both_sides,
    service_time_queue_share,
    stage_share,
    with_running,
)
from sre_agent.rules_api import Evidence, Finding, Regression

#: Confidence factor when nothing says how many prompt tokens were cached.
NO_CACHE_SIGNAL_DAMPING: Final[float] = 0.5

NEXT_CHECK: Final[str] = (
    "benchmark prefill of fixed uncached prompts at equal batch size on both versions; diff attention "
    "backend, kernel and structured-output/tokenizer versions; check TTFT split by response_format"
)


def prefill_slowdown(
    comparison: Comparison, regression: Regression, stages: StageDecomposition, metrics: MetricView
) -> Finding | None:
    """A ``prefill_slowdown`` finding when prefill per uncached token rose at equal batch size."""
    frame = comparison.requests.filter(pl.col("prefill_s").is_not_null() & (pl.col("input_tokens") > 0))
    require_both_sides(frame, "per-request prefill timing")
    hit = metric_hit_rate(metrics, comparison.request_counts)
    cache_known = hit is not None or frame["cached_tokens"].drop_nulls().len() > 0
    side_hit = pl.lit(0.0)
    if hit is not None:
        side_hit = pl.when(pl.col("side") == "baseline").then(hit[0].baseline).otherwise(hit[0].candidate)
    uncached = (pl.col("input_tokens") - pl.col("cached_tokens").fill_null(pl.col("input_tokens") * side_hit)).clip(
        1, None
    )
    frame = frame.with_columns(uncached.alias("uncached_tokens")).with_columns(
        (pl.col("prefill_s") / pl.col("uncached_tokens")).alias("prefill_s_per_uncached_token")
    )
    frame, running = with_running(comparison, frame, "prefill", pl.col("uncached_tokens"))
    verdict = assess_slowdown(
        frame,
        cost="prefill_s_per_uncached_token",
        unit="s/token",
        share=stage_share(stages, "prefill", regression, comparison)
        + service_time_queue_share(comparison, stages, regression, metrics),
        batch=batch_shape(metrics, comparison.request_counts),
        running=running,
    )
    if verdict is None:
        return None
    confidence = verdict.confidence
    evidence = verdict.evidence
    if not cache_known:
        confidence *= NO_CACHE_SIGNAL_DAMPING
        evidence += (Evidence("cached_tokens", None, None, "no cache signal: every prompt token counted as uncached"),)
    return Finding(
        cause="prefill_slowdown",
        title=f"Prefill time per uncached prompt token rose {verdict.rise:.0%} at the same running batch size",
        explained=verdict.explained,
        confidence=confidence,
        stage="prefill",
        evidence=evidence,
        next_check=NEXT_CHECK,
    )
