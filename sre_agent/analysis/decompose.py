"""Stage decomposition of the tail: where did the candidate's extra latency go?

For the headline metric at quantile q, take each side's tail (requests at or
above that side's q-quantile of the metric) and compare the mean time each
stage took in the tail: queue, prefill, decode (engine span), gateway and
dependency (other spans of the same trace). A stage's *share* is its part of
the summed positive excess. Tail means are additive, so the shares add up to
one, unlike differences of per-stage quantiles. A tail whose stages add up to
no rise has no shares. A TPOT headline's one stage is decode, measured as the
tail's TPOT; an ITL headline (metrics) is decomposed on its per-request
counterpart, TPOT.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sre_agent.analysis.compare import LATENCIES, SIDES
from sre_agent.analysis.rules_api import SHARE_HEADLINES
from sre_agent.analysis.stats import MIN_TAIL

if TYPE_CHECKING:
    import polars as pl

    from sre_agent.analysis.compare import Comparison
    from sre_agent.analysis.rules_api import Regression

# MIN_TAIL (fewest tail requests per side) is the headline's own rule, so a reported quantile can be decomposed.
__all__ = [
    "MIN_TAIL",
    "STAGES_OF",
    "StageDecomposition",
    "offered_load_terms",
    "queue_drivers",
    "replicas_expr",
    "stage_decomposition",
    "stage_drivers",
]

#: Headline metric -> engine stages that make it up.
STAGES_OF: Final[dict[str, tuple[str, ...]]] = {
    "e2e": ("queue", "prefill", "decode"),
    "trace": ("queue", "prefill", "decode"),
    "ttft": ("queue", "prefill"),
    "tpot": ("decode",),
    "itl": ("decode",),
    "queue": ("queue",),
    "dependency": ("dependency",),
    "gateway": ("gateway",),
    "prefill": ("prefill",),
    "decode": ("decode",),
}


@dataclass(frozen=True)
class StageDecomposition:
    """Tail means per stage on both sides (seconds) and each stage's share of the excess.

    ``shares`` maps stage -> share of the positive excess (0..1, sums to 1
    when anything rose); empty when the tail is too small to say.
    """

    metric: str
    quantile: float
    tail_requests: tuple[int, int]
    baseline: dict[str, float]
    candidate: dict[str, float]
    shares: dict[str, float]

    @property
    def dominant(self) -> str | None:
        """The stage with the largest share, or ``None``."""
        return max(self.shares, key=lambda s: self.shares[s]) if self.shares else None

    def excess(self, stage: str) -> float:
        """candidate - baseline tail mean of ``stage``, seconds (0 when unknown)."""
        return self.candidate.get(stage, 0.0) - self.baseline.get(stage, 0.0)


def stage_decomposition(
    comparison: Comparison, regression: Regression, where: pl.Expr | None = None
) -> StageDecomposition:
    """Decompose the tail of ``regression.metric`` into stages (see module docstring).

    ``where`` restricts both sides to a slice of the requests (e.g. one host).
    """
    import polars as pl

    if regression.metric in SHARE_HEADLINES:
        return StageDecomposition(regression.metric, regression.quantile, (0, 0), {}, {}, {})
    metric = regression.metric if regression.metric in (*LATENCIES, "trace", "dependency", "gateway") else "e2e"
    if regression.metric == "itl":
        # Inter-token latency is decode time per token: its per-request counterpart is TPOT, not
        # the e2e tail (which the queue and prefill share, and which may not have moved at all).
        metric = "tpot"
    stages = STAGES_OF.get(regression.metric, STAGES_OF["e2e"])
    col = LATENCIES.get(metric, f"{metric}_s")
    q = regression.quantile if regression.quantile >= 0.5 else 0.9
    frame = comparison.requests if where is None else comparison.requests.filter(where)
    if col not in frame.columns:  # a root-span headline without engine requests: nothing to split
        return StageDecomposition(metric, q, (0, 0), {}, {}, {})
    if metric in ("e2e", "trace") and "gateway_s" in frame.columns:
        stages = (*stages, "gateway", "dependency")
    columns = {s: _column(s) for s in stages}
    if metric == "tpot":
        # A per-token headline has one stage, decode, in its own unit: the tail's decode seconds
        # would weigh long answers, whose TPOT is not the tail's.
        columns["decode"] = "tpot_s"
    means: dict[str, dict[str, float]] = {}
    tails: list[int] = []
    for side in SIDES:
        part = frame.filter((pl.col("side") == side) & pl.col(col).is_not_null())
        if part.height == 0:
            return StageDecomposition(metric, q, (0, 0), {}, {}, {})
        threshold = part[col].quantile(q, interpolation="lower")
        tail = part.filter(pl.col(col) >= threshold)
        tails.append(tail.height)
        means[side] = {s: _mean(tail[columns[s]].fill_null(0.0)) for s in stages if columns[s] in tail.columns}
    if min(tails) < MIN_TAIL:
        return StageDecomposition(metric, q, (tails[0], tails[1]), means["baseline"], means["candidate"], {})
    excess = {s: means["candidate"][s] - means["baseline"][s] for s in means["baseline"]}
    positive = sum(max(0.0, v) for v in excess.values())
    # A tail whose stages add up to no rise has no excess to split: one stage's noise would be
    # "100 % of it" while another stage fell by more.
    grew = positive > 0 and sum(excess.values()) > 0
    shares = {s: max(0.0, v) / positive for s, v in excess.items()} if grew else {}
    return StageDecomposition(metric, q, (tails[0], tails[1]), means["baseline"], means["candidate"], shares)


def _mean(values: pl.Series) -> float:
    m = values.mean()
    return float(m) if isinstance(m, int | float) else 0.0


def _column(stage: str) -> str:
    return LATENCIES.get(stage, f"{stage}_s")


#: Relative change below which a queue driver is treated as unchanged.
DRIVER_MIN_CHANGE: Final[float] = 0.10


def _uncached(uncached: pl.Expr | None) -> pl.Expr:
    """A request's uncached prompt tokens: ``uncached`` as given, else input - cached (a missing count as 0)."""
    import polars as pl

    if uncached is not None:
        return uncached
    return (pl.col("input_tokens").fill_null(0) - pl.col("cached_tokens").fill_null(0)).clip(0)


