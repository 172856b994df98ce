"""Each mechanism rule fires on its mechanism and stays quiet when the mechanism did not move.

Stores are built from serving mechanics (``rules_synth``), never from the
scenario files. The rules run through the real runner (``diagnose`` limited
to this area's rules) so their registration and context wiring are exercised
too; each store is built and diagnosed once per session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pytest
from rules_synth import Side, build

from sre_agent.analysis.diagnosis import diagnose
from sre_agent.analysis.report import Report
from sre_agent.analysis.rules_api import Finding
from sre_agent.analysis.selection import Selection

MECHANISM_RULES = [
    "prefix_cache",
    "batch_composition",
    "kv_pressure",
    "dependency",
    "decode_slowdown",
    "prefill_slowdown",
    "retry_amplification",
    "errors",
]
BASE = Side()
V2 = replace(BASE, version="v2")

# name -> (baseline, candidate, build options)
STORES: dict[str, tuple[Side, Side, dict[str, Any]]] = {
    "null": (BASE, V2, {"gateway": True}),
    "bare": (BASE, V2, {"metrics": False, "cached_on_spans": False}),
    "cache_drop": (BASE, replace(V2, cache_hit=0.05), {}),
    "cache_drop_counters": (BASE, replace(V2, cache_hit=0.05), {"cached_on_spans": False}),
    "tpot_up": (BASE, replace(V2, tpot_s=0.032), {"metrics": False}),
    "load_up": (BASE, replace(V2, rate_rps=2 * BASE.rate_rps), {}),
    # A slower decode while the prefix cache hits more: half the uncached prompt tokens per request.
    "tpot_up_less_prefill": (BASE, replace(V2, tpot_s=0.032, cache_hit=0.75), {}),
    "prefill_up": (BASE, replace(V2, prefill_s_per_token=4e-4), {}),
    "kv_full": (BASE, replace(V2, kv_usage=0.97, preemptions=120, prefill_s_per_token=3e-4), {}),
    "kv_one_replica": (BASE, replace(V2, kv_usage=0.97, preemptions=120, preempting_replicas=(1,)), {}),
    "budget_cut": (BASE, replace(V2, step_tokens_cap=128, prefill_s_per_token=3e-4), {}),
    "budget_cut_and_load": (BASE, replace(V2, step_tokens_cap=128, rate_rps=2 * BASE.rate_rps), {}),
    # Each replica takes prompts in one at a time (a budget far below them): requests wait below the peak.
    "admitted_slower": (BASE, replace(V2, admit_s_per_token=2.5e-3), {"waiting": True}),
    # Chunks of 1024 tokens, then whole prompts: only the few prompts above 1024 uncached tokens change step.
    "budget_raised": (replace(BASE, step_tokens_cap=1024), replace(V2, step_tokens_cap=16384), {}),
    "gateway_incident": (
        BASE,
        replace(V2, retrieval_s={"acme": 0.6, "globex": 0.05}, retry_share=0.25, length_share=0.2),
        {"gateway": True},
    ),
    # A gateway's spans and the engines' metrics, no engine spans: the requests' tenants are on the roots.
    "gateway_only_dependency": (
        BASE,
        replace(V2, retrieval_s={"acme": 0.6, "globex": 0.05}),
        {"gateway": True, "engine_spans": False},
    ),
}


@pytest.fixture(scope="session")
def report(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Report]:
    """The diagnosis of a named store (built and diagnosed on first use)."""
    cache: dict[str, Report] = {}
    root = tmp_path_factory.mktemp("mechanism_rules")

    def get(name: str) -> Report:
        if name not in cache:
            baseline, candidate, options = STORES[name]
            path: Path = build(root / f"{name}.duckdb", baseline, candidate, **options)
            con = duckdb.connect(str(path), read_only=True)
            try:
                cache[name] = diagnose(con, Selection(mode="since_last_deploy"), rules=MECHANISM_RULES)
            finally:
                con.close()
            assert not cache[name].errors, cache[name].errors
        return cache[name]

    return get


def _found(report: Report, cause: str) -> list[Finding]:
    return [f for f in report.findings if f.cause == cause]


def _fires(report: Report, cause: str, min_score: float = 0.2) -> Finding:
    found = _found(report, cause)
    assert found, f"no {cause} finding; notes: {report.notes}"
    best = max(found, key=lambda f: f.score)
    assert best.score >= min_score, best
    assert best.next_check
    assert best.evidence
    return best


def _quiet(report: Report, cause: str) -> None:
    assert all(f.score < 0.1 for f in _found(report, cause)), _found(report, cause)


@pytest.mark.parametrize("cause", MECHANISM_RULES)
def test_every_rule_is_quiet_on_a_version_bump_that_changed_nothing(
    report: Callable[[str], Report], cause: str
) -> None:
    assert not _found(report("null"), cause)


def test_rules_without_their_data_skip_with_a_reason(report: Callable[[str], Report]) -> None:
    notes = report("bare").notes
    for rule in ("prefix_cache", "kv_pressure", "dependency", "retry_amplification"):
        assert any(n.startswith(f"{rule}:") for n in notes), notes


# ---------------------------------------------------------------- prefix_cache
def test_prefix_cache_fires_on_a_hit_rate_drop_with_identical_arrivals(report: Callable[[str], Report]) -> None:
    finding = _fires(report("cache_drop"), "prefix_cache")
    assert finding.stage == "prefill"
    rates = {e.signal: e for e in finding.evidence}
    assert rates["prefix_cache_hit_rate"].baseline > 0.4
    assert rates["prefix_cache_hit_rate"].candidate < 0.1
    # The same drop is visible in the counters, read as deltas per window.
    assert rates["prefix_cache_hit_rate_metrics"].candidate < 0.1
    assert finding.explained > 0.5


def test_prefix_cache_from_counters_alone(report: Callable[[str], Report]) -> None:
    finding = _fires(report("cache_drop_counters"), "prefix_cache")
    assert {e.signal for e in finding.evidence} >= {"prefix_cache_hit_rate_metrics"}
    assert "prefix_cache_hit_rate" not in {e.signal for e in finding.evidence}


def test_a_cache_drop_is_not_a_prefill_or_decode_slowdown(report: Callable[[str], Report]) -> None:
    _quiet(report("cache_drop"), "prefill_slowdown")
    _quiet(report("cache_drop"), "decode_slowdown")
    _quiet(report("cache_drop"), "batch_composition")


# ------------------------------------------------------ decode/prefill slowdown
def test_decode_slowdown_fires_when_tokens_slow_at_the_same_batch_size(report: Callable[[str], Report]) -> None:
    finding = _fires(report("tpot_up"), "decode_slowdown")
    assert finding.stage == "decode"


def test_a_decode_slowdown_with_less_prefill_per_request_is_not_damped(report: Callable[[str], Report]) -> None:
    """Less prefill per request takes prompt tokens out of the steps a decode shares: a TPOT rise at
    equal batch is then an underestimate, not the extra prefill's echo (which more prefill would be)."""
    finding = _fires(report("tpot_up_less_prefill"), "decode_slowdown")
    assert report("tpot_up_less_prefill").findings[0].cause == "decode_slowdown"
    assert finding.confidence >= 0.9


