"""What an engine step carries, for the engine rules: tokens per step and the decode/prefill mix of its time.

Not a rule (nothing registers it). Apart from :mod:`sre_agent.rules._engine_cost`
(a request's cost at equal batch) because these look at the step itself, to keep
a change in how the engine batches apart from the engine getting slower:

* :func:`batch_shape`: tokens per engine step on both sides (the
  ``vllm:iteration_tokens`` histogram), adjusted for the prefill work per
  request, to keep batch-composition changes apart from slowdowns.
* :func:`step_mix` / :func:`decode_step_mix`: how much of a TPOT rise is decode
  work and how much the prefill chunks sharing the steps (:class:`StepMix`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import polars as pl

from sre_agent.analysis.busy import replica_expr
from sre_agent.analysis.compare import SIDES
from sre_agent.analysis.rules_api import Evidence, RuleSkipped, SidePair
from sre_agent.rules._engine_cost import EngineCost, engine_cost
from sre_agent.rules._load import cap_binds, kv_limited
from sre_agent.rules._mechanism import metric_hit_rate, per_request, rnd, side, side_means, uncached_tokens

if TYPE_CHECKING:
    from sre_agent.analysis.compare import Comparison
    from sre_agent.analysis.metric_view import HistogramDelta, MetricView

#: The p99 tokens per step (work-adjusted) must move by this factor to call the batch shape changed.
BATCH_SHAPE_FACTOR: Final[float] = 1.5
#: Factor by which the cap alone must fall (two power-of-two buckets) to call the budget cut.
CAP_CUT: Final[float] = 4.0
#: Change of uncached prompt tokens per request within which the work counts as the same.
SAME_WORK: Final[float] = 0.2
#: Share of the steps (of the side with fewer) whose bucket stands for the step budget.
CAP_SHARE: Final[float] = 0.001
#: Chance, were both sides' scrape intervals alike, that the candidate's intervals holding a step
#: larger than every baseline step would all fall on the candidate side, below which the budget rose.
ABOVE_BUDGET_P: Final[float] = 0.001
#: Scrape intervals (time blocks) a side needs before the test above is read.
MIN_BLOCKS: Final[int] = 8


@dataclass(frozen=True)
class StepsAbove:
    """Candidate steps larger than every baseline step: a budget that let bigger steps through.

    ``steps`` candidate steps fall in buckets above the baseline's largest occupied bucket,
    within ``blocks`` of the candidate's scrape intervals. ``p`` is the chance that the
    ``blocks`` intervals whose largest step tops every baseline interval's would all be the
    candidate's were the two sides' intervals exchangeable: C(n_c, m) / C(n_b + n_c, m), exact
    and free of any step-size distribution. Intervals, not steps, are the units: the steps of one
    burst share their prompts.
    """

    steps: int
    blocks: int
    p: float


def steps_above(before: HistogramDelta, after: HistogramDelta) -> StepsAbove | None:
    """The candidate's steps above the baseline's largest (:class:`StepsAbove`); ``None`` without
    :data:`MIN_BLOCKS` scrape intervals a side, or when the baseline's steps reach the +Inf bucket."""
    if before.bounds != after.bounds:
        return None
    top = max((i for i, n in enumerate(before.counts) if n), default=None)
    base_blocks = [b for b in before.blocks if sum(b)]
    cand_blocks = [b for b in after.blocks if sum(b)]
    if top is None or top >= len(before.bounds) or min(len(base_blocks), len(cand_blocks)) < MIN_BLOCKS:
        return None
    above = [sum(b[top + 1 :]) for b in cand_blocks]
    held = sum(1 for n in above if n)
    total = len(base_blocks) + len(cand_blocks)
    p = math.prod((len(cand_blocks) - i) / (total - i) for i in range(held))
    return StepsAbove(sum(above), held, p)


