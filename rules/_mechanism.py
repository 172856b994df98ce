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
* :func:`running_batch`: per sampled request, how many requests the same
  replica was running at a given moment of that request's life, counted
  from the overlap of *every* selected engine span (not just the sample).
* :func:`conditional_log_shift`: the change of a per-request cost at equal
  covariate buckets (batch size, prompt length) versus its raw change, so a
  load- or mix-driven rise is not mistaken for the engine getting slower.
* :func:`confined_slice`: the one attribute value that holds most of a
  signal's change while carrying a minority of the traffic, if any.
* :func:`batch_shape`: tokens per engine step on both sides (the
  ``vllm:iteration_tokens`` histogram), used to keep batch-composition
  changes apart from slowdowns.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import polars as pl

from sre_agent.compare import LATENCIES, SIDES
from sre_agent.rules_api import Evidence, Regression, RuleSkipped, SidePair

if TYPE_CHECKING:
    from sre_agent.compare import Comparison
    from sre_agent.decompose import StageDecomposition
    from sre_agent.metric_view import MetricView

#: Headline metrics measured per output token: wholly decode-stage, engine time.
PER_TOKEN_METRICS: Final[tuple[str, ...]] = ("tpot", "itl")
#: z below which a change is not evidence at all.
Z_MIN: Final[float] = 2.0
#: z from which a change is certain (confidence 1 before effect-size damping).
Z_FULL: Final[float] = 5.0
#: Fewest requests per side and per covariate bucket for a conditional comparison.
MIN_BUCKET: Final[int] = 20
#: Relative change of offered load per replica still counted as the same load.
SAME_LOAD: Final[float] = 0.10
#: Width (ratio) of a running-batch bucket: narrow enough that load-driven batch growth stays visible.
RUNNING_BUCKET: Final[float] = 1.25
#: Tokens per step must move by this factor (p90 or mean) to call the batch shape changed.
BATCH_SHAPE_FACTOR: Final[float] = 1.5
_NS: Final[int] = 1_000_000_000


@dataclass(frozen=True)
class RatioEstimate:
    """``sum(num) / sum(den)`` over a side, its standard error and the rows behind it.

    ``value`` is ``None`` when the denominator sums to zero.
    """

    value: float | None
    se: float
    n: int


def ratio_estimate(frame: pl.DataFrame, num: pl.Expr, den: pl.Expr, cluster: str = "slice") -> RatioEstimate:
    """Ratio of sums with a cluster-robust (linearised) standard error.

    ``var = K/(K-1) * sum_k (y_k - R x_k)^2 / X^2`` over clusters k, floored by
    the same sum over single rows (never more precise than independent rows).
    """
    rows = frame.select(num.cast(pl.Float64).alias("y"), den.cast(pl.Float64).alias("x"), pl.col(cluster)).drop_nulls(
        ["y", "x"]
    )
    n = rows.height
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


def tail_shares(stages: StageDecomposition, regression: Regression, comparison: Comparison) -> dict[str, float]:
    """Each stage's share of the headline's tail excess.

    The runner decomposes the tail at the headline quantile; with too few
    tail requests (p99 of a few hundred requests) that is empty, so the
    decomposition is redone at p90, whose tail has ten times the requests.
    """
    if stages.shares or not regression.significant or regression.quantile <= 0.9:
        return stages.shares
    from sre_agent.decompose import stage_decomposition

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


def require_both_sides(frame: pl.DataFrame, what: str) -> None:
    """Raise :class:`RuleSkipped` naming ``what`` when either side has no rows."""
    if any(side(frame, s).height == 0 for s in SIDES):
        raise RuleSkipped(f"no {what} on one side")


def windows_overlap(comparison: Comparison) -> bool:
    """Whether the two windows overlap in time (version mode), so spans cannot be sided by start time."""
    b, c = comparison.window("baseline"), comparison.window("candidate")
    return b.start_ns < c.end_ns and c.start_ns < b.end_ns


# ------------------------------------------------------------- running batch
_RUNNING_CACHE: weakref.WeakKeyDictionary[Comparison, dict[str, pl.DataFrame]] = weakref.WeakKeyDictionary()


