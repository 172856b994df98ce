"""`sre-agent replay` and `sre-agent demo` as a user runs them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sre_agent.cli import main
from sre_agent.replays.outputs import MemoryOutput
from sre_agent.replays.scenario import list_scenarios
from sre_agent.replays.telemetry import TelemetryEmitter


def test_replay_list_names_every_scenario_and_cause(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--list"]) == 0
    out = capsys.readouterr().out
    for path in list_scenarios():
        assert path.stem in out
    assert "host.name=replica-2" in out
    assert "tenant.id=acme" in out


def test_replay_json_summary_and_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["replay", "errors_http_500", "--scale", "0.1", "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["expected"] == {"cause": "errors", "scope": {}}
    rows = {r["metric"]: r for r in summary["metrics"]}
    assert rows["error_rate"]["baseline"] == 0.0
    assert rows["error_rate"]["candidate"] > 0.03
    assert main(["replay"]) == 2
    assert main(["replay", "none_version_bump", "--speed", "0"]) == 2
    assert main(["replay", str(tmp_path / "nope.toml")]) == 1
    assert "no such scenario" in capsys.readouterr().err


def test_speed_paces_export_on_an_injected_clock() -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    emitter = TelemetryEmitter(MemoryOutput(), 0, seed=1, speed=10.0, clock=lambda: now[0], sleep=sleep)
    for t in (0.0, 5.0, 10.0, 15.0):
        emitter.on_metrics(t, [])
    assert sleeps == pytest.approx([0.5, 0.5, 0.5])


def test_demo_prints_a_diagnosis_from_an_embedded_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = tmp_path / "demo.duckdb"
    assert main(["demo", "--db", str(db), "--format", "json", "--scale", "0.2"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["schema"] == "sre-agent/diagnosis/v1"
    assert report["regression"]["ratio"] > 1.0
    assert "replaying" in captured.err
    assert db.exists()


def test_demo_falls_back_to_the_stage_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sre_agent.analysis.diagnosis", None)  # as if the diagnosis engine were missing
    assert main(["demo", "--format", "json", "--scale", "0.2"]) == 0
    rows = {r["stage"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ttft"]["after"]["p99"] > rows["ttft"]["before"]["p99"]
    assert rows["dependency"]["before"]["n"] > 100
