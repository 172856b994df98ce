"""Stage decomposition of the tail, as a fallback explanation.

Mechanism: the candidate's tail requests spent extra time somewhere; the
stage that took most of the excess points at the family of causes (queue ->
capacity or load, prefill -> prefill slowdown, decode -> decode slowdown,
gateway or dependency spans -> dependency). A stage is not a mechanism,
so this finding's confidence is damped: the specific rules (prefix cache,
batch composition, queueing, traffic mix, ...) outrank it whenever they can
name the mechanism, and it remains as the honest "where" when none can.
"""

from __future__ import annotations

from sre_agent.compare import Comparison
from sre_agent.decompose import StageDecomposition, queue_drivers, stage_drivers
from sre_agent.rules_api import Evidence, Finding, Regression

#: How much a stage-only explanation is trusted relative to a mechanism.
STAGE_ONLY_CONFIDENCE = 0.25

_CAUSE_OF_STAGE = {
    "prefill": ("prefill_slowdown", "compare prefill time per uncached prompt token at equal batch size"),
    "decode": ("decode_slowdown", "compare decode step time at equal running batch size (CUDA graphs, kernels)"),
    "dependency": ("dependency", "list the non-engine spans of the slowest traces and compare their durations"),
    "gateway": ("dependency", "compare gateway span time outside engine calls (auth, routing, network)"),
}


def stages(stages: StageDecomposition, regression: Regression, comparison: Comparison) -> Finding | None:
    """Name the stage that holds most of the tail excess, with the full decomposition as evidence."""
    if not regression.significant or not stages.shares:
        return None
    dominant = stages.dominant
    assert dominant is not None
    share = stages.shares[dominant]
    if dominant == "queue":
        # Queueing is a symptom: name what drove utilisation up (load, replicas, work, speed).
        drivers = queue_drivers(comparison.requests, comparison.window_seconds(), comparison.request_counts)
        cause = max(drivers, key=lambda d: drivers[d]) if drivers else "capacity"
        check = "compare arrival rate, replica count, tokens per request and seconds per token before and after"
    elif dominant in ("prefill", "decode"):
        # A stage took longer because requests asked for more, the cache helped less, or the engine slowed.
        drivers = stage_drivers(comparison.requests, dominant, comparison.window_seconds(), comparison.request_counts)
        cause = max(drivers, key=lambda d: drivers[d]) if drivers else _CAUSE_OF_STAGE[dominant][0]
        check = _CAUSE_OF_STAGE[dominant][1]
    else:
        cause, check = _CAUSE_OF_STAGE[dominant]
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
    return Finding(
        cause=cause,
        title=f"{share:.0%} of the {label} tail excess is {dominant} time",
        explained=share,
        confidence=STAGE_ONLY_CONFIDENCE,
        stage=dominant,
        evidence=evidence,
        next_check=check,
    )
