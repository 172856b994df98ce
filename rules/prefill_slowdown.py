"""Prefill time per uncached prompt token rose at a comparable batch size.

Mechanism: prefill cost grows with the prompt tokens actually computed (the
uncached ones) and with what shares the steps (the running batch). When
prefill per uncached token rises at the same batch size and prompt length,
the prefill path itself got slower (attention kernel, structured-output or
multimodal preprocessing, tokenisation moved into the engine clock). A fall
of the prefix-cache hit rate adds uncached tokens but does not change the
cost *per uncached token*, so it stays ``prefix_cache``'s finding.

Signal: ``prefill_s / uncached tokens`` per request, uncached = input -
cached tokens (cached from the span; when spans lack it, input x (1 - the
side's hit rate from the prefix-cache counters); with no cache signal at all
every prompt token counts as uncached and confidence is halved), compared as
a log within buckets of running batch (at the request's scheduling, from span
overlap) x uncached tokens (factor-4 buckets).

``explained`` (0..1): the prefill stage's share of the headline's tail
excess (plus the queue's share at unchanged load per replica without more
preemptions, as in ``decode_slowdown``; for a TPOT/ITL headline, the whole
of it when decode slowed less than prefill at equal batch size, since
prefill chunks share steps with decodes) times the share of the raw log
change that remains at equal buckets.

``explained`` is 0 when the headline is the error rate (no latency mechanism
accounts for failed requests).

``confidence``: as ``decode_slowdown`` (significance x effect size x coverage,
x 0.4 when the step cap moved, x 0.25 when the uncached work per request changed,
x 0.5 when the offered load per replica changed), halved without any
cache signal, x 0.4 when only the longest quarter of prompts slowed and no
step histogram exists (a smaller step budget: ``batch_composition``), x 0.2 when
the step fit bounds the rise of a prompt token's cost in a step below 10 %
(``_steps.StepMix.prefill_cost_rise_bound``: the prompts waited for steps),
x (1 - the decode work's share of the TPOT rise, at least 0.1) when the step fit says
decode work led a surely slower decode and prefill per token rose no more than 1.25x
TPOT's rise, or a prompt token is not surely 10 % costlier in a step (an echo), or,
for a reading at equal prompt size alone (the batch grew at unchanged load) or with
20 % more uncached prompt tokens per request, when the fit's 95 % interval of that
rise includes none (``prefill_cost_rise_floor``).

Quiet below a 10 % rise at equal buckets or z < 2.

Scope: the replica whose cost rose compared with itself (at equal batch and prompt
size, else at equal size when its batch grew no more than its peers') while the
other replicas' rose at most a third as much (``_replica_scope.slowed_replica``).
"""

from __future__ import annotations

from typing import Final

from sre_agent.analysis.busy import replica_expr
from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import StageDecomposition
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import Evidence, Finding, Regression, run_late
from sre_agent.rules._engine_cost import (
    FULL_SLOWDOWN,
    MIN_SLOWDOWN,
    assess_slowdown,
    engine_cost,
    prefill_length_profile,
)
from sre_agent.rules._load import load_moved, load_per_replica, service_time_queue_share
from sre_agent.rules._mechanism import (
    ECHO_MARGIN,
    PER_TOKEN_METRICS,
    Z_MIN,
    clip01,
    latency_share,
    rnd,
    significance,
    stage_share,
    uncached_per_request,
)
from sre_agent.rules._replica_scope import replica_scope
from sre_agent.rules._steps import DECODE_LED, SAME_WORK, StepMix, batch_shape, decode_step_mix, slice_step_mix

#: Confidence factor when only the long prompts slowed and no step histogram says why.
LONG_ONLY_DAMPING: Final[float] = 0.4
#: Confidence kept when the step fit bounds the rise of a prompt token's cost in a step below
#: MIN_SLOWDOWN: the data contradicts a slower prefill path, so below the stage fallback's 0.25.
STEP_COST_FLAT_DAMPING: Final[float] = 0.2
#: Confidence factor when nothing says how many prompt tokens were cached.
NO_CACHE_SIGNAL_DAMPING: Final[float] = 0.5
#: Lowest confidence factor of an echoed prefill rise (the prefill path may have slowed too).
ECHO_FLOOR: Final[float] = 0.1
#: Confidence factor of a slowdown read from the step fit alone (a weaker control than equal
#: batch and prompt size; as a reading at equal prompt size alone, _engine_cost.SIZE_ONLY_DAMPING).
STEP_FIT_ONLY_DAMPING: Final[float] = 0.6

