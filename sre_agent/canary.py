"""The canary gate: SLO specs, the verdict, its score and its renderings.

A gate run compares a candidate (canary) with a baseline, exactly as
``sre-agent diagnose`` does (:mod:`sre_agent.compare`), and checks:

* **absolute SLOs** (``--slo``): ``ttft_p99=2s``, ``itl_p99=80ms``,
  ``tpot_p50=30ms``, ``e2e_p99=20s``, ``queue_p99=500ms`` (any ``pNN``,
  ``pNN.N`` or ``p999``), ``error_rate=1%`` (failed share at most),
  ``goodput=0.95`` (share of requests that did not fail and met every latency
  SLO given, at least);
* **relative checks** (``--max-regression ttft_p99=15%``): the candidate's
  quantile may exceed the baseline's by at most that much.

Every check uses an any-time-valid confidence sequence
(:mod:`sre_agent.sequential`), so a controller may poll as often as it likes.
A check **fails** only when its whole interval lies beyond the threshold,
**passes** only when it lies entirely within, and is otherwise
**inconclusive**; it is **nodata** when the metric is absent. The family
error ``alpha`` (default 0.05) is split evenly over the checks (Bonferroni),
and a relative check splits its share over its two sides, so the chance
that a polled gate *ever* fails a candidate that meets all its SLOs (or
ever passes one that misses one) stays at most ``alpha``.

Overall verdict (checks with fewer than ``min_samples`` values are
inconclusive, never pass):

* ``fail`` if any check fails;
* else ``inconclusive`` if no check had data, or half or more had none
  (Kayenta's rule);
* else ``pass`` if every check with data passed;
* else ``inconclusive``.

Score (0-100): 0 on ``fail`` and when half or more of the checks have no
data; otherwise ``100 * (passes + 0.5 * inconclusives) / checks with data``.
So ``pass`` scores 100 and ``inconclusive`` scores 50 to 99.

With ``dry_run`` the reported verdict is always ``pass`` (score 100) while
``real_verdict`` and the first reason carry the verdict the gate reached.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal

from sre_agent.errors import UsageError
from sre_agent.sequential import point_rank, quantile_cs_ranks

if TYPE_CHECKING:
    import duckdb

    from sre_agent.selection import Selection

__all__ = [
    "LATENCY_METRICS",
    "SCHEMA",
    "CanarySpec",
    "CheckResult",
    "QuantileEstimate",
    "QuantileNeed",
    "RegressionSpec",
    "SideStats",
    "SloSpec",
    "Verdict",
    "evaluate",
    "judge",
    "parse_max_regression",
    "parse_slo",
    "quantile_estimate",
    "render",
]

log = logging.getLogger(__name__)

SCHEMA: Final[str] = "sre-agent/canary/v1"
#: Latency names accepted in SLOs -> what they measure.
LATENCY_METRICS: Final[dict[str, str]] = {
    "ttft": "time to first token",
    "itl": "inter-token latency (vLLM histogram, else per-request TPOT)",
    "tpot": "time per output token (per request)",
    "e2e": "end-to-end request latency",
    "queue": "time waiting in the engine queue",
}
DEFAULT_MIN_SAMPLES: Final[int] = 50
DEFAULT_ALPHA: Final[float] = 0.05

Status = Literal["pass", "fail", "inconclusive", "nodata"]
_NAME_RE = re.compile(r"^(ttft|itl|tpot|e2e|queue)_p(\d+(?:\.\d+)?)$")
_DURATION_RE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s|m|min)?$")
_DURATION_UNITS: Final[dict[str, float]] = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0}


# ----------------------------------------------------------------- specs
@dataclass(frozen=True)
class SloSpec:
    """One absolute SLO.

    Attributes:
        name: canonical name, e.g. ``ttft_p99``, ``error_rate``, ``goodput``.
        kind: ``quantile``, ``error_rate`` (at most) or ``goodput`` (at least).
        threshold: seconds for quantiles, a fraction in [0, 1] for the rates.
        metric / quantile: for quantile SLOs (``ttft``, 0.99); ``None`` otherwise.
    """

    name: str
    kind: Literal["quantile", "error_rate", "goodput"]
    threshold: float
    metric: str | None = None
    quantile: float | None = None


@dataclass(frozen=True)
class RegressionSpec:
    """A relative check: candidate quantile <= (1 + max_increase) x baseline quantile."""

    name: str
    metric: str
    quantile: float
    max_increase: float


def _quantile_name(name: str) -> tuple[str, float]:
    m = _NAME_RE.match(name)
    if not m:
        raise UsageError(
            f"unknown SLO {name!r}: use METRIC_pNN with METRIC one of {', '.join(LATENCY_METRICS)} "
            "(e.g. ttft_p99, itl_p95, tpot_p50, e2e_p99.9), error_rate or goodput"
        )
    digits = m.group(2)
    # p99 -> 0.99, p999 -> 0.999, p99.9 -> 0.999, p50 -> 0.5
    level = float(digits) / 100 if "." in digits or len(digits) <= 2 else float("0." + digits)
    if not 0 < level < 1:
        raise UsageError(f"SLO {name!r}: the quantile must be between p0 and p100")
    return m.group(1), level


def _split(text: str, flag: str) -> tuple[str, str]:
    if "=" not in text:
        raise UsageError(f"{flag} {text!r}: use NAME=VALUE")
    name, value = (part.strip() for part in text.split("=", 1))
    if not name or not value:
        raise UsageError(f"{flag} {text!r}: use NAME=VALUE")
    return name.lower(), value


def _fraction(text: str, what: str) -> float:
    """``1%`` -> 0.01, ``0.95`` -> 0.95."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"{what}: cannot read {text!r} as a fraction (use 1% or 0.01)") from None
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise UsageError(f"{what}: {text!r} is not between 0 and 1 (0% and 100%)")
    return value