def running_batch(comparison: Comparison, at: Literal["prefill", "decode"]) -> pl.DataFrame:
    """Per sampled request (``span_id``): requests running on its replica at one moment of its life.

    ``at="prefill"``: when it was scheduled (queue end); ``at="decode"``: the
    mean over a quarter, half and three quarters of its decode (the batch
    changes while a request decodes). A request counts as running from its scheduling
    (arrival + queue) to its end (arrival + e2e). Counted over every
    selected engine span of both windows, per replica (``service.instance.id``,
    else ``host.name``, else ``service.name``). Columns ``span_id``, ``running``.
    """
    cached = _RUNNING_CACHE.setdefault(comparison, {})
    if at in cached:
        return cached[at]
    replica = "coalesce(service_instance, host_name, service_name, '')"
    # Every selected request's busy interval, as two integers per request: no ids, so the whole
    # population stays small even over millions of requests.
    full = comparison.con.sql(
        f"SELECT {replica} AS replica, start_ns + CAST(coalesce(queue_s, 0) * 1e9 AS BIGINT) AS _sched, "
        f"start_ns + CAST(e2e_s * 1e9 AS BIGINT) AS _end FROM "
        f"{comparison.engine_sql('service_instance, host_name, service_name, start_ns, queue_s, e2e_s')} "
        "WHERE e2e_s IS NOT NULL"
    ).pl()
    sample = comparison.requests.filter(pl.col("e2e_s").is_not_null()).select(
        "span_id",
        pl.coalesce("service_instance", "host_name", "service_name", pl.lit("")).alias("replica"),
        "start_ns",
        pl.col("queue_s").fill_null(0.0),
        "ttft_s",
        "e2e_s",
    )
    sched = pl.col("start_ns") + (pl.col("queue_s") * _NS).cast(pl.Int64)
    end = pl.col("start_ns") + (pl.col("e2e_s") * _NS).cast(pl.Int64)
    first = pl.col("start_ns") + (pl.col("ttft_s").fill_null(pl.col("queue_s")) * _NS).cast(pl.Int64)
    fractions = (0.0,) if at == "prefill" else (0.25, 0.5, 0.75)
    origin = sched if at == "prefill" else first
    sample = sample.with_columns(origin.alias("_from"), (end - origin).alias("_span"))
    parts: list[pl.DataFrame] = []
    for (replica,), group in sample.group_by("replica"):
        events = full.filter(pl.col("replica") == replica)
        starts = np.sort(events["_sched"].to_numpy())
        ends = np.sort(events["_end"].to_numpy())
        counts = []
        for f in fractions:
            t = group["_from"].to_numpy() + (group["_span"].to_numpy() * f).astype(np.int64)
            counts.append(np.searchsorted(starts, t, side="right") - np.searchsorted(ends, t, side="right"))
        running = np.maximum(np.mean(counts, axis=0), 1.0)
        parts.append(pl.DataFrame({"span_id": group["span_id"], "running": running.astype(np.float64)}))
    out = pl.concat(parts) if parts else pl.DataFrame(schema={"span_id": pl.String, "running": pl.Float64})
    cached[at] = out
    return out


# ------------------------------------------------------- conditional change
@dataclass(frozen=True)
class ConditionalShift:
    """Change of ``log(cost)`` between the sides, raw and at equal covariate buckets.

    Attributes:
        raw: mean log change over all requests (candidate - baseline).
        conditional: candidate-weighted mean of the per-bucket log changes.
        se: standard error of ``conditional`` (per bucket cluster-robust, combined).
        buckets: buckets compared (both sides >= :data:`MIN_BUCKET` requests).
        coverage: share of the candidate's requests in compared buckets.
        rows: (bucket label, baseline mean cost, candidate mean cost, candidate requests), largest first.
    """

    raw: float
    conditional: float
    se: float
    buckets: int
    coverage: float
    rows: tuple[tuple[str, float, float, int], ...]

    @property
    def z(self) -> float:
        """conditional / se."""
        return self.conditional / self.se if self.se > 0 else 0.0

    @property
    def explained_share(self) -> float:
        """Part of the raw change that remains at equal buckets (0..1; 0 when the cost did not rise)."""
        if self.raw <= 0 or self.conditional <= 0:
            return 0.0
        return clip01(self.conditional / self.raw)