# --------------------------------------------------------------- batch shape
@dataclass(frozen=True)
class BatchShape:
    """Tokens per engine step on both sides (``None`` = no histogram there).

    ``work_ratio`` is the candidate/baseline ratio of uncached prompt tokens
    per request (1 when unknown): a cache-hit drop or longer prompts make
    prefill steps bigger without any change to how the engine batches.
    ``cap`` is the upper bound of the bucket where a side's largest steps begin, as many
    on both sides (0.1 % of the side with fewer steps): the largest steps the engine runs,
    pinned by its token budget. As many, not the same share: a decode x1.30 ran 18 % fewer
    steps at the same load, and the same ~70 steps above 2048 tokens crossed 0.1 % of them,
    which read as the budget doubled (dev 1150079).
    """

    mean: SidePair
    p90: SidePair
    p99: SidePair
    steps: SidePair
    cap: SidePair
    work_ratio: float = 1.0
    above: StepsAbove | None = None

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
        """Whether the step budget moved: the largest steps changed bucket *and* the p99 moved too.

        The work-adjusted p99 must move by :data:`BATCH_SHAPE_FACTOR` and the
        cap by a factor of 2 (one power-of-two bucket), each in either direction;
        or the cap alone fall by :data:`CAP_CUT` at the same prefill work per request.
        Longer steps under load or slower decodes collect more arrivals, which
        moves the p99 while the budget-pinned cap stays; the mean is not used
        at all (it grows with the running batch).
        """
        r, cap = self.p99_ratio, self.cap.ratio
        if r is None or cap is None or r <= 0 or cap <= 0:
            return False
        # Either direction each: a budget cut below long prompts splits their one big step into
        # many budget-sized chunks, so the cap falls while the p99 rises (1050244: 16384 -> 256,
        # p99 15 -> 246 tokens); a raise does the reverse.
        if abs(math.log(r)) >= math.log(BATCH_SHAPE_FACTOR) and abs(math.log(cap)) >= math.log(2.0):
            return True
        same_work = abs(math.log(self.work_ratio)) < math.log(1 + SAME_WORK)
        # The largest steps two buckets smaller at the same prefill work per request: nothing but
        # a lower budget shrinks them (more load, longer or uncached prompts only grow them), and
        # the p99 may sit below both budgets (1050037: cap 4096 -> 256, p99 311 -> 227).
        if cap <= 1 / CAP_CUT and same_work:
            return True
        # Steps larger than any the baseline ran, in too many scrape intervals for chance, at the
        # same prefill work: under chunked prefill no step exceeds max_num_batched_tokens whatever
        # the load, so the budget rose or chunking was turned off (whole prompts in one step). The
        # p99 step need not move: most steps are decodes (dev 1340076: 740 baseline steps at the
        # 8192 bound and none above, 309 candidate steps above it in all 29 intervals).
        return cap > 1 and same_work and self.above is not None and self.above.p <= ABOVE_BUDGET_P

    def evidence(self) -> list[Evidence]:
        """Evidence rows for the tokens-per-step distribution."""
        above = []
        if self.above is not None and self.above.steps:
            above = [Evidence("steps_above_baseline_largest", 0, self.above.steps,
                              f"steps larger than any baseline step, in {self.above.blocks} scrape intervals; "
                              f"p = {self.above.p:.2g} were the sides' intervals alike")]  # fmt: skip
        return [*above,
            Evidence("iteration_tokens_mean", rnd(self.mean.baseline, 1), rnd(self.mean.candidate, 1),
                     "tokens per engine step (vllm:iteration_tokens)"),
            Evidence("iteration_tokens_p99", rnd(self.p99.baseline, 1), rnd(self.p99.candidate, 1),
                     "tokens per engine step, 99th percentile; uncached prompt tokens per request changed "
                     f"x{self.work_ratio:.2f}"),
            Evidence("iteration_tokens_cap", self.cap.baseline, self.cap.candidate,
                     "bound of the bucket of the largest 0.1 % of steps (pinned by max_num_batched_tokens)"),
        ]  # fmt: skip


def _cap(hist: HistogramDelta, steps: float) -> float | None:
    """Upper bound of the bucket where the largest ``steps`` steps begin (the last finite bound for +Inf)."""
    if hist.count == 0 or not hist.bounds:
        return None
    seen = 0
    for i in range(len(hist.counts) - 1, -1, -1):
        seen += hist.counts[i]
        if seen >= steps:
            return float(hist.bounds[min(i, len(hist.bounds) - 1)])
    return float(hist.bounds[0])


