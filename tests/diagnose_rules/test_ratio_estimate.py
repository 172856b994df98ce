"""``ratio_estimate`` on rows that are already aggregates (spans per slice) says what per-span rows say."""

from __future__ import annotations

import numpy as np
import polars as pl

from sre_agent.rules._mechanism import ratio_estimate, z_change


def _spans(rng: np.random.Generator, mean_s: float, slices: int = 20, per_slice: int = 90) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "slice": np.repeat(np.arange(slices), per_slice),
            "duration_s": rng.lognormal(np.log(mean_s), 0.3, slices * per_slice),
        }
    )


def _per_slice(spans: pl.DataFrame) -> pl.DataFrame:
    return spans.group_by("slice").agg(pl.col("duration_s").sum().alias("total_s"), pl.len().alias("n"))


def test_aggregated_rows_give_the_per_span_estimate() -> None:
    # The dependency rule reads spans per slice (count and sum). Its standard error was floored at
    # 1/rows: with 20 slices, 0.05 s for a 26 ms mean, so a guardrail 6x slower (26 -> 155 ms over
    # 1,890 spans a side) scored z = 1.8 and no rule explained the regression. Counted per span,
    # the floor is one span's worth and the estimate matches the per-span one.
    rng = np.random.default_rng(3)
    spans = _spans(rng, 0.026)
    per_span = ratio_estimate(spans, pl.col("duration_s"), pl.lit(1.0))
    agg = _per_slice(spans)
    per_slice = ratio_estimate(agg, pl.col("total_s"), pl.col("n"), observations=pl.col("n"))
    assert per_span.value is not None
    assert per_slice.value is not None
    assert abs(per_slice.value - per_span.value) < 1e-12
    assert per_slice.n == per_span.n == spans.height
    assert per_span.se / 2 <= per_slice.se <= 2 * per_span.se
    assert per_slice.se < 0.005


def test_a_sixfold_slower_span_group_is_significant_from_slice_aggregates() -> None:
    rng = np.random.default_rng(4)
    base, cand = _per_slice(_spans(rng, 0.026)), _per_slice(_spans(rng, 0.155))
    est = [ratio_estimate(f, pl.col("total_s"), pl.col("n"), observations=pl.col("n")) for f in (base, cand)]
    assert z_change(*est) > 10
    # Two draws of the same spans are not (the finer floor does not make noise significant).
    rng = np.random.default_rng(5)
    base, same = _per_slice(_spans(rng, 0.026)), _per_slice(_spans(rng, 0.026))
    est = [ratio_estimate(f, pl.col("total_s"), pl.col("n"), observations=pl.col("n")) for f in (base, same)]
    assert abs(z_change(*est)) < 3
