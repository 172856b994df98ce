"""The metric histograms' share route to a significant quantile (headline._histogram_share_rise).

Without spans, a quantile comes from bucket counts. Its order-statistic interval runs out to
the bucket edges and counts the observations' independence from raw scrape blocks, each one
replica's scrape: two replicas that differ count as time correlation. The share of
observations above the baseline quantile's bucket, with its variance over time slices that
merge the scrapes, uses every observation. These tests hold the route to what it claims: it
finds a change the intervals miss behind replica differences, stays quiet on two draws of one
distribution at the rate its bar allows, counts minute-long swings through its time-block
variance, holds a variance from a handful of scrapes to Student's t, and says nothing where
it cannot.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sre_agent.analysis import stats
from sre_agent.analysis.headline import _histogram_share_rise
from sre_agent.analysis.histogram_delta import HistogramDelta

#: vLLM's TTFT histogram bounds (seconds), up to 2.5 s.
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)
#: A side's scrapes (a 5-minute window scraped every 5 s).
BLOCKS = 60
#: The level of the metric-only family: e2e, TTFT and ITL, the route at half their level.
LEVEL = 0.025 / 6


def _side(
    seed: int, n: int, median_s: float, *, swing: float = 0.0, replica_spread: float = 1.0, blocks: int = BLOCKS
) -> HistogramDelta:
    """``n`` lognormal TTFTs over ``blocks`` scrapes.

    ``swing``: sd of a log speed shared by 12 consecutive scrapes (a minute); ``replica_spread``:
    how much slower the second of two replicas is, the scrapes alternating between them.
    """
    rng = np.random.default_rng(seed)
    block = np.arange(n) * blocks // n
    shared = rng.normal(0.0, swing, blocks // 12 + 1)[block // 12] if swing else 0.0
    replica = np.where(block % 2 == 1, math.log(replica_spread), 0.0)
    values = np.exp(math.log(median_s) + shared + replica + rng.normal(0.0, 0.8, n))
    bucket = np.searchsorted(TTFT_BOUNDS, values, side="left")
    rows = np.zeros((blocks, len(TTFT_BOUNDS) + 1), dtype=int)
    np.add.at(rows, (block, bucket), 1)
    total = rows.sum(axis=0)
    return HistogramDelta(
        TTFT_BOUNDS, tuple(int(c) for c in total), float(values.sum()), tuple(tuple(int(c) for c in r) for r in rows)
    )


def _rose(baseline: HistogramDelta, candidate: HistogramDelta, q: float) -> bool:
    """The route as the headline applies it: significant, and the quantile up by the metric bar (x1.2)."""
    rise = _histogram_share_rise(baseline, candidate, q, 40)
    bq, cq = baseline.quantile(q), candidate.quantile(q)
    return rise is not None and rise.beyond(LEVEL) and bool(bq and cq and cq / bq >= 1.2)


def _apart(baseline: HistogramDelta, candidate: HistogramDelta, q: float) -> bool:
    """The metric route's other test: the two sides' order-statistic intervals do not overlap (and x1.2)."""
    b, c = baseline.quantile_interval(q), candidate.quantile_interval(q)
    bq, cq = baseline.quantile(q), candidate.quantile(q)
    return bool(b and c and c[0] >= b[1] and bq and cq and cq / bq >= 1.2)


def test_a_slower_median_is_found_where_replica_differences_hide_it_from_the_intervals() -> None:
    share_route = interval_route = 0
    for seed in range(40):
        baseline = _side(100 + seed, 600, 0.05, replica_spread=2.5)
        candidate = _side(200 + seed, 600, 0.07, replica_spread=2.5)
        share_route += _rose(baseline, candidate, 0.5)
        interval_route += _apart(baseline, candidate, 0.5)
    # 38 and 6 of 40 when written.
    assert share_route >= 34
    assert interval_route <= share_route // 2


def test_two_draws_of_one_distribution_pass_at_the_rate_the_bar_allows() -> None:
    # One-sided at p = 0.004: about one false call in 240 expected; four in 200 is miscalibrated.
    pairs = [(_side(1000 + i, 400, 0.08), _side(5000 + i, 400, 0.08)) for i in range(100)]
    fired = sum(_rose(baseline, candidate, q) for baseline, candidate in pairs for q in (0.5, 0.9))
    assert fired <= 3


def test_a_minute_long_swing_widens_the_variance_instead_of_firing() -> None:
    # Both sides' speed wanders by a shared +-30 % for a minute at a time: the share above an edge
    # swings with it. Binomial variances alone call many such pairs regressed; the time blocks do not.
    fired = naive = 0
    for i in range(200):
        baseline, candidate = _side(300 + i, 400, 0.08, swing=0.3), _side(700 + i, 400, 0.08, swing=0.3)
        fired += _rose(baseline, candidate, 0.5)
        rise = _histogram_share_rise(baseline, candidate, 0.5, 40)
        assert rise is not None
        pb, pc = rise.baseline, rise.candidate
        binomial = math.sqrt(pb * (1 - pb) / baseline.count + pc * (1 - pc) / candidate.count)
        naive += (pc - pb) / binomial >= stats.normal_isf(LEVEL)
    assert fired <= 4
    assert naive >= 3 * max(1, fired)


def test_a_variance_from_four_scrapes_is_held_to_students_t() -> None:
    # A 30 s scrape of a bursty 5-minute window: four scrapes a side hold requests. Their variance
    # has 3 df, and the normal bar would take its noise for evidence.
    baseline, candidate = _side(21, 240, 0.06, blocks=4), _side(22, 480, 0.09, blocks=4)
    rise = _histogram_share_rise(baseline, candidate, 0.5, 40)
    assert rise is not None
    assert rise.t >= stats.normal_isf(LEVEL)  # what the normal bar would have called a regression
    assert rise.df < 3
    assert not rise.beyond(LEVEL)


@pytest.mark.parametrize(
    ("df", "p", "exact"),
    [(3, 0.005, 5.841), (4, 0.005, 4.604), (5, 0.025, 2.571), (10, 0.005, 3.169), (30, 0.005, 2.750)],
)
def test_student_t_quantile_matches_the_table(df: int, p: float, exact: float) -> None:
    assert stats.student_t_isf(p, df) == pytest.approx(exact, rel=0.01)


def test_below_three_degrees_of_freedom_nothing_is_significant() -> None:
    assert stats.student_t_isf(0.025, 2) == math.inf


def test_no_blocks_or_a_quantile_in_the_open_bucket_says_nothing() -> None:
    baseline = _side(1, 400, 0.08)
    bare = HistogramDelta(baseline.bounds, baseline.counts, baseline.total_sum)
    assert _histogram_share_rise(bare, _side(2, 400, 0.3), 0.5, 40) is None
    # Every observation above 2.5 s: the quantile's bucket is +Inf, no edge above it.
    slow = _side(3, 400, 30.0)
    assert _histogram_share_rise(slow, _side(4, 400, 60.0), 0.99, 40) is None
