"""Every bundled scenario, replayed, shows at least the regression it claims (or none, for ``none``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sre_agent.errors import ScenarioError
from sre_agent.replays.replay import run_scenario
from sre_agent.replays.scenario import CAUSES, list_scenarios, load_scenario

SCENARIOS = list_scenarios()
# The default run replays each scenario over half its duration (same deploy-centred windows, half as
# long); the full-length replays run with `-m slow`.
REDUCED_SCALE = 0.5


def _check(path: Path, scale: float) -> None:
    scenario = load_scenario(path)
    if scale != 1.0:
        scenario = scenario.scaled(scale)
    result = run_scenario(scenario)
    expected = scenario.expected
    assert len(result.records) > 500
    if expected.min_regression is not None:
        metric, claimed = expected.min_regression
        base, cand, change = result.compare(metric, dict(expected.scope))
        assert change >= claimed, f"{path.stem}: {metric} {base:.4g} -> {cand:.4g} ({change:.3f}) < claimed {claimed}"
    if expected.max_regression is not None:
        metric, bound = expected.max_regression
        base, cand, change = result.compare(metric, dict(expected.scope))
        assert change <= bound, f"{path.stem}: {metric} {base:.4g} -> {cand:.4g} ({change:.3f}) > bound {bound}"
    if expected.cause == "none":
        for metric in ("ttft_p99", "tpot_p99", "e2e_p50"):
            assert result.compare(metric)[2] < 1.15, f"{path.stem}: {metric} moved in a no-change scenario"
        assert result.compare("error_rate")[2] < 0.005


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_shows_its_claimed_regression(path: Path) -> None:
    _check(path, REDUCED_SCALE)


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_shows_its_claimed_regression_full_length(path: Path) -> None:
    _check(path, 1.0)


def test_library_covers_every_cause_twice_with_slices_and_confounders() -> None:
    loaded = [load_scenario(p) for p in SCENARIOS]
    for cause in CAUSES:
        assert sum(s.expected.cause == cause for s in loaded) >= 2, cause
    scopes = {key for s in loaded for key in s.expected.scope}
    assert {"host.name", "tenant.id"} <= scopes
    # confounded: traffic changes at the moment of an innocent deploy
    confounded = [s for s in loaded if s.expected.cause in ("load", "traffic_mix")]
    assert all(any(c.at_s == s.deploy.at_s for c in s.changes) for s in confounded)
    assert all(s.engine_after == s.engine_before for s in confounded)


def test_bad_scenarios_name_file_and_key(tmp_path: Path) -> None:
    good = (Path(SCENARIOS[0])).read_text()
    bad = tmp_path / "typo.toml"
    bad.write_text(good.replace("[deploy]", "[deploy]\natt_s = 3"))
    with pytest.raises(ScenarioError, match=r"typo\.toml: unknown key 'deploy\.att_s'"):
        load_scenario(bad)
    bad.write_text(good.replace("[expected]\ncause = ", '[expected]\ncause = "cosmic_rays"\nx = '))
    with pytest.raises(ScenarioError, match=r"expected\.cause 'cosmic_rays'"):
        load_scenario(bad)
    bad.write_text('[workload]\nduration_s = "long"\n')
    with pytest.raises(ScenarioError, match=r"workload\.duration_s must be float"):
        load_scenario(bad)
    bad.write_text("[deploy\n")
    with pytest.raises(ScenarioError, match="invalid TOML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="no such scenario"):
        load_scenario(tmp_path / "missing.toml")
