"""Prefix-cache hit rate fell, so more of every prompt is prefilled again.

Mechanism: a prompt token found in the prefix cache is not recomputed. When
the hit rate falls (caching switched off, a template or tokenizer change that
breaks the shared prefix, evictions), each request prefills more tokens, which
raises prefill time and TTFT (and, through busier steps, everything else).

Signals (the first available gives the headline hit rate; all are evidence):

* spans: token-weighted hit rate ``sum(cached_tokens) / sum(input_tokens)``
  per side, with a cluster-robust SE over time slices;
* vLLM counters: ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``
  deltas within each window (never the raw cumulative values);
* SGLang: the ``sglang:cache_hit_rate`` gauge, mean per window.

``explained`` (share of the headline excess, 0..1): the extra uncached
prefill the drop implies for the candidate's tail requests, in seconds,
``drop x mean input tokens of the tail x baseline prefill seconds per
uncached token``, divided by the headline's excess (candidate - baseline
quantile, seconds), plus the queue's share of the tail excess when the offered
load per replica did not move (more work per request at the same arrival rate
fills the slots: ``_load.service_time_queue_share``; without engine spans, the
engine histograms' mean queue time over the headline's,
``_load.metric_queue_share``). For decode-side headlines (TPOT/ITL) the
mechanism acts through prefill chunks sharing steps with decodes, so
``explained`` is then the relative rise of tokens computed per request (newly
uncached prompt tokens over the baseline's uncached prompt + output tokens),
capped at 1; for other headlines the decode stage's share of the tail excess
times that same rise is added (the tail's decode steps carry the extra prefill
too).

The drop is measured against the hit rate *expected* for the candidate's
prompts under the baseline's caching (see ``_expected_hit_rate``), so a
longer-prompt mix is not read as a cache failure.

``explained`` is 0 when the headline is the error rate (no latency mechanism
accounts for failed requests).

``confidence``: spans: significance of the drop's z score times
``min(1, drop / 0.2)``; counters or gauge only (exact totals without a
per-request variance): ``0.85 x min(1, drop / 0.2)``; x 0.2 when the drop is
confined to a slice with no baseline requests (a new tenant's prompts had
nothing cached before: the mix's change); x 0.3 when each running request holds
>= 15 % more of the KV cache than its own tokens explain (a smaller pool evicts
the cached prefixes: kv_pressure's finding).

Quiet (``None``) when the hit rate fell by less than 5 points or 10 %;
:class:`RuleSkipped` when no hit-rate signal exists on both sides.
"""

from __future__ import annotations

import math
from typing import Final

import polars as pl

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import StageDecomposition
from sre_agent.analysis.metric_view import MetricView
from sre_agent.analysis.rules_api import SIDES, Evidence, Finding, Regression, RuleSkipped, SidePair
from sre_agent.rules._load import metric_queue_share, pool_shrank_by, service_time_queue_share
from sre_agent.rules._mechanism import (
    HIT_RATE_DROP,
    MIN_BUCKET,
    clip01,
    confined_slice,
    headline_column,
    latency_share,
    metric_hit_rate,
    pow2_bucket,
    ratio_estimate,
    rnd,
    side,
    significance,
    z_change,
)

#: Smallest drop of the hit rate worth a finding: absolute (fraction of prompt tokens), and relative.
MIN_DROP, MIN_RELATIVE_DROP = HIT_RATE_DROP
#: Drop at which the effect counts as unmistakable.
FULL_DROP: Final[float] = 0.20
#: Confidence ceiling for hit rates known only from metric totals.
METRIC_ONLY_CONFIDENCE: Final[float] = 0.85
#: Confidence kept by a drop confined to traffic that did not exist before the deploy (the mix's).
NEW_SLICE_DAMPING: Final[float] = 0.2
#: Confidence kept when the KV pool itself shrank: its evictions are the drop's cause.
SMALLER_POOL_DAMPING: Final[float] = 0.3

