"""One side of a canary comparison: what the judge needs, and how it is computed from arrays.

The store computes the same summaries in SQL (:mod:`sre_agent.canary.gather`);
:func:`summarise` is the pure mirror the tests and the power benchmark use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from sre_agent.analysis.exceedance import ShareCounts, share_counts
from sre_agent.canary.sequential import point_rank
from sre_agent.canary.spec import CanarySpec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["LADDER", "QuantileEstimate", "SideStats", "ladder_ranks", "summarise"]

#: Offsets in quantile level at which order statistics are read, to show a quantile's CI in seconds.
LADDER: Final[tuple[float, ...]] = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5,
)  # fmt: skip


@dataclass(frozen=True)
class QuantileEstimate:
    """A quantile of one side.

    Attributes:
        n: values it rests on (requests, or observations for histograms).
        estimate: the empirical quantile (``None`` when ``n == 0``).
        lo / hi: a confidence sequence's bounds, for histogram sources only
            (``0`` and ``inf`` otherwise, or when too few values bound a side).
        source: ``spans`` or the histogram metric it came from.
        ladder: ``(offset, lower, upper)``: the order statistics at quantile
            levels ``p - offset`` and ``p + offset`` for each offset of
            :data:`LADDER` (0 and ``inf`` past the data's ends); a check turns
            its share interval into seconds with them.
    """

    n: int
    estimate: float | None
    lo: float = 0.0
    hi: float = math.inf
    source: str = "spans"
    ladder: tuple[tuple[float, float, float], ...] = ()

    def interval(self, radius: float) -> tuple[float, float]:
        """The quantile's interval for a share radius: the narrowest ladder rung at least that wide."""
        for offset, lower, upper in self.ladder:
            if offset >= radius:
                return lower, upper
        return 0.0, math.inf


def ladder_ranks(n: int, p: float) -> list[tuple[float, int | None, int | None]]:
    """1-based ranks of the ladder's order statistics; ``None`` past the data's ends."""
    out: list[tuple[float, int | None, int | None]] = []
    for offset in LADDER:
        low, high = p - offset, p + offset
        lower = math.ceil(n * low - 1e-9) if low > 0 else None
        upper = math.ceil(n * high - 1e-9) if high < 1 else None
        out.append((offset, lower if lower and lower >= 1 else None, upper if upper and upper <= n else None))
    return out


@dataclass(frozen=True)
class SideStats:
    """What the judge needs from one side.

    Attributes:
        requests: engine requests in the population.
        errors: requests that failed (span status error or an error type).
        good: requests that did not fail and met every latency SLO (``None``
            when no latency SLO was given).
        quantiles: check key (``slo:NAME`` or ``reg:NAME``) -> estimate.
        shares: check key -> bad requests per time block (see
            :mod:`sre_agent.analysis.exceedance`): above the SLO (``slo:``), failed
            (``slo:error_rate``), not good (``slo:goodput``), or, for a
            relative check (``reg:``), above the side's own quantile
            estimate (with ``near`` around it: the local density).
        window: the side's description for the report (start, end, filter).
    """

    requests: int
    errors: int = 0
    good: int | None = None
    quantiles: Mapping[str, QuantileEstimate] = field(default_factory=dict)
    shares: Mapping[str, ShareCounts] = field(default_factory=dict)
    window: Mapping[str, Any] = field(default_factory=dict)


def _estimate(values: npt.NDArray[np.float64], p: float) -> QuantileEstimate:
    import numpy as np

    ordered = np.sort(values[~np.isnan(values)])
    n = len(ordered)
    if n == 0:
        return QuantileEstimate(0, None)
    ladder = tuple(
        (offset, float(ordered[lo - 1]) if lo else 0.0, float(ordered[hi - 1]) if hi else math.inf)
        for offset, lo, hi in ladder_ranks(n, p)
    )
    return QuantileEstimate(n, float(ordered[point_rank(n, p) - 1]), ladder=ladder)


def summarise(
    spec: CanarySpec,
    values: Mapping[str, Sequence[float] | npt.NDArray[np.float64]],
    failed: Sequence[bool] | npt.NDArray[np.bool_],
    blocks: Sequence[int] | npt.NDArray[np.int64],
) -> SideStats:
    """One side's :class:`SideStats` from per-request arrays (pure; the store computes the same in SQL).

    Args:
        values: latency metric (``ttft``, ``e2e``, ...) -> one value per
            request in arrival order, NaN where the request has none.
        failed: per request, whether it failed.
        blocks: per request, its time block (:func:`sre_agent.analysis.exceedance.block_of`).
    """
    import numpy as np

    bad_request = np.asarray(failed, dtype=bool)
    n = len(bad_request)
    columns = {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}
    nan = np.full(n, np.nan)
    good = ~bad_request
    for s in spec.latency_slos:
        good &= ~(columns.get(s.metric or "", nan) > s.threshold)  # NaN meets the SLO, as in SQL
    quantiles: dict[str, QuantileEstimate] = {}
    shares: dict[str, ShareCounts] = {}
    for s in spec.slos:
        key = f"slo:{s.name}"
        if s.kind == "quantile":
            column = columns.get(s.metric or "", nan)
            assert s.quantile is not None
            quantiles[key] = _estimate(column, s.quantile)
            shares[key] = share_counts(column, blocks, s.threshold)
        else:
            bad = bad_request if s.kind == "error_rate" else ~good
            shares[key] = share_counts(bad.astype(np.float64), blocks, 0.5)
    for r in spec.regressions:
        key = f"reg:{r.name}"
        column = columns.get(r.metric, nan)
        quantiles[key] = own = _estimate(column, r.quantile)
        if own.estimate is not None:
            shares[key] = share_counts(column, blocks, own.estimate)
    return SideStats(
        requests=n,
        errors=int(bad_request.sum()),
        good=int(good.sum()) if spec.latency_slos else None,
        quantiles=quantiles,
        shares=shares,
    )
