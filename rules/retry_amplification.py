"""More attempts per logical request (retries, hedges).

Mechanism: a gateway that resends failed or slow engine calls multiplies the
engine's offered load by its attempts per request and puts the failed
attempts' time into the retried requests' latency; under load the extra
attempts slow everyone else too, which causes more timeouts and retries.

Signals: per logical request (a trace's root span), its attempts: the
gateway spans that wrap engine calls (CLIENT attempt spans, including failed
ones without an engine child) plus any span carrying
``http.request.resend_count``; without gateway wrappers, the engine spans per
trace (``traces.attempts``). Per side: mean attempts per request with a
cluster-robust SE over time slices, the share of retried requests, and
their share of the root-span tail.

``explained`` (0..1): how much of the candidate's trace tail is newly made of
retried requests, ``(tail_share_c - tail_share_b) / (1 - tail_share_b)``
where ``tail_share`` is the share of retried requests among traces at or
above that side's quantile (the headline quantile) of the root duration, or
of the headline's own per-trace time when the headline is gateway or
dependency time (failed attempts and back-off are gateway time).

When the headline is the error rate, ``explained`` is the share of the rise in failed
logical requests made of retried ones, provided the engine's own error share did not
rise (a gateway timing attempts out and retrying them fails requests the engine never
failed); 0 when it did (the failures are ``errors``', retries only amplify them).

``confidence``: significance of the z score of attempts per request x
``min(1, rise / min(0.1, 1 - q))`` for the headline quantile q: ten extra
attempts per hundred requests counts as unmistakable, and at a tail quantile
as many extra attempts as the tail holds requests (at p99, one per hundred).

Quiet when attempts per request rose by less than 0.02 or z < 2;
:class:`RuleSkipped` without root spans, attempt spans or engine spans per
trace, and when the windows overlap (version mode).
"""

from __future__ import annotations

from typing import Final

import polars as pl

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.rules_api import SIDES, Evidence, Finding, Regression, RuleSkipped
from sre_agent.rules._mechanism import (
    clip01,
    latency_share,
    ratio_estimate,
    rnd,
    side,
    significance,
    windows_overlap,
    z_change,
)

#: Smallest rise of attempts per logical request.
MIN_RISE: Final[float] = 0.02
#: Fewest traces per side to read the tail on a gateway-side stage.
MIN_TAIL_TRACES: Final[int] = 100
#: Rise counted as unmistakable.
FULL_RISE: Final[float] = 0.10
#: Rise of the engine's own error share (points) beyond which failures are the errors rule's.
ENGINE_ERROR_RISE: Final[float] = 0.01

NEXT_CHECK: Final[str] = (
    "list the retried requests' first-attempt errors (timeout, 429/5xx, replica); compare the gateway's retry "
    "policy and per-attempt timeout before and after, and check whether a retry budget caps the resend rate"
)


