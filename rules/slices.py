"""Slice localisation as a finding: one host, model, tenant or route holds the regression.

Mechanism: a fault confined to one replica (a bad GPU, a noisy neighbour, a
misconfigured pod) or one kind of request makes that slice's requests slow
while the rest stay as they were; the candidate's excess slow requests then
concentrate in the slice far beyond its share of traffic
(:mod:`sre_agent.analysis.localise`). Why the slice is slow is read from the same
stage decomposition restricted to the slice; a slice that did not get slower
itself but grew its share of traffic is a mix change instead.
"""

from __future__ import annotations

import polars as pl

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import queue_drivers, stage_decomposition, stage_drivers
from sre_agent.analysis.localise import Localisation
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import Evidence, Finding, Regression
from sre_agent.rules._engine_cost import MIN_SLOWDOWN
from sre_agent.rules._mechanism import uncached_tokens, wide_enough
from sre_agent.rules._steps import DECODE_LED, StepMix, slice_step_mix

#: The engine slowdowns a slice's own step fit tells apart (:func:`_whose_steps`).
_SLOWDOWNS = frozenset({"decode_slowdown", "prefill_slowdown"})
#: A slice-level stage explanation is localisation plus a stage, not a mechanism: damp it.
SLICE_CONFIDENCE = 0.6

_STAGE_CAUSE = {
    "prefill": ("prefill_slowdown", "compare prefill time per uncached prompt token on this slice with the others"),
    "decode": (
        "decode_slowdown",
        "compare decode step time on this slice with the others at equal batch size "
        "(GPU clocks, CUDA graphs, kernels, noisy neighbours)",
    ),
    "dependency": ("dependency", "list the non-engine spans of this slice's slowest traces"),
    "gateway": ("dependency", "compare gateway time for this slice (auth, routing, network path)"),
}


