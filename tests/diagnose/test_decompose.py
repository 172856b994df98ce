"""Stage decomposition of the tail on hand-built request frames (what a comparison's ``requests`` holds)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import pytest

from sre_agent.analysis.decompose import offered_load_terms, queue_drivers, stage_decomposition, stage_drivers
from sre_agent.analysis.rules_api import Regression


@dataclass
class _Requests:
    requests: pl.DataFrame


def _requests(*, decode_scale: float, dependency_add_s: float, tpot_scale: float = 1.0) -> _Requests:
    """800 requests a side with queue, prefill, decode (tpot x 99 tokens), gateway and dependency time."""
    rng = np.random.default_rng(3)
    rows = []
    for side in ("baseline", "candidate"):
        cand = side == "candidate"
        for _ in range(800):
            queue, prefill = float(rng.exponential(0.05)), float(rng.lognormal(np.log(0.2), 0.3))
            tpot = float(rng.lognormal(np.log(0.02), 0.3)) * (tpot_scale if cand else 1.0)
            decode = tpot * 99 * (decode_scale if cand else 1.0)
            dependency = 0.05 + (dependency_add_s if cand else 0.0)
            e2e = queue + prefill + decode
            rows.append({"side": side, "queue_s": queue, "prefill_s": prefill, "decode_s": decode, "tpot_s": tpot,
                         "e2e_s": e2e, "ttft_s": queue + prefill, "gateway_s": 0.003, "dependency_s": dependency,
                         "trace_s": e2e + 0.003 + dependency})  # fmt: skip
    return _Requests(pl.DataFrame(rows))


def _regression(metric: str) -> Regression:
    return Regression(metric=metric, quantile=0.9, baseline=1.0, candidate=1.5, ci=None, significant=True)


def test_a_tail_that_did_not_grow_has_no_stage_holding_its_excess() -> None:
    # Decode fell by 5 % while the dependency rose 10 ms: the e2e tail shrank. Before, the
    # dependency held "100 % of the tail excess" (the stage fallback then named it).
    frames = _requests(decode_scale=0.95, dependency_add_s=0.01)
    result = stage_decomposition(frames, _regression("e2e"))  # type: ignore[arg-type]
    assert result.excess("dependency") > 0 > result.excess("decode")
    assert result.shares == {}


def test_a_tail_that_grew_is_split_by_stage() -> None:
    frames = _requests(decode_scale=1.5, dependency_add_s=0.01)
    result = stage_decomposition(frames, _regression("e2e"))  # type: ignore[arg-type]
    assert result.dominant == "decode"
    assert abs(sum(result.shares.values()) - 1.0) < 1e-9


def test_an_itl_headline_is_split_on_tpot_not_on_the_e2e_tail() -> None:
    # ITL comes from the engines' histograms; the requests carry its counterpart, TPOT.
    frames = _requests(decode_scale=1.0, dependency_add_s=0.0, tpot_scale=1.4)
    result = stage_decomposition(frames, _regression("itl"))  # type: ignore[arg-type]
    assert result.metric == "tpot"
    assert result.shares == {"decode": 1.0}


def test_a_tpot_headline_is_split_in_its_own_unit() -> None:
    # The TPOT tail's decode stage is its TPOT (seconds per token), not its decode seconds:
    # the requests with the highest TPOT are often short answers with little decode time.
    frames = _requests(decode_scale=1.0, dependency_add_s=0.0, tpot_scale=1.4)
    result = stage_decomposition(frames, _regression("tpot"))  # type: ignore[arg-type]
    assert result.shares == {"decode": 1.0}
    assert 0.02 < result.baseline["decode"] < 0.2
    assert result.candidate["decode"] / result.baseline["decode"] > 1.3


def _split_frame(*, replicas: dict[str, int], per_replica: int, tpot: dict[str, float]) -> pl.DataFrame:
    """Requests of equal shape on each side, spread over that side's replicas; decode time = tokens x tpot."""
    rows = []
    for side, count in replicas.items():
        for r in range(count):
            for i in range(per_replica):
                rows.append({
                    "side": side, "service_instance": f"{side}-{r}", "host_name": None,
                    "input_tokens": 2000, "cached_tokens": 0, "output_tokens": 200,
                    "prefill_s": 0.4, "decode_s": 200 * tpot[side] * (1 + 0.01 * (i % 3)),
                })  # fmt: skip
    return pl.DataFrame(rows)


@pytest.mark.parametrize(
    ("replicas", "candidate_requests", "expected"),
    [
        # Each replica of both versions gets the same arrivals; the candidate runs on twice the
        # replicas, so its arrival rate doubled. A replica's steps carry its own arrivals' prefill
        # only: the slower decode is the candidate's own, not load's (the raw arrival rate
        # credited it to load before).
        ((1, 2), 2000, "decode_slowdown"),
        # Controls: the same replicas get twice the arrivals, so every step carries more prefill...
        ((2, 2), 2000, "load"),
        # ...and half the replicas serve the same arrivals (before: all of it decode_slowdown).
        ((4, 2), 1000, "capacity"),
    ],
)
def test_decode_prefill_pressure_follows_the_offered_load_per_replica(
    replicas: tuple[int, int], candidate_requests: int, expected: str
) -> None:
    frame = _split_frame(
        replicas={"baseline": replicas[0], "candidate": replicas[1]},
        per_replica=60,
        tpot={"baseline": 0.05, "candidate": 0.1},
    )
    seconds = {"baseline": 300.0, "candidate": 300.0}
    terms = stage_drivers(frame, "decode", seconds, {"baseline": 1000, "candidate": candidate_requests})
    assert max(terms, key=lambda k: terms[k]) == expected
    assert sum(terms.values()) == pytest.approx(math.log(2.0), abs=0.05)
    if expected != "load":
        assert "load" not in terms


