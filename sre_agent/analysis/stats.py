"""Statistics for comparing two latency populations.

Everything here is pure (numpy arrays in, numbers out) and reused by
diagnose and canary.

* **Log-bucket histograms.** Latencies are binned on a log scale with
  :data:`BUCKETS_PER_E` buckets per unit of ``ln(seconds)`` (about 1 % wide),
  so a quantile read from a histogram is within ~0.5 % of the exact one.
  DuckDB builds them per time slice in one scan; everything below reads the
  slices, never the millions of requests.
* **Quantile comparisons by time blocks.** Requests in one engine batch share
  their fate, so requests are not independent. A quantile's standard error is
  read from the share of requests above it per time slice (batch means) and
  the local density there (:meth:`SliceHistogram.log_quantile_se`, the same
  estimator the canary gate uses, :mod:`sre_agent.analysis.exceedance`), at blocks of
  :data:`BLOCK_SCALES` consecutive slices, the largest kept: load swings that
  outlast a slice count, and a trend the deploy started inside the candidate
  window is not mistaken for noise (as a parametric AR(1) factor, fitted per
  window, mistook it).
* **Block bootstrap.** :func:`quantile_ci` resamples whole time slices for a
  one-population CI.
* **Location test.** Mann-Whitney U (normal approximation with tie
  correction) and the Hodges-Lehmann shift, as Kayenta uses them.
* **Tail test.** A location test misses a variance-only change in the tail,
  so the share of candidate requests above the baseline's quantile is
  compared with the baseline's own share, with a cluster-robust (per-slice)
  variance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "BUCKETS_PER_E",
    "MIN_REQUESTS",
    "MIN_TAIL",
    "ZERO_BUCKET",
    "QuantileComparison",
    "SliceHistogram",
    "bucket_value",
    "compare_quantile",
    "hodges_lehmann",
    "mann_whitney",
    "min_samples_for_quantile",
    "normal_isf",
    "normal_sf",
    "quantile_ci",
    "share_with_variance",
    "student_t_isf",
    "tail_test",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Histogram resolution: buckets per unit of natural log (bucket width ~1 %).
BUCKETS_PER_E: Final[int] = 100
#: Bucket id used for exact zeros (log undefined).
ZERO_BUCKET: Final[int] = -1_000_000
#: Fewest requests per side for any comparison at all.
MIN_REQUESTS: Final[int] = 20
#: Fewest requests beyond a quantile, per side, before anything is said about that quantile.
#: The one minimum-sample rule of the diagnosis: the headline's CIs, the stage decomposition
#: of the tail and the rules that read the tail all use it, so a quantile that can be reported
#: as regressed always has a tail large enough to be explained.
MIN_TAIL: Final[int] = 5
#: Block lengths, in consecutive time slices, at which a quantile's batch-means variance is read;
#: the largest is kept. With 40 slices a side the longest are 5 blocks of 8 slices: correlation
#: that lasts up to a fifth of the window (a minute-long load swing in 7 minutes) shows as a
#: larger variance there. Without the 8-slice blocks, 4 of 40 healthy deploys under such a swing
#: were flagged, with them 1 (``python tests/benchmarks/noise_swing.py --scales 1,2,4``).
BLOCK_SCALES: Final[tuple[int, ...]] = (1, 2, 4, 8)


def min_samples_for_quantile(q: float) -> int:
    """Fewest requests per side for a usable estimate of quantile ``q``.

    :data:`MIN_TAIL` observations must lie beyond the quantile (p99 needs
    500, p90 50), and never fewer than :data:`MIN_REQUESTS`.
    """
    # round() first: 5 / (1 - 0.99) is 500.00000000000045 in floating point
    return max(MIN_REQUESTS, math.ceil(round(MIN_TAIL / max(1e-9, min(q, 1.0 - q)), 6)))


def bucket_value(buckets: npt.ArrayLike) -> FloatArray:
    """Representative value (geometric centre, seconds) of log buckets; 0 for :data:`ZERO_BUCKET`."""
    b = np.atleast_1d(np.asarray(buckets, dtype=np.float64))
    out: FloatArray = np.where(b == ZERO_BUCKET, 0.0, np.exp((b + 0.5) / BUCKETS_PER_E))
    return out


def normal_sf(z: float) -> float:
    """Upper tail probability of the standard normal, P(Z > z)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True)