def test_more_load_raises_batch_and_tpot_but_is_not_a_decode_slowdown(report: Callable[[str], Report]) -> None:
    # Twice the arrivals: more requests run together, so each token is slower by the same
    # batch-size law on both sides. That is load, not the engine's decode step getting slower.
    result = report("load_up")
    assert result.regression.significant
    _quiet(result, "decode_slowdown")
    _quiet(result, "batch_composition")


def test_prefill_slowdown_fires_on_slower_prefill_per_uncached_token(report: Callable[[str], Report]) -> None:
    finding = _fires(report("prefill_up"), "prefill_slowdown")
    assert finding.stage == "prefill"
    assert not _found(report("prefill_up"), "prefix_cache")


# ---------------------------------------------------------------- kv_pressure
def test_kv_pressure_fires_on_preemptions_with_a_full_cache(report: Callable[[str], Report]) -> None:
    finding = _fires(report("kv_full"), "kv_pressure")
    per_request = next(e for e in finding.evidence if e.signal == "preemptions_per_request")
    assert per_request.baseline == 0
    assert per_request.candidate > 0.02
    assert not _found(report("prefill_up"), "kv_pressure")


def test_kv_pressure_is_scoped_to_the_replica_that_preempts(report: Callable[[str], Report]) -> None:
    assert _fires(report("kv_one_replica"), "kv_pressure").scope == {"host.name": "gpu-1"}
    assert _fires(report("kv_full"), "kv_pressure").scope == {}


# ---------------------------------------------------------- batch_composition
def test_batch_composition_fires_when_the_step_budget_shrinks_at_the_same_load(report: Callable[[str], Report]) -> None:
    finding = _fires(report("budget_cut"), "batch_composition")
    p99 = next(e for e in finding.evidence if e.signal == "iteration_tokens_p99")
    assert p99.candidate < p99.baseline / 1.5


