"""Time per output token rose at a comparable batch size.

Mechanism: a decode step's time depends on how many sequences share it (the
running batch) and how long their contexts are. When TPOT rises with the
batch, that is load or capacity; when it rises *at the same batch size and
context length*, the step itself got slower (a kernel or library change,
lost CUDA-graph coverage, a sampler or detokeniser regression, eager mode).

Signal: ``tpot_s`` per request (decode time / (output tokens - 1)),
compared as ``log(tpot)`` within buckets of running batch (requests running on
the same replica during the request's decode, the mean at a quarter, half and
three quarters of it, from span overlap over every selected request; x1.25
buckets) x prompt length (x4 buckets); buckets need 20 requests per side. The per-bucket changes are averaged with the
candidate's request counts as weights.

``explained`` (0..1): the decode stage's share of the headline's tail excess
(1 for a TPOT/ITL headline), plus the queue's share when the offered load per
replica is unchanged and preemptions did not rise (slower steps then fill the
slots and requests queue: Little's law), times the share of the raw log change
of TPOT that remains at equal buckets (``conditional / raw``).

``explained`` is 0 when the headline is the error rate (no latency mechanism
accounts for failed requests).

``confidence``: significance of the conditional change's z score x
``min(1, rise / 30 %)`` x bucket coverage (``min(1, covered share / 0.5)``),
x 0.4 when the step cap (p99 tokens per step) moved (``batch_composition``)
and x 0.25 when uncached prompt tokens per request changed by 20 % or more
(steps then carry other prefill work: ``prefix_cache`` or ``traffic_mix``),
x the decode work's share of the TPOT rise (``_steps.StepMix``: per side,
``tpot = a + b * running + g * prompt tokens prefilled per decode step``; a
slower prefill raises ``g``, a slower decode ``a`` and ``b``; ``explained`` is
scaled by the same share), or, when that fit cannot be made, x (decode rise /
prefill rise) when prefill per uncached token rose more at equal batch size, and
x 0.5 when the offered load per replica changed by more than 10 % (busier
steps carry more prefill tokens, which the running count does not see).

Quiet (``None``) below a 10 % rise at equal buckets or z < 2, unless the engine's
inter-token histogram shows the median decode step rising beyond noise and >= 15 %
more than the running batch per replica (a step grows at most in proportion to its
batch at the same cost) at the same load and work per request: prefill steps between
decodes (vLLM V0) dilute TPOT at equal batch while the median step, a plain decode
step, doubles. Confidence 0.5 x ``min(1, (step ratio / batch ratio - 1) / 0.3)``.

Scope: the replica whose cost rose compared with itself (at equal batch and prompt
size, else at equal size when its batch grew no more than its peers') while the
other replicas' rose at most a third as much (``_replica_scope.slowed_replica``).
"""

from __future__ import annotations

import math
from typing import Final

import polars as pl

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import StageDecomposition
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import Evidence, Finding, Regression, run_late
from sre_agent.rules._engine_cost import BATCH_GREW, FULL_SLOWDOWN, EngineCost, assess_slowdown, engine_cost
from sre_agent.rules._load import load_moved, load_per_replica, service_time_queue_share
from sre_agent.rules._mechanism import (
    Z_MIN,
    clip01,
    latency_share,
    rnd,
    side_means,
    significance,
    stage_share,
    uncached_tokens,
)
from sre_agent.rules._replica_scope import confined_slowdown, replica_scope
from sre_agent.rules._steps import SAME_WORK, batch_shape, decode_step_mix, median_step, slice_step_mix

#: How far the median inter-token step must outgrow the running batch to be a slower step.
STEP_BEYOND_BATCH: Final[float] = 1.15
#: Confidence of a slower step read from the inter-token median alone, at x1.3 beyond the batch.
STEP_ONLY_CONFIDENCE: Final[float] = 0.5

NEXT_CHECK: Final[str] = (
    "compare decode step time at equal running batch size before and after (engine logs or a fixed-batch "
    "benchmark); check CUDA-graph capture sizes vs max_num_seqs, enforce_eager, attention backend and "
    "kernel/library versions in the new image"
)


