"""Load, capacity or a slower engine step, read from the engine's own metric stream.

For telemetry without engine request spans (metrics only, or gateway spans plus
engine metrics) the span rules cannot split stages or compare costs at equal
batch; the metric stream still carries the three quantities Little's law needs
per replica. Per side:

* arrivals ``lambda``: the gateway's root spans starting per second when both
  windows have them; else requests finished per second (the count of the e2e
  latency histogram, else the TTFT histogram, over the window's seconds), which
  is throughput and lags arrivals while a backlog builds or drains;
* replicas ``R``: instances that finished requests in the window (a drained
  replica may keep exporting frozen counters); the peak of the running
  gauge is the effective running-request cap (``max_num_seqs``);
* work per request: prompt + generation tokens (counter deltas) per request;
* step time: the mean inter-token latency (ITL histogram).

Mechanisms, each with what must stay flat:

* ``load``: ``lambda`` rose (>= 15 %, Poisson z >= 3 with an over-dispersion
  of 4 for bursty arrivals, or against the spread of per-scrape counts where
  wider: :func:`_block_spread`) with replicas unchanged;
* ``capacity``: replicas fell by >= 10 % (or the running cap fell while
  requests waited) with ``lambda`` within 15 %, or with finished requests per
  second (throughput) fallen while a backlog built (the waiting gauge at least
  doubled, to 2 or more): the requests kept arriving faster than they were served;
* ``decode_slowdown``: mean ITL rose >= 15 % while the offered load per replica
  (``lambda / R``: within 15 %, or the same replicas and a ``lambda`` change within
  noise as above), work per request (within 20 %), preemptions per request and
  the prefix-cache hit rate stayed flat (those rises are ``load``/``capacity``,
  ``traffic_mix``, ``kv_pressure`` and ``prefix_cache``, whose own rules read
  them). A slower step raises the running batch too (Little's law), so the
  running gauge is evidence, not a test; and so do more arrivals, so an arrival
  rate risen 15 % or more at 2 <= z < 3 (neither noise nor measured) is named
  beside it as ``load``, its confidence scaled by z / 3.

``explained`` (0..1): the finding's log driver (``log lambda ratio``,
``-log R ratio``, ``log ITL ratio``) over the sum of every driver that moved;
the driver is not compared with the headline's ratio, because queueing is
convex (15 % more arrivals can triple a p99). ``confidence``: 0.8 x
``min(1, relative change / 0.3)``; exact metric totals have no per-request
variance, so this rule never outranks a span rule that measured the same
mechanism: it runs when no engine request spans exist on either side, or when the
headline was measured by the metric stream alone (an ITL histogram's p99 whose
per-request TPOT twin did not move: dev 1140095, arrivals x2.0, ITL p99 x2.7 and no
finding), the span rules having nothing of it to decompose. Arrivals are then the
engine request spans starting per window.

Scope (``decode_slowdown``): the replica whose mean ITL ratio is >= 1.15 while
every peer's rose at most a third as much (per-replica ITL histograms, >= 1,000
tokens a side, at least two peers). Such a replica is a ``decode_slowdown`` finding
even when the fleet's mean ITL rose less than 15 % (one replica of six carries a
sixth of the tokens), its own rise the change, at half the confidence.

Quiet when the headline did not regress or nothing moved; :class:`RuleSkipped`
when engine request spans exist and measured the headline (the span rules decide) or
the metric stream lacks the running gauge and latency histograms.
"""

from __future__ import annotations

import math
from typing import Final

from sre_agent.analysis import stats
from sre_agent.analysis.compare import SIDES, Comparison
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import Evidence, Finding, MetricEstimate, Regression, RuleSkipped, SidePair
from sre_agent.rules._load import pool_shrank
from sre_agent.rules._mechanism import clip01, metric_hit_rate, rnd
from sre_agent.rules._replica_scope import MIN_PEERS, REST_SHARE
from sre_agent.rules._steps import metric_step, slot_cap_binds

