"""Any-time-valid confidence sequences for the canary gate.

Why
---
A rollout controller polls the gate every minute while the canary grows
(Argo Rollouts ``interval``/``count``, Flagger ``interval``). A fixed-n test
run at every poll inflates the false-fail rate with the number of polls.
A *confidence sequence* (CS) is a sequence of intervals ``C_1, C_2, ...``
with ``P(for all t: theta in C_t) >= 1 - alpha``: the coverage holds at
every sample size simultaneously, so any number of looks, at any times,
chosen in any data-dependent way, keeps the error below ``alpha``.

Method
------
Everything here rests on one nonnegative martingale: the beta-binomial
mixture of Bernoulli likelihood ratios (Robbins 1970; Howard, Ramdas,
McAuliffe, Sekhon 2021, "Time-uniform, nonparametric, nonasymptotic
confidence sequences", section on conjugate mixtures). For ``S`` successes
in ``t`` Bernoulli(p) trials and a Beta(a, b) mixing prior,

    M_t(p) = B(a + S, b + t - S) / B(a, b) / (p^S (1 - p)^(t - S))

is a nonnegative martingale with ``M_0 = 1`` when the true rate is ``p``.
Ville's inequality gives ``P(exists t: M_t(p) >= 1/alpha) <= alpha``. The
exact Bernoulli likelihood is used, so no sub-Gaussian approximation is
needed (that matters for p = 0.99, where the increments are very skewed).

* **Quantiles** (Howard & Ramdas 2022, "Sequential estimation of quantiles
  with applications to A/B-testing and best-arm identification", Thm 1):
  for the true p-quantile ``q`` of a continuous distribution the count
  ``S_t = #{X_i <= q}`` is Binomial(t, p). The counts ``k`` with
  ``M_t(p; k) < 1/alpha`` form an interval ``[k_lo, k_hi]`` (convexity
  in ``k``); on the event that holds for every ``t`` the order statistics
  ``X_(k_lo) <= q <= X_(k_hi + 1)`` hold for every ``t`` too. The CS is
  therefore two order statistics of the data seen so far; no distributional
  assumption beyond i.i.d. sampling. The prior is Beta(p r, (1 - p) r), centred
  on ``p``.
* **Histograms** (vLLM ``inter_token_latency_seconds``): the same ranks,
  widened to bucket edges, which only makes the interval more conservative.

The prior strength ``r`` sets where the boundary is tightest (about
``t ~ 10 r``); ``DEFAULT_PRIOR_STRENGTH = 100`` is tuned for canaries of
a few hundred to tens of thousands of requests. At ``t = 1000, p = 0.99``
the interval is about 1.5 times as wide as a fixed-n normal interval: the
price of being allowed to look at every poll.

Polling model and guarantee
---------------------------
Each poll evaluates all requests seen so far (a growing prefix of one
stream). For one check at level ``alpha`` the probability that *any* poll,
ever, reports an interval that misses the true value is at most ``alpha``.
The gate fails only when an interval lies entirely beyond the threshold and
passes only when it lies entirely within, so both false-fail and false-pass
rates are bounded by ``alpha`` per check, for any polling schedule.
Assumptions: requests are exchangeable within a side (independent draws
from one distribution). The canary gate uses these sequences for engine
histograms (vLLM's ITL), where no per-request order exists; span-level checks
use :mod:`sre_agent.analysis.exceedance`, whose variance comes from time blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = [
    "DEFAULT_PRIOR_STRENGTH",
    "histogram_quantile_cs",
    "log_mixture_wealth",
    "point_rank",
    "quantile_cs_ranks",
    "rank_bounds",
]

DEFAULT_PRIOR_STRENGTH = 100.0


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def log_mixture_wealth(successes: float, trials: float, p: float, prior_a: float, prior_b: float) -> float:
    """``log M_t(p)`` of the beta-binomial mixture martingale (see the module docstring).

    Args:
        successes: ``S``, the number of successes (may be fractional only in bisection).
        trials: ``t``, the number of trials.
        p: the hypothesised success probability, in (0, 1).
        prior_a / prior_b: the Beta mixing prior.
    """
    failures = trials - successes
    return (
        _log_beta(prior_a + successes, prior_b + failures)
        - _log_beta(prior_a, prior_b)
        - successes * math.log(p)
        - failures * math.log1p(-p)
    )


def _first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """Smallest integer in ``[lo, hi]`` where a monotone ``pred`` is true (``hi`` if none before)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def rank_bounds(n: int, p: float, alpha: float, prior_strength: float = DEFAULT_PRIOR_STRENGTH) -> tuple[int, int]:
    """Counts ``[k_lo, k_hi]`` of observations at or below the true p-quantile, valid at all ``n``.

    With probability at least ``1 - alpha``, for every ``n`` at once,
    ``k_lo <= #{X_i <= q_p} <= k_hi``.
    """
    if n <= 0:
        return 0, 0
    a, b = p * prior_strength, (1.0 - p) * prior_strength
    threshold = math.log(1.0 / alpha)
    centre = min(n, max(0, round(n * p)))

    def accepted(k: int) -> bool:
        return log_mixture_wealth(k, n, p, a, b) < threshold

    if not accepted(centre):  # cannot happen for sane alpha; be conservative anyway
        return 0, n
    k_lo = _first_true(0, centre, accepted)
    # accepted() is true on [k_lo, k_hi]; find the last true after the centre.
    k_hi = _first_true(centre, n + 1, lambda k: k > n or not accepted(k)) - 1
    return k_lo, k_hi