class SliceHistogram:
    """Log-bucket counts per time slice for one latency on one side.

    Attributes:
        buckets: sorted bucket ids, shape (J,).
        counts: request counts, shape (K slices, J buckets).
    """

    buckets: IntArray
    counts: IntArray

    @classmethod
    def from_long(cls, slices: npt.ArrayLike, buckets: npt.ArrayLike, counts: npt.ArrayLike) -> SliceHistogram:
        """Build from long-form rows ``(slice, bucket, count)`` as SQL returns them (or one row per request)."""
        s = np.asarray(slices, dtype=np.int64)
        b = np.asarray(buckets, dtype=np.int64)
        c = np.asarray(counts, dtype=np.int64)
        if s.size == 0:
            return cls(np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.int64))
        zero = b == ZERO_BUCKET
        # Dense index over the occupied bucket range (plus one slot for exact zeros) via bincount,
        # which is an order of magnitude faster than np.unique on a few hundred thousand rows.
        b_min = int(b[~zero].min()) if (~zero).any() else 0
        b_idx = np.where(zero, 0, b - b_min + 1)
        width = int(b_idx.max()) + 1
        s_min = int(s.min())
        s_idx = s - s_min
        n_slices = int(s_idx.max()) + 1
        dense = np.bincount(s_idx * width + b_idx, weights=c, minlength=n_slices * width).reshape(n_slices, width)
        dense = dense.astype(np.int64)
        keep_cols = dense.sum(axis=0) > 0
        keep_rows = dense.sum(axis=1) > 0
        ids = np.arange(width, dtype=np.int64) + b_min - 1
        ids[0] = ZERO_BUCKET
        return cls(ids[keep_cols], dense[np.ix_(keep_rows, keep_cols)])

    @classmethod
    def from_values(cls, slices: npt.ArrayLike, values: npt.ArrayLike) -> SliceHistogram:
        """Build from one value (seconds, >= 0) per request and its slice."""
        v = np.asarray(values, dtype=np.float64)
        with np.errstate(divide="ignore"):
            buckets = np.where(v == 0, ZERO_BUCKET, np.floor(np.log(v) * BUCKETS_PER_E)).astype(np.int64)
        return cls.from_long(np.asarray(slices, dtype=np.int64), buckets, np.ones_like(buckets))

    @property
    def n(self) -> int:
        """Total number of requests."""
        return int(self.counts.sum())

    @property
    def slices(self) -> int:
        """Number of non-empty time slices (the time blocks of every estimate)."""
        return int(self.counts.shape[0])

    def log_quantile_se(self, q: float) -> float:
        """Standard error of ``ln`` of quantile ``q`` of this side, time correlation included.

        The quantile is where the share of requests above it crosses ``1 - q``;
        that share's variance by batch means over time blocks, divided by the
        local density of ``ln(latency)`` at the quantile, is the log quantile's
        variance (:func:`sre_agent.analysis.exceedance.log_quantile_se`, the canary's
        estimator). It is read with blocks of each length in
        :data:`BLOCK_SCALES` and the largest is returned: requests that shared
        a burst land in one block, and swings that outlast a slice make longer
        blocks vary more. ``inf`` when the side is empty.
        """
        from sre_agent.analysis.exceedance import DENSITY_WINDOW, ShareCounts, log_quantile_se

        threshold = self.quantile(q)
        if threshold is None:
            return math.inf
        values = bucket_value(self.buckets)
        hits = self.counts[:, values > threshold].sum(axis=1)
        sizes = self.counts.sum(axis=1)
        near_below = int(self.counts[:, (values >= threshold / (1.0 + DENSITY_WINDOW)) & (values <= threshold)].sum())
        near_above = int(self.counts[:, (values > threshold) & (values <= threshold * (1.0 + DENSITY_WINDOW))].sum())
        largest = 0.0
        for scale in BLOCK_SCALES:
            blocks = -(-sizes.size // scale)  # ceil: the last block may be shorter
            if blocks < 2:
                continue
            edges = np.arange(0, sizes.size, scale)
            counts = ShareCounts(
                tuple(int(x) for x in np.add.reduceat(sizes, edges)),
                tuple(int(x) for x in np.add.reduceat(hits, edges)),
                near_below,
                near_above,
            )
            largest = max(largest, log_quantile_se(counts, 1.0 - q))
        return largest

    def quantile(self, q: float) -> float | None:
        """Quantile ``q`` in seconds, or ``None`` when empty."""
        if self.n == 0:
            return None
        cum = np.cumsum(self.counts.sum(axis=0))
        j = int(np.searchsorted(cum, q * cum[-1], side="left"))
        return float(bucket_value(self.buckets[min(j, cum.size - 1)])[0])

    def exceedances(self, threshold_s: float) -> tuple[IntArray, IntArray]:
        """Per slice: (requests above ``threshold_s``, requests)."""
        above = bucket_value(self.buckets) > threshold_s
        return self.counts[:, above].sum(axis=1), self.counts.sum(axis=1)

    def bootstrap_quantiles(self, q: float, resamples: int, rng: np.random.Generator) -> FloatArray:
        """Quantile ``q`` of ``resamples`` block-bootstrap resamples (whole slices drawn with replacement).

        Only the buckets around the quantile matter, so the work is done on a window of
        cumulative share ``q +- 4 sd`` (sd as if each slice were one observation, the most
        correlated case) with buckets merged in fours (~4 % wide): the CI moves by well under
        the bucket width, and the cost no longer grows with the histogram's range.
        """
        k = self.slices
        weights = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples)
        col_total = self.counts.sum(axis=0)
        share = np.cumsum(col_total) / max(1, int(col_total.sum()))
        spread = min(0.5, max(0.005, 4.0 * math.sqrt(q * (1.0 - q) / max(1, k))))
        lo = int(np.searchsorted(share, q - spread, side="left"))
        hi = int(np.searchsorted(share, q + spread, side="left")) + 1
        lo, hi = max(0, lo - 1), min(self.buckets.size, hi)
        groups = (self.buckets[lo:hi] - (self.buckets[lo] if hi > lo else 0)) // 4
        starts = np.flatnonzero(np.r_[True, np.diff(groups) != 0]) if hi > lo else np.zeros(0, dtype=np.int64)
        window = np.add.reduceat(self.counts[:, lo:hi], starts, axis=1) if starts.size else self.counts[:, :0]
        # counts below the window stay as one column so every resample's total is right
        below = self.counts[:, :lo].sum(axis=1, keepdims=True)
        above = self.counts[:, hi:].sum(axis=1, keepdims=True)
        cum = weights @ np.cumsum(np.hstack([below, window, above]), axis=1)  # (B, 1 + G + 1)
        target = q * cum[:, -1:]
        j = (cum < target).sum(axis=1)  # 0 = below the window, G + 1 = above it
        values = np.empty(resamples, dtype=np.float64)
        centres = bucket_value(self.buckets[lo:hi][starts]) if starts.size else np.zeros(0)
        # merged groups are represented by the centre of their middle bucket
        if starts.size:
            ends = np.r_[starts[1:], hi - lo] - 1
            centres = bucket_value(self.buckets[lo:hi][(starts + ends) // 2])
        lo_value = bucket_value(self.buckets[max(0, lo - 1)])[0] if self.buckets.size else 0.0
        hi_value = bucket_value(self.buckets[min(hi, self.buckets.size - 1)])[0] if self.buckets.size else 0.0
        inside = (j >= 1) & (j <= centres.size)
        values[inside] = centres[np.clip(j[inside] - 1, 0, max(0, centres.size - 1))] if centres.size else 0.0
        values[j < 1] = lo_value
        values[j > centres.size] = hi_value
        return values


@dataclass(frozen=True)
class QuantileComparison:
    """Quantile ``q`` on both sides with 95 % CIs (``None`` = not estimable), see :func:`compare_quantile`.

    ``log_ratio_se`` is the standard error of ``ln(candidate / baseline)``
    (time blocks, :meth:`SliceHistogram.log_quantile_se`), for tests at other levels.
    """

    quantile: float
    baseline: float | None
    candidate: float | None
    diff_ci: tuple[float, float] | None
    ratio_ci: tuple[float, float] | None
    log_ratio_se: float | None = None

    @property
    def ratio(self) -> float | None:
        """candidate / baseline (``None`` when missing or the baseline is 0)."""
        if self.baseline is None or self.candidate is None or self.baseline <= 0:
            return None
        return self.candidate / self.baseline


def quantile_ci(
    hist: SliceHistogram, q: float, *, resamples: int = 400, level: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Block-bootstrap percentile CI of quantile ``q`` of one population, seconds.

    ``None`` when there are fewer requests than :func:`min_samples_for_quantile`
    or fewer than two slices.
    """
    if hist.n < min_samples_for_quantile(q) or hist.slices < 2:
        return None
    draws = hist.bootstrap_quantiles(q, resamples, np.random.default_rng(seed))
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(draws, alpha)), float(np.quantile(draws, 1.0 - alpha))


def compare_quantile(
    baseline: SliceHistogram,
    candidate: SliceHistogram,
    q: float,
    *,
    level: float = 0.95,
) -> QuantileComparison:
    """Quantile ``q`` on both sides and CIs of their difference (seconds) and ratio.

    ``ln(candidate / baseline)`` is normal with the two sides'
    :meth:`SliceHistogram.log_quantile_se` added in quadrature; the ratio CI
    is its ``level`` interval, and the difference CI is the baseline times
    that interval minus one. No CI below :func:`min_samples_for_quantile`
    requests a side, with fewer than two time slices, or at a zero quantile.
    """
    b_est, c_est = baseline.quantile(q), candidate.quantile(q)
    need = min_samples_for_quantile(q)
    if b_est is None or c_est is None or baseline.n < need or candidate.n < need:
        return QuantileComparison(q, b_est, c_est, None, None)
    if baseline.slices < 2 or candidate.slices < 2 or not (b_est > 0 and c_est > 0):
        return QuantileComparison(q, b_est, c_est, None, None)
    log_se = math.hypot(baseline.log_quantile_se(q), candidate.log_quantile_se(q))
    z = normal_isf((1.0 - level) / 2.0)
    log_ratio = math.log(c_est / b_est)
    lo, hi = math.exp(log_ratio - z * log_se), math.exp(log_ratio + z * log_se)
    return QuantileComparison(q, b_est, c_est, (b_est * (lo - 1.0), b_est * (hi - 1.0)), (lo, hi), log_se)


def normal_isf(p: float) -> float:
    """The z with P(Z > z) = ``p`` for the standard normal (bisection on :func:`normal_sf`; 0 < p < 1)."""
    lo, hi = -40.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if normal_sf(mid) > p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def mann_whitney(baseline: npt.ArrayLike, candidate: npt.ArrayLike) -> float | None:
    """One-sided Mann-Whitney p-value for "candidate is stochastically larger".

    Normal approximation with tie correction; ``None`` when a side has fewer
    than :data:`MIN_REQUESTS` values. Treats requests as independent, so the
    p-value is optimistic under time correlation: use it as supporting
    evidence next to the block-bootstrap CIs, not alone.
    """
    x = np.asarray(baseline, dtype=np.float64)
    y = np.asarray(candidate, dtype=np.float64)
    n, m = x.size, y.size
    if n < MIN_REQUESTS or m < MIN_REQUESTS:
        return None
    both = np.concatenate([x, y])
    order = np.argsort(both, kind="mergesort")
    sorted_vals = both[order]
    # average ranks for ties
    _, first, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    avg_rank = first + (counts + 1) / 2.0
    ranks = np.empty(both.size, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, counts)
    u = ranks[n:].sum() - m * (m + 1) / 2.0
    mean = n * m / 2.0
    tie_term = float((counts**3 - counts).sum()) / ((n + m) * (n + m - 1))
    var = n * m / 12.0 * ((n + m + 1) - tie_term)
    if var <= 0:
        return 1.0
    return normal_sf((u - mean - 0.5) / math.sqrt(var))


def hodges_lehmann(
    baseline: npt.ArrayLike, candidate: npt.ArrayLike, *, max_per_side: int = 1500, seed: int = 0
) -> float | None:
    """Hodges-Lehmann shift: median of all pairwise differences candidate - baseline, seconds.

    Each side is subsampled to ``max_per_side`` values (2.25 M pairs) so the
    cost is bounded; ``None`` when a side is empty.
    """
    x = np.asarray(baseline, dtype=np.float64)
    y = np.asarray(candidate, dtype=np.float64)
    if x.size == 0 or y.size == 0:
        return None
    rng = np.random.default_rng(seed)
    if x.size > max_per_side:
        x = rng.choice(x, max_per_side, replace=False)
    if y.size > max_per_side:
        y = rng.choice(y, max_per_side, replace=False)
    return float(np.median(np.subtract.outer(y, x)))


def tail_test(baseline: SliceHistogram, candidate: SliceHistogram, q: float) -> tuple[float, float, float] | None:
    """Does the candidate exceed the baseline's ``q`` quantile more often than the baseline does?

    Returns ``(baseline_share, candidate_share, one_sided_p)`` where a share is
    the fraction of requests above the baseline quantile; the variance of each
    share is by batch means over blocks of each length in :data:`BLOCK_SCALES`
    consecutive time slices, the largest kept (as :meth:`SliceHistogram.log_quantile_se`),
    so correlated bursts and swings that outlast a slice are not mistaken for
    evidence. ``None`` when not estimable. Catches variance-only tail
    regressions that a location test misses.
    """
    threshold = baseline.quantile(q)
    if threshold is None or baseline.n < min_samples_for_quantile(q) or candidate.n < MIN_REQUESTS:
        return None
    (pb, vb, _), (pc, vc, _) = (share_with_variance(*hist.exceedances(threshold)) for hist in (baseline, candidate))
    z = (pc - pb) / math.sqrt(vb + vc)
    return pb, pc, normal_sf(z)


def rate_moments(counts: npt.ArrayLike, seconds: float) -> tuple[float, float]:
    """Events per second over a window and that rate's sampling variance, from per-slice counts.

    ``counts`` are the events of consecutive equal slices of a ``seconds``-long window (empty
    slices included). The rate is the mean of the per-slice rates and its variance that mean's
    batch-means variance, so bursts widen it as much as they move it (a Poisson variance
    assumes events that come one by one). Variance 0 for a single slice.
    """
    values = np.asarray(counts, dtype=np.float64)
    rates = values / (seconds / values.size)
    variance = float(rates.var(ddof=1)) / rates.size if rates.size > 1 else 0.0
    return float(rates.mean()), variance


def share_with_variance(above: npt.ArrayLike, total: npt.ArrayLike) -> tuple[float, float, int]:
    """The share ``sum(above) / sum(total)`` over consecutive time slices, its variance and that variance's df.

    The variance is by batch means over blocks of each length in :data:`BLOCK_SCALES`
    consecutive slices, the largest kept, and never below what independent sampling would
    give: correlated bursts and swings that outlast a slice widen it. The degrees of freedom
    are the kept estimate's: blocks - 1, or observations - 1 for the binomial floor. ``total``
    must not be all zero.
    """
    hits = np.asarray(above, dtype=np.float64)
    sizes = np.asarray(total, dtype=np.float64)
    n = float(sizes.sum())
    p = float(hits.sum()) / n
    # never claim more precision than independent sampling would give
    var = max(p * (1 - p) / n, 1.0 / (n * n))
    df = max(1, round(n) - 1)
    for scale in BLOCK_SCALES:
        edges = np.arange(0, sizes.size, scale)
        k = edges.size
        if k < 2:
            continue
        resid = np.add.reduceat(hits, edges) - p * np.add.reduceat(sizes, edges)
        batch = (k / (k - 1)) * float((resid**2).sum()) / (n * n)
        if batch > var:
            var, df = batch, k - 1
    return p, var, df


def student_t_isf(p: float, df: float) -> float:
    """The t with P(T > t) = ``p`` for Student's t with ``df`` degrees of freedom (``inf`` below 3).

    Cornish-Fisher expansion of the normal quantile to four terms in ``1 / df`` (Abramowitz
    and Stegun 26.7.5): within 1 % of the exact value from 3 degrees of freedom up (3 df at
    p = 0.005: 5.80 against 5.84). Fewer than 3 degrees of freedom estimate no variance worth
    testing against.
    """
    if df < 3:
        return math.inf
    z = normal_isf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4