def batch_shape(metrics: MetricView, comparison: Comparison) -> BatchShape | None:
    """Tokens-per-step histogram summary, or ``None`` when either side lacks it.

    The prefill work per request (:attr:`BatchShape.work_ratio`) is the requests' own uncached
    prompt tokens where spans carry prompt lengths, else the prompt-token counter per request.
    The counter counts the prompts the engine prefilled in the window, the spans the requests
    that arrived in it: behind a growing backlog the two differ (dev 1210222: a decode x3 left
    TTFT at 69 s, and the counter per arriving request read the same prompts as x0.81 of the
    work, which damped the slowdown as "other prefill work").
    """
    known = _SHAPE_CACHE.setdefault(comparison, {})
    if id(metrics) not in known:
        known[id(metrics)] = (_batch_shape(metrics, comparison),)
    return known[id(metrics)][0]


#: :func:`batch_shape` per comparison and metric view: four rules and the capacity readings ask.
_SHAPE_CACHE: weakref.WeakKeyDictionary[Comparison, dict[int, tuple[BatchShape | None]]] = weakref.WeakKeyDictionary()


def _batch_shape(metrics: MetricView, comparison: Comparison) -> BatchShape | None:
    """Uncached :func:`batch_shape`."""
    hist = metrics.histogram("iteration_tokens")
    b, c = hist.get("baseline"), hist.get("candidate")
    if b is None or c is None or b.count == 0 or c.count == 0:
        return None
    requests: Mapping[str, int] = comparison.request_counts
    measured = _span_work_ratio(comparison, metrics)
    if measured is not None:
        return _shape(b, c, measured)
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
    return _shape(b, c, work)


def _span_work_ratio(comparison: Comparison, metrics: MetricView) -> float | None:
    """Candidate / baseline mean uncached prompt tokens per request from the spans (``None`` without them)."""
    frame = comparison.requests
    if frame.height == 0 or "input_tokens" not in frame.columns:
        return None
    known = frame.filter(pl.col("input_tokens").is_not_null())
    means = side_means(known, work=uncached_tokens(comparison, metrics))["work"]
    if not means.baseline or not means.candidate:
        return None
    return float(means.candidate) / float(means.baseline)


def _shape(b: HistogramDelta, c: HistogramDelta, work: float) -> BatchShape:
    """The :class:`BatchShape` of two tokens-per-step histograms at prefill work ratio ``work``."""
    steps = CAP_SHARE * min(b.count, c.count)
    return BatchShape(
        SidePair(b.mean, c.mean),
        SidePair(b.quantile(0.9), c.quantile(0.9)),
        SidePair(b.quantile(0.99), c.quantile(0.99)),
        SidePair(float(b.count), float(c.count)),
        SidePair(_cap(b, steps), _cap(c, steps)),
        work,
        steps_above(b, c),
    )


def budget_fell(metrics: MetricView, comparison: Comparison) -> bool:
    """Whether the step budget fell: the tokens-per-step histogram moved (:attr:`BatchShape.changed`) to a lower cap.

    A smaller ``max_num_batched_tokens`` admits fewer prompts per step, so fewer requests run
    at once and the running gauge's peak falls with it, as under a lower ``max_num_seqs``. A cut
    of ``max_num_seqs`` leaves the largest steps where the budget pins them; a budget cut moves
    them: a lower running peak beside a lower step cap is the budget's (``batch_composition``).
    """
    shape = batch_shape(metrics, comparison)
    return shape is not None and shape.changed and (shape.cap.ratio or 1.0) < 1.0


