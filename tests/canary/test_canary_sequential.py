"""The confidence sequences keep their coverage under repeated polling of a growing sample."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sre_agent.canary.sequential import (
    histogram_quantile_cs,
    point_rank,
    quantile_cs_ranks,
    rank_bounds,
)

ALPHA = 0.05
STREAMS = 400
# Monte-Carlo slack: 2 standard errors of a rate near alpha over STREAMS streams.
SLACK = 2 * math.sqrt(ALPHA * (1 - ALPHA) / STREAMS)
POLLS = np.unique(np.geomspace(20, 3000, 40).astype(int))


def _any_poll_misses(
    data: np.ndarray, p: float, truth: float, ranks: dict[int, tuple[int | None, int | None]]
) -> float:
    """Share of streams where some poll's interval excludes the true quantile."""
    missed = np.zeros(data.shape[0], dtype=bool)
    for t in POLLS:
        lower, upper = ranks[int(t)]
        prefix = np.sort(data[:, :t], axis=1)
        lo = prefix[:, lower - 1] if lower is not None else np.zeros(data.shape[0])
        hi = prefix[:, upper - 1] if upper is not None else np.full(data.shape[0], np.inf)
        missed |= (lo > truth) | (hi < truth)
    return float(missed.mean())


@pytest.mark.parametrize("p", [0.5, 0.99])
def test_quantile_cs_covers_at_every_poll(p: float) -> None:
    rng = np.random.default_rng(7)
    sigma = 0.6
    data = rng.lognormal(0.0, sigma, size=(STREAMS, int(POLLS[-1])))
    truth = math.exp(sigma * _normal_ppf(p))
    ranks = {int(t): quantile_cs_ranks(int(t), p, ALPHA) for t in POLLS}
    assert _any_poll_misses(data, p, truth, ranks) <= ALPHA + SLACK


def test_fixed_n_intervals_polled_repeatedly_do_inflate_misses() -> None:
    """The reason for the method: a 95 % fixed-n interval checked at 40 polls misses far more than 5 %."""
    rng = np.random.default_rng(7)
    p, sigma = 0.5, 0.6
    data = rng.lognormal(0.0, sigma, size=(STREAMS, int(POLLS[-1])))
    truth = math.exp(sigma * _normal_ppf(p))
    naive: dict[int, tuple[int | None, int | None]] = {}
    for t in POLLS:
        half = 1.96 * math.sqrt(t * p * (1 - p))
        naive[int(t)] = (max(1, math.floor(t * p - half)), min(int(t), math.ceil(t * p + half) + 1))
    sequential = {int(t): quantile_cs_ranks(int(t), p, ALPHA) for t in POLLS}
    naive_rate = _any_poll_misses(data, p, truth, naive)
    assert naive_rate > 2 * ALPHA
    assert _any_poll_misses(data, p, truth, sequential) < naive_rate / 2


def test_rank_bounds_narrow_with_more_data_and_bracket_the_point() -> None:
    widths = []
    for n in (100, 1000, 10_000, 100_000):
        lo, hi = rank_bounds(n, 0.99, ALPHA)
        assert lo <= point_rank(n, 0.99) <= hi + 1
        widths.append((hi - lo) / n)
    assert widths == sorted(widths, reverse=True)
    assert widths[-1] < 0.003  # about 1.8x a fixed-n interval at n = 100k


def test_too_few_samples_leave_the_upper_bound_open() -> None:
    lower, upper = quantile_cs_ranks(100, 0.99, ALPHA)
    assert upper is None  # 100 samples can never show that p99 is below anything
    assert lower is not None
    assert quantile_cs_ranks(0, 0.5, ALPHA) == (None, None)


def test_histogram_cs_is_the_sample_cs_widened_to_bucket_edges() -> None:
    rng = np.random.default_rng(3)
    values = np.sort(rng.lognormal(np.log(0.03), 0.3, 20_000))
    bounds = [0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2]
    counts = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds) + 1)
    cs = histogram_quantile_cs(bounds, counts.tolist(), 0.99, ALPHA)
    assert cs is not None
    lo, hi, estimate = cs
    lower, upper = quantile_cs_ranks(len(values), 0.99, ALPHA)
    assert lower is not None
    assert upper is not None
    assert lo <= values[lower - 1] <= values[upper - 1] <= hi
    assert lo <= estimate <= hi
    assert lo in bounds
    assert hi in bounds
    assert histogram_quantile_cs(bounds, [0] * (len(bounds) + 1), 0.5, ALPHA) is None


def _normal_ppf(p: float) -> float:
    """Inverse standard normal CDF by bisection (no scipy needed)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