NEXT_CHECK: Final[str] = (
    "benchmark prefill of fixed uncached prompts at equal batch size on both versions; diff attention "
    "backend, kernel and structured-output/tokenizer versions; check TTFT split by response_format"
)


def _more_prefill_work(comparison: Comparison, metrics: MetricView) -> bool:
    """Whether each request brought :data:`~sre_agent.rules._steps.SAME_WORK` or more uncached prompt tokens."""
    ratio = uncached_per_request(comparison, metrics).ratio
    return ratio is not None and ratio >= 1 + SAME_WORK


@run_late  # waits on the busy intervals read in the background
def prefill_slowdown(
    comparison: Comparison, regression: Regression, stages: StageDecomposition, metrics: MetricView
) -> Finding | None:
    """A ``prefill_slowdown`` finding when prefill per uncached token rose at equal batch size."""
    cost = engine_cost(comparison, metrics, "prefill")
    share = stage_share(stages, "prefill", regression, comparison) + service_time_queue_share(
        comparison, stages, regression, metrics
    )
    extra: tuple[Evidence, ...] = ()
    if regression.metric in PER_TOKEN_METRICS and cost.shift is not None:
        decode = engine_cost(comparison, metrics, "decode").shift
        if decode is not None and decode.rise < cost.shift.rise and cost.shift.rise >= MIN_SLOWDOWN:
            # Prefill chunks share steps with decodes: a costlier prefill slows the tokens of everyone
            # decoding beside it, so it reaches a per-token headline too. The stalls land in the
            # TPOT tail (requests decoding beside long prompts), so the per-bucket mean decode
            # cost need not rise at all; it only must have risen less than prefill's.
            share = 1.0
            extra = (Evidence("tpot_s_change_at_equal_batch", 0.0, rnd(decode.rise),
                              "decode slowed less than prefill: the shared steps carry the prefill cost"),)  # fmt: skip
    mix = decode_step_mix(comparison, metrics)
    if share < 1.0 and mix is not None and mix.prefill_share is not None and mix.prefill_part > 0:
        # The decode steps carry prefill chunks too: the part of the decode time's rise that
        # costlier prefill in those steps accounts for (_steps.StepMix) is this cause's (not
        # the part from more prefill per step at the old cost: that is the work's).
        echo = stage_share(stages, "decode", regression, comparison) * mix.prefill_share
        share = min(1.0, share + echo)
        why = f"{echo:.0%} of the tail excess is decode time lost to costlier prefill in shared steps"
        extra += (Evidence("tpot_rise_from_shared_prefill_s", 0.0, rnd(mix.prefill_part), why),)
    verdict = assess_slowdown(
        cost,
        share=share,
        batch=batch_shape(metrics, comparison),
        load=load_per_replica(comparison, metrics)[0],
        load_changed=load_moved(comparison, metrics),
    )
    if verdict is None:
        return _costlier_in_every_step(mix, share, regression, comparison, metrics)
    confidence = verdict.confidence
    evidence = verdict.evidence + extra
    decode = None
    if mix is not None:
        decode_cost = engine_cost(comparison, metrics, "decode")
        # Compared on the same control as prefill's verdict: when the batch grew past every
        # equal-batch bucket, both per-token costs are read at equal prompt size alone (dev
        # 1210222: decode x3, TPOT +553 % and prefill per token +43 % at equal size, no decode
        # bucket at equal batch, and the echo read as a prefill regression).
        decode = decode_cost.shift if decode_cost.shift is not None or not verdict.size_only else decode_cost.size_shift
    floor = mix.prefill_cost_rise_floor() if mix is not None else None
    if (
        mix is not None
        and mix.decode_share is not None
        and mix.decode_share >= DECODE_LED
        and decode is not None
        and decode.z >= Z_MIN
        and (verdict.rise <= decode.rise * ECHO_MARGIN or (floor is not None and floor < MIN_SLOWDOWN))
    ):
        # A prompt is prefilled in steps that also decode the running batch: when the decode
        # work of a step rose (the step fit) and prefill per token rose no more than TPOT, the
        # slower prefill is the shared steps' echo of a decode regression. Also when it rose more
        # but the fit cannot show a prompt token surely 10 % costlier in a step (the stage
        # fallback's bar, stages._prefill_echo_owner): prompts then waited for slower steps or
        # were prefilled again after preemptions (vLLM V0, decode x2.0 at 0.31 preemptions per
        # request: prefill +120 % per token at equal batch, TPOT +83 %, g +11 % with a floor of
        # -15 %, and prefill led; dev 1280270, 1290217).
        confidence *= max(1.0 - mix.decode_share, ECHO_FLOOR)
        evidence += (Evidence("tpot_rise_from_decode_work_s", 0.0, rnd(mix.decode_part),
                              f"decode work per step rose (TPOT +{decode.rise:.0%} at equal batch): "
                              "prefill shares those steps"),)  # fmt: skip
    profile = prefill_length_profile(cost)
    if profile is not None and profile.long_only and batch_shape(metrics, comparison) is None:
        # Only the longest quarter of prompts got costlier: a smaller step budget's signature
        # (batch_composition's finding), not a slower prefill path, which costs every prompt more.
        confidence *= LONG_ONLY_DAMPING
        evidence += (Evidence("prefill_s_per_uncached_token_change_short", 0.0, rnd(profile.short.rise),
                              f"prompts up to {profile.short_tokens:.0f} uncached tokens did not slow: "
                              "a step budget, not the prefill path"),)  # fmt: skip
    bound = mix.prefill_cost_rise_bound() if mix is not None else None
    if bound is not None and bound < MIN_SLOWDOWN:
        # A slower prefill path costs every prompt token more in every step it shares; the step
        # fit bounds that below the threshold, so the prompts waited for or were spread over
        # more steps (batch_composition's finding: chunked prefill or the step budget) or behind
        # more prefill in the steps (a new tenant's longer prompts: traffic_mix's).
        confidence *= STEP_COST_FLAT_DAMPING
        evidence += (Evidence("prefill_cost_per_token_in_step_rise_bound", 0.0, rnd(bound),
                              "upper 95 % bound of a prompt token's cost rise in a step (step fit)"),)  # fmt: skip
    more_work = _more_prefill_work(comparison, metrics)
    unsure = floor is not None and floor <= 0 and not (bound is not None and bound < MIN_SLOWDOWN)
    if unsure and (verdict.size_only or more_work):
        # The step fit cannot tell a prompt token's cost in a step from unchanged, and something
        # else lengthened the prompts' steps. Read at equal prompt size only because the batch
        # grew at unchanged load, which only a slower step can do in a linear regime: near
        # saturation a little more work grows the batch too (longer steps keep more requests
        # running, whose steps grow longer still; dev 1160102: a tenant's longer prompts, batch
        # 35 -> 110, prefill +65 % per token at equal size while g rose 4 %, 95 % CI -1..+10 %).
        # Or more prefill per request arrived, and each prompt shares its steps with more of it
        # (dev 1160110: a new tenant's long prompts, uncached work x1.44, prefill per step
        # 92 -> 146 tokens, +29 % per token at equal batch while g rose 4 %, CI -4..+13 %).
        confidence *= STEP_COST_FLAT_DAMPING
        why = "more prefill per request shares the steps" if more_work else "no sure rise behind the grown batch"
        evidence += (Evidence("prefill_cost_per_token_in_step_rise_floor", 0.0, rnd(floor),
                              f"lower 95 % bound of a prompt token's cost rise in a step: {why}"),)  # fmt: skip
    if not cost.cache_known:
        confidence *= NO_CACHE_SIGNAL_DAMPING
        evidence += (Evidence("cached_tokens", None, None, "no cache signal: every prompt token counted as uncached"),)
    scope, scope_evidence = replica_scope(cost)
    return Finding(
        cause="prefill_slowdown",
        title=f"Prefill time per uncached prompt token rose {verdict.rise:.0%} at the same {verdict.control}",
        explained=latency_share(regression, verdict.explained),
        confidence=confidence,
        stage="prefill",
        scope=scope,
        evidence=evidence + scope_evidence,
        next_check=NEXT_CHECK,
    )


