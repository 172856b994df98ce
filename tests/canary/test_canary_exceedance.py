"""The share and quantile-ratio tests behind every canary check (sre_agent.analysis.exceedance)."""

from __future__ import annotations

import math

import numpy as np

from sre_agent.analysis.exceedance import (
    ShareCounts,
    boundary_radius,
    crosses,
    log_quantile_se,
    one_sample,
    ratio_test,
    share_counts,
)

ALPHA = 0.05


def test_the_mixture_boundary_keeps_its_error_under_every_look() -> None:
    """A Brownian motion with no drift, looked at 100 times: the boundary is crossed in at most alpha of paths.

    A fixed z = 1.645 boundary at each look, for contrast, is crossed far more often.
    """
    rng = np.random.default_rng(0)
    paths, looks = 2000, 100
    steps = rng.standard_normal((paths, looks)).cumsum(axis=1)
    info = np.arange(1, looks + 1, dtype=float)
    crossed = naive = 0
    rho = 10.0 / 6.0  # tightest at 10 looks' information
    for path in steps:
        theta, se = path / info, 1.0 / np.sqrt(info)
        crossed += any(crosses(float(t), float(s), ALPHA, rho) for t, s in zip(theta, se, strict=True))
        naive += bool(np.any(theta / se > 1.645))
    assert crossed / paths <= ALPHA
    assert naive / paths > 3 * ALPHA


def test_a_real_drift_is_crossed() -> None:
    assert crosses(0.5, 0.1, ALPHA, 100.0 / 6.0)  # z = 5
    assert not crosses(-0.5, 0.1, ALPHA, 100.0 / 6.0)
    assert not crosses(0.1, 0.1, ALPHA, 100.0 / 6.0)  # z = 1: not at any-time levels
    assert boundary_radius(0.1, ALPHA, 100.0 / 6.0) > 0.1 * 1.96


def test_bursts_raise_a_shares_variance_and_the_floor_is_binomial() -> None:
    spread = ShareCounts((100,) * 20, (1,) * 20)
    burst = ShareCounts((100,) * 20, (20,) + (0,) * 19)
    assert spread.share == burst.share == 0.01
    binomial = 0.01 * 0.99 / 2000
    assert spread.variance(0.01) == binomial  # evenly spread: never below independence
    assert burst.variance(0.01) > 15 * binomial
    # a share far above the limit is floored at its own binomial variance
    high = ShareCounts((100,) * 20, (10,) * 20)
    assert high.variance(0.01) >= 0.1 * 0.9 / 2000


def test_share_counts_counts_above_and_near_the_threshold() -> None:
    values = np.array([1.0, 2.0, 1.95, 2.1, 2.3, np.nan, 0.5])
    blocks = np.array([0, 0, 1, 1, 2, 2, 3])
    counts = share_counts(values, blocks, 2.0, n_blocks=4)
    assert counts.sizes == (2, 2, 1, 1)
    assert counts.hits == (0, 1, 1, 0)
    assert (counts.near_below, counts.near_above) == (2, 1)  # 1.95 and 2.0 at or below; 2.1 above, 2.3 too far


def test_log_quantile_error_matches_repeated_samples() -> None:
    """The sparsity estimate of the p99's log error is close to its spread over fresh independent samples."""
    rng = np.random.default_rng(1)
    n, p = 4000, 0.99
    logs, estimates = [], []
    for _ in range(300):
        x = rng.lognormal(0.0, 0.6, n)
        q = float(np.sort(x)[math.ceil(n * p) - 1])
        logs.append(math.log(q))
        estimates.append(log_quantile_se(share_counts(x, np.arange(n) * 20 // n, q), 1 - p))
    truth = float(np.std(logs))
    assert 0.8 * truth < float(np.median(estimates)) < 1.6 * truth  # conservative, not wildly so


def test_ratio_test_fails_a_regression_and_not_the_margin() -> None:
    rng = np.random.default_rng(2)
    n = 3000
    blocks = np.arange(n) * 20 // n

    def counts(x: np.ndarray) -> tuple[ShareCounts, float]:
        q = float(np.sort(x)[math.ceil(n * 0.99) - 1])
        return share_counts(x, blocks, q), q

    base, qb = counts(rng.lognormal(0.0, 0.5, n))
    worse, qw = counts(rng.lognormal(0.0, 0.5, n) * 1.6)
    test = ratio_test(base, worse, quantiles=(qb, qw), tail=0.01, margin=0.2, alpha=0.025)
    assert test.above
    assert not test.below
    same, qs = counts(rng.lognormal(0.0, 0.5, n))
    ok = ratio_test(base, same, quantiles=(qb, qs), tail=0.01, margin=0.2, alpha=0.025)
    assert not ok.above
    assert math.exp(ok.ci[0]) < qs / qb < math.exp(ok.ci[1])


def test_one_sample_share_test() -> None:
    errors = ShareCounts((250,) * 20, (5,) * 20)  # 2 % failed
    assert one_sample(errors, 0.01, 0.025).above
    assert one_sample(errors, 0.05, 0.025).below
    undecided = one_sample(errors, 0.02, 0.025)
    assert not undecided.above
    assert not undecided.below
