"""Stage decomposition of the tail on hand-built request frames (what a comparison's ``requests`` holds)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import pytest

from sre_agent.decompose import offered_load_terms, stage_decomposition, stage_drivers
from sre_agent.rules_api import Regression


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


def test_a_canary_serving_more_traffic_on_more_replicas_brings_no_prefill_pressure() -> None:
    # Each replica of both versions gets the same arrivals; the candidate runs on twice the replicas,
    # so its arrival rate doubled. A replica's steps carry its own arrivals' prefill only: the slower
    # decode is the candidate's own, not load's (the raw arrival rate credited x2 to load before).
    frame = _split_frame(
        replicas={"baseline": 1, "candidate": 2}, per_replica=60, tpot={"baseline": 0.05, "candidate": 0.1}
    )
    terms = stage_drivers(
        frame, "decode", {"baseline": 300.0, "candidate": 300.0}, {"baseline": 1000, "candidate": 2000}
    )
    assert set(terms) == {"decode_slowdown"}
    assert abs(terms["decode_slowdown"] - math.log(2.0)) < 0.05


def test_more_arrivals_per_replica_still_own_the_decode_steps_they_crowd() -> None:
    # Control: the same replicas get twice the arrivals, so every step carries more prefill.
    frame = _split_frame(
        replicas={"baseline": 2, "candidate": 2}, per_replica=60, tpot={"baseline": 0.05, "candidate": 0.1}
    )
    terms = stage_drivers(
        frame, "decode", {"baseline": 300.0, "candidate": 300.0}, {"baseline": 1000, "candidate": 2000}
    )
    assert terms.get("load", 0.0) > 0.5


def test_fewer_replicas_for_the_same_arrivals_are_capacity_in_the_decode_steps() -> None:
    frame = _split_frame(
        replicas={"baseline": 4, "candidate": 2}, per_replica=60, tpot={"baseline": 0.05, "candidate": 0.1}
    )
    terms = stage_drivers(
        frame, "decode", {"baseline": 300.0, "candidate": 300.0}, {"baseline": 1000, "candidate": 1000}
    )
    assert terms.get("capacity", 0.0) > 0.5
    assert "load" not in terms


def test_offered_load_terms_net_arrivals_against_replicas() -> None:
    assert offered_load_terms(math.log(2.0), math.log(0.5)) == {}
    assert offered_load_terms(math.log(2.0), 0.0) == {"load": pytest.approx(math.log(2.0))}
    both = offered_load_terms(math.log(1.5), math.log(2.0))
    assert set(both) == {"load", "capacity"}
    assert sum(both.values()) == pytest.approx(math.log(3.0))
    assert offered_load_terms(math.log(1.05), 0.0) == {}
