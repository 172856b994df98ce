"""Engine cost at equal batch size, step shape and offered load, for the engine rules.

Not a rule (nothing registers it); shared by ``decode_slowdown``,
``prefill_slowdown`` and ``batch_composition``:

* :func:`running_batch`: per sampled request, how many requests the same
  replica was running during that request's prefill or decode, counted
  from the overlap of *every* selected engine span (not just the sample).
* :func:`conditional_log_shift`: the change of a per-request cost at equal
  covariate buckets (batch size, prompt length) versus its raw change, so a
  load- or mix-driven rise is not mistaken for the engine getting slower.
* :func:`engine_cost`: that comparison for decode (TPOT) and prefill (seconds
  per uncached prompt token), computed once per comparison.
* :func:`batch_shape`: tokens per engine step on both sides (the
  ``vllm:iteration_tokens`` histogram), adjusted for the prefill work per
  request, to keep batch-composition changes apart from slowdowns.
* :func:`load_per_replica` / :func:`service_time_queue_share`: whether the
  offered load per replica stayed put, so that a slower step explains the queue.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import polars as pl

from sre_agent.busy import moment_at, moments, replica_expr
from sre_agent.compare import SIDES
from sre_agent.rules._mechanism import (
    LOAD_Z,
    MIN_BUCKET,
    PER_TOKEN_METRICS,
    Z_MIN,
    clip01,
    metric_hit_rate,
    per_request,
    pow2_bucket,
    require_both_sides,
    rnd,
    side,
    significance,
    tail_shares,
)
from sre_agent.rules_api import Evidence, Regression, RuleSkipped, SidePair

if TYPE_CHECKING:
    from sre_agent.compare import Comparison
    from sre_agent.decompose import StageDecomposition
    from sre_agent.metric_view import HistogramDelta, MetricView

#: Relative change of offered load per replica still counted as the same load.
SAME_LOAD: Final[float] = 0.10
#: Width (ratio) of a running-batch bucket: narrow enough that load-driven batch growth stays visible.
RUNNING_BUCKET: Final[float] = 1.25
#: The p99 tokens per step (work-adjusted) must move by this factor to call the batch shape changed.
BATCH_SHAPE_FACTOR: Final[float] = 1.5
#: Quantile of tokens per step whose bucket stands for the step budget.
CAP_QUANTILE: Final[float] = 0.999


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
    intervals = comparison.busy_intervals
    sample, fractions = moments(comparison.requests, at)
    parts: list[pl.DataFrame] = []
    for (replica,), group in sample.group_by("replica"):
        counts = [intervals.running_at(str(replica), moment_at(group, f)) for f in fractions]
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
    def rise(self) -> float:
        """Relative rise at equal buckets (0.25 = 25 % costlier)."""
        return math.exp(self.conditional) - 1.0

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


def _bucket_estimates(data: pl.DataFrame, cost: str, bucket: str) -> pl.DataFrame:
    """Per (side, bucket): requests, mean ``_log`` with its cluster-robust SE, and mean ``cost``.

    The same estimate as ``ratio_estimate(part, _log, 1)`` for every bucket at once,
    from per-slice sums in one group-by (a filter per bucket cost a collect each).
    """
    per_slice = data.group_by("side", bucket, "slice").agg(
        pl.len().alias("n_k"), pl.col("_log").sum().alias("y_k"), (pl.col("_log") ** 2).sum().alias("y2_k"),
        pl.col(cost).sum().alias("c_k"),
    )  # fmt: skip
    mean = pl.col("y") / pl.col("n")
    per_row = (pl.col("y2") - 2 * mean * pl.col("y") + mean**2 * pl.col("n")) / pl.col("n") ** 2
    per_cluster = pl.when(pl.col("k") > 1).then(
        pl.col("k") / (pl.col("k") - 1) * pl.col("resid2") / pl.col("n") ** 2
    ).otherwise(0.0)  # fmt: skip
    groups = per_slice.group_by("side", bucket).agg(
        pl.col("n_k").sum().alias("n"), pl.col("y_k").sum().alias("y"), pl.col("y2_k").sum().alias("y2"),
        pl.col("c_k").sum().alias("c"), pl.len().alias("k"),
        # sum_k (y_k - R n_k)^2 with R = sum y / sum n, expanded so it needs no second pass
        ((pl.col("y_k") - pl.col("y_k").sum() / pl.col("n_k").sum() * pl.col("n_k")) ** 2).sum().alias("resid2"),
    )  # fmt: skip
    return groups.with_columns(
        mean.alias("value"),
        pl.max_horizontal(per_cluster, per_row, 1.0 / pl.col("n") ** 2).sqrt().alias("se"),
        (pl.col("c") / pl.col("n")).alias("cost_mean"),
    )


def conditional_log_shift(frame: pl.DataFrame, cost: str, bucket: str, label: str) -> ConditionalShift | None:
    """Compare ``log(cost)`` per ``bucket`` (a column); ``None`` when no bucket has enough requests on both sides.

    ``frame`` needs ``side``, ``slice``, ``cost`` (> 0 rows only are used) and ``bucket``.
    ``label`` names the bucket in the evidence rows (e.g. ``batch``). Each bucket's
    mean log cost has a cluster-robust SE over the time slices (as :func:`ratio_estimate`).
    """
    data = frame.filter(pl.col(cost).is_not_null() & (pl.col(cost) > 0) & pl.col(bucket).is_not_null())
    data = data.select("side", "slice", bucket, cost, pl.col(cost).log().alias("_log"))
    sides = {s: data.filter(pl.col("side") == s) for s in SIDES}
    if any(part.height < MIN_BUCKET for part in sides.values()):
        return None
    raw = float(sides["candidate"]["_log"].mean()) - float(sides["baseline"]["_log"].mean())  # type: ignore[arg-type]
    estimates = _bucket_estimates(data, cost, bucket)
    both = estimates.filter((pl.col("side") == "baseline") & (pl.col("n") >= MIN_BUCKET)).join(
        estimates.filter((pl.col("side") == "candidate") & (pl.col("n") >= MIN_BUCKET)), on=bucket, suffix="_c"
    )
    if both.height == 0:
        return None
    diffs: list[tuple[float, float, int]] = []
    rows: list[tuple[str, float, float, int]] = []
    for r in both.iter_rows(named=True):
        diffs.append((r["value_c"] - r["value"], r["se"] ** 2 + r["se_c"] ** 2, int(r["n_c"])))
        rows.append((f"{label} {r[bucket]}", float(r["cost_mean"]), float(r["cost_mean_c"]), int(r["n_c"])))
    weight = sum(n for _, _, n in diffs)
    conditional = sum(d * n for d, _, n in diffs) / weight
    se = math.sqrt(sum(v * n * n for _, v, n in diffs)) / weight
    rows.sort(key=lambda r: -r[3])
    return ConditionalShift(raw, conditional, se, len(diffs), weight / sides["candidate"].height, tuple(rows))


# --------------------------------------------------------------- batch shape
@dataclass(frozen=True)
class BatchShape:
    """Tokens per engine step on both sides (``None`` = no histogram there).

    ``work_ratio`` is the candidate/baseline ratio of uncached prompt tokens
    per request (1 when unknown): a cache-hit drop or longer prompts make
    prefill steps bigger without any change to how the engine batches.
    ``cap`` is the upper bound of the histogram bucket holding the 99.9th
    percentile: the largest steps the engine runs, pinned by its token budget.
    """

    mean: SidePair
    p90: SidePair
    p99: SidePair
    steps: SidePair
    cap: SidePair
    work_ratio: float = 1.0

    def adjusted(self, pair: SidePair) -> float | None:
        """candidate/baseline ratio of a statistic, divided by :attr:`work_ratio`."""
        r = pair.ratio
        return None if r is None else r / self.work_ratio

    @property
    def p99_ratio(self) -> float | None:
        """Work-adjusted candidate/baseline ratio of the p99 tokens per step."""
        return self.adjusted(self.p99)

    @property
    def changed(self) -> bool:
        """Whether the step budget moved: the largest steps changed bucket *and* the p99 moved with them.

        The work-adjusted p99 must move by :data:`BATCH_SHAPE_FACTOR` and the
        cap by a factor of 2 (one power-of-two bucket) in the same direction.
        Longer steps under load or slower decodes collect more arrivals, which
        moves the p99 while the budget-pinned cap stays; the mean is not used
        at all (it grows with the running batch).
        """
        r, cap = self.p99_ratio, self.cap.ratio
        if r is None or cap is None:
            return False
        return (r >= BATCH_SHAPE_FACTOR and cap >= 2.0) or (r <= 1 / BATCH_SHAPE_FACTOR and cap <= 0.5)

    def evidence(self) -> list[Evidence]:
        """Evidence rows for the tokens-per-step distribution."""
        return [
            Evidence("iteration_tokens_mean", rnd(self.mean.baseline, 1), rnd(self.mean.candidate, 1),
                     "tokens per engine step (vllm:iteration_tokens)"),
            Evidence("iteration_tokens_p99", rnd(self.p99.baseline, 1), rnd(self.p99.candidate, 1),
                     "tokens per engine step, 99th percentile; uncached prompt tokens per request changed "
                     f"x{self.work_ratio:.2f}"),
            Evidence("iteration_tokens_cap", self.cap.baseline, self.cap.candidate,
                     "bucket bound of the 99.9th percentile of tokens per step (pinned by max_num_batched_tokens)"),
        ]  # fmt: skip


def _cap(hist: HistogramDelta) -> float | None:
    """Upper bound of the bucket holding the 99.9th percentile (the last finite bound for the +Inf bucket)."""
    total = hist.count
    if total == 0 or not hist.bounds:
        return None
    seen = 0
    for i, c in enumerate(hist.counts):
        seen += c
        if seen >= CAP_QUANTILE * total:
            return float(hist.bounds[min(i, len(hist.bounds) - 1)])
    return float(hist.bounds[-1])


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
    if not (requests.get("baseline") and requests.get("candidate")):
        # No request spans: count requests by the engine's latency histogram instead.
        finished = metrics.finished_requests()
        requests = {"baseline": int(finished.baseline or 0), "candidate": int(finished.candidate or 0)}
    hit = metric_hit_rate(metrics, requests)
    per_b, per_c = (
        per_request(prompt.baseline, requests["baseline"]),
        per_request(prompt.candidate, requests["candidate"]),
    )
    if per_b and per_c:
        work = per_c / per_b
    # The uncached share moves prefill work per request whether or not requests can be counted.
    if hit is not None and hit[0].baseline is not None and hit[0].candidate is not None and hit[0].baseline < 1:
        work *= max(1e-3, 1 - hit[0].candidate) / (1 - hit[0].baseline)
    return BatchShape(
        SidePair(b.mean, c.mean),
        SidePair(b.quantile(0.9), c.quantile(0.9)),
        SidePair(b.quantile(0.99), c.quantile(0.99)),
        SidePair(float(b.count), float(c.count)),
        SidePair(_cap(b), _cap(c)),
        work,
    )


# ------------------------------------------------------------ slowdowns
#: Smallest cost rise at equal buckets worth a slowdown finding (10 %).
MIN_SLOWDOWN: Final[float] = 0.10
#: Share of candidate requests in compared batch buckets below which prefill falls back to equal size.
MIN_COVERAGE: Final[float] = 0.25
#: Running-batch growth that a slowdown at unchanged load explains (the fallback's precondition).
BATCH_GREW: Final[float] = 1.3
#: Confidence factor of a prefill cost compared at equal prompt size alone.
SIZE_ONLY_DAMPING: Final[float] = 0.6
#: Rise at which a slowdown counts as unmistakable (30 %).
FULL_SLOWDOWN: Final[float] = 0.30
#: Change of uncached prompt tokens per request that makes steps carry different prefill work (20 %).
WORK_CHANGE: Final[float] = 0.20
#: Confidence factor when each request brings different prefill work (cache-hit drop, longer prompts).
WORK_CHANGED_DAMPING: Final[float] = 0.25
#: Confidence factor when the offered load per replica changed by more than :data:`SAME_LOAD`.
LOAD_CHANGED_DAMPING: Final[float] = 0.5
#: Confidence factor when the batch shape changed too (batch_composition explains it better).
BATCH_CHANGED_DAMPING: Final[float] = 0.4


@dataclass(frozen=True)
class Slowdown:
    """A per-token cost that rose at equal batch size: the shared verdict of the slowdown rules."""

    shift: ConditionalShift
    explained: float
    confidence: float
    evidence: tuple[Evidence, ...]
    #: Compared at equal prompt size alone (the batch grew at unchanged load), not at equal batch too.
    size_only: bool = False

    @property
    def rise(self) -> float:
        """Relative rise at equal buckets (0.25 = 25 % slower)."""
        return self.shift.rise

    @property
    def control(self) -> str:
        """What the compared requests had in common, for a title ("at the same ...")."""
        return "prompt length (the running batch grew at unchanged load)" if self.size_only else "running batch size"


def assess_slowdown(
    cost: EngineCost,
    *,
    share: float,
    batch: BatchShape | None,
    load: SidePair | None = None,
    load_changed: bool | None = None,
) -> Slowdown | None:
    """Judge a per-token cost compared at equal buckets (:func:`engine_cost`).

    ``share``: the part of the headline excess the stage can reach; ``load``:
    offered load per replica (:func:`load_per_replica`), whose change weakens
    the equal-batch control (``load_changed``, from :func:`load_moved`, decides
    whether it changed; without it, a ratio beyond :data:`SAME_LOAD` does);
    ``explained`` is that share times the part of the raw change that remains
    at equal buckets. ``None`` (quiet) when the cost did not rise by
    :data:`MIN_SLOWDOWN` at equal buckets with z >= 2.
    """
    shift, running = cost.shift, cost.running
    work = cost.work.ratio
    # A slower engine at unchanged arrivals and unchanged work per request keeps each request
    # longer, so more of them run at once (Little's law: running = arrivals x time in the engine).
    # The batch cannot have grown otherwise: with the same per-step cost the same arrivals settle
    # at the same batch. Equal-batch buckets then compare the baseline's bursts with the
    # candidate's ordinary moments (steps that differ in the prefill they carry) or hardly
    # overlap, so that control misleads and equal prompt size is the one left, with less weight.
    # Queueing is convex: near saturation a few per cent more arrivals double the batch, so the
    # load must be flat in value, not merely within the spread of a bursty trace (load_changed).
    # (A load flat in value is also one load_moved calls unchanged, so load_changed adds nothing.)
    grew_alone = (
        cost.size_shift is not None
        and _flat(load.ratio if load is not None else None)
        and (running.ratio or 0.0) >= BATCH_GREW
        and _flat(work)
    )
    equal_batch_quiet = shift is None or shift.coverage < MIN_COVERAGE or shift.z < Z_MIN or shift.rise < MIN_SLOWDOWN
    size_only = grew_alone and equal_batch_quiet
    if size_only:
        shift = cost.size_shift
    if shift is None or shift.z < Z_MIN or shift.rise < MIN_SLOWDOWN:
        return None
    rise = math.exp(shift.conditional) - 1.0
    confidence = significance(shift.z) * min(1.0, rise / FULL_SLOWDOWN) * min(1.0, shift.coverage / 0.5)
    if size_only:
        confidence *= SIZE_ONLY_DAMPING
    control = "prompt size only: the batch grew at unchanged load" if size_only else "running batch and prompt size"
    evidence = [
        Evidence(f"{cost.column}_change_at_equal_batch", 0.0, rnd(rise),
                 f"relative change at equal {control} over {shift.buckets} buckets "
                 f"({shift.coverage:.0%} of candidate requests), z = {shift.z:.1f}; raw change "
                 f"{math.exp(shift.raw) - 1.0:+.0%}"),
        Evidence("running_batch_mean", rnd(running.baseline, 2), rnd(running.candidate, 2),
                 "requests running on the same replica (span overlap)"),
    ]  # fmt: skip
    evidence += [
        Evidence(f"{cost.column} mean (s/token) at {label}", rnd(b, 6), rnd(c, 6), f"{n} candidate requests")
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
    if load_changed is None:
        load_changed = load is not None and load.ratio is not None and abs(load.ratio - 1.0) > SAME_LOAD
    if load is not None and load_changed:
        # Busier replicas put more prefill tokens into every step, which the running count does
        # not see: equal batch size no longer means equal step work.
        confidence *= LOAD_CHANGED_DAMPING
        evidence.append(Evidence("offered_load_per_replica", rnd(load.baseline), rnd(load.candidate),
                                 "the load changed: equal running batch is a weaker control"))  # fmt: skip
    return Slowdown(shift, clip01(share * shift.explained_share), confidence, tuple(evidence), size_only)


@dataclass(frozen=True)
class EngineCost:
    """A per-token cost compared between the sides at equal running batch and prompt size.

    Attributes:
        column: the cost (``tpot_s`` or ``prefill_s_per_uncached_token``), seconds per token.
        shift: the comparison (``None`` when no bucket had enough requests on both sides).
        running: mean running batch per side (span overlap).
        cache_known: whether cached prompt tokens were known (spans or counters).
        frame: the compared requests (``side``, ``slice``, ``bucket``, the cost and, for
            prefill, ``uncached_tokens``), for splits such as :func:`prefill_length_profile`.
        size_shift: the comparison at equal prompt size alone (see :func:`assess_slowdown`).
        work: mean tokens per compared request that the stage computes, on each side: output
            tokens for decode (a request decodes for that many steps), uncached prompt tokens
            for prefill.
    """

    column: str
    shift: ConditionalShift | None
    running: SidePair
    cache_known: bool = True
    frame: pl.DataFrame | None = None
    size_shift: ConditionalShift | None = None
    work: SidePair = field(default_factory=lambda: SidePair(None, None))


_COST_CACHE: weakref.WeakKeyDictionary[Comparison, dict[str, EngineCost]] = weakref.WeakKeyDictionary()


def engine_cost(comparison: Comparison, metrics: MetricView, stage: Literal["prefill", "decode"]) -> EngineCost:
    """Decode (TPOT) or prefill (seconds per uncached prompt token) cost at equal batch size, once per comparison.

    Prefill's uncached tokens are input - cached tokens; when spans lack
    ``cached_tokens``, input x (1 - the side's hit rate from the counters);
    with no cache signal at all every prompt token counts as uncached
    (``cache_known`` False). Raises :class:`RuleSkipped` when a side has no
    timing for the stage.
    """
    cached = _COST_CACHE.setdefault(comparison, {})
    if stage in cached:
        return cached[stage]
    # Only the columns used below: a filter or join copies every column of the ~30-column sample.
    requests = comparison.requests.select(
        "side", "slice", "span_id", "input_tokens", "output_tokens", "cached_tokens", "prefill_s", "tpot_s"
    )
    if stage == "decode":
        frame = requests.filter(pl.col("tpot_s").is_not_null() & (pl.col("output_tokens") > 1))
        require_both_sides(frame, "per-request decode timing (tpot)")
        frame, running = with_running(comparison, frame, "decode", pl.col("input_tokens").fill_null(1))
        result = EngineCost(
            "tpot_s",
            conditional_log_shift(frame, "tpot_s", "bucket", "batch"),
            running,
            frame=frame,
            size_shift=conditional_log_shift(frame, "tpot_s", "size_bucket", "size"),
            work=_work_per_request(frame, "output_tokens"),
        )
    else:
        frame = requests.filter(pl.col("prefill_s").is_not_null() & (pl.col("input_tokens") > 0))
        require_both_sides(frame, "per-request prefill timing")
        hit = metric_hit_rate(metrics, comparison.request_counts)
        side_hit = pl.lit(0.0)
        if hit is not None:
            side_hit = pl.when(pl.col("side") == "baseline").then(hit[0].baseline).otherwise(hit[0].candidate)
        uncached = pl.col("input_tokens") - pl.col("cached_tokens").fill_null(pl.col("input_tokens") * side_hit)
        column = "prefill_s_per_uncached_token"
        frame = frame.with_columns(uncached.clip(1, None).alias("uncached_tokens")).with_columns(
            (pl.col("prefill_s") / pl.col("uncached_tokens")).alias(column)
        )
        frame, running = with_running(comparison, frame, "prefill", pl.col("uncached_tokens"))
        cache_known = hit is not None or frame["cached_tokens"].drop_nulls().len() > 0
        shift = conditional_log_shift(frame, column, "bucket", "batch")
        size_shift = conditional_log_shift(frame, column, "size_bucket", "size")
        result = EngineCost(
            column, shift, running, cache_known, frame, size_shift, _work_per_request(frame, "uncached_tokens")
        )
    cached[stage] = result
    return result


def _flat(ratio: float | None) -> bool:
    """Whether a candidate/baseline ratio is known and within :data:`SAME_LOAD` either way (in log)."""
    return ratio is not None and ratio > 0 and abs(math.log(ratio)) < math.log1p(SAME_LOAD)


def _work_per_request(frame: pl.DataFrame, tokens: str) -> SidePair:
    """Mean of column ``tokens`` per request on each side (``None`` where unknown or zero)."""
    means = [side(frame, s)[tokens].mean() for s in SIDES]
    return SidePair(*(float(m) if isinstance(m, int | float) and m > 0 else None for m in means))


#: z of the long-minus-short prompt difference that counts as a length-confined rise.
LENGTH_Z: Final[float] = 3.0


@dataclass(frozen=True)
class LengthProfile:
    """Prefill cost per uncached token at equal batch, for short and long prompts apart.

    A smaller step budget (``max_num_batched_tokens``, SGLang's ``chunked_prefill_size``)
    splits only prompts longer than the new budget into more steps, each carrying its own
    overhead and the decodes beside it; a prompt that fits is computed exactly as before.
    A slower prefill path (kernel, preprocessing) costs every prompt more. So a rise
    confined to the long prompts, with the short ones flat, is the budget's signature.

    Attributes:
        short_tokens: the shortest quarter's upper bound, uncached prompt tokens (both sides pooled).
        long_tokens: the longest quarter's lower bound, uncached prompt tokens.
        short, long: the comparison within each quarter.
    """

    short_tokens: float
    long_tokens: float
    short: ConditionalShift
    long: ConditionalShift

    @property
    def long_only(self) -> bool:
        """Long prompts rose (>= MIN_SLOWDOWN, z >= LENGTH_Z), LENGTH_Z above short ones, which rose < 1/3 as much."""
        se = math.hypot(self.long.se, self.short.se)
        gap = (self.long.conditional - self.short.conditional) / se if se > 0 else 0.0
        return (
            self.long.rise >= MIN_SLOWDOWN
            and self.long.z >= LENGTH_Z
            and gap >= LENGTH_Z
            and self.short.rise < self.long.rise / 3
        )


def prefill_length_profile(cost: EngineCost) -> LengthProfile | None:
    """Compare the shortest and the longest quarter of prompts (uncached tokens) of a prefill :class:`EngineCost`.

    Quarters rather than halves: a budget cut to below the median prompt splits many
    prompts under the median too. ``None`` when a quarter cannot be compared.
    """
    frame = cost.frame
    if frame is None or "uncached_tokens" not in frame.columns or frame.height == 0:
        return None
    tokens = frame["uncached_tokens"]
    low, high = float(tokens.quantile(0.25)), float(tokens.quantile(0.75))  # type: ignore[arg-type]
    short = conditional_log_shift(frame.filter(pl.col("uncached_tokens") <= low), cost.column, "bucket", "batch")
    long = conditional_log_shift(frame.filter(pl.col("uncached_tokens") > high), cost.column, "bucket", "batch")
    if short is None or long is None:
        return None
    return LengthProfile(low, high, short, long)


def with_running(
    comparison: Comparison, frame: pl.DataFrame, at: Literal["prefill", "decode"], size: pl.Expr
) -> tuple[pl.DataFrame, SidePair]:
    """``frame`` plus ``running`` and ``bucket`` (running batch x ``size`` bucket); mean running per side."""
    # A left join plus a filter: polars' inner join on string keys was ~10x slower here (100k rows).
    frame = frame.join(running_batch(comparison, at), on="span_id", how="left").filter(pl.col("running").is_not_null())
    frame = frame.with_columns(size.alias("_size")).with_columns(
        pl.format("{} x size {}", pow2_bucket("running", RUNNING_BUCKET), pow2_bucket("_size", 4.0)).alias("bucket"),
        pow2_bucket("_size", 4.0).cast(pl.String).alias("size_bucket"),
    )
    means = {s: side(frame, s)["running"].mean() for s in SIDES}
    return frame, SidePair(*(float(v) if isinstance(v, int | float) else None for v in means.values()))


# -------------------------------------------------------------- offered load
def load_moved(comparison: Comparison, metrics: MetricView, limit: float = SAME_LOAD) -> bool | None:
    """Whether the offered load per replica changed by more than ``limit``; ``None`` when unknown.

    A change the arrival rate alone carries (replicas within ``limit``) counts only when it
    clears the spread of per-slice arrivals (:attr:`Comparison.arrival_change_z` >= ``LOAD_Z``):
    a bursty trace puts a burst on one side of the deploy by chance.
    """
    load, _ = load_per_replica(comparison, metrics)
    if load.ratio is None:
        return None
    if abs(load.ratio - 1.0) <= limit:
        return False
    rate = comparison.arrival_rate.ratio
    z = comparison.arrival_change_z
    if rate is None or z is None or rate <= 0:
        return True
    same_replicas = abs(load.ratio / rate - 1.0) <= limit
    return not (same_replicas and abs(z) < LOAD_Z)


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
        per_side = frame.group_by("side").agg(pl.coalesce("service_instance", "host_name").n_unique().alias("n"))
        found = dict(zip(per_side["side"].to_list(), per_side["n"].to_list(), strict=True))
        replicas = [found.get(s) or 1 for s in SIDES]
        if rate.baseline is not None and rate.candidate is not None:
            return SidePair(rate.baseline / replicas[0], rate.candidate / replicas[1]), "requests/s per replica"
    prompt, generated = metrics.counter_rate("prompt_tokens"), metrics.counter_rate("generation_tokens")
    series = metrics.serving_replicas()
    values: list[float | None] = []
    for p, g, r in zip(
        (prompt.baseline, prompt.candidate),
        (generated.baseline, generated.candidate),
        (series.baseline, series.candidate),
        strict=True,
    ):
        values.append(None if p is None or g is None or not r else (p + g) / r)
    return SidePair(values[0], values[1]), "tokens/s per replica (counters)"


#: KV usage (p90) from which the running batch counts as held down by free blocks.
KV_FULL: Final[float] = 0.9
#: Rise of preemptions per request that counts as KV pressure.
PREEMPTION_RISE: Final[float] = 0.002


def kv_limited(metrics: MetricView, requests: Mapping[str, int]) -> bool:
    """Whether the candidate's running batch is held down by KV blocks rather than by a slot cap.

    A lower ``max_num_seqs`` plateaus the running gauge with blocks to spare; a smaller KV
    cache caps it too, but with the cache full (usage p90 >= 90 %) or requests preempted
    (>= 0.002 more per request). Both look like "max running fell while requests wait",
    so the slot-cap reading of capacity needs this to be false.
    """
    usage = metrics.gauge("kv_cache_usage", "p90")
    if (usage.candidate or 0.0) >= KV_FULL and (usage.baseline or 0.0) < KV_FULL:
        return True
    if not (requests.get("baseline") and requests.get("candidate")):
        finished = metrics.finished_requests()
        requests = {"baseline": int(finished.baseline or 0), "candidate": int(finished.candidate or 0)}
    preemptions = metrics.counter_delta("preemptions")
    per_b = per_request(preemptions.baseline, requests.get("baseline", 0))
    per_c = per_request(preemptions.candidate, requests.get("candidate", 0))
    return per_b is not None and per_c is not None and per_c - per_b >= PREEMPTION_RISE


#: KV share per running request must rise by this factor for the pool itself to have shrunk.
POOL_SHRANK: Final[float] = 1.15


def kv_per_running(metrics: MetricView) -> tuple[float, Evidence] | None:
    """How much more of the KV cache each running request holds (candidate / baseline), with evidence.

    A smaller KV pool (fewer blocks, a lower ``gpu_memory_utilization``) or longer contexts raise
    the share of the cache a running request holds; more requests running on the same pool do
    not. ``None`` without both the usage and the running gauge.
    """
    usage, running = metrics.gauge("kv_cache_usage", "mean"), metrics.gauge("running_requests", "mean")
    if not (usage.baseline and usage.candidate and running.baseline and running.candidate):
        return None
    per_b, per_c = usage.baseline / running.baseline, usage.candidate / running.candidate
    evidence = Evidence("kv_usage_per_running_request", rnd(per_b, 5), rnd(per_c, 5),
                        "mean KV usage / mean running requests: the cache share one request holds")  # fmt: skip
    return per_c / per_b, evidence


def service_time_queue_share(
    comparison: Comparison, stages: StageDecomposition, regression: Regression, metrics: MetricView
) -> float:
    """Queue share of the tail excess that a slower engine step accounts for, else 0.

    At the same offered load per replica (within 10 %) a longer service time
    fills the slots and requests queue (Little's law), so a per-token slowdown
    explains the queue as well; not when preemptions rose while each running request
    came to hold more of the cache (a smaller pool queues requests itself: KV pressure)
    and not for per-token headlines (they hold no queue time).
    """
    if regression.metric in PER_TOKEN_METRICS:
        return 0.0
    queue = tail_shares(stages, regression, comparison).get("queue", 0.0)
    if queue <= 0:
        return 0.0
    if load_moved(comparison, metrics) is not False:
        return 0.0
    preemptions = metrics.counter_delta("preemptions")
    counts = comparison.request_counts
    per_b, per_c = (
        per_request(preemptions.baseline, counts["baseline"]),
        per_request(preemptions.candidate, counts["candidate"]),
    )
    if per_b is not None and per_c is not None and per_c - per_b >= PREEMPTION_RISE:
        pool = kv_per_running(metrics)
        if pool is None or pool[0] >= POOL_SHRANK:
            return 0.0
        # Each running request holds the same share of the cache as before: the pool filled
        # because slower steps kept more requests running, so the preemptions are this
        # slowdown's consequence and the queue is still its doing.
    return queue


__all__ = [
    "BATCH_GREW",
    "BATCH_SHAPE_FACTOR",
    "BatchShape",
    "ConditionalShift",
    "EngineCost",
    "POOL_SHRANK",
    "LengthProfile",
    "Slowdown",
    "assess_slowdown",
    "batch_shape",
    "conditional_log_shift",
    "engine_cost",
    "kv_limited",
    "kv_per_running",
    "load_moved",
    "load_per_replica",
    "prefill_length_profile",
    "running_batch",
    "service_time_queue_share",
    "with_running",
]


# ------------------------------------------------------------ decode steps
#: Requests per side a decode-step fit needs (three coefficients on noisy per-request means).
STEP_FIT_MIN: Final[int] = 60


@dataclass(frozen=True)
class StepMix:
    """Where a rise in TPOT comes from: the decode work of a step or the prefill chunks sharing it.

    Mechanism: an engine step's time is additive in its work (a fixed part, a part per
    sequence decoding, a part per prompt token prefilled; vLLM V1 and SGLang put prefill
    chunks in the same steps as decodes, V0 runs prefill steps between them that the
    decoding requests wait through). One output token per step, so a request's TPOT is the
    mean step time over its decode: ``tpot = a + b * running + g * prefill_per_step``, where
    ``prefill_per_step`` is the prompt tokens its replica prefilled while it decoded, per
    its own output token. A prefill regression raises ``g``; a decode regression raises
    ``a`` and ``b``. Fitted per side by least squares; the rise is split at the candidate's
    mean work.

    Attributes:
        decode_part: (a_c - a_b) + (b_c - b_b) * mean candidate running, seconds per token.
        prefill_part: (g_c - g_b) * mean candidate prefill per step, seconds per token.
        prefill_per_step: mean prompt tokens prefilled per decode step, per side.
    """

    decode_part: float
    prefill_part: float
    prefill_per_step: SidePair

    @property
    def decode_share(self) -> float | None:
        """The decode part's share of a positive rise (0..1); ``None`` when the TPOT did not rise."""
        total = max(self.decode_part, 0.0) + max(self.prefill_part, 0.0)
        return max(self.decode_part, 0.0) / total if total > 0 else None


def _prefill_integral(starts: np.ndarray, ends: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sorted breakpoints and prefix sums so that ``F(t)`` = prompt tokens prefilled by ``t`` is O(log n).

    Each request prefills ``tokens`` uniformly over ``[starts, ends]`` (ns): its rate ``r``
    contributes ``r * (min(t, end) - start)`` once ``t`` passes its start.
    """
    rate = tokens / np.maximum(ends - starts, 1.0)
    s_order, e_order = np.argsort(starts), np.argsort(ends)
    s_sorted, e_sorted = starts[s_order], ends[e_order]
    zero = np.zeros(1)
    return (
        s_sorted,
        np.concatenate([zero, np.cumsum(rate[s_order])]),
        np.concatenate([zero, np.cumsum(rate[s_order] * s_sorted)]),
        e_sorted,
        np.concatenate([zero, np.cumsum(rate[e_order])]),
        np.concatenate([zero, np.cumsum(rate[e_order] * e_sorted)]),
    )


def _prefilled_by(t: np.ndarray, parts: tuple[np.ndarray, ...]) -> np.ndarray:
    """``F(t)`` of :func:`_prefill_integral`: prompt tokens prefilled on the replica by each ``t``."""
    s_sorted, r_s, rs_s, e_sorted, r_e, re_e = parts
    i = np.searchsorted(s_sorted, t, side="right")
    j = np.searchsorted(e_sorted, t, side="right")
    started = t * r_s[i] - rs_s[i]
    finished = t * r_e[j] - re_e[j]
    out: np.ndarray = started - finished
    return out


def step_mix(comparison: Comparison, cost: EngineCost) -> StepMix | None:
    """Split a decode :class:`EngineCost`'s TPOT change into decode work and shared prefill (see :class:`StepMix`).

    Prompt tokens prefilled come from every sampled request of the replica (uncached
    tokens, spread over its prefill: scheduling to first token), scaled by the side's
    sample fraction. ``None`` when a side has fewer than :data:`STEP_FIT_MIN` decoding
    requests or no prefill timing.
    """
    frame = cost.frame
    if frame is None or "running" not in frame.columns:
        return None
    requests = comparison.requests.filter(pl.col("e2e_s").is_not_null() & pl.col("ttft_s").is_not_null())
    hit = pl.col("cached_tokens").fill_null(0)
    requests = requests.select(
        "side",
        "span_id",
        replica_expr(),
        (pl.col("start_ns") + pl.col("queue_s").fill_null(0.0) * 1e9).cast(pl.Float64).alias("_sched"),
        (pl.col("start_ns") + pl.col("ttft_s") * 1e9).cast(pl.Float64).alias("_first"),
        (pl.col("start_ns") + pl.col("e2e_s") * 1e9).cast(pl.Float64).alias("_end"),
        (pl.col("input_tokens").fill_null(0) - hit).clip(0, None).cast(pl.Float64).alias("_uncached"),
    )
    counts = comparison.request_counts
    scale = {s: counts[s] / max(1, side(requests, s).height) for s in SIDES}
    decoding = frame.select("side", "span_id", "tpot_s", "running", "output_tokens").join(
        requests.select("span_id", "replica", "_first", "_end"), on="span_id", how="inner"
    )
    per_step: list[pl.DataFrame] = []
    decoding_by_replica = decoding.partition_by("replica", as_dict=True)
    for (replica,), group in requests.group_by("replica"):
        mine = decoding_by_replica.get((replica,))
        if mine is None:
            continue
        parts = _prefill_integral(
            group["_sched"].to_numpy(), np.maximum(group["_first"].to_numpy(), group["_sched"].to_numpy()),
            group["_uncached"].to_numpy(),
        )  # fmt: skip
        tokens = _prefilled_by(mine["_end"].to_numpy(), parts) - _prefilled_by(mine["_first"].to_numpy(), parts)
        steps = np.maximum(mine["output_tokens"].to_numpy().astype(np.float64) - 1.0, 1.0)
        per_step.append(mine.select("side", "tpot_s", "running").with_columns(pl.Series("_p", tokens / steps)))
    if not per_step:
        return None
    data = pl.concat(per_step).with_columns(
        pl.col("_p") * pl.when(pl.col("side") == "baseline").then(scale["baseline"]).otherwise(scale["candidate"])
    )
    fits: dict[str, np.ndarray] = {}
    means: dict[str, np.ndarray] = {}
    for s in SIDES:
        part = side(data, s)
        if part.height < STEP_FIT_MIN:
            return None
        x = np.column_stack([np.ones(part.height), part["running"].to_numpy(), part["_p"].to_numpy()])
        if np.linalg.matrix_rank(x) < 3:
            return None
        fits[s] = np.linalg.lstsq(x, part["tpot_s"].to_numpy(), rcond=None)[0]
        means[s] = x.mean(axis=0)
    delta = fits["candidate"] - fits["baseline"]
    at = means["candidate"]
    return StepMix(
        decode_part=float(delta[0] + delta[1] * at[1]),
        prefill_part=float(delta[2] * at[2]),
        prefill_per_step=SidePair(float(means["baseline"][2]), float(at[2])),
    )


_MIX_CACHE: weakref.WeakKeyDictionary[Comparison, tuple[StepMix | None]] = weakref.WeakKeyDictionary()


def decode_step_mix(comparison: Comparison, metrics: MetricView) -> StepMix | None:
    """:func:`step_mix` of the comparison's decode cost, once per comparison; ``None`` when it cannot be fitted."""
    if comparison not in _MIX_CACHE:
        try:
            mix = step_mix(comparison, engine_cost(comparison, metrics, "decode"))
        except RuleSkipped:
            mix = None
        _MIX_CACHE[comparison] = (mix,)
    return _MIX_CACHE[comparison][0]
