"""Stage decomposition of the tail, as a fallback explanation.

Mechanism: the candidate's tail requests spent extra time somewhere; the
stage that took most of the excess points at the family of causes (queue ->
capacity or load, prefill -> prefill slowdown, decode -> decode slowdown,
gateway or dependency spans -> dependency). A stage is not a mechanism,
so this finding's confidence is damped: the specific rules (prefix cache,
batch composition, queueing, traffic mix, ...) outrank it whenever they can
name the mechanism, and it remains as the honest "where" when none can.

Stage is not cause (docs/causes.md): the finding's cause is the *driver* of
the stage's extra time, and its title names that mechanism first, with the
stage share after it. Seconds per token only count as an engine slowdown for
the part of their rise that remains at equal running batch and prompt length
(``_engine_cost.engine_cost``): a TPOT that rose because each replica now runs
more requests (fewer replicas, more arrivals) is that batch growth's doing,
and its term moves to the capacity or load driver that made the batch grow. Where no batch
bucket overlaps, the step fit (``_steps.StepMix``) says whose the rise is: the decode work's, or
a prompt token's surely costlier step (then the slower prefill's). A queue with no driver
measured takes the drivers of the engine stage holding the next part of the excess, and a
prefix-cache driver whose prefixes a smaller KV pool evicted is ``kv_pressure``'s.
"""

from __future__ import annotations

import math
from typing import Final, Literal

import polars as pl

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import DRIVER_MIN_CHANGE, StageDecomposition, queue_drivers, stage_drivers
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import Evidence, Finding, Regression, RuleSkipped
from sre_agent.rules._engine_cost import BATCH_GREW, MIN_SLOWDOWN, engine_cost
from sre_agent.rules._load import pool_shrank_by
from sre_agent.rules._mechanism import (
    per_replica,
    queue_drivers_per_replica,
    rnd,
    side_means,
    uncached_tokens,
    wide_enough,
)
from sre_agent.rules._replica_scope import replica_scope
from sre_agent.rules._steps import DECODE_LED, decode_step_mix, prefill_cost_floor

#: The drivers of the offered load per replica.
_OFFERED: Final[frozenset[str]] = frozenset({"load", "capacity"})
#: The engine stages whose drivers stand in for the queue's when it has none measured...
_ENGINE_STAGES: Final[tuple[Literal["prefill", "decode"], ...]] = ("prefill", "decode")
#: ...when they hold at least this share of the tail excess.
NEXT_STAGE_SHARE: Final[float] = 0.25
#: How much a stage-only explanation is trusted relative to a mechanism.
STAGE_ONLY_CONFIDENCE = 0.25
#: The engine stage whose per-token cost a slowdown cause is about.
_STAGE_OF: Final[dict[str, Literal["prefill", "decode"]]] = {"decode_slowdown": "decode", "prefill_slowdown": "prefill"}

_CAUSE_OF_STAGE = {
    "prefill": ("prefill_slowdown", "compare prefill time per uncached prompt token at equal batch size"),
    "decode": ("decode_slowdown", "compare decode step time at equal running batch size (CUDA graphs, kernels)"),
    "dependency": ("dependency", "list the non-engine spans of the slowest traces and compare their durations"),
    "gateway": ("dependency", "compare gateway span time outside engine calls (auth, routing, network)"),
}


#: What each driver means, for the title (the mechanism comes first, the stage second).
_MECHANISM = {
    "load": "more arrivals per second",
    "capacity": "fewer replicas for the offered load",
    "traffic_mix": "more work per request",
    "prefix_cache": "fewer prompt tokens served from the prefix cache",
    "kv_pressure": "a smaller KV pool evicted the cached prefixes and preempted requests",
    "prefill_slowdown": "prefill seconds per uncached token rose at equal batch",
    "batch_composition": "prompts spread over more engine steps at the same cost per step (step budget, chunking)",
    "decode_slowdown": "seconds per output token rose at equal batch",
}
#: What the title says when no driver was measured: the stage's own change, never a driver it
#: did not measure (outside the engine there are no drivers to split).
_STAGE_MECHANISM = {
    "prefill": "prefill took longer per request, with no driver measured",
    "decode": "decode took longer per request, with no driver measured",
    "dependency": "non-engine spans (dependency calls) took longer",
    "gateway": "the gateway's own time outside engine calls grew",
}


