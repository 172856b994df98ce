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
ever passes one that misses one) stays at most ``alpha`` for independent
requests. Time-correlated requests (engine batches) are allowed for with an
estimated design effect (see :mod:`sre_agent.sequential`), a heuristic.

Per-check status: ``pass``, ``fail``, ``nodata`` (CONTRACTS section 4) and
``inconclusive`` (an additive value: the interval straddles the threshold,
or there are fewer than ``min_samples`` values).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal

from sre_agent.canary_spec import (
    DEFAULT_ALPHA,
    LATENCY_METRICS,
    CanarySpec,
    QuantileNeed,
    RegressionSpec,
    SloSpec,
    parse_max_regression,
    parse_slo,
)
from sre_agent.sequential import (
    DESIGN_EFFECT_SLICES,
    design_effect,
    design_effect_step,
    point_rank,
    proportion_cs,
    quantile_cs_ranks,
)

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
    "apply_dry_run",
    "evaluate",
    "judge",
    "parse_max_regression",
    "parse_slo",
    "quantile_estimate",
    "render",
    "stream_quantile_estimate",
    "verdict_from_dict",
]

log = logging.getLogger(__name__)

SCHEMA: Final[str] = "sre-agent/canary/v1"

Status = Literal["pass", "fail", "inconclusive", "nodata"]


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
        design_effect: the time-correlation allowance applied (1 = none).
    """

    n: int
    estimate: float | None
    lo: float
    hi: float
    source: str = "spans"
    design_effect: float = 1.0


def quantile_estimate(
    sorted_values: Sequence[float], p: float, alpha: float, design_effect: float = 1.0
) -> QuantileEstimate:
    """The estimate and confidence sequence of the p-quantile from ascending values (pure)."""
    n = len(sorted_values)
    if n == 0:
        return QuantileEstimate(0, None, 0.0, math.inf)
    lower, upper = quantile_cs_ranks(n, p, alpha, design_effect=design_effect)
    return QuantileEstimate(
        n,
        float(sorted_values[point_rank(n, p) - 1]),
        float(sorted_values[lower - 1]) if lower is not None else 0.0,
        float(sorted_values[upper - 1]) if upper is not None else math.inf,
        design_effect=design_effect,
    )


def stream_quantile_estimate(values: Sequence[float], p: float, alpha: float) -> QuantileEstimate:
    """As the store path computes it, from values in arrival order (pure; used by tests and simulations).

    The design effect comes from :data:`DESIGN_EFFECT_SLICES` consecutive,
    equal slices of the stream: how much the exceedances of the point
    estimate cluster in time.
    """
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return QuantileEstimate(0, None, 0.0, math.inf)
    estimate = ordered[point_rank(n, p) - 1]
    k = min(DESIGN_EFFECT_SLICES, n)
    bounds = [n * j // k for j in range(k + 1)]
    sizes = [bounds[j + 1] - bounds[j] for j in range(k)]
    hits = [sum(1 for v in values[bounds[j] : bounds[j + 1]] if v > estimate) for j in range(k)]
    step = design_effect_step(design_effect(sizes, hits))
    return quantile_estimate(ordered, p, alpha, step)


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
        error_design_effect / good_design_effect: time-correlation
            allowances for the error and goodput shares (1 = none).
    """

    requests: int
    errors: int = 0
    good: int | None = None
    quantiles: Mapping[str, QuantileEstimate] = field(default_factory=dict)
    window: Mapping[str, Any] = field(default_factory=dict)
    error_design_effect: float = 1.0
    good_design_effect: float = 1.0


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
    design_effect: float = 1.0

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
            "design_effect": self.design_effect,
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


def verdict_from_dict(data: Mapping[str, Any]) -> Verdict:
    """Inverse of :meth:`Verdict.to_dict` (used by ``sre-agent canary --url``); ``null`` CI bounds are open."""
    from sre_agent.errors import RemoteError

    if data.get("schema") != SCHEMA:
        raise RemoteError(f"expected a {SCHEMA} document, got schema {data.get('schema')!r}")
    checks = []
    for c in data.get("slos", []):
        ci = c.get("ci")
        checks.append(
            CheckResult(
                name=c["name"],
                kind=c.get("kind", "absolute"),
                threshold=float(c["threshold"]),
                baseline=c.get("baseline"),
                candidate=c.get("candidate"),
                ci=None if ci is None else (ci[0] or 0.0, math.inf if ci[1] is None else ci[1]),
                status=c["status"],
                reason=c.get("reason", ""),
                n_baseline=int(c.get("n_baseline", 0)),
                n_candidate=int(c.get("n_candidate", 0)),
                unit=c.get("unit", "s"),
                design_effect=float(c.get("design_effect", 1.0)),
            )
        )
    return Verdict(
        verdict=data["verdict"],
        score=int(data["score"]),
        slos=tuple(checks),
        reasons=tuple(data.get("reasons", [])),
        dry_run=bool(data.get("dry_run", False)),
        real_verdict=data.get("real_verdict"),
        findings=tuple(data.get("findings", [])),
        baseline=data.get("baseline", {}),
        candidate=data.get("candidate", {}),
        alpha=float(data.get("method", {}).get("alpha", DEFAULT_ALPHA)),
        notes=tuple(data.get("notes", [])),
    )


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