@run_late  # waits on the busy intervals read in the background
def decode_slowdown(
    comparison: Comparison, regression: Regression, stages: StageDecomposition, metrics: MetricView
) -> Finding | None:
    """A ``decode_slowdown`` finding when TPOT rose at equal batch size (see module docstring)."""
    cost = engine_cost(comparison, metrics, "decode")
    verdict = assess_slowdown(
        cost,
        share=stage_share(stages, "decode", regression, comparison)
        + service_time_queue_share(comparison, stages, regression, metrics),
        batch=batch_shape(metrics, comparison),
        load=load_per_replica(comparison, metrics)[0],
        load_changed=load_moved(comparison, metrics),
    )
    if verdict is None:
        return _step_beyond_batch(comparison, regression, stages, metrics) or _one_replica(
            cost, regression, stages, comparison, metrics
        )
    confidence, evidence = verdict.confidence, verdict.evidence
    explained = verdict.explained
    mix = decode_step_mix(comparison, metrics)
    decode_share = mix.decode_share if mix is not None else None
    prefill = engine_cost(comparison, metrics, "prefill").shift
    if mix is not None and decode_share is not None:
        # The steps a request decodes in also carry its replica's prefill chunks: only the part of
        # the TPOT rise that the decode work per step accounts for is a decode regression.
        confidence *= decode_share
        explained *= decode_share
        evidence += (
            Evidence("tpot_rise_from_decode_work_s", 0.0, rnd(mix.decode_part),
                     "TPOT change the decode work of a step accounts for (fixed + per running sequence)"),
            Evidence("tpot_rise_from_shared_prefill_s", 0.0, rnd(mix.prefill_part),
                     "TPOT change from costlier prefill in the same steps"),
            Evidence("tpot_rise_from_more_prefill_s", 0.0, rnd(mix.work_part),
                     f"TPOT change from more prefill in the same steps at the old cost "
                     f"({mix.prefill_per_step.baseline:.0f} -> {mix.prefill_per_step.candidate:.0f} prompt tokens "
                     "per decode step)"),
        )  # fmt: skip
    elif prefill is not None and prefill.z >= Z_MIN and prefill.rise > verdict.rise:
        # Decode tokens share steps with prefill chunks: when prefill got costlier still, the slower
        # decode steps are more likely its echo than a decode regression of their own.
        confidence *= verdict.rise / prefill.rise
        evidence += (
            Evidence("prefill_s_per_uncached_token_change_at_equal_batch", 0.0, rnd(prefill.rise),
                     "prefill rose more than decode: decode steps may be slowed by the prefill chunks they share"),
        )  # fmt: skip
    scope, scope_evidence = replica_scope(cost)
    return Finding(
        cause="decode_slowdown",
        title=f"Time per output token rose {verdict.rise:.0%} at the same "
        + ("running batch size and prompt length" if not verdict.size_only else verdict.control),
        explained=latency_share(regression, explained),
        confidence=confidence,
        stage="decode",
        scope=scope,
        evidence=evidence + scope_evidence,
        next_check=NEXT_CHECK,
    )


def _one_replica(
    cost: EngineCost, regression: Regression, stages: StageDecomposition, comparison: Comparison, metrics: MetricView
) -> Finding | None:
    """A decode slowdown of one replica's own steps, diluted below the bar when pooled (:func:`confined_slowdown`).

    ``explained`` as for the pooled reading (the decode and queue share of the excess), and
    both it and ``confidence`` times the decode work's share of the replica's own fitted TPOT
    rise (:func:`~sre_agent.rules._steps.step_mix` on its requests; 1 when it cannot be fitted).
    """
    confined = confined_slowdown(cost)
    if confined is None or regression.metric == "error_rate":
        return None
    scope, evidence, rise, z = confined
    share = stage_share(stages, "decode", regression, comparison) + service_time_queue_share(
        comparison, stages, regression, metrics
    )
    ((attribute, replica),) = scope.items()
    # The replica's decode steps carry its own prefill chunks: its own step fit says how much of
    # its TPOT rise is the decode work (a prefill x1.55 on replica-2 raised its TPOT 34 %, 97 % of
    # that a prompt token's cost in the step; dev 1230269), as the pooled reading asks of the fleet.
    mix = slice_step_mix(comparison, metrics, attribute, replica)
    decode_share = mix.decode_share if mix is not None and mix.decode_share is not None else 1.0
    return Finding(
        cause="decode_slowdown",
        title=f"Time per output token rose {rise:.0%} on {replica} alone, compared with itself "
        "(pooled over every replica the rise stays below 10 %)",
        explained=latency_share(regression, clip01(share) * decode_share),
        confidence=significance(z) * min(1.0, rise / FULL_SLOWDOWN) * decode_share,
        stage="decode",
        scope=scope,
        evidence=evidence,
        next_check=NEXT_CHECK,
    )


