"""The report: CONTRACTS section 3 JSON shape, text and Markdown renderings, and the registry."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sre_agent import CAUSES, diagnose
from sre_agent.report import SCHEMA, Report
from sre_agent.rules_api import Evidence, Finding
from sre_agent.rules_registry import list_rules, load_rules
from sre_agent.selection import Selection

MakeStore = Callable[[str], tuple[Path, int]]
SINCE = Selection(mode="since_last_deploy")
FRAMEWORK_RULES = {"stages", "queueing", "traffic_mix", "slices"}


@pytest.fixture(scope="module")
def report(make_store: MakeStore) -> Report:
    path, _ = make_store("slow_host")
    return diagnose(path, SINCE)


def test_json_matches_contracts_section_3(report: Report) -> None:
    data = json.loads(report.render("json"))
    assert data["schema"] == SCHEMA == "sre-agent/diagnosis/v1"
    for side in ("baseline", "candidate"):
        assert set(data[side]) == {"start", "end", "requests", "filter"}
        assert data[side]["start"].endswith("Z")
        assert data[side]["requests"] > 0
    reg = data["regression"]
    # quantile_switch is additive (issue 12): null, or {from, to, reason} when the headline is below p99
    assert set(reg) == {"metric", "quantile", "baseline", "candidate", "ratio", "ci", "significant", "quantile_switch"}
    assert reg["significant"] is True
    assert reg["ratio"] == pytest.approx(reg["candidate"] / reg["baseline"], rel=1e-3)
    assert len(reg["ci"]) == 2
    assert reg["ci"][0] <= reg["candidate"] - reg["baseline"] <= reg["ci"][1]
    names = {m["name"] for m in data["metrics"]}
    assert {"ttft", "tpot", "itl", "e2e", "queue"} <= names
    assert {m["quantile"] for m in data["metrics"]} == {0.5, 0.99}
    for m in data["metrics"]:
        assert set(m) == {"name", "quantile", "baseline", "candidate", "ci"}
    assert [f["rank"] for f in data["findings"]] == list(range(1, len(data["findings"]) + 1))
    scores = [f["score"] for f in data["findings"]]
    assert scores == sorted(scores, reverse=True)
    for f in data["findings"]:
        assert set(f) == {"rank", "cause", "title", "score", "confidence", "stage", "scope", "evidence", "next_check"}
        assert f["cause"] in CAUSES
        assert f["cause"] != "none"
        assert f["stage"] in (None, "queue", "prefill", "decode", "gateway", "dependency")
        assert f["next_check"]
        for e in f["evidence"]:
            assert set(e) == {"signal", "baseline", "candidate", "detail"}
    assert isinstance(data["notes"], list)
    assert data["errors"] == []


def test_text_and_markdown_carry_the_same_story(report: Report) -> None:
    top = report.findings[0]
    text = report.render("text")
    md = report.render("markdown")
    assert "REGRESSED" in text
    assert f"1. {top.cause}" in text
    assert "next:" in text
    assert md.startswith("## Diagnosis")
    assert f"**{top.cause}**" in md
    assert "| metric | baseline | candidate |" in md
    assert "host.name=gpu-2" in md


def test_from_dict_round_trip_for_the_url_mode(report: Report) -> None:
    again = Report.from_dict(report.to_dict())
    assert again.render("json") == report.render("json")
    # The findings read the same (the metric table loses only the significance marks).
    text, original = again.render("text"), report.render("text")
    assert text[text.index("\n1. ") :] == original[original.index("\n1. ") :]


def test_findings_reject_causes_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="closed vocabulary"):
        Finding(cause="latency", title="p99 went up", explained=1.0, confidence=1.0)
    with pytest.raises(ValueError, match="stage"):
        Finding(cause="load", title="x", explained=1.0, confidence=1.0, stage="network")
    f = Finding(cause="load", title="x", explained=1.7, confidence=0.5, evidence=(Evidence("a", 1, 2),))
    assert f.score == 0.5  # explained is clipped to 1 before tempering by confidence


def test_registry_lists_without_importing_and_loads_the_framework_rules() -> None:
    import sys

    names = {info.name for info in list_rules()}
    assert names >= FRAMEWORK_RULES
    loaded, failures = load_rules(sorted(FRAMEWORK_RULES))
    assert {name for name, _ in loaded} == FRAMEWORK_RULES
    assert failures == []
    for name, rule in loaded:
        assert rule.__name__ == name  # one function named like its module
        assert rule.__module__ == f"sre_agent.rules.{name}"
    assert "sre_agent.rules.slices" in sys.modules
    _, missing = load_rules(["no_such_rule"])
    assert [f.name for f in missing] == ["no_such_rule"]