def conditional_log_shift(frame: pl.DataFrame, cost: str, bucket: str, label: str) -> ConditionalShift | None:
    """Compare ``log(cost)`` per ``bucket`` (a column); ``None`` when no bucket has enough requests on both sides.

    ``frame`` needs ``side``, ``slice``, ``cost`` (> 0 rows only are used) and ``bucket``.
    ``label`` names the bucket in the evidence rows (e.g. ``batch``).
    """
    data = frame.filter(pl.col(cost).is_not_null() & (pl.col(cost) > 0) & pl.col(bucket).is_not_null())
    data = data.with_columns(pl.col(cost).log().alias("_log"))
    b_all, c_all = side(data, "baseline"), side(data, "candidate")
    if b_all.height < MIN_BUCKET or c_all.height < MIN_BUCKET:
        return None
    raw = float(c_all["_log"].mean()) - float(b_all["_log"].mean())  # type: ignore[arg-type]
    one = pl.lit(1.0)
    diffs: list[tuple[float, float, int]] = []
    rows: list[tuple[str, float, float, int]] = []
    for (key,), c_part in c_all.group_by(bucket):
        b_part = b_all.filter(pl.col(bucket) == key)
        if b_part.height < MIN_BUCKET or c_part.height < MIN_BUCKET:
            continue
        eb = ratio_estimate(b_part, pl.col("_log"), one)
        ec = ratio_estimate(c_part, pl.col("_log"), one)
        if eb.value is None or ec.value is None:
            continue
        diffs.append((ec.value - eb.value, eb.se**2 + ec.se**2, c_part.height))
        rows.append(
            (f"{label} {key}", float(b_part[cost].mean()), float(c_part[cost].mean()), c_part.height)  # type: ignore[arg-type]
        )
    if not diffs:
        return None
    weight = sum(n for _, _, n in diffs)
    conditional = sum(d * n for d, _, n in diffs) / weight
    se = math.sqrt(sum(v * n * n for _, v, n in diffs)) / weight
    rows.sort(key=lambda r: -r[3])
    return ConditionalShift(raw, conditional, se, len(diffs), weight / c_all.height, tuple(rows))


def pow2_bucket(column: str, width: float = 2.0) -> pl.Expr:
    """Geometric bucket label of a positive column: ``"lo-hi"`` with hi = lo * width (values below 1 count as 1)."""
    lo = width ** (pl.col(column).cast(pl.Float64).clip(1.0, None).log(width).floor())
    return pl.format("{}-{}", lo.round(1), (lo * width).round(1))