def _duration_s(text: str, what: str) -> float:
    """``2s`` -> 2.0, ``80ms`` -> 0.08, a bare number is seconds."""
    m = _DURATION_RE.match(text.strip())
    if not m:
        raise UsageError(f"{what}: cannot read {text!r} as a duration (use e.g. 2s, 80ms, 1.5)")
    value = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
    if value <= 0:
        raise UsageError(f"{what}: the threshold must be positive")
    return value


def parse_slo(text: str) -> SloSpec:
    """Parse ``--slo NAME=VALUE``; raises :class:`UsageError` with a hint on bad input.

    >>> parse_slo("itl_p99=80ms")
    SloSpec(name='itl_p99', kind='quantile', threshold=0.08, metric='itl', quantile=0.99)
    >>> parse_slo("error_rate=1%").threshold
    0.01
    """
    name, value = _split(text, "--slo")
    if name == "error_rate":
        return SloSpec(name, "error_rate", _fraction(value, f"--slo {name}"))
    if name == "goodput":
        return SloSpec(name, "goodput", _fraction(value, f"--slo {name}"))
    metric, level = _quantile_name(name)
    return SloSpec(name, "quantile", _duration_s(value, f"--slo {name}"), metric, level)


def parse_max_regression(text: str) -> RegressionSpec:
    """Parse ``--max-regression NAME=PCT`` (``ttft_p99=15%`` or ``ttft_p99=0.15``)."""
    name, value = _split(text, "--max-regression")
    metric, level = _quantile_name(name)
    try:
        increase = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise UsageError(f"--max-regression {name}: cannot read {value!r} (use 15% or 0.15)") from None
    if not increase >= 0 or math.isinf(increase):
        raise UsageError(f"--max-regression {name}: {value!r} must be a non-negative percentage")
    return RegressionSpec(name, metric, level, increase)


@dataclass(frozen=True)
class QuantileNeed:
    """One confidence sequence a check needs: ``metric`` at ``quantile`` on ``side`` at level ``alpha``."""

    key: str
    side: Literal["baseline", "candidate"]
    metric: str
    quantile: float
    alpha: float