def slot_cap_binds(metrics: MetricView, comparison: Comparison, requests: Mapping[str, int]) -> bool:
    """Whether a lower running count is a cap on running requests (``max_num_seqs``) holding requests back.

    The cap binds (:func:`~sre_agent.rules._load.cap_binds`), KV blocks are not the limit
    (:func:`~sre_agent.rules._load.kv_limited`, ``requests`` per side to count preemptions by)
    and the step budget did not fall (:func:`budget_fell`): each of those also lowers the running
    peak while requests wait. ``queueing`` and ``engine_metrics`` read a lower cap through this.
    """
    return cap_binds(metrics) and not kv_limited(metrics, requests) and not budget_fell(metrics, comparison)


# ------------------------------------------------------------ decode steps
#: Decode work's share of a TPOT rise (:attr:`StepMix.decode_share`) from which the decode step led it.
DECODE_LED: Final[float] = 0.5
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
    ``a`` and ``b``; more prefill arriving (longer or less cached prompts, more requests)
    raises ``prefill_per_step`` at the same ``g``. Fitted per side by least squares; the
    change of the mean TPOT splits exactly into the coefficients' changes at the
    candidate's mean work and the work's change at the baseline's coefficients.

    Attributes:
        decode_part: (a_c - a_b) + (b_c - b_b) * mean candidate running, seconds per token.
        prefill_part: (g_c - g_b) * mean candidate prefill per step, seconds per token.
        prefill_per_step: mean prompt tokens prefilled per decode step, per side.
        work_part: g_b * (rise of prefill per step that more prefill arriving per replica
            accounts for), seconds per token: the steps carry more prefill at the baseline's
            cost per token. The rest of a rise in prefill per step is longer steps gathering
            more of the same arrivals, the echo of whatever slowed the step.
    """

    decode_part: float
    prefill_part: float
    prefill_per_step: SidePair
    work_part: float = 0.0
    #: ``g`` per side (seconds per prompt token prefilled in a step) and the standard error of
    #: its change (heteroskedasticity-robust, HC1), for :meth:`prefill_cost_rise_bound`.
    prefill_cost: SidePair | None = None
    prefill_cost_se: float | None = None

    def prefill_cost_rise_bound(self) -> float | None:
        """Upper 95 % bound of the relative rise of ``g``, the cost of a prompt token in a step.

        A slower prefill path costs every prefilled token more in every step it shares; a
        bound below :data:`~sre_agent.rules._engine_cost.MIN_SLOWDOWN` rules that out.
        ``None`` when ``g`` or its error is unknown or the baseline's ``g`` is not positive.
        """
        return self._prefill_cost_rise(1.96)

    def _prefill_cost_rise(self, z: float) -> float | None:
        """Relative rise of ``g`` plus ``z`` standard errors (``None`` when unknown or ``g_b`` <= 0)."""
        if self.prefill_cost is None:
            return None
        g_b, g_c = self.prefill_cost.baseline, self.prefill_cost.candidate
        if g_b is None or g_c is None or self.prefill_cost_se is None or g_b <= 0:
            return None
        return (g_c - g_b + z * self.prefill_cost_se) / g_b

    def prefill_cost_rise_floor(self) -> float | None:
        """Lower 95 % bound of the relative rise of ``g`` (``None`` as :meth:`prefill_cost_rise_bound`).

        A step budget or chunking change moves how many prompt tokens a step carries, not what
        each costs; a floor at or above :data:`~sre_agent.rules._engine_cost.MIN_SLOWDOWN` says
        the prefill path itself got costlier.
        """
        return self._prefill_cost_rise(-1.96)

    def _share(self, part: float) -> float | None:
        total = max(self.decode_part, 0.0) + max(self.prefill_part, 0.0) + max(self.work_part, 0.0)
        return max(part, 0.0) / total if total > 0 else None

    @property
    def decode_share(self) -> float | None:
        """The decode part's share of a positive rise (0..1); ``None`` when the TPOT did not rise."""
        return self._share(self.decode_part)

    @property
    def prefill_share(self) -> float | None:
        """The costlier prefill's share of a positive rise (0..1); ``None`` when the TPOT did not rise."""
        return self._share(self.prefill_part)

    @property
    def work_share(self) -> float | None:
        """The share of a positive rise from more prefill per step at the old cost (0..1)."""
        return self._share(self.work_part)


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


