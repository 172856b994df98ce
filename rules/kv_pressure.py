"""KV cache near full: preemptions and recomputation rose.

Mechanism: when the paged KV cache runs out of free blocks, the scheduler
preempts running requests (vLLM ``num_preemptions``, SGLang "retracted"
requests). A preempted request goes back to the waiting queue and later
recomputes its prompt and the tokens generated so far, so queue time,
prefill and the gaps between tokens all grow for exactly those requests,
which then fill the tail.

Signals (metric stream only: released engines put no preemption count on spans):

* ``preemptions_per_request``: the preemption counter's delta within each
  window (never the raw cumulative value) divided by the window's engine
  requests (per second when the store holds no spans);
* ``kv_cache_usage`` gauge (``vllm:kv_cache_usage_perc`` / ``sglang:token_usage``):
  mean, p90 and max per window.

``explained`` (0..1): the share of the headline's tail excess that lies in
engine stages (queue + prefill + decode, from the stage decomposition),
times the share of the tail the *extra* preemptions can cover,
``min(1, extra preemptions per request / (1 - q))`` for the headline
quantile q (at p99 one extra preemption per hundred requests can make the
whole tail); when the cache filled up (p90 >= 80 % after rising 30 points),
the queue's share counts in full, since new requests then wait for free
blocks whether or not they are preempted.

``explained`` is 0 when the headline is the error rate (no latency mechanism
accounts for failed requests).

``confidence``: significance of a Poisson z score of the preemption rate
with an over-dispersion of 2 (one step preempts several requests at once),
at least 0.7 when the KV cache also filled up (p90 >= 80 % after rising 30
points or more) or each running request holds 15 % more of it than its tokens explain (a
smaller pool), times ``min(1, candidate KV p90 / 0.9)`` (the peak instead of the p90 for a
smaller pool, which fills at the window's peaks). Without a preemption counter, a KV
cache that went from below 80 % to above 95 % at p90 gives at most 0.4.

x 0.2 when the KV share one running request holds (mean usage / mean running
requests) rose by less than 15 % beyond the tokens a running request holds
(uncached prompt + half the output, weighted by the time each request held its blocks):
the cache then filled because more requests ran on the same pool (load,
capacity, slower steps) or each held more of it (a new tenant's long answers:
traffic_mix), whose rules name it, not because the pool shrank.

Scope: the replica (``host.name``, else ``service.instance.id`` on the metric
points) holding >= 80 % of the candidate's preemptions when several report.

Quiet when preemptions per request did not rise (z < 2 or below 0.002 per
request) and KV usage did not newly saturate; :class:`RuleSkipped` when
neither metric exists.
"""

from __future__ import annotations

import math
from typing import Final

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import StageDecomposition
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import Evidence, Finding, Regression, RuleSkipped, SidePair
from sre_agent.rules._load import held_tokens_per_request, kv_per_running, pool_shrank, pool_shrank_by
from sre_agent.rules._mechanism import (
    clip01,
    engine_share,
    latency_share,
    rnd,
    significance,
    tail_shares,
)

#: Counter over-dispersion: preemptions arrive in bursts, not one by one.
DISPERSION: Final[float] = 2.0
#: Smallest rise of preemptions per request worth a finding.
MIN_RISE: Final[float] = 0.002
#: KV usage (p90) at which the cache counts as full.
FULL_USAGE: Final[float] = 0.9
#: KV usage p90 (and its rise) at which the cache counts as having filled up in the candidate.
FILLED_USAGE: Final[float] = 0.8
FILLED_RISE: Final[float] = 0.3
#: Confidence floor when preemptions rose (z >= 2) and the cache filled up.
CORROBORATED_CONFIDENCE: Final[float] = 0.7
#: Share of the candidate's preemptions on one replica that confines the finding to it.
CONFINED_SHARE: Final[float] = 0.8
#: Confidence ceiling when only the usage gauge is known.
USAGE_ONLY_CONFIDENCE: Final[float] = 0.4
_ENGINE_STAGES: Final[tuple[str, ...]] = ("queue", "prefill", "decode")
#: Confidence factor when the cache filled only because more requests ran: below the stage fallback
#: (``stages.STAGE_ONLY_CONFIDENCE``), which at least names the driver that filled it.
CONSEQUENCE_DAMPING: Final[float] = 0.2

NEXT_CHECK: Final[str] = (
    "compare num_gpu_blocks / gpu_memory_utilization in the engine start-up logs before and after, and "
    "num_preemptions per replica; replay the candidate with the baseline's KV size or a lower max_num_seqs"
)


