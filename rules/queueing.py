"""Queueing and its drivers: offered load versus capacity.

Mechanism (Little's law, per replica): requests in the engine L = (lambda / R) x W.
Queueing grows when the offered load per replica lambda / R grows relative
to what the replicas can serve. Its change splits into

* arrival rate lambda (``load``): more requests per second at the same work each,
  beyond the spread of per-slice arrivals (z >= 3; bursts are not load);
* replicas R or slots (``capacity``): fewer replicas, or a lower cap on
  running requests (``max_num_seqs``) while requests wait (the running gauge's peak
  down 10 % and two requests or more, the waiting gauge up 10 % or more and queue
  time holding part of the tail excess);
* work per request (traffic mix: more tokens each), left to ``traffic_mix``;
  more uncached prompt tokens at the same lengths (a cache that stopped hitting) and
  slower tokens share the split but are ``prefix_cache``'s and the slowdown rules' findings.

The part of the regression at stake is the queue's share of the tail excess,
plus the prefill/decode share when the running batch grew with the load
(continuous batching absorbs load into larger, slower batches before it
queues). Engine slowdowns at the same load are other rules' business, so they
do not enter the split.
"""

from __future__ import annotations

import math

import polars as pl

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import StageDecomposition, replicas_expr
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import Evidence, Finding, Regression, SidePair
from sre_agent.rules._mechanism import queue_drivers_per_replica, wide_enough
from sre_agent.rules._steps import slot_cap_binds

#: Relative change below which a driver is treated as unchanged (10 %).
MIN_CHANGE = 0.10
#: Fewest running slots a peak must lose to count as a lower cap (one is the gauge's own step).
MIN_SLOT_DROP = 2.0
#: Running-request concurrency growth that means batches grew with the load.
BATCH_GROWTH = 1.10


def _log_up(ratio: float | None) -> float:
    """log(ratio) when the ratio rose, else 0."""
    return math.log(ratio) if ratio is not None and ratio > 1 else 0.0


def _replicas(requests: pl.LazyFrame, metrics: MetricView) -> SidePair:
    """Replicas serving on each side: distinct engine instances in the spans, else metric series."""
    frame = requests.group_by("side").agg(replicas_expr().alias("r")).collect()
    got = {row["side"]: float(row["r"]) for row in frame.to_dicts()}
    if got.get("baseline") and got.get("candidate"):
        return SidePair(got["baseline"], got["candidate"])
    return metrics.serving_replicas()


def _concurrency(
    requests: pl.LazyFrame, windows: dict[str, tuple[int, int, float, int]], metrics: MetricView
) -> SidePair:
    """Mean running requests per serving replica: the running gauge, else Little's law over the spans."""
    gauge = metrics.running_per_replica()
    if gauge.baseline is not None and gauge.candidate is not None:
        return gauge
    sums = (
        requests.group_by("side")
        .agg(pl.col("inference_s").fill_null(pl.col("e2e_s")).sum().alias("busy"), pl.len().alias("n"))
        .collect()
    )
    out: dict[str, float] = {}
    for row in sums.to_dicts():
        _, _, seconds, total = windows[row["side"]]
        if row["n"] and seconds > 0:
            # The sample holds n of the side's `total` requests; scale its busy time back up.
            out[row["side"]] = float(row["busy"]) * (total / row["n"]) / seconds
    return SidePair(out.get("baseline"), out.get("candidate"))


