"""Run the rules over a comparison and rank what they find.

``diagnose(source, selection)`` resolves the selection (:mod:`sre_agent.analysis.compare`),
estimates every latency quantile with CIs over time blocks and picks the headline
regression (:mod:`sre_agent.analysis.headline`), runs each registered rule with only the context it asks for
(by parameter name, as sqlglot's optimizer passes its rules their arguments),
and ranks the findings by ``explained x confidence``. When nothing
regressed, the first finding is ``none``.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from sre_agent.analysis import stats
from sre_agent.analysis.compare import SIDES, Comparison
from sre_agent.analysis.decompose import stage_decomposition
from sre_agent.analysis.headline import (
    HEADLINE_METRICS,
    METRIC_MIN_EFFECT,
    MIN_EFFECT,
    QUANTILES,
    STAGE_METRICS,
    estimate_metrics,
    headline,
    leading,
)
from sre_agent.analysis.localise import Localisation, localise
from sre_agent.analysis.report import Report
from sre_agent.analysis.rules_api import (
    CONTEXT_NAMES,
    SHARE_HEADLINES,
    Finding,
    MetricEstimate,
    Regression,
    Rule,
    RuleSkipped,
)
from sre_agent.analysis.rules_registry import LoadFailure, load_rules
from sre_agent.analysis.selection import Selection
from sre_agent.errors import StoreError
from sre_agent.store.sql_text import dialect_of

if TYPE_CHECKING:
    import duckdb

__all__ = ["HEADLINE_METRICS", "MIN_EFFECT", "QUANTILES", "diagnose", "estimate_metrics", "headline", "run_rules"]

_log = logging.getLogger(__name__)


class RuleContext:
    """Context values by name, each built on first request and then shared by every rule."""

    def __init__(self, factories: dict[str, Callable[[], Any]]) -> None:
        self._factories = factories
        self._values: dict[str, Any] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def get(self, name: str) -> Any:
        """The value for ``name`` (KeyError when unknown)."""
        if name not in self._values:
            self._values[name] = self._factories[name]()
        return self._values[name]


def _context(comparison: Comparison, regression: Regression, estimates: list[MetricEstimate]) -> RuleContext:
    """The context of CONTEXT_NAMES, evaluated only when a rule asks for a name."""
    return RuleContext(
        {
            "comparison": lambda: comparison,
            "regression": lambda: regression,
            "estimates": lambda: estimates,
            "requests": comparison.lazy,
            "baseline": lambda: comparison.lazy("baseline"),
            "candidate": lambda: comparison.lazy("candidate"),
            "dimensions": lambda: list(comparison.dimensions),
            "metrics": lambda: comparison.metrics,
            "spans": lambda: comparison.spans,
            "traces": lambda: comparison.traces.lazy(),  # noqa: PLW0108 - traces is computed on first use
            "windows": lambda: comparison.windows,
            "arrival_rate": lambda: comparison.arrival_rate,
            "stages": lambda: stage_decomposition(comparison, regression),
            "localisation": lambda: localise(comparison, regression),
        }
    )


def run_rules(
    rules: Iterable[tuple[str, Rule]], context: RuleContext
) -> tuple[list[Finding], list[LoadFailure], list[str], dict[str, float]]:
    """Call each rule with the context it names; collect findings, failures, skip notes and timings (s).

    Rules marked :func:`~sre_agent.analysis.rules_api.run_late` run after the others, in their given order.
    """
    findings: list[Finding] = []
    failures: list[LoadFailure] = []
    notes: list[str] = []
    timings: dict[str, float] = {}
    for name, rule in sorted(rules, key=lambda item: bool(getattr(item[1], "runs_late", False))):
        started = time.perf_counter()
        try:
            params = inspect.signature(rule).parameters
            unknown = [p for p in params if p not in CONTEXT_NAMES or p not in context]
            if unknown:
                raise TypeError(f"asks for unknown context {', '.join(unknown)}; known: {', '.join(CONTEXT_NAMES)}")
            kwargs = {p: context.get(p) for p in params}
            result = rule(**kwargs)
            produced = [result] if isinstance(result, Finding) else list(result or [])
            for f in produced:
                if not isinstance(f, Finding):
                    raise TypeError(f"returned {type(f).__name__}, not Finding")
                if f.cause == "none":
                    raise ValueError("rules do not report 'none'; the runner does when nothing regressed")
            findings.extend(f.with_rule(name) for f in produced)
        except RuleSkipped as skip:
            notes.append(f"{name}: {skip}")
        except Exception as exc:  # one failing rule must not take the diagnosis down
            _log.warning("rule %s failed: %s", name, exc, exc_info=True)
            failures.append(LoadFailure(name, f"{type(exc).__name__}: {exc}"))
        timings[name] = time.perf_counter() - started
    return findings, failures, notes, timings


#: The stages a latency measures: among findings that explain as much, those of its own stages lead.
_STAGES_OF: Final[dict[str, frozenset[str]]] = {
    "ttft": frozenset({"queue", "prefill"}),
    **{m: frozenset({"decode"}) for m in ("tpot", "itl", "decode")},
    **{m: frozenset({m}) for m in ("queue", "prefill", "dependency")},
}


def _rank_key(order: dict[str, int], metric: str | None = None) -> Callable[[Finding], tuple[float, bool, int]]:
    """Findings' order: the highest score first; ties to a finding in a stage ``metric`` measures, then rule order.

    Findings that explain none of the headline (score 0) still differ in where they act: under a
    TTFT p99 that is all queue, a prompt token 141 % costlier in every step (prefill) came after a
    TPOT rise (decode) by rule order alone (dev 1300122); under a TPOT headline the decode's leads.
    A latency over every stage (e2e, trace) leaves rule order.
    """
    own = _STAGES_OF.get(metric or "", frozenset())
    return lambda f: (-f.score, f.stage not in own, order.get(f.rule, 0))


#: Causes that are the traffic a router sends each side, which a version pair's versions do not
#: choose: arrivals per replica, and the requests' mix (prompt lengths and prefixes, tenants).
ROUTED: Final[frozenset[str]] = frozenset({"load", "traffic_mix"})


def _rank(
    findings: list[Finding],
    regression: Regression,
    order: dict[str, int],
    localisation: Localisation | None,
    *,
    versions_side_by_side: bool = False,
) -> list[Finding]:
    if localisation is not None and localisation.scope and regression.significant:
        # The regression lives in one slice, so every explanation without a scope of its own
        # is about that slice.
        findings = [f if f.scope else replace(f, scope=dict(localisation.scope)) for f in findings]
    findings = _stage_scopes(findings)
    owner = {"error_rate": "errors", "retried_share": "retry_amplification"}.get(regression.metric)
    if owner is not None:
        # The regression *is* the failed (retried) share: that cause's finding accounts for all of it.
        findings = [replace(f, explained=1.0) if f.cause == owner else f for f in findings]
    ranked = sorted(findings, key=_rank_key(order, regression.metric))
    if versions_side_by_side:
        # Two versions serving at once: what the router sent each is not what either version does,
        # so a version's own mechanism comes first and the routed traffic after it, as context.
        ranked = [f for f in ranked if f.cause not in ROUTED] + [f for f in ranked if f.cause in ROUTED]
    if not regression.significant:
        # Nothing regressed: say so first; whatever moved is listed after, for context.
        ranked.insert(0, _none_finding(regression))
    return ranked


#: Entry-point name of the stage decomposition's rule (rules/stages.py), whose findings carry no slice.
_STAGE_RULE: Final[str] = "stages"


def _stage_scopes(findings: list[Finding]) -> list[Finding]:
    """Give the stage decomposition's finding the slice a mechanism rule found for the same cause and stage.

    The decomposition says where the tail's extra time went, over all requests; it cannot
    say which slice. When a rule that reads the mechanism (a dependency confined to one
    tenant, say) names the same cause in the same stage with a scope, both findings tell
    one explanation, and the decomposition's scope is that rule's. Its score is unchanged.
    """
    scoped: dict[tuple[str, str | None], Finding] = {}
    for f in sorted(findings, key=lambda f: -f.score):
        if f.rule != _STAGE_RULE and f.scope:
            scoped.setdefault((f.cause, f.stage), f)
    return [
        replace(f, scope=dict(scoped[(f.cause, f.stage)].scope))
        if f.rule == _STAGE_RULE and not f.scope and (f.cause, f.stage) in scoped
        else f
        for f in findings
    ]


def _none_finding(regression: Regression) -> Finding:
    from sre_agent.analysis.rules_api import Evidence

    label = f"{regression.metric} p{round(regression.quantile * 100)}"
    evidence: list[Evidence] = []
    if regression.baseline is not None:
        ci = f"CI of the change {regression.ci[0]:+.4f}..{regression.ci[1]:+.4f} s" if regression.ci else "no CI"
        evidence.append(Evidence(label, regression.baseline, regression.candidate, ci))
    if regression.tail_p is not None:
        evidence.append(Evidence("tail_test_p", None, regression.tail_p, "share above the baseline quantile"))
    confidence = 0.5 if regression.baseline is None or regression.ci is None else 0.9
    why = (
        regression.note
        if regression.note.startswith(f"{label} moved with the traffic mix")
        else f"{label} within noise or below {MIN_EFFECT - 1:.0%}"
    )
    return Finding(
        cause="none",
        title=f"No significant latency regression ({why})",
        explained=1.0,
        confidence=confidence,
        evidence=tuple(evidence),
        next_check="widen the windows or compare another quantile if users still report slowness",
    )


#: Causes measured under a control of their own (equal running batch and prompt size, the same
#: load, a counter that moved), whose finding can corroborate a headline short of the family bar.
CORROBORATING: Final[frozenset[str]] = frozenset(
    {"decode_slowdown", "prefill_slowdown", "kv_pressure", "prefix_cache", "batch_composition"}
)
#: Confidence from which such a finding corroborates.
CORROBORATION_CONFIDENCE: Final[float] = 0.5


def _surest(
    findings: list[Finding], causes: frozenset[str], confidence: float, *, skip: frozenset[str] = frozenset()
) -> Finding | None:
    """The most confident finding of ``causes`` at ``confidence`` or more, from a rule not in ``skip``."""
    strong = [f for f in findings if f.cause in causes and f.rule not in skip and f.confidence >= confidence]
    return max(strong, key=lambda f: f.confidence) if strong else None


def _corroborated(
    regression: Regression, estimates: list[MetricEstimate], findings: list[Finding]
) -> Regression | None:
    """A headline short of the family-wise bar that a mechanism measured under its own control confirms.

    The family-wise bar guards against calling a regression from whichever of many latencies
    moved by chance. A user-facing quantile whose own 95 % CI lies above zero, up by
    :data:`~sre_agent.analysis.headline.MIN_EFFECT` at least, is no longer one draw among many
    when an engine mechanism, compared under its own control, moved at
    :data:`CORROBORATION_CONFIDENCE` or more: a decode x2.15 in a rolling restart raised TPOT
    at equal batch by 60 % (confidence 0.66) while its TPOT p50 x2.14, CI +1.8..+63 ms, read
    z = 2.2 against the bar of 2.5 over four latencies (dev 1230025, "no regression"). ``None``
    when the headline is significant or nothing corroborates it.
    """
    if regression.significant:
        return None
    by = _surest(findings, CORROBORATING, CORROBORATION_CONFIDENCE)
    nominal = [
        e
        for e in estimates
        if e.name in HEADLINE_METRICS
        and e.source == "spans"
        and e.ci is not None
        and e.ci[0] > 0
        and (e.ratio or 0.0) >= MIN_EFFECT
    ]
    if by is None or not nominal:
        return None
    best = leading(nominal)
    label = f"{best.name} p{round(best.quantile * 100)}"
    note = (
        f"{label} rose beyond its own 95 % CI but not the family-wise bar over the latencies; "
        f"{by.cause} (confidence {by.confidence:.2f}), measured under its own control, corroborates it"
    )
    return Regression(best.name, best.quantile, best.baseline, best.candidate, best.ci, True, note=note)


#: Causes whose rule tests a mechanism of its own beyond that mechanism's noise (the CORROBORATING
#: controls, plus arrivals against their per-slice spread and work per request), which alone can
#: make a regression of a latency that rose within its noise (:func:`_by_mechanism`). ``capacity``
#: only by a count (:func:`_replicas_counted_fewer`) or a peak cap that binds (:func:`_cap_held_requests`):
#: a lower cap read from the running gauge's median at the scrapes that had a backlog has no test of
#: its own (a version bump, metrics only, waiting 0.02 -> 0.03: "1.0 run per replica against 2.0" at
#: 0.8; dev 1230231).
MECHANISMS: Final[frozenset[str]] = CORROBORATING | {"load", "traffic_mix"}
#: Rules that split a latency's change between stages or slices rather than test a mechanism.
_PARTITIONS: Final[frozenset[str]] = frozenset({"stages", "slices"})
#: Confidence from which such a mechanism alone makes the regression. Calibrated on a null: the
#: 61 scored healthy deploys of the incident generator's seeds 1900000-1900399 (a range no
#: benchmark reports on), where a user-facing quantile rose >= 10 % by chance in 31 and the rules,
#: asked to explain it, put such a mechanism at 0.49 at most; real causes in the dev ranges read
#: 0.65 and up (a metric-only prefix cache switched off, KV per running request x12 under preemptions).
#: Measured by ``python tests/benchmarks/mechanism_null.py``.
MECHANISM_CONFIDENCE: Final[float] = 0.6


def _provisional(estimates: list[MetricEstimate]) -> Regression | None:
    """The user-facing quantile that rose most by its point estimate, as a headline to test.

    The highest quantile up by :data:`~sre_agent.analysis.headline.MIN_EFFECT` (twice that
    without a CI), then the largest ratio (:func:`~sre_agent.analysis.headline.leading`).
    ``None`` when no user-facing latency rose that much. Its ``significant`` is True only so that
    the rules explain it; :func:`_by_mechanism` decides whether it stands.
    """
    # Without a CI (a metric histogram's quantile, interpolated inside its bucket), twice the
    # effect, as the headline's own metric route asks.
    risen = [
        e
        for e in estimates
        if e.name in HEADLINE_METRICS
        and e.source != "derived"
        and (e.ratio or 0.0) >= (MIN_EFFECT if e.ci is not None else METRIC_MIN_EFFECT)
    ]
    if not risen:
        return None
    best = leading(risen)
    return Regression(best.name, best.quantile, best.baseline, best.candidate, best.ci, True)


def _replicas_counted_fewer(finding: Finding) -> bool:
    """A ``capacity`` finding whose replicas fell >= 10 % by their count, not by an estimate.

    Distinct instances serving (span resource attributes, else metric series weighted by the
    time each served) are counted, with no sampling noise of their own; a replica removed for
    the same traffic is there whatever the latency's noise (1 of 4 SGLang replicas removed:
    e2e p99 x1.46, its CI above zero but short of the family bar, read "no regression").
    """
    if finding.cause != "capacity":
        return False
    counted = next((e for e in finding.evidence if e.signal == "replicas"), None)
    before, after = (counted.baseline, counted.candidate) if counted is not None else (None, None)
    if not isinstance(before, int | float) or not isinstance(after, int | float):
        return False
    return before > 0 and after <= (1 - REPLICAS_FELL) * before


#: Fall of the replica count that makes a counted capacity loss.
REPLICAS_FELL: Final[float] = 0.10


def _cap_held_requests(finding: Finding) -> bool:
    """A ``capacity`` finding of a lower running cap that held requests back, tested on the gauges.

    The queueing rule names a cap only when its own tests passed: the running gauge's peak fell
    10 % and two slots or more, requests waited more, queue time holds part of the tail excess,
    and the cap binds (two scrapes or more with requests waiting, their running counts at one
    value and at the replica's peak: :func:`sre_agent.rules._steps.slot_cap_binds`). Its
    ``max_running_requests`` evidence says so. A cut of ``max_num_seqs`` 128 -> 6 moved the
    e2e p99 x0.93 (shorter batches decode faster) while the queue grew: "no regression" over
    "max running requests 26 -> 6 while requests wait" at 0.9 (dev 1300226).
    """
    if finding.cause != "capacity":
        return False
    peak = next((e for e in finding.evidence if e.signal == "max_running_requests"), None)
    return peak is not None and isinstance(peak.baseline, int | float) and isinstance(peak.candidate, int | float)


def mechanism_finding(
    findings: list[Finding], confidence: float, *, versions_side_by_side: bool = False
) -> Finding | None:
    """The most confident finding of a mechanism tested on its own (:data:`MECHANISMS`, a lower
    running cap that held requests back, or replicas counted fewer outside a version pair) at
    ``confidence`` or more, from no partition rule."""
    tested = [
        f
        for f in findings
        if f.cause in MECHANISMS or _cap_held_requests(f) or (not versions_side_by_side and _replicas_counted_fewer(f))
    ]
    return _surest(tested, MECHANISMS | {"capacity"}, confidence, skip=_PARTITIONS)


def _by_mechanism(
    provisional: Regression, findings: list[Finding], *, versions_side_by_side: bool = False
) -> Regression | None:
    """The provisional headline when a mechanism the rules tested on its own explains it; else ``None``.

    A window's latency quantiles move with its bursts: in a bursty trace a side's minutes
    differ far more than its requests, and the time-block CIs that say so leave a latency
    that really rose inside the noise (load x1.47 at the deploy, 610 against 1,185 requests:
    trace p50 x1.65 at z = 0.9; prefix caching lost, hit rate 34 % -> 0 %: TTFT p50 x1.9 at
    z = 1.7; dev-unseen 1240064, 1240152, called "no regression"). The mechanism's own test does
    not share that noise: arrivals against their per-slice spread, the hit rate against the
    mix's expectation, a step's tokens. When one of :data:`MECHANISMS` reaches
    :data:`MECHANISM_CONFIDENCE` explaining a user-facing quantile that rose
    :data:`~sre_agent.analysis.headline.MIN_EFFECT` or more, the regression is that mechanism's,
    and the note says the latency alone would not have shown it. A deploy that changed nothing
    must then fool the mechanism's test, not only the latency's. ``versions_side_by_side``: the
    windows are a version pair, whose replica counts differ by design.
    """
    by = mechanism_finding(findings, MECHANISM_CONFIDENCE, versions_side_by_side=versions_side_by_side)
    if by is None:
        return None
    label = f"{provisional.metric} p{round(provisional.quantile * 100)}"
    note = (
        f"{label} rose x{provisional.ratio:.2f}, within the window's own noise; {by.cause} "
        f"(confidence {by.confidence:.2f}), tested beyond its own noise, makes it a regression"
    )
    return replace(provisional, note=note)


#: Share of a stage headline that a mix finding must reproduce for the stage to have slowed for no request.
MIX_REPRODUCES: Final[float] = 0.9


def _moved_with_the_mix(
    regression: Regression, findings: list[Finding], order: dict[str, int], *, versions_side_by_side: bool = False
) -> Regression:
    """No regression when a stage headline, or a version pair's, is the traffic mix's alone.

    A stage is the headline only when no user-facing latency rose (users did not feel it, but
    a component slowed). When the leading finding is the mix's composition (the reweighted
    baseline, or a slow slice that grew) reproducing :data:`MIX_REPRODUCES` of the stage's
    change, no component slowed for any request: the
    quantile moved because more requests went through the slower path (a RAG route grew from 9
    to 13 % of the traffic, its retrieval ~110 ms against a guardrail's 25 ms, and the
    dependency p90 read x1.79 while every route's dependency time held; dev 1230259).

    Two versions serving side by side (``versions_side_by_side``) do not choose their requests:
    the router does. There any headline the baseline version reproduces on the candidate's mix is
    the routing's, not the version's (a prefix-affine router sends a canary the longer conversations).
    """
    if not regression.significant or not findings:
        return regression
    if regression.metric not in STAGE_METRICS and not versions_side_by_side:
        return regression
    top = min(findings, key=_rank_key(order, regression.metric))
    # Composition only: the reweighted baseline (rule traffic_mix) or a slow slice that grew without
    # its own requests slowing (the slices rule's stage-less finding). A queue that more work per
    # request lengthened is every request's, a regression the mix caused (dev 1230112).
    composition = top.rule == "traffic_mix" or (top.rule == "slices" and top.stage is None)
    if top.cause != "traffic_mix" or not composition or top.explained < MIX_REPRODUCES:
        return regression
    label = f"{regression.metric} p{round(regression.quantile * 100)}"
    if regression.metric in STAGE_METRICS:
        note = (
            f"{label} moved with the traffic mix: no user-facing latency rose, no request's {regression.metric} slowed"
        )
    else:
        note = (
            f"{label} moved with the traffic mix routed to each version: the baseline reweighted to the "
            f"candidate's mix reproduces {top.explained:.0%} of it"
        )
    return replace(regression, significant=False, note=note)


def _unexplained(context: RuleContext, regression: Regression) -> list[str]:
    """Why a reported regression has no explanation, when the reason is the sample size."""
    if regression.metric in SHARE_HEADLINES:
        return []
    decomposition = context.get("stages")
    tails = decomposition.tail_requests
    if min(tails) >= stats.MIN_TAIL:
        return []
    label = f"{regression.metric} p{round(regression.quantile * 100)}"
    return [
        f"unexplained, too few tail requests ({tails[0]} baseline / {tails[1]} candidate beyond the {label}; "
        f"needs {stats.MIN_TAIL} per side)"
    ]


def _connection(source: Any) -> tuple[duckdb.DuckDBPyConnection, bool]:
    """A DuckDB connection for ``source`` (Store, connection or path) and whether we own it."""
    import duckdb

    if isinstance(source, duckdb.DuckDBPyConnection):
        return source, False
    if dialect_of(source) == "clickhouse":
        # A ClickHouseConnection answers the DuckDB calls the analysis makes (sre_agent.store.clickhouse);
        # not imported here, since sqlglot is an optional install.
        return cast("duckdb.DuckDBPyConnection", source), False
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.exists():
            raise StoreError(f"no store at {path}")
        from sre_agent.store.embedded import Store

        # Through Store.open, so that a store of an older layout is upgraded before it is read.
        return Store.open(path, read_only=True).connection, True
    cursor = getattr(source, "cursor", None)
    if callable(cursor):
        con = cursor()
        if isinstance(con, duckdb.DuckDBPyConnection):
            return con, True
    connection = getattr(source, "connection", None)
    if isinstance(connection, duckdb.DuckDBPyConnection):
        return connection.cursor(), True
    raise TypeError(f"diagnose() needs a Store, a DuckDB connection or a path, not {type(source).__name__}")


def diagnose(
    source: Any,
    selection: Selection,
    *,
    rules: list[str] | None = None,
    sample_per_side: int = 50_000,
    seed: int = 0,
) -> Report:
    """Diagnose the regression between the selection's baseline and candidate.

    Args:
        source: a ``Store``, a DuckDB connection (tables ``spans``,
            ``metric_points``, ``deploys``) or the path of a store file
            (opened read-only).
        selection: what to compare (CONTRACTS section 2).
        rules: names of the rules to run (``None`` = every installed rule).
        sample_per_side: requests per side kept for mix and slice analysis.
        seed: seed of the request sample and the Hodges-Lehmann draws (results are reproducible).

    Raises:
        SelectionError: the selection cannot be resolved or selects nothing.
        InsufficientDataError: neither spans nor metrics give either side data.
    """
    started = time.perf_counter()
    con, owned = _connection(source)
    comparison: Comparison | None = None
    try:
        comparison = Comparison.open(con, selection, sample_per_side=sample_per_side, seed=seed)
        if all(comparison.request_counts[s] for s in SIDES):
            # The engine rules' busy intervals are read meanwhile, on a core the Python work leaves
            # idle. Only after the sample is drawn: both are parallel scans, and run together they
            # slowed each other more than the overlap saved.
            _ = comparison.requests
            comparison.start_prefetch()
        estimates = estimate_metrics(comparison)
        regression = headline(comparison, estimates)
        loaded, failures = load_rules(rules)
        context = _context(comparison, regression, estimates)
        findings, run_failures, skip_notes, timings = run_rules(loaded, context)
        order = {name: i for i, (name, _) in enumerate(loaded)}
        localisation = None
        context_note = ""
        if regression.significant and all(comparison.request_counts[s] for s in SIDES):
            localisation = context.get("localisation")
        corroborated = _corroborated(regression, estimates, findings)
        if corroborated is not None:
            regression = corroborated
        elif not regression.significant and (provisional := _provisional(estimates)) is not None:
            # The rules again, asked to explain the latency that rose most. It becomes the headline
            # when a mechanism of its own carries it (_by_mechanism); else "no regression" stands,
            # and what would explain that latency's rise, were it real, is listed after it: an
            # on-call engineer whose users still report slowness starts there.
            tried = _context(comparison, provisional, estimates)
            run = run_rules(loaded, tried)
            findings, run_failures, skip_notes = run[0], run[1], run[2]
            timings = {k: v + run[3].get(k, 0.0) for k, v in timings.items()}
            adopted = _by_mechanism(provisional, findings, versions_side_by_side=comparison.windows_overlap)
            if adopted is not None:
                regression, context = adopted, tried
                if all(comparison.request_counts[s] for s in SIDES):
                    localisation = context.get("localisation")
            elif findings:
                label = f"{provisional.metric} p{round(provisional.quantile * 100)}"
                context_note = (
                    f"the findings after 'none' explain {label} x{provisional.ratio:.2f}, "
                    "the user-facing quantile that rose most, within its noise"
                )
        pair = comparison.windows_overlap
        regression = _moved_with_the_mix(regression, findings, order, versions_side_by_side=pair)
        ranked = _rank(findings, regression, order, localisation, versions_side_by_side=pair)
        notes = [*comparison.notes, *comparison.quality_notes(), *skip_notes]
        if comparison.sampled:
            notes.append(
                f"mix and slice analysis on a sample of {comparison.requests.height} requests; "
                "e2e quantiles use every row"
            )
        if regression.note:
            notes.append(regression.note)
        if context_note and not regression.significant:
            notes.append(context_note)
        if regression.significant and not findings:
            notes.extend(_unexplained(context, regression))
        return Report(
            selection=selection,
            baseline=comparison.window("baseline").describe(selection),
            candidate=comparison.window("candidate").describe(selection),
            regression=regression,
            estimates=estimates,
            findings=ranked,
            notes=notes,
            errors=[f"{f.name}: {f.error}" for f in (*failures, *run_failures)],
            timings={"total_s": time.perf_counter() - started, **{f"rule.{k}": v for k, v in timings.items()}},
        )
    finally:
        if comparison is not None:
            comparison.cancel_prefetch()
        if owned:
            con.close()