def slices(
    regression: Regression, localisation: Localisation, comparison: Comparison, metrics: MetricView | None = None
) -> Finding | None:
    """The slice that holds the regression, with the mechanism its own stages point at.

    The slice's uncached prompt tokens take the fleet's hit rate from the counters where its
    spans carry no cached-token count (``_mechanism.uncached_tokens``): a slice is no place to
    read a cache that stopped hitting as a slower prefill.
    """
    if not regression.significant or not localisation.scope or localisation.best is None:
        return None
    best = localisation.best
    scope = dict(localisation.scope)
    label = ", ".join(f"{k}={v}" for k, v in scope.items())
    evidence = [
        Evidence(
            "traffic_share",
            round(best.traffic_baseline, 4),
            round(best.traffic_candidate, 4),
            f"share of requests with {best.dimension}={best.value}",
        ),
        Evidence(
            "slow_rate",
            round(best.slow_rate_baseline, 4),
            round(best.slow_rate_candidate, 4),
            f"share of the slice's requests above the baseline's {regression.metric} "
            f"p{round(regression.quantile * 100)} ({localisation.threshold_s:.4g} s)",
        ),
        Evidence("excess_slow_share", None, round(best.excess_share, 4), "the slice's part of the extra slow requests"),
    ]
    strength = min(1.0, best.z / 6.0)
    grew = best.traffic_baseline > 0 and best.traffic_candidate / best.traffic_baseline >= 1.3
    own_rate_rose = best.slow_rate_candidate > 1.5 * max(best.slow_rate_baseline, 1e-9)
    if grew and not own_rate_rose:
        return Finding(
            cause="traffic_mix",
            title=f"More traffic from a slow slice: {label} grew from {best.traffic_baseline:.0%} to "
            f"{best.traffic_candidate:.0%} of requests and holds {best.excess_share:.0%} of the extra slow requests",
            explained=best.excess_share,
            confidence=SLICE_CONFIDENCE * strength,
            scope=scope,
            evidence=tuple(evidence),
            next_check=f"compare {best.dimension}={best.value}'s request lengths and rate before and after; "
            "replay the baseline with the candidate's mix",
        )
    # The slice's requests by the dimension that scored it: the scope's other attributes name the
    # same candidate requests, but one may exist on the candidate side alone (a version deployed
    # to that replica only), and filtering by it leaves the slice no baseline to compare with
    # (dev 1230269: prefill x1.55 on replica-2 with its own version, read as `capacity` by default).
    expr = pl.col(best.dimension).cast(pl.String).fill_null("(missing)") == best.value
    # A slice's tail is thinner than the fleet's: its p99 of 270 requests holds 4 (dev 1230269).
    decomposition = wide_enough(stage_decomposition(comparison, regression, expr), regression, comparison, expr)
    stage = decomposition.dominant
    if stage is None:
        return None
    share = decomposition.shares[stage]
    evidence.extend(
        Evidence(
            f"slice_tail_mean_{s}_s",
            round(decomposition.baseline.get(s, 0.0), 6),
            round(decomposition.candidate.get(s, 0.0), 6),
            f"{decomposition.shares.get(s, 0.0):.0%} of the slice's tail excess",
        )
        for s in decomposition.baseline
    )
    drivers: dict[str, float] = {}
    if stage == "queue":
        # The slice queues: name what drove its utilisation up (its load, its speed, its work).
        part = comparison.requests.filter(expr)
        drivers = queue_drivers(
            part, comparison.window_seconds(), comparison.scaled_counts(part), uncached_tokens(comparison, metrics)
        )
        cause = max(drivers, key=lambda d: drivers[d]) if drivers else "capacity"
        check = (
            f"compare arrival rate, running requests and seconds per token on {label} with the other slices; "
            "check its scheduler limits"
        )
    else:
        cause, check = _STAGE_CAUSE[stage]
        if stage in ("prefill", "decode"):
            part = comparison.requests.filter(expr)
            drivers = stage_drivers(
                part,
                stage,
                comparison.window_seconds(),
                comparison.scaled_counts(part),
                uncached_tokens(comparison, metrics),
            )
            cause = max(drivers, key=lambda d: drivers[d]) if drivers else cause
    if cause in _SLOWDOWNS:
        cause = _whose_steps(cause, drivers, slice_step_mix(comparison, metrics, best.dimension, best.value))
    return Finding(
        cause=cause,
        title=f"The regression is confined to {label}: {best.excess_share:.0%} of the extra slow requests on "
        f"{best.traffic_candidate:.0%} of the traffic, mostly {stage} time",
        explained=best.excess_share * share,
        confidence=SLICE_CONFIDENCE * strength,
        stage=stage,
        scope=scope,
        evidence=tuple(evidence),
        next_check=check,
    )


def _whose_steps(cause: str, drivers: dict[str, float], mix: StepMix | None) -> str:
    """A slice's engine slowdown named by its own step fit: costlier prefill, slower decode work, or neither.

    One replica's prefill and decode share its steps, so each stage's raw time per token rises
    with the other's: prefill x1.55 on replica-2 alone raised its TPOT x2.4 and its prefill per
    token x1.4, and the larger raw driver named decode (dev 1230269). The fit on that replica's
    own requests (``mix``, :func:`_steps.slice_step_mix`) says whose rise it is: most of it in a prompt token's
    cost in a step, surely up by :data:`MIN_SLOWDOWN`, is prefill's; most in the decode work of a
    step is decode's. When it is neither, the raw rise is the batch that grew around the steps,
    and the slice's largest other driver names it (dev 1220117: arrivals x2 with one replica of
    three taking the surge, its TPOT up with a batch 36 -> 229 while the decode work held 37 % of
    the fitted rise: `load`, not `decode_slowdown`). Other causes, and a fit that cannot be made,
    keep the raw reading. Called for the two slowdowns only.
    """
    if mix is None:
        return cause
    floor = mix.prefill_cost_rise_floor()
    prefill_led = mix.prefill_share is not None and mix.prefill_share >= DECODE_LED
    if prefill_led and floor is not None and floor >= MIN_SLOWDOWN:
        return "prefill_slowdown"
    if mix.decode_share is not None and mix.decode_share >= DECODE_LED:
        return "decode_slowdown"
    others = {d: v for d, v in drivers.items() if d not in _SLOWDOWNS}
    return max(others, key=lambda d: others[d]) if others else cause
