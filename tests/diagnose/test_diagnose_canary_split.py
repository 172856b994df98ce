"""Automatic deploy detection and a canary split (issue 12 item 10).

When both versions serve at once, the last "deploy" is just the moment the
second version's first span arrived: comparing before/after it put a few
seconds of traffic against a mix of both versions. The default selection
now becomes the version pair over the time both served, and says so.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from synth import T0_NS, Options, Side, build_store

from sre_agent.analysis.compare import Comparison, resolve_windows
from sre_agent.analysis.diagnosis import diagnose
from sre_agent.analysis.selection import Selection, format_time

NS = 1_000_000_000
SINCE = Selection(mode="since_last_deploy")


def _split_store(tmp_path: Path, name: str, candidate_tpot_s: float, marker: bool) -> Path:
    """v1 takes 80 % of the traffic for 10 minutes; the v2 canary takes 20 %, starting 20 s in."""
    baseline = Side(rate_rps=16.0, duration_s=600.0)
    candidate = Side(version="v2", rate_rps=4.0, duration_s=580.0, tpot_s=candidate_tpot_s)
    path = tmp_path / f"{name}.duckdb"
    build_store(path, baseline, candidate, Options(deploy_marker=marker, concurrent_after_s=20.0))
    return path


@pytest.mark.parametrize("marker", [True, False], ids=["deploy-marker", "version-change"])
def test_versions_serving_at_once_become_the_version_pair(tmp_path: Path, marker: bool) -> None:
    path = _split_store(tmp_path, "split", 0.02, marker)
    with duckdb.connect(str(path), read_only=True) as con:
        baseline, candidate, notes, deploy = resolve_windows(con, SINCE)
        assert (baseline.version, candidate.version) == ("v1", "v2")
        assert deploy is not None
        assert deploy.time_ns == baseline.start_ns == candidate.start_ns
        assert baseline.end_ns == candidate.end_ns
        assert candidate.end_ns - candidate.start_ns > 500 * NS  # the time both served, not 20 s
        assert any("v1 and v2 serve at the same time" in n for n in notes)
        comparison = Comparison.open(con, SINCE)
        counts = comparison.request_counts
        totals = dict(con.execute("SELECT service_version, count(*) FROM spans GROUP BY 1").fetchall())
    # Each side is (nearly) all of its version's traffic while both served, not 20 s of it.
    assert counts["baseline"] > 0.9 * totals["v1"] * 560 / 600
    assert counts["candidate"] > 0.95 * totals["v2"]


def test_a_slower_canary_is_diagnosed_against_its_concurrent_baseline(tmp_path: Path) -> None:
    report = diagnose(_split_store(tmp_path, "slow", 0.04, True), SINCE)
    assert report.baseline["filter"] == {"service.version": "v1"}
    assert report.candidate["filter"] == {"service.version": "v2"}
    assert report.regression.significant
    assert report.findings[0].cause == "decode_slowdown"
    assert any("serve at the same time" in n for n in report.notes)


def test_a_healthy_canary_is_not_a_regression(tmp_path: Path) -> None:
    report = diagnose(_split_store(tmp_path, "healthy", 0.02, True), SINCE)
    assert report.findings[0].cause == "none"


def test_a_hot_swap_stays_a_before_after_comparison(make_store) -> None:  # type: ignore[no-untyped-def]
    path, deploy = make_store("none")
    with duckdb.connect(str(path), read_only=True) as con:
        baseline, candidate, notes, _ = resolve_windows(con, SINCE)
    assert baseline.version is None
    assert candidate.version is None
    assert baseline.end_ns == candidate.start_ns == deploy
    assert not any("serve at the same time" in n for n in notes)
    assert deploy > T0_NS


def test_a_canary_after_ample_old_only_data_stays_before_after_and_says_both_serve(tmp_path: Path) -> None:
    """Ten minutes of v1 alone, then a one-in-five v2 canary: before/after has a full baseline, and the
    slice localiser can find the new version in the mix; the note says how to compare side by side."""
    baseline = Side(rate_rps=16.0, duration_s=1200.0)
    candidate = Side(version="v2", rate_rps=4.0, duration_s=600.0)
    path = tmp_path / "late_canary.duckdb"
    deploy = build_store(path, baseline, candidate, Options(concurrent_after_s=600.0))
    with duckdb.connect(str(path), read_only=True) as con:
        b, c, notes, _ = resolve_windows(con, SINCE)
    assert (b.version, c.version) == (None, None)
    assert b.end_ns == c.start_ns == deploy
    assert any("--baseline-version v1 --candidate-version v2 compares them side by side" in n for n in notes)


@pytest.mark.parametrize("selection", [SINCE, "deploy_at"], ids=["since-last-deploy", "deploy-at"])
def test_a_restart_gap_after_the_deploy_is_not_candidate_time(tmp_path: Path, selection: object) -> None:
    """A vLLM restart: the new version's marker, then a minute of start-up with no requests.

    A minute of traffic each side. Windows of equal wall-clock length from the marker put the
    candidate's window wholly in the start-up (no requests: an error); the windows are measured
    over serving time instead, so the candidate holds its requests and its arrival rate is the
    rate it served at, not half of it.
    """
    path = tmp_path / "restart.duckdb"
    deploy = build_store(
        path,
        Side(rate_rps=20.0, duration_s=60.0),
        Side(version="v2", rate_rps=20.0, duration_s=60.0, tpot_s=0.04),
        Options(restart_gap_s=60.0),
    )
    chosen = SINCE if selection is SINCE else Selection(mode="deploy_at", deploy_at_ns=deploy)
    with duckdb.connect(str(path), read_only=True) as con:
        baseline, candidate, notes, _ = resolve_windows(con, chosen)
        comparison = Comparison.open(con, chosen)
        totals = dict(con.execute("SELECT service_version, count(*) FROM spans GROUP BY 1").fetchall())
        rate = comparison.arrival_rate
    assert candidate.start_ns >= deploy + 59 * NS
    assert baseline.end_ns <= deploy
    assert any("no engine request started for 60 s after the deploy" in n for n in notes)
    assert comparison.request_counts["candidate"] >= 0.95 * totals["v2"]
    assert comparison.request_counts["baseline"] >= 0.95 * totals["v1"]
    assert 0.8 < rate.candidate / rate.baseline < 1.25
    report = diagnose(path, chosen)
    assert report.findings[0].cause == "decode_slowdown"


def _restart_with_gateway(tmp_path: Path) -> tuple[Path, int]:
    """A minute of traffic each side through a gateway, the candidate's after a minute of restart."""
    path = tmp_path / "restart-gateway.duckdb"
    deploy = build_store(
        path,
        Side(rate_rps=20.0, duration_s=60.0),
        Side(version="v2", rate_rps=20.0, duration_s=60.0),
        Options(restart_gap_s=60.0, gateway_spans=True),
    )
    return path, deploy


