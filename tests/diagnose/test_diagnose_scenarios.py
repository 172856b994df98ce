"""Every bundled scenario, replayed into a real store and diagnosed: the top finding is the expected one.

Cases are data (``replays/scenarios/*.toml``); adding a scenario adds a case here.
Each replay takes tens of seconds on the 2-core CI machine, so the suite runs
with ``-m slow`` (``python -m pytest -m slow tests/diagnose/test_diagnose_scenarios.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sre_agent import diagnose
from sre_agent.analysis.selection import Selection
from sre_agent.replays.outputs import StoreOutput
from sre_agent.replays.replay import replay
from sre_agent.replays.scenario import list_scenarios, load_scenario

SCENARIOS = list_scenarios()


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_top_finding_is_the_expected_cause_and_scope(path: Path, tmp_path: Path) -> None:
    scenario = load_scenario(path)
    db = tmp_path / f"{path.stem}.duckdb"
    output = StoreOutput.open(db)
    replay(scenario, output)
    report = diagnose(db, Selection(mode="since_last_deploy"))
    expected = scenario.expected
    assert report.findings, report.render("text")
    top = report.findings[0]
    assert top.cause == expected.cause, report.render("text")
    for key, value in expected.scope.items():
        assert top.scope.get(key) == value, report.render("text")
    if expected.cause == "none":
        assert not report.regression.significant
    assert not report.errors, report.errors


def test_a_lost_cache_leads_when_the_tail_it_slows_is_decode_time(tmp_path: Path) -> None:
    # prefix_cache_template_break: e2e p99 rose 1.16x and 98 % of the tail's excess is decode
    # time, because the prompt tokens no longer cached are prefilled in chunks that share the
    # decode steps (tokens computed per request +39 %). Counting only the tail's own extra
    # prefill (2 % of the excess), the cache lost to the stage fallback's prefill_slowdown.
    path = next(p for p in SCENARIOS if p.stem == "prefix_cache_template_break")
    db = tmp_path / "cache.duckdb"
    replay(load_scenario(path), StoreOutput.open(db))
    report = diagnose(db, Selection(mode="since_last_deploy"))
    assert report.regression.metric == "e2e", report.render("text")
    top = report.findings[0]
    assert top.cause == "prefix_cache", report.render("text")
    assert "decode_share_from_shared_steps" in {e.signal for e in top.evidence}
