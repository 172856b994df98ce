"""The verdict: pass/fail/inconclusive/nodata rules, score, dry run, and evaluation on a real store."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from canary_synth import NS, T0, Profile, spans_table, version_pair_store, write_store

from sre_agent.analysis.selection import Selection
from sre_agent.canary.sequential import point_rank
from sre_agent.canary.spec import CanarySpec
from sre_agent.canary.verdict import SideStats, evaluate, judge, render, summarise, verdict_from_dict
from sre_agent.errors import CannotEvaluateError
from sre_agent.store.embedded import Store
from sre_agent.store.schema import metric_points_arrow_schema

VERSIONS = Selection(mode="versions", baseline_version="v1", candidate_version="v2")


def _side(spec: CanarySpec, values: dict[str, np.ndarray], failed: np.ndarray | None = None) -> SideStats:
    """SideStats for one side from raw per-metric arrays, in arrival order (20 equal time blocks)."""
    n = max(len(v) for v in values.values())
    blocks = np.arange(n) * 20 // n
    return summarise(spec, values, np.zeros(n, bool) if failed is None else failed, blocks)


def _pair(
    spec: CanarySpec, base: dict[str, np.ndarray], cand: dict[str, np.ndarray], failed: np.ndarray | None = None
) -> tuple[SideStats, SideStats]:
    return _side(spec, base), _side(spec, cand, failed)


def test_clear_breach_fails_clear_margin_passes_near_threshold_depends_on_the_pass_rule() -> None:
    rng = np.random.default_rng(0)
    ttft = rng.lognormal(np.log(0.5), 0.3, 5000)  # p99 ~ 1.0 s
    base = {"ttft": ttft}
    cases = (("0.6s", "fail", "fail"), ("3s", "pass", "pass"), ("1.0s", "pass", "inconclusive"))
    for threshold, default, strict in cases:
        for equivalence, expected in ((False, default), (True, strict)):
            spec = CanarySpec.from_strings([f"ttft_p99={threshold}"], require_equivalence=equivalence)
            verdict = judge(spec, *_pair(spec, base, {"ttft": ttft}))
            assert verdict.verdict == expected, (threshold, equivalence, verdict.reasons)
            (check,) = verdict.slos
            assert check.status == expected
            assert check.ci is not None
            assert check.ci[0] <= check.candidate <= check.ci[1]
            assert verdict.to_dict()["method"]["pass_rule"] == ("equivalence" if equivalence else
                                                                "no-significant-regression")  # fmt: skip
    # at the threshold the strict rule cannot show the SLO holds: inconclusive, score 50
    assert verdict.score == 50


def test_default_pass_needs_enough_tail_data() -> None:
    """Kayenta's rule passes with enough data: for a p99 check, 5 tail requests expected (500 values)."""
    spec = CanarySpec.from_strings(["ttft_p99=100s"], min_samples=50)
    small = judge(spec, *_pair(spec, {"ttft": np.full(400, 0.1)}, {"ttft": np.full(400, 0.1)}))
    assert small.verdict == "inconclusive"
    assert "too few to judge a 1.00% tail (needs 500)" in small.slos[0].reason
    enough = judge(spec, *_pair(spec, {"ttft": np.full(500, 0.1)}, {"ttft": np.full(500, 0.1)}))
    assert enough.verdict == "pass"
    assert "Kayenta" in enough.reasons[0]


def test_fewer_than_min_samples_is_inconclusive_never_pass() -> None:
    spec = CanarySpec.from_strings(["ttft_p99=100s"], min_samples=50)
    tiny = {"ttft": np.full(20, 0.1)}
    verdict = judge(spec, *_pair(spec, {"ttft": np.full(500, 0.1)}, tiny))
    assert verdict.verdict == "inconclusive"
    assert any("fewer than the minimum 50" in r for r in verdict.reasons)
    # even a hopeless candidate is not failed on 20 requests: the minimum is a promise to the user
    assert (
        judge(spec, *_pair(spec, {"ttft": np.full(500, 0.1)}, {"ttft": np.full(20, 500.0)})).verdict == "inconclusive"
    )


