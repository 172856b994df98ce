"""What regressed: every latency quantile on both sides, and the one regression to explain.

:func:`estimate_metrics` compares every latency x quantile with CIs over time blocks
(:func:`stats.compare_quantile`), significant at a family-wise bar, or for a tail quantile by
the share of requests beyond the baseline's quantile (:func:`_tail_exceeded`).
:func:`headline` picks the regression the rules explain: the user-facing quantile that
surely rose most, else a stage that clearly slowed, else the failed or retried share of
requests (:func:`_error_regression`, :func:`_retry_regression`), else "nothing significant".
Split from :mod:`sre_agent.analysis.diagnosis`, which runs and ranks the rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sre_agent.analysis import stats
from sre_agent.analysis.compare import LATENCIES, SIDES, Comparison
from sre_agent.analysis.histogram_delta import HistogramDelta
from sre_agent.analysis.rules_api import MetricEstimate, Regression
from sre_agent.analysis.stats import SliceHistogram

__all__ = [
    "FAMILY_ALPHA",
    "HEADLINE_METRICS",
    "METRIC_MIN_EFFECT",
    "MIN_EFFECT",
    "QUANTILES",
    "STAGE_METRICS",
    "estimate_metrics",
    "headline",
    "leading",
]

#: Quantiles estimated for every latency.
QUANTILES: Final[tuple[float, ...]] = (0.5, 0.9, 0.99)
#: Smallest relative increase reported as a regression (10 %): smaller moves are within
#: the run-to-run noise of serving stacks and not worth an incident.
MIN_EFFECT: Final[float] = 1.10
#: ...twice that for a quantile without a CI (a metric histogram's, interpolated inside its bucket).
METRIC_MIN_EFFECT: Final[float] = 1 + 2 * (MIN_EFFECT - 1)
#: Chance, over the user-facing latencies together, that a deploy that changed nothing shows a
#: significant rise in any of them (one-sided, family-wise; split evenly, Bonferroni).
FAMILY_ALPHA: Final[float] = 0.025
#: User-facing latencies that can be the headline; stages explain them, they are not headlines.
HEADLINE_METRICS: Final[tuple[str, ...]] = ("trace", "e2e", "ttft", "tpot", "itl")
#: Stages of the request path that can be the headline when no user-facing latency regressed...
STAGE_METRICS: Final[tuple[str, ...]] = ("dependency", "gateway", "queue", "prefill", "decode")
#: ...if they at least grew by half...
STAGE_MIN_EFFECT: Final[float] = 1.5
#: Latencies averaged over a request's tokens: no tail-exceedance route (:func:`_tail_exceeded`).
PER_TOKEN_LATENCIES: Final[frozenset[str]] = frozenset({"tpot", "itl"})
#: Lowest quantile whose significance may come from the tail-exceedance test (:func:`_tail_exceeded`).
TAIL_ROUTE_MIN_QUANTILE: Final[float] = 0.9
#: ...and by 10 ms (a 2 ms queue becoming 4 ms is not an incident).
STAGE_MIN_DELTA_S: Final[float] = 0.010
_METRIC_HISTOGRAMS: Final[dict[str, str]] = {
    "e2e": "e2e_seconds",
    "ttft": "ttft_seconds",
    "itl": "itl_seconds",
    "queue": "queue_seconds",
}


def estimate_metrics(comparison: Comparison) -> list[MetricEstimate]:
    """Every latency x quantile on both sides with 95 % CIs over time blocks (:func:`stats.compare_quantile`).

    Span-derived where spans exist; where a side has no spans, from the
    metric stream's latency histograms (no CI: the histogram deltas are not
    resampled, so such an estimate is never ``significant`` on a CI alone).
    ITL comes from the ``itl_seconds`` histogram where present, else it is
    derived from spans as TPOT. ``trace`` (the root span's duration, what the
    gateway's client waited, dependencies included) is added when traces
    have gateway spans.
    """
    out: list[MetricEstimate] = []
    have_spans = all(comparison.request_counts[s] > 0 for s in SIDES)
    names = list(LATENCIES)
    if have_spans and "trace_s" in comparison.requests.columns:
        names += ["trace", "dependency", "gateway"]
    compared: list[tuple[str, stats.QuantileComparison]] = []
    # Each compared latency's two histograms, for the tail-exceedance route below.
    histograms: dict[str, tuple[SliceHistogram, SliceHistogram]] = {}
    roots = comparison.root_histograms if not have_spans else None
    if roots is not None and all(roots[s].n > 0 for s in SIDES):
        # No engine request spans, but the gateway's root spans time every request: the one
        # latency with per-request values, so it gets a CI like any span latency.
        histograms["trace"] = (roots["baseline"], roots["candidate"])
        for q in QUANTILES:
            cq = stats.compare_quantile(roots["baseline"], roots["candidate"], q)
            compared.append(("trace", cq))
        # The same traces' time in dependency spans: a slower retrieval or guardrail is a stage
        # headline without engine spans too (the dependency rule then explains all of it).
        deps = comparison.root_dependency_histograms
        if all(deps[s].n > 0 for s in SIDES):
            histograms["dependency"] = (deps["baseline"], deps["candidate"])
            for q in QUANTILES:
                compared.append(("dependency", stats.compare_quantile(deps["baseline"], deps["candidate"], q)))
    for name in names:
        if not have_spans:
            continue
        b_hist, c_hist = comparison.histogram("baseline", name), comparison.histogram("candidate", name)
        if b_hist.n == 0 and c_hist.n == 0:
            continue
        histograms[name] = (b_hist, c_hist)
        for q in QUANTILES:
            cq = stats.compare_quantile(b_hist, c_hist, q)
            compared.append((name, cq))
    # Every user-facing latency is a chance to find a regression by accident: each one's bar is
    # the family's (Bonferroni over the headline latencies that have a CI; the quantiles of one
    # latency are nearly the same test, so they count once), on a standard error that already
    # covers time correlation (stats.compare_quantile).
    family = len({name for name, cq in compared if cq.log_ratio_se is not None and name in HEADLINE_METRICS})
    z_crit = stats.normal_isf(FAMILY_ALPHA / max(1, family))
    # The tail-share route is a second test of each latency: it gets half the family's level.
    z_tail = stats.normal_isf(FAMILY_ALPHA / (2 * max(1, family)))
    for name, cq in compared:
        significant = bool(
            cq.diff_ci is not None
            and cq.diff_ci[0] > 0
            and cq.ratio is not None
            and cq.ratio >= MIN_EFFECT
            and (cq.log_ratio_se is None or math.log(cq.ratio) >= z_crit * cq.log_ratio_se)
        )
        by_tail = bool(
            not significant
            and cq.ratio is not None
            and cq.ratio >= MIN_EFFECT
            and name in histograms
            and name not in PER_TOKEN_LATENCIES
            and _tail_exceeded(*histograms[name], cq.quantile, z_tail)
        )
        out.append(
            MetricEstimate(
                name,
                cq.quantile,
                cq.baseline,
                cq.candidate,
                cq.diff_ci,
                cq.ratio_ci,
                significant or by_tail,
                by_tail_share=by_tail,
            )
        )
    metrics = comparison.metrics
    traced = any(name == "trace" and cq.log_ratio_se is not None for name, cq in compared)
    # A metric histogram's second route (_histogram_share_rise) is a test of each headline
    # latency it times, at half the family's level, the family counting those latencies too.
    timed = sum(
        1
        for name, signal in _METRIC_HISTOGRAMS.items()
        if name in HEADLINE_METRICS and metrics.has(signal) and not (have_spans and name != "itl")
    )
    share_level = FAMILY_ALPHA / (2 * max(1, family + timed))
    for name, signal in _METRIC_HISTOGRAMS.items():
        if have_spans and name != "itl":
            continue
        if not metrics.has(signal):
            continue
        hist = metrics.histogram(signal)
        b, c = hist["baseline"], hist["candidate"]
        for q in QUANTILES:
            bq = b.quantile(q) if b else None
            cq_ = c.quantile(q) if c else None
            enough = bool(b and c and min(b.count, c.count) >= stats.min_samples_for_quantile(q))
            # Without a CI, demand twice the effect before calling it a regression, and
            # that the two sides' order-statistic intervals (binomial ranks read through the
            # buckets) do not overlap: a p99 of 700 requests is 7 values, and a none deploy's
            # TTFT p99 moves 1.3x on those alone. The intervals run bucket edge to bucket edge, so
            # two that only share an edge are apart: the candidate's lies wholly in higher buckets.
            # Observations that arrived together (a request's tokens, a step's requests) count as
            # the independent ones they are worth, measured between scrape intervals.
            b_iv = b.quantile_interval(q) if b else None
            c_iv = c.quantile_interval(q) if c else None
            apart = bool(b_iv and c_iv and c_iv[0] >= b_iv[1])
            sig = bool(enough and apart and bq and cq_ and cq_ / bq >= METRIC_MIN_EFFECT)
            # The gateway's root spans time every request users sent, by when it started, with a
            # CI. The e2e histogram times the same requests minus the gateway, by when they
            # *finished*: with minute-long requests a window's finishers started in the window
            # before, and a backlog draining after a deploy tripled that histogram's p50 while no
            # request's trace moved. Where traces are measured, the e2e histogram is a table row.
            sig = sig and not (name == "e2e" and traced)
            # Beside spans, the ITL histogram must count the tokens of the requests compared: it
            # counts intervals when they were generated, the spans requests by their start, and a
            # baseline cut at its last request before a deploy (serving time) leaves that request's
            # answer out (dev 1210029: the histogram held half the intervals the baseline's spans
            # did, the long answers among them, and a healthy deploy's ITL p90 read x8.6).
            sig = sig and not (name == "itl" and have_spans and not _counts_the_spans_tokens(comparison, b, c))
            by_share = bool(
                not sig
                and enough
                and name in _SHARE_ROUTE_HISTOGRAMS
                and not (name == "e2e" and traced)
                and bq
                and cq_
                and cq_ / bq >= METRIC_MIN_EFFECT
                and b
                and c
                and (rise := _histogram_share_rise(b, c, q, comparison.slices)) is not None
                and rise.beyond(share_level)
            )
            out.append(MetricEstimate(name, q, bq, cq_, None, None, sig or by_share, "metrics", by_share))
    if have_spans and not any(e.name == "itl" for e in out):
        out.extend(
            MetricEstimate("itl", e.quantile, e.baseline, e.candidate, e.ci, e.ratio_ci, e.significant, "derived")
            for e in out
            if e.name == "tpot"
        )
    return out


#: Metric histograms whose quantiles may be significant by the share of observations above the
#: baseline's bucket (:func:`_histogram_share_rise`). Not ITL: its observations are tokens, and a
#: request's tokens share the step speed of its minutes (see :func:`_tail_exceeded`).
_SHARE_ROUTE_HISTOGRAMS: Final[frozenset[str]] = frozenset({"e2e", "ttft", "queue"})


@dataclass(frozen=True)
class ShareRise:
    """More observations above a bucket edge on the candidate side (:func:`_histogram_share_rise`).

    Attributes:
        edge_s: the upper bound of the bucket holding the baseline's quantile, seconds.
        baseline / candidate: each side's share of observations above it.
        t: the difference over its standard error (time-block variances, both sides).
        df: Welch-Satterthwaite degrees of freedom of that standard error.
    """

    edge_s: float
    baseline: float
    candidate: float
    t: float
    df: float

    def beyond(self, level: float) -> bool:
        """Whether the rise is significant at one-sided ``level`` (Student's t at :attr:`df`)."""
        return self.t >= stats.student_t_isf(level, self.df)


def _histogram_share_rise(
    baseline: HistogramDelta, candidate: HistogramDelta, q: float, slices: int
) -> ShareRise | None:
    """Did more candidate observations than baseline ones land above the bucket of the baseline's ``q`` quantile?

    Each side's share of observations above the upper bound of the bucket holding the
    baseline's ``q`` quantile, their difference and its t, each share's variance by batch
    means over time slices (:func:`stats.share_with_variance`, on the scrape blocks merged
    into at most ``slices``). A 30 s scrape of a 5-minute window gives 10 blocks, of which a
    bursty trace may fill 4: a variance from so few is itself noisy, so the bar is Student's
    t at the Welch-Satterthwaite degrees of freedom, not the normal one. ``None`` when the
    quantile is in the +Inf bucket or a side has no time blocks.

    The metric route's other test, whether the two sides' order-statistic intervals are apart,
    runs each interval out to bucket edges and reads the observations' independence from raw
    scrape blocks, one replica's scrape each: between-replica differences count there as time
    correlation. A prompt template that defeated the prefix cache moved TTFT p99 0.25 -> 0.48 s
    over 1,100 requests a side, intervals 0.1-0.5 and 0.25-0.5 s overlapping, while 0.8 % against
    11 % of requests above 0.25 s is t = 8.9 on 16 df (seed 1230193, 59 scrapes a side).
    """
    holding = baseline.bucket_of_rank(q)
    if holding is None or holding >= len(baseline.bounds):
        return None
    b_side, c_side = baseline.exceedances(holding + 1, slices), candidate.exceedances(holding + 1, slices)
    if b_side is None or c_side is None:
        return None
    (pb, vb, db), (pc, vc, dc) = stats.share_with_variance(*b_side), stats.share_with_variance(*c_side)
    df = (vb + vc) ** 2 / (vb**2 / db + vc**2 / dc)
    return ShareRise(baseline.bounds[holding], pb, pc, (pc - pb) / math.sqrt(vb + vc), df)


#: How far apart the two sides' ITL histograms may cover their requests' inter-token intervals
#: (candidate's share over the baseline's) and still count the same kind of tokens.
ITL_COVERAGE: Final[tuple[float, float]] = (2 / 3, 3 / 2)


def _counts_the_spans_tokens(comparison: Comparison, *histograms: HistogramDelta | None) -> bool:
    """Whether the two sides' ITL histograms cover alike shares of their requests' inter-token intervals.

    A side's share is its histogram's observations over its spans' intervals (``output tokens
    - 1`` summed over the sample, scaled to the side's request count). The histogram counts
    intervals when generated, the spans requests by their start: behind a backlog both sides
    cover less (a saturated fleet: 36 % and 40 %, still alike), but a baseline cut at its last
    request before a deploy covers half its answers while the candidate covers all of its own.
    Within :data:`ITL_COVERAGE` of each other, or unknown, they count alike tokens.
    """
    import polars as pl

    frame = comparison.requests
    if "output_tokens" not in frame.columns:
        return True
    intervals = (pl.col("output_tokens").cast(pl.Float64) - 1.0).clip(0.0, None)
    sums = frame.group_by("side").agg(intervals.sum().alias("k"), pl.len().alias("n"))
    rows = {r["side"]: r for r in sums.to_dicts()}
    shares: list[float] = []
    for side, hist in zip(SIDES, histograms, strict=True):
        row = rows.get(side)
        if hist is None or row is None or not row["k"]:
            return True
        shares.append(hist.count / (row["k"] * comparison.request_counts.get(side, row["n"]) / max(1, row["n"])))
    low, high = ITL_COVERAGE
    return shares[0] <= 0 or low <= shares[1] / shares[0] <= high


def _tail_exceeded(baseline: SliceHistogram, candidate: SliceHistogram, q: float, z_crit: float) -> bool:
    """Whether more candidate requests than the baseline's own share lie beyond the baseline's ``q`` quantile.

    The second route to a significant tail quantile, at half the family-wise level (it is a
    second test of the same latency). A p99 of
    1,000 requests rests on its 10 slowest, and its resampled CI is as wide as the gaps
    between them; the share of requests beyond the baseline's p99 uses every request and
    is tested directly (:func:`stats.tail_test`: time-slice-robust variances, both sides'
    noise), as the canary gate tests its shares (:mod:`sre_agent.analysis.exceedance`).
    Not for per-token latencies (:data:`PER_TOKEN_LATENCIES`): a request's TPOT averages many
    steps, so its tail is the shared step speed of a few minutes, not a few slow requests,
    and a healthy deploy's one-minute speed swing put 20 % of requests beyond the old TPOT
    p99 at p = 0.0009 (``tests/benchmarks/noise_swing.py``: 6 of 40 healthy deploys flagged).
    A new tenant's longer answers put 3 % of requests beyond the old e2e p99 at p = 1e-14
    while the p99's CI spanned -1.5..+11 s (dev 1150218). Tail quantiles only: at the
    median the share test is a location test the CI already is.
    """
    if q < TAIL_ROUTE_MIN_QUANTILE:
        return False
    tail = stats.tail_test(baseline, candidate, q)
    return tail is not None and tail[1] > tail[0] and tail[2] <= stats.normal_sf(z_crit)


def leading(candidates: list[MetricEstimate]) -> MetricEstimate:
    """The estimate to report among risen ones: the highest quantile, then the largest ratio.

    The tail first (incidents are about p99), then p90, then the median. Among changes already
    judged real, the largest one (half its ratio without a CI, as metric-only estimates have): a
    CI's width says how noisy a latency is (time correlation widens some far more than others),
    not how much it rose. ``candidates`` must not be empty.
    """
    top_q = max(e.quantile for e in candidates)
    return max(
        (e for e in candidates if e.quantile == top_q),
        key=lambda e: (e.ratio or 0.0) if e.ratio_ci is not None else (e.ratio or 0.0) / 2,
    )


def headline(comparison: Comparison, estimates: list[MetricEstimate]) -> Regression:
    """The regression to explain: of the user-facing quantiles that surely rose, the one that rose most.

    Among significant trace/e2e/TTFT/TPOT/ITL estimates at the highest quantile
    that has any, the one with the largest ratio (half the ratio when it has
    no CI, as metric-only estimates do); failing those, a stage (dependency,
    gateway, queue, prefill, decode) that grew by half and 10 ms; when
    none is significant, e2e p99 with ``significant=False``. The location
    (Mann-Whitney, Hodges-Lehmann) and tail tests are attached as evidence.
    """
    candidates = [e for e in estimates if e.name in HEADLINE_METRICS and e.significant and e.source != "derived"]
    if not candidates:
        # Users did not feel it (yet), but a stage of the request path clearly slowed: a tripled
        # dependency p99 is a regression even when it is a small part of e2e. Stricter bar.
        candidates = [
            e
            for e in estimates
            if e.name in STAGE_METRICS
            and e.significant
            and (e.ratio or 0) >= STAGE_MIN_EFFECT
            and (e.candidate or 0) - (e.baseline or 0) >= STAGE_MIN_DELTA_S
        ]

    if not candidates:
        share = _error_regression(comparison) or _retry_regression(comparison)
        if share is not None:
            return share
    if candidates:
        # The tail first (incidents are about p99), then p90, then the median; within a quantile,
        # the metric whose ratio is largest.
        best = leading(candidates)
    else:
        fallback = [e for e in estimates if e.name == "e2e" and e.quantile == 0.99] or [
            e for e in estimates if e.quantile == 0.99
        ]
        if not fallback:
            return Regression("e2e", 0.99, None, None, None, False, note="no latency data on one side")
        best = fallback[0]
    location_p = hl = tail_p = None
    tail: tuple[float, float, float] | None = None
    col = LATENCIES.get(best.name, f"{best.name}_s")
    if best.source == "spans" and col in comparison.requests.columns:
        frame = comparison.requests
        import polars as pl

        values = {s: frame.filter((pl.col("side") == s) & pl.col(col).is_not_null())[col].to_numpy() for s in SIDES}
        location_p = stats.mann_whitney(values["baseline"], values["candidate"])
        hl = stats.hodges_lehmann(values["baseline"], values["candidate"], seed=comparison.seed)
        tail = stats.tail_test(
            comparison.histogram("baseline", best.name), comparison.histogram("candidate", best.name), best.quantile
        )
        tail_p = tail[2] if tail else None
    note = "" if best.source == "spans" else "estimated from metric histograms (no spans): no confidence interval"
    if best.by_tail_share and best.source == "metrics":
        note += _histogram_share_note(comparison, best)
    elif best.by_tail_share:
        # Significant by the tail-exceedance route (_tail_exceeded): say which test decided.
        label = f"p{round(best.quantile * 100)}"
        shares = f": {tail[0]:.1%} -> {tail[1]:.1%} (p = {tail[2]:.2g})" if tail else ""
        note = (
            f"{best.name} {label} regressed by the share of requests beyond the baseline's {label}{shares}; "
            f"the {label}'s own CI alone did not clear the bar"
        )
    switched_from, reason = _quantile_switch(comparison, estimates, best)
    return Regression(
        best.name,
        best.quantile,
        best.baseline,
        best.candidate,
        best.ci,
        best.significant,
        location_p,
        hl,
        tail_p,
        note,
        switched_from,
        reason,
    )


def _histogram_share_note(comparison: Comparison, best: MetricEstimate) -> str:
    """What decided a metric histogram's quantile by the share route (:func:`_histogram_share_rise`)."""
    hist = comparison.metrics.histogram(_METRIC_HISTOGRAMS[best.name])
    b, c = hist["baseline"], hist["candidate"]
    rise = _histogram_share_rise(b, c, best.quantile, comparison.slices) if b and c else None
    if rise is None:
        return ""
    return (
        f"; significant by the share of observations above {rise.edge_s:g} s: "
        f"{rise.baseline:.1%} -> {rise.candidate:.1%} (t = {rise.t:.1f}, {rise.df:.0f} df)"
    )


def _quantile_switch(
    comparison: Comparison, estimates: list[MetricEstimate], best: MetricEstimate
) -> tuple[float | None, str]:
    """When the headline is below p99: the quantile it switched from and why (``(None, "")`` otherwise).

    Incidents are about the tail, so a p90 or median headline is a choice the reader must see:
    either p99 had too few requests beyond it to say anything (:func:`stats.min_samples_for_quantile`,
    the same rule the stage decomposition uses), or it had enough and did not move significantly.
    """
    top = max(QUANTILES)
    if not best.significant or best.quantile >= top:
        return None, ""
    need = stats.min_samples_for_quantile(top)
    if best.source == "spans":
        counts = [comparison.histogram(s, best.name).n for s in SIDES]
    elif best.name in _METRIC_HISTOGRAMS:
        hist = comparison.metrics.histogram(_METRIC_HISTOGRAMS[best.name])
        counts = [h.count if h else 0 for h in (hist["baseline"], hist["candidate"])]
    else:
        counts = [0, 0]
    label = f"p{round(top * 100)}"
    if min(counts) < need:
        return top, (
            f"{label} needs {need} requests per side ({stats.MIN_TAIL} beyond it); "
            f"{best.name} has {counts[0]} baseline and {counts[1]} candidate"
        )
    return top, f"{best.name} {label} did not change significantly"


#: An error-rate rise is a regression when it is at least 1 point, x1.5, and z >= 4
#: (a high bar, because failures cluster in time and the z test assumes they do not).
ERROR_MIN_RISE: Final[float] = 0.01
ERROR_MIN_FACTOR: Final[float] = 1.5
ERROR_MIN_Z: Final[float] = 4.0


def _error_regression(comparison: Comparison) -> Regression | None:
    """The failed share of logical requests as the headline, when it rose and latency did not."""
    return _share_rise("error_rate", comparison.failures, "failed share of requests")


def _retry_regression(comparison: Comparison) -> Regression | None:
    """The retried share of logical requests as the headline, when it rose and neither latency nor failures did.

    A gateway that retries a failing replica hides the failures from the client and the
    latency of one retry in the tail: the share of requests that needed more than one
    attempt (the gateway's attempt spans, :attr:`OtherSpans.attempts_per_trace`) is then
    the regression, held to the error rate's bar (retries are failures absorbed). Not
    read when the windows overlap (a version pair: traces cannot be sided by time) or
    no span wraps an engine call (no attempts to count).
    """
    if not comparison.has_other_spans or comparison.windows_overlap:
        return None
    per_trace = comparison.other_spans.attempts_per_trace
    if per_trace.height == 0 or not int(per_trace["wrapped"].sum() or 0):
        return None
    import polars as pl

    counts: dict[str, tuple[int, int]] = {
        s: (int(part.filter(pl.col("attempts") > 1).height), part.height)
        for s in SIDES
        for part in (per_trace.filter(pl.col("side") == s),)
    }
    return _share_rise("retried_share", counts, "share of requests retried by the gateway")


def _share_rise(metric: str, counts: Mapping[str, tuple[int, int]], what: str) -> Regression | None:
    """A share of logical requests as the headline when it rose by the error bar; ``counts``: side -> (k, n)."""
    (fb, nb), (fc, nc) = counts["baseline"], counts["candidate"]
    if nb < stats.MIN_REQUESTS or nc < stats.MIN_REQUESTS:
        return None
    pb, pc = fb / nb, fc / nc
    pooled = (fb + fc) / (nb + nc)
    se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / nb + 1 / nc))
    z = (pc - pb) / se
    if pc - pb < ERROR_MIN_RISE or pc < ERROR_MIN_FACTOR * pb or z < ERROR_MIN_Z:
        return None
    se_diff = math.sqrt(pb * (1 - pb) / nb + pc * (1 - pc) / nc)
    ci = (pc - pb - 1.96 * se_diff, pc - pb + 1.96 * se_diff)
    # quantile 0.99 tells rules which tail to examine; the report prints no quantile for a share
    return Regression(metric, 0.99, pb, pc, ci, True, note=f"{what}, z = {z:.1f}")