#: What to check next for a decode reading (the fleet's mean, one replica's, or the step fit's).
DECODE_NEXT_CHECK: Final[str] = (
    "compare decode step time at equal running batch before and after (a fixed-batch benchmark); check "
    "CUDA-graph capture sizes, enforce_eager, attention backend and kernel versions in the new image"
)
#: Relative change of arrivals (or of mean ITL) that counts as a rise.
MIN_RISE: Final[float] = 0.15
#: Relative fall of replicas or of the running cap that counts as less capacity.
MIN_FALL: Final[float] = 0.10
#: Work per request may move this much before a step-time rise is left to ``traffic_mix``.
SAME_WORK: Final[float] = 0.20
#: Poisson z needed for an arrival-rate change, after over-dispersion.
MIN_Z: Final[float] = 3.0
#: Variance inflation of request counts: arrivals come in bursts (Azure code: CV 13).
DISPERSION: Final[float] = 4.0
#: Poisson z below which an arrival-rate change is plainly noise; between it and :data:`MIN_Z` the
#: arrivals rose by as much as a slower step would need to explain, and both readings are named.
NOISE_Z: Final[float] = 2.0
#: Hit-rate fall (points) and preemptions per request rise that belong to other mechanisms.
HIT_RATE_FALL: Final[float] = 0.05
PREEMPTION_RISE: Final[float] = 0.002
CONFIDENCE: Final[float] = 0.8
#: Confidence factor when engine request spans exist (the headline was the metric stream's alone):
#: the span rules' per-request readings, where they found a mechanism, are the better evidence
#: (1140148, 1140271: this rule's 0.80 and 0.67 led span findings at 0.60 and 0.55 that were right;
#: 1050140: its mean-ITL reading led the span rule's median-step one, 0.26). An aggregate reading
#: beside spans ranks with the stage fallback (0.25): first only where no span rule found anything.
BESIDE_SPANS: Final[float] = 0.25
#: Mean waiting requests the candidate must reach (and at least double) to count as a backlog that built.
BACKLOG: Final[float] = 2.0
#: Confidence factor of a decode slowdown read on one replica whose fleet's mean ITL stayed within 15 %.
ONE_REPLICA: Final[float] = 0.5
#: Inter-token latencies a replica must have observed on each side to be compared with its peers.
MIN_REPLICA_TOKENS: Final[int] = 1000


def _engine_spans(comparison: Comparison) -> bool:
    """Whether both windows have engine request spans."""
    return all(comparison.request_counts.get(s, 0) > 0 for s in SIDES)


def _arrivals_counted(comparison: Comparison) -> bool:
    """Whether arrivals (not finished requests) are counted: engine request spans or the gateway's root spans."""
    return _engine_spans(comparison) or all(comparison.root_histograms[s].n > 0 for s in SIDES)


def _measured_by_spans(regression: Regression, estimates: list[MetricEstimate]) -> bool:
    """Whether the headline was estimated from spans (not only from the metric stream's histograms)."""
    return not any(
        e.name == regression.metric and e.quantile == regression.quantile and e.source == "metrics" for e in estimates
    )


def _requests(
    comparison: Comparison, metrics: MetricView, windows: dict[str, tuple[int, int, float, int]]
) -> tuple[SidePair, SidePair, str]:
    """(requests, requests per second, what was counted) per side.

    Arrivals are counted where requests arrive: the gateway's root spans by their start, when
    both windows have them. The engine's latency histograms count requests that *finished*,
    which under a backlog is the engine's throughput, not its offered load: a baseline still
    draining a queue finishes fewer requests than arrive, and the next window's catch-up
    then reads as more arrivals. Without root spans, arrivals are the finished requests plus
    the growth of the waiting gauge over the window (:meth:`MetricView.gauge_change`).
    """
    if _engine_spans(comparison):
        counts = SidePair(float(windows["baseline"][3]), float(windows["candidate"][3]))
        how = "engine request spans starting per second of window"
    elif _arrivals_counted(comparison):
        roots = comparison.root_histograms
        counts = SidePair(float(roots["baseline"].n), float(roots["candidate"].n))
        how = "gateway root spans (logical requests) starting per second of window"
    else:
        counts = metrics.finished_requests()
        how = "latency-histogram count (finished requests) per second of window"
        backlog = metrics.gauge_change("waiting_requests")
        if None not in (counts.baseline, counts.candidate, backlog.baseline, backlog.candidate):
            # Requests that arrived = requests finished + how many more waited at the end than at the
            # start. A saturated engine finishes no more than it can while a backlog builds (dev
            # 1110034: arrivals x2.0, finished x1.13, waiting 2 -> 246 on average), and one draining
            # a backlog finishes more than arrive. The running gauge's change is left out: the
            # engine's slots bound it, so it is a few requests of endpoint noise, not a trend.
            counts = SidePair(
                max(0.0, (counts.baseline or 0.0) + (backlog.baseline or 0.0)),
                max(0.0, (counts.candidate or 0.0) + (backlog.candidate or 0.0)),
            )
            how = "finished requests + growth of the waiting gauge, per second of window"
    if counts.baseline is None or counts.candidate is None:
        return counts, SidePair(None, None), how
    rate = SidePair(counts.baseline / windows["baseline"][2], counts.candidate / windows["candidate"][2])
    return counts, rate, how