def _at_equal_batch(
    drivers: dict[str, float], comparison: Comparison, metrics: MetricView | None, growth: dict[str, float]
) -> dict[str, float]:
    """Keep of each slowdown term only the part that remains at equal running batch; hand the rest to batch growth.

    The moved part goes to ``capacity`` or ``load``, whichever driver of queueing (``growth``:
    :func:`~sre_agent.rules._mechanism.queue_drivers_per_replica`) is larger (the batch grew
    because each replica got more requests); without either it is dropped.
    """
    if metrics is None:
        return drivers
    out = dict(drivers)
    grew = [d for d in ("capacity", "load") if growth.get(d, 0.0) > 0]
    batch_driver = max(grew, key=lambda d: growth[d], default=None)
    echo = more = 0.0
    for driver, stage in (("decode_slowdown", "decode"), ("prefill_slowdown", "prefill")):
        term = out.get(driver)
        if not term:
            continue
        try:
            cost = engine_cost(comparison, metrics, stage)  # type: ignore[arg-type]
        except RuleSkipped:
            continue
        # Prefill falls back to equal prompt size (assess_slowdown); decode only when the step fit
        # puts the rise in the decode work of a step (its fixed and per-sequence cost), not in a
        # batch that grew for another reason (a slower prefill keeps more requests decoding).
        # Dev 1210222: decode x3, the batch x4.7 past every equal-batch bucket, the decode term
        # dropped and the queue went to a x1.02 prefill driver.
        fallback = _prefill_step_rose(comparison, metrics) if stage == "prefill" else _decode_led(comparison, metrics)
        shift = cost.shift or (cost.size_shift if fallback else None)
        if shift is None:
            if (cost.running.ratio or 0.0) >= BATCH_GREW:
                # No batch bucket overlaps and the batch grew: the raw per-token rise may be the bigger
                # batch's alone (a slower prefill keeps more requests decoding), so it names nothing,
                # unless the step fit says whose: a prompt token surely costlier in every step it
                # shares, with the costlier prefill holding most of the steps' rise, makes both the
                # decodes beside it and the batch that grew around them the slower prefill's (dev
                # 1200152: prefill x2.78, TPOT x4.8, batch 23 -> 63, g +131 % at its lower bound).
                if driver == "decode_slowdown" and _prefill_led(comparison, metrics):
                    echo += term
                out[driver] = 0.0
            continue
        kept = term * shift.explained_share if shift.z >= 2 else 0.0
        moved = 0.0
        mix = decode_step_mix(comparison, metrics) if driver == "decode_slowdown" else None
        if mix is not None and mix.decode_share is not None:
            # Decode steps carry the replica's prefill chunks: the part of the slower decode that
            # costlier prefill in those steps accounts for is prefill's, the part from more
            # prefill per step at the old cost is whatever brought that prefill (_steps.StepMix).
            # Added after the loop: the step fit measured them, not prefill's own per-token cost.
            echo += kept * (mix.prefill_share or 0.0)
            more += kept * (mix.work_share or 0.0)
            moved = kept * (1 - mix.decode_share)
            kept *= mix.decode_share
        out[driver] = kept
        if batch_driver is not None:
            out[batch_driver] = out.get(batch_driver, 0.0) + (term - kept - moved)
        elif mix is not None and mix.work_share:
            # The per-token rise is gone at equal batch and no replica got more requests: the batch
            # and the prefill per step grew around steps that carry more prefill at the old cost,
            # so of the rise the step fit measured, more prefill arriving owns its share (dev
            # 1230267: a tenant with 33 % longer prompts grew 10 % -> 44 %, TPOT +37 %, 91 % of the
            # fitted rise more prefill per step; the queue went to `capacity` by default).
            more += (term - kept - moved) * mix.work_share
    prefill = out.get("prefill_slowdown", 0.0)
    mix = decode_step_mix(comparison, metrics) if prefill > 0 else None
    bound = mix.prefill_cost_rise_bound() if mix is not None else None
    if bound is not None and bound < MIN_SLOWDOWN:
        # The step fit bounds a prompt token's cost in a step below a slowdown: prompts took longer
        # per token because they were spread over more steps (a smaller step budget, chunked
        # prefill: batch_composition) or shared them with more prefill (traffic_mix, prefix_cache),
        # as prefill_slowdown's own rule concludes (dev 1160038: budget 8192 -> 512, long prompts
        # +32 % per token, the step cost bound +1.6 %; the queue went to a x1.01 "slowdown").
        owner = _more_prompt_work(comparison, metrics) or "batch_composition"
        out[owner] = out.get(owner, 0.0) + out.pop("prefill_slowdown")
    if echo > 0:
        owner = _prefill_echo_owner(comparison, metrics)
        out[owner] = out.get(owner, 0.0) + echo
    # More prefill per step came with more prompt work per request, else with more requests
    # per replica (the batch driver found above); neither, and nothing owns it.
    owner_of_more = _more_prompt_work(comparison, metrics) or batch_driver
    if more > 0 and owner_of_more is not None:
        out[owner_of_more] = out.get(owner_of_more, 0.0) + more
    return {k: v for k, v in out.items() if v > 0}


