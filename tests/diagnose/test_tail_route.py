"""The tail-exceedance route to a significant tail quantile (diagnosis._tail_exceeded).

A p99 of 1,000 requests rests on its ten slowest: its CI is as wide as the gaps
between them, and 30 % of the traffic answering 2.5x longer (a new tenant's
long answers) moved it 1.5-2x with a CI through zero in most draws. The share of requests
beyond the baseline's p99 uses every request. These tests hold the route to
what it claims: it finds that change, stays quiet on two draws of one
distribution (at the rate its bar allows) and says nothing about the median.
"""

from __future__ import annotations

import math

import numpy as np

from sre_agent.analysis import stats
from sre_agent.analysis.headline import _tail_exceeded
from sre_agent.analysis.stats import SliceHistogram

N = 1000
#: The family-wise bar of five headline latencies (diagnosis.FAMILY_ALPHA / 5).
Z_CRIT = stats.normal_isf(0.025 / 5)


def _side(seed: int, heavy_share: float = 0.0) -> SliceHistogram:
    """1,000 lognormal latencies (median 3 s) over 40 time slices (as a side's); ``heavy_share`` of them 2.5x longer."""
    rng = np.random.default_rng(seed)
    values = rng.lognormal(math.log(3.0), 0.8, N)
    values[rng.random(N) < heavy_share] *= 2.5
    return SliceHistogram.from_values(np.arange(N) * 40 // N, values)


def test_a_heavier_tail_is_found_where_the_p99_ci_misses_it() -> None:
    tail_route = ci_route = 0
    for seed in range(20):
        baseline, candidate = _side(100 + seed), _side(200 + seed, heavy_share=0.3)
        tail_route += _tail_exceeded(baseline, candidate, 0.99, Z_CRIT)
        cq = stats.compare_quantile(baseline, candidate, 0.99)
        assert cq.ratio is not None
        assert cq.log_ratio_se is not None
        ci_route += math.log(cq.ratio) >= Z_CRIT * cq.log_ratio_se
    # 18 and 8 of 20 when written: the share test finds what the quantile's own CI misses.
    assert tail_route >= 16
    assert ci_route <= tail_route // 2


def test_two_draws_of_one_distribution_pass_at_the_rate_the_bar_allows() -> None:
    # One-sided at p = 0.005: one false call in 200 is expected; four would be a miscalibrated test.
    fired = sum(_tail_exceeded(_side(1000 + i), _side(5000 + i), 0.99, Z_CRIT) for i in range(200))
    assert fired <= 3


def test_the_median_is_left_to_its_ci() -> None:
    baseline, candidate = _side(7), _side(8, heavy_share=0.5)
    assert not _tail_exceeded(baseline, candidate, 0.5, Z_CRIT)
    assert _tail_exceeded(baseline, candidate, 0.9, Z_CRIT)


def test_a_lighter_tail_is_no_regression() -> None:
    assert not _tail_exceeded(_side(11, heavy_share=0.2), _side(12), 0.99, Z_CRIT)
