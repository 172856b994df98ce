"""One minimum-sample rule: a regression the headline reports can always be explained (issue 12, items 4 and 7).

The queue-regression case of item 7: two versions side by side, fewer slots
per replica on the candidate (queue p99 from well under a second to many
seconds), at a few hundred requests per side. The headline used to switch to
p99 at 500 requests while the stage decomposition needed 10 tail requests
per side (~1,000), so between the two nothing explained the regression. Now
both need stats.MIN_TAIL requests beyond the quantile, and a headline below
p99 says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from synth import Options, Side, build_store

from sre_agent.analysis import stats
from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.decompose import stage_decomposition
from sre_agent.analysis.diagnosis import diagnose
from sre_agent.analysis.report import render_dict
from sre_agent.analysis.selection import Selection

VERSIONS = Selection(mode="versions", baseline_version="v1", candidate_version="v2")


def _queue_store(tmp_path: Path, requests_per_side: int) -> Path:
    """Same arrivals and work on both sides; the candidate has half the slots, so only queueing grows."""
    duration = requests_per_side / 2.5
    baseline = Side(rate_rps=2.5, duration_s=duration, replicas=2, slots=2, tpot_s=0.005)
    candidate = Side(version="v2", rate_rps=2.5, duration_s=duration, replicas=2, slots=1, tpot_s=0.005)
    path = tmp_path / f"queue{requests_per_side}.duckdb"
    build_store(path, baseline, candidate, Options(deploy_marker=False))
    return path


def test_the_quantile_rule_keeps_min_tail_requests_beyond_every_quantile() -> None:
    for q in (0.5, 0.9, 0.99, 0.999):
        need = stats.min_samples_for_quantile(q)
        assert need * (1 - q) >= stats.MIN_TAIL - 1e-9
        assert (need - 1) * (1 - q) < stats.MIN_TAIL or need == stats.MIN_REQUESTS


@pytest.mark.parametrize("per_side", [600, 850])
def test_a_pure_queue_regression_between_500_and_1000_requests_is_explained(tmp_path: Path, per_side: int) -> None:
    path = _queue_store(tmp_path, per_side)
    report = diagnose(path, VERSIONS)
    assert report.regression.significant
    # The headline's quantile always leaves MIN_TAIL requests per side for the decomposition...
    with duckdb.connect(str(path), read_only=True) as con:
        decomposition = stage_decomposition(Comparison.open(con, VERSIONS), report.regression)
    assert min(decomposition.tail_requests) >= stats.MIN_TAIL
    assert decomposition.dominant == "queue"
    # ...so the regression is explained, by queueing with its driver named.
    assert report.findings, report.render("text")
    top = report.findings[0]
    assert top.stage == "queue"
    assert top.cause in ("capacity", "load")


def test_the_switch_from_p99_is_printed_and_carried_in_the_json(tmp_path: Path) -> None:
    report = diagnose(_queue_store(tmp_path, 300), VERSIONS)
    data = json.loads(report.render("json"))
    switch = data["regression"]["quantile_switch"]
    assert data["regression"]["quantile"] == 0.9
    assert switch["from"] == 0.99
    assert switch["to"] == 0.9
    assert "needs 500 requests per side" in switch["reason"]
    text = report.render("text")
    assert "p90 instead of p99: p99 needs 500 requests per side" in text
    assert "p90 instead of p99" in report.render("markdown")
    # the --url path renders the JSON the server answered: the switch survives the round trip
    assert "p90 instead of p99: p99 needs 500 requests per side" in render_dict(data, "text")


def test_no_switch_is_reported_when_p99_itself_is_the_headline(tmp_path: Path) -> None:
    report = diagnose(_queue_store(tmp_path, 1100), VERSIONS)
    assert report.regression.quantile == 0.99
    assert json.loads(report.render("json"))["regression"]["quantile_switch"] is None
    assert "instead of p99" not in report.render("text")


def test_a_regression_without_tail_requests_says_it_is_unexplained_and_why(make_store) -> None:  # type: ignore[no-untyped-def]
    path, _ = make_store("metrics_only")  # latency from metric histograms: no request to decompose
    report = diagnose(path, Selection(mode="since_last_deploy"), rules=["stages"])
    assert report.regression.significant
    assert not report.findings
    note = next(n for n in report.notes if n.startswith("unexplained"))
    assert f"needs {stats.MIN_TAIL} per side" in note
    assert "0 baseline / 0 candidate" in note
    assert "No rule explains the regression" in report.render("text")