# ------------------------------------------------------------ localisation
def confined_slice(
    frame: pl.DataFrame, dimensions: list[str], num: pl.Expr, den: pl.Expr, *, direction: int = 1
) -> tuple[str, str, float, float] | None:
    """The attribute value that holds most of a ratio's change, if the change is confined to one.

    For each value v, its contribution is ``den_c(v) * (r_c(v) - r_b(v)) * direction``
    (r = sum(num)/sum(den) within v; a value absent from the baseline uses the
    baseline's overall ratio). Returns ``(dimension, value, share of the
    positive change, share of candidate traffic)`` for a value with >= 70 %
    of the change and at least 20 points more of the change than of the
    traffic, else ``None``.
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
        # gives every value a share equal to its traffic).
        if share >= 0.7 and share - traffic >= 0.2 and (best is None or share - traffic > best[2] - best[3]):
            best = (dim, value, share, traffic)
    return best


# --------------------------------------------------------------- batch shape
@dataclass(frozen=True)
class BatchShape:
    """Tokens per engine step on both sides (``None`` = no histogram there).

    ``work_ratio`` is the candidate/baseline ratio of uncached prompt tokens
    per request (1 when unknown): a cache-hit drop or longer prompts make
    prefill steps bigger without any change to how the engine batches.
    """

    mean: SidePair
    p90: SidePair
    p99: SidePair
    steps: SidePair
    work_ratio: float = 1.0

    def adjusted(self, pair: SidePair) -> float | None:
        """candidate/baseline ratio of a statistic, divided by :attr:`work_ratio`."""
        r = pair.ratio
        return None if r is None else r / self.work_ratio

    @property
    def cap_ratio(self) -> float | None:
        """Work-adjusted ratio of the p99 tokens per step (the step budget shows there)."""
        return self.adjusted(self.p99)

    @property
    def changed(self) -> bool:
        """Whether the work-adjusted p99 tokens per step moved by :data:`BATCH_SHAPE_FACTOR` or more.

        The mean is not used: it grows with the running batch (more decodes per
        step), so load or slower decodes move it without any batching change.
        """
        r = self.cap_ratio
        return r is not None and (r >= BATCH_SHAPE_FACTOR or r <= 1 / BATCH_SHAPE_FACTOR)

    def evidence(self) -> list[Evidence]:
        """Evidence rows for the tokens-per-step distribution."""
        return [
            Evidence("iteration_tokens_mean", rnd(self.mean.baseline, 1), rnd(self.mean.candidate, 1),
                     "tokens per engine step (vllm:iteration_tokens)"),
            Evidence("iteration_tokens_p99", rnd(self.p99.baseline, 1), rnd(self.p99.candidate, 1),
                     "tokens per engine step, 99th percentile (bounded by max_num_batched_tokens); uncached prompt "
                     f"tokens per request changed x{self.work_ratio:.2f}"),
        ]  # fmt: skip


def batch_shape(metrics: MetricView, requests: Mapping[str, int]) -> BatchShape | None:
    """Tokens-per-step histogram summary, or ``None`` when either side lacks it.

    ``requests``: engine requests per side, to put the prompt-token counter per request.
    """
    hist = metrics.histogram("iteration_tokens")
    b, c = hist.get("baseline"), hist.get("candidate")
    if b is None or c is None or b.count == 0 or c.count == 0:
        return None
    work = 1.0
    prompt = metrics.counter_delta("prompt_tokens")
    hit = metric_hit_rate(metrics, requests)
    per_b, per_c = (
        per_request(prompt.baseline, requests["baseline"]),
        per_request(prompt.candidate, requests["candidate"]),
    )
    if per_b and per_c:
        work = per_c / per_b
        if hit is not None and hit[0].baseline is not None and hit[0].candidate is not None and hit[0].baseline < 1:
            work *= max(1e-3, 1 - hit[0].candidate) / (1 - hit[0].baseline)
    return BatchShape(
        SidePair(b.mean, c.mean),
        SidePair(b.quantile(0.9), c.quantile(0.9)),
        SidePair(b.quantile(0.99), c.quantile(0.99)),
        SidePair(float(b.count), float(c.count)),
        work,
    )


def metric_hit_rate(metrics: MetricView, requests: Mapping[str, int]) -> tuple[SidePair, str] | None:
    """Hit rate per side from the counters (else the SGLang gauge) and how it was read."""
    hits, queries = metrics.counter_delta("prefix_cache_hits"), metrics.counter_delta("prefix_cache_queries")
    rates: list[float | None] = []
    how = "prefix_cache_hits / prefix_cache_queries counter deltas per window"
    for h, q, s in ((hits.baseline, queries.baseline, SIDES[0]), (hits.candidate, queries.candidate, SIDES[1])):
        if h is not None and q:
            rates.append(h / q)
        elif q == 0 and requests[s] > 0:
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


def per_request(total: float | None, requests: int) -> float | None:
    """A window total divided by the window's requests (``None`` when unknown or no requests)."""
    return None if total is None or requests <= 0 else total / requests


# ------------------------------------------------------------ slowdowns
#: Smallest cost rise at equal buckets worth a slowdown finding (10 %).
MIN_SLOWDOWN: Final[float] = 0.10
#: Rise at which a slowdown counts as unmistakable (30 %).
FULL_SLOWDOWN: Final[float] = 0.30
#: Change of uncached prompt tokens per request that makes steps carry different prefill work (20 %).
WORK_CHANGE: Final[float] = 0.20
#: Confidence factor when each request brings different prefill work (cache-hit drop, longer prompts).
WORK_CHANGED_DAMPING: Final[float] = 0.25
#: Confidence factor when the batch shape changed too (batch_composition explains it better).
BATCH_CHANGED_DAMPING: Final[float] = 0.4


@dataclass(frozen=True)
class Slowdown:
    """A per-token cost that rose at equal batch size: the shared verdict of the slowdown rules."""

    shift: ConditionalShift
    explained: float
    confidence: float
    evidence: tuple[Evidence, ...]

    @property
    def rise(self) -> float:
        """Relative rise at equal buckets (0.25 = 25 % slower)."""
        return math.exp(self.shift.conditional) - 1.0