def test_a_restart_the_gateway_waited_through_is_still_not_candidate_time(tmp_path: Path) -> None:
    # The gateway's requests paused with the engine's (nothing was sent): dead time, as without it.
    path, deploy = _restart_with_gateway(tmp_path)
    with duckdb.connect(str(path), read_only=True) as con:
        _, candidate, notes, _ = resolve_windows(con, Selection(mode="deploy_at", deploy_at_ns=deploy))
    assert candidate.start_ns >= deploy + 59 * NS
    assert any("no engine request started for 60 s after the deploy (a restart" in n for n in notes)
    assert not any("gateway kept receiving" in n for n in notes)


def test_engine_requests_that_stop_while_the_gateway_keeps_receiving_are_the_incident(tmp_path: Path) -> None:
    """Users kept sending through the engine's pause: the gateway's attempts failed (a retry storm
    that aborted every engine request, which then exported no span). The pause is candidate time."""
    path, deploy = _restart_with_gateway(tmp_path)
    with duckdb.connect(str(path)) as con:
        # One failed gateway request a second through the engine's silent minute.
        con.execute(
            f"""
            INSERT INTO span_rows BY NAME
            SELECT 'gap' || i AS trace_id, 'gap' || i AS span_id, NULL AS parent_span_id, name, kind,
                   {deploy} + i * {NS} AS start_ns, {deploy} + i * {NS} + 700000000 AS end_ns, 0.7 AS duration_s,
                   'ERROR' AS status_code, service_name, service_version, is_engine
            FROM (SELECT * FROM spans WHERE parent_span_id IS NULL AND NOT is_engine LIMIT 1), range(60) t(i)
            """
        )
    with duckdb.connect(str(path), read_only=True) as con:
        _, candidate, notes, _ = resolve_windows(con, Selection(mode="deploy_at", deploy_at_ns=deploy))
    assert candidate.start_ns == deploy
    assert any(
        "no engine request started for 60 s after the deploy while the gateway kept receiving requests" in n
        for n in notes
    )
    assert not any("(a restart or a drain)" in n for n in notes)


def _rollout_store(
    tmp_path: Path, overlap_s: float, candidate_tpot_s: float = 0.02, *, spans: bool = True
) -> tuple[Path, int]:
    """v1 serves 330 s; v2 takes over from 300 s on, so both serve for ``overlap_s`` after the deploy."""
    baseline = Side(rate_rps=16.0, duration_s=300.0 + overlap_s)
    candidate = Side(version="v2", rate_rps=16.0, duration_s=300.0, tpot_s=candidate_tpot_s)
    path = tmp_path / f"rollout-{overlap_s:.0f}-{spans}.duckdb"
    deploy_ns = build_store(path, baseline, candidate, Options(concurrent_after_s=300.0, engine_spans=spans))
    return path, deploy_ns


