"""Every bundled scenario, replayed into a real store and diagnosed: the top finding is the expected one.

Cases are data (``replays/scenarios/*.toml``); adding a scenario adds a case here.
Each replay takes tens of seconds on the 2-core CI machine, so the suite runs
with ``-m slow`` (``python -m pytest -m slow tests/diagnose/test_diagnose_scenarios.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sre_agent import diagnose
from sre_agent.replays.outputs import StoreOutput
from sre_agent.replays.replay import replay
from sre_agent.replays.scenario import list_scenarios, load_scenario
from sre_agent.selection import Selection

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