def test_relative_check_accounts_for_both_sides() -> None:
    rng = np.random.default_rng(1)
    base = {"ttft": rng.lognormal(np.log(0.5), 0.3, 20_000)}
    spec = CanarySpec.from_strings([], ["ttft_p99=15%"])
    slower = {"ttft": rng.lognormal(np.log(0.5), 0.3, 20_000) * 1.6}
    same = {"ttft": rng.lognormal(np.log(0.5), 0.3, 20_000)}
    assert judge(spec, *_pair(spec, base, slower)).verdict == "fail"
    ok = judge(spec, *_pair(spec, base, same))
    assert ok.verdict == "pass", ok.reasons
    (check,) = ok.slos
    assert check.kind == "relative"
    assert check.ci is not None
    assert check.ci[0] < 1.0 < check.ci[1] <= 1.15
    # within the margin but not shown to be: the default rule passes, the strict one waits
    strict = CanarySpec.from_strings([], ["ttft_p99=15%"], require_equivalence=True)
    near = {"ttft": base["ttft"] * 1.14}
    assert judge(spec, *_pair(spec, base, near)).verdict == "pass"
    assert judge(strict, *_pair(strict, base, near)).verdict == "inconclusive"


def test_relative_check_reads_bursts_of_slow_requests_as_fewer_independent_ones() -> None:
    """The same values, once shuffled and once with the tail in one burst: the burst widens the interval."""
    rng = np.random.default_rng(5)
    spec = CanarySpec.from_strings([], ["ttft_p99=15%"])
    base = rng.lognormal(np.log(0.5), 0.3, 4000)
    cand = np.sort(rng.lognormal(np.log(0.5), 0.3, 4000))
    shuffled = rng.permutation(cand)
    bursty = np.concatenate([rng.permutation(cand[:3600]), rng.permutation(cand[3600:])])  # slowest 10 % together
    widths = {}
    for name, values in (("shuffled", shuffled), ("bursty", bursty)):
        (check,) = judge(spec, *_pair(spec, {"ttft": base}, {"ttft": values})).slos
        assert check.ci is not None
        widths[name] = check.ci[1] - check.ci[0]
    assert widths["bursty"] > 1.5 * widths["shuffled"]


def test_rates_and_goodput() -> None:
    spec = CanarySpec.from_strings(["error_rate=1%", "goodput=0.95", "ttft_p50=10s"])
    rng = np.random.default_rng(3)
    ttft = {"ttft": np.full(4000, 0.2)}
    few_errors = np.zeros(4000, bool)
    few_errors[rng.choice(4000, 4, replace=False)] = True
    healthy = judge(spec, *_pair(spec, ttft, ttft, few_errors))
    assert healthy.verdict == "pass", healthy.reasons
    errors = np.zeros(4000, bool)
    errors[rng.choice(4000, 200, replace=False)] = True
    slow = ttft["ttft"].copy()
    slow[rng.choice(np.flatnonzero(~errors), 100, replace=False)] = 20.0  # misses the 10 s SLO: not good
    broken = judge(spec, *_pair(spec, ttft, {"ttft": slow}, errors))
    assert broken.verdict == "fail"
    failing = {c.name for c in broken.slos if c.status == "fail"}
    assert failing == {"error_rate", "goodput"}
    assert len([r for r in broken.reasons if r.startswith(("error_rate", "goodput"))]) == 2


def test_nodata_rules_and_score() -> None:
    spec = CanarySpec.from_strings(["ttft_p99=10s", "itl_p99=80ms"])
    only_ttft = {"ttft": np.full(5000, 0.2)}
    half_missing = judge(spec, *_pair(spec, only_ttft, only_ttft))
    assert [c.status for c in half_missing.slos] == ["pass", "nodata"]
    assert half_missing.verdict == "inconclusive"  # half or more without data: cannot pass (Kayenta's rule)
    assert half_missing.score == 0
    spec3 = CanarySpec.from_strings(["ttft_p99=10s", "ttft_p50=5s", "itl_p99=80ms"])
    mostly = judge(spec3, *_pair(spec3, only_ttft, only_ttft))
    assert mostly.verdict == "pass"
    assert mostly.score == 100
    assert any("itl_p99: no itl data" in r for r in mostly.reasons)


