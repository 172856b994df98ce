"""Engine cost at equal batch size, for the engine rules.

Not a rule (nothing registers it); shared by ``decode_slowdown``,
``prefill_slowdown``, ``batch_composition`` and ``stages``:

* :func:`running_batch`: per sampled request, how many requests the same
  replica was running during that request's prefill or decode, counted
  from the overlap of *every* selected engine span (not just the sample).
* :func:`conditional_log_shift`: the change of a per-request cost at equal
  covariate buckets (batch size, prompt length) versus its raw change, so a
  load- or mix-driven rise is not mistaken for the engine getting slower.
* :func:`engine_cost`: that comparison for decode (TPOT) and prefill (seconds
  per uncached prompt token), computed once per comparison.

What an engine step carries (batch shape, the decode-step mix) is in
:mod:`sre_agent.rules._steps`; offered load and KV pressure in
:mod:`sre_agent.rules._load`.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import polars as pl

from sre_agent.analysis.busy import moment_at, moments
from sre_agent.analysis.compare import SIDES
from sre_agent.analysis.rules_api import Evidence, SidePair
from sre_agent.rules._load import SAME_LOAD
from sre_agent.rules._mechanism import (
    MIN_BUCKET,
    Z_MIN,
    clip01,
    metric_hit_rate,
    pow2_bucket,
    require_both_sides,
    rnd,
    side,
    significance,
    uncached_tokens,
)

if TYPE_CHECKING:
    from sre_agent.analysis.compare import Comparison
    from sre_agent.analysis.metric_view import MetricView
    from sre_agent.rules._steps import BatchShape

#: Width (ratio) of a running-batch bucket: narrow enough that load-driven batch growth stays visible.
RUNNING_BUCKET: Final[float] = 1.25


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


def _work_confounds(column: str, work_ratio: float) -> bool:
    """Whether a change of uncached prompt tokens per request (``work_ratio``, candidate/baseline)
    could have moved ``column`` at equal batch without the engine slowing.

    More prefill per request puts more prompt tokens into the steps a decode shares, so TPOT at
    equal batch rises with no slower step; less prefill takes them out, so a TPOT rise at equal
    batch is then an underestimate, not an echo (1340161: a canary's decode x3.5 at z 10.7 with
    uncached prompt tokens per request x0.81 kept 0.12 and ranked below the stage fallback). A
    prefill cost per uncached token moves either way with the cached share (the cached prefix is
    still attended), so for prefill either direction counts.
    """
    if abs(math.log(max(1e-9, work_ratio))) < math.log(1.0 + WORK_CHANGE):
        return False
    return column != "tpot_s" or work_ratio > 1.0


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
        if _work_confounds(cost.column, batch.work_ratio):
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
        replica_attribute: the attribute naming the replica in ``frame``'s ``replica`` column
            (``host.name``, else ``service.instance.id``; ``None`` when the spans name neither).
    """

    column: str
    shift: ConditionalShift | None
    running: SidePair
    cache_known: bool = True
    frame: pl.DataFrame | None = None
    size_shift: ConditionalShift | None = None
    work: SidePair = field(default_factory=lambda: SidePair(None, None))
    replica_attribute: str | None = None
    #: What readers of this cost derived from it once (e.g. ``_replica_scope``'s slowed replica),
    #: shared by the rules that ask again; not part of the cost's value.
    derived: dict[str, object] = field(default_factory=dict, compare=False, repr=False)


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
    columns = comparison.requests.columns
    replica_attribute = next((a for a in ("host.name", "service.instance.id") if a in columns), None)
    replica = pl.col(replica_attribute).cast(pl.String) if replica_attribute else pl.lit(None, pl.String)
    requests = comparison.requests.select(
        "side",
        "slice",
        "span_id",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
        "prefill_s",
        "tpot_s",
        replica.alias("replica"),
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
            replica_attribute=replica_attribute,
        )
    else:
        frame = requests.filter(pl.col("prefill_s").is_not_null() & (pl.col("input_tokens") > 0))
        require_both_sides(frame, "per-request prefill timing")
        hit = metric_hit_rate(metrics, comparison.request_counts)
        uncached = uncached_tokens(comparison, metrics)
        column = "prefill_s_per_uncached_token"
        frame = frame.with_columns(uncached.clip(1, None).alias("uncached_tokens")).with_columns(
            (pl.col("prefill_s") / pl.col("uncached_tokens")).alias(column)
        )
        frame, running = with_running(comparison, frame, "prefill", pl.col("uncached_tokens"))
        cache_known = hit is not None or frame["cached_tokens"].drop_nulls().len() > 0
        shift = conditional_log_shift(frame, column, "bucket", "batch")
        size_shift = conditional_log_shift(frame, column, "size_bucket", "size")
        result = EngineCost(
            column,
            shift,
            running,
            cache_known,
            frame,
            size_shift,
            _work_per_request(frame, "uncached_tokens"),
            replica_attribute,
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


__all__ = [
    "BATCH_GREW",
    "ConditionalShift",
    "EngineCost",
    "MIN_SLOWDOWN",
    "LengthProfile",
    "Slowdown",
    "assess_slowdown",
    "conditional_log_shift",
    "engine_cost",
    "prefill_length_profile",
    "running_batch",
    "with_running",
]
