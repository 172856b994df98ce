"""Tail-exceedance tests for the canary gate: time-block variance, any-time-valid boundaries.

Why
---
Every check of the gate is a statement about a *share of requests*:

* ``ttft_p99=2s`` holds when at most 1 % of candidate requests take longer
  than 2 s;
* ``--max-regression ttft_p99=20%`` holds when at most 1 % of candidate
  requests take longer than 1.2 x the baseline's p99 (the *tail
  exceedance* of that threshold);
* ``error_rate=1%`` holds when at most 1 % fail; ``goodput=0.95`` when at
  most 5 % are bad.

So one test serves them all: is the share of "bad" candidate requests above
its limit? Testing the share directly uses the data far better than comparing
two quantile intervals. For a relative check the baseline's p99 is itself
estimated; the old gate pushed the threshold up by the baseline quantile's
whole confidence width and then asked the candidate's interval to clear it
(two intervals stacked). Here the baseline's noise enters as one more
variance term of the same share (a two-sample test), which at 2,000 requests
a side is the difference between deciding and not.

Time correlation
----------------
Requests served in the same engine batches share their fate: slow requests
come in bursts. The variance of a share is therefore estimated by *batch
means* over consecutive time blocks (:data:`TIME_BLOCKS` per side), never
below the binomial variance at the limit. A burst inflates the variance only
as much as it really moves the share, instead of a blanket widening factor.

Any-time validity
-----------------
A rollout controller polls every minute. Each poll's estimate ``theta`` of
``share - limit`` with standard error ``se`` is treated as a Brownian motion
``B = theta * I`` in information time ``I = 1 / se^2``; a one-sided
half-normal mixture of its likelihood ratios (Robbins 1970),

    M = 2 sqrt(rho / (I + rho)) exp(B^2 / (2 (I + rho))) Phi(B / sqrt(I + rho)),

is a nonnegative martingale under ``theta <= 0``, so by Ville's inequality
``P(exists poll: M >= 1 / alpha) <= alpha``. With the variance estimated
from the data this is an *asymptotic* confidence sequence (Waudby-Smith,
Arbour, Sinha, Kennedy, Ramdas 2024, "Time-uniform central limit theory and
asymptotic confidence sequences"): valid as the sample grows, which the
benchmark ``tests/benchmarks/canary_power.py`` measures on replayed,
time-correlated traffic. ``rho`` puts the boundary's tightest point at
:data:`TUNED_REQUESTS` requests per side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "DENSITY_WINDOW",
    "TIME_BLOCKS",
    "TUNED_REQUESTS",
    "ShareCounts",
    "ShareTest",
    "block_of",
    "boundary_radius",
    "crosses",
    "log_quantile_se",
    "one_sample",
    "ratio_test",
    "share_counts",
]

#: Consecutive time blocks per side over which a share's variance is estimated (batch means).
TIME_BLOCKS: Final[int] = 20
#: Requests per side where the any-time boundary is tightest.
TUNED_REQUESTS: Final[int] = 1000
#: Relative half-width of the value window in which densities are compared (10 %).
DENSITY_WINDOW: Final[float] = 0.10

_NORMAL = NormalDist()


@dataclass(frozen=True)
class ShareCounts:
    """How many requests of one side were "bad", per time block.

    Attributes:
        sizes: requests with a value, per time block (earliest first).
        hits: of those, the bad ones (above the threshold, failed, ...).
        near_below / near_above: requests whose value lies within
            :data:`DENSITY_WINDOW` (relative) below the threshold (inclusive)
            or above it: the local density a quantile's error needs. 0 where
            not measured.
    """

    sizes: tuple[int, ...]
    hits: tuple[int, ...]
    near_below: int = 0
    near_above: int = 0

    @property
    def n(self) -> int:
        """Requests with a value."""
        return sum(self.sizes)

    @property
    def total_hits(self) -> int:
        """Bad requests."""
        return sum(self.hits)

    @property
    def share(self) -> float:
        """The bad share (0 when there are no requests)."""
        return self.total_hits / self.n if self.n else 0.0

    def variance(self, limit: float) -> float:
        """Variance of :attr:`share` by batch means over the time blocks, at least binomial at ``limit``.

        The floor is the variance independent requests would give at the
        limit (or at the observed share, if larger), so a few quiet blocks
        can never make the test more confident than independence allows.
        """
        n = self.n
        if n == 0:
            return math.inf
        share = self.share
        floor_share = min(max(share, limit), 0.5) if limit < 0.5 else max(min(share, limit), 0.5)
        binomial = floor_share * (1.0 - floor_share) / n
        blocks = [(s, h) for s, h in zip(self.sizes, self.hits, strict=True) if s > 0]
        k = len(blocks)
        if k < 2:
            return binomial
        batch = sum((h - share * s) ** 2 for s, h in blocks) * k / (k - 1) / (n * n)
        return max(batch, binomial)


def block_of(position: float, start: float, end: float, blocks: int = TIME_BLOCKS) -> int:
    """The time block (0 .. blocks - 1) of ``position`` in ``[start, end)``."""
    width = max(end - start, 1e-12)
    return min(blocks - 1, max(0, math.floor((position - start) * blocks / width)))


def share_counts(
    values: Sequence[float] | npt.NDArray[np.float64],
    blocks: Sequence[int] | npt.NDArray[np.int64],
    threshold: float,
    n_blocks: int = TIME_BLOCKS,
) -> ShareCounts:
    """Count values above ``threshold`` per time block, and those near it (pure; mirrors the store's SQL).

    Args:
        values: one value per request (NaN for none).
        blocks: each request's time block, from :func:`block_of`.
        threshold: the value a bad request exceeds.
    """
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    b = np.asarray(blocks, dtype=np.int64)
    valid = ~np.isnan(v)
    lo, hi = threshold / (1.0 + DENSITY_WINDOW), threshold * (1.0 + DENSITY_WINDOW)
    sizes = np.bincount(b[valid], minlength=n_blocks)
    hits = np.bincount(b[valid & (v > threshold)], minlength=n_blocks)
    below = int(np.count_nonzero(valid & (v >= lo) & (v <= threshold)))
    above = int(np.count_nonzero(valid & (v > threshold) & (v <= hi)))
    return ShareCounts(tuple(int(x) for x in sizes), tuple(int(x) for x in hits), below, above)


@dataclass(frozen=True)
class ShareTest:
    """The outcome of a test of an estimate against a limit.

    Attributes:
        estimate: the candidate's bad share (:func:`one_sample`) or the
            log of the candidate/baseline quantile ratio (:func:`ratio_test`).
        limit: the largest value the check allows (a share, or ``log(1 + margin)``).
        se: standard error of ``estimate``.
        z: ``(estimate - limit) / se``.
        above: significantly above the limit (any-time valid): the check fails.
        below: significantly below the limit: the check is shown to hold.
        radius: half-width of the any-time confidence interval of ``estimate``.
    """

    estimate: float
    limit: float
    se: float
    z: float
    above: bool
    below: bool
    radius: float

    @property
    def ci(self) -> tuple[float, float]:
        """Any-time confidence interval of the estimate."""
        return self.estimate - self.radius, self.estimate + self.radius


def _log_wealth(b: float, info: float, rho: float) -> float:
    """log of the half-normal mixture martingale at ``B = b`` after information ``info``."""
    scale = math.sqrt(info + rho)
    log_phi = math.log(max(_NORMAL.cdf(b / scale), 1e-300))
    return math.log(2.0) + 0.5 * math.log(rho / (info + rho)) + b * b / (2.0 * (info + rho)) + log_phi


def crosses(theta: float, se: float, alpha: float, rho: float) -> bool:
    """Whether the estimate ``theta`` (> 0 direction) with standard error ``se`` crosses the any-time boundary."""
    if not se > 0 or math.isinf(se) or theta <= 0:
        return False
    info = 1.0 / (se * se)
    return _log_wealth(theta * info, info, rho) >= math.log(1.0 / alpha)


def boundary_radius(se: float, alpha: float, rho: float) -> float:
    """Half-width, in the estimate's units, of the two-sided normal-mixture confidence sequence at ``alpha``."""
    if not se > 0 or math.isinf(se):
        return math.inf
    info = 1.0 / (se * se)
    return se * math.sqrt((1.0 + rho / info) * (math.log(1.0 + info / rho) + 2.0 * math.log(1.0 / alpha)))


def _decide(estimate: float, limit: float, variance: float, tuned_variance: float, alpha: float) -> ShareTest:
    """Both one-sided tests of ``estimate`` against ``limit``; the mixture is tightest at ``tuned_variance``."""
    se = math.sqrt(variance)
    # rho = I*/6 puts the boundary's minimum (about z = 3.0 at alpha 0.025) at the tuned information.
    rho = 1.0 / (6.0 * max(tuned_variance, 1e-300))
    theta = estimate - limit
    return ShareTest(
        estimate=estimate,
        limit=limit,
        se=se,
        z=theta / se if se > 0 else 0.0,
        above=crosses(theta, se, alpha, rho),
        below=crosses(-theta, se, alpha, rho),
        radius=boundary_radius(se, alpha, rho),
    )


def one_sample(counts: ShareCounts, limit: float, alpha: float) -> ShareTest:
    """Is the bad share above (or below) ``limit``? For absolute SLOs, error rate and goodput.

    ``alpha`` bounds, over every poll at once, the chance of calling the
    share above the limit when it is not (and, separately, below when it is not).
    """
    tuned = limit * (1.0 - limit) / TUNED_REQUESTS
    return _decide(counts.share, limit, counts.variance(limit), tuned, alpha)


def log_quantile_se(counts: ShareCounts, tail: float) -> float:
    """Standard error of the log of a side's quantile estimate (sparsity estimate, time blocks).

    ``counts`` holds the side's requests above its own estimate of the
    ``1 - tail`` quantile, per time block, and those within
    :data:`DENSITY_WINDOW` of it on either side. The share's variance
    (batch means) divided by the local density of ``log(value)`` is the
    variance of the log quantile (Siddiqui 1960; Bloch and Gastwirth 1968),
    with bursts of slow requests counted through the blocks. The density is
    the sparser of the two half-windows: in a tail the density falls fast,
    and the denser side would understate the error.
    """
    n = counts.n
    if n == 0:
        return math.inf
    log_density = max(min(counts.near_below, counts.near_above), 1) / n / math.log1p(DENSITY_WINDOW)
    return math.sqrt(counts.variance(tail)) / log_density


def ratio_test(
    baseline: ShareCounts,
    candidate: ShareCounts,
    *,
    quantiles: tuple[float, float],
    tail: float,
    margin: float,
    alpha: float,
) -> ShareTest:
    """Is the candidate's quantile more than ``(1 + margin)`` times the baseline's? (log ratio, two samples.)

    Each side's ``counts`` are its requests above its *own* quantile
    estimate (see :func:`log_quantile_se`). Both estimates' noise enters the
    variance; the test is the share test's twin in quantile space, far more
    powerful when the candidate is well beyond the margin (its share above
    a threshold deep inside its body is noisy, its own quantile is not).
    ``quantiles`` are the (baseline, candidate) point estimates.
    """
    baseline_quantile, candidate_quantile = quantiles
    if not (baseline_quantile > 0 and candidate_quantile > 0):
        return ShareTest(0.0, math.log1p(margin), math.inf, 0.0, False, False, math.inf)
    estimate = math.log(candidate_quantile) - math.log(baseline_quantile)
    variance = log_quantile_se(baseline, tail) ** 2 + log_quantile_se(candidate, tail) ** 2
    tuned = variance * min(baseline.n, candidate.n) / TUNED_REQUESTS
    return _decide(estimate, math.log1p(margin), variance, tuned, alpha)