def replicas_expr() -> pl.Expr:
    """Distinct engine replicas among a frame's requests (``service.instance.id``, else ``host.name``)."""
    import polars as pl

    return pl.coalesce("service_instance", "host_name").drop_nulls().n_unique()


def offered_load_terms(log_rate: float, log_replicas: float) -> dict[str, float]:
    """The rise of arrivals *per replica* as ``load`` and ``capacity`` log terms (empty when it did not rise).

    ``log_rate`` is ln(candidate / baseline arrivals per second), ``log_replicas`` ln(baseline /
    candidate replicas). Each replica's load follows their sum (Little's law per replica), so a
    canary that serves 2 of 3 replicas with two thirds of the traffic has no load term although
    its arrival rate doubled. When the per-replica load rose by 10 % or more, the rise is split
    between ``load`` and ``capacity`` in proportion to their own rises (each counted only from
    10 %: a driver that moved less on its own is unchanged and only nets).
    """
    floor = math.log(1 + DRIVER_MIN_CHANGE)
    net = log_rate + log_replicas
    rises = {"load": log_rate if log_rate >= floor else 0.0, "capacity": log_replicas if log_replicas >= floor else 0.0}
    total = sum(rises.values())
    if net < floor or total <= 0:
        return {}
    return {k: net * v / total for k, v in rises.items() if v > 0}