@dataclass(frozen=True)
class CanarySpec:
    """What the gate checks, and how strictly.

    Attributes:
        slos: absolute SLOs.
        regressions: relative checks against the baseline.
        min_samples: fewest values per side a check needs before it may pass or fail.
        alpha: family error level over all checks and all polls.
        dry_run: report ``pass`` whatever the real verdict.
        findings: how many diagnosis findings to attach (0 = do not diagnose).
    """

    slos: tuple[SloSpec, ...] = ()
    regressions: tuple[RegressionSpec, ...] = ()
    min_samples: int = DEFAULT_MIN_SAMPLES
    alpha: float = DEFAULT_ALPHA
    dry_run: bool = False
    findings: int = 3

    def __post_init__(self) -> None:
        if not self.slos and not self.regressions:
            raise UsageError("give at least one --slo NAME=VALUE or --max-regression NAME=PCT")
        if self.min_samples < 1:
            raise UsageError("--min-samples must be at least 1")
        if not 0 < self.alpha < 1:
            raise UsageError("alpha must be between 0 and 1")
        names = [s.name for s in self.slos] + [f"{r.name} regression" for r in self.regressions]
        if len(set(names)) != len(names):
            raise UsageError(f"an SLO is given twice: {', '.join(sorted(names))}")

    @classmethod
    def from_strings(
        cls,
        slos: Iterable[str] = (),
        max_regressions: Iterable[str] = (),
        **options: Any,
    ) -> CanarySpec:
        """Build from ``--slo``/``--max-regression`` strings (each may hold several, comma-separated)."""

        def items(values: Iterable[str]) -> list[str]:
            return [part.strip() for value in values for part in value.split(",") if part.strip()]

        return cls(
            slos=tuple(parse_slo(s) for s in items(slos)),
            regressions=tuple(parse_max_regression(r) for r in items(max_regressions)),
            **options,
        )

    @property
    def check_alpha(self) -> float:
        """Error level of each check (Bonferroni over all checks)."""
        return self.alpha / (len(self.slos) + len(self.regressions))

    @property
    def latency_slos(self) -> tuple[SloSpec, ...]:
        """The absolute quantile SLOs (they define a request's goodness for ``goodput``)."""
        return tuple(s for s in self.slos if s.kind == "quantile")

    def quantile_needs(self) -> list[QuantileNeed]:
        """Every confidence sequence the checks need, keyed by check."""
        a = self.check_alpha
        needs: list[QuantileNeed] = []
        for s in self.latency_slos:
            assert s.metric is not None
            assert s.quantile is not None
            needs.append(QuantileNeed(f"slo:{s.name}", "baseline", s.metric, s.quantile, a))
            needs.append(QuantileNeed(f"slo:{s.name}", "candidate", s.metric, s.quantile, a))
        for r in self.regressions:
            for side in ("baseline", "candidate"):
                needs.append(QuantileNeed(f"reg:{r.name}", side, r.metric, r.quantile, a / 2))  # type: ignore[arg-type]
        return needs


# ------------------------------------------------------------------ data
@dataclass(frozen=True)
class QuantileEstimate:
    """A quantile of one side with its confidence sequence.

    Attributes:
        n: values it rests on (requests, or observations for histograms).
        estimate: the empirical quantile (``None`` when ``n == 0``).
        lo / hi: the confidence-sequence bounds; ``0`` and ``inf`` when
            there are too few values to bound that side.
        source: ``spans`` or the histogram metric it came from.
    """

    n: int
    estimate: float | None
    lo: float
    hi: float
    source: str = "spans"


def quantile_estimate(sorted_values: Sequence[float], p: float, alpha: float) -> QuantileEstimate:
    """The estimate and confidence sequence of the p-quantile from ascending values (pure)."""
    n = len(sorted_values)
    if n == 0:
        return QuantileEstimate(0, None, 0.0, math.inf)
    lower, upper = quantile_cs_ranks(n, p, alpha)
    return QuantileEstimate(
        n,
        float(sorted_values[point_rank(n, p) - 1]),
        float(sorted_values[lower - 1]) if lower is not None else 0.0,
        float(sorted_values[upper - 1]) if upper is not None else math.inf,
    )