def _engine_stage_drivers(
    comparison: Comparison, metrics: MetricView | None, stage: Literal["prefill", "decode"]
) -> dict[str, float]:
    """Why an engine stage took longer (``decompose.stage_drivers``), slowdowns kept at equal batch only."""
    drivers = stage_drivers(
        comparison.requests,
        stage,
        comparison.window_seconds(),
        comparison.request_counts,
        uncached_tokens(comparison, metrics),
    )
    return _at_equal_batch(drivers, comparison, metrics, queue_drivers_per_replica(comparison, metrics))


def _prefill_step_rose(comparison: Comparison, metrics: MetricView) -> bool:
    """Whether the step fit leaves room for a costlier prompt token in a step (True when it cannot be fitted).

    False when the 95 % interval of that cost's rise includes none: a batch grown at unchanged
    load then need not be a slower step (near saturation a little more work grows it too).
    """
    floor = prefill_cost_floor(comparison, metrics)
    return floor is None or floor > 0


def _prefill_led(comparison: Comparison, metrics: MetricView) -> bool:
    """Whether the step fit puts most of a TPOT rise in costlier prefill, a prompt token surely >= 10 % costlier."""
    mix = decode_step_mix(comparison, metrics)
    if mix is None or mix.prefill_share is None or mix.prefill_share < DECODE_LED:
        return False
    floor = mix.prefill_cost_rise_floor()
    return floor is not None and floor >= MIN_SLOWDOWN


def _decode_led(comparison: Comparison, metrics: MetricView) -> bool:
    """Whether the step fit puts most of a TPOT rise in the decode work of a step (``_steps.StepMix``)."""
    mix = decode_step_mix(comparison, metrics)
    return mix is not None and mix.decode_share is not None and mix.decode_share >= DECODE_LED