NEXT_CHECK: Final[str] = (
    "compare prefix hashes of the system prompt before and after; check enable_prefix_caching (or SGLang's "
    "--disable-radix-cache), the chat template and the tokenizer version; check cache evictions"
)


def _expected_hit_rate(frame: pl.DataFrame, with_cache: pl.DataFrame | None, baseline_rate: float) -> float:
    """The hit rate the candidate's prompts would get under the baseline's caching.

    A longer-prompt mix lowers the token-weighted hit rate without any cache
    change (the shared prefix is a smaller part of each prompt). With
    per-request cached tokens: the baseline's hit rate per prompt-length
    bucket (x2), weighted by the candidate's prompt tokens per bucket. With
    totals only: the lower of the baseline rate and the baseline's cached
    tokens per request over the candidate's mean prompt.
    """
    if with_cache is not None:
        data = with_cache.with_columns(pow2_bucket("input_tokens").alias("_len"))
        per_bucket = (
            side(data, "baseline")
            .group_by("_len")
            .agg((pl.col("cached_tokens").clip(0, None).sum() / pl.col("input_tokens").sum()).alias("_hit"))
        )
        cand = side(data, "candidate").join(per_bucket, on="_len", how="left")
        total = float(cand["input_tokens"].sum())
        if total <= 0:
            return baseline_rate
        weighted = cand.select((pl.col("input_tokens") * pl.col("_hit").fill_null(baseline_rate)).sum()).item()
        return float(weighted) / total
    means = [side(frame, s)["input_tokens"].mean() for s in SIDES]
    if isinstance(means[0], int | float) and isinstance(means[1], int | float) and means[1] > 0:
        return baseline_rate * min(1.0, float(means[0]) / float(means[1]))
    return baseline_rate


def _counter_share(metrics: MetricView, rate: SidePair, drop: float, regression: Regression) -> float:
    """Without request spans: how much of the headline the extra prefill work accounts for, 0..1.

    From the candidate's counter deltas, tokens the engine computes are
    ``P (1 - hit) + G``; the drop adds ``drop x P``. For a TPOT/ITL headline every
    computed token shares the steps; for TTFT/e2e/queue only the uncached prompt
    tokens do. The share is ``log(1 + added / computed) / log(headline ratio)``.
    """
    prompt, generated = (
        metrics.counter_delta("prompt_tokens").candidate,
        metrics.counter_delta("generation_tokens").candidate,
    )
    ratio = regression.ratio
    if not prompt or ratio is None or ratio <= 1 or rate.baseline is None:
        return 0.0
    computed = prompt * (1 - rate.baseline)
    if regression.metric in ("tpot", "itl", "decode"):
        computed += generated or 0.0
    if computed <= 0:
        return 1.0
    return clip01(math.log1p(drop * prompt / computed) / math.log(ratio))