def queue_drivers(
    requests: pl.DataFrame,
    seconds: Mapping[str, float],
    totals: Mapping[str, int] | None = None,
    uncached: pl.Expr | None = None,
) -> dict[str, float]:
    """Why did queueing grow? log-ratio contribution of each driver (only those that rose >= 10 %).

    Utilisation per replica is arrivals x work x time-per-unit-of-work / replicas, so its log
    change splits into: ``load`` (arrival rate), ``capacity`` (fewer replicas), ``traffic_mix``
    (more work per request at the baseline's speed and cached share: tokens weighted by the
    baseline's seconds per token; only beyond the spread of the window's token counts, z >=
    :data:`WORK_Z` with time slices as clusters), ``prefix_cache`` (more of each prompt to prefill at the
    candidate's lengths: a smaller cached share), ``prefill_slowdown`` / ``decode_slowdown``
    (seconds per token rose). ``requests`` is one slice or all of the sample, with a ``side``
    column; ``seconds`` the window lengths; ``totals`` the unsampled request counts per side
    (default: the sample's counts); ``uncached`` a request's uncached prompt tokens (default:
    input - cached tokens, a missing count read as none cached).
    """
    import polars as pl

    agg = (
        requests.group_by("side")
        .agg(
            pl.len().alias("n"),
            replicas_expr().alias("replicas"),
            pl.col("input_tokens").fill_null(0).mean().alias("inp"),
            _uncached(uncached).mean().alias("new_in"),
            pl.col("output_tokens").fill_null(0).mean().alias("out"),
            pl.col("prefill_s").mean().alias("prefill"),
            pl.col("decode_s").mean().alias("decode"),
        )
        .to_dicts()
    )
    by = {r["side"]: r for r in agg}
    if set(by) != {"baseline", "candidate"}:
        return {}
    b, c = by["baseline"], by["candidate"]
    n = totals or {"baseline": b["n"], "candidate": c["n"]}
    terms: dict[str, float] = {}

    def add(name: str, ratio: float | None) -> None:
        if ratio is not None and ratio >= 1 + DRIVER_MIN_CHANGE and math.isfinite(ratio):
            terms[name] = terms.get(name, 0.0) + math.log(ratio)

    rate_b, rate_c = n["baseline"] / seconds["baseline"], n["candidate"] / seconds["candidate"]
    add("load", rate_c / rate_b if rate_b else None)
    if b["replicas"] and c["replicas"]:
        add("capacity", b["replicas"] / c["replicas"])
    p_cost = (b["prefill"] or 0.0) / b["new_in"] if b["new_in"] else 0.0
    d_cost = (b["decode"] or 0.0) / b["out"] if b["out"] else 0.0
    work_b = p_cost * (b["new_in"] or 0.0) + d_cost * (b["out"] or 0.0)
    work_c = p_cost * (c["new_in"] or 0.0) + d_cost * (c["out"] or 0.0)
    # The candidate's prompts and answers at the baseline's cached share: what the mix alone asks;
    # the rest of the rise is prompt tokens the cache stopped serving.
    kept = (b["new_in"] or 0.0) / b["inp"] if b["inp"] else 1.0
    work_mix = p_cost * (c["inp"] or 0.0) * kept + d_cost * (c["out"] or 0.0)
    if _mix_work_z(requests, p_cost * kept, d_cost) >= WORK_Z:
        add("traffic_mix", work_mix / work_b if work_b > 0 else None)
    add("prefix_cache", work_c / work_mix if work_mix > 0 else None)
    # Speed terms are weighted by the stage's part of the baseline's service time.
    for stage, cost, tokens in (("prefill", p_cost, "new_in"), ("decode", d_cost, "out")):
        if cost > 0 and c[tokens] and c[stage] is not None and work_b > 0:
            speed_ratio = (c[stage] / c[tokens]) / cost
            weight = cost * (b[tokens] or 0.0) / work_b
            if speed_ratio >= 1 + DRIVER_MIN_CHANGE:
                terms[f"{stage}_slowdown"] = weight * math.log(speed_ratio)
    return terms


#: z from which the mean work per request (at the baseline's speed) moved beyond sampling noise.
WORK_Z: Final[float] = 2.0


def _mix_work_z(requests: pl.DataFrame, per_prompt_token: float, per_output_token: float) -> float:
    """z of the change of mean work per request at fixed seconds per token, time slices as clusters.

    Token counts are heavy-tailed (a few huge prompts carry a window's mean) and arrive in bursts,
    so a mean over one window moves by chance: two halves of one bursty stream (lognormal counts
    with a per-slice burst factor) gave a chance traffic_mix term in 23 of 60 draws, none with
    this test (``tests/diagnose/test_decompose.py``). Each side's mean has the cluster-robust
    variance over its time slices (the ``slice`` column; one cluster per request without it).
    ``inf`` when a side has no spread to measure (a constant workload: any change is real).
    """
    import polars as pl

    work = (
        pl.col("input_tokens").fill_null(0) * per_prompt_token + pl.col("output_tokens").fill_null(0) * per_output_token
    ).alias("_w")
    cluster = pl.col("slice") if "slice" in requests.columns else pl.int_range(pl.len())
    sums = (
        requests.select("side", cluster.alias("_k"), work)
        .group_by("side", "_k")
        .agg(pl.col("_w").sum().alias("s"), pl.len().alias("n"))
    )
    moments: dict[str, tuple[float, float]] = {}
    for side in SIDES:
        part = sums.filter(pl.col("side") == side)
        n, k = float(part["n"].sum()), part.height
        if n <= 0:
            return 0.0
        mean = float(part["s"].sum()) / n
        resid = part["s"].to_numpy() - mean * part["n"].to_numpy()
        variance = (k / (k - 1)) * float((resid**2).sum()) / (n * n) if k > 1 else math.inf
        moments[side] = (mean, variance)
    (m_b, v_b), (m_c, v_c) = moments["baseline"], moments["candidate"]
    se = math.sqrt(v_b + v_c)
    if se == 0:
        return math.inf if m_c != m_b else 0.0
    return (m_c - m_b) / se


