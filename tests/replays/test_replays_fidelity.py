"""Fidelity of the engine simulator: queueing identities and the direction engine mechanics predict."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from replay_fixtures import TRACES, scenario_with

from sre_agent.replays.engine import EngineConfig, Replica
from sre_agent.replays.outputs import MemoryOutput
from sre_agent.replays.replay import build_workload_for, replay, run_scenario
from sre_agent.replays.stats import ITL_BUCKETS, Histogram
from sre_agent.replays.workload import Tenant, load_trace, measured_prefix_reuse

LONG_PROMPTS = (
    Tenant("docs", 1.0, 512, 0.2, input_scale=8.0, routes={"/v1/rag/chat": 1.0}),
    Tenant("acme", 1.0, 512, 0.5),
)


def _merged_itl(replicas: list[Replica]) -> Histogram:
    merged = Histogram(ITL_BUCKETS)
    for r in replicas:
        merged.counts = [a + b for a, b in zip(merged.counts, r.stats.itl.counts, strict=True)]
        merged.count += r.stats.itl.count
    return merged


def test_littles_law_holds_per_replica() -> None:
    """Time-averaged gauges (running + waiting, scraped every 5 s) = arrival rate x mean time in engine, within 10%."""
    sc = scenario_with(duration_s=600)
    out = MemoryOutput()
    result = replay(sc, out)
    scrapes: dict[str, list[float]] = {r.name: [] for r in result.replicas}
    for data in out.metrics:
        for rm in data.resource_metrics:
            host = str(rm.resource.attributes["host.name"])
            gauges = {m.name: m.data.data_points[0] for m in rm.scope_metrics[0].metrics}
            running, waiting = gauges["vllm:num_requests_running"], gauges["vllm:num_requests_waiting"]
            scrapes[host].append(running.value + waiting.value)  # type: ignore[union-attr]
    for replica in result.replicas:
        seqs = [
            a.seq
            for rec in result.records
            for a in rec.attempts
            if a.replica == replica.name and a.seq is not None and a.seq.finish_s >= 0
        ]
        horizon = 5.0 * (len(scrapes[replica.name]) - 1)
        inside = [s for s in seqs if s.arrival_s < horizon]
        arrival_rate = len(inside) / horizon
        mean_time = statistics.fmean(s.finish_s - s.arrival_s for s in inside)
        mean_in_system = statistics.fmean(scrapes[replica.name])
        assert mean_in_system > 1.0, "the replica must actually be loaded for the check to mean anything"
        assert mean_in_system == pytest.approx(arrival_rate * mean_time, rel=0.10), replica.name


def test_bigger_budget_with_chunking_off_raises_itl_p99_under_long_prompts() -> None:
    chunked = EngineConfig(enable_chunked_prefill=True, max_num_batched_tokens=512)
    whole = EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=32768)
    runs = {}
    for name, cfg in (("chunked", chunked), ("whole", whole)):
        sc = scenario_with(engine=cfg, duration_s=400, tenants=LONG_PROMPTS, rate_scale=0.5)
        runs[name] = _merged_itl(run_scenario(sc).replicas).quantile(0.99)
    # A whole 8k-token prompt in one step stalls every running decode for that step.
    assert runs["whole"] > 2.0 * runs["chunked"]


def test_prefix_cache_off_raises_prefill_tokens_by_the_measured_hit_ratio() -> None:
    on = scenario_with(duration_s=600, replicas=1, rate_scale=0.5, loop_s=None)
    off = dataclasses.replace(on, engine_before=EngineConfig(enable_prefix_caching=False))
    off = dataclasses.replace(off, engine_after=off.engine_before)
    reuse = measured_prefix_reuse(build_workload_for(on))
    stats_on = run_scenario(on).replicas[0].stats
    stats_off = run_scenario(off).replicas[0].stats
    assert stats_on.preemptions == stats_off.preemptions == 0
    hit = stats_on.prefix_cache_hits / stats_on.prefix_cache_queries
    assert 0.2 < reuse < 0.6
    assert hit == pytest.approx(reuse, abs=0.03)
    assert stats_off.prefix_cache_queries == 0  # vLLM records no prefix-cache stats with caching off
    # every cached token is a prefill token the cache-less engine computes
    assert stats_off.prefill_tokens_computed / stats_on.prefill_tokens_computed == pytest.approx(
        1 / (1 - reuse), rel=0.05
    )


def test_halving_kv_blocks_raises_preemptions() -> None:
    preemptions = {}
    for blocks in (1400, 700):
        sc = scenario_with(
            engine=EngineConfig(num_gpu_blocks=blocks),
            duration_s=400,
            replicas=1,
            profile="llama3-70b-h100x4",
            rate_scale=0.6,
        )
        result = run_scenario(sc)
        preemptions[blocks] = result.replicas[0].stats.preemptions
    assert preemptions[700] > 2 * max(1, preemptions[1400])


def test_merged_decode_runs_equal_stepping_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = scenario_with(duration_s=120)
    merged = run_scenario(sc)
    monkeypatch.setattr(Replica, "merge_decode_steps", False)
    stepped = run_scenario(sc)
    assert sum(r.stats.steps for r in merged.replicas) == sum(r.stats.steps for r in stepped.replicas)
    for a, b in zip(merged.records, stepped.records, strict=True):
        assert a.req.request_id == b.req.request_id
        assert a.end_s == pytest.approx(b.end_s, abs=1e-6)
    # merging is the point: far fewer scheduler calls
    assert sum(r.stats.steps for r in merged.replicas) > 5 * len(merged.records)


def test_mooncake_prefix_hits_match_the_trace_reuse() -> None:
    """The README's measure on the whole trace is 37.4%; the engine reproduces the measure it is fed."""
    rows = load_trace(str(TRACES / "mooncake-fast25" / "conversation_trace.jsonl"))
    sc = _mooncake_scenario(duration_s=rows[-1].arrival_s + 0.001)  # exactly the trace, no wrap-around
    workload = build_workload_for(sc)
    full = measured_prefix_reuse(workload)
    assert len(rows) == len(workload) == 12031
    assert full == pytest.approx(0.374, abs=0.003)
    short = _mooncake_scenario(duration_s=240)
    stats = run_scenario(short).replicas[0].stats
    assert stats.prefix_cache_hits / stats.prefix_cache_queries == pytest.approx(
        measured_prefix_reuse(build_workload_for(short)), abs=0.01
    )


@pytest.mark.slow
def test_mooncake_whole_trace_with_unbounded_cache_hits_37_percent() -> None:
    stats = run_scenario(_mooncake_scenario(duration_s=3537.0)).replicas[0].stats
    assert stats.prefix_cache_hits / stats.prefix_cache_queries == pytest.approx(0.374, abs=0.01)


def _mooncake_scenario(duration_s: float):  # type: ignore[no-untyped-def]
    unbounded = EngineConfig(num_gpu_blocks=10**8, max_model_len=131072, max_num_batched_tokens=16384)
    sc = scenario_with(
        engine=unbounded,
        duration_s=duration_s,
        replicas=1,
        profile="llama3-8b-h100",
        trace=str(TRACES / "mooncake-fast25" / "conversation_trace.jsonl"),
        loop_s=None,
    )
    return dataclasses.replace(sc, routes={k: dataclasses.replace(v, max_tokens=2000) for k, v in sc.routes.items()})
