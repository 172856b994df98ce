"""What a diagnosis rule is, what it receives and what it returns.

How to write a rule
-------------------
A rule is **one module in** ``rules/`` **with one function named like the
module** (``rules/prefix_cache.py`` defines ``prefix_cache``). It is pure: it
reads the comparison and returns findings; it never opens files, sockets or
the store itself. Register it in ``pyproject.toml``::

    [project.entry-points."sre_agent.rules"]
    prefix_cache = "sre_agent.rules.prefix_cache:prefix_cache"

then ``pip install -e .`` so the entry point is visible (``sre-agent rules``
lists it). Third-party packages register the same way.

The runner passes a rule **only the context it asks for, by parameter name**
(see :data:`CONTEXT_NAMES`)::

    def prefix_cache(requests: pl.LazyFrame, metrics: MetricView, regression: Regression) -> list[Finding]:
        ...

A parameter with a name outside :data:`CONTEXT_NAMES` makes the rule fail to
run; the failure is reported in the report's ``errors`` and the other rules
still run. A rule returns a :class:`Finding`, an iterable of findings, or
``None`` (nothing to say). Raise :class:`RuleSkipped` when the data a rule
needs is absent (spans only, metrics only); the reason is shown as a note.

Scoring. ``explained`` is the share (0..1) of the regression the mechanism
accounts for, measured in the rule's own terms (for example the part of the
candidate's p99 excess that the queue explains, or the part of the p99
change the mix-reweighted baseline reproduces). ``confidence`` (0..1) says how
sure the rule is that the mechanism moved at all (sample sizes, CIs). The
runner ranks by ``score = explained * confidence``. Report *causes* from the
closed vocabulary :data:`CAUSES`; latency itself is a symptom and is never a
cause. Put the slice in ``scope`` (attribute names exactly as received, e.g.
``{"host.name": "gpu-7"}``) when the mechanism is confined to one slice.

Minimal example (``rules/stages.py`` is a complete one)::

    from sre_agent.analysis.rules_api import Evidence, Finding, Regression

    def load(requests_per_second: SidePair, regression: Regression) -> Finding | None:
        if requests_per_second.ratio < 1.2:
            return None
        return Finding(cause="load", title="Arrival rate rose 40 %", explained=0.6, confidence=0.9,
                       stage="queue", evidence=(Evidence("arrival_rate_rps", 10.0, 14.0),),
                       next_check="compare offered load per replica with the autoscaler target")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover - typing only
    pass

__all__ = [
    "CAUSES",
    "CONTEXT_NAMES",
    "SHARE_HEADLINES",
    "Evidence",
    "Finding",
    "MetricEstimate",
    "Regression",
    "Rule",
    "RuleResult",
    "RuleSkipped",
    "SIDES",
    "STAGES",
    "Side",
    "SidePair",
    "run_late",
]

#: The closed cause vocabulary of CONTRACTS section 3 (order = display order).
CAUSES: Final[tuple[str, ...]] = (
    "prefix_cache",
    "batch_composition",
    "kv_pressure",
    "capacity",
    "load",
    "traffic_mix",
    "dependency",
    "decode_slowdown",
    "prefill_slowdown",
    "retry_amplification",
    "errors",
    "none",
)

#: Stages a finding may name (``None`` = not stage-specific).
STAGES: Final[tuple[str, ...]] = ("queue", "prefill", "decode", "gateway", "dependency")

#: Context a rule may ask for by parameter name, and what each holds.
CONTEXT_NAMES: Final[dict[str, str]] = {
    "comparison": "the sre_agent.analysis.compare.Comparison (everything below is derived from it)",
    "regression": "Regression: the headline metric that regressed (or did not)",
    "estimates": "list[MetricEstimate]: every metric x quantile with CIs and significance",
    "requests": "polars.LazyFrame: sampled engine requests of both sides, column `side` = baseline|candidate",
    "baseline": "polars.LazyFrame: the baseline rows of `requests`",
    "candidate": "polars.LazyFrame: the candidate rows of `requests`",
    "dimensions": "list[str]: low-cardinality attribute columns of `requests` (names as received)",
    "metrics": "sre_agent.analysis.compare.MetricView: metric-stream signals per side "
    "(gauges, counter deltas, histograms)",
    "spans": "polars.DataFrame: non-engine span groups per side (service, name, kind, count, p50_s, p99_s)",
    "traces": "polars.LazyFrame: per sampled request: trace_s, gateway_s, dependency_s, attempts (may be empty)",
    "windows": "dict side -> (start_ns, end_ns, seconds, requests)",
    "arrival_rate": "SidePair: engine requests per second in each window (full data, not sampled)",
    "stages": "sre_agent.analysis.decompose.StageDecomposition: tail excess per stage and each stage's share",
    "localisation": "sre_agent.analysis.localise.Localisation: slices scored by their share of the "
    "excess slow requests",
}


class RuleSkipped(Exception):
    """Raised by a rule when the data it needs is absent; the message is shown as a note."""


#: The two populations of a comparison, in the order every per-side loop and frame uses.
Side = Literal["baseline", "candidate"]
SIDES: Final[tuple[Side, Side]] = ("baseline", "candidate")


@dataclass(frozen=True)
class SidePair:
    """One number measured on both sides. ``None`` means not measurable there."""

    baseline: float | None
    candidate: float | None

    @property
    def delta(self) -> float | None:
        """candidate - baseline, or ``None`` when either side is missing."""
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate - self.baseline

    @property
    def ratio(self) -> float | None:
        """candidate / baseline, or ``None`` when missing or the baseline is 0."""
        if self.baseline is None or self.candidate is None or self.baseline == 0:
            return None
        return self.candidate / self.baseline


@dataclass(frozen=True)
class MetricEstimate:
    """A latency quantile on both sides with a CI of the ratio over time blocks (:func:`stats.compare_quantile`).

    Attributes:
        name: ``ttft``, ``tpot``, ``itl``, ``e2e``, ``queue``, ``prefill``, ``decode``.
        quantile: 0.5, 0.9 or 0.99.
        baseline / candidate: the quantile in seconds (``None`` = no data on that side).
        ci: 95 % CI of candidate - baseline in seconds (``None`` = too few samples).
        ratio_ci: 95 % CI of candidate / baseline.
        significant: the CI excludes 0 *and* the change is practically relevant.
        source: ``spans`` (exact per-request) or ``metrics`` (OTLP histogram).
        by_tail_share: significant by the share of requests beyond the baseline's quantile,
            not by the quantile's own CI (``headline._tail_exceeded``).
    """

    name: str
    quantile: float
    baseline: float | None
    candidate: float | None
    ci: tuple[float, float] | None = None
    ratio_ci: tuple[float, float] | None = None
    significant: bool = False
    source: str = "spans"
    by_tail_share: bool = False

    @property
    def ratio(self) -> float | None:
        """candidate / baseline (``None`` when either is missing or the baseline is 0)."""
        return SidePair(self.baseline, self.candidate).ratio


#: Headlines that are shares of logical requests, not latencies: failed (``error_rate``) and retried
#: (``retried_share``, retries that may hide the failures). No quantile, no stage decomposition.
SHARE_HEADLINES: Final[tuple[str, ...]] = ("error_rate", "retried_share")


@dataclass(frozen=True)
class Regression:
    """The headline: the metric whose regression the findings explain.

    ``significant`` False means nothing regressed (the first finding is then
    ``none``). ``location_p`` is the Mann-Whitney p-value and
    ``hodges_lehmann_s`` the HL shift on the same metric; ``tail_p`` the tail
    test's p-value (exceedances of the baseline quantile). ``switched_from``
    is the quantile the headline would have been (0.99) when it is reported at
    a lower one, and ``switch_reason`` says why (too few requests beyond p99,
    or p99 did not move significantly).
    """

    metric: str
    quantile: float
    baseline: float | None
    candidate: float | None
    ci: tuple[float, float] | None
    significant: bool
    location_p: float | None = None
    hodges_lehmann_s: float | None = None
    tail_p: float | None = None
    note: str = ""
    switched_from: float | None = None
    switch_reason: str = ""

    @property
    def ratio(self) -> float | None:
        """candidate / baseline."""
        return SidePair(self.baseline, self.candidate).ratio

    @property
    def excess(self) -> float | None:
        """candidate - baseline in seconds."""
        return SidePair(self.baseline, self.candidate).delta


@dataclass(frozen=True)
class Evidence:
    """One signal behind a finding: its value on each side and what it means."""

    signal: str
    baseline: Any
    candidate: Any
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The CONTRACTS section 3 evidence object."""
        return {"signal": self.signal, "baseline": self.baseline, "candidate": self.candidate, "detail": self.detail}


