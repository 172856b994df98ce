"""A headline short of the family-wise bar, corroborated by a mechanism measured under its own control.

``diagnosis._corroborated`` turns "no regression" into one only when both hold: a
user-facing quantile's own 95 % CI lies above zero (up >= 10 %), and an engine mechanism
compared under its own control (equal batch, same load, a counter) moved at confidence
>= 0.5. Each half alone, or a cause read without such a control, leaves the verdict alone.

``diagnosis._provisional`` / ``_by_mechanism``: the quantile that rose most by its point estimate
becomes the headline when a mechanism tested beyond its own noise explains it at >= 0.6; a weaker
mechanism, a split of the latency between stages or slices, or a cap read from a gauge do not.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sre_agent.analysis.diagnosis import (
    CORROBORATING,
    MECHANISM_CONFIDENCE,
    _by_mechanism,
    _corroborated,
    _provisional,
)
from sre_agent.analysis.rules_api import Evidence, Finding, MetricEstimate, Regression

NONE = Regression("e2e", 0.99, 11.19, 16.69, (-0.4, 15.2), False)
#: TPOT p50 x2.14 with a CI above zero (dev 1230025's numbers), e2e p99 through zero.
NOMINAL = [
    MetricEstimate("tpot", 0.5, 0.0197, 0.0422, (0.0018, 0.0631), (1.09, 4.2), False),
    MetricEstimate("e2e", 0.99, 11.19, 16.69, (-0.4, 15.2), (0.96, 2.36), False),
]


def _finding(cause: str, confidence: float) -> Finding:
    return Finding(cause=cause, title="t", explained=0.5, confidence=confidence)


def test_a_nominal_rise_with_a_controlled_mechanism_is_a_regression() -> None:
    out = _corroborated(NONE, NOMINAL, [_finding("decode_slowdown", 0.66)])
    assert out is not None
    assert out.significant
    assert (out.metric, out.quantile) == ("tpot", 0.5)
    assert "decode_slowdown" in out.note


@pytest.mark.parametrize(
    ("estimates", "findings"),
    [
        (NOMINAL, [_finding("decode_slowdown", 0.45)]),  # the mechanism is not sure enough
        (NOMINAL, [_finding("load", 0.95)]),  # arrivals are no control of their own: the mix of a window moves
        (NOMINAL, [_finding("traffic_mix", 0.9)]),
        (NOMINAL[1:], [_finding("decode_slowdown", 0.9)]),  # no quantile's own CI above zero
        ([MetricEstimate("itl", 0.99, 0.01, 0.02, None, None, False, "metrics")], [_finding("decode_slowdown", 0.9)]),
        ([MetricEstimate("queue", 0.5, 0.1, 0.5, (0.2, 0.6), (2.0, 6.0), False)], [_finding("prefix_cache", 0.9)]),
    ],
)
def test_either_half_alone_leaves_no_regression(estimates: list[MetricEstimate], findings: list[Finding]) -> None:
    assert _corroborated(NONE, estimates, findings) is None


def test_a_significant_headline_is_left_as_it_is() -> None:
    significant = Regression("ttft", 0.99, 1.0, 2.0, (0.5, 1.5), True)
    assert _corroborated(significant, NOMINAL, [_finding("decode_slowdown", 0.9)]) is None


def test_only_engine_mechanisms_corroborate() -> None:
    assert {"load", "capacity", "traffic_mix", "dependency", "errors", "retry_amplification"}.isdisjoint(CORROBORATING)


def test_a_stage_headline_the_mix_reproduces_is_no_regression() -> None:
    from sre_agent.analysis.diagnosis import _moved_with_the_mix

    stage = Regression("dependency", 0.9, 0.047, 0.084, (0.012, 0.072), True)
    mix = Finding(cause="traffic_mix", title="t", explained=1.0, confidence=0.6, rule="slices")
    out = _moved_with_the_mix(stage, [mix], {"slices": 0})
    assert not out.significant
    assert "moved with the traffic mix" in out.note
    # A user-facing headline the mix explains is a regression users feel, with traffic_mix its cause.
    e2e = Regression("e2e", 0.99, 1.0, 2.0, (0.5, 1.5), True)
    assert _moved_with_the_mix(e2e, [mix], {"slices": 0}).significant
    # A mix that reproduces part of the stage's change leaves the rest to explain.
    half = Finding(cause="traffic_mix", title="t", explained=0.5, confidence=0.6, rule="slices")
    assert _moved_with_the_mix(stage, [half], {"slices": 0}).significant
    # A queue that more work per request lengthened (the stage fallback's mix driver) is every request's.
    congestion = Finding(cause="traffic_mix", title="t", explained=1.0, confidence=0.25, stage="queue", rule="stages")
    assert _moved_with_the_mix(stage, [congestion], {"stages": 0}).significant
    # A stage finding leading the mix keeps the headline.
    dep = Finding(cause="dependency", title="t", explained=1.0, confidence=0.9, rule="dependency")
    assert _moved_with_the_mix(stage, [mix, dep], {"slices": 0, "dependency": 1}).significant


def test_a_version_pair_headline_the_baseline_reproduces_on_the_candidates_mix_is_the_routers() -> None:
    from sre_agent.analysis.diagnosis import _moved_with_the_mix

    # Two versions serving at once do not choose their requests: the baseline version, reweighted
    # to the canary's mix, reproduces the canary's e2e p99, so the version did not regress.
    e2e = Regression("e2e", 0.99, 1.0, 2.0, (0.5, 1.5), True)
    mix = Finding(cause="traffic_mix", title="t", explained=0.95, confidence=0.6, rule="traffic_mix")
    out = _moved_with_the_mix(e2e, [mix], {"traffic_mix": 0}, versions_side_by_side=True)
    assert not out.significant
    assert "routed to each version" in out.note
    # Before and after a deploy the same mix is a regression users feel, the mix its cause.
    assert _moved_with_the_mix(e2e, [mix], {"traffic_mix": 0}).significant
    # Half reproduced leaves the version a regression to explain.
    half = replace(mix, explained=0.5)
    assert _moved_with_the_mix(e2e, [half], {"traffic_mix": 0}, versions_side_by_side=True).significant


def test_a_version_pair_ranks_the_versions_own_mechanism_before_the_traffic_routed_to_it() -> None:
    from sre_agent.analysis.diagnosis import _rank

    regression = Regression("ttft", 0.99, 1.0, 2.0, (0.5, 1.5), True)
    routed = Finding(cause="traffic_mix", title="t", explained=1.0, confidence=0.8, rule="queueing")
    load = Finding(cause="load", title="t", explained=0.5, confidence=0.9, rule="queueing")
    cache = Finding(cause="prefix_cache", title="t", explained=0.3, confidence=0.7, rule="prefix_cache")
    order = {"queueing": 0, "prefix_cache": 1}
    pair = _rank([routed, load, cache], regression, order, None, versions_side_by_side=True)
    assert [f.cause for f in pair] == ["prefix_cache", "traffic_mix", "load"]
    # Before and after a deploy the score alone orders them.
    swap = _rank([routed, load, cache], regression, order, None)
    assert [f.cause for f in swap] == ["traffic_mix", "load", "prefix_cache"]


#: Trace p50 x1.65 whose time-block CI runs through zero (load x1.47 at a deploy, dev-unseen 1240064).
RISEN_IN_NOISE = [
    MetricEstimate("trace", 0.5, 0.62, 1.03, (-0.5, 2.6), (0.3, 5.2), False),
    MetricEstimate("ttft", 0.99, 2.42, 4.24, None, None, False, "metrics"),
    MetricEstimate("e2e", 0.99, 8.7, 9.4, None, None, False, "metrics"),
]


def _ruled(cause: str, confidence: float, rule: str) -> Finding:
    return _finding(cause, confidence).with_rule(rule)


def test_the_provisional_headline_is_the_highest_risen_quantile() -> None:
    provisional = _provisional(RISEN_IN_NOISE)
    assert provisional is not None
    assert (provisional.metric, provisional.quantile) == ("ttft", 0.99)
    assert provisional.significant  # so that the rules explain it
    # Nothing rose by MIN_EFFECT (twice that without a CI): nothing to test.
    assert _provisional([MetricEstimate("e2e", 0.99, 8.7, 9.4, (-1.0, 2.0), (0.9, 1.2), False)]) is None
    assert _provisional([MetricEstimate("ttft", 0.5, 0.0747, 0.0889, None, None, False, "metrics")]) is None


@pytest.mark.parametrize(
    ("cause", "rule"),
    [
        ("load", "engine_metrics"),
        ("prefix_cache", "prefix_cache"),
        ("traffic_mix", "queueing"),
        ("batch_composition", "batch_composition"),
    ],
)
def test_a_mechanism_tested_beyond_its_own_noise_makes_the_regression(cause: str, rule: str) -> None:
    provisional = _provisional(RISEN_IN_NOISE)
    assert provisional is not None
    out = _by_mechanism(provisional, [_ruled(cause, MECHANISM_CONFIDENCE, rule)])
    assert out is not None
    assert out.significant
    assert (out.metric, out.quantile) == ("ttft", 0.99)
    assert cause in out.note
    assert "within the window's own noise" in out.note


@pytest.mark.parametrize(
    "finding",
    [
        _ruled("load", MECHANISM_CONFIDENCE - 0.01, "engine_metrics"),  # not sure enough
        _ruled("capacity", 0.95, "stages"),  # a split of the latency is no test of a mechanism
        _ruled("decode_slowdown", 0.95, "slices"),
        _ruled("dependency", 0.95, "dependency"),  # a stage of its own, with its own headline route
        _ruled("errors", 0.95, "errors"),
        _ruled("capacity", 0.8, "engine_metrics"),  # a cap read from the gauge's median, no test of its own
    ],
)
def test_a_split_or_a_weak_mechanism_leaves_no_regression(finding: Finding) -> None:
    provisional = _provisional(RISEN_IN_NOISE)
    assert provisional is not None
    assert _by_mechanism(provisional, [finding]) is None


def _capacity(before: float, after: float, rule: str = "queueing") -> Finding:
    evidence = (Evidence("replicas", before, after, "distinct engine instances serving"),)
    return Finding(cause="capacity", title="t", explained=0.5, confidence=0.9, evidence=evidence).with_rule(rule)


def test_replicas_counted_fewer_make_the_regression_outside_a_version_pair() -> None:
    provisional = _provisional(RISEN_IN_NOISE)
    assert provisional is not None
    out = _by_mechanism(provisional, [_capacity(4, 3)])
    assert out is not None
    assert "capacity" in out.note
    # A canary's replicas are its version's by design; the same count names nothing there.
    assert _by_mechanism(provisional, [_capacity(4, 3)], versions_side_by_side=True) is None
    # Fewer than 10 % fewer (time-weighted serving: a replica drained for 20 s of 300) is no count.
    assert _by_mechanism(provisional, [_capacity(4.0, 3.7, "engine_metrics")]) is None
    # Partitions of the latency do not test a mechanism, whatever their evidence says.
    assert _by_mechanism(provisional, [_capacity(4, 3, "stages")]) is None


def test_a_running_cap_that_held_requests_back_makes_the_regression() -> None:
    """max_num_seqs 128 -> 6: shorter batches decode faster (e2e p99 x0.93) while requests queue at the cap.

    The queueing rule names the cap only when its tests passed (peak down 10 % and two slots, more
    waiting, queue time in the tail, the cap binding), and says so with its ``max_running_requests``
    evidence; a lower running count read at the scrapes with a backlog alone has no test (dev 1230231).
    """
    provisional = _provisional(RISEN_IN_NOISE)
    assert provisional is not None
    peak = Evidence("max_running_requests", 26.0, 6.0, "peak of the running gauge: the effective max_num_seqs")
    cap = Finding(cause="capacity", title="t", explained=0.9, confidence=0.9, evidence=(peak,)).with_rule("queueing")
    out = _by_mechanism(provisional, [cap])
    assert out is not None
    assert "capacity" in out.note
    # Its evidence is a count of slots; a version pair's own cap counts too.
    assert _by_mechanism(provisional, [cap], versions_side_by_side=True) is not None
    under = Evidence("running_under_backlog", 2.0, 1.0, "median running gauge at the scrapes with requests waiting")
    median_only = replace(cap, evidence=(under,))
    assert _by_mechanism(provisional, [median_only]) is None


def test_findings_that_explain_as_much_lead_with_the_stage_the_headline_measures() -> None:
    from sre_agent.analysis.diagnosis import _rank

    decode = Finding(cause="decode_slowdown", title="t", explained=0.0, confidence=0.1, stage="decode", rule="decode")
    prefill = Finding(cause="prefill_slowdown", title="t", explained=0.0, confidence=0.6, stage="prefill", rule="pre")
    order = {"decode": 0, "pre": 1}
    ttft = Regression("ttft", 0.99, 1.0, 2.0, (0.5, 1.5), True)
    assert [f.cause for f in _rank([decode, prefill], ttft, order, None)] == ["prefill_slowdown", "decode_slowdown"]
    tpot = Regression("tpot", 0.5, 0.1, 0.2, (0.05, 0.1), True)
    assert [f.cause for f in _rank([prefill, decode], tpot, order, None)] == ["decode_slowdown", "prefill_slowdown"]
    # Over every stage, rule order.
    e2e = Regression("e2e", 0.99, 1.0, 2.0, (0.5, 1.5), True)
    assert [f.cause for f in _rank([prefill, decode], e2e, order, None)] == ["decode_slowdown", "prefill_slowdown"]
