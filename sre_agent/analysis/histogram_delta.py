"""Histogram observations that arrived within a window, merged over series (from :mod:`sre_agent.analysis.metric_view`).

A leaf of the analysis layer: the quantile, its order-statistic interval and the
observations' independence, for a latency histogram's counter deltas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

__all__ = ["MIN_TAIL_FOR_EFFECT", "HistogramDelta", "time_blocks"]

#: Observations a side of a bucket edge needs before their spread over time blocks measures a
#: design effect (:meth:`HistogramDelta.independent`).
MIN_TAIL_FOR_EFFECT: Final[int] = 10


def time_blocks(increments: list[tuple[int, list[int]]], width: int) -> tuple[tuple[int, ...], ...]:
    """Histogram increments summed per scrape time (every series scraped at once), earliest first."""
    by_time: dict[int, list[int]] = {}
    for time_ns, inc in increments:
        row = by_time.setdefault(time_ns, [0] * width)
        for i, x in enumerate(inc):
            row[i] += x
    return tuple(tuple(by_time[t]) for t in sorted(by_time))


@dataclass(frozen=True)
class HistogramDelta:
    """Observations that arrived within a window, merged over series.

    Attributes:
        bounds: explicit upper bucket bounds.
        counts: per-bucket counts, ``len(bounds) + 1`` (the last is +Inf).
        total_sum: sum of the observations.
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total_sum: float
    #: The same counts per time block (consecutive scrape intervals, earliest first); empty when
    #: not recorded. They measure how much observations that arrived together share their fate.
    blocks: tuple[tuple[int, ...], ...] = ()

    def independent(self, q: float) -> int:
        """How many independent observations the ``q`` quantile rests on (design effect by batch means).

        Observations that arrive together are not independent: the output tokens of one
        request, the requests of one engine step. The share of observations above the
        quantile's bucket varies between time blocks; its batch-means variance over the
        binomial one is the design effect, and ``count / effect`` the effective sample. With
        fewer than 4 blocks nothing can be measured and every observation counts.

        The quantile lies between its bucket's edges, so the effect is read at both (the share
        above the bucket, and the share above its lower edge) and the larger kept, each edge only
        with :data:`MIN_TAIL_FOR_EFFECT` observations or more on either side of it. A p99 often
        sits in the last bucket its side reached: a share of 0 or of three observations above it
        says nothing about how they cluster, and reading it as independence let a healthy
        deploy's TTFT p99 count 1,553 observations that 16 scrapes of 2 replicas held (dev
        1280290: a p90 one bucket lower rested on 16; the p99's interval came out apart).
        """
        from sre_agent.analysis.exceedance import ShareCounts

        n = self.count
        blocks = [b for b in self.blocks if sum(b) > 0]
        if n == 0 or len(blocks) < 4:
            return n
        holding = self.bucket_of_rank(q)
        totals = tuple(sum(b) for b in blocks)
        cuts = [len(self.counts)] if holding is None else [holding + 1, holding]
        effects: list[float] = []
        for cut in cuts:
            counts = ShareCounts(totals, tuple(sum(b[cut:]) for b in blocks))
            if min(counts.total_hits, n - counts.total_hits) < MIN_TAIL_FOR_EFFECT:
                continue  # too few on one side of this edge to measure clustering (and 0 < share < 1)
            share = counts.share
            # The canary's batch-means variance, floored at the binomial one: the effect is >= 1.
            effects.append(counts.variance(share) / (share * (1.0 - share) / n))
        return max(1, round(n / max(effects))) if effects else n

    def bucket_of_rank(self, q: float) -> int | None:
        """Index of the bucket holding the observation of rank ``q * count`` (``None`` when empty)."""
        rank, seen = q * self.count, 0
        for i, c in enumerate(self.counts):
            seen += c
            if c and seen >= rank:
                return i
        return None

    def exceedances(self, cut: int, slices: int) -> tuple[list[int], list[int]] | None:
        """Per time slice: (observations in buckets ``cut`` and above, observations); ``None`` without blocks.

        The scrape-interval blocks are merged into at most ``slices`` consecutive slices, so a
        slice spans the same share of the window as a span comparison's time slice whatever
        the scrape interval (:func:`sre_agent.analysis.stats.share_with_variance` reads
        correlation at multiples of it).
        """
        blocks = [b for b in self.blocks if sum(b) > 0]
        if not blocks:
            return None
        per = -(-len(blocks) // max(1, slices))
        groups = [blocks[i : i + per] for i in range(0, len(blocks), per)]
        above = [sum(sum(b[cut:]) for b in g) for g in groups]
        total = [sum(sum(b) for b in g) for g in groups]
        return above, total

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)

    @property
    def mean(self) -> float | None:
        """Mean observation (``None`` when empty)."""
        return self.total_sum / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Quantile by linear interpolation inside the bucket (Prometheus style); ``None`` when empty."""
        return self.value_at_rank(q * self.count)

    def quantile_interval(
        self, q: float, z: float = 1.96, *, independent: int | None = None
    ) -> tuple[float, float] | None:
        """Distribution-free interval for the ``q`` quantile, as wide as the buckets force it to be.

        The rank of the sample quantile is binomial (order statistics): the quantile lies
        between the observations of ranks ``n q -+ z sqrt(n q (1-q))``; when the ``n``
        observations are worth only ``independent`` independent ones (by default
        :meth:`independent`, measured between time blocks), the spread is
        ``n sqrt(q (1-q) / independent)``. A histogram only says
        which bucket each of those lies in, so the interval runs from the lower edge of the
        bucket holding the low rank to the upper edge of the one holding the high rank
        (interpolating inside a bucket assumes a shape and under-covers: 86 % for a nominal
        95 % on log-normal latencies). ``inf`` when the high rank is in the +Inf bucket;
        ``None`` when empty.
        """
        n = self.count
        if n == 0:
            return None
        units = max(1, min(n, self.independent(q) if independent is None else independent))
        half = z * n * math.sqrt(q * (1 - q) / units)
        lo_rank, hi_rank = max(0.0, n * q - half), min(float(n), n * q + half)
        edges = (0.0, *self.bounds, math.inf)
        seen, lo, hi = 0, None, None
        for i, c in enumerate(self.counts):
            if c and lo is None and seen + c >= lo_rank:
                lo = edges[i]
            if c and seen + c >= hi_rank:
                hi = edges[i + 1]
                break
            seen += c
        return None if lo is None or hi is None else (lo, hi)

    def value_at_rank(self, rank: float) -> float | None:
        """The observation of rank ``rank`` (0..count), interpolated inside its bucket; ``None`` when empty."""
        total = self.count
        if total == 0:
            return None
        seen = 0
        for i, c in enumerate(self.counts):
            if seen + c >= rank and c > 0:
                lo = self.bounds[i - 1] if i > 0 else 0.0
                if i >= len(self.bounds):
                    return self.bounds[-1] if self.bounds else None
                hi = self.bounds[i]
                return lo + (hi - lo) * (rank - seen) / c
            seen += c
        return self.bounds[-1] if self.bounds else None