#: Fewest scrape intervals per side whose spread measures how bursty the requests came.
MIN_BLOCKS: Final[int] = 4


def _block_spread(metrics: MetricView, seconds: list[float]) -> float:
    """Standard error of the change in requests per second, from the spread of per-scrape counts.

    :data:`DISPERSION` assumes bursts; a trace burstier than that moves a short window's count
    by more. Each side's rate is the mean of its per-scrape-interval rates (empty intervals
    included) and its variance that mean's sampling variance, as the span path measures it
    (:attr:`Comparison.arrival_change_z`). On Azure's code trace a metrics-only baseline of
    195 s held one burst of 32 requests in 12 scrapes and the candidate four: x5.8 read at
    Poisson z 5.2 as "offered load rose 475 %" (dev 1280287), where the bursts give z 1.4.
    0 when a side has fewer than :data:`MIN_BLOCKS` intervals (the assumed dispersion stands).
    """
    blocks = metrics.finished_per_block()
    if blocks is None or min(len(b) for b in blocks) < MIN_BLOCKS:
        return 0.0
    return math.sqrt(sum(stats.rate_moments(c, secs)[1] for c, secs in zip(blocks, seconds, strict=True)))


def _per(total: SidePair, count: SidePair) -> SidePair:
    values = [
        None if t is None or not n else t / n
        for t, n in ((total.baseline, count.baseline), (total.candidate, count.candidate))
    ]
    return SidePair(values[0], values[1])


def _log(ratio: float | None) -> float:
    return math.log(ratio) if ratio is not None and ratio > 0 else 0.0