def test_dry_run_reports_pass_and_keeps_the_real_verdict() -> None:
    spec = CanarySpec.from_strings(["ttft_p99=0.01s"], dry_run=True)
    data = {"ttft": np.full(1000, 1.0)}
    verdict = judge(spec, *_pair(spec, data, data))
    assert verdict.verdict == "pass"
    assert verdict.exit_code == 0
    doc = verdict.to_dict()
    assert doc["dry_run"] is True
    assert doc["real_verdict"] == "fail"
    assert doc["reasons"][0].startswith("dry run: the real verdict is fail")
    assert doc["slos"][0]["status"] == "fail"


def test_json_contract_round_trip() -> None:
    spec = CanarySpec.from_strings(["ttft_p99=2s"])
    data = {"ttft": np.full(30, 0.1)}
    doc = judge(spec, *_pair(spec, data, data)).to_dict()
    text = json.dumps(doc, allow_nan=False)  # infinite CI bounds must not leak as Infinity
    assert doc["schema"] == "sre-agent/canary/v1"
    assert set(doc) >= {"schema", "verdict", "score", "dry_run", "slos", "reasons", "findings"}
    assert set(doc["slos"][0]) >= {"name", "threshold", "baseline", "candidate", "ci", "status"}
    assert doc["slos"][0]["ci"][1] is None  # 30 samples cannot bound p99 from above
    back = verdict_from_dict(json.loads(text))
    assert back.to_dict() == doc


# ------------------------------------------------------------------ real store
@pytest.fixture
def regression_db(regression_store: Path) -> Path:
    """The session's v1/v2 store whose candidate TTFT doubled (see conftest)."""
    return regression_store


def test_evaluate_on_a_store_fails_a_regressed_version_and_explains(regression_db: Path) -> None:
    spec = CanarySpec.from_strings(
        ["ttft_p99=3s", "error_rate=1%", "goodput=0.9"], ["ttft_p99=15%"], findings_budget_s=120.0
    )
    with Store.open(regression_db, read_only=True) as store:
        verdict = evaluate(store.connection, VERSIONS, spec)
    statuses = {c.name: c.status for c in verdict.slos}
    assert verdict.verdict == "fail"
    assert statuses["ttft_p99 regression"] == "fail"
    assert statuses["error_rate"] == "pass"
    assert verdict.exit_code == 1
    assert verdict.baseline["requests"] == 4000
    assert verdict.candidate["filter"] == {"service.version": "v2"}
    assert 1 <= len(verdict.findings) <= 3
    top = verdict.findings[0]
    assert {"rank", "cause", "scope", "evidence"} <= set(top)
    assert top["cause"] in {"prefill_slowdown", "traffic_mix", "capacity", "load", "batch_composition", "prefix_cache"}
    assert "top findings:" in render(verdict)
    text = render(verdict)
    assert "FAIL" in text
    assert "ttft_p99 regression" in text
    assert "| ttft_p99 regression | fail |" in render(verdict, "markdown")


def test_evaluate_passes_an_unchanged_version_and_reads_exact_order_statistics(tmp_path: Path) -> None:
    path = tmp_path / "same.duckdb"
    version_pair_store(path, n_baseline=5000, n_candidate=5000, seed=9)
    spec = CanarySpec.from_strings(["ttft_p99=5s", "itl_p99=80ms", "error_rate=2%"], ["ttft_p50=15%"])
    with Store.open(path, read_only=True) as store:
        verdict = evaluate(store.connection, VERSIONS, spec)
        ttft = sorted(v for (v,) in store.connection.execute(
            "SELECT ttft_s FROM spans WHERE service_version = 'v2'").fetchall())  # fmt: skip
    assert verdict.verdict == "pass", verdict.reasons
    assert verdict.score == 100
    (ttft_check,) = (c for c in verdict.slos if c.name == "ttft_p99")
    assert ttft_check.candidate == pytest.approx(ttft[point_rank(len(ttft), 0.99) - 1])
    assert ttft_check.ci is not None
    assert ttft_check.ci[0] in ttft
    assert ttft_check.ci[1] in ttft
    assert ttft_check.ci[0] < ttft_check.candidate < ttft_check.ci[1]