def kv_pressure(
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    stages: StageDecomposition,
    windows: dict[str, tuple[int, int, float, int]],
) -> Finding | None:
    """A ``kv_pressure`` finding when preemptions rose with a nearly full KV cache (see module docstring)."""
    has_preemptions, has_usage = metrics.has("preemptions"), metrics.has("kv_cache_usage")
    if not has_preemptions and not has_usage:
        raise RuleSkipped("no KV-cache usage gauge and no preemption counter in the metric stream")
    usage_mean, usage_p90 = metrics.gauge("kv_cache_usage", "mean"), metrics.gauge("kv_cache_usage", "p90")
    usage_max = metrics.gauge("kv_cache_usage", "max")
    evidence = [
        Evidence("kv_cache_usage_mean", rnd(usage_mean.baseline), rnd(usage_mean.candidate), "share of KV blocks used"),
        Evidence("kv_cache_usage_p90", rnd(usage_p90.baseline), rnd(usage_p90.candidate), "90th percentile"),
        Evidence("kv_cache_usage_max", rnd(usage_max.baseline), rnd(usage_max.candidate), "peak"),
    ]
    exposure = SidePair(float(windows["baseline"][3]), float(windows["candidate"][3]))
    unit = "request"
    if not exposure.baseline or not exposure.candidate:
        exposure = metrics.finished_requests()  # no request spans: the engine's latency histogram counts them
    if not exposure.baseline or not exposure.candidate:
        exposure, unit = SidePair(windows["baseline"][2], windows["candidate"][2]), "second"
    counts = metrics.counter_delta("preemptions")
    z = 0.0
    rise = 0.0
    if counts.baseline is not None and counts.candidate is not None and exposure.baseline and exposure.candidate:
        rate_b, rate_c = counts.baseline / exposure.baseline, counts.candidate / exposure.candidate
        var = DISPERSION * (
            max(counts.baseline, 1.0) / exposure.baseline**2 + max(counts.candidate, 1.0) / exposure.candidate**2
        )
        z = (rate_c - rate_b) / math.sqrt(var)
        rise = rate_c - rate_b
        evidence.insert(0, Evidence(f"preemptions_per_{unit}", rnd(rate_b, 5), rnd(rate_c, 5),
                                    f"preemption counter delta per window / {unit}s; {counts.baseline:.0f} -> "
                                    f"{counts.candidate:.0f} preemptions, z = {z:.1f}"))  # fmt: skip
    saturated = (usage_p90.candidate or 0.0) >= FULL_USAGE + 0.05 and (usage_p90.baseline or 0.0) < FULL_USAGE - 0.1
    # Two independent signals agreeing (preemptions appeared and the cache filled up) are stronger
    # evidence than the bursty preemption count alone.
    filled = (usage_p90.candidate or 0.0) >= FILLED_USAGE and (usage_p90.delta or 0.0) >= FILLED_RISE
    # So are preemptions that rose while each running request came to hold far more of the cache
    # than its tokens explain (a smaller pool, measured): 0 -> 30 preemptions at z = 3.8 with KV
    # per running request x12.5 at the same tokens was 0.23, scaled down by a p90 usage of 34 %
    # (dev 1230236, num_gpu_blocks cut). A pool that small fills at the window's peaks, not at
    # its p90: then the peak is the usage that preempts.
    if rise > 0 and z >= 2.0 and (unit == "second" or rise >= MIN_RISE):
        shrank = pool_shrank_by(comparison, metrics) is not None
        usage = (usage_max if shrank else usage_p90).candidate
        confidence = max(significance(z), CORROBORATED_CONFIDENCE if filled or shrank else 0.0) * min(
            1.0, (usage or FULL_USAGE) / FULL_USAGE
        )
        # Per second there is no request count to scale by: the engine share alone bounds it.
        coverage = clip01(rise / max(1e-9, 1.0 - regression.quantile)) if unit == "request" else 1.0
    elif not has_preemptions and saturated:
        confidence, coverage = USAGE_ONLY_CONFIDENCE, 1.0
    else:
        return None
    pool = kv_per_running(metrics)
    if pool is not None:
        evidence.append(pool[1])
        tokens = held_tokens_per_request(comparison, metrics)
        if tokens is not None:
            evidence.append(Evidence("tokens_per_running_request", rnd(tokens.baseline, 1), rnd(tokens.candidate, 1),
                                     "uncached tokens a running request holds in the cache"))  # fmt: skip
        # Longer requests hold more of the same pool each (a new tenant's long answers): only the
        # rise of KV per running request beyond the rise of tokens per request is a smaller pool.
        if not pool_shrank(metrics, tokens.ratio if tokens is not None else None):
            # The cache filled because more requests were running (more arrivals, fewer replicas,
            # slower steps keep requests longer), each using the same share of it: the pressure is
            # that mechanism's consequence, and its own rule names it.
            confidence *= CONSEQUENCE_DAMPING
    at_stake = engine_share(stages, regression, comparison)
    shares = tail_shares(stages, regression, comparison)
    engine = {s: shares.get(s, 0.0) for s in _ENGINE_STAGES}
    # A full cache also holds back admission (new requests wait for free blocks), so the queue's
    # part does not depend on how many requests were themselves preempted.
    queue_part = min(at_stake, engine["queue"]) if filled else 0.0
    explained = queue_part + (at_stake - queue_part) * coverage
    stage = max(engine, key=lambda s: engine[s]) if sum(engine.values()) > 0 else None
    scope, scope_evidence = _scope(metrics.counter_delta_by_replica("preemptions"))
    if scope_evidence is not None:
        evidence.append(scope_evidence)
    what = (
        f"preemptions per {unit} rose {evidence[0].baseline} -> {evidence[0].candidate}"
        if has_preemptions
        else "preemption counts unknown"
    )
    return Finding(
        cause="kv_pressure",
        title=f"KV cache under pressure ({what}; KV usage p90 {_pct(usage_p90.baseline)} -> "
        f"{_pct(usage_p90.candidate)}): preempted requests wait and recompute",
        explained=latency_share(regression, explained),
        confidence=confidence,
        stage=stage,
        scope=scope,
        evidence=tuple(evidence),
        next_check=NEXT_CHECK,
    )


def _scope(by_replica: dict[tuple[str, str], float]) -> tuple[dict[str, str], Evidence | None]:
    """The replica holding >= 80 % of the candidate's preemptions when several replicas report."""
    total = sum(by_replica.values())
    if len(by_replica) < 2 or total <= 0:
        return {}, None
    (key, value), top = max(by_replica.items(), key=lambda kv: kv[1])
    if top / total < CONFINED_SHARE:
        return {}, None
    evidence = Evidence(f"preemptions[{key}={value}]", None, round(top), f"{top / total:.0%} of the candidate's "
                        f"{total:.0f} preemptions on {len(by_replica)} replicas")  # fmt: skip
    return {key: value}, evidence


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"