def engine_metrics(
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    windows: dict[str, tuple[int, int, float, int]],
    estimates: list[MetricEstimate],
) -> list[Finding]:
    """``load``, ``capacity`` or ``decode_slowdown`` from the metric stream alone (see module docstring)."""
    spans = any(comparison.request_counts.get(s, 0) > 0 for s in SIDES)
    if spans and _measured_by_spans(regression, estimates):
        raise RuleSkipped("engine request spans present: the span rules read these mechanisms")
    if not metrics.has("running_requests") or not metrics.has_latency_histograms():
        raise RuleSkipped("no running gauge or latency histograms in the metric stream")
    if not regression.significant or regression.metric == "error_rate":
        return []
    counts, rate, counted = _requests(comparison, metrics, windows)
    replicas = metrics.serving_replicas()
    if rate.ratio is None or replicas.ratio is None or counts.baseline is None or counts.candidate is None:
        return []
    running, running_max = metrics.running_per_replica(), metrics.gauge("running_requests", "max")
    waiting = metrics.gauge("waiting_requests")
    # Per-request work and preemptions divide the engine's own counters by the requests the
    # engine finished in the same window, whatever counted the arrivals.
    finished = metrics.finished_requests()
    done = finished if finished.baseline and finished.candidate else counts
    work = metrics.tokens_per_request(done)
    preempt = _per(metrics.counter_delta("preemptions"), done)
    itl = metrics.histogram("itl_seconds")
    itl_mean = SidePair(*(h.mean if h is not None else None for h in (itl["baseline"], itl["candidate"])))
    served = {"baseline": int(done.baseline or 0), "candidate": int(done.candidate or 0)}
    hit = metric_hit_rate(metrics, served)

    secs = [windows[s][2] for s in SIDES]
    se = math.sqrt(DISPERSION * (counts.baseline / secs[0] ** 2 + counts.candidate / secs[1] ** 2))
    if not (_engine_spans(comparison) or _arrivals_counted(comparison)):
        se = max(se, _block_spread(metrics, secs))
    rate_z = ((rate.candidate or 0.0) - (rate.baseline or 0.0)) / se if se > 0 else 0.0
    rate_moved = rate.ratio >= 1 + MIN_RISE and rate_z >= MIN_Z
    rate_flat = abs(rate.ratio - 1) < MIN_RISE or abs(rate_z) < MIN_Z
    # Finished requests per second are throughput. When it fell while a backlog built (the
    # waiting gauge at least doubled, to BACKLOG or more), the requests kept arriving faster
    # than they were served: arrivals did not fall with it (1 of 3 replicas removed, metrics
    # only: throughput -23 %, waiting 0.3 -> 65).
    backlog = (waiting.candidate or 0.0) >= max(BACKLOG, 2 * (waiting.baseline or 0.0))
    throughput_fell_under_backlog = not _arrivals_counted(comparison) and rate.ratio < 1 and backlog
    load_per_replica = rate.ratio / replicas.ratio
    # Flat per replica: within 15 %, or the same replicas and an arrival change within noise
    # (bursty traffic moves a short window's rate by 20 % at z < 3).
    per_replica_flat = abs(load_per_replica - 1) < MIN_RISE or (rate_flat and abs(replicas.ratio - 1) < MIN_RISE)
    cache_lost = hit is not None and (hit[0].baseline or 0.0) - (hit[0].candidate or 0.0) >= HIT_RATE_FALL
    # Preemptions are KV pressure's own mechanism only when each running request holds more of
    # the cache; when more requests merely ran at once at the same load and work (1090211:
    # ITL x3.0, running x2.5, KV share per request flat), they are the slower steps' echo.
    pool_pressure = (
        preempt.baseline is not None
        and (preempt.candidate or 0.0) - preempt.baseline >= PREEMPTION_RISE
        and pool_shrank(metrics, work.ratio)
    )
    other_mechanism = bool(cache_lost or pool_pressure or (work.ratio is not None and abs(work.ratio - 1) > SAME_WORK))

    # The running cap, where the engine saturates: the running gauge while requests wait on the
    # same replica, against the baseline's own saturation, else the most it ran at all. The peak
    # alone misses a cut at a hot swap, when the old cap's requests still run at the first scrape
    # (dev 1140136: max_num_seqs 64 -> 4, peak 26 -> 44, running under a backlog 4).
    # A lower saturation level is a cap only when each running request holds the same work: with more
    # of every prompt prefilled again (a lost prefix cache, 1150026: hit rate 29 % -> 0, running
    # where requests waited 28 -> 21.5) fewer requests fit the same engine, which is the cache's.
    under = metrics.running_under_backlog()
    reference = under.baseline if under.baseline is not None else running_max.baseline
    same_work = not other_mechanism
    cap_ratio = under.candidate / reference if under.candidate is not None and reference and same_work else None
    # Beside engine spans (a headline only the metric stream measured) a lower peak is a cap only
    # under a backlog: a peak 9 -> 8 with 0.19 -> 0.23 waiting led a dependency slowdown (1150149).
    peak = running_max.ratio if not spans or backlog else None
    lower_cap = min(r for r in (peak, cap_ratio, 1.0) if r is not None)
    # Only a cap that binds (spread below its peak, the engine admits slowly: _load.cap_binds).
    cap_fell = (
        lower_cap <= 1 - MIN_FALL
        and (waiting.candidate or 0.0) > (waiting.baseline or 0.0)
        and slot_cap_binds(metrics, comparison, {"baseline": int(counts.baseline), "candidate": int(counts.candidate)})
    )

    # Arrivals counted at the gateway are the offered load whatever the replicas did, so a rise there
    # is load even while replicas fell (a rolling restart during a traffic surge: arrivals x2.0,
    # replicas 4 -> 3.6 on average, and neither driver was named; dev 1100164), and both drivers
    # share the excess. Counted as finished requests, a rate is throughput: fewer replicas cannot
    # raise it, so a rise is still more arrivals, unless the waiting gauge fell (the engines
    # finished a backlog faster than requests came; dev 1090294: finished x2.0, replicas 6 -> 5.2,
    # waiting 0.19 -> 0.59). Capacity then needs a flat rate.
    arrivals = _arrivals_counted(comparison)
    fewer = replicas.ratio <= 1 - MIN_FALL
    drained = (waiting.candidate or 0.0) < (waiting.baseline or 0.0)
    terms: dict[str, float] = {}
    load_within_noise = 1.0  # the load finding's confidence factor when its rise is within noise
    if comparison.windows_overlap:
        # Two versions serving side by side (a canary split): each side's replicas are the version's
        # by design, so its offered load is per replica (dev 1200131: a canary on 2 of 3 replicas
        # with 0.92 against 0.52 req/s read as load up 78 %, 0.48 against 0.52 per replica).
        if rate_moved and load_per_replica >= 1 + MIN_RISE:
            terms["load"] = _log(load_per_replica)
    else:
        if rate_moved and (arrivals or not fewer or not drained):
            terms["load"] = _log(rate.ratio)
        if (rate_flat or throughput_fell_under_backlog or arrivals) and (fewer or cap_fell):
            terms["capacity"] = -_log(replicas.ratio) + (-_log(lower_cap) if cap_fell else 0.0)
    if comparison.windows_overlap and cap_fell:
        terms["capacity"] = -_log(lower_cap)
    slowest = _slowest_replica(metrics) if per_replica_flat and not other_mechanism else None
    alone = False  # the decode reading is one replica's: the fleet's mean ITL did not rise 15 %
    by_step = False  # the decode reading is the step fit's, where load or work moved too
    # The step at the candidate's batch and prefill, by the baseline's own per-interval step
    # (_steps.metric_step): the control the span rules have at equal overlap. The same step means
    # the mean ITL rose with the batch and the prompts it shares, not a slower step (dev 1280068:
    # ITL mean x1.29 with arrivals up 26 % "within noise", the step x0.97). A step surely slower
    # at equal batch and prefill is the decode's, even where more work per request or preemptions
    # would otherwise hide it, since both only act through the batch and the prefill the fit holds
    # equal (1280087: decode x3.93, prompt tokens counted per request x1.22 with recomputation,
    # the step x3.08 at z 22); not where the cache lost its hits or the pool shrank, which change
    # what a prompt token costs.
    itl_rose = itl_mean.ratio is not None and itl_mean.ratio >= 1 + MIN_RISE
    step = metric_step(metrics) if itl_rose else None  # only asked when the mean ITL rose
    step_same = step is not None and step.ratio < 1 + MIN_RISE
    if itl_rose and per_replica_flat and not other_mechanism and not step_same:
        terms["decode_slowdown"] = _log(itl_mean.ratio or 1.0)
    elif step is not None and step.ratio >= 1 + MIN_RISE and step.z >= MIN_Z and not cache_lost and not pool_pressure:
        terms["decode_slowdown"] = _log(step.ratio)
        by_step = True
    elif slowest is not None:
        # One replica of several slowed apart from its peers, too few of the fleet's tokens to
        # move its mean 15 % (decode x2.07 on 1 of 6 replicas: ITL p99 x2.4, and nothing explained
        # it; dev 1280181). Its own rise is the reading, as the span rule reads one replica
        # against itself, at ONE_REPLICA of the confidence: no fleet mean corroborates it.
        terms["decode_slowdown"] = _log(slowest[2])
        alone = True
    # More arrivals grow the running batch and slow each step as a slower step grows the batch
    # (Little's law): the gauges cannot tell them apart, only the arrival rate can. Risen by 15 %
    # or more at 2 <= z < 3 it is neither noise nor measured, so both readings are named, the
    # load at its z's share of the bar (1270283: arrivals x1.26 at z 2.9 on the same replicas,
    # ITL x1.25, running x1.23, read as a decode slowdown alone). Where the step fit shows the same
    # step at the candidate's batch and prefill, the batch grew with the arrivals alone, and the
    # load is named by itself, still at its z's share (1270283 again: the step x1.0).
    if (
        ("decode_slowdown" in terms or step_same)
        and not comparison.windows_overlap
        and "load" not in terms
        and rate.ratio >= 1 + MIN_RISE
        and NOISE_Z <= rate_z < MIN_Z
        and abs(replicas.ratio - 1) < MIN_RISE
    ):
        terms["load"] = _log(rate.ratio)
        load_within_noise = rate_z / MIN_Z
    terms = {k: v for k, v in terms.items() if v > 0}
    if not terms:
        return []
    total = sum(terms.values())

    evidence = (
        Evidence("requests_per_s", rnd(rate.baseline), rnd(rate.candidate),
                 f"{counted}; z = {rate_z:.1f} (Poisson at dispersion {DISPERSION:g}, or the spread "
                 "of per-scrape counts where wider)"),
        Evidence("replicas", replicas.baseline, replicas.candidate,
                 "instances serving, weighted by the share of the window each served"),
        Evidence("requests_per_s_per_replica", rnd(_per(rate, replicas).baseline), rnd(_per(rate, replicas).candidate),
                 "offered load per replica"),
        Evidence("running_per_replica", rnd(running.baseline), rnd(running.candidate),
                 "running gauge, window mean per serving replica"),
        Evidence("max_running", running_max.baseline, running_max.candidate,
                 "running gauge peak (effective max_num_seqs)"),
        Evidence("running_under_backlog", rnd(under.baseline), rnd(under.candidate),
                 "median running gauge at the scrapes where the same replica had requests waiting"),
        Evidence("waiting_requests", rnd(waiting.baseline), rnd(waiting.candidate), "waiting gauge, window mean"),
        Evidence("tokens_per_request", rnd(work.baseline), rnd(work.candidate), "prompt + generation counter deltas"),
        Evidence("itl_mean_s", rnd(itl_mean.baseline, 6), rnd(itl_mean.candidate, 6),
                 "inter-token latency histogram mean"),
    )  # fmt: skip
    findings: list[Finding] = []
    for cause, term in terms.items():
        explained = clip01(term / total)
        scope: dict[str, str] = {}
        extra: tuple[Evidence, ...] = ()
        if cause == "load":
            rise = (load_per_replica if comparison.windows_overlap else rate.ratio) - 1
            per = " per replica" if comparison.windows_overlap else ""
            title = (f"Offered load{per} rose {rise:.0%} ({rnd(rate.baseline)} -> {rnd(rate.candidate)} req/s) "
                     f"on {replicas.candidate:.0f} replicas (engine metrics)")  # fmt: skip
            if load_within_noise < 1 and "decode_slowdown" in terms:
                title += f", at z = {rate_z:.1f}: within bursty arrivals' spread, as likely as a slower step"
            elif load_within_noise < 1 and step is not None:
                title += (f", at z = {rate_z:.1f}: within bursty arrivals' spread, and the step at the same batch "
                          f"and prefill did not slow (x{step.ratio:.2f})")  # fmt: skip
                extra = (step.evidence(),)
            change, stage, next_check = (
                rise,
                "queue",
                (
                    "check which clients or tenants sent more requests at the deploy (gateway logs); scale out or "
                    "rate-limit, then compare again at equal arrival rate"
                ),
            )
        elif cause == "capacity":
            what = (
                f"replicas {replicas.baseline:.3g} -> {replicas.candidate:.3g} (time-weighted)"
                if replicas.ratio <= 1 - MIN_FALL
                else (
                    f"max running requests {running_max.baseline:.0f} -> {running_max.candidate:.0f}"
                    " while requests wait"
                    if peak is not None and peak <= 1 - MIN_FALL
                    else f"requests wait while {rnd(under.candidate)} run per replica, against {rnd(reference)} before"
                )
            )
            same = "for the same arrivals" if rate_flat else f"while arrivals rose {rate.ratio - 1:.0%}"
            title = f"Capacity fell {same}: {what} (engine metrics)"
            change, stage, next_check = (
                1 - min(replicas.ratio or 1.0, lower_cap),
                "queue",
                (
                    "compare replica count and the engine's max_num_seqs / max_num_batched_tokens before and after "
                    "the deploy; restore the baseline's and replay"
                ),
            )
        elif by_step and step is not None:
            extra = (step.evidence(),)
            title = (f"The engine step ran {step.ratio - 1:.0%} slower at the same running batch and prompt tokens "
                     f"per second (mean inter-token latency x{itl_mean.ratio or 1.0:.2f}; engine metrics)")  # fmt: skip
            change, stage, next_check = (
                step.ratio - 1,
                "decode",
                DECODE_NEXT_CHECK,
            )
        else:
            if slowest is not None:
                scope, extra = slowest[0], (slowest[1],)
            elif step is not None:
                extra = (step.evidence(),)
            same_load = (
                "at the same load per replica"
                if load_within_noise == 1
                else f"while arrivals rose {rate.ratio - 1:.0%} within noise"
            )
            rose = slowest[2] if alone and slowest is not None else (itl_mean.ratio or 1.0)
            where = f" on {next(iter(scope.values()))} alone" if alone else ""
            title = (f"Mean inter-token latency rose {rose - 1:.0%}{where} {same_load} "
                     "and the same work per request (engine metrics)")  # fmt: skip
            change, stage, next_check = (
                rose - 1,
                "decode",
                DECODE_NEXT_CHECK,
            )
        findings.append(
            Finding(
                cause=cause,
                title=title,
                explained=explained,
                confidence=CONFIDENCE
                * min(1.0, change / 0.3)
                * (BESIDE_SPANS if spans else 1.0)
                * (load_within_noise if cause == "load" else ONE_REPLICA if alone else 1.0),
                stage=stage,
                scope=scope,
                evidence=evidence + extra,
                next_check=next_check,
            )
        )
    return findings