def quantile_cs_ranks(
    n: int, p: float, alpha: float, prior_strength: float = DEFAULT_PRIOR_STRENGTH
) -> tuple[int | None, int | None]:
    """1-based order-statistic ranks bounding the p-quantile: ``X_(lo) <= q_p <= X_(hi)``.

    ``None`` means unbounded on that side (too few samples for that bound):
    the lower bound is then 0 for latencies and the upper bound infinity.
    """
    k_lo, k_hi = rank_bounds(n, p, alpha, prior_strength)
    return (k_lo if k_lo >= 1 else None), (k_hi + 1 if k_hi + 1 <= n else None)


def point_rank(n: int, p: float) -> int:
    """1-based rank of the empirical p-quantile (the inverse-CDF definition), for ``n >= 1``."""
    return min(n, max(1, math.ceil(n * p - 1e-9)))


def histogram_quantile_cs(
    bounds: Sequence[float],
    counts: Sequence[float],
    p: float,
    alpha: float,
    prior_strength: float = DEFAULT_PRIOR_STRENGTH,
) -> tuple[float, float, float] | None:
    """CS and point estimate of the p-quantile from explicit-bucket histogram counts.

    Args:
        bounds: bucket upper bounds (seconds), ascending, as in OTLP.
        counts: ``len(bounds) + 1`` observation counts; the last is the overflow bucket.
        p: the quantile level.
        alpha: error level of the confidence sequence.

    Returns:
        ``(lo, hi, estimate)`` in the histogram's unit, where ``hi`` may be
        ``inf`` (the overflow bucket has no upper edge) and the estimate
        interpolates linearly inside its bucket (Prometheus
        ``histogram_quantile``); ``None`` when the histogram is empty.
    """
    n = round(sum(counts))
    if n <= 0:
        return None
    edges = [0.0, *bounds, math.inf]
    cumulative: list[float] = []
    total = 0.0
    for c in counts:
        total += c
        cumulative.append(total)

    def bucket_of(rank: float) -> int:
        for i, c in enumerate(cumulative):
            if c >= rank:
                return i
        return len(cumulative) - 1

    lower_rank, upper_rank = quantile_cs_ranks(n, p, alpha, prior_strength)
    lo = edges[bucket_of(lower_rank)] if lower_rank is not None else 0.0
    hi = edges[bucket_of(upper_rank) + 1] if upper_rank is not None else math.inf
    rank = p * n
    i = bucket_of(rank)
    below = cumulative[i - 1] if i > 0 else 0.0
    left, right = edges[i], edges[i + 1]
    if math.isinf(right):
        estimate = left
    else:
        inside = counts[i]
        estimate = left + (right - left) * ((rank - below) / inside if inside > 0 else 0.0)
    return lo, hi, estimate