def step_mix(
    comparison: Comparison, cost: EngineCost, metrics: MetricView | None = None, where: pl.Expr | None = None
) -> StepMix | None:
    """Split a decode :class:`EngineCost`'s TPOT change into decode work and shared prefill (see :class:`StepMix`).

    Prompt tokens prefilled come from every sampled request of the replica (uncached
    tokens, spread over its prefill: scheduling to first token; with ``metrics``, the hit
    rate from the counters where spans lack cached tokens), scaled by the side's sample
    fraction. ``where``: only the requests of a slice of whole replicas (one host), whose
    steps are their own. ``None`` when a side has fewer than :data:`STEP_FIT_MIN` decoding
    requests or no prefill timing.
    """
    frame = cost.frame
    if frame is None or "running" not in frame.columns:
        return None
    requests = comparison.requests.filter(pl.col("e2e_s").is_not_null() & pl.col("ttft_s").is_not_null())
    if where is not None:
        requests = requests.filter(where)
    requests = requests.select(
        "side",
        "span_id",
        replica_expr(),
        (pl.col("start_ns") + pl.col("queue_s").fill_null(0.0) * 1e9).cast(pl.Float64).alias("_sched"),
        (pl.col("start_ns") + pl.col("ttft_s") * 1e9).cast(pl.Float64).alias("_first"),
        (pl.col("start_ns") + pl.col("e2e_s") * 1e9).cast(pl.Float64).alias("_end"),
        uncached_tokens(comparison, metrics).cast(pl.Float64).alias("_uncached"),
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
    g_variance = 0.0
    for s in SIDES:
        part = side(data, s)
        if part.height < STEP_FIT_MIN:
            return None
        x = np.column_stack([np.ones(part.height), part["running"].to_numpy(), part["_p"].to_numpy()])
        if np.linalg.matrix_rank(x) < 3:
            return None
        y = part["tpot_s"].to_numpy()
        fits[s] = np.linalg.lstsq(x, y, rcond=None)[0]
        means[s] = x.mean(axis=0)
        g_variance += _robust_variance(x, y - x @ fits[s])[2]
    delta = fits["candidate"] - fits["baseline"]
    at = means["candidate"]
    # More prefill per step comes from more prompt tokens arriving per replica (longer or less
    # cached prompts, more requests) or from longer steps gathering more of the same arrivals
    # (a slower step's echo). Only the first is work: at most the rise of the prefill arrival
    # rate per replica, on the baseline's prefill per step.
    arriving = _prefill_rate(requests, comparison)
    more = max(0.0, arriving - 1.0) * means["baseline"][2] if arriving is not None else 0.0
    return StepMix(
        decode_part=float(delta[0] + delta[1] * at[1]),
        prefill_part=float(delta[2] * at[2]),
        prefill_per_step=SidePair(float(means["baseline"][2]), float(at[2])),
        work_part=float(fits["baseline"][2] * min(more, max(0.0, at[2] - means["baseline"][2]))),
        prefill_cost=SidePair(float(fits["baseline"][2]), float(fits["candidate"][2])),
        prefill_cost_se=math.sqrt(g_variance) if math.isfinite(g_variance) else None,
    )


def _robust_variance(x: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """Diagonal of the HC1 (heteroskedasticity-robust) covariance of least-squares coefficients."""
    n, k = x.shape
    if n <= k:
        return np.full(k, np.inf)
    bread = np.linalg.pinv(x.T @ x)
    meat = (x * residuals[:, None] ** 2).T @ x
    variance: np.ndarray = np.diag(bread @ meat @ bread) * (n / (n - k))
    return variance


def _prefill_rate(requests: pl.DataFrame, comparison: Comparison) -> float | None:
    """Candidate / baseline uncached prompt tokens arriving per second per replica (``None`` if unknown)."""
    agg = requests.group_by("side").agg(pl.col("_uncached").mean().alias("u"), pl.col("replica").n_unique().alias("r"))
    rows = {r["side"]: r for r in agg.to_dicts()}
    rate = comparison.arrival_rate
    per: list[float] = []
    for s, arrivals in zip(SIDES, (rate.baseline, rate.candidate), strict=True):
        row = rows.get(s)
        if row is None or not row["r"] or not row["u"] or not arrivals:
            return None
        per.append(float(row["u"]) * arrivals / float(row["r"]))
    return per[1] / per[0]


_MIX_CACHE: weakref.WeakKeyDictionary[Comparison, tuple[StepMix | None]] = weakref.WeakKeyDictionary()


def median_step(metrics: MetricView) -> tuple[SidePair, HistogramDelta, HistogramDelta] | None:
    """Each side's median inter-token interval, with the two histograms; ``None`` without them.

    The median is a plain decode step: prefill steps and steps carrying large chunks are the tail.
    """
    itl = metrics.histogram("itl_seconds")
    before, after = itl["baseline"], itl["candidate"]
    if before is None or after is None:
        return None
    return SidePair(before.quantile(0.5), after.quantile(0.5)), before, after


def decode_step_mix(comparison: Comparison, metrics: MetricView) -> StepMix | None:
    """:func:`step_mix` of the comparison's decode cost, once per comparison; ``None`` when it cannot be fitted."""
    if comparison not in _MIX_CACHE:
        try:
            mix = step_mix(comparison, engine_cost(comparison, metrics, "decode"), metrics)
        except RuleSkipped:
            mix = None
        _MIX_CACHE[comparison] = (mix,)
    return _MIX_CACHE[comparison][0]


def prefill_cost_floor(comparison: Comparison, metrics: MetricView) -> float | None:
    """:meth:`StepMix.prefill_cost_rise_floor` of :func:`decode_step_mix` (``None`` when it cannot be fitted)."""
    mix = decode_step_mix(comparison, metrics)
    return mix.prefill_cost_rise_floor() if mix is not None else None


#: Step fits of one slice of whole replicas, per comparison: a slice's rule, the slowdown rules and
#: the second run of the rules (a rise within noise) ask for the same ones.
_SLICE_MIX_CACHE: weakref.WeakKeyDictionary[Comparison, dict[tuple[str, str], tuple[StepMix | None]]] = (
    weakref.WeakKeyDictionary()
)


def slice_step_mix(comparison: Comparison, metrics: MetricView | None, column: str, value: str) -> StepMix | None:
    """:func:`step_mix` of the decode cost on the requests whose ``column`` is ``value``, once per comparison.

    ``column`` ``"replica"`` is the replica as :func:`~sre_agent.analysis.busy.replica_expr` names
    it; any other is a request attribute (a missing value reads ``"(missing)"``, as the slice
    search names it). ``None`` when the fit cannot be made.
    """
    known = _SLICE_MIX_CACHE.setdefault(comparison, {})
    if (column, value) not in known:
        where = (
            replica_expr() == value
            if column == "replica"
            else pl.col(column).cast(pl.String).fill_null("(missing)") == value
        )
        try:
            mix = step_mix(comparison, engine_cost(comparison, metrics, "decode"), metrics, where) if metrics else None
        except RuleSkipped:
            mix = None
        known[(column, value)] = (mix,)
    return known[(column, value)][0]


#: Scrape intervals with inter-token observations each side needs for :func:`metric_step`.
METRIC_STEP_INTERVALS: Final[int] = 8
#: Candidate intervals within the baseline's range of running batches that :func:`metric_step` compares.
METRIC_STEP_SUPPORTED: Final[int] = 6


@dataclass(frozen=True)
class MetricStep:
    """The candidate's inter-token interval against the baseline's step at the candidate's batch and prefill.

    The metric stream's version of :class:`StepMix`'s model: per replica and scrape interval,
    the mean inter-token latency (the histogram's sum over its count) against the running batch
    (the gauge's mean at the interval's two scrapes) and the prompt tokens prefilled per second
    (the counter), ``itl = a + b * running + g * prompt_tokens_per_s``, fitted on the baseline's
    intervals (non-negative, weighted by their tokens) and asked for the candidate's that ran a
    batch within the baseline's range (at least :data:`METRIC_STEP_SUPPORTED` of them).
    ``ratio`` is the candidate's observed mean ITL over that prediction (1 = the same step for
    the same batch and prefill), ``z`` its rise against both sides' interval residuals (intervals
    taken as independent: a lower bound on the noise in bursty traffic).
    """

    ratio: float
    z: float
    intervals: tuple[int, int]

    def evidence(self) -> Evidence:
        """The reading, as evidence."""
        return Evidence(
            "itl_at_equal_batch_and_prefill",
            1.0,
            rnd(self.ratio, 3),
            f"candidate mean ITL over the baseline's step (a + b x running + g x prompt tokens/s, fitted on "
            f"{self.intervals[0]} scrape intervals) at its {self.intervals[1]}; z = {self.z:.1f}",
        )


def _nonnegative_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares of ``y`` on the columns of ``x`` with every coefficient >= 0.

    Three coefficients: every subset of them is solved unconstrained and the best feasible one
    kept (exact for so few; a step has no negative cost, and busy intervals are collinear in
    batch and prefill, where a free fit trades one coefficient's sign for the other's).
    """
    root = np.sqrt(w)
    a, b = x * root[:, None], y * root
    best: tuple[float, np.ndarray] | None = None
    columns = x.shape[1]
    for mask in range(1, 2**columns):
        keep = [k for k in range(columns) if mask >> k & 1]
        solution, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        if (solution < 0).any():
            continue
        coef = np.zeros(columns)
        coef[keep] = solution
        residual = float(((a @ coef - b) ** 2).sum())
        if best is None or residual < best[0]:
            best = (residual, coef)
    return best[1] if best is not None else np.zeros(columns)


def metric_step(metrics: MetricView) -> MetricStep | None:
    """:class:`MetricStep` from the metric stream; ``None`` with fewer than
    :data:`METRIC_STEP_INTERVALS` intervals a side (:meth:`MetricView.itl_by_running`)."""
    rows = metrics.itl_by_running()
    if rows is None:
        return None
    b, c = rows
    if min(len(b), len(c)) < METRIC_STEP_INTERVALS:
        return None

    def design(r: np.ndarray) -> np.ndarray:
        return np.column_stack([np.ones(len(r)), r[:, 0], r[:, 1]])

    coef = _nonnegative_fit(design(b), b[:, 2] / b[:, 3], b[:, 3])
    # Only at batches the baseline ran: a step's cost is not linear far past them (a load x2 ran 45
    # requests a replica against the baseline's 9 at most, and the line drawn through 0-9 read a
    # step x2.16 slower there; dev 1280032).
    c = c[(c[:, 0] >= b[:, 0].min()) & (c[:, 0] <= b[:, 0].max())]
    if len(c) < METRIC_STEP_SUPPORTED:
        return None
    predicted_b, predicted_c = design(b) @ coef, design(c) @ coef
    expected = float((c[:, 3] * predicted_c).sum())
    if expected <= 0:
        return None
    ratio = float(c[:, 2].sum()) / expected

    def mean_residual(r: np.ndarray, predicted: np.ndarray) -> tuple[float, float]:
        # The token-weighted mean residual per token and its standard error over the intervals.
        w = r[:, 3] / r[:, 3].sum()
        residual = r[:, 2] / r[:, 3] - predicted
        mean = float((w * residual).sum())
        return mean, float(np.sqrt((w**2 * (residual - mean) ** 2).sum()))

    rise, se_c = mean_residual(c, predicted_c)
    _, se_b = mean_residual(b, predicted_b)
    se = math.hypot(se_b, se_c)
    z = rise / se if se > 0 else 0.0
    return MetricStep(ratio, z, (len(b), len(c)))


__all__ = [
    "BATCH_SHAPE_FACTOR",
    "BatchShape",
    "CAP_CUT",
    "DECODE_LED",
    "METRIC_STEP_INTERVALS",
    "MetricStep",
    "SAME_WORK",
    "StepMix",
    "batch_shape",
    "budget_fell",
    "slot_cap_binds",
    "decode_step_mix",
    "median_step",
    "metric_step",
    "prefill_cost_floor",
    "slice_step_mix",
    "step_mix",
]