def assess_slowdown(
    frame: pl.DataFrame,
    *,
    cost: str,
    unit: str,
    share: float,
    batch: BatchShape | None,
    running: SidePair,
) -> Slowdown | None:
    """Judge a per-token cost (column ``cost``, bucketed by column ``bucket``) between the sides.

    ``share``: the stage's share of the headline excess; ``explained`` is that
    share times the part of the raw change that remains at equal buckets.
    ``None`` (quiet) when the cost did not rise by :data:`MIN_SLOWDOWN` at
    equal buckets with z >= 2.
    """
    shift = conditional_log_shift(frame, cost, "bucket", "batch")
    if shift is None or shift.z < Z_MIN or math.exp(shift.conditional) - 1.0 < MIN_SLOWDOWN:
        return None
    rise = math.exp(shift.conditional) - 1.0
    confidence = significance(shift.z) * min(1.0, rise / FULL_SLOWDOWN) * min(1.0, shift.coverage / 0.5)
    evidence = [
        Evidence(f"{cost}_change_at_equal_batch", 0.0, rnd(rise),
                 f"relative change at equal running batch and prompt size over {shift.buckets} buckets "
                 f"({shift.coverage:.0%} of candidate requests), z = {shift.z:.1f}; raw change "
                 f"{math.exp(shift.raw) - 1.0:+.0%}"),
        Evidence("running_batch_mean", rnd(running.baseline, 2), rnd(running.candidate, 2),
                 "requests running on the same replica (span overlap)"),
    ]  # fmt: skip
    evidence += [
        Evidence(f"{cost} mean ({unit}) at {label}", rnd(b, 6), rnd(c, 6), f"{n} candidate requests")
        for label, b, c, n in shift.rows[:3]
    ]
    if batch is not None:
        evidence += batch.evidence()
        # Steps that changed shape, or that carry more prefill per request (cache-hit drop, longer
        # prompts), are slower for reasons other rules name; the step itself need not have slowed.
        if batch.changed:
            confidence *= BATCH_CHANGED_DAMPING
        if abs(math.log(max(1e-9, batch.work_ratio))) >= math.log(1.0 + WORK_CHANGE):
            confidence *= WORK_CHANGED_DAMPING
    return Slowdown(shift, clip01(share * shift.explained_share), confidence, tuple(evidence))


def with_running(
    comparison: Comparison, frame: pl.DataFrame, at: Literal["prefill", "decode"], size: pl.Expr
) -> tuple[pl.DataFrame, SidePair]:
    """``frame`` plus ``running`` and ``bucket`` (running batch x ``size`` bucket); mean running per side."""
    frame = frame.join(running_batch(comparison, at), on="span_id", how="inner")
    frame = frame.with_columns(size.alias("_size")).with_columns(
        pl.format("{} x size {}", pow2_bucket("running", RUNNING_BUCKET), pow2_bucket("_size", 4.0)).alias("bucket")
    )
    means = {s: side(frame, s)["running"].mean() for s in SIDES}
    return frame, SidePair(*(float(v) if isinstance(v, int | float) else None for v in means.values()))


# ---------------------------------------------------------- non-engine spans
def other_spans_sql(comparison: Comparison) -> str:
    """A subquery over the non-engine spans of both windows (by each span's own start time).

    Columns: ``side``, ``slice`` (the comparison's time slices), ``trace_id``,
    ``span_id``, ``service_name``, ``name``, ``kind``, ``duration_s``,
    ``status_code``, ``error_type``, ``attempt``, ``is_root`` (no parent),
    ``wraps_engine`` (an engine request span is its child: a gateway attempt).
    The ``--service`` filter is not applied: dependencies live in other services.
    """
    b, c = comparison.window("baseline"), comparison.window("candidate")
    k = comparison.slices
    lo, hi = min(b.start_ns, c.start_ns), max(b.end_ns, c.end_ns)
    side_sql = (
        f"CASE WHEN s.start_ns >= {b.start_ns} AND s.start_ns < {b.end_ns} THEN 'baseline' "
        f"WHEN s.start_ns >= {c.start_ns} AND s.start_ns < {c.end_ns} THEN 'candidate' END"
    )
    in_b = f"s.start_ns >= {b.start_ns} AND s.start_ns < {b.end_ns}"
    b_len, c_len = max(1, b.end_ns - b.start_ns), max(1, c.end_ns - c.start_ns)
    slice_sql = (
        f"CAST(floor((s.start_ns - CASE WHEN {in_b} THEN {b.start_ns} ELSE {c.start_ns} END) * {k}.0 "
        f"/ CASE WHEN {in_b} THEN {b_len} ELSE {c_len} END) AS INTEGER)"
    )
    return f"""(
        WITH eng AS (
          SELECT DISTINCT trace_id, parent_span_id FROM spans
          WHERE is_engine AND parent_span_id IS NOT NULL
            AND start_ns >= {lo - 3600 * _NS} AND start_ns < {hi + 3600 * _NS}
        )
        SELECT {side_sql} AS side, {slice_sql} AS slice, s.trace_id, s.span_id, s.service_name, s.name, s.kind,
          CASE WHEN s.duration_s >= 0 AND isfinite(s.duration_s) THEN s.duration_s END AS duration_s,
          s.status_code, s.error_type, s.attempt, s.parent_span_id IS NULL AS is_root,
          eng.trace_id IS NOT NULL AS wraps_engine
        FROM spans s LEFT JOIN eng ON eng.trace_id = s.trace_id AND eng.parent_span_id = s.span_id
        WHERE NOT coalesce(s.is_engine, false) AND s.start_ns >= {lo} AND s.start_ns < {hi}
          AND {side_sql} IS NOT NULL
    )"""


