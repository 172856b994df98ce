"""The engine's batch mix changed: tokens per step, prefill chunking, running batch.

Mechanism: continuous batching packs prefill chunks and decode tokens into
steps of at most ``max_num_batched_tokens``. With the same arrivals and the
same work per request, changing that budget or chunked prefill changes the
steps themselves: a small budget spreads each prompt over many steps (TTFT
rises, vllm#14845); no chunking runs whole long prompts in one step and
stalls every decode sharing it (ITL/TPOT tails rise, vllm RFC#3130).

Signals:

* ``vllm:iteration_tokens`` histogram: mean, p99 and cap (the bucket where the
  largest steps begin, as many on both sides: 0.1 % of the side with fewer) of
  tokens per step per window. The budget shows in the
  largest steps: the shape counts as changed when the cap moved by a bucket
  (x2) and the p99 by x1.5, each either way (a cut below long prompts splits
  their one big step into many budget-sized chunks: the cap falls, the p99
  rises), or the cap alone fell two buckets (x4) at the same prefill work per
  request, which only a lower budget does (the mean grows with the running batch
  under any load and is not judged). Mean and p99 are divided by the change
  in uncached prompt tokens per request (prompt-token counter per request x
  (1 - prefix-cache hit rate)), because a cache-hit drop or longer prompts
  make prefill steps bigger without any change in batching;
* running batch: ``vllm:num_requests_running`` gauge, else the mean number
  of requests running on the same replica (span overlap);
* prefill share of processed tokens (prompt vs generation token counters),
  offered load per replica (requests/s from spans, else prompt + generation
  tokens/s from the counters) and tokens per request, which must stay put: if
  the load per replica changed by 15 % or more (or is unknown), bigger batches
  are ``load``'s or ``capacity``'s doing; if work per request changed by 20 %
  or more, ``traffic_mix``'s.

``explained`` (0..1): the engine stages' (queue + prefill + decode) share of
the headline's tail excess x ``min(1, |ln(work-adjusted p99 ratio)| / ln 4)``
(a 4x change in the step cap counts as the whole engine excess).

``explained`` is 0 when the headline is the error rate (no latency mechanism
accounts for failed requests).

``confidence``: 0.9 x ``min(1, |ln ratio| / ln 2)`` with the histogram, x
``|ln ratio| / ln(1 + rise)`` when decode or prefill cost at equal batch size
rose by more than the step shape moved (slower steps gather more arrivals
per step, so the shape then follows a slowdown), and x 0.2 when steps grew while
the median inter-token step (a plain decode step) rose >= 1.5x and the mean
tokens per step no more than 1.5x as much: they carry more because they last
longer (a budget raise or chunking turned off leaves the plain decode step).
Without it (spans only), or when it shows no change in the step p99 (a budget that
binds only the rare prompts longer than it), a smaller budget still shows in prefill cost per uncached
token at equal batch: it rose for the longest quarter of prompts (z >= 3, and by
z >= 3 more than for the shorter half, which rose < 1/3 as much;
``_engine_cost.LengthProfile``), since a prompt that fits the new budget is
computed as before. Confidence 0.7 x ``min(1, long-prompt rise / 0.3)``;
``explained`` the prefill stage's share of the tail excess x the share of the
raw change kept at equal batch. When the step fit shows a prompt token costing more in a step
(the lower 95 % bound of ``g``'s rise >= 10 %), that long-prompt signature is a
slower prefill path's and keeps x 0.2. Else, where neither shows, a smaller budget
still shows in the decodes it no longer stalls: the TPOT p99 fell >= 1.5x beyond
its CI while the TPOT median did not fall, at the same uncached work per request,
with the queue and prefill holding the excess (confidence 0.6 at a 3x fall); and,
the mirror (chunked prefill turned off), a per-token headline's tail up >= 1.5x at a
plain decode step (the median) not slower, no per-token cost up at equal batch and no
prompt token costlier in a step by the step fit (a slower prefill path stalls decodes too).
Otherwise, a running batch that moved by 30 % or more at the
same arrival rate and mix while queueing did not carry the excess gives at
most 0.3, since span overlap alone cannot tell batching from a slowdown.
A load per replica whose point estimate moved >= 15 % within the spread of
per-slice arrivals halves any of these.

Quiet when the step shape did not change as above, or when the load per
replica or the work per request changed (then other rules own the change).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Final, Literal

import polars as pl

from sre_agent.analysis import stats
from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import StageDecomposition
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import SIDES, Evidence, Finding, Regression, RuleSkipped, SidePair, run_late
from sre_agent.rules._engine_cost import (
    BATCH_GREW,
    MIN_SLOWDOWN,
    EngineCost,
    engine_cost,
    prefill_length_profile,
    running_batch,
)
from sre_agent.rules._load import admission_limited, load_moved, load_per_replica
from sre_agent.rules._mechanism import (
    ECHO_MARGIN,
    PER_TOKEN_METRICS,
    Z_MIN,
    clip01,
    engine_share,
    hit_rate_fell,
    latency_share,
    rnd,
    side,
    stage_share,
    tail_shares,
    uncached_per_request,
)
from sre_agent.rules._steps import (
    BATCH_SHAPE_FACTOR,
    DECODE_LED,
    BatchShape,
    batch_shape,
    decode_step_mix,
    median_step,
    prefill_cost_floor,
)

#: Arrival-rate change beyond which batch changes are load's doing.
MAX_RATE_CHANGE: Final[float] = 0.15
#: Work-per-request change beyond which batch changes are traffic mix's doing.
MAX_WORK_CHANGE: Final[float] = 0.20
#: Confidence kept when the load's point estimate moved within the spread of per-slice arrivals.
BURSTY_LOAD_DAMPING: Final[float] = 0.5
#: Running-batch change that counts on spans alone.
SPAN_BATCH_CHANGE: Final[float] = 1.3
#: Confidence ceiling on spans alone.
SPANS_ONLY_CONFIDENCE: Final[float] = 0.3
#: Confidence of a budget read from prefill cost by prompt length (no step histogram).
BUDGET_CONFIDENCE: Final[float] = 0.7
#: Rise of the long prompts' prefill cost counted as unmistakable.
FULL_BUDGET_RISE: Final[float] = 0.3
#: Confidence kept by the budget signature when the step fit shows a prompt token costing more
#: in a step (a slower prefill path): below the stage fallback's 0.25, as prefill_slowdown's twin.
STEP_COST_ROSE_DAMPING: Final[float] = 0.2

#: Fall of the TPOT tail (decode stalls beside prefill chunks) that a smaller step budget shows.
STALLS_FELL: Final[float] = 1.5
#: The TPOT quantile that holds the decodes stalled beside large prefill chunks.
STALL_QUANTILE: Final[float] = 0.99
#: Confidence of a smaller budget read from the stalls alone (no step histogram, no prefill cost).
STALLS_CONFIDENCE: Final[float] = 0.6

#: Median inter-token step rise from which bigger steps count as slower steps' echo.
SLOWER_STEP: Final[float] = 1.5
#: Confidence kept by a step shape that slower steps explain.
ECHO_DAMPING: Final[float] = 0.2

_ENGINE_COSTS: Final[tuple[Literal["decode", "prefill"], ...]] = ("decode", "prefill")

NEXT_CHECK: Final[str] = (
    "diff the resolved max_num_batched_tokens, enable_chunked_prefill and max_num_seqs in the engine start-up "
    "logs (defaults depend on GPU and version); replay the candidate with the baseline's values"
)


def _step_cost_rise(comparison: Comparison, metrics: MetricView) -> tuple[str, float] | None:
    """The larger significant rise of decode or prefill cost at equal batch size, if any."""
    rises: list[tuple[str, float]] = []
    for stage in _ENGINE_COSTS:
        try:
            cost = engine_cost(comparison, metrics, stage)
        except RuleSkipped:
            continue
        if cost.shift is not None and cost.shift.z >= Z_MIN and cost.shift.rise > 0:
            rises.append((cost.column, cost.shift.rise))
    return max(rises, key=lambda r: r[1]) if rises else None


def _slower_steps(shape: BatchShape, metrics: MetricView) -> Evidence | None:
    """Evidence that the steps grew because they take longer, or ``None``.

    At the same load, tokens per step are the tokens arriving per second times the step's
    time: when the median inter-token interval (a plain decode step) rose >= 1.5x and the
    mean tokens per step rose no more than 1.5x as much, the steps carry more because they
    last longer, not because the budget let them.
    """
    median = median_step(metrics)
    if median is None:
        return None
    step = median[0]
    tokens = shape.mean.ratio
    if step.ratio is None or tokens is None or step.ratio < SLOWER_STEP or tokens > SLOWER_STEP * step.ratio:
        return None
    return Evidence("itl_p50_s", rnd(step.baseline, 6), rnd(step.candidate, 6),
                    f"the median decode step rose x{step.ratio:.2f} with the mean tokens per step (x{tokens:.2f}): "
                    "slower steps gather more arrivals")  # fmt: skip


def _changed(ratio: float | None, limit: float) -> bool:
    return ratio is not None and abs(ratio - 1.0) >= limit


def _other_prefill_work(comparison: Comparison, metrics: MetricView) -> bool:
    """Whether each request brings other prefill work (or it is unknown): then the prompts' wait is that work's.

    More of each prompt to prefill (a cache that stopped hitting, longer prompts) makes every
    step carry more prefill and each prompt wait longer for it: that work's rule owns it (dev
    1090098: hit rate 24 % -> 0, uncached tokens per request x1.25; 1230021: caching off,
    16 % -> 0, x1.18, under the work bar but the cache's by its own bar).
    """
    uncached = uncached_per_request(comparison, metrics).ratio
    return uncached is None or _changed(uncached, MAX_WORK_CHANGE) or hit_rate_fell(metrics, comparison.request_counts)


@run_late  # waits on the busy intervals read in the background
def batch_composition(
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    stages: StageDecomposition,
) -> Finding | None:
    """A ``batch_composition`` finding when steps changed shape at the same load (see module docstring).

    "The same load" is a load that did not move beyond the spread of per-slice arrivals
    (``_load.load_moved``: a bursty trace puts a burst on one side of a deploy by chance). When
    its point estimate still moved by :data:`MAX_RATE_CHANGE` or more, the load may be what
    changed the steps: confidence x :data:`BURSTY_LOAD_DAMPING` (dev 1210097: arrivals x1.85
    at z 1.8 on Azure's code trace, the running batch 17 -> 40, read as prompts spread over
    more steps "at the same load").
    """
    finding = _at_same_load(comparison, regression, metrics, stages)
    load = load_per_replica(comparison, metrics)[0]
    if finding is None or not _changed(load.ratio, MAX_RATE_CHANGE):
        return finding
    moved = f"the load per replica moved x{load.ratio:.2f}, within the spread of per-slice arrivals"
    caveat = Evidence("arrival_change_z", None, rnd(comparison.arrival_change_z, 2), moved)
    return replace(finding, confidence=finding.confidence * BURSTY_LOAD_DAMPING, evidence=(caveat, *finding.evidence))


def _at_same_load(
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    stages: StageDecomposition,
) -> Finding | None:
    """The finding of :func:`batch_composition` before its bursty-load caveat."""
    frame = comparison.requests
    work = {
        s: side(frame, s)
        .select((pl.col("input_tokens").fill_null(0) + pl.col("output_tokens").fill_null(0)).mean())
        .item()
        for s in SIDES
    }
    work_pair = SidePair(*(float(v) if v is not None else None for v in work.values()))
    load, load_unit = load_per_replica(comparison, metrics)
    # Without a load measure on both sides nothing says the load stayed put: stay quiet.
    if load_moved(comparison, metrics, MAX_RATE_CHANGE) is not False or _changed(work_pair.ratio, MAX_WORK_CHANGE):
        return None
    running = metrics.running_per_replica()
    running_how = "num_requests_running gauge, window mean per serving replica"
    if running.baseline is None or running.candidate is None:
        overlap = frame.select("span_id", "side").join(running_batch(comparison, "decode"), on="span_id")
        means = [side(overlap, s)["running"].mean() for s in SIDES]
        running = SidePair(*(float(m) if isinstance(m, int | float) else None for m in means))
        running_how = "requests running on the same replica (span overlap)"
    evidence = [
        Evidence(
            "offered_load_per_replica",
            rnd(load.baseline),
            rnd(load.candidate),
            f"{load_unit}: unchanged load",
        ),
        Evidence("tokens_per_request", rnd(work_pair.baseline, 1), rnd(work_pair.candidate, 1), "input + output"),
        Evidence("running_batch", rnd(running.baseline, 2), rnd(running.candidate, 2), running_how),
    ]
    prompt, generated = metrics.counter_delta("prompt_tokens"), metrics.counter_delta("generation_tokens")
    if prompt.baseline and prompt.candidate and generated.baseline and generated.candidate:
        evidence.append(
            Evidence("prompt_token_share", rnd(prompt.baseline / (prompt.baseline + generated.baseline)),
                     rnd(prompt.candidate / (prompt.candidate + generated.candidate)),
                     "prompt tokens / all tokens processed (counter deltas)")
        )  # fmt: skip
    at_stake = engine_share(stages, regression, comparison)
    shape = batch_shape(metrics, comparison)
    if shape is not None:
        cap = shape.p99_ratio
        if not shape.changed or cap is None or cap <= 0:
            # The step p99 stayed put. A budget that binds only the rare prompts longer than it
            # leaves the bulk of the steps alone, but still shows in those prompts' prefill cost.
            return _prefill_signature(comparison, regression, metrics, stages, [*shape.evidence(), *evidence], shape)
        strength = abs(math.log(cap))
        largest_only = strength < math.log(BATCH_SHAPE_FACTOR) and bool(shape.cap.ratio)
        if largest_only and shape.cap.ratio:
            # Only the largest steps moved (a cut below both budgets' p99 step): their fall is the size.
            strength, cap = abs(math.log(shape.cap.ratio)), shape.cap.ratio
        evidence = [*shape.evidence(), *evidence]
        confidence = 0.9 * clip01(strength / math.log(2.0))
        slower = _step_cost_rise(comparison, metrics)
        if slower is not None and math.log1p(slower[1]) > strength:
            # Slower steps gather more arrivals per step, so the step shape follows an engine
            # slowdown; a shape change smaller than the slowdown is more likely its echo.
            confidence *= strength / math.log1p(slower[1])
            evidence.append(Evidence(f"{slower[0]}_change_at_equal_batch", 0.0, rnd(slower[1]),
                                     "per-token cost rose more than the step shape changed"))  # fmt: skip
        echo = _slower_steps(shape, metrics) if cap > 1 else None
        if echo is not None:
            # Steps that take longer gather more of the same arrivals: tokens per step grow with the
            # step time (dev 263: decode x3.75, mean tokens per step x3.1, median step x3.9, and the
            # p99 crossed into the prefill-carrying steps, x58). A budget raise or chunking turned
            # off leaves the plain decode step, the median, as it was.
            confidence *= ECHO_DAMPING
            evidence.append(echo)
        direction = "rose" if cap > 1 else "fell"
        stage = "decode" if cap > 1 else "prefill"  # bigger steps stall decodes; smaller ones stretch prefills
        what = (
            f"largest steps {shape.cap.baseline:.0f} -> {shape.cap.candidate:.0f}"
            if largest_only
            else f"p99 {shape.p99.baseline:.0f} -> {shape.p99.candidate:.0f}"
        )
        return Finding(
            cause="batch_composition",
            title=f"Tokens per engine step {direction} at the same load ({what}): the step budget or chunked "
            "prefill changed",
            explained=latency_share(regression, at_stake * clip01(strength / math.log(4.0))),
            confidence=confidence,
            stage=stage,
            evidence=tuple(evidence),
            next_check=NEXT_CHECK,
        )
    budget = _prefill_signature(comparison, regression, metrics, stages, evidence, None)
    if budget is not None:
        return budget
    ratio = running.ratio
    queue_share = tail_shares(stages, regression, comparison).get("queue", 0.0)
    if ratio is None or not (ratio >= SPAN_BATCH_CHANGE or ratio <= 1 / SPAN_BATCH_CHANGE) or queue_share >= 0.5:
        return None
    strength = abs(math.log(ratio))
    return Finding(
        cause="batch_composition",
        title=f"Running batch changed {running.baseline:.1f} -> {running.candidate:.1f} requests at the same "
        "load and mix (no tokens-per-step metric to confirm)",
        explained=latency_share(regression, at_stake * clip01(strength / math.log(4.0))),
        confidence=SPANS_ONLY_CONFIDENCE * clip01(strength / math.log(2.0)),
        stage=None,
        evidence=tuple(evidence),
        next_check=NEXT_CHECK + "; export vllm:iteration_tokens to confirm",
    )


def _prefill_signature(  # noqa: PLR0917 - the rule's own state, passed on once
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    stages: StageDecomposition,
    evidence: list[Evidence],
    shape: BatchShape | None,
) -> Finding | None:
    """With no step shape change to read: what the prefill cost at equal batch and the TPOT tail say.

    A smaller budget (:func:`_budget_signature`), else prompts waiting for steps with room
    (:func:`_prefill_spread`), both from per-request prefill timing; else the decode stalls a
    smaller budget ended (:func:`_stalls_gone`) or chunking off began (:func:`_stalls_grew`;
    ``shape`` is the step histogram's summary, ``None`` without it).
    """
    try:
        cost = engine_cost(comparison, metrics, "prefill")
    except RuleSkipped:
        cost = None
    found = None
    if cost is not None:
        found = _budget_signature(
            cost, comparison=comparison, regression=regression, metrics=metrics, stages=stages, evidence=evidence
        ) or _prefill_spread(
            cost, metrics, comparison=comparison, regression=regression, stages=stages, evidence=evidence
        )
    return (
        found
        or _stalls_gone(comparison, regression, metrics, stages, evidence, shape)
        or _stalls_grew(comparison, regression, metrics, evidence, shape)
        or _admitted_slower(comparison, regression, metrics, stages, evidence)
    )


def _stalls_grew(
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    evidence: list[Evidence],
    shape: BatchShape | None,
) -> Finding | None:
    """The per-token tail rose at a steady median with every per-token cost flat: decodes stall behind bigger steps.

    The mirror of :func:`_stalls_gone`: with chunked prefill turned off (or a larger budget) a
    long prompt is prefilled in one step and every decode beside it waits for it, so the ITL/TPOT
    tail grows while a plain decode step (the median) does not (vLLM RFC#3130). Read only at the
    same load and uncached work per request, with neither decode nor prefill surely costlier
    per token at equal batch (:func:`_step_cost_rise`, z >= 2: a slower prefill step stalls
    decodes too, and a slowdown of some replicas also lifts the tail over a steady median), nor
    a prompt token surely costlier in the steps it shares (the step fit's ``g``, lower 95 % bound
    of its rise >= 10 %: it still shows when the batch grew too much for equal-batch buckets).
    Where the step histogram shows no change (the budget above every prompt: the steps are as
    big, only no decode rides along; dev 1200213, chunking off on Azure's code trace: ITL p99
    x2.4, median x1.02, g +0 %).
    """
    if regression.metric not in PER_TOKEN_METRICS or not regression.significant or regression.ratio is None:
        return None
    if regression.ratio < STALLS_FELL:
        return None
    before, after = comparison.histogram("baseline", "tpot"), comparison.histogram("candidate", "tpot")
    if before.n and after.n:
        # The requests' own TPOT tail must have grown too: stalls lengthen the answers that sat
        # beside them. An inter-token histogram tail that rose while the span TPOT p99 fell
        # x0.59 is no stall (dev 1150149: a slower retrieval, and ITL p99 x1.97 by chance).
        own = stats.compare_quantile(before, after, regression.quantile).ratio
        if own is not None and own < 1 + MIN_SLOWDOWN:
            return None
    median = median_step(metrics)
    step = median[0] if median is not None else None
    if step is None or step.ratio is None:
        step = SidePair(before.quantile(0.5), after.quantile(0.5))
    if step.ratio is None or step.ratio > 1 + MIN_SLOWDOWN:
        return None  # the plain decode step slowed: a decode regression or a bigger batch, not stalls
    if _step_cost_rise(comparison, metrics) is not None:
        # Any per-token cost surely up at equal batch: stalls lengthen a few decodes' intervals and
        # barely move the mean; a slowdown of some of the replicas moves it (dev 1200272: decode
        # x1.91 on one replica of six, +8.9 % over all at z 10.8, TPOT p99 x1.62 at a steady median).
        return None
    floor = prefill_cost_floor(comparison, metrics)
    if floor is not None and floor >= MIN_SLOWDOWN:
        # A prompt token costs surely more in the steps it shares: decodes stall behind costlier
        # prompts, not more of them (1270080: prefill x3.2, g x2.4, ITL p99 x56 at a steady median,
        # where the batch grew x7 and no equal-batch bucket was left to show it). Whole-prompt
        # scheduling moves how many prompt tokens a step carries, not what each costs (g -2..+1 %).
        return None
    # The same prefill work per request: more of each prompt to prefill (a lost prefix cache,
    # longer prompts) makes the steps that carry it longer too (dev 1150206: caching off, uncached
    # prompt tokens per request x1.55 by the counters, ITL p99 x2.5).
    uncached = uncached_per_request(comparison, metrics).ratio
    work = uncached if uncached is not None else (shape.work_ratio if shape is not None else None)
    if work is None or _changed(work, MAX_WORK_CHANGE):
        return None
    label = f"{regression.metric.upper()} p{round(regression.quantile * 100)}"
    grew_evidence = (
        Evidence(f"{regression.metric}_p{round(regression.quantile * 100)}_s", rnd(regression.baseline, 6),
                 rnd(regression.candidate, 6), "decodes stalled beside whole prompts"),
        Evidence("decode_step_p50_s", rnd(step.baseline, 6), rnd(step.candidate, 6),
                 "the plain decode step (inter-token median, else TPOT median)"),
    )  # fmt: skip
    return Finding(
        cause="batch_composition",
        title=f"Decode stalls behind prompts grew ({label} x{regression.ratio:.2f}, median step x{step.ratio:.2f}) "
        "at the same load, work and per-token costs: steps carry whole prompts (chunked prefill off) or a "
        "larger budget",
        explained=latency_share(regression, 1.0),
        confidence=STALLS_CONFIDENCE * clip01(math.log(regression.ratio) / math.log(2 * STALLS_FELL)),
        stage="decode",
        evidence=(*grew_evidence, *evidence),
        next_check=NEXT_CHECK,
    )


def _admitted_slower(
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    stages: StageDecomposition,
    evidence: list[Evidence],
) -> Finding | None:
    """Fewer requests ran at the same load while requests waited below the replicas' peak: prompts admitted slower.

    Little's law: at the same arrivals, the requests running at once are the arrivals times the
    time each runs. A slower decode or prefill makes that time longer, so more run; fewer running
    while more wait is the engine taking prompts in slower. Saturated, a slower step admits fewer
    per second but each runs as much longer, so the running count stays; a smaller budget admits
    fewer per step and it falls. With no cap binding and KV not full (``_load.admission_limited``),
    no prompt token surely costlier in a step (where the step fit measures it: the upper bound
    of ``g``'s rise below :data:`MIN_SLOWDOWN`) and the same uncached work per request, what is
    left is how many prompt tokens a step takes: a smaller budget or chunking changed. Read where
    the running batch shrank too far for equal-batch buckets to compare prefill cost (SGLang
    chunked_prefill_size 8192 -> 256 on Azure's code trace: running x0.36 per replica, every
    queued scrape at 38 % of the peak, the queue all of the TTFT tail; dev 1340217, which read
    as the stage fallback's capacity and, by its median step, decode_slowdown).
    """
    running = metrics.running_per_replica()
    if running.ratio is None or running.ratio <= 0 or running.ratio > 1 / BATCH_GREW:
        return None
    waited, wait_evidence = _admission_wait(comparison, regression, metrics, stages)
    mix = decode_step_mix(comparison, metrics)
    bound = mix.prefill_cost_rise_bound() if mix is not None else None
    if waited <= 0 or (bound is not None and bound >= MIN_SLOWDOWN):
        return None
    if _other_prefill_work(comparison, metrics):
        return None
    strength = math.log(1 / running.ratio)
    bound_evidence = () if bound is None else (
        Evidence("prefill_cost_per_token_in_step_rise_bound", 0.0, rnd(bound),
                 "upper 95 % bound of the rise of a prompt token's cost in a step (step fit): no slower prefill path"),
    )  # fmt: skip
    return Finding(
        cause="batch_composition",
        title=f"Fewer requests ran at the same load ({running.baseline:.1f} -> {running.candidate:.1f} per "
        "replica) while requests waited below the replicas' peak: prompts are admitted slower (a smaller step "
        "budget or chunked prefill changed)",
        explained=latency_share(regression, waited),
        confidence=BUDGET_CONFIDENCE * clip01(strength / math.log(2.0)),
        stage="prefill",
        evidence=(*bound_evidence, *wait_evidence, *evidence),
        next_check=NEXT_CHECK + " (SGLang: chunked_prefill_size)",
    )


def _stalls_gone(  # noqa: PLR0917 - the rule's own state, passed on once
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    stages: StageDecomposition,
    evidence: list[Evidence],
    shape: BatchShape | None,
) -> Finding | None:
    """The TPOT tail fell at the same load and work while requests waited longer: a smaller step budget.

    A request's TPOT tail is the decodes that shared steps with large prefill chunks (a long
    prompt prefilled in one step stalls every decode beside it). A smaller budget caps the
    prompt tokens a step carries, so those stalls shrink, and spreads each prompt and each
    admission over more steps, so first tokens wait: vLLM's tuning guide trades exactly these
    ("smaller values achieve better inter-token latency ... higher values achieve better
    TTFT", docs.vllm.ai configuration/optimization, chunked prefill). Read where no step
    histogram shows the budget (SGLang, spans only; dev 1210256, SGLang 16384 -> 256: TPOT p99
    143 -> 20 ms, TTFT p99 x3.0, the prefill per token not up since short chunks cost less).
    The plain decode step (the TPOT median) must not have got cheaper: a smaller running batch
    (fewer slots, a smaller KV pool) lowers every TPOT, not only the stalled ones; and the
    uncached prompt tokens per request must be the same (fewer long prompts stall fewer decodes).
    Where the step histogram exists (``shape``), its largest steps must not have stayed at the old
    bound while the p99 step grew: a smaller budget cannot make steps bigger (dev 1340102,
    ``max_num_seqs`` 256 -> 9: fewer decodes beside each chunk shrank the stalls, the cap stayed
    8192 and the p99 step rose x2.96; read as a smaller budget over the queue's capacity).
    """
    per_token = regression.metric in PER_TOKEN_METRICS
    if (per_token and regression.quantile >= STALL_QUANTILE) or not regression.significant:
        return None
    if shape is not None and (shape.cap.ratio or 0.0) >= 1.0 and (shape.p99_ratio or 0.0) >= BATCH_SHAPE_FACTOR:
        return None
    before, after = comparison.histogram("baseline", "tpot"), comparison.histogram("candidate", "tpot")
    if before.n == 0 or after.n == 0:
        return None
    tail = stats.compare_quantile(before, after, STALL_QUANTILE)
    median = stats.compare_quantile(before, after, 0.5)
    if tail.ratio is None or tail.ratio_ci is None or median.ratio is None:
        return None
    if tail.ratio_ci[1] >= 1.0 or tail.ratio > 1 / STALLS_FELL or median.ratio < 1 / (1 + MIN_SLOWDOWN):
        return None
    uncached = uncached_per_request(comparison, metrics)
    if uncached.ratio is None or _changed(uncached.ratio, MAX_WORK_CHANGE):
        return None
    # A per-token headline below the stall quantile is the other half of the same trade: each prompt
    # spread over more steps puts a chunk in more of them, so the body of the inter-token intervals
    # rises while no step carries a whole prompt (dev 1340252, SGLang 8192 -> 512: ITL p90 x3.24,
    # TPOT p99 x0.16; "no rule explains the regression").
    waited = (
        1.0
        if per_token
        else stage_share(stages, "queue", regression, comparison)
        + stage_share(stages, "prefill", regression, comparison)
    )
    if waited <= 0:
        return None
    stall_evidence = (
        Evidence("tpot_p99_s", rnd(tail.baseline, 6), rnd(tail.candidate, 6),
                 "decodes stalled beside prefill chunks: ratio 95 % CI "
                 f"{tail.ratio_ci[0]:.2f}..{tail.ratio_ci[1]:.2f}"),
        Evidence("tpot_p50_s", rnd(median.baseline, 6), rnd(median.candidate, 6), "the plain decode step"),
        Evidence("uncached_tokens_per_request", rnd(uncached.baseline, 1), rnd(uncached.candidate, 1),
                 "the same prefill work per request"),
    )  # fmt: skip
    return Finding(
        cause="batch_composition",
        title=f"Decode stalls beside prefill chunks shrank (TPOT p99 x{tail.ratio:.2f}, p50 x{median.ratio:.2f}) "
        + ("while more steps carry a prompt chunk" if per_token else "while requests waited longer to be prefilled")
        + ", at the same load and work: a smaller step budget",
        explained=latency_share(regression, waited),
        confidence=STALLS_CONFIDENCE * clip01(math.log(1 / tail.ratio) / math.log(2 * STALLS_FELL)),
        stage="decode" if per_token else "prefill",
        evidence=(*stall_evidence, *evidence),
        next_check=NEXT_CHECK + " (SGLang: chunked_prefill_size)",
    )


def _budget_signature(
    cost: EngineCost,
    *,
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    stages: StageDecomposition,
    evidence: list[Evidence],
) -> Finding | None:
    """Without the step histogram: prefill per uncached token rose for long prompts only (a smaller budget).

    The budget also holds new requests back: each step takes fewer prompt tokens in, so at the
    same load they wait to be admitted. The queue's share of the excess counts too when the
    gauges show that kind of wait (requests waiting at spread running counts, no cap binding
    and KV not full: ``_load.admission_limited``); a binding cap or a full pool is queueing's
    and kv_pressure's (dev 1160081, SGLang budget 4096 -> 512: all of the TTFT tail excess queue time).
    """
    profile = prefill_length_profile(cost)
    if profile is None or not profile.long_only:
        return None
    short, long = profile.short, profile.long
    confidence = BUDGET_CONFIDENCE * clip01(long.rise / FULL_BUDGET_RISE)
    floor = prefill_cost_floor(comparison, metrics)
    if floor is not None and floor >= MIN_SLOWDOWN:
        # A budget moves how many prompt tokens a step carries, not what each costs: the step fit
        # says a prompt token now costs more in every step it shares, a slower prefill path
        # (prefill_slowdown's finding). Long prompts then show it most because a short prompt's
        # time is mostly the decode work of its steps (dev 1210261, SGLang prefill x2.43: long
        # prompts +83 %, short -7 %, the cost of a prompt token in a step up by at least that).
        confidence *= STEP_COST_ROSE_DAMPING
        evidence = [*evidence, Evidence("prefill_cost_per_token_in_step_rise_floor", 0.0, rnd(floor),
                                        "lower 95 % bound of a prompt token's cost rise in a step (step fit): "
                                        "a slower prefill path, not a budget")]  # fmt: skip
    at_prefill = stage_share(stages, "prefill", regression, comparison)
    kept = cost.shift.explained_share if cost.shift is not None else 1.0
    waited, wait_evidence = _admission_wait(comparison, regression, metrics, stages)
    budget_evidence: tuple[Evidence, ...] = (
        Evidence("prefill_s_per_uncached_token_change_long", 0.0, rnd(long.rise),
                 f"prompts over {profile.long_tokens:.0f} uncached tokens, at equal batch; z = {long.z:.1f}"),
        Evidence("prefill_s_per_uncached_token_change_short", 0.0, rnd(short.rise),
                 f"prompts up to {profile.short_tokens:.0f} uncached tokens, at equal batch; z = {short.z:.1f}"),
        *wait_evidence,
    )  # fmt: skip
    return Finding(
        cause="batch_composition",
        title=f"Prefill per uncached token rose {long.rise:.0%} for prompts over {profile.long_tokens:.0f} "
        f"uncached tokens and {short.rise:.0%} up to {profile.short_tokens:.0f}, at the same load: "
        "a smaller step budget splits long prompts" + (" and admits requests slower" if waited > 0 else ""),
        explained=latency_share(regression, at_prefill * kept + waited),
        confidence=confidence,
        stage="prefill",
        evidence=(*budget_evidence, *evidence),
        next_check=NEXT_CHECK + " (SGLang: chunked_prefill_size); export vllm:iteration_tokens to confirm",
    )


def _admission_wait(
    comparison: Comparison, regression: Regression, metrics: MetricView, stages: StageDecomposition
) -> tuple[float, tuple[Evidence, ...]]:
    """The queue's share of the tail excess when the gauges show requests waiting to be admitted, with evidence.

    A smaller budget (or whole prompts per step) also holds new requests back: each step takes
    fewer prompt tokens in, so at the same load they wait at whatever the replica runs, with no
    cap binding and KV not full (``_load.admission_limited``; dev 1160081, SGLang budget
    4096 -> 512: all of the TTFT tail excess queue time). ``(0.0, ())`` otherwise: a binding cap
    or a full pool is queueing's and kv_pressure's.
    """
    if not admission_limited(metrics, comparison.request_counts):
        return 0.0, ()
    waited = stage_share(stages, "queue", regression, comparison)
    if waited <= 0:
        return 0.0, ()
    full = metrics.running_at_queues()
    return waited, (
        Evidence("running_share_of_peak_at_queues", rnd(full.baseline), rnd(full.candidate),
                 f"no cap: requests wait to be admitted below the replicas' peak ({waited:.0%} of the tail "
                 "excess is queue time)"),
    )  # fmt: skip


def _prefill_spread(
    cost: EngineCost,
    metrics: MetricView,
    *,
    comparison: Comparison,
    regression: Regression,
    stages: StageDecomposition,
    evidence: list[Evidence],
) -> Finding | None:
    """Prefill per uncached token rose at equal batch while a prompt token costs no more in a step.

    A request's prefill time is the steps it is prefilled in. A slower prefill path makes each
    prompt token cost more in every step (the step fit's ``g``, :class:`_steps.StepMix`; on dev
    prefill slowdowns it rose 60-300 %, z 18-118); when the fit bounds that rise below
    :data:`MIN_SLOWDOWN` the prompts instead waited for steps with room or were spread over
    more of them: a whole-prompt scheduling (chunked prefill off) or a smaller step budget
    (dev 1100005, 1100053, 1090140: prefill per token +22-29 % at equal batch, ``g`` -2 to +1 %).
    """
    shift = cost.shift
    if shift is None or shift.z < Z_MIN or shift.rise < MIN_SLOWDOWN:
        return None
    mix = decode_step_mix(comparison, metrics)
    bound = mix.prefill_cost_rise_bound() if mix is not None else None
    if bound is None or bound >= MIN_SLOWDOWN:
        return None
    decode = engine_cost(comparison, metrics, "decode").shift
    decode_led = mix is not None and mix.decode_share is not None and mix.decode_share >= DECODE_LED
    if decode_led and decode is not None and decode.z >= Z_MIN and shift.rise <= decode.rise * ECHO_MARGIN:
        # The steps got slower by their decode work, per output token at equal batch as much as
        # prompts per token: prompts ride those steps, the slower decode's echo (dev 1220058:
        # decode x2.59, TPOT +132 %, prefill per token +112 %). Chunking turned off moves the fit's
        # decode part too, but not TPOT at equal batch as much as the prompts' own wait (1100005).
        return None
    if _other_prefill_work(comparison, metrics):
        return None
    waited, wait_evidence = _admission_wait(comparison, regression, metrics, stages)
    spread_evidence = (
        Evidence("prefill_s_per_uncached_token_change_at_equal_batch", 0.0, rnd(shift.rise),
                 f"at equal running batch and prompt size; z = {shift.z:.1f}"),
        Evidence("prefill_cost_per_token_in_step_rise_bound", 0.0, rnd(bound),
                 "upper 95 % bound of the rise of a prompt token's cost in a step (step fit): no slower prefill path"),
        *wait_evidence,
    )  # fmt: skip
    return Finding(
        cause="batch_composition",
        title=f"Prefill per uncached token rose {shift.rise:.0%} at the same load and batch while a prompt token "
        "costs no more in a step: prompts waited for or were spread over more steps (chunked prefill or the "
        "step budget changed)" + (" and requests waited to be admitted" if waited > 0 else ""),
        explained=latency_share(
            regression, engine_share(stages, regression, comparison) * shift.explained_share + waited
        ),
        confidence=BUDGET_CONFIDENCE * clip01(shift.rise / FULL_BUDGET_RISE),
        stage="prefill",
        evidence=(*spread_evidence, *evidence),
        next_check=NEXT_CHECK,
    )