@dataclass(frozen=True)
class Finding:
    """One ranked explanation of the regression.

    Attributes:
        cause: one of :data:`CAUSES`.
        title: one line for people ("Prefix-cache hit rate fell 0.82 -> 0.01").
        explained: share of the regression this mechanism accounts for, 0..1.
        confidence: how sure the rule is that the mechanism moved, 0..1.
        stage: one of :data:`STAGES`, or ``None``.
        scope: the slice the finding is confined to (empty = everywhere).
        evidence: the signals, baseline vs candidate.
        next_check: the concrete check that would confirm it.
        rule: name of the rule that produced it (set by the runner).
    """

    cause: str
    title: str
    explained: float
    confidence: float
    stage: str | None = None
    scope: Mapping[str, str] = field(default_factory=dict)
    evidence: tuple[Evidence, ...] = ()
    next_check: str = ""
    rule: str = ""

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"cause {self.cause!r} is not in the closed vocabulary {CAUSES}")
        if self.stage is not None and self.stage not in STAGES:
            raise ValueError(f"stage {self.stage!r} is not one of {STAGES}")

    @property
    def score(self) -> float:
        """Ranking key: explained share (clipped to 0..1) tempered by confidence."""
        return max(0.0, min(1.0, self.explained)) * max(0.0, min(1.0, self.confidence))

    def with_rule(self, rule: str) -> Finding:
        """A copy attributed to ``rule``."""
        return replace(self, rule=rule)


RuleResult = Finding | Iterable[Finding] | None


_R = TypeVar("_R", bound=Callable[..., Any])


def run_late(rule: _R) -> _R:
    """Mark ``rule`` to run after the unmarked rules; the ranking does not depend on the order.

    For rules that wait on work the diagnosis starts in the background (the
    engine rules wait on :attr:`~sre_agent.analysis.compare.Comparison.busy_intervals`):
    the other rules' Python work then overlaps that work instead of waiting
    behind it.
    """
    setattr(rule, "runs_late", True)  # noqa: B010 - a function attribute the runner reads with getattr
    return rule


class Rule(Protocol):
    """A rule: a function whose parameters are names from :data:`CONTEXT_NAMES`.

    The runner calls it with keyword arguments only, each looked up by
    parameter name, so a rule asks for exactly what it uses.
    """

    __name__: str

    def __call__(self, **context: Any) -> RuleResult:  # pragma: no cover - protocol
        ...