def _step_beyond_batch(
    comparison: Comparison, regression: Regression, stages: StageDecomposition, metrics: MetricView
) -> Finding | None:
    """Decode steps slower than the running batch allows, from the inter-token histogram's median.

    A decode step costs a fixed part and a part per running sequence (``a + b * running``),
    so at the same cost per step its time grows at most in proportion to the running batch.
    The median inter-token interval is a plain decode step (prefill steps, and steps carrying
    large chunks, are the tail). Where prefill steps between decodes dilute TPOT at equal
    batch (vLLM V0: ITL p50 x2.0 while TPOT +30 % at equal batch, z 0.7; 1050140), a median
    step that rose beyond noise (the two sides' intervals apart) and >= 15 % more than the
    running batch is a slower step. Only at the same load per replica, the same work and
    uncached prompt tokens per request (20 %; else the steps carry other work), and where the
    step fit can be made, with the rise in the decode work, not in the prefill sharing the steps;
    and not where fewer requests ran (see below).
    """
    if regression.metric == "error_rate" or load_moved(comparison, metrics) is not False:
        return None
    median = median_step(metrics)
    running = metrics.running_per_replica()
    if median is None or running.ratio is None:
        return None
    if running.ratio < 1 / BATCH_GREW:
        # Little's law: at the same arrivals and tokens per request, a slower decode keeps each
        # request running longer, so more run at once. Fewer running is the engine admitting fewer
        # (a lower cap or step budget holding requests in the queue), and a smaller budget puts a
        # prompt chunk in more of the steps, which lifts the median step with no decode slower
        # (SGLang chunked_prefill_size 8192 -> 256 on Azure's code trace: ITL p50 x1.65 at running
        # x0.36, the queue all of the TTFT tail; dev 1340217, read as decode_slowdown).
        return None
    p50, before, after = median
    intervals = before.quantile_interval(0.5), after.quantile_interval(0.5)
    if p50.ratio is None or intervals[0] is None or intervals[1] is None or intervals[1][0] < intervals[0][1]:
        return None
    batch = max(running.ratio, 1.0)
    if p50.ratio < STEP_BEYOND_BATCH * batch:
        return None
    work = side_means(
        comparison.requests,
        work=pl.col("input_tokens").fill_null(0) + pl.col("output_tokens").fill_null(0),
        new=uncached_tokens(comparison, metrics),
    )
    if any(pair.ratio is None or abs(pair.ratio - 1.0) > SAME_WORK for pair in work.values()):
        return None
    mix = decode_step_mix(comparison, metrics)
    if mix is not None and mix.decode_share is not None and mix.decode_share < 0.5:
        return None
    beyond = p50.ratio / batch
    share = stage_share(stages, "decode", regression, comparison) + service_time_queue_share(
        comparison, stages, regression, metrics
    )
    evidence = (
        Evidence("itl_p50_s", rnd(p50.baseline, 6), rnd(p50.candidate, 6),
                 f"median inter-token interval (histogram); 95 % intervals {intervals[0]} -> {intervals[1]}"),
        Evidence("running_per_replica", rnd(running.baseline), rnd(running.candidate),
                 "a step grows at most in proportion to its batch at the same cost"),
    )  # fmt: skip
    return Finding(
        cause="decode_slowdown",
        title=f"The median decode step rose {p50.ratio - 1:.0%} while the running batch rose {batch - 1:.0%}: "
        "slower steps, not more of them (inter-token histogram)",
        # The part of the step's rise the batch cannot account for, of the decode (and queue) share.
        explained=latency_share(regression, clip01(share) * math.log(beyond) / math.log(p50.ratio)),
        confidence=STEP_ONLY_CONFIDENCE * min(1.0, (beyond - 1.0) / 0.3),
        stage="decode",
        evidence=evidence,
        next_check=NEXT_CHECK,
    )
