"""Each of the framework's rules on small stores built from mechanism, and ranking over all rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from sre_agent import diagnose
from sre_agent.analysis.selection import Selection

MakeStore = Callable[[str], tuple[Path, int]]
SINCE = Selection(mode="since_last_deploy")


def _causes(report) -> list[str]:  # type: ignore[no-untyped-def]
    return [f.cause for f in report.findings]


def test_more_arrivals_at_the_same_service_time_is_load(make_store: MakeStore) -> None:
    path, _ = make_store("load")
    report = diagnose(path, SINCE, rules=["queueing"])
    assert report.regression.significant
    load = next(f for f in report.findings if f.cause == "load")
    assert load.score > 0.5
    rates = next(e for e in load.evidence if e.signal == "arrival_rate_rps")
    assert rates.candidate / rates.baseline == pytest.approx(1.4, rel=0.1)
    assert "capacity" not in _causes(report)


def test_fewer_replicas_for_the_same_load_is_capacity(make_store: MakeStore) -> None:
    path, _ = make_store("capacity")
    report = diagnose(path, SINCE, rules=["queueing"])
    capacity = next(f for f in report.findings if f.cause == "capacity")
    replicas = next(e for e in capacity.evidence if e.signal == "replicas")
    assert (replicas.baseline, replicas.candidate) == (4, 3)
    assert "load" not in _causes(report)


def test_stage_decomposition_names_the_stage_and_what_drove_it(make_store: MakeStore) -> None:
    path, _ = make_store("load")
    report = diagnose(path, SINCE, rules=["stages"])
    (finding,) = report.findings
    assert finding.stage == "queue"
    assert finding.cause == "load"  # queueing is the symptom; the arrival rate drove it
    assert finding.confidence < 0.5  # a stage alone is not a mechanism


def test_one_slow_host_is_localised_and_named_in_scope(make_store: MakeStore) -> None:
    path, _ = make_store("slow_host")
    report = diagnose(path, SINCE, rules=["slices"])
    top = report.findings[0]
    assert top.scope.get("host.name") == "gpu-2"
    assert top.cause == "decode_slowdown"  # its queue grew because its decode got slower, not for lack of slots
    share = next(e for e in top.evidence if e.signal == "excess_slow_share")
    assert share.candidate > 0.8


def test_a_heavier_request_mix_is_traffic_mix_not_the_deploy(make_store: MakeStore) -> None:
    path, _ = make_store("mix")
    report = diagnose(path, SINCE, rules=["traffic_mix", "queueing", "stages"])
    assert report.findings[0].cause == "traffic_mix"
    dfl = diagnose(path, SINCE, rules=["traffic_mix"])
    (mix,) = dfl.findings
    shift = next(e for e in mix.evidence if e.signal == "mix_shift_tv")
    assert shift.candidate > 0.1


def test_no_regression_ranks_none_first_whatever_the_rules_say(make_store: MakeStore) -> None:
    path, _ = make_store("none")
    report = diagnose(path, SINCE)
    assert not report.regression.significant
    assert report.findings[0].cause == "none"
    assert report.to_dict()["findings"][0]["rank"] == 1


@pytest.mark.parametrize(
    ("case", "cause", "scope"),
    [
        ("load", "load", {}),
        ("capacity", "capacity", {}),
        ("slow_host", "decode_slowdown", {"host.name": "gpu-2"}),
        ("none", "none", {}),
    ],
)
def test_top_finding_over_all_installed_rules(
    make_store: MakeStore, case: str, cause: str, scope: dict[str, str]
) -> None:
    path, _ = make_store(case)
    report = diagnose(path, SINCE)
    top = report.findings[0]
    assert top.cause == cause, report.render("text")
    for key, value in scope.items():
        assert top.scope.get(key) == value, report.render("text")
    assert not report.errors


def test_rules_marked_run_late_run_after_the_others_and_ranking_ignores_the_order() -> None:
    from sre_agent.analysis.diagnosis import RuleContext, run_rules
    from sre_agent.analysis.rules_api import Finding, Rule, run_late

    calls: list[str] = []

    def make(name: str, score: float) -> Callable[[], Finding]:
        def rule() -> Finding:
            calls.append(name)
            return Finding("load", name, explained=score, confidence=1.0)

        rule.__name__ = name
        return rule

    early, late = make("early", 0.2), run_late(make("late", 0.9))
    rules = cast("list[tuple[str, Rule]]", [("late", late), ("early", early)])
    findings, failures, _, _ = run_rules(rules, RuleContext({}))
    assert calls == ["early", "late"]
    assert not failures
    assert [f.rule for f in sorted(findings, key=lambda f: -f.score)] == ["late", "early"]
    installed = dict(_installed_rules())
    assert all(getattr(installed[n], "runs_late", False) for n in ("decode_slowdown", "prefill_slowdown"))


def _installed_rules() -> list[tuple[str, object]]:
    from sre_agent.analysis.rules_registry import load_rules

    loaded, _ = load_rules(None)
    return list(loaded)