def _costlier_in_every_step(
    mix: StepMix | None, share: float, regression: Regression, comparison: Comparison, metrics: MetricView
) -> Finding | None:
    """A prompt token surely costlier in every step it shares, where the equal-batch buckets cannot say.

    The step fit (``tpot = a + b * running + g * prefill_per_step``, :class:`_steps.StepMix`)
    reads ``g``, a prompt token's cost in a step, from every decoding request at once; the
    equal-batch buckets read prefill per token from the requests that land in buckets both
    sides fill. A canary on two of three replicas with a saturated baseline filled 21 % of its
    requests' buckets (+21 %, z = 1.1), while ``g`` rose +50 % with a lower 95 % bound of +43 %
    and the costlier prefill held all of the steps' rise (dev 1230016, prefill x1.49: "no rule
    explains the regression"). Read only when each request brought no more uncached prompt
    tokens (longer prompts cost more per token in attention) and the fit puts most of the TPOT
    rise in costlier prefill; damped x :data:`STEP_FIT_ONLY_DAMPING` as the weaker control.
    """
    if mix is None or mix.prefill_cost is None or mix.prefill_cost_se is None:
        return None
    floor = mix.prefill_cost_rise_floor()
    if floor is None or floor < MIN_SLOWDOWN or mix.prefill_share is None or mix.prefill_share < DECODE_LED:
        return None
    if _more_prefill_work(comparison, metrics) or _a_replica_decode_led(comparison, metrics):
        return None
    g_b, g_c = mix.prefill_cost.baseline, mix.prefill_cost.candidate
    if not g_b or g_c is None or mix.prefill_cost_se <= 0:
        return None
    rise = g_c / g_b - 1.0
    z = (g_c - g_b) / mix.prefill_cost_se
    confidence = significance(z) * min(1.0, rise / FULL_SLOWDOWN) * STEP_FIT_ONLY_DAMPING
    evidence = (
        Evidence("prefill_cost_per_token_in_step_s", rnd(g_b, 8), rnd(g_c, 8),
                 f"a prompt token's cost in a decode step (step fit), z = {z:.1f}; lower 95 % bound of the rise "
                 f"{floor:+.0%}"),
        Evidence("tpot_rise_from_shared_prefill_s", 0.0, rnd(mix.prefill_part),
                 f"{mix.prefill_share:.0%} of the fitted TPOT rise is costlier prefill in shared steps"),
    )  # fmt: skip
    return Finding(
        cause="prefill_slowdown",
        title=f"Prefill: a prompt token costs {rise:.0%} more in every engine step it shares (step fit; prefill per "
        "token at equal batch did not clear its bar)",
        explained=latency_share(regression, clip01(share)),
        confidence=confidence,
        stage="prefill",
        evidence=evidence,
        next_check=NEXT_CHECK,
    )


def _a_replica_decode_led(comparison: Comparison, metrics: MetricView) -> bool:
    """Whether some replica's own step fit puts most of its TPOT rise in the decode work of a step.

    The fleet's fit pools replicas: one replica whose decode slowed (its batch piling up with
    prefill behind it) made the pooled cost of a prompt token in a step rise +1,045 % (the
    slow-host scenario: decode slower on gpu-2 alone). A slower prefill path slows no replica's
    decode work; a replica whose own fit says otherwise vetoes the pooled reading.
    """
    for value in comparison.requests.select(replica_expr().alias("r"))["r"].unique().drop_nulls().to_list():
        mix = slice_step_mix(comparison, metrics, "replica", value)
        if mix is not None and mix.decode_share is not None and mix.decode_share >= DECODE_LED:
            return True
    return False
