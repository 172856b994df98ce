"""Shared measurements for the mechanism rules (not a rule: nothing registers it).

Rules compare a *mechanism signal* (hit rate, preemptions per request, time
per token at equal batch size, error share, ...) between the two sides. The
helpers here give those comparisons the same statistics everywhere:

* :func:`ratio_estimate`: a ratio of sums (token-weighted hit rate, a share,
  a mean) with a standard error that is cluster-robust over the comparison's
  time slices, because requests in one engine batch share their fate. The
  variance is never below the independent-sampling one.
* :func:`z_change` / :func:`significance`: a z score of the change and a 0..1
  confidence from it (0 below z = 2, 1 from z = 5).
* :func:`tail_shares` / :func:`stage_share` / :func:`engine_share`: which part
  of the headline's tail excess a stage holds (what a mechanism can explain).
* :func:`confined_slice`: the one attribute value that holds most of a
  signal's change while carrying a minority of the traffic, if any.
* :func:`metric_hit_rate`: the prefix-cache hit rate from counter deltas;
  :func:`uncached_tokens`: a request's uncached prompt tokens, with that rate where spans lack them.

Engine-cost helpers (running batch, costs at equal batch size) live in
:mod:`sre_agent.rules._engine_cost`, step shape in :mod:`sre_agent.rules._steps`,
offered load and KV pressure in :mod:`sre_agent.rules._load`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

import polars as pl

from sre_agent.analysis.compare import LATENCIES, SIDES
from sre_agent.analysis.decompose import MIN_TAIL, offered_load_terms, queue_drivers, replicas_expr, stage_decomposition
from sre_agent.analysis.rules_api import SHARE_HEADLINES, Regression, RuleSkipped, SidePair

if TYPE_CHECKING:
    from sre_agent.analysis.compare import Comparison
    from sre_agent.analysis.decompose import StageDecomposition
    from sre_agent.analysis.metric_view import MetricView

#: Headline metrics measured per output token: wholly decode-stage, engine time.
PER_TOKEN_METRICS: Final[tuple[str, ...]] = ("tpot", "itl")
#: z below which a change is not evidence at all.
Z_MIN: Final[float] = 2.0
#: Prefill per token rising up to this many times TPOT's rise (both at equal batch) is within the
#: echo of decode steps that got slower: a prompt's chunks ride those steps.
ECHO_MARGIN: Final[float] = 1.25
#: z of an arrival-rate change (against the per-slice spread) below which it is burstiness, not load.
LOAD_Z: Final[float] = 3.0
#: z from which a change is certain (confidence 1 before effect-size damping).
Z_FULL: Final[float] = 5.0
#: Fewest requests per side and per covariate bucket for a conditional comparison.
MIN_BUCKET: Final[int] = 20
#: Attributes that describe where a request was served, not what was asked (attribute-name prefixes).
SERVING_DIMENSIONS: Final[tuple[str, ...]] = (
    "host.", "k8s.", "service.", "server.", "container.", "process.", "telemetry.", "cloud.",
)  # fmt: skip


@dataclass(frozen=True)
class RatioEstimate:
    """``sum(num) / sum(den)`` over a side, its standard error and the rows behind it.

    ``value`` is ``None`` when the denominator sums to zero.
    """

    value: float | None
    se: float
    n: int


def ratio_estimate(
    frame: pl.DataFrame, num: pl.Expr, den: pl.Expr, cluster: str = "slice", *, observations: pl.Expr | None = None
) -> RatioEstimate:
    """Ratio of sums with a cluster-robust (linearised) standard error.

    ``var = K/(K-1) * sum_k (y_k - R x_k)^2 / X^2`` over clusters k, floored by
    the same sum over single rows (never more precise than independent rows)
    and by ``1 / n^2`` (one observation's worth of a share). ``observations``:
    how many observations each row sums (rows that are already aggregates, e.g.
    spans per slice); by default each row is one. ``n`` counts observations.
    """
    weight = pl.lit(1.0) if observations is None else observations.cast(pl.Float64)
    rows = frame.select(
        num.cast(pl.Float64).alias("y"), den.cast(pl.Float64).alias("x"), weight.alias("w"), pl.col(cluster)
    ).drop_nulls(["y", "x"])
    n = int(rows["w"].sum()) if rows.height else 0
    total_x = float(rows["x"].sum()) if n else 0.0
    if n == 0 or total_x <= 0:
        return RatioEstimate(None, math.inf, n)
    ratio = float(rows["y"].sum()) / total_x
    per_row = float(((rows["y"] - ratio * rows["x"]) ** 2).sum()) / total_x**2
    clusters = rows.group_by(cluster).agg(pl.col("y").sum(), pl.col("x").sum())
    k = clusters.height
    per_cluster = 0.0
    if k > 1:
        resid = clusters["y"] - ratio * clusters["x"]
        per_cluster = k / (k - 1) * float((resid**2).sum()) / total_x**2
    var = max(per_cluster, per_row, 1.0 / (n * n))
    return RatioEstimate(ratio, math.sqrt(var), n)


def z_change(baseline: RatioEstimate, candidate: RatioEstimate) -> float:
    """(candidate - baseline) / combined SE; 0 when either side is unknown."""
    if baseline.value is None or candidate.value is None:
        return 0.0
    se = math.sqrt(baseline.se**2 + candidate.se**2)
    return (candidate.value - baseline.value) / se if se > 0 else 0.0


def significance(z: float) -> float:
    """0..1 confidence that a change with score ``|z|`` is real: 0 below :data:`Z_MIN`, 1 from :data:`Z_FULL`."""
    return max(0.0, min(1.0, (abs(z) - Z_MIN) / (Z_FULL - Z_MIN)))


def clip01(x: float) -> float:
    """``x`` clipped to 0..1 (NaN -> 0)."""
    return 0.0 if not math.isfinite(x) else max(0.0, min(1.0, x))


def rnd(x: float | None, digits: int = 4) -> float | None:
    """Rounded for evidence (``None`` stays ``None``)."""
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def headline_column(regression: Regression, columns: list[str]) -> str:
    """The per-request column of the headline metric (ITL is read as TPOT on spans).

    Trace-level headlines (``trace``, ``gateway``, ``dependency``) are the
    ``<name>_s`` columns the comparison lifts onto each request; ``e2e_s``
    when that column is not among ``columns``.
    """
    metric = "tpot" if regression.metric == "itl" else regression.metric
    column = LATENCIES.get(metric, f"{metric}_s")
    return column if column in columns else "e2e_s"


def latency_share(regression: Regression, explained: float) -> float:
    """``explained`` for a latency headline; 0 when the headline is the error rate.

    A latency mechanism (cache, batching, KV, slowdowns, dependencies,
    retries) does not account for a rise of the failed share; the ``errors``
    rule does.
    """
    return 0.0 if regression.metric in SHARE_HEADLINES else explained


def tail_shares(stages: StageDecomposition, regression: Regression, comparison: Comparison) -> dict[str, float]:
    """Each stage's share of the headline's tail excess.

    The runner decomposes the tail at the headline quantile; with too few
    tail requests (p99 of a few hundred requests) that is empty, so the
    decomposition is redone at p90, whose tail has ten times the requests.
    """
    if stages.shares or not regression.significant or regression.quantile <= 0.9:
        return stages.shares
    from sre_agent.analysis.decompose import stage_decomposition

    return stage_decomposition(comparison, replace(regression, quantile=0.9)).shares


def stage_share(stages: StageDecomposition, stage: str, regression: Regression, comparison: Comparison) -> float:
    """Share of the headline's tail excess held by ``stage`` (see :func:`tail_shares`).

    A per-token headline (TPOT/ITL) is all decode. Falls back to 1 when the
    headline *is* that stage's own metric and no decomposition could be made.
    """
    if regression.metric in PER_TOKEN_METRICS:
        return 1.0 if stage == "decode" else 0.0
    shares = tail_shares(stages, regression, comparison)
    if shares:
        return shares.get(stage, 0.0)
    own = {"decode": ("tpot", "itl", "decode"), "prefill": ("prefill",), "queue": ("queue",)}
    return 1.0 if regression.metric in own.get(stage, ()) else 0.0


def engine_share(stages: StageDecomposition, regression: Regression, comparison: Comparison) -> float:
    """Share of the headline's tail excess in engine stages (queue + prefill + decode).

    When no decomposition could be made (or the headline is a per-token
    metric it cannot split), every engine-span latency is engine time, so the
    share is 1 for a significant regression and 0 otherwise.
    """
    shares = tail_shares(stages, regression, comparison)
    if shares and regression.metric not in PER_TOKEN_METRICS:
        return sum(shares.get(s, 0.0) for s in ("queue", "prefill", "decode"))
    return 1.0 if regression.significant else 0.0


def side(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    """One side's rows."""
    return frame.filter(pl.col("side") == name)


def side_means(frame: pl.DataFrame, **columns: pl.Expr) -> dict[str, SidePair]:
    """Per named expression, its mean over each side's rows (a side without rows is ``None``)."""
    means = frame.group_by("side").agg(e.mean().alias(k) for k, e in columns.items())
    rows = {str(r["side"]): r for r in means.to_dicts()}
    return {k: SidePair(*(rows.get(s, {}).get(k) for s in SIDES)) for k in columns}


def require_both_sides(frame: pl.DataFrame, what: str) -> None:
    """Raise :class:`RuleSkipped` naming ``what`` when either side has no rows."""
    if any(side(frame, s).height == 0 for s in SIDES):
        raise RuleSkipped(f"no {what} on one side")


def windows_overlap(comparison: Comparison) -> bool:
    """Whether the two windows overlap in time (version mode), so spans cannot be sided by start time."""
    return comparison.windows_overlap


def pow2_bucket(column: str, width: float = 2.0) -> pl.Expr:
    """Geometric bucket label of a positive column: ``"lo-hi"`` with hi = lo * width (values below 1 count as 1)."""
    lo = width ** (pl.col(column).cast(pl.Float64).clip(1.0, None).log(width).floor())
    return pl.format("{}-{}", lo.round(1), (lo * width).round(1))


# ------------------------------------------------------------ localisation
def confined_slice(
    frame: pl.DataFrame,
    dimensions: list[str],
    num: pl.Expr,
    den: pl.Expr,
    *,
    direction: int = 1,
    rest_moved_less: bool = False,
) -> tuple[str, str, float, float] | None:
    """The attribute value that holds most of a ratio's change, if the change is confined to one.

    For each value v, its contribution is ``den_c(v) * (r_c(v) - r_b(v)) * direction``
    (r = sum(num)/sum(den) within v; a value absent from the baseline uses the
    baseline's overall ratio). Returns ``(dimension, value, share of the
    positive change, share of candidate traffic)`` for a value with >= 70 %
    of the change and at least 20 points more of the change than of the
    traffic, else ``None``. A value carrying most of the traffic cannot clear
    the 20 points (80 % of the traffic, 99.7 % of the change: dev 1210092, a
    guardrail x3.3 for its largest tenant); with ``rest_moved_less`` it is
    confined too when the rest of the traffic, at least :data:`MIN_BUCKET`
    requests a side, moved by at most a third as much relative to its own
    baseline (as a replica's own slowdown is told from its peers',
    ``_replica_scope``). For durations only: a rare outcome's share in the
    rest (an error rate on a fifth of the traffic) moves by a third by chance
    (dev 1150259: a 503 on every route, 87 % of the rise on the route with 81 %
    of the traffic).
    """
    data = frame.with_columns(num.cast(pl.Float64).alias("_y"), den.cast(pl.Float64).alias("_x")).drop_nulls(
        ["_y", "_x"]
    )
    base = side(data, "baseline")
    overall_b = float(base["_y"].sum()) / max(1e-12, float(base["_x"].sum())) if base.height else 0.0
    best: tuple[str, str, float, float] | None = None
    for dim in dimensions:
        if dim not in data.columns:
            continue
        grouped = (
            data.group_by(pl.col(dim).cast(pl.String).fill_null("(missing)").alias("v"), "side")
            .agg(pl.col("_y").sum(), pl.col("_x").sum(), pl.len().alias("n"))
            .to_dicts()
        )
        per: dict[str, dict[str, tuple[float, float, int]]] = {}
        for row in grouped:
            per.setdefault(row["v"], {})[row["side"]] = (row["_y"], row["_x"], row["n"])
        n_c = sum(sides["candidate"][2] for sides in per.values() if "candidate" in sides)
        contributions: dict[str, float] = {}
        for value, sides in per.items():
            if "candidate" not in sides:
                continue
            yc, xc, _ = sides["candidate"]
            yb, xb, nb = sides.get("baseline", (0.0, 0.0, 0))
            rate_b = yb / xb if xb > 0 and nb >= MIN_BUCKET else overall_b
            rate_c = yc / xc if xc > 0 else 0.0
            contributions[value] = direction * xc * (rate_c - rate_b)
        total = sum(max(0.0, c) for c in contributions.values())
        if total <= 0 or len(contributions) < 2:
            continue
        value, top = max(contributions.items(), key=lambda kv: kv[1])
        share = top / total
        traffic = per[value]["candidate"][2] / max(1, n_c)
        # Confined: most of the change, and clearly more of it than of the traffic (a uniform change
        # gives every value a share equal to its traffic), or than the rest of the traffic moved.
        apart = share - traffic >= 0.2 or (rest_moved_less and _rest_moved_less(per, value, direction))
        if share >= 0.7 and apart and (best is None or share - traffic > best[2] - best[3]):
            best = (dim, value, share, traffic)
    return best


def _rest_moved_less(per: Mapping[str, Mapping[str, tuple[float, float, int]]], value: str, direction: int) -> bool:
    """Whether the other values together changed by at most a third of ``value``'s relative change.

    ``per``: value -> side -> (sum of numerator, sum of denominator, rows). Both ``value`` and
    the rest need :data:`MIN_BUCKET` rows a side; the change is the ratio's relative change in
    ``direction``.
    """

    def rate(parts: list[tuple[float, float, int]]) -> tuple[float, int] | None:
        y, x, n = (sum(part[i] for part in parts) for i in range(3))
        return (y / x, int(n)) if x > 0 else None

    changes: list[float] = []
    for group in ([per[value]], [sides for v, sides in per.items() if v != value]):
        before = rate([sides["baseline"] for sides in group if "baseline" in sides])
        after = rate([sides["candidate"] for sides in group if "candidate" in sides])
        if before is None or after is None or min(before[1], after[1]) < MIN_BUCKET or before[0] <= 0:
            return False
        changes.append(direction * (after[0] / before[0] - 1.0))
    own, rest = changes
    return own > 0 and rest <= own / 3


#: Queries per prompt token falling below this share of the baseline's means caching was off for part of a window.
QUERIES_LOST: Final[float] = 0.5


def metric_hit_rate(metrics: MetricView, requests: Mapping[str, int]) -> tuple[SidePair, str] | None:
    """Hit rate per side from the counters (else the SGLang gauge) and how it was read."""
    hits, queries = metrics.counter_delta("prefix_cache_hits"), metrics.counter_delta("prefix_cache_queries")
    # Served: engine request spans, else prompt tokens processed (metrics without spans).
    prompt = metrics.counter_delta("prompt_tokens")
    rates: list[float | None] = []
    how = "prefix_cache_hits / prefix_cache_queries counter deltas per window"
    coverage = [
        q / p if q is not None and p else None
        for q, p in ((queries.baseline, prompt.baseline), (queries.candidate, prompt.candidate))
    ]
    if (
        coverage[0]
        and coverage[1] is not None
        and coverage[1] < QUERIES_LOST * coverage[0]
        and hits.baseline is not None
        and prompt.baseline
        and prompt.candidate
    ):
        # The cache stopped being queried for part of the candidate window (caching turned off at a
        # restart inside it): hits over queries is then the few seconds before the restart. Hits
        # per prompt token served (scaled by the baseline's queries per prompt token) is the rate.
        pair = SidePair(hits.baseline / (prompt.baseline * coverage[0]),
                        (hits.candidate or 0.0) / (prompt.candidate * coverage[0]))  # fmt: skip
        return pair, (f"prefix_cache_hits per prompt token: the cache was queried for {coverage[1]:.0%} of the "
                      f"candidate's prompt tokens against {coverage[0]:.0%} before (caching off)")  # fmt: skip
    for h, q, s, p in (
        (hits.baseline, queries.baseline, SIDES[0], prompt.baseline),
        (hits.candidate, queries.candidate, SIDES[1], prompt.candidate),
    ):
        if h is not None and q:
            rates.append(h / q)
        elif q == 0 and (requests[s] > 0 or (p or 0) > 0):
            # Requests were served but the cache was never queried: prefix caching is off.
            rates.append(0.0)
            how += f"; no queries at all on the {s} side (caching off)"
        else:
            rates.append(None)
    if rates[0] is not None and rates[1] is not None:
        return SidePair(rates[0], rates[1]), how
    gauge = metrics.gauge("prefix_cache_hit_rate")
    if gauge.baseline is not None and gauge.candidate is not None:
        return gauge, "cache_hit_rate gauge, window mean"
    return None


#: A prefix-cache hit rate that fell by both (absolute points, relative share) is ``prefix_cache``'s to explain.
HIT_RATE_DROP: Final[tuple[float, float]] = (0.05, 0.10)


def hit_rate_fell(metrics: MetricView, requests: Mapping[str, int]) -> bool:
    """Whether the counters' (else the gauge's) prefix-cache hit rate fell by ``HIT_RATE_DROP`` or more."""
    hit = metric_hit_rate(metrics, requests)
    if hit is None or hit[0].baseline is None or hit[0].candidate is None:
        return False
    before, after = hit[0].baseline, hit[0].candidate
    points, share = HIT_RATE_DROP
    return before - after >= points and before - after >= share * before


def uncached_tokens(comparison: Comparison, metrics: MetricView | None) -> pl.Expr:
    """Prompt tokens a request had to prefill (input - cached), as an expression over ``comparison.requests``.

    Where a span carries no cached-token count (vLLM V0, SGLang, gateway spans), its side's
    hit rate from the counters stands in: ``input x (1 - hit rate)``. Without that either,
    every prompt token counts as uncached. Reading a missing count as "nothing cached" made a
    prefix cache that stopped hitting look like a slower prefill path: the prompts' tokens
    did not change, their prefill time did (dev 1150042, 1150164: 30 % -> 0 % from counters).
    """
    hit = metric_hit_rate(metrics, comparison.request_counts) if metrics is not None else None
    side_hit = pl.lit(0.0)
    if hit is not None and hit[0].baseline is not None and hit[0].candidate is not None:
        side_hit = pl.when(pl.col("side") == SIDES[0]).then(hit[0].baseline).otherwise(hit[0].candidate)
    prompt = pl.col("input_tokens").fill_null(0)
    return (prompt - pl.col("cached_tokens").fill_null(prompt * side_hit)).clip(0)


#: Uncached prompt tokens per request per comparison (and whether metrics were given): several rules ask.
_UNCACHED_CACHE: weakref.WeakKeyDictionary[Comparison, dict[bool, SidePair]] = weakref.WeakKeyDictionary()


def uncached_per_request(comparison: Comparison, metrics: MetricView | None) -> SidePair:
    """Mean uncached prompt tokens per request on each side (:func:`uncached_tokens` over the sample).

    The prefill work each request brings: the batch-composition and prefill rules hold their
    "same work" claims to it. Computed once per comparison.
    """
    known = _UNCACHED_CACHE.setdefault(comparison, {})
    key = metrics is not None
    if key not in known:
        known[key] = side_means(comparison.requests, uncached=uncached_tokens(comparison, metrics))["uncached"]
    return known[key]


def per_request(total: float | None, requests: int) -> float | None:
    """A window total divided by the window's requests (``None`` when unknown or no requests)."""
    return None if total is None or requests <= 0 else total / requests


def wide_enough(
    stages: StageDecomposition, regression: Regression, comparison: Comparison, where: pl.Expr | None = None
) -> StageDecomposition:
    """The stage decomposition, at a lower quantile when the headline's tail is too small to split.

    At p99 a side of 600 requests has 6 tail requests, fewer than the decomposition's minimum
    (``decompose.MIN_TAIL``), and every stage-based rule would fall silent although the headline
    regressed. The widest tail that holds the minimum on the smaller side (quantile
    ``1 - MIN_TAIL / n``, never below p50) is then decomposed instead; its ``quantile`` says
    which, so a finding can state it. ``where``: the slice of requests ``stages`` was read on.
    """
    if stages.shares or regression.metric == "error_rate" or not regression.significant:
        return stages
    requests = comparison.requests if where is None else comparison.requests.filter(where)
    counts = requests.group_by("side").len()
    n = min((int(r["len"]) for r in counts.to_dicts()), default=0)
    if n == 0 or len(counts) < 2:
        return stages
    q = max(0.5, 1.0 - MIN_TAIL / n)
    if q >= stages.quantile:
        return stages
    return stage_decomposition(comparison, replace(regression, quantile=q), where)


def per_replica(
    drivers: Mapping[str, float], comparison: Comparison, *, within_bursts: bool = False
) -> dict[str, float]:
    """Queue drivers with ``load`` and ``capacity`` netted into the offered load *per replica*.

    Queueing follows arrivals per replica (Little's law per replica). ``queue_drivers`` credits
    more arrivals to ``load`` and fewer replicas to ``capacity`` separately and drops falls, so a
    version pair where the canary serves 1 of 3 replicas with a third of the traffic would get a
    ``capacity`` term although each replica carries the same load. Here the two are netted into
    the offered load per replica (:func:`sre_agent.analysis.decompose.offered_load_terms`), all of it
    ``load`` in a version pair (windows that overlap), whose replica counts differ by design. An arrival-rate
    change within the spread of per-slice arrivals (:attr:`Comparison.arrival_change_z` below
    :data:`LOAD_Z`) is no ``load`` driver, unless ``within_bursts`` (for a caller left with no other
    driver), but it still nets against the replicas.
    """
    counts, seconds = comparison.request_counts, comparison.window_seconds()
    z = None if within_bursts else comparison.arrival_change_z
    if z is not None and abs(z) < LOAD_Z:
        # The rate moved no more than the spread of per-slice arrivals: bursts, not load.
        drivers = {k: v for k, v in drivers.items() if k != "load"}
    bursty = z is not None and abs(z) < LOAD_Z
    reps = comparison.requests.group_by("side").agg(replicas_expr().alias("r")).to_dicts()
    r = {row["side"]: int(row["r"]) for row in reps}
    if not (r.get("baseline") and r.get("candidate") and counts.get("baseline") and counts.get("candidate")):
        return dict(drivers)
    if not (seconds.get("baseline") and seconds.get("candidate")):
        return dict(drivers)
    log_rate = math.log((counts["candidate"] / seconds["candidate"]) / (counts["baseline"] / seconds["baseline"]))
    out = {k: v for k, v in drivers.items() if k not in ("load", "capacity")}
    terms = offered_load_terms(log_rate, math.log(r["baseline"] / r["candidate"]))
    if comparison.windows_overlap and terms:
        # A version pair's replica counts are the split's design, not capacity the deploy removed:
        # whatever each replica carries beyond the other version's is the traffic the router sent it
        # (dev 1300102: a canary on 2 of 6 replicas with 45 % more requests per replica read as
        # "capacity: replicas 4 -> 2").
        terms = {"load": sum(terms.values())}
    if bursty:
        # Within the bursts the rate is no driver of its own, but it still nets against the
        # replicas: a canary on 1 of 3 replicas with a third of bursty traffic (dev 1160000:
        # 3.92 -> 1.96 req/s, z = -2.5; replicas 2 -> 1) carries the same load per replica.
        terms.pop("load", None)
    out.update(terms)
    return out


#: Queue drivers per comparison (and whether metrics were given): stages and queueing both read them.
_DRIVERS_CACHE: weakref.WeakKeyDictionary[Comparison, dict[bool, dict[str, float]]] = weakref.WeakKeyDictionary()


def queue_drivers_per_replica(comparison: Comparison, metrics: MetricView | None) -> dict[str, float]:
    """The drivers of the comparison's queueing (:func:`~sre_agent.analysis.decompose.queue_drivers`), uncached
    tokens read with the counters' hit rate (:func:`uncached_tokens`), load and capacity netted per replica.

    Computed once per comparison; each caller gets its own copy."""
    known = _DRIVERS_CACHE.setdefault(comparison, {})
    key = metrics is not None
    if key not in known:
        uncached = uncached_tokens(comparison, metrics)
        drivers = queue_drivers(comparison.requests, comparison.window_seconds(), comparison.request_counts, uncached)
        known[key] = per_replica(drivers, comparison)
    return dict(known[key])


__all__ = [
    "ECHO_MARGIN",
    "LOAD_Z",
    "MIN_BUCKET",
    "SERVING_DIMENSIONS",
    "PER_TOKEN_METRICS",
    "Z_MIN",
    "RatioEstimate",
    "clip01",
    "confined_slice",
    "engine_share",
    "headline_column",
    "latency_share",
    "HIT_RATE_DROP",
    "hit_rate_fell",
    "metric_hit_rate",
    "per_replica",
    "per_request",
    "pow2_bucket",
    "queue_drivers_per_replica",
    "ratio_estimate",
    "require_both_sides",
    "rnd",
    "side",
    "side_means",
    "significance",
    "stage_share",
    "tail_shares",
    "uncached_per_request",
    "uncached_tokens",
    "wide_enough",
    "windows_overlap",
    "z_change",
]