def _prefill_echo_owner(comparison: Comparison, metrics: MetricView) -> str:
    """Who owns the part of a slower decode that costlier prefill sharing its steps accounts for.

    ``prefill_slowdown`` when prefill per uncached token rose at equal batch and prompt size
    (or that cannot be measured: as before). When it did not and more prompt work per request
    arrived, the step fit's rise of the prefill cost per token is the prompts' own (longer
    prompts cost more per token): it goes to ``traffic_mix`` or ``prefix_cache``
    (:func:`_more_prompt_work`). When neither, it stays ``prefill_slowdown`` only if the fit
    bounds that rise at >= 10 %; else ``decode_slowdown`` keeps it.
    """
    try:
        cost = engine_cost(comparison, metrics, "prefill")
    except RuleSkipped:
        return "prefill_slowdown"
    shift = cost.shift or cost.size_shift
    if shift is None or (shift.z >= 2 and shift.rise >= DRIVER_MIN_CHANGE):
        return "prefill_slowdown"
    # Handed on only when more prefill work arrived to own it: the step fit's own evidence of a
    # costlier prefill stands when nothing else changed (dev 1040246: prefill x1.58, the per-token
    # comparison flat at z 0.4 while g rose 85 ms per token), if it is evidence: a prompt token
    # surely >= 10 % costlier in a step. Else the fit's split of the rise is its point estimate
    # and the rise stays the decode's, whose cost at equal batch measured it (1260284: decode
    # x1.45, TPOT +21 % at equal batch at z 3.8, prefill per token -5 %, g's rise bounded at
    # +0.02 %, and the queue went to a x1.09 "prefill" echo over a x1.07 decode).
    floor = prefill_cost_floor(comparison, metrics)
    surely = floor is None or floor >= MIN_SLOWDOWN
    return _more_prompt_work(comparison, metrics) or ("prefill_slowdown" if surely else "decode_slowdown")


def _more_prompt_work(comparison: Comparison, metrics: MetricView) -> str | None:
    """Whether each request brought more prefill: more prompt tokens (``traffic_mix``: a new
    tenant's long prompts), else more of them uncached (``prefix_cache``); ``None`` otherwise."""
    means = side_means(
        comparison.requests,
        prompt=pl.col("input_tokens"),
        uncached=uncached_tokens(comparison, metrics),
    )
    for column, owner in (("prompt", "traffic_mix"), ("uncached", "prefix_cache")):
        ratio = means[column].ratio
        if ratio is not None and ratio >= 1 + DRIVER_MIN_CHANGE:
            return owner
    return None


def _slower_at_equal_batch(comparison: Comparison, metrics: MetricView | None, stage: str) -> bool:
    """Whether the stage's per-token cost rose at equal running batch (True when it cannot be measured)."""
    if metrics is None:
        return True
    try:
        shift = engine_cost(comparison, metrics, stage).shift  # type: ignore[arg-type]
    except RuleSkipped:
        return True
    return shift is None or (shift.z >= 2 and shift.rise >= DRIVER_MIN_CHANGE)


