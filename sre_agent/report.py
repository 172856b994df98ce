"""The diagnosis report: CONTRACTS section 3 JSON, terminal text and Markdown."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from sre_agent.rules_api import Evidence, Finding, MetricEstimate, Regression
from sre_agent.selection import Selection

__all__ = ["SCHEMA", "Report", "render_dict"]

SCHEMA: Final[str] = "sre-agent/diagnosis/v1"
#: Quantiles listed in the report's ``metrics`` array (CONTRACTS: 0.5 and 0.99).
REPORTED_QUANTILES: Final[tuple[float, ...]] = (0.5, 0.99)


def _num(x: Any) -> Any:
    """JSON-safe numbers: floats rounded to 6 significant digits, NaN/inf as null."""
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {str(k): _num(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_num(v) for v in x]
    return x


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def _fmt_any(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "n/a" if x is None else str(x)


@dataclass
class Report:
    """A ranked diagnosis. ``to_dict()`` is the CONTRACTS section 3 object.

    Attributes:
        selection: what was compared.
        baseline / candidate: the resolved windows (start, end, requests, filter).
        regression: the headline metric.
        estimates: every metric x quantile with CIs.
        findings: ranked; the first is ``none`` when nothing regressed.
        notes: how data was chosen or degraded (shown to people, included in JSON).
        errors: rules that failed to load or run.
        timings: seconds spent, total and per rule.
    """

    selection: Selection | None
    baseline: dict[str, Any]
    candidate: dict[str, Any]
    regression: Regression
    estimates: list[MetricEstimate]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """Rebuild a report from its :meth:`to_dict` JSON (e.g. an HTTP API answer) for rendering."""
        r = data.get("regression") or {}
        regression = Regression(
            str(r.get("metric", "e2e")), float(r.get("quantile") or 0.99), r.get("baseline"), r.get("candidate"),
            tuple(r["ci"]) if r.get("ci") else None, bool(r.get("significant")),
        )  # fmt: skip
        switch = r.get("quantile_switch") or {}
        if switch:
            reason = str(switch.get("reason", ""))
            regression = replace(regression, switched_from=switch.get("from"), switch_reason=reason)
        estimates = [
            MetricEstimate(str(m["name"]), float(m["quantile"]), m.get("baseline"), m.get("candidate"),
                           tuple(m["ci"]) if m.get("ci") else None)
            for m in data.get("metrics", [])
        ]  # fmt: skip
        findings = []
        for f in data.get("findings", []):
            confidence = float(f.get("confidence") or 0.0)
            findings.append(
                Finding(
                    cause=str(f["cause"]), title=str(f.get("title", "")),
                    explained=float(f.get("score") or 0.0) / confidence if confidence else 0.0,
                    confidence=confidence, stage=f.get("stage"), scope=dict(f.get("scope") or {}),
                    evidence=tuple(Evidence(str(e.get("signal")), e.get("baseline"), e.get("candidate"),
                                            str(e.get("detail") or "")) for e in f.get("evidence", [])),
                    next_check=str(f.get("next_check") or ""),
                )
            )  # fmt: skip
        return cls(
            selection=None, baseline=dict(data.get("baseline") or {}), candidate=dict(data.get("candidate") or {}),
            regression=regression, estimates=estimates, findings=findings,
            notes=list(data.get("notes") or []), errors=list(data.get("errors") or []),
        )  # fmt: skip

    @property
    def top(self) -> Finding | None:
        """The first-ranked finding (``None`` when a regression is unexplained)."""
        return self.findings[0] if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of CONTRACTS section 3 (plus ``notes`` and ``errors``, always lists)."""
        r = self.regression
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "regression": {
                "metric": r.metric,
                "quantile": None if r.metric == "error_rate" else r.quantile,
                "baseline": r.baseline,
                "candidate": r.candidate,
                "ratio": r.ratio,
                "ci": list(r.ci) if r.ci else None,
                "significant": r.significant,
                "quantile_switch": None
                if r.switched_from is None
                else {"from": r.switched_from, "to": r.quantile, "reason": r.switch_reason},
            },
            "metrics": [
                {
                    "name": e.name,
                    "quantile": e.quantile,
                    "baseline": e.baseline,
                    "candidate": e.candidate,
                    "ci": list(e.ci) if e.ci else None,
                }
                for e in self.estimates
                if e.quantile in REPORTED_QUANTILES
            ],
            "findings": [
                {
                    "rank": i + 1,
                    "cause": f.cause,
                    "title": f.title,
                    "score": f.score,
                    "confidence": f.confidence,
                    "stage": f.stage,
                    "scope": dict(f.scope),
                    "evidence": [e.to_dict() for e in f.evidence],
                    "next_check": f.next_check,
                }
                for i, f in enumerate(self.findings)
            ],
            "notes": list(self.notes),
            "errors": list(self.errors),
        }
        return dict(_num(out))

    def render(self, fmt: Literal["text", "json", "markdown"] = "text") -> str:
        """The report as terminal text, indented JSON or Markdown."""
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2)
        if fmt == "markdown":
            return self._markdown()
        if fmt == "text":
            return self._text()
        raise ValueError(f"unknown format {fmt!r}")

    def _headline(self) -> str:
        r = self.regression
        if r.metric == "error_rate":
            verdict = "REGRESSED" if r.significant else "no significant regression"
            return f"error rate: {_fmt_any(r.baseline)} -> {_fmt_any(r.candidate)} — {verdict}"
        label = f"{r.metric} p{round(r.quantile * 100)}"
        ratio = f" ({r.ratio:.2f}x)" if r.ratio else ""
        ci = f", 95% CI of the change {r.ci[0]:+.3f}..{r.ci[1]:+.3f} s" if r.ci else ""
        verdict = "REGRESSED" if r.significant else "no significant regression"
        return f"{label}: {_fmt_s(r.baseline)} -> {_fmt_s(r.candidate)}{ratio}{ci} — {verdict}"

    def _switch(self) -> list[str]:
        """The line saying why the headline is below p99 (none when it is not)."""
        r = self.regression
        if r.switched_from is None:
            return []
        return [f"(p{round(r.quantile * 100)} instead of p{round(r.switched_from * 100)}: {r.switch_reason})"]

    def _windows(self) -> list[str]:
        return [
            f"{side:9s} {w['start']} .. {w['end']}  {w['requests']} requests"
            + (f"  {w['filter']}" if w["filter"] else "")
            for side, w in (("baseline", self.baseline), ("candidate", self.candidate))
        ]

    def _metric_rows(self) -> list[tuple[str, str, str, str, str]]:
        rows = []
        for e in self.estimates:
            if e.quantile not in REPORTED_QUANTILES:
                continue
            ci = f"{e.ci[0]:+.4f}..{e.ci[1]:+.4f}" if e.ci else "n/a"
            mark = " *" if e.significant else ""
            rows.append(
                (f"{e.name} p{round(e.quantile * 100)}", _fmt_s(e.baseline), _fmt_s(e.candidate), ci, mark + e.source)
            )
        return rows

    def _text(self) -> str:
        lines = ["sre-agent diagnosis", "", *self._windows(), "", self._headline(), *self._switch(), ""]
        lines.append(f"{'metric':10s} {'baseline':>10s} {'candidate':>10s}  {'change CI (s)':>22s}  source")
        lines.extend(f"{a:10s} {b:>10s} {c:>10s}  {d:>22s}  {s}" for a, b, c, d, s in self._metric_rows())
        lines.append("")
        for i, f in enumerate(self.findings, 1):
            scope = " in " + ", ".join(f"{k}={v}" for k, v in f.scope.items()) if f.scope else ""
            stage = f" [{f.stage}]" if f.stage else ""
            lines.append(f"{i}. {f.cause}{stage}{scope}  score {f.score:.2f} (confidence {f.confidence:.2f})")
            lines.append(f"   {f.title}")
            for e in f.evidence:
                detail = f" — {e.detail}" if e.detail else ""
                lines.append(f"   · {e.signal}: {_fmt_any(e.baseline)} -> {_fmt_any(e.candidate)}{detail}")
            if f.next_check:
                lines.append(f"   next: {f.next_check}")
        if not self.findings:
            lines.append("No rule explains the regression; check the metrics above and the notes.")
        lines.extend(f"note: {n}" for n in self.notes)
        lines.extend(f"rule error: {e}" for e in self.errors)
        return "\n".join(lines) + "\n"

    def _markdown(self) -> str:
        lines = ["## Diagnosis", "", *(f"- {w}" for w in self._windows()), "", f"**{self._headline()}**"]
        lines += [*(f"\n{line}" for line in self._switch()), ""]
        lines += ["| metric | baseline | candidate | 95% CI of change (s) | source |", "|---|---|---|---|---|"]
        lines.extend(f"| {a} | {b} | {c} | {d} | {s.strip()} |" for a, b, c, d, s in self._metric_rows())
        lines += ["", "### Findings", ""]
        for i, f in enumerate(self.findings, 1):
            scope = " in " + ", ".join(f"`{k}={v}`" for k, v in f.scope.items()) if f.scope else ""
            stage = f" (stage: {f.stage})" if f.stage else ""
            lines.append(f"{i}. **{f.cause}**{stage}{scope} — score {f.score:.2f}, confidence {f.confidence:.2f}")
            lines.append(f"   {f.title}")
            if f.evidence:
                lines.append("")
                lines.append("   | signal | baseline | candidate | detail |")
                lines.append("   |---|---|---|---|")
                lines.extend(
                    f"   | {e.signal} | {_fmt_any(e.baseline)} | {_fmt_any(e.candidate)} | {e.detail} |"
                    for e in f.evidence
                )
                lines.append("")
            if f.next_check:
                lines.append(f"   *Next check:* {f.next_check}")
            lines.append("")
        if not self.findings:
            lines.append("No rule explains the regression.")
        if self.notes:
            lines += ["", "### Notes", "", *(f"- {n}" for n in self.notes)]
        if self.errors:
            lines += ["", "### Rule errors", "", *(f"- {e}" for e in self.errors)]
        return "\n".join(lines) + "\n"


def render_dict(data: dict[str, Any], fmt: Literal["text", "json", "markdown"] = "text") -> str:
    """Render a report received as JSON (the ``--url`` path of the CLI)."""
    return Report.from_dict(data).render(fmt)