def retry_amplification(comparison: Comparison, regression: Regression) -> Finding | None:
    """A ``retry_amplification`` finding when attempts per logical request rose (see module docstring)."""
    if not comparison.has_other_spans:
        raise RuleSkipped("no gateway spans: attempts per logical request are unknown")
    if windows_overlap(comparison):
        raise RuleSkipped("the windows overlap (version comparison): gateway traces cannot be assigned a side")
    per_trace = comparison.other_spans.attempts_per_trace
    if per_trace.height == 0:
        raise RuleSkipped("no root spans of logical requests in the windows")
    source = "gateway attempt spans per logical request"
    if int(per_trace["wrapped"].sum() or 0) == 0:
        # No wrappers: the engine spans are called directly from the root; count them per trace instead.
        traces = comparison.traces.join(comparison.requests.select("span_id", "slice"), on="span_id")
        per_trace = traces.unique("trace_id").select("trace_id", "side", "slice", "trace_s", "attempts").drop_nulls()
        per_trace = per_trace.with_columns(pl.lit(False).alias("failed"))
        source = "engine spans per trace"
    per_trace = per_trace.with_columns(pl.col("attempts").clip(1, None).cast(pl.Float64))
    one = pl.lit(1.0)
    eb = ratio_estimate(side(per_trace, "baseline"), pl.col("attempts"), one)
    ec = ratio_estimate(side(per_trace, "candidate"), pl.col("attempts"), one)
    if eb.value is None or ec.value is None:
        raise RuleSkipped("no logical requests on one side")
    z = z_change(eb, ec)
    rise = ec.value - eb.value
    if rise < MIN_RISE or z < 2.0:
        return None
    q = regression.quantile if regression.quantile >= 0.5 else 0.9
    # The tail is read on the headline's own per-trace time when it is a gateway-side stage
    # (failed attempts and back-off are gateway time), else on the root span's duration.
    tail_col, tail_frame = "trace_s", per_trace
    stage_col = f"{regression.metric}_s"
    if regression.metric in ("gateway", "dependency") and stage_col in comparison.requests.columns:
        per_request = comparison.requests.select("trace_id", stage_col).drop_nulls().unique("trace_id")
        joined = per_trace.join(per_request, on="trace_id", how="inner")
        if min(side(joined, s).height for s in SIDES) >= MIN_TAIL_TRACES:
            tail_col, tail_frame = stage_col, joined
    shares: dict[str, tuple[float, float]] = {}
    for s in SIDES:
        part = side(tail_frame, s)
        threshold = part[tail_col].quantile(q, interpolation="lower")
        tail = part.filter(pl.col(tail_col) >= threshold)
        shares[s] = (float((part["attempts"] > 1).mean()), float((tail["attempts"] > 1).mean()))  # type: ignore[arg-type]
    tail_b, tail_c = shares["baseline"][1], shares["candidate"][1]
    explained = clip01((tail_c - tail_b) / (1.0 - tail_b)) if tail_b < 1 else 0.0
    explained = _failures_share(comparison, per_trace) if regression.metric == "error_rate" else explained
    evidence = (
        Evidence("attempts_per_request", rnd(eb.value), rnd(ec.value), f"{source}; z = {z:.1f}"),
        Evidence("retried_request_share", rnd(shares["baseline"][0]), rnd(shares["candidate"][0]),
                 "logical requests with more than one attempt"),
        Evidence(f"retried_share_of_{tail_col.removesuffix('_s')}_p{round(q * 100)}_tail", rnd(tail_b), rnd(tail_c),
                 f"retried requests among traces at or above the side's quantile of {tail_col}"),
        Evidence("engine_load_factor", rnd(eb.value), rnd(ec.value),
                 f"engine calls per logical request: offered load x{ec.value / eb.value:.2f} at the same arrivals"),
    )  # fmt: skip
    return Finding(
        cause="retry_amplification",
        title=f"Attempts per request rose {eb.value:.3f} -> {ec.value:.3f}: retries amplify load and latency",
        explained=explained if regression.metric == "error_rate" else latency_share(regression, explained),
        # A tail at quantile q is 1 - q of the requests: that many more of them retried can make
        # all of it (at p99, 3 % retried filled the gateway tail while "rise / 10 %" read 0.33 and a
        # slice of the replica the retries landed on led: dev 1150021).
        confidence=significance(z) * min(1.0, rise / min(FULL_RISE, 1.0 - q)),
        stage="gateway",
        evidence=evidence,
        next_check=NEXT_CHECK,
    )


def _failures_share(comparison: Comparison, per_trace: pl.DataFrame) -> float:
    """Share of the rise in failed logical requests made of retried ones, when the engine's own errors did not rise.

    A gateway that aborts slow attempts and retries them fails requests whose attempts all ran
    out of time: those failures are the retry policy's, and the engine reports nothing. When
    the engine's error share rose too, the failures are the ``errors`` rule's and retries only
    amplify them (0 here).
    """
    engine = comparison.requests.select("side", "slice", (pl.col("status_code") == "error").cast(pl.Float64).alias("e"))
    eb = ratio_estimate(side(engine, "baseline"), pl.col("e"), pl.lit(1.0))
    ec = ratio_estimate(side(engine, "candidate"), pl.col("e"), pl.lit(1.0))
    if (
        eb.value is not None
        and ec.value is not None
        and ec.value - eb.value >= ENGINE_ERROR_RISE
        and z_change(eb, ec) >= 2
    ):
        return 0.0
    rates: dict[str, tuple[float, float]] = {}
    for s in SIDES:
        part = side(per_trace, s)
        if part.height == 0:
            return 0.0
        failed = int(part["failed"].sum())
        retried_failed = int((part["failed"] & (part["attempts"] > 1)).sum())
        rates[s] = (failed / part.height, retried_failed / part.height)
    rise = rates["candidate"][0] - rates["baseline"][0]
    return clip01((rates["candidate"][1] - rates["baseline"][1]) / rise) if rise > 0 else 0.0
