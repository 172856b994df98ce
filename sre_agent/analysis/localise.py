"""Slice localisation: which attribute value holds the candidate's extra slow requests?

BubbleUp-style, made additive so that it answers "how much of the
regression": a request is *slow* when the headline metric exceeds the
baseline's quantile T. Without a regression a share ``1 - q`` of requests is
slow in each slice; the candidate's *excess slow* requests in a slice are
``slow_c(v) - n_c(v) * rate_b(v)``, where ``rate_b(v)`` is that slice's own
baseline slow rate (the overall rate when the slice is new or tiny). A slice
that holds most of the excess while carrying a small share of the traffic is
where the regression lives. Aliased attributes (``host.name`` and
``service.instance.id`` naming the same replica) are reported together.

Concentration alone also picks the slice of the longest requests when every
request slowed by the same factor: a multiplicative slowdown pushes the
requests closest to T over it, and those are one tenant's long prompts or the
requests that ran to ``max_tokens``. So the slice is named only when the rest
of the candidate's requests rose, at the headline quantile against their own
baseline, at most :data:`REST_SHARE` as much as the slice did; a slice the
baseline never served (a new tenant, a version on one replica) has no rise of
its own and is judged by concentration alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from sre_agent.analysis.compare import LATENCIES, SIDES
from sre_agent.analysis.rules_api import SHARE_HEADLINES

if TYPE_CHECKING:
    import polars as pl

    from sre_agent.analysis.compare import Comparison
    from sre_agent.analysis.rules_api import Regression

__all__ = ["Localisation", "SliceScore", "localise"]

#: A slice is "the" scope when it holds at least this share of the excess slow requests...
MIN_EXCESS_SHARE: Final[float] = 0.6
#: ...while carrying at most this share of the candidate's traffic.
MAX_TRAFFIC_SHARE: Final[float] = 0.5
#: ...and being slow far more often than the rest of the candidate's requests.
MIN_LIFT: Final[float] = 3.0
#: Fewest requests per side for localisation at all.
MIN_SLICE_BASELINE: Final[int] = 50
#: Pseudo-requests at the overall slow rate added to each slice's baseline (shrinkage).
PRIOR_REQUESTS: Final[int] = 100
#: The rest of the traffic may rise at most this share of the slice's rise (quantile ratio - 1).
REST_SHARE: Final[float] = 1 / 3


@dataclass(frozen=True)
class SliceScore:
    """One attribute value.

    Attributes:
        dimension / value: the attribute as received and its value.
        traffic_baseline / traffic_candidate: share of each side's requests in the slice.
        slow_rate_baseline / slow_rate_candidate: share of the slice's requests above T.
        excess_share: the slice's part of the candidate's excess slow requests (0..1).
        z: standardised difference of the slice's slow rate, candidate vs its expectation.
        lift: the slice's candidate slow rate over the rest of the candidate's.
        candidate_requests / candidate_slow: the slice's candidate requests, and those above T.
    """

    dimension: str
    value: str
    traffic_baseline: float
    traffic_candidate: float
    slow_rate_baseline: float
    slow_rate_candidate: float
    excess_share: float
    z: float
    lift: float = 1.0
    candidate_requests: int = 0
    candidate_slow: int = 0


@dataclass(frozen=True)
class Localisation:
    """Scores of every slice, best first, and the scope they point at (empty = everywhere)."""

    metric: str
    threshold_s: float | None
    slices: tuple[SliceScore, ...] = ()
    scope: dict[str, str] = field(default_factory=dict)

    @property
    def best(self) -> SliceScore | None:
        """The highest-scoring slice, or ``None``."""
        return self.slices[0] if self.slices else None


def localise(comparison: Comparison, regression: Regression, dimensions: list[str] | None = None) -> Localisation:
    """Score every value of every low-cardinality dimension (see module docstring)."""
    import polars as pl

    if regression.metric in SHARE_HEADLINES:
        return Localisation(regression.metric, None)
    metric = regression.metric if regression.metric in (*LATENCIES, "trace", "dependency", "gateway") else "e2e"
    col = LATENCIES.get(metric, f"{metric}_s")
    if col not in comparison.requests.columns:  # a root-span headline without engine requests
        col = "e2e_s"
    frame = comparison.requests.filter(pl.col(col).is_not_null())
    dims = [d for d in (dimensions if dimensions is not None else comparison.dimensions) if d in frame.columns]
    base = frame.filter(pl.col("side") == "baseline")
    cand = frame.filter(pl.col("side") == "candidate")
    if base.height < MIN_SLICE_BASELINE or cand.height < MIN_SLICE_BASELINE or not dims:
        return Localisation(metric, None)
    q = regression.quantile if regression.quantile >= 0.5 else 0.9
    threshold = base[col].quantile(q, interpolation="linear")
    if threshold is None:
        return Localisation(metric, None)
    frame = frame.with_columns((pl.col(col) > threshold).alias("_slow"))
    slow_mean = frame.filter(pl.col("side") == "baseline")["_slow"].mean()
    overall_rate = float(slow_mean) if isinstance(slow_mean, int | float) else 0.0
    n_b, n_c = base.height, cand.height
    scores: list[SliceScore] = []
    for dim in dims:
        stats = (
            frame.group_by(pl.col(dim).fill_null("(missing)").alias("value"))
            .agg(
                (pl.col("side") == "baseline").sum().alias("nb"),
                (pl.col("side") == "candidate").sum().alias("nc"),
                ((pl.col("side") == "baseline") & pl.col("_slow")).sum().alias("sb"),
                ((pl.col("side") == "candidate") & pl.col("_slow")).sum().alias("sc"),
            )
            .to_dicts()
        )
        if sum(1 for r in stats if r["nc"] > 0) < 2:
            continue  # one value on the candidate side: nothing to localise on
        excess: dict[str, float] = {}
        rows = {}
        for r in stats:
            nb, nc, sb, sc = int(r["nb"]), int(r["nc"]), int(r["sb"]), int(r["sc"])
            # The slice's own baseline slow rate, shrunk toward the overall rate (a slice with few
            # baseline requests, or none slow among them by chance, is not assumed immune).
            rate_b = (sb + PRIOR_REQUESTS * overall_rate) / (nb + PRIOR_REQUESTS)
            excess[str(r["value"])] = sc - nc * rate_b
            rows[str(r["value"])] = (nb, nc, sb, sc, rate_b)
        total = sum(max(0.0, e) for e in excess.values())
        slow_c_total = sum(v[3] for v in rows.values())
        if total <= 0:
            continue
        for value, (nb, nc, sb, sc, rate_b) in rows.items():
            if nc == 0:
                continue
            # two-proportion z: the slice's candidate slow rate against its (shrunk) baseline rate
            pooled = (sc + rate_b * (nb + PRIOR_REQUESTS)) / (nc + nb + PRIOR_REQUESTS)
            se = math.sqrt(max(pooled * (1 - pooled), 1e-9) * (1 / nc + 1 / (nb + PRIOR_REQUESTS)))
            scores.append(
                SliceScore(
                    dimension=dim,
                    value=value,
                    traffic_baseline=nb / n_b,
                    traffic_candidate=nc / n_c,
                    slow_rate_baseline=sb / nb if nb else math.nan,
                    slow_rate_candidate=sc / nc,
                    excess_share=max(0.0, excess[value]) / total,
                    z=(sc / nc - rate_b) / se,
                    lift=(sc / nc) / max((slow_c_total - sc) / max(n_c - nc, 1), 1e-9) if n_c > nc else 1.0,
                    candidate_requests=nc,
                    candidate_slow=sc,
                )
            )
    # Concentration beats size: prefer the slice whose excess share most exceeds its traffic share.
    scores.sort(key=lambda s: (s.excess_share - s.traffic_candidate, s.excess_share), reverse=True)
    scope: dict[str, str] = {}
    best = scores[0] if scores else None
    if (
        best is not None
        and best.excess_share >= MIN_EXCESS_SHARE
        and best.traffic_candidate <= MAX_TRAFFIC_SHARE
        and best.z >= 3.0
        and best.lift >= MIN_LIFT
        and not _rest_rose_alike(frame, best, col, q)
    ):
        scope[best.dimension] = best.value
        # Attributes that hold the same candidate requests name the same slice: the host and
        # instance of one replica, or a version deployed to that replica alone (which has no
        # baseline of its own, so its excess, measured against the overall rate, differs).
        # Equal shares are not enough: a tenant can match a replica's counts by chance.
        for other in scores[1:]:
            if other.dimension not in scope and _same_candidate_requests(frame, best, other):
                scope[other.dimension] = other.value
    return Localisation(metric, float(threshold), tuple(scores), scope)


def _rest_rose_alike(frame: pl.DataFrame, best: SliceScore, col: str, q: float) -> bool:
    """Whether the requests outside ``best`` rose more than :data:`REST_SHARE` of its rise at quantile ``q``.

    Each part is compared with its own baseline (quantile ratio candidate / baseline of
    ``col``). ``False`` when either part has fewer than :data:`MIN_SLICE_BASELINE`
    requests on a side: a slice new at the deploy has no rise to compare with.
    """
    import polars as pl

    inside = pl.col(best.dimension).cast(pl.String).fill_null("(missing)") == best.value
    rises = []
    for part in (frame.filter(inside), frame.filter(~inside)):
        values = [part.filter(pl.col("side") == s)[col] for s in SIDES]
        if min(v.len() for v in values) < MIN_SLICE_BASELINE:
            return False
        base, cand = (v.quantile(q, interpolation="linear") for v in values)
        if base is None or cand is None or base <= 0:
            return False
        rises.append(cand / base - 1.0)
    own, rest = rises
    return rest > REST_SHARE * max(own, 0.0)


def _same_candidate_requests(frame: pl.DataFrame, one: SliceScore, other: SliceScore) -> bool:
    """Whether two slices hold exactly the same candidate requests (``frame`` as in :func:`localise`)."""
    import polars as pl

    if (one.candidate_requests, one.candidate_slow) != (other.candidate_requests, other.candidate_slow):
        return False
    both = frame.filter(
        (pl.col("side") == "candidate")
        & (pl.col(one.dimension).cast(pl.String).fill_null("(missing)") == one.value)
        & (pl.col(other.dimension).cast(pl.String).fill_null("(missing)") == other.value)
    )
    return both.height == one.candidate_requests
