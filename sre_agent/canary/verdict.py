"""The canary gate: SLO checks, the verdict, its score and its renderings.

A gate run compares a candidate (canary) with a baseline, exactly as
``sre-agent diagnose`` does (:mod:`sre_agent.analysis.compare`), and checks:

* **absolute SLOs** (``--slo``): ``ttft_p99=2s``, ``itl_p99=80ms``,
  ``tpot_p50=30ms``, ``e2e_p99=20s``, ``queue_p99=500ms`` (any ``pNN``,
  ``pNN.N`` or ``p999``), ``error_rate=1%`` (failed share at most),
  ``goodput=0.95`` (share of requests that did not fail and met every latency
  SLO given, at least);
* **relative checks** (``--max-regression ttft_p99=15%``): the candidate's
  quantile may exceed the baseline's by at most that much.

Each check is a test of a share of candidate requests (see
:mod:`sre_agent.analysis.exceedance`): above the SLO, failed, not good, or above
``(1 + margin)`` times the baseline's quantile (*tail exceedance*). The
share's variance comes from time blocks (bursts of slow requests count as
what they are), and the decision boundary is any-time valid, so a controller
may poll as often as it likes. The family error ``alpha`` (default 0.05) is
split evenly over the checks (Bonferroni).

Per check:

* **fail** when the share is significantly above its limit (and the side
  has at least ``min_samples`` values);
* **pass**, by default (Kayenta's semantics), when it did not fail and there
  is enough data: ``min_samples`` values on each side it reads and at least
  :data:`MIN_EXPECTED_BAD` bad requests expected at the limit (500 requests
  for a p99 check); with ``require_equivalence`` only when the share is
  significantly *below* its limit (the check is shown to hold);
* **inconclusive** otherwise; **nodata** when the metric is absent.

Checks read from an engine histogram (vLLM's ITL) use the histogram's
quantile confidence sequence (:mod:`sre_agent.canary.sequential`) instead.

Overall verdict: ``fail`` if any check fails; else ``inconclusive`` if no
check had data or half or more had none (Kayenta's rule); else ``pass`` if
every check with data passed; else ``inconclusive``. Score (0-100): 0 on
``fail`` and when half or more of the checks have no data; otherwise
``100 * (passes + 0.5 * inconclusives) / checks with data``.

With ``dry_run`` the reported verdict is always ``pass`` (score 100) while
``real_verdict`` and the first reason carry the verdict the gate reached.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal

from sre_agent.analysis.exceedance import ShareCounts, ShareTest, one_sample, ratio_test
from sre_agent.canary.sides import QuantileEstimate, SideStats, ladder_ranks, summarise
from sre_agent.canary.spec import (
    DEFAULT_ALPHA,
    LATENCY_METRICS,
    CanarySpec,
    QuantileNeed,
    RegressionSpec,
    SloSpec,
    parse_max_regression,
    parse_slo,
)

if TYPE_CHECKING:
    import duckdb

    from sre_agent.analysis.selection import Selection

__all__ = [
    "LATENCY_METRICS",
    "MIN_EXPECTED_BAD",
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
    "ladder_ranks",
    "parse_max_regression",
    "parse_slo",
    "render",
    "summarise",
    "verdict_from_dict",
]

log = logging.getLogger(__name__)

SCHEMA: Final[str] = "sre-agent/canary/v1"
#: Bad requests a check must expect at its limit before it may pass (n x limit).
MIN_EXPECTED_BAD: Final[int] = 5

Status = Literal["pass", "fail", "inconclusive", "nodata"]
PassRule = Literal["no-significant-regression", "equivalence"]


# --------------------------------------------------------------- verdict
@dataclass(frozen=True)
class CheckResult:
    """One row of the verdict's ``slos`` list (CONTRACTS section 4, plus additive fields).

    ``tail`` (additive) describes the share test behind the status: the
    candidate's bad share, its any-time interval, the limit and ``z``.
    """

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
    tail: Mapping[str, Any] | None = None

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
            "tail": None if self.tail is None else dict(self.tail),
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
    pass_rule: PassRule = "no-significant-regression"

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
                "pass_rule": self.pass_rule,
                "test": "tail-exceedance share tests, time-block variance, any-time-valid mixture boundary "
                "(sre_agent.analysis.exceedance)",
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
                tail=c.get("tail"),
            )
        )
    method = data.get("method", {})
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
        alpha=float(method.get("alpha", DEFAULT_ALPHA)),
        notes=tuple(data.get("notes", [])),
        pass_rule=method.get("pass_rule", "no-significant-regression"),
    )


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) or math.isnan(x) else x


def _fmt(value: float | None, unit: str) -> str:
    """A value in its unit: seconds as ``ms``/``s``, ratios as ``1.5x``, fractions as percentages."""
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "∞"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.3g} s"
    if unit == "ratio":
        return f"{value:.3g}x"
    return f"{value * 100:.2f}%"


def _status(test: ShareTest, n: int, bad_share: float, spec: CanarySpec, tail_test: bool = False) -> Status:
    """A test's status under the spec's pass rule; ``bad_share`` is the share the limit allows.

    A ``tail_test`` (quantile ratio) also needs :data:`MIN_EXPECTED_BAD` tail
    values to fail: its error rests on the local density there.
    """
    if n < spec.min_samples or (tail_test and n * bad_share < MIN_EXPECTED_BAD):
        return "inconclusive"
    if test.above:
        return "fail"
    if spec.require_equivalence:
        return "pass" if test.below else "inconclusive"
    return "pass" if n * bad_share >= MIN_EXPECTED_BAD else "inconclusive"


def _tail(test: ShareTest, counts: ShareCounts) -> dict[str, Any]:
    lo, hi = test.ci
    return {"share": test.estimate, "ci": [max(0.0, lo), min(1.0, hi)], "limit": test.limit,
            "z": round(test.z, 3), "bad": counts.total_hits, "n": counts.n}  # fmt: skip


def _reason(name: str, told: str, status: Status, decided: tuple[str, str], undecided: str) -> str:
    """``NAME: what was measured: what it means``; ``decided`` is the (pass, fail) wording."""
    ending = {"pass": decided[0], "fail": decided[1], "inconclusive": undecided}[status]
    return f"{name}: {told}: {ending}"


def _why_undecided(n: int, bad_share: float, spec: CanarySpec) -> str:
    if n < spec.min_samples:
        return f"{n} values, fewer than the minimum {spec.min_samples}; no decision yet"
    if not spec.require_equivalence and n * bad_share < MIN_EXPECTED_BAD:
        need = math.ceil(MIN_EXPECTED_BAD / bad_share)
        return f"{n} values, too few to judge a {_fmt(bad_share, '')} tail (needs {need}); no decision yet"
    return "not yet shown to be within the limit (--require-equivalence)"


def _absolute_quantile(s: SloSpec, base: SideStats, cand: SideStats, spec: CanarySpec) -> CheckResult:
    key = f"slo:{s.name}"
    b, c = base.quantiles.get(key), cand.quantiles.get(key)
    counts = cand.shares.get(key)
    row: dict[str, Any] = {"name": s.name, "kind": "absolute", "threshold": s.threshold, "unit": "s",
                           "baseline": b.estimate if b else None, "n_baseline": b.n if b else 0}  # fmt: skip
    if c is None or c.n == 0:
        return CheckResult(**row, candidate=None, ci=None, status="nodata",
                           reason=f"{s.name}: no {s.metric} data for the candidate", n_candidate=0)  # fmt: skip
    if counts is None:  # read from a histogram: its confidence sequence decides
        status = _interval_status(c.lo, c.hi, s.threshold, c.n, spec)
        reason = (f"{s.name}: candidate {_fmt(c.estimate, 's')} (CI {_fmt(c.lo, 's')}–{_fmt(c.hi, 's')}, n={c.n}) "
                  f"against the SLO {_fmt(s.threshold, 's')}: {status} [from {c.source}]")  # fmt: skip
        return CheckResult(**row, candidate=c.estimate, ci=(c.lo, c.hi), status=status, reason=reason,
                           n_candidate=c.n)  # fmt: skip
    assert s.quantile is not None
    test = one_sample(counts, 1.0 - s.quantile, spec.check_alpha)
    status = _status(test, counts.n, test.limit, spec)
    ci = c.interval(test.radius)
    told = (f"{_fmt(test.estimate, '')} of candidate requests ({counts.total_hits}/{counts.n}) exceed "
            f"{_fmt(s.threshold, 's')}, against at most {_fmt(test.limit, '')}; candidate {s.name} "
            f"{_fmt(c.estimate, 's')} (CI {_fmt(ci[0], 's')}–{_fmt(ci[1], 's')})")  # fmt: skip
    reason = _reason(s.name, told, status, ("within the SLO", "the SLO is missed"),
                     _why_undecided(counts.n, test.limit, spec))  # fmt: skip
    return CheckResult(**row, candidate=c.estimate, ci=ci, status=status, reason=reason, n_candidate=counts.n,
                       tail=_tail(test, counts))  # fmt: skip


def _interval_status(lo: float, hi: float, limit: float, n: int, spec: CanarySpec) -> Status:
    """Status from a confidence sequence (histogram sources)."""
    if n < spec.min_samples:
        return "inconclusive"
    if lo > limit:
        return "fail"
    if hi <= limit or not spec.require_equivalence:
        return "pass"
    return "inconclusive"


def _rate(s: SloSpec, base: SideStats, cand: SideStats, spec: CanarySpec) -> CheckResult:
    is_error = s.kind == "error_rate"
    key = f"slo:{s.name}"
    counts = cand.shares.get(key)
    base_counts = base.shares.get(key)

    def rate(c: ShareCounts | None) -> float | None:
        if c is None or c.n == 0:
            return None
        return c.share if is_error else 1.0 - c.share

    row: dict[str, Any] = {"name": s.name, "kind": "absolute", "threshold": s.threshold, "unit": "fraction",
                           "baseline": rate(base_counts), "n_baseline": base.requests}  # fmt: skip
    if counts is None or counts.n == 0:
        why = "no candidate requests" if cand.requests == 0 else "goodput needs at least one latency SLO"
        return CheckResult(**row, candidate=None, ci=None, status="nodata", reason=f"{s.name}: {why}",
                           n_candidate=cand.requests)  # fmt: skip
    limit = s.threshold if is_error else 1.0 - s.threshold
    test = one_sample(counts, limit, spec.check_alpha)
    status = _status(test, counts.n, limit, spec)
    lo, hi = max(0.0, test.ci[0]), min(1.0, test.ci[1])
    ci = (lo, hi) if is_error else (1.0 - hi, 1.0 - lo)
    value = rate(counts)
    bound = "at most" if is_error else "at least"
    told = (f"candidate {_fmt(value, '')} (CI {_fmt(ci[0], '')}–{_fmt(ci[1], '')}, {counts.total_hits} of "
            f"{counts.n} {'failed' if is_error else 'not good'}) against {bound} {_fmt(s.threshold, '')}")  # fmt: skip
    reason = _reason(
        s.name, told, status, ("meets the SLO", "the SLO is missed"), _why_undecided(counts.n, limit, spec)
    )
    return CheckResult(**row, candidate=value, ci=ci, status=status, reason=reason, n_candidate=counts.n,
                       tail=_tail(test, counts))  # fmt: skip


def _relative(r: RegressionSpec, base: SideStats, cand: SideStats, spec: CanarySpec) -> CheckResult:
    key = f"reg:{r.name}"
    b, c = base.quantiles.get(key), cand.quantiles.get(key)
    b_counts, c_counts = base.shares.get(key), cand.shares.get(key)
    row: dict[str, Any] = {"name": f"{r.name} regression", "kind": "relative", "threshold": r.max_increase,
                           "unit": "ratio", "baseline": b.estimate if b else None,
                           "candidate": c.estimate if c else None,
                           "n_baseline": b.n if b else 0, "n_candidate": c.n if c else 0}  # fmt: skip
    if b is None or c is None or not b.n or not c.n or b.estimate is None or c.estimate is None:
        side = "baseline" if not (b and b.n) else "candidate"
        return CheckResult(**row, ci=None, status="nodata", reason=f"{r.name}: no {r.metric} data for the {side}")
    if b_counts is None or c_counts is None:  # histogram sources: both confidence sequences decide
        ci = (c.lo / b.hi if b.hi > 0 and not math.isinf(b.hi) else 0.0, c.hi / b.lo if b.lo > 0 else math.inf)
        status = _interval_status(ci[0], ci[1], 1.0 + r.max_increase, min(b.n, c.n), spec)
        reason = (f"{r.name} regression: candidate/baseline {_fmt(c.estimate / b.estimate, 'ratio')} "
                  f"(CI {_fmt(ci[0], 'ratio')}–{_fmt(ci[1], 'ratio')}) against +{r.max_increase * 100:.0f}%: "
                  f"{status} [from {c.source}]")  # fmt: skip
        return CheckResult(**row, ci=ci, status=status, reason=reason)
    tail = 1.0 - r.quantile
    test = ratio_test(b_counts, c_counts, quantiles=(b.estimate, c.estimate), tail=tail, margin=r.max_increase,
                      alpha=spec.check_alpha)  # fmt: skip
    n = min(b_counts.n, c_counts.n)
    status = _status(test, n, tail, spec, tail_test=True)
    ratio = c.estimate / b.estimate if b.estimate > 0 else math.inf
    ci = (math.exp(test.ci[0]), math.exp(test.ci[1])) if math.isfinite(test.radius) else (0.0, math.inf)
    told = (f"candidate/baseline {_fmt(ratio, 'ratio')} (CI {_fmt(ci[0], 'ratio')}–{_fmt(ci[1], 'ratio')}; "
            f"{_fmt(c.estimate, 's')} vs {_fmt(b.estimate, 's')}) "
            f"against the allowed +{r.max_increase * 100:.0f}%")  # fmt: skip
    reason = _reason(f"{r.name} regression", told, status,
                     ("no significant regression beyond the margin", "regressed beyond the allowed margin"),
                     _why_undecided(n, tail, spec))  # fmt: skip
    details = {"log_ratio": test.estimate, "se": test.se, "z": round(test.z, 3), "limit": test.limit}
    return CheckResult(**row, ci=ci, status=status, reason=reason, tail=details)


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
        rule = (
            "every check is shown to be within its limit (--require-equivalence)"
            if spec.require_equivalence
            else "enough data and no significant regression beyond any margin (Kayenta's rule)"
        )
        reasons.append(f"all {with_data} checks with data pass: {rule}")
        reasons.extend(c.reason for c in checks if c.status in ("pass", "nodata"))
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
        pass_rule="equivalence" if spec.require_equivalence else "no-significant-regression",
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
    """Run the gate against a store connection (tables per :mod:`sre_agent.store.schema`).

    A selection that cannot be resolved *yet* (no deploy marker, no request
    in a window) gives an ``inconclusive`` verdict with the reason, because
    early in a rollout that is the normal state.

    Raises:
        CannotEvaluateError: the selection names a ``service.version`` or a
            ``service.name`` the store has never seen, or a ``--where``
            filter matches nothing (a typo in a rollout template must not
            poll forever as "inconclusive").
        StoreError: the store cannot be read.
    """
    import duckdb

    from sre_agent.canary.gather import gather, top_findings, unknown_names
    from sre_agent.errors import CannotEvaluateError, EmptySelectionError, SelectionError, StoreError

    try:
        baseline, candidate, notes = gather(con, selection, spec)
    except EmptySelectionError as exc:
        # A filter that matches nothing is a template error, not "no traffic yet".
        raise CannotEvaluateError(str(exc)) from exc
    except SelectionError as exc:
        # Only a failed resolution asks whether the names exist at all: polls that resolve pay nothing.
        unknown = unknown_names(con, selection)
        if unknown:
            raise CannotEvaluateError(unknown) from exc
        # Early in a rollout the canary may have no traffic yet: that is "not yet", not an error.
        empty = SideStats(requests=0, window={"selection": selection.to_dict()})
        result = judge(replace(spec, dry_run=False), empty, empty)
        result = replace(result, reasons=(f"cannot select the populations: {exc}", *result.reasons))
        return apply_dry_run(result) if spec.dry_run else result
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"cannot read the store for the canary verdict: {first}") from exc
    result = judge(replace(spec, dry_run=False), baseline, candidate)
    findings: tuple[dict[str, Any], ...] = ()
    enough = min(candidate.requests, baseline.requests) >= spec.min_samples
    # Findings explain a fail or an undecided gate; a pass needs no explanation and polls stay cheap.
    if spec.findings > 0 and result.verdict != "pass" and enough:
        findings = tuple(top_findings(con, selection, spec.findings, notes, spec.findings_budget_s))
    result = replace(result, findings=findings, notes=tuple(notes))
    return apply_dry_run(result) if spec.dry_run else result


# ------------------------------------------------------------- rendering
def _cells(chk: CheckResult) -> list[str]:
    """One table row: values and their CI in the same unit (a relative row adds the ratio)."""
    if chk.kind == "relative":
        ratio = chk.candidate / chk.baseline if chk.candidate is not None and chk.baseline else None
        ci = "n/a" if chk.ci is None else f"{_fmt(chk.ci[0], 'ratio')}–{_fmt(chk.ci[1], 'ratio')}"
        candidate = f"{_fmt(chk.candidate, 's')} ({_fmt(ratio, 'ratio')})"
        return [chk.name, chk.status, f"+{chk.threshold * 100:.0f}%", _fmt(chk.baseline, "s"), candidate, ci]
    ci = "n/a" if chk.ci is None else f"{_fmt(chk.ci[0], chk.unit)}–{_fmt(chk.ci[1], chk.unit)}"
    cells = [_fmt(chk.threshold, chk.unit), _fmt(chk.baseline, chk.unit), _fmt(chk.candidate, chk.unit), ci]
    return [chk.name, chk.status, *cells]


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
    else:
        lines.append("  {:<24} {:<13} {:>10} {:>10} {:>18}  {}".format(
            "check", "status", "threshold", "baseline", "candidate", "CI"))  # fmt: skip
    for chk in result.slos:
        cells = _cells(chk)
        lines.append(
            "| " + " | ".join(cells) + " |" if md else "  {:<24} {:<13} {:>10} {:>10} {:>18}  {}".format(*cells)
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
