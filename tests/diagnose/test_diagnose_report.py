"""The report: CONTRACTS section 3 JSON shape, text and Markdown renderings, and the registry."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sre_agent import CAUSES, diagnose
from sre_agent.analysis.report import SCHEMA, Report
from sre_agent.analysis.rules_api import Evidence, Finding
from sre_agent.analysis.rules_registry import list_rules, load_rules
from sre_agent.analysis.selection import Selection, format_time

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
    # The findings read the same (the metric table loses only the significance and source columns).
    text, original = again.render("text"), report.render("text")
    assert text[text.index("\n1. ") :] == original[original.index("\n1. ") :]
    assert again.comparison() == report.comparison()
    # The JSON carries neither significance nor source: the rebuilt table leaves them out, never guesses.
    header = next(line for line in text.splitlines() if line.startswith("metric"))
    assert "regressed" not in header
    assert "source" not in header
    assert "REGRESSED" in text  # the headline's verdict is in the JSON and stays


def test_window_lines_name_filters_as_key_value_not_python_dicts(make_store: MakeStore) -> None:
    path, _ = make_store("slow_host")
    narrowed = diagnose(path, Selection(mode="since_last_deploy", service="vllm", where=(("host.name", "gpu-2"),)))
    text, md = narrowed.render("text"), narrowed.render("markdown")
    for rendered in (text, md):
        assert "{" not in rendered
        assert "'" not in "\n".join(line for line in rendered.splitlines() if "requests" in line)
    windows = [line for line in text.splitlines() if line.startswith(("baseline ", "candidate "))]
    assert len(windows) == 2
    assert all(line.endswith("where service=vllm, host.name=gpu-2") for line in windows)
    assert "where `service=vllm`, `host.name=gpu-2`" in md


def test_versions_and_deploy_time_comparisons_are_named(make_store: MakeStore) -> None:
    path, deploy_ns = make_store("slow_host")
    by_version = diagnose(path, Selection(mode="versions", baseline_version="v1", candidate_version="v2"))
    assert by_version.comparison() == "service.version v1 (baseline) vs v2 (candidate)"
    assert "where service.version=v1" in by_version.render("text")
    at_time = diagnose(path, Selection(mode="deploy_at", deploy_at_ns=deploy_ns))
    assert at_time.comparison() == f"before vs after {format_time(deploy_ns)}"
    assert f"compared: before vs after {format_time(deploy_ns)}" in at_time.render("text")


def test_the_compared_deploy_is_named_at_the_top_of_the_report(report: Report) -> None:
    """stdout alone says which deploy was compared (the demo and scripts show only stdout)."""
    text, md = report.render("text"), report.render("markdown")
    first = text.splitlines()[2]
    assert first.startswith("compared: before vs after the deploy of vllm v2 at ")
    assert first.endswith("Z (deploy marker)")
    assert report.baseline["end"] in first  # the deploy time is where the windows meet
    assert f"Compared: {report.comparison()}" in md.splitlines()[:4]
    assert "note: deploy marker" not in text  # said once, at the top


def test_metric_table_explains_its_marks_and_keeps_one_unit(report: Report) -> None:
    text = report.render("text")
    lines = text.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("metric"))
    header = lines[header_at].split()
    assert header[-2:] == ["regressed", "source"]
    rows = lines[header_at + 1 : lines.index("", header_at)]
    legend = rows.pop()
    assert legend.startswith("regressed: ")  # the column is explained under the table
    assert not any("*" in row for row in rows)
    marked = {row.split()[0] + " " + row.split()[1] for row in rows if " yes " in f" {row} "}
    expected = {f"{e.name} p{round(e.quantile * 100)}" for e in report.estimates if e.significant}
    expected &= {f"{e.name} p{round(e.quantile * 100)}" for e in report.estimates if e.quantile in (0.5, 0.99)}
    assert marked == expected
    for row in rows:
        if "n/a" in row:
            continue
        # The CI is in the units of the values beside it (ms or s), never bare 4-decimal seconds.
        ci = row.split("  ")
        ci_cell = next(cell.strip() for cell in ci if " .. " in cell)
        for bound in ci_cell.split(" .. "):
            assert bound == "0" or bound.endswith((" ms", " s", " µs")), row
    headline = next(line for line in lines if "95% CI of the change" in line)
    r = report.regression
    assert r.ci is not None
    assert f"{r.ci[0] * 1e3:+.1f} ms" in headline or f"{r.ci[0]:+.2f} s" in headline


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