def queueing(
    *,
    comparison: Comparison,
    regression: Regression,
    stages: StageDecomposition,
    arrival_rate: SidePair,
    requests: pl.LazyFrame,
    metrics: MetricView,
    windows: dict[str, tuple[int, int, float, int]],
) -> list[Finding]:
    """``load`` and/or ``capacity`` findings when queueing (or load-grown batches) carries the regression."""
    stages = wide_enough(stages, regression, comparison)
    if not regression.significant or not stages.shares:
        return []
    replicas = _replicas(requests, metrics)
    concurrency = _concurrency(requests, windows, metrics)
    waiting = metrics.gauge("waiting_requests")
    running_max = metrics.gauge("running_requests", "max")
    queue_share = stages.shares.get("queue", 0.0)
    engine_share = stages.shares.get("prefill", 0.0) + stages.shares.get("decode", 0.0)
    batches_grew = (concurrency.ratio or 0.0) >= BATCH_GROWTH
    at_stake = queue_share + (engine_share if batches_grew else 0.0)
    if at_stake <= 0.05:
        return []

    drivers = queue_drivers_per_replica(comparison, metrics)
    load_term = drivers.get("load", 0.0)
    replica_term = drivers.get("capacity", 0.0)
    slot_term = 0.0
    # A lower cap holds requests back only if they queue: the waiting gauge rose by 10 % or more and
    # queue time carries part of the tail excess (dev 1100070: peak running 10 -> 9, waiting 0.072
    # -> 0.075, the tail's queue time fell; one replica's slower decode read as capacity at 0.9).
    # And only a cap that binds (spread below its peak, the engine admits slowly: _load.cap_binds).
    # The peak of a window's running counts moves by one request by chance (the gauge's own step;
    # dev 1210077: peak 7 -> 6 at 2.7 running on average, a new tenant's longer prompts read as a cap).
    if (
        running_max.ratio is not None
        and running_max.ratio <= 1 - MIN_CHANGE
        and (running_max.baseline or 0.0) - (running_max.candidate or 0.0) >= MIN_SLOT_DROP
        and queue_share > 0
        and (waiting.candidate or 0.0) >= (1 + MIN_CHANGE) * (waiting.baseline or 0.0)
        and (waiting.candidate or 0.0) > 0
        and slot_cap_binds(metrics, comparison, comparison.request_counts)
    ):
        slot_term = _log_up(1 / running_max.ratio)  # a lower cap on running requests while requests wait
    work_term = drivers.get("traffic_mix", 0.0)
    # Engine slowdowns and a cache that stopped hitting also raise utilisation; they share the queue
    # but are reported by their own rules.
    speed_term = drivers.get("prefill_slowdown", 0.0) + drivers.get("decode_slowdown", 0.0)
    speed_term += drivers.get("prefix_cache", 0.0)
    total = load_term + replica_term + slot_term + work_term + speed_term
    if total <= 0:
        return []
    work = (
        requests.group_by("side")
        .agg((pl.col("input_tokens").fill_null(0) + pl.col("output_tokens").fill_null(0)).mean().alias("w"))
        .collect()
    )
    work_by_side = {r["side"]: r["w"] for r in work.to_dicts()}
    work_ratio = SidePair(work_by_side.get("baseline"), work_by_side.get("candidate")).ratio

    evidence = [
        Evidence(
            "arrival_rate_rps", _r(arrival_rate.baseline), _r(arrival_rate.candidate), "engine requests per second"
        ),
        Evidence("replicas", replicas.baseline, replicas.candidate, "distinct engine instances serving"),
        Evidence(
            "running_per_replica",
            _r(concurrency.baseline),
            _r(concurrency.candidate),
            "running gauge, else Little's law over span durations",
        ),
        Evidence(
            "tail_mean_queue_s",
            _r(stages.baseline.get("queue")),
            _r(stages.candidate.get("queue")),
            f"{queue_share:.0%} of the tail excess is queueing"
            + (
                f" (p{stages.quantile * 100:.0f} tail: the p{regression.quantile * 100:.0f} tail is too small to split)"
                if stages.quantile < regression.quantile
                else ""
            ),
        ),
    ]
    if waiting.baseline is not None:
        evidence.append(Evidence("waiting_requests", _r(waiting.baseline), _r(waiting.candidate), "mean waiting gauge"))
    if work_ratio is not None:
        evidence.append(
            Evidence(
                "tokens_per_request",
                _r(work_by_side.get("baseline")),
                _r(work_by_side.get("candidate")),
                "input + output tokens (work per request)",
            )
        )
    stage = "queue" if queue_share >= engine_share or not batches_grew else None
    findings: list[Finding] = []
    if load_term > 0:
        rise = (arrival_rate.ratio or 1.0) - 1.0
        rates = f"{_r(arrival_rate.baseline)} -> {_r(arrival_rate.candidate)} req/s"
        if comparison.windows_overlap and replicas.ratio:
            # A version pair: each version's replicas are its own, so the load is per replica.
            rise = (arrival_rate.ratio or 1.0) / replicas.ratio - 1.0
            rates += f" on {replicas.baseline:.0f} and {replicas.candidate:.0f} replicas: the router's share"
        findings.append(
            Finding(
                cause="load",
                title=f"Offered load{' per replica' if comparison.windows_overlap else ''} rose {rise:.0%} "
                f"({rates}) and "
                + ("queueing and batch size grew with it" if batches_grew else "queueing grew with it"),
                explained=at_stake * load_term / total,
                confidence=0.95 * min(1.0, rise / 0.25),
                stage=stage,
                evidence=tuple(evidence),
                next_check="replay the candidate's version at the baseline's arrival rate; if latency returns, "
                "scale out or rate-limit the tenant whose traffic grew",
            )
        )
    if replica_term + slot_term > 0:
        what = (
            f"replicas {replicas.baseline:.0f} -> {replicas.candidate:.0f}"
            if replica_term > 0 and replicas.baseline is not None and replicas.candidate is not None
            else f"max running requests {running_max.baseline:.0f} -> {running_max.candidate:.0f} while requests wait"
        )
        if slot_term > 0:
            evidence.append(
                Evidence(
                    "max_running_requests",
                    running_max.baseline,
                    running_max.candidate,
                    "peak of the running gauge: the effective max_num_seqs",
                )
            )
        findings.append(
            Finding(
                cause="capacity",
                title=f"Capacity fell for the same offered load: {what}",
                explained=at_stake * (replica_term + slot_term) / total,
                confidence=0.9,
                stage=stage,
                evidence=tuple(evidence),
                next_check="compare replica count and the engine's max_num_seqs / max_num_batched_tokens before and "
                "after the deploy; restore the baseline's and replay",
            )
        )
    if work_term > 0:
        findings.append(
            Finding(
                cause="traffic_mix",
                title=f"Heavier requests raised utilisation: work per request at the baseline's speed rose "
                f"{math.exp(work_term) - 1:.0%} and queueing grew with it",
                explained=at_stake * work_term / total,
                confidence=0.8,
                stage=stage,
                evidence=tuple(evidence),
                next_check="compare prompt and output length distributions (and which tenants send them) before "
                "and after; replay the baseline version with the candidate's requests",
            )
        )
    return findings


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)