def test_a_rolling_deploy_is_compared_from_when_the_rollout_finished(tmp_path: Path) -> None:
    """Both versions serve for 30 s of a 300 s window: the candidate window is the new version's alone."""
    path, deploy_ns = _rollout_store(tmp_path, 30.0)
    at_deploy = Selection(mode="deploy_at", deploy_at_ns=deploy_ns)
    with duckdb.connect(str(path), read_only=True) as con:
        (old_last,) = con.execute("SELECT max(start_ns) FROM spans WHERE service_version = 'v1'").fetchone()  # type: ignore[misc]
        for selection in (at_deploy, SINCE):
            baseline, candidate, notes, _ = resolve_windows(con, selection)
            assert candidate.start_ns == old_last + 1
            assert baseline.end_ns <= deploy_ns
            # Only the rollout is left out: the baseline keeps its length, the candidate its end.
            assert 290 < baseline.seconds <= 300
            assert candidate.end_ns - deploy_ns == pytest.approx(baseline.seconds * NS, rel=0.02)
            assert 260 < candidate.seconds < 275
            assert any(n.startswith("rolling deploy: v1 served") and "holds the new version only" in n for n in notes)
        comparison = Comparison.open(con, at_deploy)
        versions = comparison.requests.group_by("side", "service_version").len()
    by_side = {(r["side"], r["service_version"]) for r in versions.to_dicts()}
    assert by_side == {("baseline", "v1"), ("candidate", "v2")}


def test_a_rollout_that_does_not_finish_is_not_cut_away(tmp_path: Path) -> None:
    """v1 serves 200 s of the 300 after the deploy: a partial rollout, not a transition to skip."""
    path, deploy_ns = _rollout_store(tmp_path, 200.0)
    with duckdb.connect(str(path), read_only=True) as con:
        _, candidate, notes, _ = resolve_windows(con, Selection(mode="deploy_at", deploy_at_ns=deploy_ns))
    assert candidate.start_ns - deploy_ns < 5 * NS
    assert not any(n.startswith("rolling deploy") for n in notes)


def test_a_slower_version_rolled_out_is_found_without_the_old_version_as_a_slice(tmp_path: Path) -> None:
    """The old version's requests during the rollout would otherwise be a "slice" that did not regress."""
    path, deploy_ns = _rollout_store(tmp_path, 30.0, candidate_tpot_s=0.04)
    report = diagnose(path, Selection(mode="deploy_at", deploy_at_ns=deploy_ns))
    assert report.regression.significant
    assert report.findings[0].cause == "decode_slowdown"
    assert not report.findings[0].scope
    assert report.comparison() == f"before vs after {format_time(deploy_ns)}"


def test_a_rolling_deploy_is_seen_in_the_metric_stream_without_spans(tmp_path: Path) -> None:
    """Metrics only: the old version's series stop where the rollout ended."""
    path, deploy_ns = _rollout_store(tmp_path, 30.0, spans=False)
    with duckdb.connect(str(path), read_only=True) as con:
        (old_last,) = con.execute("SELECT max(time_ns) FROM metric_points WHERE service_version = 'v1'").fetchone()  # type: ignore[misc]
        _, candidate, notes, _ = resolve_windows(con, Selection(mode="deploy_at", deploy_at_ns=deploy_ns))
    assert old_last > deploy_ns + 20 * NS
    assert candidate.start_ns == old_last + 1
    assert any(n.startswith("rolling deploy: v1 reported metrics for ") for n in notes), notes


def test_a_time_picked_before_a_later_hot_swap_keeps_its_windows(tmp_path: Path) -> None:
    """Two minutes before a hot swap the old version serves alone, then the new one: no rollout to skip."""
    path = tmp_path / "swap.duckdb"
    deploy_ns = build_store(path, Side(rate_rps=16.0, duration_s=300.0), Side(version="v2", rate_rps=16.0))
    earlier = deploy_ns - 120 * NS
    with duckdb.connect(str(path), read_only=True) as con:
        _, candidate, notes, _ = resolve_windows(con, Selection(mode="deploy_at", deploy_at_ns=earlier))
    assert candidate.start_ns - earlier < 5 * NS
    assert not any(n.startswith("rolling deploy") for n in notes)


def test_a_canary_sent_more_requests_per_replica_is_load_per_replica_not_fewer_replicas(tmp_path: Path) -> None:
    """v1 on 3 replicas at 12 req/s, the v2 canary on 1 at 6 req/s: 50 % more per replica, the same code.

    A version pair's replica counts are the split's design; the canary queues because the router sends
    each of its replicas more. The old reading was "capacity: replicas 3 -> 1"."""
    path = tmp_path / "routed.duckdb"
    baseline = Side(rate_rps=12.0, duration_s=600.0, replicas=3, slots=8)
    candidate = Side(version="v2", rate_rps=6.0, duration_s=580.0, replicas=1, slots=8)
    build_store(path, baseline, candidate, Options(deploy_marker=True, concurrent_after_s=20.0))
    report = diagnose(path, SINCE)
    assert report.regression.significant
    causes = [f.cause for f in report.findings]
    assert "capacity" not in causes
    assert causes[0] == "load"
    assert "per replica" in report.findings[0].title
    assert "the router's share" in report.findings[0].title