def test_steps_larger_than_any_baseline_step_are_a_raised_budget(report: Callable[[str], Report]) -> None:
    """Chunked prefill off (or a larger budget) at the same load and prompts: the p99 step stays, yet
    steps beyond the baseline's largest show in too many scrape intervals for chance."""
    finding = _fires(report("budget_raised"), "batch_composition")
    assert finding.confidence >= 0.6
    assert finding.stage == "decode"
    above = next(e for e in finding.evidence if e.signal == "steps_above_baseline_largest")
    assert above.baseline == 0
    assert isinstance(above.candidate, int)
    assert above.candidate >= 8
    p99 = next(e for e in finding.evidence if e.signal == "iteration_tokens_p99")
    assert 1 / 1.5 < p99.candidate / p99.baseline < 1.5


def test_fewer_running_at_the_same_load_while_requests_wait_is_a_budget(report: Callable[[str], Report]) -> None:
    """Little's law: a slower engine keeps requests running longer, so more run; fewer running while
    more wait below the replicas' peak is the engine taking prompts in slower (a smaller budget)."""
    found = report("admitted_slower")
    finding = _fires(found, "batch_composition")
    assert found.findings[0].cause == "batch_composition", [(f.cause, f.title) for f in found.findings[:3]]
    assert finding.confidence >= 0.5
    assert any(e.signal == "running_share_of_peak_at_queues" for e in finding.evidence)


def test_batch_composition_leaves_a_load_change_to_the_load_rule(report: Callable[[str], Report]) -> None:
    assert not _found(report("budget_cut_and_load"), "batch_composition")


# ------------------------------------------- dependency, retries, errors
def test_dependency_fires_scoped_to_the_tenant_whose_retrieval_slowed(report: Callable[[str], Report]) -> None:
    finding = _fires(report("gateway_incident"), "dependency", 0.0)
    assert finding.scope == {"tenant.id": "acme"}
    assert finding.stage == "dependency"
    assert finding.confidence > 0.8


def test_dependency_is_scoped_by_the_root_spans_when_the_engine_sends_no_spans(
    report: Callable[[str], Report],
) -> None:
    # No engine spans, so no sampled engine requests to slice: the gateway's root spans carry
    # the tenant (before, the finding had no scope).
    finding = _fires(report("gateway_only_dependency"), "dependency", 0.0)
    assert finding.scope == {"tenant.id": "acme"}
    assert "shift_share[tenant.id=acme]" in {e.signal for e in finding.evidence}


def test_a_slower_decode_read_from_metrics_alone_with_arrivals_up_within_noise(tmp_path: Path) -> None:
    # The engines' metrics only: decode 1.7x slower, arrivals 20 % up, which at ~4 requests/s
    # over 200 s is within the over-dispersed Poisson noise (z < 3). Before, the offered load
    # per replica "changed by 15 % or more" and blocked the decode finding: nothing explained
    # the regression (1050031, with a bursty trace).
    path = build(tmp_path / "m.duckdb", BASE, replace(V2, tpot_s=0.034, rate_rps=4.8), engine_spans=False)
    report = diagnose(path, Selection(mode="since_last_deploy"))
    assert not report.errors, report.errors
    assert report.findings, report.render("text")
    top = report.findings[0]
    assert top.cause == "decode_slowdown", report.render("text")
    rate = next(e for e in top.evidence if e.signal == "requests_per_s")
    assert rate.candidate / rate.baseline >= 1.15
    itl = next(e for e in top.evidence if e.signal == "itl_mean_s")
    assert itl.candidate / itl.baseline >= 1.5


def test_arrivals_burstier_than_assumed_are_no_load_from_metrics_alone(tmp_path: Path) -> None:
    # The same mean rate both sides, in bursts at twice the rate: the baseline's 25 s bursts fill
    # 100 s of its 200, the candidate's 150 s burst 150 s, so the candidate counts x1.5 the requests.
    # The over-dispersion assumed for request counts (4) puts that at Poisson z >= 3, "offered load
    # rose 50 %"; the spread of the per-scrape counts (all or nothing, 20 scrapes a side) does not,
    # and the slower decode the windows do show leads.
    baseline = replace(BASE, rate_rps=2.0, burst_s=25.0)
    candidate = replace(V2, rate_rps=2.0, burst_s=150.0, tpot_s=0.04)
    path = build(tmp_path / "m.duckdb", baseline, candidate, engine_spans=False)
    report = diagnose(path, Selection(mode="since_last_deploy"), rules=["engine_metrics"])
    assert not report.errors, report.errors
    assert report.findings, report.render("text")
    assert report.findings[0].cause == "decode_slowdown", report.render("text")
    rate = next(e for e in report.findings[0].evidence if e.signal == "requests_per_s")
    assert rate.candidate / rate.baseline >= 1.3  # the counts did rise: the bursts, not the rate


