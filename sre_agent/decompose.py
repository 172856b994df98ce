"""Stage decomposition of the tail: where did the candidate's extra latency go?

For the headline metric at quantile q, take each side's tail (requests at or
above that side's q-quantile of the metric) and compare the mean time each
stage took in the tail: queue, prefill, decode (engine span), gateway and
dependency (other spans of the same trace). A stage's *share* is its part of
the summed positive excess. Tail means are additive, so the shares add up to
one, unlike differences of per-stage quantiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sre_agent.compare import LATENCIES, SIDES

if TYPE_CHECKING:
    import polars as pl

    from sre_agent.compare import Comparison
    from sre_agent.rules_api import Regression

__all__ = ["STAGES_OF", "StageDecomposition", "stage_decomposition"]

#: Headline metric -> engine stages that make it up.
STAGES_OF: Final[dict[str, tuple[str, ...]]] = {
    "e2e": ("queue", "prefill", "decode"),
    "ttft": ("queue", "prefill"),
    "tpot": ("decode",),
    "itl": ("decode",),
    "queue": ("queue",),
    "prefill": ("prefill",),
    "decode": ("decode",),
}
#: Fewest tail requests per side for a decomposition.
MIN_TAIL: Final[int] = 10


@dataclass(frozen=True)
class StageDecomposition:
    """Tail means per stage on both sides (seconds) and each stage's share of the excess.

    ``shares`` maps stage -> share of the positive excess (0..1, sums to 1
    when anything rose); empty when the tail is too small to say.
    """

    metric: str
    quantile: float
    tail_requests: tuple[int, int]
    baseline: dict[str, float]
    candidate: dict[str, float]
    shares: dict[str, float]

    @property
    def dominant(self) -> str | None:
        """The stage with the largest share, or ``None``."""
        return max(self.shares, key=lambda s: self.shares[s]) if self.shares else None

    def excess(self, stage: str) -> float:
        """candidate - baseline tail mean of ``stage``, seconds (0 when unknown)."""
        return self.candidate.get(stage, 0.0) - self.baseline.get(stage, 0.0)


def stage_decomposition(
    comparison: Comparison, regression: Regression, where: pl.Expr | None = None
) -> StageDecomposition:
    """Decompose the tail of ``regression.metric`` into stages (see module docstring).

    ``where`` restricts both sides to a slice of the requests (e.g. one host).
    """
    import polars as pl

    metric = regression.metric if regression.metric in LATENCIES else "e2e"
    stages = STAGES_OF.get(regression.metric, STAGES_OF["e2e"])
    col = LATENCIES[metric]
    q = regression.quantile if regression.quantile >= 0.5 else 0.9
    frame = comparison.requests if where is None else comparison.requests.filter(where)
    traces = comparison.traces
    with_trace = metric == "e2e" and traces.height > 0
    if with_trace:
        frame = frame.join(traces.select("span_id", "gateway_s", "dependency_s"), on="span_id", how="left")
        stages = (*stages, "gateway", "dependency")
    means: dict[str, dict[str, float]] = {}
    tails: list[int] = []
    for side in SIDES:
        part = frame.filter((pl.col("side") == side) & pl.col(col).is_not_null())
        if part.height == 0:
            return StageDecomposition(metric, q, (0, 0), {}, {}, {})
        threshold = part[col].quantile(q, interpolation="lower")
        tail = part.filter(pl.col(col) >= threshold)
        tails.append(tail.height)
        means[side] = {s: _mean(tail[_column(s)].fill_null(0.0)) for s in stages if _column(s) in tail.columns}
    if min(tails) < MIN_TAIL:
        return StageDecomposition(metric, q, (tails[0], tails[1]), means["baseline"], means["candidate"], {})
    excess = {s: means["candidate"][s] - means["baseline"][s] for s in means["baseline"]}
    positive = sum(max(0.0, v) for v in excess.values())
    shares = {s: max(0.0, v) / positive for s, v in excess.items()} if positive > 0 else {}
    return StageDecomposition(metric, q, (tails[0], tails[1]), means["baseline"], means["candidate"], shares)


def _mean(values: pl.Series) -> float:
    m = values.mean()
    return float(m) if isinstance(m, int | float) else 0.0


def _column(stage: str) -> str:
    return LATENCIES.get(stage, f"{stage}_s")
