"""Offered load per replica and the KV cache's hold on the running batch, for the engine rules.

Not a rule (nothing registers it). Apart from :mod:`sre_agent.rules._engine_cost`
because these read arrivals and the metric stream, not the per-request cost at
equal batch, and the queue-side rules (``queueing``, ``kv_pressure``,
``engine_metrics``, ``prefix_cache``) use them without it:

* :func:`load_per_replica` / :func:`load_moved`: whether the offered load per
  replica stayed put (within :data:`SAME_LOAD`).
* :func:`kv_limited` / :func:`kv_per_running`: whether free KV blocks rather
  than a slot cap hold the running batch down, and whether the pool shrank.
* :func:`cap_binds` / :func:`admission_limited`: whether a lower running count under a
  backlog is a cap at all, or requests wait for the engine to take them in.
* :func:`service_time_queue_share`: whether, at that same load, a slower step
  explains the queue.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import polars as pl

from sre_agent.analysis.compare import SIDES
from sre_agent.analysis.decompose import replicas_expr
from sre_agent.analysis.rules_api import Evidence, Regression, SidePair
from sre_agent.rules._mechanism import (
    LOAD_Z,
    PER_TOKEN_METRICS,
    clip01,
    metric_hit_rate,
    per_request,
    rnd,
    side_means,
    tail_shares,
    uncached_tokens,
)

if TYPE_CHECKING:
    from sre_agent.analysis.compare import Comparison
    from sre_agent.analysis.decompose import StageDecomposition
    from sre_agent.analysis.metric_view import MetricView

#: Relative change of offered load per replica still counted as the same load.
SAME_LOAD: Final[float] = 0.10


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
        per_side = frame.group_by("side").agg(replicas_expr().alias("n"))
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


# ------------------------------------------------------------------ KV cache
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


#: Share of the candidate's backlog scrapes at one running count that makes it a cap (MetricView.cap_binds).
CAP_BINDS: Final[float] = 0.5
#: How full the replicas must run where requests wait for a cap to hold them back (MetricView.running_at_queues):
#: cuts of max_num_seqs read 0.95-1.0; slow admission and chance peaks 0.49-0.82.
CAP_AT_PEAK: Final[float] = 0.9


def cap_binds(metrics: MetricView) -> bool:
    """Whether the candidate's running count under a backlog sits at one value, as under a cap.

    At a running cap (``max_num_seqs``) the gauge reads the cap while a queue waits; spread
    below its peak, the engine admits slowly instead (a smaller token budget splits each prompt
    over more steps; dev 1160081: budget 4096 -> 512, peak 49 -> 12, 30 % of the queued scrapes'
    running counts at one value; 1160188, 4096 -> 256: 35 %; 1160080: 30 %; max_num_seqs cuts
    1140136, 1160283 and 1140055: 95 %, 75 % and 50 %, the rest of the last being requests the old
    cap admitted before a hot swap).
    And where requests waited the replicas ran full: at least :data:`CAP_AT_PEAK` of their own
    peak, weighted by the requests waiting (:meth:`MetricView.running_at_queues`); a queue
    below the peak waits for something other than a slot.
    Not when fewer than :data:`~sre_agent.analysis.metric_view.MIN_BACKLOG_SCRAPES` scrapes had a
    queue: a cap that binds keeps requests waiting, and one queued scrape at a replica's peak is
    that peak's own moment (dev 1280101: a new tenant's long prompts, one scrape with requests
    waiting in 300 s, peak 11 -> 9 read as "max running fell while requests wait").
    """
    share = metrics.cap_binds().candidate
    if share is None or share < CAP_BINDS:
        return False
    full = metrics.running_at_queues().candidate
    return full is None or full >= CAP_AT_PEAK


def admission_limited(metrics: MetricView, requests: Mapping[str, int]) -> bool:
    """Whether the candidate's requests waited while the engine ran fewer than a cap would hold.

    Known only from the gauges: enough scrapes with requests waiting, their running counts
    spread (no cap binds, :func:`cap_binds`), and KV blocks not the limit (:func:`kv_limited`).
    The engine then admits no faster than its steps take prompts in.
    """
    measured = metrics.cap_binds().candidate is not None
    return measured and not cap_binds(metrics) and not kv_limited(metrics, requests)


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


#: Held tokens per request per comparison: kv_pressure, prefix_cache and the stage fallback all ask.
_HELD_CACHE: weakref.WeakKeyDictionary[Comparison, tuple[SidePair | None]] = weakref.WeakKeyDictionary()


def held_tokens_per_request(comparison: Comparison, metrics: MetricView) -> SidePair | None:
    """:func:`_held_tokens_per_request`, once per comparison (its metrics are the comparison's)."""
    if comparison not in _HELD_CACHE:
        _HELD_CACHE[comparison] = (_held_tokens_per_request(comparison, metrics),)
    return _HELD_CACHE[comparison][0]


def _held_tokens_per_request(comparison: Comparison, metrics: MetricView) -> SidePair | None:
    """Tokens a running request holds in the cache on its own, on each side; ``None`` when neither side can say.

    From engine spans: uncached prompt + half the output (the context grows over the decode),
    averaged over the running requests, i.e. weighted by the time each held its blocks
    (scheduled to finished): a long answer is running for longer, so it is more of the running
    population than of the requests. A prompt's cached prefix is held once for every request
    sharing it, so a cache that stopped hitting gives each request its own copy: more of the
    pool each, from the same pool (dev 1150164: KV per running request x1.58, hit rate 34 % ->
    4 %, prompts unchanged). Without spans: uncached prompt + generation counters per finished request.
    """
    frame = comparison.requests
    if frame.height:
        held = (pl.col("e2e_s") - pl.col("queue_s").fill_null(0.0)).clip(0.0)
        context = uncached_tokens(comparison, metrics) + pl.col("output_tokens").fill_null(0) / 2
        means = {
            str(r["side"]): r["t"]
            for r in frame.filter(held.is_not_null())
            .group_by("side")
            .agg(((context * held).sum() / held.sum()).alias("t"))
            .to_dicts()
        }
        pair = SidePair(means.get("baseline"), means.get("candidate"))
    else:
        pair = _private_tokens_from_counters(metrics)
    return pair if pair.ratio is not None else None


def _private_tokens_from_counters(metrics: MetricView) -> SidePair:
    """Uncached prompt + generation tokens per finished request, from the counters (no spans).

    The prompt counter counts cached tokens too; the side's hit rate takes them out as
    ``uncached_tokens`` does for spans, when the hit rate is known.
    """
    done = metrics.finished_requests()
    hit = metric_hit_rate(metrics, {"baseline": int(done.baseline or 0), "candidate": int(done.candidate or 0)})
    return metrics.tokens_per_request(done, cached_share=hit[0] if hit is not None else None)


def pool_shrank(metrics: MetricView, longer: float | None = None) -> bool:
    """Whether each running request came to hold more of the KV cache than its tokens explain.

    ``longer``: candidate / baseline tokens a request holds (longer contexts hold more of the same
    pool). True when the share rose by :data:`POOL_SHRANK` beyond that (a smaller pool: KV pressure
    is a mechanism of its own), or cannot be measured; False when the cache filled only because
    more requests ran at once (more arrivals, fewer replicas, slower steps), its consequence.
    """
    pool = kv_per_running(metrics)
    return pool is None or pool[0] / max(longer or 1.0, 1.0) >= POOL_SHRANK


def pool_shrank_by(comparison: Comparison, metrics: MetricView) -> float | None:
    """How much more of the KV cache a running request holds than its own tokens explain, when >= POOL_SHRANK.

    ``None`` when that cannot be measured or stayed below :data:`POOL_SHRANK`
    (a lost cache gives each request its own copy of the prefix: the tokens it holds rise as much).
    """
    pool = kv_per_running(metrics)
    tokens = held_tokens_per_request(comparison, metrics)
    if pool is None or tokens is None or tokens.ratio is None:
        return None
    beyond = pool[0] / max(tokens.ratio, 1.0)
    return beyond if beyond >= POOL_SHRANK else None


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
    # When preemptions rose and each running request held the same share of the cache as before,
    # the pool filled because slower steps kept more requests running: the preemptions are this
    # slowdown's consequence and the queue is still its doing (pool_shrank). A request's share
    # is measured against the tokens it holds privately (shared prefix blocks count once): a
    # prefix cache that stopped hitting gives each request its own copy (dev 1090098: KV per
    # running request x1.29 with private tokens x1.25), which is no smaller pool.
    if per_b is not None and per_c is not None and per_c - per_b >= PREEMPTION_RISE:
        private = side_means(
            comparison.requests,
            private=uncached_tokens(comparison, metrics) + pl.col("output_tokens").fill_null(0),
        )["private"]
        if pool_shrank(metrics, private.ratio):
            return 0.0
    return queue


#: The engine's latency histogram a headline's queue share is read against, by headline metric.
_HEADLINE_HISTOGRAM: Final[dict[str, str]] = {"ttft": "ttft_seconds", "e2e": "e2e_seconds", "trace": "e2e_seconds"}


def metric_queue_share(comparison: Comparison, regression: Regression, metrics: MetricView) -> float:
    """Without engine spans: the queue's share of the headline's excess from the engines' histograms, at the same load.

    The metric twin of :func:`service_time_queue_share` for stores with engine metrics but no
    engine request spans (gateway spans, metrics only): means are additive where quantiles are
    not, so the share is the rise of the mean queue time (``queue_seconds``) over the rise of the
    mean of the headline's own histogram (TTFT, else e2e), 0..1. Only at an offered load per
    replica that did not move and without preemptions from a smaller pool (as there); 0 for
    per-token headlines and without both histograms (dev 1210224: a template that broke the
    prefix cache at a saturated baseline; mean queue time 1.2 -> 10.5 s of TTFT's 2.3 -> 11.1 s).
    """
    signal = _HEADLINE_HISTOGRAM.get(regression.metric)
    if signal is None or load_moved(comparison, metrics) is not False:
        return 0.0
    queue, total = metrics.histogram("queue_seconds"), metrics.histogram(signal)
    means = [(h.mean if h is not None and h.count else None) for h in (*queue.values(), *total.values())]
    if any(m is None for m in means):
        return 0.0
    q_b, q_c, t_b, t_c = (float(m) for m in means)  # type: ignore[arg-type]
    if t_c - t_b <= 0 or q_c - q_b <= 0:
        return 0.0
    preemptions = metrics.counter_delta("preemptions")
    finished = [h.count if h is not None else 0 for h in total.values()]
    per_b, per_c = per_request(preemptions.baseline, finished[0]), per_request(preemptions.candidate, finished[1])
    if per_b is not None and per_c is not None and per_c - per_b >= PREEMPTION_RISE and pool_shrank(metrics):
        return 0.0
    return clip01((q_c - q_b) / (t_c - t_b))


__all__ = [
    "KV_FULL",
    "POOL_SHRANK",
    "PREEMPTION_RISE",
    "SAME_LOAD",
    "kv_limited",
    "kv_per_running",
    "held_tokens_per_request",
    "load_moved",
    "load_per_replica",
    "metric_queue_share",
    "pool_shrank",
    "pool_shrank_by",
    "service_time_queue_share",
]