def prefix_cache(
    comparison: Comparison,
    regression: Regression,
    metrics: MetricView,
    dimensions: list[str],
    stages: StageDecomposition,
) -> Finding | None:
    """A ``prefix_cache`` finding when the prefix-cache hit rate fell (see module docstring)."""
    frame = comparison.requests.filter(pl.col("input_tokens") > 0)
    with_cache = frame.filter(pl.col("cached_tokens").is_not_null())
    evidence: list[Evidence] = []
    span_rate: SidePair | None = None
    z = 0.0
    if min(side(with_cache, s).height for s in SIDES) >= MIN_BUCKET:
        cached, prompt = pl.col("cached_tokens").clip(0, None), pl.col("input_tokens")
        eb = ratio_estimate(side(with_cache, "baseline"), cached, prompt)
        ec = ratio_estimate(side(with_cache, "candidate"), cached, prompt)
        span_rate, z = SidePair(eb.value, ec.value), -z_change(eb, ec)
        evidence.append(
            Evidence("prefix_cache_hit_rate", rnd(eb.value), rnd(ec.value),
                     f"cached / input tokens on spans, token-weighted; drop z = {z:.1f}")
        )  # fmt: skip
    metric = metric_hit_rate(metrics, comparison.request_counts)
    if metric is not None:
        evidence.append(Evidence("prefix_cache_hit_rate_metrics", rnd(metric[0].baseline), rnd(metric[0].candidate),
                                 metric[1]))  # fmt: skip
    rate = span_rate if span_rate is not None else (metric[0] if metric is not None else None)
    if rate is None or rate.baseline is None or rate.candidate is None:
        raise RuleSkipped("no prefix-cache signal: neither cached_tokens on spans nor hit/query counters or gauge")
    expected = _expected_hit_rate(frame, with_cache if span_rate is not None else None, rate.baseline)
    evidence.append(
        Evidence("prefix_cache_hit_rate_expected", rnd(rate.baseline), rnd(expected),
                 "the candidate's prompts under the baseline's caching (prompt-length mix adjusted)")
    )  # fmt: skip
    drop = expected - rate.candidate
    if drop < MIN_DROP or drop < MIN_RELATIVE_DROP * expected:
        return None
    confidence = min(1.0, drop / FULL_DROP) * (significance(z) if span_rate is not None else METRIC_ONLY_CONFIDENCE)

    # Extra uncached prefill implied by the drop, priced at the baseline's prefill seconds per uncached token.
    hit_b = rate.baseline
    uncached = pl.col("input_tokens") - pl.col("cached_tokens").fill_null(pl.col("input_tokens") * hit_b)
    base = side(frame, "baseline").filter(pl.col("prefill_s").is_not_null())
    seconds_per_token = None
    if base.height:
        tokens = float(base.select(uncached.clip(1, None).sum()).item())
        seconds_per_token = float(base["prefill_s"].sum()) / tokens if tokens > 0 else None
    col = headline_column(regression, frame.columns)
    cand = side(frame, "candidate").filter(pl.col(col).is_not_null())
    excess = regression.excess
    explained = 0.0
    shared_steps = 0.0  # the share of a decode-time rise the extra prefill in shared steps accounts for
    if frame.height and cand.height:
        # Decode steps share the engine with prefill chunks (V0: prefill steps the decodes wait
        # through): they now carry this much more work.
        base_tokens = float(cand.select((pl.col("input_tokens") * (1 - rate.baseline)).sum()).item()) + float(
            cand["output_tokens"].fill_null(0).sum()
        )
        extra_tokens = drop * float(cand["input_tokens"].sum())
        shared_steps = clip01(extra_tokens / base_tokens) if base_tokens > 0 else 0.0
        evidence.append(
            Evidence("tokens_computed_per_request", rnd(base_tokens / max(1, cand.height), 1),
                     rnd((base_tokens + extra_tokens) / max(1, cand.height), 1),
                     "uncached prompt + output tokens: the extra prefill shares steps with decodes")
        )  # fmt: skip
    if regression.metric in ("tpot", "itl", "decode") and frame.height:
        explained = shared_steps
    elif not frame.height:
        explained = _counter_share(metrics, rate, drop, regression)
        evidence.append(
            Evidence("explained_by_counters", None, rnd(explained),
                     "log rise of tokens computed (uncached prompt + output) over the log headline ratio")
        )  # fmt: skip
        queue = metric_queue_share(comparison, regression, metrics)
        if queue > 0:
            # As with spans below: more work per request at the same load queues requests, and
            # near saturation far more than the work's own log rise (dev 1210224: +9 % of tokens
            # computed, TTFT p99 x3.1, nearly all of it the histogram's queue time).
            explained = clip01(explained + queue)
            why = "mean queue time's rise over the headline's (engine histograms): more work at the same load"
            evidence.append(Evidence("queue_share_at_same_load", None, rnd(queue), why))
    elif cand.height and seconds_per_token is not None and excess is not None and excess > 0:
        threshold = cand[col].quantile(regression.quantile, interpolation="lower")
        tail = cand.filter(pl.col(col) >= threshold)
        extra_s = drop * float(tail["input_tokens"].mean()) * seconds_per_token  # type: ignore[arg-type]
        explained = clip01(extra_s / excess)
        evidence.append(
            Evidence("extra_uncached_prefill_s_per_tail_request", 0.0, rnd(extra_s),
                     f"{explained:.0%} of the {regression.metric} p{round(regression.quantile * 100)} excess "
                     f"({excess:.4f} s) at {seconds_per_token * 1e3:.3f} ms per uncached token")
        )  # fmt: skip
        decode = stages.shares.get("decode", 0.0) * shared_steps
        if decode > 0:
            # The tail's decode time grew too: its steps carry the extra prefill (as for a TPOT headline).
            explained = clip01(explained + decode)
            evidence.append(Evidence("decode_share_from_shared_steps", None, rnd(decode),
                                     f"decode share of the tail excess ({stages.shares.get('decode', 0.0):.0%}) x "
                                     f"the rise of tokens computed per request ({shared_steps:.0%})"))  # fmt: skip
        queue = service_time_queue_share(comparison, stages, regression, metrics)
        if queue > 0:
            # Each request now brings more prefill work to the same replicas at the same arrival rate:
            # utilisation rises and requests queue (Little's law; steeply near saturation).
            explained = clip01(explained + queue)
            evidence.append(Evidence("queue_share_at_same_load", None, rnd(queue),
                                     "queue share of the tail excess: more work per request at the same load "
                                     "per replica"))  # fmt: skip
    scope: dict[str, str] = {}
    if span_rate is not None:
        found = confined_slice(with_cache, dimensions, pl.col("cached_tokens"), pl.col("input_tokens"), direction=-1)
        if found is not None:
            scope = {found[0]: found[1]}
            evidence.append(Evidence(f"hit_rate_drop_share[{found[0]}={found[1]}]", None, rnd(found[2]),
                                     f"share of the lost cached tokens; {found[3]:.0%} of the traffic"))  # fmt: skip
            in_baseline = (
                side(with_cache, "baseline")
                .filter(pl.col(found[0]).cast(pl.String).fill_null("(missing)") == found[1])
                .height
            )
            if in_baseline == 0:
                # The cached tokens were lost in traffic that did not exist before the deploy (a new
                # tenant): its prompts had nothing cached under the baseline, so the drop is the new
                # traffic's (traffic_mix), not a cache that got worse (dev 1100231: 96 % of the
                # lost cached tokens in a new tenant sending 16 % of the traffic).
                confidence *= NEW_SLICE_DAMPING
                evidence.append(Evidence(f"baseline_requests[{found[0]}={found[1]}]", 0, 0,
                                         "new since the deploy: nothing of it was cached before"))  # fmt: skip
    smaller = pool_shrank_by(comparison, metrics)
    if smaller is not None:
        # Each running request holds more of the KV cache than its own tokens explain: the pool
        # shrank, and a smaller pool evicts the cached prefixes (kv_pressure's finding; dev
        # 1150228: num_gpu_blocks cut, hit rate 34 % -> 9 %, KV per running request x6.4 against
        # x1.45 of the tokens it holds).
        confidence *= SMALLER_POOL_DAMPING
        evidence.append(Evidence("kv_share_per_running_beyond_its_tokens", 1.0, rnd(smaller),
                                 "the pool shrank: a smaller cache evicts the cached prefixes"))  # fmt: skip
    where = f" in {next(iter(scope))}={next(iter(scope.values()))}" if scope else ""
    return Finding(
        cause="prefix_cache",
        title=f"Prefix-cache hit rate fell {rate.baseline:.0%} -> {rate.candidate:.0%}{where}: "
        f"{drop:.0%} more of each prompt is prefilled again",
        explained=latency_share(regression, explained),
        confidence=confidence,
        stage="prefill",
        scope=scope,
        evidence=tuple(evidence),
        next_check=NEXT_CHECK,
    )