def test_an_unknown_version_or_service_cannot_be_evaluated(regression_db: Path) -> None:
    """A typo in a rollout template is an error (exit 4, HTTP 422), not an "inconclusive" polled forever."""
    spec = CanarySpec.from_strings(["ttft_p99=3s"])
    with Store.open(regression_db, read_only=True) as store:
        with pytest.raises(CannotEvaluateError, match=r"service.version='v3'.*versions present: v1, v2"):
            evaluate(store.connection, Selection(mode="versions", baseline_version="v1", candidate_version="v3"), spec)
        with pytest.raises(CannotEvaluateError, match=r"service nope \(services: vllm\)"):
            evaluate(store.connection, Selection(mode="versions", baseline_version="v1", candidate_version="v2",
                                                 service="nope"), spec)  # fmt: skip


def test_a_deploy_without_candidate_traffic_yet_is_inconclusive(regression_db: Path) -> None:
    spec = CanarySpec.from_strings(["ttft_p99=3s"])
    with Store.open(regression_db, read_only=True) as store:
        (end,) = store.connection.execute("SELECT max(start_ns) FROM spans").fetchone()
        verdict = evaluate(store.connection, Selection(mode="deploy_at", deploy_at_ns=end + 60 * NS), spec)
    assert verdict.verdict == "inconclusive"
    assert verdict.exit_code == 3


def test_low_traffic_store_is_inconclusive_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "low.duckdb"
    version_pair_store(path, n_baseline=2000, n_candidate=30, seed=2)
    spec = CanarySpec.from_strings(["ttft_p99=30s", "error_rate=5%"])
    with Store.open(path, read_only=True) as store:
        verdict = evaluate(store.connection, VERSIONS, spec)
    assert verdict.verdict == "inconclusive"
    assert verdict.exit_code == 3
    assert verdict.reasons[0].startswith("the candidate has 30 requests, fewer than the minimum 50")