@dataclass(frozen=True)
class SideStats:
    """What the judge needs from one side.

    Attributes:
        requests: engine requests in the population.
        errors: requests that failed (span status error or an error type).
        good: requests that did not fail and met every latency SLO (``None``
            when no latency SLO was given).
        quantiles: check key (see :meth:`CanarySpec.quantile_needs`) -> estimate.
        window: the side's description for the report (start, end, filter).
    """

    requests: int
    errors: int = 0
    good: int | None = None
    quantiles: Mapping[str, QuantileEstimate] = field(default_factory=dict)
    window: Mapping[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------- verdict
@dataclass(frozen=True)
class CheckResult:
    """One row of the verdict's ``slos`` list (CONTRACTS section 4, plus ``kind``, ``reason`` and counts)."""

    name: str
    kind: Literal["absolute", "relative"]
    threshold: float
    baseline: float | None
    candidate: float | None
    ci: tuple[float, float] | None
    status: Status
    reason: str
    n_baseline: int
    n_candidate: int
    unit: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form; infinite bounds become ``null``."""
        return {
            "name": self.name,
            "kind": self.kind,
            "threshold": self.threshold,
            "baseline": _finite(self.baseline),
            "candidate": _finite(self.candidate),
            "ci": None if self.ci is None else [_finite(self.ci[0]), _finite(self.ci[1])],
            "status": self.status,
            "reason": self.reason,
            "n_baseline": self.n_baseline,
            "n_candidate": self.n_candidate,
            "unit": self.unit,
        }


@dataclass(frozen=True)
class Verdict:
    """The gate's answer (CONTRACTS section 4)."""

    verdict: Literal["pass", "fail", "inconclusive"]
    score: int
    slos: tuple[CheckResult, ...]
    reasons: tuple[str, ...]
    dry_run: bool = False
    real_verdict: Literal["pass", "fail", "inconclusive"] | None = None
    findings: tuple[dict[str, Any], ...] = ()
    baseline: Mapping[str, Any] = field(default_factory=dict)
    candidate: Mapping[str, Any] = field(default_factory=dict)
    alpha: float = DEFAULT_ALPHA
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``sre-agent/canary/v1`` JSON document."""
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "score": self.score,
            "dry_run": self.dry_run,
            "real_verdict": self.real_verdict or self.verdict,
            "slos": [c.to_dict() for c in self.slos],
            "reasons": list(self.reasons),
            "findings": list(self.findings),
            "baseline": dict(self.baseline),
            "candidate": dict(self.candidate),
            "method": {
                "alpha": self.alpha,
                "confidence": "any-time-valid beta-binomial mixture confidence sequences (sre_agent.sequential)",
            },
            "notes": list(self.notes),
        }

    @property
    def exit_code(self) -> int:
        """CLI exit code: 0 pass, 1 fail, 3 inconclusive."""
        return {"pass": 0, "fail": 1, "inconclusive": 3}[self.verdict]


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) or math.isnan(x) else x


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "∞"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.3g} s"
    if unit == "ratio":
        return f"{value:.3g}x"
    return f"{value * 100:.2f}%"


def _decide(lo: float, hi: float, limit: float, upper_is_bad: bool) -> Status:
    """pass/fail/inconclusive for an interval against a limit."""
    if upper_is_bad:
        return "fail" if lo > limit else "pass" if hi <= limit else "inconclusive"
    return "fail" if hi < limit else "pass" if lo >= limit else "inconclusive"


def _few(name: str, n: int, side: str, spec: CanarySpec) -> str:
    return f"{name}: {side} has {n} values, fewer than the minimum {spec.min_samples}; no decision yet"


def _absolute_quantile(s: SloSpec, base: SideStats, cand: SideStats, spec: CanarySpec) -> CheckResult:
    key = f"slo:{s.name}"
    b = base.quantiles.get(key)
    c = cand.quantiles.get(key)
    row = {"name": s.name, "kind": "absolute", "threshold": s.threshold, "unit": "s"}
    n_b = b.n if b else 0
    b_est = b.estimate if b else None
    if c is None or c.n == 0:
        reason = f"{s.name}: no {s.metric} data for the candidate"
        return CheckResult(**row, baseline=b_est, candidate=None, ci=None, status="nodata",  # type: ignore[arg-type]
                           reason=reason, n_baseline=n_b, n_candidate=0)  # fmt: skip
    ci = (c.lo, c.hi)
    if c.n < spec.min_samples:
        status: Status = "inconclusive"
        reason = _few(s.name, c.n, "candidate", spec)
    else:
        status = _decide(c.lo, c.hi, s.threshold, upper_is_bad=True)
        where = {"fail": "above", "pass": "within", "inconclusive": "straddles"}[status]
        reason = (
            f"{s.name}: candidate {_fmt(c.estimate, 's')} (CI {_fmt(c.lo, 's')}–{_fmt(c.hi, 's')}, "
            f"n={c.n}) is {where} the SLO {_fmt(s.threshold, 's')}"
        )
        if status == "inconclusive":
            reason = f"{s.name}: CI {_fmt(c.lo, 's')}–{_fmt(c.hi, 's')} straddles the SLO {_fmt(s.threshold, 's')}"
    if c.source != "spans":
        reason += f" [from {c.source}]"
    return CheckResult(**row, baseline=b_est, candidate=c.estimate, ci=ci, status=status,  # type: ignore[arg-type]
                       reason=reason, n_baseline=n_b, n_candidate=c.n)  # fmt: skip


def _rate(s: SloSpec, base: SideStats, cand: SideStats, spec: CanarySpec) -> CheckResult:
    from sre_agent.sequential import proportion_cs

    is_error = s.kind == "error_rate"
    row = {"name": s.name, "kind": "absolute", "threshold": s.threshold, "unit": "fraction"}

    def share(side: SideStats) -> tuple[int, int] | None:
        if side.requests == 0:
            return None
        if is_error:
            return side.errors, side.requests
        return None if side.good is None else (side.good, side.requests)

    b, c = share(base), share(cand)
    b_rate = b[0] / b[1] if b else None
    if c is None:
        why = "no candidate requests" if cand.requests == 0 else "goodput needs at least one latency SLO"
        return CheckResult(**row, baseline=b_rate, candidate=None, ci=None, status="nodata",  # type: ignore[arg-type]
                           reason=f"{s.name}: {why}", n_baseline=base.requests, n_candidate=cand.requests)  # fmt: skip
    hits, n = c
    lo, hi = proportion_cs(hits, n, spec.check_alpha, prior_mean=s.threshold)
    if n < spec.min_samples:
        status: Status = "inconclusive"
        reason = _few(s.name, n, "candidate", spec)
    else:
        status = _decide(lo, hi, s.threshold, upper_is_bad=is_error)
        word = {"fail": "misses", "pass": "meets", "inconclusive": "cannot yet be told from"}[status]
        bound = "at most" if is_error else "at least"
        reason = (
            f"{s.name}: candidate {_fmt(hits / n, '')} (CI {_fmt(lo, '')}–{_fmt(hi, '')}, {hits}/{n}) "
            f"{word} the SLO {bound} {_fmt(s.threshold, '')}"
        )
    return CheckResult(**row, baseline=b_rate, candidate=hits / n, ci=(lo, hi), status=status,  # type: ignore[arg-type]
                       reason=reason, n_baseline=base.requests, n_candidate=n)  # fmt: skip


def _relative(r: RegressionSpec, base: SideStats, cand: SideStats, spec: CanarySpec) -> CheckResult:
    key = f"reg:{r.name}"
    b, c = base.quantiles.get(key), cand.quantiles.get(key)
    limit = 1.0 + r.max_increase
    row = {"name": f"{r.name} regression", "kind": "relative", "threshold": r.max_increase, "unit": "ratio"}
    n_b, n_c = (b.n if b else 0), (c.n if c else 0)
    b_est, c_est = (b.estimate if b else None), (c.estimate if c else None)
    if b is None or c is None or n_b == 0 or n_c == 0:
        side = "baseline" if not n_b else "candidate"
        return CheckResult(**row, baseline=b_est, candidate=c_est, ci=None, status="nodata",  # type: ignore[arg-type]
                           reason=f"{r.name}: no {r.metric} data for the {side}", n_baseline=n_b,
                           n_candidate=n_c)  # fmt: skip
    # Both sides' uncertainty: the ratio lies in [c.lo / b.hi, c.hi / b.lo] whenever both CSs cover.
    ratio_lo = c.lo / b.hi if b.hi > 0 and not math.isinf(b.hi) else 0.0
    ratio_hi = c.hi / b.lo if b.lo > 0 else math.inf
    ci = (ratio_lo, ratio_hi)
    if min(n_b, n_c) < spec.min_samples:
        status: Status = "inconclusive"
        reason = _few(r.name, min(n_b, n_c), "baseline" if n_b < n_c else "candidate", spec)
    else:
        status = _decide(ratio_lo, ratio_hi, limit, upper_is_bad=True)
        ratio = (c_est / b_est) if c_est is not None and b_est else None
        word = {"fail": "more than", "pass": "within", "inconclusive": "not yet distinguishable from"}[status]
        reason = (
            f"{r.name}: candidate/baseline {_fmt(ratio, 'ratio')} (CI {_fmt(ratio_lo, 'ratio')}–"
            f"{_fmt(ratio_hi, 'ratio')}; {_fmt(c_est, 's')} vs {_fmt(b_est, 's')}) is {word} "
            f"the allowed +{r.max_increase * 100:.0f}%"
        )
    return CheckResult(**row, baseline=b_est, candidate=c_est, ci=ci, status=status,  # type: ignore[arg-type]
                       reason=reason, n_baseline=n_b, n_candidate=n_c)  # fmt: skip


def judge(spec: CanarySpec, baseline: SideStats, candidate: SideStats) -> Verdict:
    """The verdict from both sides' summaries (pure; see the module docstring for the rules)."""
    checks: list[CheckResult] = []
    for s in spec.slos:
        checks.append(
            _absolute_quantile(s, baseline, candidate, spec)
            if s.kind == "quantile"
            else _rate(s, baseline, candidate, spec)
        )
    checks.extend(_relative(r, baseline, candidate, spec) for r in spec.regressions)

    counts = {st: sum(1 for c in checks if c.status == st) for st in ("pass", "fail", "inconclusive", "nodata")}
    with_data = len(checks) - counts["nodata"]
    reasons: list[str] = []
    if candidate.requests < spec.min_samples:
        reasons.append(
            f"the candidate has {candidate.requests} requests, fewer than the minimum {spec.min_samples}: "
            "inconclusive until more traffic arrives"
        )
    verdict: Literal["pass", "fail", "inconclusive"]
    mostly_missing = counts["nodata"] * 2 >= len(checks)
    if counts["fail"]:
        verdict = "fail"
        reasons.extend(c.reason for c in checks if c.status == "fail")
    elif with_data == 0 or mostly_missing:
        verdict = "inconclusive"
        reasons.append(f"{counts['nodata']} of {len(checks)} checks have no data; cannot judge")
        reasons.extend(c.reason for c in checks if c.status == "nodata")
    elif counts["pass"] == with_data:
        verdict = "pass"
        reasons.append(f"all {with_data} checks with data pass")
        reasons.extend(c.reason for c in checks if c.status == "nodata")
    else:
        verdict = "inconclusive"
        reasons.extend(c.reason for c in checks if c.status in ("inconclusive", "nodata"))
    if verdict == "fail" or mostly_missing or with_data == 0:
        score = 0
    else:
        score = round(100 * (counts["pass"] + 0.5 * counts["inconclusive"]) / with_data)
    result = Verdict(
        verdict=verdict,
        score=score,
        slos=tuple(checks),
        reasons=tuple(dict.fromkeys(reasons)),  # keep order, drop repeats
        baseline=dict(baseline.window, requests=baseline.requests),
        candidate=dict(candidate.window, requests=candidate.requests),
        alpha=spec.alpha,
    )
    return apply_dry_run(result) if spec.dry_run else result


def apply_dry_run(result: Verdict) -> Verdict:
    """Report ``pass`` while keeping (and logging) the real verdict."""
    log.warning("canary dry run: real verdict %s (score %d); reporting pass", result.verdict, result.score)
    return replace(
        result,
        verdict="pass",
        score=100,
        dry_run=True,
        real_verdict=result.verdict,
        reasons=(f"dry run: the real verdict is {result.verdict} (score {result.score})", *result.reasons),
    )


# ------------------------------------------------------------ evaluation
def evaluate(con: duckdb.DuckDBPyConnection, selection: Selection, spec: CanarySpec) -> Verdict:
    """Run the gate against a store connection (tables per :mod:`sre_agent.schema`).

    Raises:
        SelectionError: the selection cannot be resolved (no such version, no deploy).
        StoreError: the store cannot be read.
    """
    from sre_agent._canary_store import gather, top_findings

    baseline, candidate, notes, comparison = gather(con, selection, spec)
    result = judge(replace(spec, dry_run=False), baseline, candidate)
    findings: tuple[dict[str, Any], ...] = ()
    if spec.findings > 0 and result.verdict != "pass" and candidate.requests > 0 and baseline.requests > 0:
        findings = tuple(top_findings(comparison, spec.findings, notes))
    result = replace(result, findings=findings, notes=tuple(notes))
    return apply_dry_run(result) if spec.dry_run else result


# ------------------------------------------------------------- rendering
def render(result: Verdict, fmt: str = "text") -> str:
    """The verdict as ``text``, ``markdown`` or ``json``."""
    if fmt == "json":
        import json

        return json.dumps(result.to_dict(), indent=2)
    md = fmt == "markdown"
    head = f"canary verdict: {result.verdict.upper()} (score {result.score})"
    if result.dry_run:
        head += f" [dry run; real verdict {result.real_verdict}]"
    lines = [f"## {head}" if md else head, ""]
    b, c = result.baseline, result.candidate
    lines.append(
        f"baseline:  {b.get('requests', 0)} requests {b.get('start', '')}..{b.get('end', '')} {b.get('filter', '')}"
    )
    lines.append(
        f"candidate: {c.get('requests', 0)} requests {c.get('start', '')}..{c.get('end', '')} {c.get('filter', '')}"
    )
    lines.append("")
    if md:
        lines += ["| check | status | threshold | baseline | candidate | CI |", "|---|---|---|---|---|---|"]
    for chk in result.slos:
        thr = f"+{chk.threshold * 100:.0f}%" if chk.kind == "relative" else _fmt(chk.threshold, chk.unit)
        unit = "s" if chk.kind == "relative" else chk.unit
        ci_unit = chk.unit
        ci = "n/a" if chk.ci is None else f"{_fmt(chk.ci[0], ci_unit)}–{_fmt(chk.ci[1], ci_unit)}"
        cells = [chk.name, chk.status, thr, _fmt(chk.baseline, unit), _fmt(chk.candidate, unit), ci]
        lines.append(
            "| " + " | ".join(cells) + " |" if md else "  {:<24} {:<13} {:>10} {:>10} {:>10}  CI {}".format(*cells)
        )
    lines += ["", "### reasons" if md else "reasons:"]
    lines += [f"- {r}" for r in result.reasons]
    if result.findings:
        lines += ["", "### top findings" if md else "top findings:"]
        for f in result.findings:
            scope = ", ".join(f"{k}={v}" for k, v in (f.get("scope") or {}).items()) or "everywhere"
            lines.append(f"- #{f.get('rank')} {f.get('cause')} ({scope}): {f.get('title', '')}")
    if result.notes:
        lines += ["", "notes:"] + [f"- {n}" for n in result.notes]
    return "\n".join(lines)