def _deff_note(deff: float) -> str:
    return f" (CI widened x{deff:g} for time-correlated requests)" if deff > 1 else ""


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
    reason += _deff_note(c.design_effect)
    return CheckResult(**row, baseline=b_est, candidate=c.estimate, ci=ci, status=status,  # type: ignore[arg-type]
                       reason=reason, n_baseline=n_b, n_candidate=c.n, design_effect=c.design_effect)  # fmt: skip


def _rate(s: SloSpec, base: SideStats, cand: SideStats, spec: CanarySpec) -> CheckResult:

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
    deff = cand.error_design_effect if is_error else cand.good_design_effect
    lo, hi = proportion_cs(hits / deff, n / deff, spec.check_alpha, prior_mean=s.threshold)
    if n < spec.min_samples:
        status: Status = "inconclusive"
        reason = _few(s.name, n, "candidate", spec)
    else:
        status = _decide(lo, hi, s.threshold, upper_is_bad=is_error)
        word = {"fail": "misses", "pass": "meets", "inconclusive": "cannot yet be told from"}[status]
        bound = "at most" if is_error else "at least"
        reason = (
            f"{s.name}: candidate {_fmt(hits / n, '')} (CI {_fmt(lo, '')}–{_fmt(hi, '')}, {hits}/{n}) "
            f"{word} the SLO {bound} {_fmt(s.threshold, '')}{_deff_note(deff)}"
        )
    return CheckResult(**row, baseline=b_rate, candidate=hits / n, ci=(lo, hi), status=status,  # type: ignore[arg-type]
                       reason=reason, n_baseline=base.requests, n_candidate=n, design_effect=deff)  # fmt: skip


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
            f"{r.name} regression: candidate/baseline {_fmt(ratio, 'ratio')} (CI {_fmt(ratio_lo, 'ratio')}–"
            f"{_fmt(ratio_hi, 'ratio')}; {_fmt(c_est, 's')} vs {_fmt(b_est, 's')}) is {word} "
            f"the allowed +{r.max_increase * 100:.0f}%"
        )
    deff = max(b.design_effect, c.design_effect)
    return CheckResult(**row, baseline=b_est, candidate=c_est, ci=ci, status=status,  # type: ignore[arg-type]
                       reason=reason + _deff_note(deff), n_baseline=n_b, n_candidate=n_c,
                       design_effect=deff)  # fmt: skip


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

    A selection that cannot be resolved yet (no request of the candidate
    version, no deploy marker) gives an ``inconclusive`` verdict with the
    reason, because early in a rollout that is the normal state.

    Raises:
        StoreError: the store cannot be read.
    """
    import duckdb

    from sre_agent._canary_store import gather, top_findings
    from sre_agent.errors import SelectionError, StoreError

    try:
        baseline, candidate, notes = gather(con, selection, spec)
    except SelectionError as exc:
        # Early in a rollout the canary may have no traffic yet: that is "not yet", not an error.
        empty = SideStats(requests=0, window={"selection": selection.to_dict()})
        result = judge(replace(spec, dry_run=False), empty, empty)
        result = replace(result, reasons=(f"cannot select the populations: {exc}", *result.reasons))
        return apply_dry_run(result) if spec.dry_run else result
    except duckdb.Error as exc:
        raise StoreError(f"cannot read the store for the canary verdict: {exc}") from exc
    result = judge(replace(spec, dry_run=False), baseline, candidate)
    findings: tuple[dict[str, Any], ...] = ()
    enough = min(candidate.requests, baseline.requests) >= spec.min_samples
    # Findings explain a fail or an undecided gate; a pass needs no explanation and polls stay cheap.
    if spec.findings > 0 and result.verdict != "pass" and enough:
        findings = tuple(top_findings(con, selection, spec.findings, notes, spec.findings_budget_s))
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
    for label, side in (("baseline: ", b), ("candidate:", c)):
        where = ", ".join(f"{k}={v}" for k, v in (side.get("filter") or {}).items())
        span = f"{side.get('start', '')}..{side.get('end', '')}" if side.get("start") else ""
        lines.append(f"{label} {side.get('requests', 0)} requests {span} {where}".rstrip())
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