def _slowest_replica(metrics: MetricView) -> tuple[dict[str, str], Evidence, float] | None:
    """The replica whose decode slowed apart from its peers, from per-replica ITL histograms.

    A slower step on one replica (a bad node, a driver or image that only it runs) raises
    its mean ITL while its peers, serving the same mix, move with load alone. It is the
    scope when its ratio is >= 1 + ``MIN_RISE`` and every peer rose at most a third as much;
    a slowdown everywhere, or fewer replicas, moves them together. Two
    replicas are no peer group: when their baselines differ (uneven routing) their ratios
    differ as much, and neither tells which one departed.
    """
    sides = {s: metrics.histogram_by_replica("itl_seconds", s) for s in SIDES}
    ratios: dict[tuple[str, str], float] = {}
    for key, (total_c, n_c) in sides["candidate"].items():
        total_b, n_b = sides["baseline"].get(key, (0.0, 0))
        if min(n_b, n_c) >= MIN_REPLICA_TOKENS and total_b > 0:
            ratios[key] = (total_c / n_c) / (total_b / n_b)
    if len(ratios) < MIN_PEERS + 1:
        return None
    ranked = sorted(ratios.items(), key=lambda kv: kv[1], reverse=True)
    (attribute, replica), top = ranked[0]
    peer = ranked[1][1]
    # Every peer rose at most a third as much (as _replica_scope.slowed_replica asks of spans):
    # per-replica ITL means of a fleet-wide slowdown spread x1.2-1.7 on ~12k tokens a side.
    if top < 1 + MIN_RISE or peer - 1 > REST_SHARE * (top - 1):
        return None
    evidence = Evidence(f"itl_mean_ratio[{attribute}={replica}]", rnd(peer, 3), rnd(top, 3),
                        "candidate/baseline mean ITL of this replica (candidate) against its closest peer's "
                        "(baseline column), per-replica ITL histograms")  # fmt: skip
    return {attribute: replica}, evidence, top
