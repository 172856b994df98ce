"""Degraded inputs give a clear error or an honest degraded report, never a crash or a confident wrong answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from sre_agent import diagnose
from sre_agent.analysis.selection import Selection, Window
from sre_agent.errors import InsufficientDataError

MakeStore = Callable[[str], tuple[Path, int]]
SINCE = Selection(mode="since_last_deploy")
NS = 1_000_000_000


def test_one_side_empty_is_a_clear_error(make_store: MakeStore) -> None:
    path, deploy = make_store("none")
    sel = Selection(
        mode="windows",
        baseline=Window(deploy - 200 * NS, deploy),
        candidate=Window(deploy + 3600 * NS, deploy + 7200 * NS),
    )
    with pytest.raises(InsufficientDataError, match=r"candidate window .* holds no engine requests"):
        diagnose(path, sel)


def test_spans_only_still_finds_the_load(make_store: MakeStore) -> None:
    path, _ = make_store("spans_only")
    report = diagnose(path, SINCE)
    assert report.findings[0].cause == "load", report.render("text")
    assert all(e.source != "metrics" for e in report.estimates)


def test_metrics_only_gives_a_degraded_honest_report(make_store: MakeStore) -> None:
    path, _ = make_store("metrics_only")
    report = diagnose(path, SINCE)
    assert report.estimates
    assert {e.source for e in report.estimates} == {"metrics"}
    assert all(e.ci is None for e in report.estimates)  # no CIs are invented
    assert any("metric histograms" in n for n in report.notes)
    assert any("span-based rules cannot run" in n for n in report.notes)
    data = report.to_dict()
    assert data["regression"]["ci"] is None
    for finding in report.findings:
        assert finding.cause in ("none", "load", "capacity", "kv_pressure", "batch_composition", "prefix_cache")


def test_clock_skew_between_gateway_and_engine_does_not_bias_stages(make_store: MakeStore) -> None:
    path, _ = make_store("skew")
    report = diagnose(path, SINCE)
    assert report.findings[0].cause == "load", report.render("text")
    with duckdb.connect(str(path), read_only=True) as con:
        from sre_agent.analysis.compare import Comparison

        comparison = Comparison.open(con, SINCE)
        traces = comparison.traces
        assert traces.height > 0
        # gateway time is derived from durations, so a 3 s clock offset cannot show up as 3 s of gateway
        assert float(traces["gateway_s"].max()) < 0.1  # type: ignore[arg-type]


def test_malformed_rows_are_ignored_and_reported(make_store: MakeStore) -> None:
    path, _ = make_store("malformed")
    report = diagnose(path, SINCE)
    assert report.findings[0].cause == "none", report.render("text")
    counts = [int(n.split()[0]) for n in report.notes if "engine spans carried malformed latencies" in n]
    assert len(counts) == 2  # one note per side
    assert all(30 <= c <= 40 for c in counts)  # the 40 bad rows per side, less any outside the capped windows
    for e in report.estimates:
        assert e.baseline is None or e.baseline >= 0


def test_a_rule_that_raises_is_reported_and_skipped(make_store: MakeStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    # the package attribute `diagnose` is the function; the module lives in sys.modules
    diagnose_module = importlib.import_module("sre_agent.analysis.diagnosis")

    def broken(regression: object) -> None:
        raise RuntimeError("boom")

    def asks_for_nonsense(nonsense: object) -> None:
        return None

    real = diagnose_module.load_rules
    monkeypatch.setattr(
        diagnose_module,
        "load_rules",
        lambda names=None: (real(names)[0] + [("broken", broken), ("odd", asks_for_nonsense)], []),
    )
    path, _ = make_store("load")
    report = diagnose(path, SINCE)
    assert report.findings[0].cause == "load"
    assert any(e.startswith("broken: RuntimeError: boom") for e in report.errors)
    assert any(e.startswith("odd: TypeError: asks for unknown context nonsense") for e in report.errors)