def stages(
    stages: StageDecomposition, regression: Regression, comparison: Comparison, metrics: MetricView | None = None
) -> Finding | None:
    """Name the driver of the stage that holds most of the tail excess, with the full decomposition as evidence."""
    stages = wide_enough(stages, regression, comparison)
    if not regression.significant or not stages.shares:
        return None
    dominant = stages.dominant
    assert dominant is not None
    caveat: tuple[Evidence, ...] = ()
    share = stages.shares[dominant]
    if dominant == "queue":
        # Queueing is a symptom: name what drove utilisation up (load, replicas, work, speed).
        growth = queue_drivers_per_replica(comparison, metrics)
        drivers = _at_equal_batch(growth, comparison, metrics, growth)
        if "prefix_cache" in drivers and metrics is not None and pool_shrank_by(comparison, metrics) is not None:
            # The cache lost its prefixes because the KV pool shrank (each running request holds
            # more of it than its tokens explain): the pool's evictions are the queue's driver
            # (dev 1150228: num_gpu_blocks cut, hit rate 34 % -> 9 %).
            drivers["kv_pressure"] = drivers.pop("prefix_cache")
        if sum(drivers.values()) < math.log(1 + DRIVER_MIN_CHANGE):
            # No driver passed its bar, or those that did move utilisation by less than one would
            # have to alone. Queueing follows the offered load per replica; when only its point
            # estimate rose (arrivals within the spread of a bursty trace's slices), that is still
            # the one driver measured, named at this finding's low confidence with the caveat (dev
            # 1210097: arrivals x1.85 at z 1.8, the queue went to a x1.02 batch composition term).
            queued = queue_drivers(comparison.requests, comparison.window_seconds(), comparison.request_counts)
            offered = {k: v for k, v in per_replica(queued, comparison, within_bursts=True).items() if k in _OFFERED}
            if sum(offered.values()) > sum(drivers.values()):
                drivers = offered
                caveat = (Evidence("arrival_change_z", None, rnd(comparison.arrival_change_z, 2),
                                   "the arrival rate changed within the spread of per-slice arrivals"),)  # fmt: skip
        if not drivers:
            # Nothing measured drives the queue. Requests wait for slots and step budget that the
            # engine stages hold, so the drivers of an engine stage that holds a good part of the
            # excess too name the mechanism (dev 1160110: a new tenant's long prompts, uncached
            # work x1.44 but shorter answers, so the work at the baseline's seconds per token
            # fell; queue 54 %, prefill 46 %, and "capacity" by default).
            for stage in sorted(_ENGINE_STAGES, key=lambda st: -stages.shares.get(st, 0.0)):
                if stages.shares.get(stage, 0.0) >= NEXT_STAGE_SHARE:
                    drivers = _engine_stage_drivers(comparison, metrics, stage)
                if drivers:
                    caveat = (Evidence(f"{stage}_share", None, rnd(stages.shares[stage]),
                                       f"no driver of the queue measured: the {stage} stage's drivers"),)  # fmt: skip
                    break
        cause = max(drivers, key=lambda d: drivers[d]) if drivers else "capacity"
        check = "compare arrival rate, replica count, tokens per request and seconds per token before and after"
    elif dominant in ("prefill", "decode"):
        # A stage took longer because requests asked for more, the cache helped less, or the engine slowed.
        drivers = _engine_stage_drivers(comparison, metrics, "prefill" if dominant == "prefill" else "decode")
        if not drivers and not _slower_at_equal_batch(comparison, metrics, dominant):
            # Nothing measured drives the stage and its per-token cost did not rise at equal batch:
            # naming the stage's slowdown would name a mechanism the data contradicts.
            return None
        cause = max(drivers, key=lambda d: drivers[d]) if drivers else _CAUSE_OF_STAGE[dominant][0]
        check = _CAUSE_OF_STAGE[dominant][1]
    else:
        cause, check = _CAUSE_OF_STAGE[dominant]
        drivers = {}
    driver_evidence = tuple(
        Evidence(f"driver_{d}", None, round(math.exp(t), 4), f"x{math.exp(t):.2f} of the {dominant} time's drivers")
        for d, t in sorted(drivers.items(), key=lambda kv: -kv[1])
    )
    evidence = tuple(
        Evidence(
            f"tail_mean_{s}_s",
            round(stages.baseline.get(s, 0.0), 6),
            round(stages.candidate.get(s, 0.0), 6),
            f"{stages.shares.get(s, 0.0):.0%} of the tail excess",
        )
        for s in stages.baseline
    )
    label = f"{stages.metric} p{round(stages.quantile * 100)}"
    where = f"{share:.0%} of the {label} tail excess is {dominant} time"
    mechanism = _MECHANISM.get(cause) if cause in drivers else _STAGE_MECHANISM.get(dominant)
    scope: dict[str, str] = {}
    if cause in ("decode_slowdown", "prefill_slowdown") and metrics is not None:
        # A slowdown of one replica's steps is that replica's, whichever finding names it.
        try:
            scope, scope_evidence = replica_scope(engine_cost(comparison, metrics, _STAGE_OF[cause]))
        except RuleSkipped:  # no per-request timing for the stage: nothing to compare per replica
            scope_evidence = ()
        evidence += scope_evidence
    return Finding(
        cause=cause,
        title=f"{mechanism[0].upper()}{mechanism[1:]} ({where})" if mechanism else where,
        explained=share,
        confidence=STAGE_ONLY_CONFIDENCE,
        stage=dominant,
        scope=scope,
        evidence=driver_evidence + caveat + evidence,
        next_check=check,
    )