def test_offered_load_terms_net_arrivals_against_replicas() -> None:
    assert offered_load_terms(math.log(2.0), math.log(0.5)) == {}
    assert offered_load_terms(math.log(2.0), 0.0) == {"load": pytest.approx(math.log(2.0))}
    both = offered_load_terms(math.log(1.5), math.log(2.0))
    assert set(both) == {"load", "capacity"}
    assert sum(both.values()) == pytest.approx(math.log(3.0))
    assert offered_load_terms(math.log(1.05), 0.0) == {}


def _cache_frame(*, cached: dict[str, float | None], input_tokens: dict[str, int]) -> pl.DataFrame:
    """400 requests a side on 2 replicas: prefill at 1 ms per uncached token, 100 output tokens at 20 ms."""
    rows = []
    for side in ("baseline", "candidate"):
        share = cached[side]
        for i in range(400):
            prompt = input_tokens[side]
            uncached = prompt * (1 - (share or 0.0)) if share is not None else prompt * 0.6
            rows.append({"side": side, "input_tokens": prompt, "output_tokens": 100,
                         "cached_tokens": None if share is None else int(prompt * share),
                         "prefill_s": 0.001 * uncached, "decode_s": 2.0, "host_name": f"r{i % 2}",
                         "service_instance": f"r{i % 2}", "service_name": "vllm"})  # fmt: skip
    return pl.DataFrame(rows, infer_schema_length=None)


def test_queue_work_from_a_cache_that_stopped_hitting_is_the_caches_not_the_mixs() -> None:
    # The same prompts, 40 % of them cached before and none after: every request brings more
    # prefill work, and the mix did not change (before: the whole rise was traffic_mix's).
    seconds, counts = {"baseline": 300.0, "candidate": 300.0}, {"baseline": 400, "candidate": 400}
    frame = _cache_frame(cached={"baseline": 0.4, "candidate": 0.0}, input_tokens={"baseline": 8000, "candidate": 8000})
    terms = queue_drivers(frame, seconds, counts)
    assert set(terms) == {"prefix_cache"}
    # work: 4.8 s of prefill + 2 s of decode -> 8 + 2 s
    assert terms["prefix_cache"] == pytest.approx(math.log(10.0 / 6.8), rel=1e-6)
    # Longer prompts at the same cached share are the mix's.
    longer = _cache_frame(
        cached={"baseline": 0.4, "candidate": 0.4}, input_tokens={"baseline": 4000, "candidate": 8000}
    )
    assert set(queue_drivers(longer, seconds, counts)) == {"traffic_mix"}


def test_queue_drivers_take_the_uncached_tokens_they_are_given() -> None:
    # Spans without cached-token counts (vLLM V0): read as "nothing cached", the prompts' prefill
    # per token rose 1/0.6 x and the cache's part became prefill_slowdown. The counters' hit rate
    # (40 % -> 0 %) given as the uncached tokens puts it back on the cache.
    seconds, counts = {"baseline": 300.0, "candidate": 300.0}, {"baseline": 400, "candidate": 400}
    frame = _cache_frame(
        cached={"baseline": None, "candidate": 0.0}, input_tokens={"baseline": 8000, "candidate": 8000}
    )
    frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("cached_tokens"))
    assert "prefill_slowdown" in queue_drivers(frame, seconds, counts)
    hit = pl.when(pl.col("side") == "baseline").then(0.4).otherwise(0.0)
    given = queue_drivers(frame, seconds, counts, uncached=pl.col("input_tokens") * (1 - hit))
    assert set(given) == {"prefix_cache"}


def _bursty_mix(seed: int, *, candidate_scale: float) -> pl.DataFrame:
    """400 requests a side over 40 time slices; each slice's prompts and answers share a burst factor.

    Token counts are lognormal (sigma 1.2, as Azure's code trace is heavy-tailed) times a per-slice
    factor (sigma 0.8): a few slices carry much of a window's work, as bursts of one tenant do.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for side in ("baseline", "candidate"):
        scale = candidate_scale if side == "candidate" else 1.0
        for k in range(40):
            burst = float(rng.lognormal(0.0, 0.8))
            for _ in range(10):
                rows.append({"side": side, "slice": k, "host_name": "r0", "service_instance": "r0",
                             "input_tokens": int(2000 * scale * burst * rng.lognormal(0.0, 1.2)),
                             "output_tokens": int(30 * scale * burst * rng.lognormal(0.0, 1.2)) + 1,
                             "cached_tokens": 0, "prefill_s": 0.2, "decode_s": 1.0})  # fmt: skip
    return pl.DataFrame(rows)


def test_a_heavier_mix_must_clear_the_spread_of_bursty_token_counts() -> None:
    # Two halves of one bursty stream differ in work per request by chance (dev 1210193: a canary
    # split's versions, +29 %, read as a heavier mix that queued). The mix term counts only when
    # the mean work moved beyond its cluster-robust spread over time slices.
    seconds, counts = {"baseline": 300.0, "candidate": 300.0}, {"baseline": 400, "candidate": 400}
    same = [queue_drivers(_bursty_mix(seed, candidate_scale=1.0), seconds, counts) for seed in range(60)]
    heavier = [queue_drivers(_bursty_mix(seed, candidate_scale=2.0), seconds, counts) for seed in range(60)]
    # Without the test, "traffic_mix" appears whenever chance put +10 % on the candidate's side.
    assert sum("traffic_mix" in terms for terms in same) <= 3
    assert sum("traffic_mix" in terms for terms in heavier) >= 45
