"""Selections that cannot mislead (issue 12 items 5 and 9; issue 14's ``--service nope`` row).

A ``--where`` or ``--service`` that matches nothing is a usage error naming
the filter (exit 2, CONTRACTS section 2), raised as
:class:`~sre_agent.errors.EmptySelectionError` so the canary can answer
"could not evaluate"; and a filter set on the spans is also applied to the
metric stream, or the metrics are not used at all (with a note saying so).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from sre_agent.analysis.compare import Comparison
from sre_agent.analysis.diagnosis import diagnose
from sre_agent.analysis.selection import Selection
from sre_agent.cli import main
from sre_agent.errors import EmptySelectionError, SelectionError

MakeStore = Callable[[str], tuple[Path, int]]


def test_a_where_that_matches_nothing_is_a_usage_error_naming_the_filter(
    make_store: MakeStore, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = make_store("load")  # a real load regression: unfiltered metrics would "explain" anything
    assert main(["diagnose", "--db", str(path), "--since-last-deploy", "--where", "tenant.id=nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert len(err.splitlines()) == 1
    assert "--where tenant.id=nope matches no engine request in either window" in err
    assert "acme" in err
    assert "globex" in err  # the values that are there
    assert "Traceback" not in err


def test_the_empty_selection_error_is_its_own_subclass(make_store: MakeStore) -> None:
    path, deploy = make_store("none")
    with pytest.raises(EmptySelectionError, match=r"host\.name=gpu-9"):
        diagnose(path, Selection(mode="deploy_at", deploy_at_ns=deploy, where=(("host.name", "gpu-9"),)))
    assert issubclass(EmptySelectionError, SelectionError)
    # A filter that empties one side only names that side.
    versions = Selection(
        mode="versions", baseline_version="v1", candidate_version="v2", where=(("service.version", "v2"),)
    )
    with pytest.raises(EmptySelectionError, match=r"service\.version=v2 matches no baseline engine request"):
        diagnose(path, versions)


def test_an_unknown_service_names_the_services_present(
    make_store: MakeStore, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = make_store("none")
    assert main(["diagnose", "--db", str(path), "--service", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no spans for service nope (services: vllm)" in err
    assert "deploy marker" not in err
    with pytest.raises(EmptySelectionError, match="no spans for service nope"):
        diagnose(path, Selection(mode="deploy_at", deploy_at_ns=1, service="nope"))


def test_metrics_are_narrowed_by_a_filter_they_carry(make_store: MakeStore) -> None:
    path, deploy = make_store("load")
    with duckdb.connect(str(path), read_only=True) as con:
        everything = Comparison.open(con, Selection(mode="deploy_at", deploy_at_ns=deploy))
        gpu1 = Selection(mode="deploy_at", deploy_at_ns=deploy, where=(("host.name", "gpu-1"),))
        one_host = Comparison.open(con, gpu1)
        assert everything.metrics.series_count("running_requests").baseline == 4
        assert one_host.metrics.series_count("running_requests").baseline == 1
        assert one_host.metrics.series_count("running_requests").candidate == 1
        whole = everything.metrics.gauge("running_requests", "sum_mean")
        part = one_host.metrics.gauge("running_requests", "sum_mean")
        assert part.candidate is not None
        assert whole.candidate is not None
        assert part.candidate < whole.candidate / 2
        assert not any("metrics not used" in n for n in one_host.notes)


def test_metrics_are_not_used_under_a_filter_they_cannot_carry(make_store: MakeStore) -> None:
    path, _ = make_store("load")
    report = diagnose(path, Selection(mode="since_last_deploy", where=(("tenant.id", "acme"),)))
    # Engine metrics have no tenant label: unfiltered they would describe both tenants' load.
    assert any("metrics not used: the metric stream carries no tenant.id" in n for n in report.notes)
    assert report.findings[0].cause == "load"  # the tenant's own arrivals rose: spans alone show it
    with duckdb.connect(str(path), read_only=True) as con:
        tenant = Comparison.open(con, Selection(mode="since_last_deploy", where=(("tenant.id", "acme"),)))
        assert not tenant.metrics.has("running_requests")
        assert tenant.request_counts["candidate"] > 0