def stage_drivers(
    requests: pl.DataFrame,
    stage: str,
    seconds: Mapping[str, float] | None = None,
    totals: Mapping[str, int] | None = None,
    uncached: pl.Expr | None = None,
) -> dict[str, float]:
    """Why did a stage take longer? log-ratio terms (only those that rose >= 10 %).

    ``prefill`` time = prompt tokens x uncached fraction x seconds per uncached token, so
    its change splits into ``traffic_mix`` (longer prompts), ``prefix_cache`` (a smaller cached
    fraction) and ``prefill_slowdown`` (slower per token). ``decode`` time = output tokens x
    seconds per token: ``traffic_mix`` and ``decode_slowdown``. Means over all requests.

    Decode steps share the engine with prefill chunks, so a decode slowdown that comes with
    more uncached prompt tokens per second on each replica (given ``seconds`` and ``totals`` per
    side) is credited, up to the size of that prefill pressure, to what raised the pressure: longer
    prompts (``traffic_mix``), a smaller cached fraction (``prefix_cache``), more arrivals or fewer
    replicas (``load``, ``capacity``: :func:`offered_load_terms`; a replica's steps carry only its
    own arrivals' prefill, so a canary serving twice the traffic on twice the replicas adds none).
    ``uncached``: as :func:`queue_drivers` (given, the cached share counts as known).
    """
    import polars as pl

    if stage not in ("prefill", "decode"):
        return {}
    agg = {
        r["side"]: r
        for r in requests.group_by("side")
        .agg(
            pl.col("input_tokens").cast(pl.Float64).mean().alias("inp"),
            _uncached(uncached).cast(pl.Float64).mean().alias("new"),
            (pl.col("cached_tokens").is_not_null().any() | pl.lit(uncached is not None)).alias("has_cache"),
            pl.col("output_tokens").cast(pl.Float64).mean().alias("out"),
            pl.col("prefill_s").mean().alias("prefill"),
            pl.col("decode_s").mean().alias("decode"),
            replicas_expr().alias("replicas"),
        )
        .to_dicts()
    }
    if set(agg) != {"baseline", "candidate"}:
        return {}
    b, c = agg["baseline"], agg["candidate"]
    terms: dict[str, float] = {}

    def add(name: str, num: float | None, den: float | None) -> None:
        if num and den and num / den >= 1 + DRIVER_MIN_CHANGE:
            terms[name] = terms.get(name, 0.0) + math.log(num / den)

    if stage == "prefill":
        add("traffic_mix", c["inp"], b["inp"])
        if b["has_cache"] and c["has_cache"] and b["inp"] and c["inp"]:
            add("prefix_cache", (c["new"] or 0.0) / c["inp"], (b["new"] or 0.0) / b["inp"])
            tokens_b, tokens_c = b["new"], c["new"]
        else:
            tokens_b, tokens_c = b["inp"], c["inp"]
        if tokens_b and tokens_c and b["prefill"] is not None and c["prefill"] is not None:
            add("prefill_slowdown", c["prefill"] / tokens_c, b["prefill"] / tokens_b)
    else:
        add("traffic_mix", c["out"], b["out"])
        if b["out"] and c["out"] and b["decode"] is not None and c["decode"] is not None:
            add("decode_slowdown", c["decode"] / c["out"], b["decode"] / b["out"])
        slowdown = terms.get("decode_slowdown", 0.0)
        if slowdown > 0 and seconds and totals and b["inp"] and c["inp"]:
            rate_b, rate_c = totals["baseline"] / seconds["baseline"], totals["candidate"] / seconds["candidate"]
            log_reps = math.log(b["replicas"] / c["replicas"]) if b["replicas"] and c["replicas"] else 0.0
            pressure = offered_load_terms(math.log(rate_c / rate_b), log_reps) if rate_b and rate_c else {}
            for name, num, den in (
                ("traffic_mix", c["inp"], b["inp"]),
                ("prefix_cache", (c["new"] or 0.0) / c["inp"], (b["new"] or 0.0) / b["inp"]),
            ):
                if num and den and num / den >= 1 + DRIVER_MIN_CHANGE:
                    pressure[name] = math.log(num / den)
            total_pressure = sum(pressure.values())
            if total_pressure > 0:
                moved = min(slowdown, total_pressure)
                terms["decode_slowdown"] = slowdown - moved
                for name, value in pressure.items():
                    terms[name] = terms.get(name, 0.0) + moved * value / total_pressure
                if terms["decode_slowdown"] <= 0:
                    del terms["decode_slowdown"]
    return terms
