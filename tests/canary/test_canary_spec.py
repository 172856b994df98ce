"""SLO syntax: what users type on the command line and in controller parameters."""

from __future__ import annotations

import pytest

from sre_agent.api.canary_routes import request_from_params
from sre_agent.canary.spec import CanarySpec, parse_max_regression, parse_slo
from sre_agent.errors import ConfigError, UsageError


@pytest.mark.parametrize(
    ("text", "kind", "metric", "quantile", "threshold"),
    [
        ("ttft_p99=2s", "quantile", "ttft", 0.99, 2.0),
        ("itl_p99=80ms", "quantile", "itl", 0.99, 0.08),
        ("tpot_p50=30ms", "quantile", "tpot", 0.5, 0.03),
        ("e2e_p99.9=20", "quantile", "e2e", 0.999, 20.0),
        ("queue_p999=500ms", "quantile", "queue", 0.999, 0.5),
        ("E2E_P95 = 1.5s", "quantile", "e2e", 0.95, 1.5),
        ("error_rate=1%", "error_rate", None, None, 0.01),
        ("error_rate=0.002", "error_rate", None, None, 0.002),
        ("goodput=0.95", "goodput", None, None, 0.95),
        ("goodput=99%", "goodput", None, None, 0.99),
    ],
)
def test_parse_slo(text: str, kind: str, metric: str | None, quantile: float | None, threshold: float) -> None:
    slo = parse_slo(text)
    assert slo.kind == kind
    assert slo.metric == metric
    assert slo.quantile == pytest.approx(quantile) if quantile is not None else slo.quantile is None
    assert slo.threshold == pytest.approx(threshold)


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("ttft_p99", "NAME=VALUE"),
        ("latency_p99=2s", "unknown SLO"),
        ("ttft_p99=2x", "duration"),
        ("ttft_p99=-1s", "duration"),
        ("error_rate=150%", "between 0 and 1"),
        ("goodput=high", "fraction"),
        ("ttft_p0=1s", "between p0 and p100"),
    ],
)
def test_bad_slo_is_a_usage_error_with_a_hint(text: str, hint: str) -> None:
    with pytest.raises(UsageError, match=hint):
        parse_slo(text)


def test_max_regression() -> None:
    r = parse_max_regression("ttft_p99=15%")
    assert (r.metric, r.quantile, r.max_increase) == ("ttft", 0.99, pytest.approx(0.15))
    assert parse_max_regression("e2e_p50=0.1").max_increase == pytest.approx(0.1)
    with pytest.raises(UsageError):
        parse_max_regression("error_rate=10%")
    with pytest.raises(UsageError):
        parse_max_regression("ttft_p99=-5%")


def test_spec_splits_alpha_over_checks_and_refuses_empty_or_duplicates() -> None:
    spec = CanarySpec.from_strings(["ttft_p99=2s,error_rate=1%", "goodput=0.9"], ["ttft_p99=15%"])
    assert len(spec.slos) == 3
    assert spec.check_alpha == pytest.approx(0.05 / 4)
    needs = spec.quantile_needs()
    relative = [n for n in needs if n.key == "reg:ttft_p99"]
    assert {n.side for n in relative} == {"baseline", "candidate"}
    assert all(n.alpha == pytest.approx(spec.check_alpha) for n in relative)
    with pytest.raises(UsageError, match="at least one"):
        CanarySpec.from_strings([], [])
    with pytest.raises(UsageError, match="twice"):
        CanarySpec.from_strings(["ttft_p99=2s", "ttft_p99=3s"])
    with pytest.raises(UsageError, match="min-samples"):
        CanarySpec.from_strings(["ttft_p99=2s"], min_samples=0)


def test_controller_parameters_flagger_metadata_and_argo_query() -> None:
    selection, spec = request_from_params(
        {
            "baseline_version": "v1",
            "candidate_version": "v2",
            "slo": "ttft_p99=2s,error_rate=1%",
            "max_regression": ["ttft_p99=15%"],
            "min_samples": "100",
            "dry_run": "true",
            "where": "model=llama,tenant.id=acme",
        }
    )
    assert selection.mode == "versions"
    assert selection.where == (("model", "llama"), ("tenant.id", "acme"))
    assert [s.name for s in spec.slos] == ["ttft_p99", "error_rate"]
    assert spec.min_samples == 100
    assert spec.dry_run is True
    selection, _ = request_from_params({"since_last_deploy": "true", "slo": "e2e_p99=20s"})
    assert selection.mode == "since_last_deploy"
    selection, _ = request_from_params({"selection": {"deploy_at": "1780000000", "window": "10m"}, "slo": "e2e_p99=2"})
    assert selection.mode == "deploy_at"
    with pytest.raises(ConfigError, match="unknown parameter"):
        request_from_params({"slos": "ttft_p99=2s"})
    with pytest.raises(ConfigError, match="true or false"):
        request_from_params({"slo": "ttft_p99=2s", "dry_run": "maybe"})