def _itl_histograms(version: str, counts: list[int], start_ns: int) -> pa.Table:
    """Two cumulative scrapes of vllm:inter_token_latency_seconds for one version."""
    bounds = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2]
    schema = metric_points_arrow_schema()
    rows = {
        "name": ["vllm:inter_token_latency_seconds"] * 2,
        "source_name": ["vllm:inter_token_latency_seconds"] * 2,
        "kind": ["histogram"] * 2,
        "time_ns": [start_ns + 10 * NS, start_ns + 500 * NS],
        "start_time_ns": [start_ns, start_ns],
        "temporality": ["cumulative"] * 2,
        "count": [sum(counts) // 10, sum(counts)],
        "sum": [0.0, 0.0],
        "bounds": [bounds, bounds],
        "bucket_counts": [[c // 10 for c in counts], counts],
        "service_name": ["vllm"] * 2,
        "service_version": [version] * 2,
        "series_key": [f"itl-{version}"] * 2,
    }
    arrays = [pa.array(rows[f.name], type=f.type) if f.name in rows else pa.nulls(2, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def test_itl_comes_from_the_vllm_histogram_when_present(tmp_path: Path) -> None:
    path = tmp_path / "itl.duckdb"
    rng = np.random.default_rng(4)
    write_store(path, [spans_table(rng, 3000, "v1", Profile()), spans_table(rng, 3000, "v2", Profile())])
    with Store.open(path) as store:
        store.append_metric_points(_itl_histograms("v1", [0, 5000, 90000, 4000, 1000, 0, 0, 0], T0))
        # the candidate's per-token latency regressed into the 100-150 ms bucket
        store.append_metric_points(_itl_histograms("v2", [0, 1000, 40000, 20000, 20000, 19000, 0, 0], T0))
    spec = CanarySpec.from_strings(["itl_p99=80ms", "tpot_p99=80ms"])
    with Store.open(path, read_only=True) as store:
        verdict = evaluate(store.connection, VERSIONS, spec)
    itl, tpot = verdict.slos
    assert itl.status == "fail"
    assert itl.ci == (0.1, 0.15)  # the CS widened to bucket edges
    assert "inter_token_latency_seconds" in itl.reason
    assert itl.n_candidate == 100_000 - 10_000  # counter delta between the two scrapes
    assert tpot.status == "pass"  # per-request TPOT from spans is unchanged
    assert verdict.verdict == "fail"


def test_store_errors_are_store_errors(tmp_path: Path) -> None:
    from sre_agent.errors import StoreError

    path = tmp_path / "empty.duckdb"
    duckdb.connect(str(path)).close()
    con = duckdb.connect(str(path))
    with pytest.raises(StoreError):
        evaluate(con, VERSIONS, CanarySpec.from_strings(["ttft_p99=2s"]))
    con.close()


def test_slow_diagnosis_is_cut_off_and_the_verdict_still_stands(
    regression_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import sre_agent.analysis.diagnosis as diagnose_module

    release = threading.Event()

    def stuck(*args: object, **kwargs: object) -> None:
        release.wait(10)
        raise RuntimeError("interrupted")

    monkeypatch.setattr(diagnose_module, "diagnose", stuck)
    spec = CanarySpec.from_strings(["ttft_p99=3s"], findings_budget_s=0.05)
    try:
        with Store.open(regression_db, read_only=True) as store:
            verdict = evaluate(store.connection, VERSIONS, spec)
    finally:
        release.set()
    assert verdict.verdict == "fail"
    assert verdict.findings == ()
    assert any("did not finish within 0.05 s" in n for n in verdict.notes)


def test_derived_and_malformed_latencies_match_compare(tmp_path: Path) -> None:
    """Spans without e2e (only a duration) and with malformed TTFTs: the verdict reads what compare derives."""
    path = tmp_path / "derived.duckdb"
    rng = np.random.default_rng(8)
    base, cand = spans_table(rng, 2000, "v1", Profile()), spans_table(rng, 2000, "v2", Profile())
    e2e = cand.schema.get_field_index("e2e_s")
    ttft = cand.schema.get_field_index("ttft_s")
    cand = cand.set_column(e2e, "e2e_s", pa.nulls(cand.num_rows, pa.float64()))  # SGLang-like: duration only
    bad_ttft = np.array(cand.column("ttft_s").to_pylist())
    bad_ttft[::100] = -1.0  # malformed values compare drops
    cand = cand.set_column(ttft, "ttft_s", pa.array(bad_ttft))
    write_store(path, [base, cand])
    spec = CanarySpec.from_strings(["e2e_p99=60s", "ttft_p90=5s"], findings=0)
    with Store.open(path, read_only=True) as store:
        verdict = evaluate(store.connection, VERSIONS, spec)
        con = store.connection
        durations = sorted(
            v for (v,) in con.execute("SELECT duration_s FROM spans WHERE service_version = 'v2'").fetchall()
        )
        valid_ttft = sorted(
            v
            for (v,) in con.execute("SELECT ttft_s FROM spans WHERE service_version = 'v2' AND ttft_s >= 0").fetchall()
        )
    e2e_check, ttft_check = verdict.slos
    assert e2e_check.n_candidate == 2000
    assert e2e_check.candidate == pytest.approx(durations[point_rank(2000, 0.99) - 1])
    assert ttft_check.n_candidate == 2000 - 20
    assert ttft_check.candidate == pytest.approx(valid_ttft[point_rank(1980, 0.9) - 1])