# -------------------------------------------------------------- offered load
def load_per_replica(comparison: Comparison, metrics: MetricView) -> tuple[SidePair, str]:
    """Offered load per replica on each side, and its unit.

    With engine spans on both sides: requests per second over the distinct
    replicas serving them. Without: prompt + generation tokens per second
    (counter deltas) over the replicas reporting the running gauge. A pair of
    ``None`` when neither is known (no side can then be said to carry the same load).
    """
    counts = comparison.request_counts
    frame = comparison.requests
    if all(counts.get(s, 0) > 0 for s in SIDES) and frame.height:
        rate = comparison.arrival_rate
        replicas = [
            side(frame, s).select(pl.coalesce("service_instance", "host_name").n_unique()).item() or 1 for s in SIDES
        ]
        if rate.baseline is not None and rate.candidate is not None:
            return SidePair(rate.baseline / replicas[0], rate.candidate / replicas[1]), "requests/s per replica"
    prompt, generated = metrics.counter_rate("prompt_tokens"), metrics.counter_rate("generation_tokens")
    series = metrics.series_count("running_requests")
    values: list[float | None] = []
    for p, g, r in zip(
        (prompt.baseline, prompt.candidate),
        (generated.baseline, generated.candidate),
        (series.baseline, series.candidate),
        strict=True,
    ):
        values.append(None if p is None or g is None or not r else (p + g) / r)
    return SidePair(values[0], values[1]), "tokens/s per replica (counters)"


def service_time_queue_share(
    comparison: Comparison, stages: StageDecomposition, regression: Regression, metrics: MetricView
) -> float:
    """Queue share of the tail excess that a slower engine step accounts for, else 0.

    At the same offered load per replica (within 10 %) a longer service time
    fills the slots and requests queue (Little's law), so a per-token slowdown
    explains the queue as well; not when preemptions rose (KV pressure queues
    requests itself) and not for per-token headlines (they hold no queue time).
    """
    if regression.metric in PER_TOKEN_METRICS:
        return 0.0
    queue = tail_shares(stages, regression, comparison).get("queue", 0.0)
    if queue <= 0:
        return 0.0
    load, _ = load_per_replica(comparison, metrics)
    if load.ratio is None or abs(load.ratio - 1.0) > SAME_LOAD:
        return 0.0
    preemptions = metrics.counter_delta("preemptions")
    counts = comparison.request_counts
    per_b, per_c = (
        per_request(preemptions.baseline, counts["baseline"]),
        per_request(preemptions.candidate, counts["candidate"]),
    )
    if per_b is not None and per_c is not None and per_c - per_b >= 0.002:
        return 0.0
    return queue


__all__ = [
    "BATCH_SHAPE_FACTOR",
    "MIN_BUCKET",
    "SIDES",
    "BatchShape",
    "ConditionalShift",
    "RatioEstimate",
    "Slowdown",
    "assess_slowdown",
    "batch_shape",
    "clip01",
    "conditional_log_shift",
    "confined_slice",
    "engine_share",
    "headline_column",
    "load_per_replica",
    "metric_hit_rate",
    "other_spans_sql",
    "per_request",
    "pow2_bucket",
    "ratio_estimate",
    "require_both_sides",
    "rnd",
    "running_batch",
    "service_time_queue_share",
    "side",
    "significance",
    "stage_share",
    "tail_shares",
    "windows_overlap",
    "with_running",
    "z_change",
]