def test_a_replica_removed_with_a_backlog_building_is_capacity_from_metrics_alone(tmp_path: Path) -> None:
    # The engines' metrics only: one of two replicas gone at the same arrivals, and the one left
    # cannot keep up. Requests finished per second fell with the backlog; before, that read as
    # "arrivals fell" and blocked capacity. Arrivals are now the finished requests plus the
    # backlog's growth, which stay where they were.
    baseline, candidate = replace(BASE, slots=8), replace(V2, slots=4, replicas=1)
    path = build(tmp_path / "m.duckdb", baseline, candidate, engine_spans=False)
    report = diagnose(path, Selection(mode="since_last_deploy"), rules=["engine_metrics"])
    assert not report.errors, report.errors
    capacity = [f for f in report.findings if f.cause == "capacity"]
    assert capacity, report.render("text")
    evidence = {e.signal: e for e in capacity[0].evidence}
    rate = evidence["requests_per_s"]
    assert abs(rate.candidate / rate.baseline - 1.0) < 0.15
    assert "waiting gauge" in rate.detail
    assert evidence["waiting_requests"].candidate >= 2 * max(1.0, evidence["waiting_requests"].baseline)


def test_retry_amplification_fires_on_more_attempts_per_request(report: Callable[[str], Report]) -> None:
    finding = _fires(report("gateway_incident"), "retry_amplification", 0.0)
    attempts = next(e for e in finding.evidence if e.signal == "attempts_per_request")
    assert attempts.baseline == pytest.approx(1.0)
    assert attempts.candidate == pytest.approx(1.25, abs=0.06)
    assert finding.confidence > 0.8


def test_errors_fires_on_a_finish_reason_shift(report: Callable[[str], Report]) -> None:
    finding = _fires(report("gateway_incident"), "errors", 0.0)
    assert finding.evidence[0].signal == "finish_reason=length_share"
    assert finding.evidence[0].candidate > 0.1 > finding.evidence[0].baseline
    assert finding.confidence > 0.8


def test_more_arrivals_within_the_spread_of_bursts_name_load_not_capacity(tmp_path: Path) -> None:
    # Arrivals come in 30 s bursts and rise 40 % at the deploy: within the spread of per-slice
    # arrivals (z < 3), so load is no confirmed driver, and the queue-dominated tail had none
    # left. Before, the stage finding then said "capacity", a mechanism nothing measured (the
    # replicas did not change); the point estimate of the offered load is the one measured.
    base = replace(BASE, rate_rps=3.0, duration_s=300.0, replicas=1, slots=6, burst_s=30.0)
    path = build(tmp_path / "b.duckdb", base, replace(base, version="v2", rate_rps=4.2))
    report = diagnose(path, Selection(mode="since_last_deploy"))
    assert not report.errors, report.errors
    assert report.findings, report.render("text")
    top = report.findings[0]
    assert (top.cause, top.stage) == ("load", "queue"), report.render("text")
    z = next(e for e in top.evidence if e.signal == "arrival_change_z")
    assert z.candidate is not None
    assert z.candidate < 3.0
    assert "capacity" not in {f.cause for f in report.findings}


def test_preemptions_that_follow_slower_steps_do_not_hide_the_decode_slowdown(tmp_path: Path) -> None:
    # Metrics only: decode steps 2x slower at the same load and work, so each replica runs more
    # requests at once, fills its KV cache and preempts. Each running request holds the same share
    # of the cache as before: the preemptions are the slower steps' echo. Before, any rise in
    # preemptions counted as another mechanism and the engine-metrics rule named no slowdown
    # (1090211: ITL x3.0, running x2.5, KV share per request flat, read as kv_pressure).
    base = replace(BASE, kv_per_running=0.03)
    path = build(
        tmp_path / "m.duckdb", base, replace(base, version="v2", tpot_s=0.04, preemptions=40), engine_spans=False
    )
    report = diagnose(path, Selection(mode="since_last_deploy"))
    assert not report.errors, report.errors
    assert report.findings, report.render("text")
    top = report.findings[0]
    assert top.cause == "decode_slowdown", report.render("text")
    assert {e.signal for e in top.evidence} >= {"itl_mean_s", "running_per_replica"}


def test_preemptions_from_a_smaller_kv_pool_still_block_the_decode_reading(tmp_path: Path) -> None:
    # Control: the same slower steps, but each running request now holds twice the cache share (a
    # smaller pool): KV pressure is a mechanism of its own, and the ITL rise no clean decode signal.
    base = replace(BASE, kv_per_running=0.03)
    candidate = replace(base, version="v2", tpot_s=0.04, preemptions=40, kv_per_running=0.06)
    path = build(tmp_path / "m.duckdb", base, candidate, engine_spans=False)
    report = diagnose(path, Selection(mode="since_last_deploy"), rules=["engine_metrics"])
    assert not report.errors, report.errors
    assert "decode_slowdown" not in {f.cause for f in report.findings}, report.render("text")
